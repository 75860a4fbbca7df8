"""Daemon configuration: embedded defaults, the TOML file, command-line overrides.

The TOML file is decoded straight into msgspec structs, so a bad key or type is
reported with its path (``$.servers[0].transport``). Servers declared in the
file are read-only through the API; servers added with ``servers/add`` live in
the state database.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Final
from urllib.parse import urlsplit

import msgspec

from memorizz.api.methods import Decision, ServerSpec
from memorizz.api.protocol import default_runtime_dir
from memorizzd.egress.urls import normalise_pattern

DEFAULT_CONFIG_PATH: Final = Path("/etc/memorizzd/memorizzd.toml")
SERVER_NAME_MAX: Final = 64
LOOPBACK_HOSTS: Final = ("localhost", "127.0.0.1", "::1")
_TOKEN_CHARS: Final = frozenset(
    "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
)
FORBIDDEN_HEADERS: Final = frozenset(
    {
        "host",
        "content-length",
        "content-type",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "upgrade",
        "te",
        "trailer",
        "accept",
        "accept-encoding",
        "proxy-authorization",
        "proxy-connection",
        "last-event-id",
    }
)
"""Headers the transport owns; ``mcp-*`` (session, protocol version) too."""
_CODE_ENV_PREFIXES: Final = ("LD_", "BASH_FUNC_", "PYTHON", "NODE_", "PERL", "RUBY")
_CODE_ENV: Final = frozenset({"PATH", "BASH_ENV", "ENV", "HOME"})


class ConfigError(Exception):
    """The configuration is invalid; the message names the bad key."""


class ConfigServer(ServerSpec, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """A ``[[servers]]`` entry: a ServerSpec whose unknown keys are errors (on the
    wire, unknown fields are ignored so that the protocol can grow)."""


class Decisions(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """What a call gets, per risk class (``[decisions]`` in the config file)."""

    read: Decision = "allow"
    write: Decision = "allow"
    destructive: Decision = "ask"


class Config(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Everything the daemon reads at start. Field names are the TOML keys."""

    socket: str = ""
    """The operator socket; default /run/memorizzd/memorizzd.sock as root, else
    $XDG_RUNTIME_DIR/memorizzd/memorizzd.sock."""
    state_dir: str = ""
    """SQLite state; default /var/lib/memorizzd as root, else $XDG_STATE_HOME/memorizzd."""
    servers: list[ServerSpec] = []
    """Read-only through the API (``[[servers]]`` tables; keys as ``servers/add``)."""
    host_allowlist: list[str] = []
    """Hosts HTTP servers may be on (``api.example.com``, ``*.example.com``); empty:
    any public host. Env MEMORIZZ_MCP_HOST_ALLOWLIST (comma-separated) adds to it."""
    stdio_allowlist: list[str] = []
    """Executables stdio servers may run (names or absolute paths); empty: any.
    Env MEMORIZZ_MCP_STDIO_ALLOWLIST (comma-separated) adds to it."""
    stdio_allow_inline_code: bool = False
    """Allow interpreter one-liners (``python -c``, ``node -e``, ``sh -c`` ...)."""
    decisions: Decisions = msgspec.field(default_factory=Decisions)
    connect_wait_s: float = 5.0
    """How long a call waits for a server that is (re)connecting before it fails."""
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 30.0
    health_interval_s: float = 30.0
    """An idle ready upstream is probed (ping / server/discover) this often."""
    health_timeout_s: float = 10.0
    """A probe that takes longer marks the session dead (it reconnects)."""
    max_in_flight_per_server: int = 256
    max_in_flight_per_connection: int = 64
    drain_timeout_s: float = 10.0
    """On SIGTERM, how long in-flight calls may take to finish."""
    list_page_limit: int = 100
    """List methods follow upstream cursors to the end, at most this many pages."""
    config_path: str | None = None
    """Where the config was read from (set by ``load``; not a TOML key)."""


_POSITIVE: Final = (
    "connect_wait_s",
    "backoff_initial_s",
    "backoff_max_s",
    "health_interval_s",
    "health_timeout_s",
    "max_in_flight_per_server",
    "max_in_flight_per_connection",
    "list_page_limit",
)


def default_state_dir() -> str:
    if os.geteuid() == 0:
        return "/var/lib/memorizzd"
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return os.path.join(base, "memorizzd")


def validate_server(spec: ServerSpec) -> None:
    """Checks msgspec cannot express; raises ValueError with a user-facing message."""
    if not spec.name or len(spec.name) > SERVER_NAME_MAX:
        raise ValueError(f"server name must be 1..{SERVER_NAME_MAX} characters")
    if not all((c.isascii() and c.isalnum()) or c in "-_." for c in spec.name):
        raise ValueError(
            f"server name {spec.name!r} may contain only letters, digits, '-', '_' and '.'"
        )
    if spec.transport == "stdio":
        if not spec.command:
            raise ValueError(f"server {spec.name!r}: transport stdio needs a command")
        if spec.url:
            raise ValueError(f"server {spec.name!r}: transport stdio takes no url")
    else:
        if not spec.url:
            raise ValueError(
                f"server {spec.name!r}: transport {spec.transport} needs a url"
            )
        if not spec.url.startswith(("http://", "https://")):
            raise ValueError(f"server {spec.name!r}: url must be http:// or https://")
        if spec.command or spec.args or spec.env or spec.cwd or spec.secret_env:
            raise ValueError(
                f"server {spec.name!r}: command, args, env, secret_env and cwd"
                " are for stdio servers"
            )
    _validate_secrets(spec)
    if not 0 < spec.timeout_s <= 3600:
        raise ValueError(f"server {spec.name!r}: timeout_s must be in (0, 3600]")
    if not 1024 <= spec.max_result_bytes <= 256 * 1024 * 1024:
        raise ValueError(
            f"server {spec.name!r}: max_result_bytes must be in [1024, 268435456]"
        )


def _validate_oauth(spec: ServerSpec, where: str) -> None:
    oauth_keys = (
        spec.oauth_client_id is not None
        or spec.oauth_client_secret is not None
        or spec.oauth_client_metadata_url is not None
        or bool(spec.oauth_scopes)
        or spec.oauth_token_endpoint_auth_method is not None
        or spec.oauth_redirect_uri is not None
    )
    if spec.auth != "oauth":
        if oauth_keys:
            raise ValueError(f'{where}: the oauth_* settings need auth = "oauth"')
        return
    if spec.oauth_client_secret is not None and not spec.oauth_client_id:
        raise ValueError(f"{where}: oauth_client_secret needs oauth_client_id")
    if spec.oauth_client_secret is not None and not _clean(spec.oauth_client_secret):
        raise ValueError(
            f"{where}: oauth_client_secret must be non-empty printable text"
        )
    if spec.oauth_client_id is not None and not _clean(spec.oauth_client_id):
        raise ValueError(f"{where}: oauth_client_id must be non-empty printable text")
    url = spec.oauth_client_metadata_url
    if url is not None:
        parts = urlsplit(url)
        if parts.scheme != "https" or parts.path in ("", "/") or parts.fragment:
            raise ValueError(
                f"{where}: oauth_client_metadata_url must be an https URL with a path"
            )
    for scope in spec.oauth_scopes:
        if not scope or not _clean(scope) or " " in scope:
            raise ValueError(f"{where}: oauth_scopes holds an empty or spaced scope")
    if spec.oauth_redirect_uri is not None and not redirect_uri_ok(
        spec.oauth_redirect_uri
    ):
        raise ValueError(
            f"{where}: oauth_redirect_uri must be http://127.0.0.1:PORT/PATH "
            "(loopback) or an https URL, without a fragment"
        )


def redirect_uri_ok(uri: str) -> bool:
    """Loopback ``http`` (RFC 8252 §7.3) or ``https``; no fragment."""
    parts = urlsplit(uri)
    loopback = parts.scheme == "http" and (parts.hostname or "") in LOOPBACK_HOSTS
    return (
        (loopback or parts.scheme == "https")
        and not parts.fragment
        and bool(parts.netloc)
    )


def _validate_secrets(spec: ServerSpec) -> None:
    """Auth, headers and secret env; messages never contain a value."""
    where = f"server {spec.name!r}"
    if spec.transport == "stdio" and (
        spec.auth != "none" or spec.token is not None or spec.headers
    ):
        raise ValueError(f"{where}: auth, token and headers are for HTTP servers")
    if spec.auth == "bearer" and not spec.token:
        raise ValueError(f"{where}: auth bearer needs a token")
    if spec.auth != "bearer" and spec.token is not None:
        raise ValueError(f"{where}: a token needs auth bearer")
    if spec.token is not None and not _clean(spec.token):
        raise ValueError(f"{where}: the token must be non-empty printable text")
    _validate_oauth(spec, where)
    seen: set[str] = set()
    for header, value in spec.headers.items():
        lower = header.lower()
        if not header or not set(header) <= _TOKEN_CHARS:
            raise ValueError(f"{where}: header name {header!r} is not a valid token")
        if lower in FORBIDDEN_HEADERS or lower.startswith("mcp-"):
            raise ValueError(f"{where}: header {header!r} is set by the transport")
        if lower == "authorization" and spec.auth != "none":
            raise ValueError(
                f"{where}: Authorization is set by auth {spec.auth}; not also in headers"
            )
        if lower in seen:
            raise ValueError(f"{where}: header {header!r} given twice")
        seen.add(lower)
        if not _clean(value):
            raise ValueError(
                f"{where}: the value of header {header!r} must be non-empty printable text"
            )
    for key, value in spec.secret_env.items():
        if not key or "=" in key or "\0" in key:
            raise ValueError(f"{where}: secret_env name {key!r} is not valid")
        if key in spec.env:
            raise ValueError(f"{where}: {key!r} is in both env and secret_env")
        if key in _CODE_ENV or key.startswith(_CODE_ENV_PREFIXES):
            raise ValueError(f"{where}: {key!r} belongs in env, not secret_env")
        if not value or "\0" in value:
            raise ValueError(
                f"{where}: the value of secret_env {key!r} must be non-empty, without NUL"
            )


def _clean(value: str) -> bool:
    """Non-empty, visible ASCII or space/tab, no surrounding whitespace."""
    return (
        bool(value)
        and value == value.strip()
        and all(c == "\t" or " " <= c <= "~" for c in value)
    )


def load(
    path: str | None,
    *,
    socket: str | None = None,
    state_dir: str | None = None,
) -> Config:
    """Read the config file (if any), apply overrides and defaults, validate."""
    config_path: Path | None
    if path is not None:
        config_path = Path(path)
        if not config_path.exists():
            raise ConfigError(f"{config_path}: no such file")
    else:
        config_path = DEFAULT_CONFIG_PATH if DEFAULT_CONFIG_PATH.exists() else None
    config = Config()
    if config_path is not None:
        try:
            raw = tomllib.loads(config_path.read_text(encoding="utf-8"))
            if "config_path" in raw:
                raise ConfigError(f"{config_path}: unknown key config_path")
            servers = msgspec.convert(raw.pop("servers", []), list[ConfigServer])
            config = msgspec.convert(raw, Config)
            config.servers = [
                msgspec.convert(msgspec.to_builtins(s), ServerSpec) for s in servers
            ]
        except OSError as exc:
            raise ConfigError(f"{config_path}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{config_path}: {exc}") from None
        except msgspec.ValidationError as exc:
            raise ConfigError(f"{config_path}: {_where(exc, raw)}") from None
    config.config_path = str(config_path) if config_path else None
    config.socket = (
        socket
        or os.environ.get("MEMORIZZ_SOCKET")
        or config.socket
        or os.path.join(default_runtime_dir(), "memorizzd.sock")
    )
    for key in _POSITIVE:
        if not getattr(config, key) > 0:
            raise ConfigError(f"{config_path}: {key} must be greater than 0")
    if config.drain_timeout_s < 0:
        raise ConfigError(f"{config_path}: drain_timeout_s must not be negative")
    config.state_dir = state_dir or config.state_dir or default_state_dir()
    config.host_allowlist = config.host_allowlist + _env_list(
        "MEMORIZZ_MCP_HOST_ALLOWLIST"
    )
    config.stdio_allowlist = config.stdio_allowlist + _env_list(
        "MEMORIZZ_MCP_STDIO_ALLOWLIST"
    )
    for pattern in config.host_allowlist:
        if normalise_pattern(pattern) is None:
            raise ConfigError(
                f"{config_path}: host_allowlist: {pattern!r} is not a host name or *.domain"
            )
    seen: set[str] = set()
    for i, spec in enumerate(config.servers):
        try:
            validate_server(spec)
        except ValueError as exc:
            raise ConfigError(f"{config_path}: $.servers[{i}]: {exc}") from None
        if spec.name in seen:
            raise ConfigError(f"{config_path}: duplicate server name {spec.name!r}")
        seen.add(spec.name)
    return config


def _where(exc: msgspec.ValidationError, raw: dict[str, object]) -> str:
    """msgspec's message, with server paths relative to the whole file."""
    text = str(exc)
    if "servers" not in raw and "- at `$[" in text:
        return text.replace("- at `$[", "- at `$.servers[")
    return text


def _env_list(name: str) -> list[str]:
    return [
        item.strip() for item in os.environ.get(name, "").split(",") if item.strip()
    ]
