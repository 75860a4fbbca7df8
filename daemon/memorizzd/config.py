"""Daemon configuration: embedded defaults, the TOML file, command-line overrides.

The TOML file is decoded straight into msgspec structs, so a bad key or type is
reported with its path (``$.servers[0].transport``). Servers declared in the
file are read-only through the API; servers added with ``servers/add`` live in
the state database.
"""

from __future__ import annotations

import grp
import ipaddress
import math
import os
import re
import stat
import sys
import tomllib
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Final, Literal, NamedTuple
from urllib.parse import urlsplit

import msgspec

from memorizz.api.digits import ascii_int
from memorizz.api.errors import RemoteError
from memorizz.api.methods import Decision, ServerSpec
from memorizz.api.paths import default_runtime_dir
from memorizz.api.presets import expand_preset, find_preset
from memorizz.api.protocol import MAX_FRAME
from memorizz.api.spec import SERVER_NAME_MAX, check_server_spec
from memorizzd.egress.urls import normalise_pattern
from memorizzd.telemetry import tracing

DEFAULT_CONFIG_PATH: Final = Path("/etc/memorizzd/memorizzd.toml")


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


class Credentials(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``[credentials]``: where secrets come from (docs/auth.md)."""

    stores: list[str] = msgspec.field(default_factory=lambda: ["vault", "systemd"])
    """``vault`` (always; written to), ``systemd`` (``credential:NAME``), and a
    deployment's own: ``module.path:factory`` or an entry point's name in the
    group ``memorizz.credential_stores``."""


class Limits(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Per-socket limits (``[profiles.limits]``; the operator socket's are fixed)."""

    max_connections: int = 64
    """Connections open at once on this socket; past it a new one is refused
    (``overloaded``) and closed at once."""
    max_connections_per_uid: int = 32
    """Connections open at once on this socket from one peer uid; past it a new
    one from that uid is refused (``overloaded``) and closed at once."""
    max_in_flight: int = 64
    """Requests in flight at once over all of this socket's connections; past
    it a request is answered ``overloaded`` at once."""
    max_request_bytes: int = MAX_FRAME
    """Largest request line; a longer one closes the connection (``frame_too_large``)."""
    max_open_proposals: int = 100
    """Proposals of this profile's open at once (pending or approved, not yet
    run, rejected or expired); past it a call that would propose one is
    answered ``overloaded`` and nothing is stored (each holds its arguments,
    up to ``max_request_bytes``, until it ends)."""
    first_frame_timeout_s: float = 10.0
    """A connection that sends no complete request line this long after it was
    accepted is closed (slowloris)."""
    write_timeout_s: float = 30.0
    """A client that leaves a reply unread this long (its socket buffer full)
    is cut off (a slow reader holds the daemon's memory)."""
    idle_timeout_s: float = 600.0
    """A connection with no request in flight that completes no request line
    this long is closed, with an ``idle_timeout`` line first (the Python client
    then reconnects by itself). Slow-drip connections cannot hold a slot."""


class Profile(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """An agent profile (``[[profiles]]``): one socket, the servers it reaches."""

    name: str
    servers: list[str] = []
    """The servers this profile's callers may use (by name); others do not exist for it."""
    uids: list[int] = []
    """Peer uids allowed to connect; with ``gids`` empty too, anyone who can
    open the socket file."""
    gids: list[int | str] = []
    """Groups (names or gids; primary or supplementary) allowed to connect."""
    socket_group: int | str | None = None
    """Group owning the socket (mode 0660); without it the socket is 0666 when
    ``uids``/``gids`` gate it in-process, else 0660 with the daemon's group."""
    limits: Limits = msgspec.field(default_factory=Limits)
    face_tools: list[Literal["proposals", "resume"]] = []
    """Built-in tools on this profile's MCP face (off unless named):
    ``proposals`` (``memorizz__proposals``: the profile's own proposals and
    their status) and ``resume`` (``memorizz__resume``: run an approved one)."""
    separator: str = "__"
    """Between a server's name and a tool's (or prompt's) on this profile's
    MCP face: 1 to 3 characters of ``[A-Za-z0-9_-]``."""


class Operators(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Who may use the operator socket (``[operators]``), checked in-process on
    the kernel-reported peer credentials. The daemon's own uid always may."""

    uids: list[int] = []
    groups: list[int | str] = []
    """Group names or gids (primary or supplementary)."""
    allow_root: bool = False
    """true: uid 0 is an operator, with no need to list it in ``uids``. false:
    uid 0 is refused even when listed in ``uids`` or a member of ``groups``
    (unless the daemon itself runs as root): root in a container without user
    namespaces is uid 0 on the host too."""
    socket_group: int | str | None = None
    """Group owning the operator socket (mode 0660)."""


class Metrics(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Prometheus metrics (``[metrics]``; docs/operations.md)."""

    enabled: bool = True
    """Count calls and serve ``GET /metrics`` on ``socket`` (and ``listen``,
    when set); false: neither."""
    socket: str = ""
    """Default: ``metrics.sock`` beside the operator socket, with its mode,
    group and rule (operators only)."""
    listen: str = ""
    """Also on TCP, e.g. ``127.0.0.1:9464`` or ``[::1]:9464``; loopback only
    unless ``allow_remote``."""
    allow_remote: bool = False
    """Let ``listen`` be an address other hosts can reach (no authentication:
    put it behind a firewall or a proxy)."""


class Tracing(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """OpenTelemetry traces (``[tracing]``): needs ``memorizzd[otel]``."""

    enabled: bool = False
    endpoint: str = ""
    """OTLP/HTTP traces endpoint, e.g. ``http://127.0.0.1:4318/v1/traces``;
    empty: the exporter's default (``OTEL_EXPORTER_OTLP_*``)."""
    service_name: str = "memorizzd"


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
    operators: Operators = msgspec.field(default_factory=Operators)
    profiles: list[Profile] = []
    """Agent profiles (``[[profiles]]``), each with its own socket."""
    agents_dir: str = ""
    """Where agent sockets live: ``<agents_dir>/<profile>/api.sock``; default
    ``agents`` next to the operator socket (/run/memorizzd/agents)."""
    approval_ttl_s: float = 900.0
    """How long a proposal waits for approval and then for its resume (15 min)."""
    mcp_face: bool = True
    """Serve MCP on ``mcp.sock`` beside each API socket (``face.py``)."""
    face_approval_wait_s: float = 50.0
    """How long a face's tool call decided ``ask`` waits for the operator
    before it answers "still pending" (0: at once). Below the 60 s request
    timeout common MCP clients use."""
    upstream_request_wait_s: float = 120.0
    """How long an upstream's elicitation or sampling request waits for the
    caller's answer (never past the call's own deadline)."""
    face_separator: str = "__"
    """The operator face's ``separator`` (a profile's face has its own)."""
    metrics: Metrics = msgspec.field(default_factory=Metrics)
    tracing: Tracing = msgspec.field(default_factory=Tracing)
    credentials: Credentials = msgspec.field(default_factory=Credentials)
    config_path: str | None = None
    """Where the config was read from (set by ``load``; not a TOML key)."""


SEPARATOR_OK: Final = re.compile(r"[A-Za-z0-9_-]{1,3}")
"""A face's separator between a server's name and a tool's."""

YEAR_S: Final = 365 * 86400.0
"""The longest duration a setting takes (31,536,000 s). Every deadline and
expiry made from one stays a time the clock and the calendar hold: a
proposal's ``expires_at``, written as a time of day in the reply that stores
it (``approval_ttl_s = 1e20`` made every proposal an internal error:
``time.gmtime`` overflows past year 3e9), a drain's, a backoff's, a
connection's deadline."""
COUNT_MAX: Final = 1_000_000
"""The largest count a setting takes: far past what a host serves at once
(connections are file descriptors; each open proposal holds its arguments in
the state database), and a number every use of it holds. A count of more
than 308 digits is no float either: it broke the range checks themselves
(``OverflowError``)."""


SHORTEST_S: Final = 0.001
"""The shortest duration a setting takes (1 ms; 0 where ``Bound.zero``): below
it a backoff or a health interval is a busy loop (``backoff_initial_s =
5e-324`` restarted a failing server as fast as it could exit), and no deadline
of the loop's clock is finer."""


class Bound(NamedTuple):
    """The range of one numeric setting: a finite number, above 0 (or 0 too,
    with ``zero``) and at least ``least`` (0 too, with ``zero``), at most
    ``most``."""

    most: float
    unit: str
    """How ``most`` is shown: ``" s (365 days)"`` after a duration's."""
    zero: bool = False
    least: float = 0.0


_DURATION: Final = Bound(YEAR_S, " s (365 days)", least=SHORTEST_S)
_COUNT: Final = Bound(COUNT_MAX, "")
BOUNDS: Final[Mapping[str, Bound]] = MappingProxyType(
    {
        "connect_wait_s": _DURATION,
        "backoff_initial_s": _DURATION,
        "backoff_max_s": _DURATION,
        "health_interval_s": _DURATION,
        "health_timeout_s": _DURATION,
        "drain_timeout_s": _DURATION._replace(zero=True),  # 0: no drain
        "approval_ttl_s": _DURATION,
        "face_approval_wait_s": _DURATION._replace(zero=True),  # "pending" at once
        "upstream_request_wait_s": _DURATION,
        "max_in_flight_per_server": _COUNT,
        "max_in_flight_per_connection": _COUNT,
        "list_page_limit": _COUNT,
        "limits.max_connections": _COUNT,
        "limits.max_connections_per_uid": _COUNT,
        "limits.max_in_flight": _COUNT,
        "limits.max_request_bytes": Bound(MAX_FRAME, " bytes (1 MiB)"),
        "limits.max_open_proposals": _COUNT,
        "limits.first_frame_timeout_s": _DURATION,
        "limits.write_timeout_s": _DURATION,
        "limits.idle_timeout_s": _DURATION,
    }
)
"""Every numeric setting of the file but a server's (``check_server_spec``
bounds ``timeout_s``, ``max_result_bytes`` and ``replicas``), by key:
``limits.*`` are each profile's. One check applies them all
(``_check_numbers``), at start, ``--check-config`` and every reload."""


def shown(value: float) -> str:
    """A number as an error message shows it: a float in at most 15 digits
    (``31536000``, ``1e+300``), an integer of more than 38 digits by its size
    only (an integer of TOML may have thousands, more than ``str`` writes)."""
    if not isinstance(value, int):
        return f"{value:.15g}"
    if value.bit_length() <= 127:
        return str(value)
    digits = int(value.bit_length() * math.log10(2)) + 1
    return f"an integer of about {digits} digits"


def range_error(
    key: str, value: float, bound: Bound, *, above_zero: str = "greater than 0"
) -> str | None:
    """What is wrong with ``value`` for ``key`` (as the message names it),
    if anything."""
    if not isinstance(value, int) and not math.isfinite(value):
        # nan passes no range check; inf breaks every deadline and expiry
        # made from it (a proposal's expires_at, the drain's deadline)
        return f"{key} must be a finite number, not {value}"
    if bound.zero and value < 0:
        return f"{key} must not be negative"
    if not bound.zero and not value > 0:
        return f"{key} must be {above_zero}"
    if 0 < value < bound.least:
        shortest = shown(bound.least) + bound.unit.split(" (")[0]
        zero = " (or 0)" if bound.zero else ""
        return f"{key} must be at least {shortest}{zero}, not {shown(value)}"
    if value > bound.most:
        return (
            f"{key} must be at most {shown(bound.most)}{bound.unit}, not {shown(value)}"
        )
    return None


_OUT_OF_RANGE: Final = re.compile(
    r"Number out of range - at `\$\.(?:profiles\[\d+\]\.)?(?P<key>[a-z_.]+)`"
)
"""msgspec's word for an integer too large for a float (more than 308 digits)."""


def _with_bound(message: str) -> str:
    """msgspec's message, with the setting's maximum when it says a number is
    out of range (a float cannot hold it)."""
    found = _OUT_OF_RANGE.fullmatch(message)
    bound = None if found is None else BOUNDS.get(found["key"])
    if bound is None:
        return message
    return f"{message}: at most {shown(bound.most)}{bound.unit}"


def _check_numbers(config: Config, where: Path | None) -> None:
    """``BOUNDS``, on the top-level settings and each profile's limits."""
    for key, bound in BOUNDS.items():
        table, _, name = key.rpartition(".")
        if not table:
            found = [(key, getattr(config, key))]
        else:
            found = [
                (f"profile {p.name!r}: {key}", getattr(p.limits, name))
                for p in config.profiles
            ]
        for label, value in found:
            error = range_error(
                label, value, bound, above_zero="> 0" if table else "greater than 0"
            )
            if error is not None:
                raise ConfigError(f"{where}: {error}")


def systemd_directory(kind: str) -> str | None:
    """The directory systemd made for the service (``StateDirectory=`` ->
    ``$STATE_DIRECTORY``, ``RuntimeDirectory=`` -> ``$RUNTIME_DIRECTORY``,
    ``ConfigurationDirectory=`` -> ``$CONFIGURATION_DIRECTORY``): the first
    of a colon-separated list; None outside such a unit."""
    value = os.environ.get(f"{kind}_DIRECTORY", "").split(":")[0]
    return value if os.path.isabs(value) else None


def default_config_path() -> Path:
    """``$CONFIGURATION_DIRECTORY/memorizzd.toml`` under systemd, else
    /etc/memorizzd/memorizzd.toml."""
    directory = systemd_directory("CONFIGURATION")
    return (
        Path(directory, DEFAULT_CONFIG_PATH.name) if directory else DEFAULT_CONFIG_PATH
    )


def default_state_dir() -> str:
    if directory := systemd_directory("STATE"):
        return directory  # a unit's StateDirectory=, whoever the daemon runs as
    if os.geteuid() == 0:
        return "/var/lib/memorizzd"
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return os.path.join(base, "memorizzd")


def load(
    path: str | None,
    *,
    socket: str | None = None,
    state_dir: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> Config:
    """Read the config file (if any), apply overrides and defaults, validate.

    ``environ``: where ``MEMORIZZ_SOCKET`` and the allowlists' variables are
    read (default ``os.environ``; a reload passes those the daemon started
    with, scrubbed from its environment since)."""
    env = os.environ if environ is None else environ
    config_path: Path | None
    if path is not None:
        config_path = Path(path)
        if not _exists(config_path):
            raise ConfigError(f"{config_path}: no such file")
    else:
        default = default_config_path()
        config_path = default if _exists(default) else None
    config = Config()
    if config_path is not None:
        raw = _read_toml(config_path)
        if "config_path" in raw:
            raise ConfigError(f"{config_path}: unknown key config_path")
        try:
            _refuse_nul(raw, "$", config_path)
        except RecursionError:  # dotted keys nest tables with no recursion in tomllib
            raise ConfigError(f"{config_path}: tables nested too deeply") from None
        try:
            servers = msgspec.convert(
                _preset_transports(raw.pop("servers", []), config_path),
                list[ConfigServer],
            )
        except msgspec.ValidationError as exc:
            raise ConfigError(f"{config_path}: {_at_servers(exc)}") from None
        try:
            config = msgspec.convert(raw, Config)
        except msgspec.ValidationError as exc:
            raise ConfigError(f"{config_path}: {_with_bound(str(exc))}") from None
        config.servers = [
            msgspec.convert(msgspec.to_builtins(s), ServerSpec) for s in servers
        ]
    config.config_path = str(config_path) if config_path else None
    config.socket = (
        socket
        or env.get("MEMORIZZ_SOCKET")
        or config.socket
        or os.path.join(
            systemd_directory("RUNTIME") or default_runtime_dir(), "memorizzd.sock"
        )
    )
    _check_numbers(config, config_path)
    stores = config.credentials.stores
    if "vault" not in stores or len(set(stores)) != len(stores):
        raise ConfigError(
            f'{config_path}: [credentials] stores must name "vault", and each store once'
        )
    separators = [("face_separator", config.face_separator)] + [
        (f"profile {p.name!r}: separator", p.separator) for p in config.profiles
    ]
    for key, separator in separators:
        if not SEPARATOR_OK.fullmatch(separator):
            raise ConfigError(
                f"{config_path}: {key} must be 1 to 3 characters of"
                f" [A-Za-z0-9_-], not {separator[:10]!r}"
            )
    config.state_dir = state_dir or config.state_dir or default_state_dir()
    from_env = _env_list(env, "MEMORIZZ_MCP_HOST_ALLOWLIST")
    for where, patterns in (
        (f"{config_path or 'the defaults'}: host_allowlist", config.host_allowlist),
        ("$MEMORIZZ_MCP_HOST_ALLOWLIST", from_env),
    ):
        for pattern in patterns:
            if normalise_pattern(pattern) is None:
                raise ConfigError(
                    f"{where}: {pattern!r} is not a host name, *.domain or IP address"
                )
    config.host_allowlist = config.host_allowlist + from_env
    config.stdio_allowlist = config.stdio_allowlist + _env_list(
        env, "MEMORIZZ_MCP_STDIO_ALLOWLIST"
    )
    config.agents_dir = config.agents_dir or os.path.join(
        os.path.dirname(config.socket) or ".", "agents"
    )
    _check_metrics(config.metrics, config_path)
    _check_tracing_values(config.tracing, config_path)
    _check_access(config, config_path)
    _check_socket_paths(config, config_path)
    seen: dict[str, int] = {}
    for i, given in enumerate(config.servers):
        try:
            spec = config.servers[i] = expand_preset(given)  # preset = "..."
            check_server_spec(spec)  # the same checks as servers/add and the CLI
        except RemoteError as exc:
            raise ConfigError(f"{config_path}: $.servers[{i}]: {exc.message}") from None
        if spec.name in seen:
            raise ConfigError(
                f"{config_path}: $.servers[{i}]: duplicate server name {spec.name!r}"
                f" (also $.servers[{seen[spec.name]}])"
            )
        seen[spec.name] = i
    return config


SUN_PATH_MAX: Final = 107
"""The longest path an AF_UNIX socket can be bound at (``sun_path`` is 108
bytes, with its NUL)."""


def _check_socket_paths(config: Config, where: Path | None) -> None:
    """Every socket the daemon binds fits in ``sun_path`` (else its start
    would end in a traceback): the operator socket and what it binds beside
    it (``mcp.sock``, ``metrics.sock``), and each profile's directory with
    ``api.sock`` and ``mcp.sock`` (``memorizzd.listeners``)."""
    beside = os.path.dirname(config.socket) or "."
    paths = [("socket", config.socket)]
    if config.mcp_face:
        paths.append(("mcp_face", os.path.join(beside, "mcp.sock")))
    if config.metrics.enabled:
        metrics = config.metrics.socket or os.path.join(beside, "metrics.sock")
        paths.append(("metrics.socket", metrics))
    paths += [
        (
            f"profile {p.name!r}'s socket",
            os.path.join(config.agents_dir, p.name, "api.sock"),
        )
        for p in config.profiles
    ]
    bound: dict[str, str] = {}
    for key, path in paths:
        if (size := len(os.fsencode(path))) > SUN_PATH_MAX:
            raise ConfigError(
                f"{f'{where}: ' if where else ''}{key}: {path!r} is {size} bytes"
                f" long; a Unix socket's path may be at most {SUN_PATH_MAX}"
            )
        # a socket named mcp.sock met its own face at the bind, and the start
        # said "another memorizzd is already listening" with none running
        if (other := bound.setdefault(os.path.normpath(path), key)) != key:
            raise ConfigError(
                f"{f'{where}: ' if where else ''}{other} and {key} would both be"
                f" bound at {path!r}; give each a path of its own (the daemon"
                " binds mcp.sock and metrics.sock beside the socket)"
            )


def _exists(path: Path) -> bool:
    """Whether ``path`` names something; a ConfigError where that cannot be
    told (a name too long, a directory that cannot be searched)."""
    try:
        return path.exists()
    except OSError as exc:
        raise ConfigError(f"{path}: {exc.strerror}") from None


def _read_toml(path: Path) -> dict[str, object]:
    """The file's TOML; a ConfigError that says where it cannot be read.
    Only a regular file is read: a FIFO or a device at the path would block
    the read (a reload's for ever) or never end."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError(f"{path}: {exc.strerror}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ConfigError(f"{path}: not a regular file")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read()
    except OSError as exc:
        raise ConfigError(f"{path}: {exc.strerror}") from None
    finally:
        os.close(fd)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise ConfigError(
            f"{path}: not UTF-8 text: byte 0x{data[exc.start]:02x}"
            f" (at line {line}, column {column})"
        ) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    except ValueError:  # int() of a decimal integer past its digits' limit
        raise ConfigError(
            f"{path}: an integer of more than {sys.get_int_max_str_digits()}"
            " digits (no setting takes one)"
        ) from None
    except RecursionError:  # tomllib parses nested arrays and tables recursively
        raise ConfigError(
            f"{path}: arrays or inline tables nested too deeply"
        ) from None


def _refuse_nul(value: object, at: str, where: Path) -> None:
    """No string of the file holds a NUL: not a path, a command, an argument
    or a variable can carry one (the OS refuses it where it is used, far from
    the file)."""
    if isinstance(value, str):
        if "\0" in value:
            raise ConfigError(f"{where}: {at}: a NUL character is not allowed")
    elif isinstance(value, dict):
        for key, item in value.items():
            if "\0" in key:
                raise ConfigError(
                    f"{where}: {at}: a NUL character is not allowed in a key"
                )
            _refuse_nul(item, f"{at}.{key}", where)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _refuse_nul(item, f"{at}[{i}]", where)


def metrics_address(listen: str) -> tuple[str, int]:
    """``host:port`` (IPv6 in brackets) as (host, port); ValueError if malformed."""
    host, colon, port_text = listen.rpartition(":")
    port = ascii_int(port_text, max_digits=5)
    if not colon or port is None or not 0 < port < 65536 or not host:
        raise ValueError(f"metrics.listen: {listen!r} is not host:port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, port


def _check_metrics(metrics: Metrics, where: Path | None) -> None:
    """``socket`` is absolute; ``listen`` parses, and is loopback unless
    ``allow_remote``."""
    if metrics.socket and not os.path.isabs(metrics.socket):
        raise ConfigError(
            f"{where}: metrics.socket: {metrics.socket!r} must be an absolute path"
        )
    if not metrics.listen:
        return
    try:
        host, _ = metrics_address(metrics.listen)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        raise ConfigError(
            f"{where}: metrics.listen: {host!r} is not an IP address or localhost"
        ) from None
    if not loopback and not metrics.allow_remote:
        raise ConfigError(
            f"{where}: metrics.listen: {host} is not a loopback address;"
            " set metrics.allow_remote = true to serve metrics to other hosts"
        )


def _check_tracing_values(tracing: Tracing, where: Path | None) -> None:
    """``endpoint`` (when given) is an http(s) URL; ``service_name`` is not
    empty (the exporter would name the daemon ``unknown_service:python``)."""
    endpoint = tracing.endpoint
    if endpoint:
        try:
            parts = urlsplit(endpoint)
            url_ok = parts.scheme in ("http", "https") and bool(parts.hostname)
        except ValueError:  # e.g. an unclosed [ of an IPv6 address
            url_ok = False
        if not url_ok:
            raise ConfigError(
                f"{where}: tracing.endpoint: {endpoint[:200]!r} is not an http(s) URL"
                " (e.g. http://127.0.0.1:4318/v1/traces)"
            )
    if not tracing.service_name.strip():
        raise ConfigError(f"{where}: tracing.service_name must not be empty")


GID_MAX: Final = 2**32 - 2
"""The largest gid (``(gid_t) -1`` means "no change" to chown)."""


def check_tracing(config: Config) -> None:
    """``[tracing] enabled`` needs the otel extra (OpenTelemetry's SDK and
    OTLP exporter): ``ConfigError`` without it. Asked by ``--check-config``
    and at the start, before anything is started; not by ``load`` (a reload
    applies no ``[tracing]`` change: it takes a restart)."""
    if config.tracing.enabled:
        try:
            tracing.check()
        except tracing.TracingUnavailableError as exc:
            raise ConfigError(str(exc)) from None


def gid_of(group: int | str) -> int:
    """A group name or gid as a gid; ValueError for an unknown name or a gid
    out of range (chown would raise OverflowError, at start or mid-reload)."""
    if isinstance(group, int):
        if not 0 <= group <= GID_MAX:
            raise ValueError(f"gid {shown(group)} is out of range (0..{GID_MAX})")
        return group
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise ValueError(f"unknown group {group!r}") from None


def _check_access(config: Config, where: Path | None) -> None:
    """Profiles: valid distinct names; every group resolves (the limits'
    ranges: ``BOUNDS``)."""
    try:
        for group in config.operators.groups:
            _gid(group, "operators.groups")
        if config.operators.socket_group is not None:
            _gid(config.operators.socket_group, "operators.socket_group")
        names: set[str] = set()
        for profile in config.profiles:
            name = profile.name
            if (
                not name
                or len(name) > SERVER_NAME_MAX
                or name.startswith(".")
                or not all((c.isascii() and c.isalnum()) or c in "-_." for c in name)
            ):
                raise ValueError(
                    f"profile name {name!r}: 1..{SERVER_NAME_MAX} letters, digits,"
                    " '-', '_' or '.', not starting with '.'"
                )
            if name == "operator" or name in names:
                raise ValueError(f"profile name {name!r} is reserved or given twice")
            names.add(name)
            for group in profile.gids:
                _gid(group, f"profile {name!r}: gids")
            if profile.socket_group is not None:
                _gid(profile.socket_group, f"profile {name!r}: socket_group")
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def open_caps(config: Config) -> dict[str, int]:
    """Each profile's ``limits.max_open_proposals``, by name (``ApprovalBook``)."""
    return {p.name: p.limits.max_open_proposals for p in config.profiles}


def _gid(group: int | str, key: str) -> None:
    try:
        gid_of(group)
    except ValueError as exc:
        raise ValueError(f"{key}: {exc}") from None


def _preset_transports(servers: object, where: Path) -> object:
    """``[[servers]]`` entries with a ``preset`` and no ``transport`` get the
    preset's (the rest of the preset is applied to the decoded spec)."""
    if not isinstance(servers, list):
        return servers
    filled: list[object] = []
    for i, entry in enumerate(servers):
        if isinstance(entry, dict) and "transport" not in entry:
            preset = entry.get("preset")
            if isinstance(preset, str):
                try:
                    entry = {**entry, "transport": find_preset(preset).transport}
                except RemoteError as exc:
                    raise ConfigError(
                        f"{where}: $.servers[{i}]: {exc.message}"
                    ) from None
        filled.append(entry)
    return filled


def _at_servers(exc: msgspec.ValidationError) -> str:
    """msgspec's message on the ``servers`` array, with its path relative to
    the whole file (``$[0]`` is ``$.servers[0]``; ``$`` is ``$.servers``)."""
    text = str(exc)
    if "- at `$" in text:
        return text.replace("- at `$", "- at `$.servers")
    return f"{text} - at `$.servers`"


def _env_list(env: Mapping[str, str], name: str) -> list[str]:
    return [item.strip() for item in env.get(name, "").split(",") if item.strip()]
