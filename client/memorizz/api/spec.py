"""What a ``ServerSpec`` must be, whoever checks it: the one validation.

``check_server_spec`` holds every check that needs nothing but the spec
(the name; transport, command and url shape; timeouts and caps; auth kinds,
tokens, headers and secret env names; the OAuth settings). The CLI runs it
before it sends ``servers/add`` (``memorizzctl mcp add``), and the daemon
runs it on ``servers/add`` and on every ``[[servers]]`` entry of its config
file, so that the same bad spec gets the same ``reason`` and message
everywhere. What needs the daemon's state stays in the daemon: the host
allowlist and the address checks of the egress policy, the stdio allowlist.

Messages name the server and the setting, never a secret's value.
Standard library and the wire contract only.
"""

from __future__ import annotations

import re
from typing import Final, NoReturn
from urllib.parse import SplitResult, urlsplit

import msgspec

from memorizz.api.errors import InvalidParamsError, PermissionDeniedError
from memorizz.api.methods import ServerSpec

SERVER_NAME_MAX: Final = 64
MAX_REPLICAS: Final = 16
ROOTS_MAX: Final = 64
ROOT_MAX: Final = 4096
"""The longest root URI taken (characters)."""
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
_SCHEME: Final = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")


def check_server_spec(spec: ServerSpec) -> None:
    """Raise the error ``servers/add`` answers for ``spec``, if any.

    ``InvalidParamsError`` (``invalid_params``) for a spec that cannot work;
    ``PermissionDeniedError`` (``scheme_not_allowed``) for a URL whose scheme
    is neither https nor http."""
    if not spec.name or len(spec.name) > SERVER_NAME_MAX:
        _invalid(f"server name must be 1..{SERVER_NAME_MAX} characters")
    if not all((c.isascii() and c.isalnum()) or c in "-_." for c in spec.name):
        _invalid(
            f"server name {spec.name!r} may contain only letters, digits, '-', '_' and '.'"
        )
    where = f"server {spec.name!r}"
    _check_nul(spec, where)
    for key in ("allow_tools", "block_tools"):
        if any(not pattern for pattern in getattr(spec, key)):
            _invalid(f"{where}: {key}: an empty name matches no tool")
    if (spec.transport == "builtin") != (spec.builtin is not None):
        _invalid(f'{where}: transport "builtin" goes with builtin (the bridge\'s name)')
    if spec.transport == "builtin":
        _check_builtin(spec, where)
    elif spec.transport == "stdio":
        if not spec.command:
            _invalid(f"{where}: transport stdio needs a command")
        if spec.url:
            _invalid(f"{where}: transport stdio takes no url")
    else:
        if not spec.url:
            _invalid(f"{where}: transport {spec.transport} needs a url")
        _check_scheme(spec.url, where)
        if spec.command or spec.args or spec.env or spec.cwd or spec.secret_env:
            _invalid(
                f"{where}: command, args, env, secret_env and cwd are for stdio servers"
            )
    _check_secrets(spec, where)
    if not 0 < spec.timeout_s <= 3600:
        _invalid(f"{where}: timeout_s must be in (0, 3600]")
    if not 1024 <= spec.max_result_bytes <= 256 * 1024 * 1024:
        _invalid(f"{where}: max_result_bytes must be in [1024, 268435456]")
    if not 1 <= spec.replicas <= MAX_REPLICAS:
        _invalid(f"{where}: replicas must be in 1..{MAX_REPLICAS}")
    if spec.replicas > 1 and spec.transport != "stdio":
        _invalid(f"{where}: replicas are for stdio servers")
    _check_roots(spec.roots, where)
    _check_connection(spec, where)


FIXED_ARGUMENTS_MAX: Final = 16
INSTRUCTIONS_MAX: Final = 4000
"""The longest instructions text taken (characters)."""
_ARGUMENT_NAME: Final = re.compile(r"[A-Za-z0-9_.$-]{1,64}")


def _check_connection(spec: ServerSpec, where: str) -> None:
    """``workspace`` (with a preset), ``fixed_arguments``, ``instructions``."""
    if spec.workspace is not None and (
        spec.preset is None or not _clean(spec.workspace) or len(spec.workspace) > 256
    ):
        _invalid(
            f"{where}: workspace needs a preset that takes one, and must be"
            " printable text of at most 256 characters"
        )
    if len(spec.fixed_arguments) > FIXED_ARGUMENTS_MAX:
        _invalid(f"{where}: at most {FIXED_ARGUMENTS_MAX} fixed_arguments")
    for key, value in spec.fixed_arguments.items():
        if not _ARGUMENT_NAME.fullmatch(key):
            _invalid(f"{where}: fixed_arguments name {key[:80]!r} is not valid")
        if not _clean(value) or len(value) > 256:
            _invalid(
                f"{where}: fixed_arguments {key!r} must be printable text of at"
                " most 256 characters"
            )
    text = spec.instructions
    if isinstance(text, str) and (
        not text.strip()
        or len(text) > INSTRUCTIONS_MAX
        or not all(c.isprintable() or c in "\n\t" for c in text)
    ):
        _invalid(
            f"{where}: instructions must be printable text of 1..{INSTRUCTIONS_MAX}"
            " characters (false: none)"
        )


COGNEE_DOMAIN: Final = "aws.cognee.ai"
"""Cognee Cloud tenants live at ``https://TENANT.aws.cognee.ai``."""
_COGNEE_HOST: Final = re.compile(
    r"(?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)+aws\.cognee\.ai"
)


def cognee_tenant_url(url: str) -> str:
    """The Cognee Cloud tenant base URL ``url`` as the bridge uses it
    (``https://HOST``); ``InvalidParamsError`` naming the rule it breaks:
    https only, a host under ``*.aws.cognee.ai``, and no credentials, port,
    path, query or fragment. The rule is the configured URL's, everywhere:
    nothing turns it off (tests answer the tenant's name with a DNS stand-in)."""
    text = url.strip()
    rule = "the Cognee tenant URL must be https://TENANT.aws.cognee.ai"
    if text != url or not url.isprintable() or "\\" in url or len(url) > 300:
        _invalid(f"{rule}: it contains spaces, control characters or a backslash")
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() != "https":
        _invalid(f"{rule}: https only")
    if "#" in rest:
        _invalid(f"{rule}: no fragment (#...)")
    if "?" in rest:
        _invalid(f"{rule}: no query (?...)")
    authority, slash, path = rest.partition("/")
    if slash and path:
        _invalid(f"{rule}: no path (the bridge adds /api/v1/...)")
    if "@" in authority:
        _invalid(f"{rule}: no credentials in the URL (the API key goes in --token)")
    if ":" in authority:
        _invalid(f"{rule}: no port")
    host = authority.lower()
    if not _COGNEE_HOST.fullmatch(host) or len(host) > 253:
        _invalid(f"{rule}: the host must be under *.{COGNEE_DOMAIN}")
    return f"https://{host}"


def _check_builtin(spec: ServerSpec, where: str) -> None:
    """The Cognee bridge: its tenant URL (if given: a stored spec keeps it in
    the vault) and its API key (``auth = "bearer"``, the token); nothing of a
    process or of an MCP endpoint."""
    if spec.url is not None:
        try:
            cognee_tenant_url(spec.url)
        except InvalidParamsError as exc:
            _invalid(f"{where}: {exc.message}")
    else:
        _invalid(f"{where}: the cognee bridge needs its tenant URL (--url)")
    if spec.auth != "bearer":
        if spec.token is not None:  # the key is there: the auth kind is not
            _invalid(
                f'{where}: the cognee bridge\'s API key goes with auth = "bearer"'
                f" (auth is {spec.auth!r})"
            )
        _invalid(f"{where}: the cognee bridge needs its API key (--token -)")
    if spec.command or spec.args or spec.env or spec.cwd or spec.secret_env:
        _invalid(
            f"{where}: command, args, env, secret_env and cwd are for stdio servers"
        )
    if spec.headers or spec.roots or spec.allow_private_network:
        _invalid(
            f"{where}: headers, roots and allow_private_network are not for the"
            " cognee bridge"
        )


def _check_roots(roots: list[str], where: str) -> None:
    """At most ``ROOTS_MAX`` ``file://`` URIs of absolute paths (no host, no
    query or fragment, no control characters)."""
    if len(roots) > ROOTS_MAX:
        _invalid(f"{where}: at most {ROOTS_MAX} roots")
    for root in roots:
        parts = _split(root)
        if (
            parts is None
            or len(root) > ROOT_MAX
            or not root.startswith("file:///")
            or parts.scheme != "file"
            or parts.netloc
            or not parts.path.startswith("/")
            or parts.query
            or parts.fragment
            or not root.isprintable()
        ):
            _invalid(
                f"{where}: a root must be a file:// URI of an absolute path "
                f"(file:///path), got {root[:80]!r}"
            )


def _check_scheme(url: str, where: str) -> None:
    """http or https (in any case, RFC 3986 §3.1); any other scheme is refused
    as such, as the egress policy refuses it; the rest of the URL is the
    egress policy's (``memorizzd.egress.urls``)."""
    scheme = _SCHEME.match(url)
    if scheme is None:
        _invalid(f"{where}: the url must be an absolute https:// URL")
    if scheme.group(1).lower() not in ("http", "https"):
        raise PermissionDeniedError(
            f"scheme_not_allowed: {where}: the url must be https:// (or http://"
            " with allow_private_network)",
            reason="scheme_not_allowed",
        )


def redirect_uri_ok(uri: str) -> bool:
    """Loopback ``http`` (RFC 8252 §7.3) or ``https``; no fragment."""
    parts = _split(uri)
    if parts is None:
        return False
    loopback = parts.scheme == "http" and (parts.hostname or "") in LOOPBACK_HOSTS
    return (
        (loopback or parts.scheme == "https")
        and not parts.fragment
        and bool(parts.netloc)
    )


def _split(url: str) -> SplitResult | None:
    """``url``'s parts; None when urllib finds it malformed (``http://[x``
    raises ValueError there, which must not reach the caller as a bug)."""
    try:
        return urlsplit(url)
    except ValueError:
        return None


def _check_nul(spec: ServerSpec, where: str) -> None:
    """No string of the spec holds a NUL: no path, command, argument,
    variable or header can carry one (the OS or the HTTP stack would refuse
    it far from here). Names the field, never its value (it may be secret)."""

    def check(value: object, at: str) -> None:
        if isinstance(value, str):
            if "\0" in value:
                _invalid(f"{where}: {at}: a NUL character is not allowed")
        elif isinstance(value, dict):
            for key, item in value.items():
                if "\0" in key:
                    _invalid(f"{where}: {at}: a NUL character is not allowed in a key")
                check(item, f"{at}.{key}")
        elif isinstance(value, list):
            for i, item in enumerate(value):
                check(item, f"{at}[{i}]")

    for field, value in msgspec.structs.asdict(spec).items():
        check(value, field)


def _invalid(message: str) -> NoReturn:
    raise InvalidParamsError(message)


def _check_secrets(spec: ServerSpec, where: str) -> None:
    """Auth, headers and secret env; messages never contain a value."""
    if spec.transport == "stdio" and (
        spec.auth != "none" or spec.token is not None or spec.headers
    ):
        _invalid(f"{where}: auth, token and headers are for HTTP servers")
    if spec.auth == "bearer" and not spec.token:
        _invalid(f"{where}: auth bearer needs a token")
    if spec.auth != "bearer" and spec.token is not None:
        _invalid(f"{where}: a token needs auth bearer")
    if spec.token is not None and not _clean(spec.token):
        _invalid(f"{where}: the token must be non-empty printable text")
    _check_oauth(spec, where)
    seen: set[str] = set()
    for header, value in spec.headers.items():
        lower = header.lower()
        if not header or not set(header) <= _TOKEN_CHARS:
            _invalid(f"{where}: header name {header!r} is not a valid token")
        if lower in FORBIDDEN_HEADERS or lower.startswith("mcp-"):
            _invalid(f"{where}: header {header!r} is set by the transport")
        if lower == "authorization" and spec.auth != "none":
            _invalid(
                f"{where}: Authorization is set by auth {spec.auth}; not also in headers"
            )
        if lower in seen:
            _invalid(f"{where}: header {header!r} given twice")
        seen.add(lower)
        if not _clean(value):
            _invalid(
                f"{where}: the value of header {header!r} must be non-empty printable text"
            )
    for key, value in spec.secret_env.items():
        if not key or "=" in key or "\0" in key:
            _invalid(f"{where}: secret_env name {key!r} is not valid")
        if key in spec.env:
            _invalid(f"{where}: {key!r} is in both env and secret_env")
        if key in _CODE_ENV or key.startswith(_CODE_ENV_PREFIXES):
            _invalid(f"{where}: {key!r} belongs in env, not secret_env")
        if not value or "\0" in value:
            _invalid(
                f"{where}: the value of secret_env {key!r} must be non-empty, without NUL"
            )


def _check_oauth(spec: ServerSpec, where: str) -> None:
    oauth_keys = (
        spec.oauth_client_id is not None
        or spec.oauth_client_secret is not None
        or spec.oauth_client_metadata_url is not None
        or bool(spec.oauth_scopes)
        or spec.oauth_token_endpoint_auth_method is not None
        or spec.oauth_redirect_uri is not None
        or spec.oauth_private_key is not None
        or spec.oauth_grant != "authorization_code"
        or spec.oauth_assertion is not None
        or spec.oauth_assertion_file is not None
        or _exchange_keys(spec)
    )
    if spec.auth != "oauth":
        if oauth_keys:
            _invalid(f'{where}: the oauth_* settings need auth = "oauth"')
        return
    if spec.oauth_client_secret is not None and not spec.oauth_client_id:
        _invalid(f"{where}: oauth_client_secret needs oauth_client_id")
    if spec.oauth_client_secret is not None and not _clean(spec.oauth_client_secret):
        _invalid(f"{where}: oauth_client_secret must be non-empty printable text")
    if spec.oauth_client_id is not None and not _clean(spec.oauth_client_id):
        _invalid(f"{where}: oauth_client_id must be non-empty printable text")
    _check_machine_grant(spec, where)
    url = spec.oauth_client_metadata_url
    if url is not None:
        parts = _split(url)
        if (
            parts is None
            or parts.scheme != "https"
            or parts.path in ("", "/")
            or parts.fragment
        ):
            _invalid(
                f"{where}: oauth_client_metadata_url must be an https URL with a path"
            )
    for scope in spec.oauth_scopes:
        if not scope or not _clean(scope) or " " in scope:
            _invalid(f"{where}: oauth_scopes holds an empty or spaced scope")
    if spec.oauth_redirect_uri is not None and not redirect_uri_ok(
        spec.oauth_redirect_uri
    ):
        _invalid(
            f"{where}: oauth_redirect_uri must be http://127.0.0.1:PORT/PATH "
            "(loopback) or an https URL, without a fragment"
        )


def _check_machine_grant(spec: ServerSpec, where: str) -> None:
    """``private_key_jwt`` and the client credentials grant need a
    pre-registered client and its credential (a secret or a PEM private key).
    Specs are checked as given (a config file, ``servers/add``), before their
    secrets move into the vault: an empty secret is refused, as it would be
    read as "in the vault" and fail at the first token request."""
    key = spec.oauth_private_key
    method = spec.oauth_token_endpoint_auth_method
    if key is not None:
        if not spec.oauth_client_id:
            _invalid(f"{where}: oauth_private_key needs oauth_client_id")
        if not _reference(key) and (
            "-----BEGIN" not in key or "PRIVATE KEY-----" not in key
        ):
            _invalid(f"{where}: oauth_private_key must be a PEM private key")
        if method not in (None, "private_key_jwt"):
            _invalid(f"{where}: oauth_private_key goes with private_key_jwt")
        if spec.oauth_grant == "authorization_code":
            _invalid(
                f"{where}: oauth_private_key (private_key_jwt) is for the machine "
                "grants (client_credentials, jwt_bearer, token_exchange); a login's "
                "client authenticates with oauth_client_secret, or none"
            )
    if method == "private_key_jwt" and key is None:
        _invalid(f"{where}: private_key_jwt needs oauth_private_key")
    _check_jwt_bearer(spec, where)
    _check_token_exchange(spec, where)
    if spec.oauth_grant == "client_credentials":
        if not spec.oauth_client_id:
            _invalid(
                f"{where}: the client_credentials grant needs oauth_client_id "
                "(a client registered with the authorization server)"
            )
        if spec.oauth_client_secret is None and key is None:
            _invalid(
                f"{where}: the client_credentials grant needs oauth_client_secret "
                "or oauth_private_key"
            )
        if method == "none":
            _invalid(
                f"{where}: the client_credentials grant needs client authentication"
            )


def _check_jwt_bearer(spec: ServerSpec, where: str) -> None:
    """The JWT bearer grant: a client and exactly one source of its assertion."""
    given = (spec.oauth_assertion is not None) + (spec.oauth_assertion_file is not None)
    if spec.oauth_grant != "jwt_bearer":
        if given:
            _invalid(f'{where}: oauth_assertion* go with oauth_grant = "jwt_bearer"')
        return
    if not spec.oauth_client_id:
        _invalid(f"{where}: the jwt_bearer grant needs oauth_client_id")
    if given != 1:
        _invalid(
            f"{where}: the jwt_bearer grant needs oauth_assertion or "
            "oauth_assertion_file (one of them)"
        )
    path = spec.oauth_assertion_file
    if path is not None and (not path.startswith("/") or not _clean(path)):
        _invalid(f"{where}: oauth_assertion_file must be an absolute path")
    assertion = spec.oauth_assertion
    if (
        assertion is not None
        and not _reference(assertion)
        and (not _clean(assertion) or assertion.count(".") != 2)
    ):
        _invalid(f"{where}: oauth_assertion must be a JWT (header.payload.signature)")


def _exchange_keys(spec: ServerSpec) -> bool:
    return any(
        value is not None
        for value in (
            spec.oauth_subject_token,
            spec.oauth_subject_token_file,
            spec.oauth_idp_issuer,
            spec.oauth_idp_token_endpoint,
            spec.oauth_idp_client_id,
            spec.oauth_idp_client_secret,
        )
    )


def _check_token_exchange(spec: ServerSpec, where: str) -> None:
    """Enterprise-managed authorization: a client at the authorization
    server, exactly one source of the ID token, the identity provider (its
    issuer or its token endpoint; https, or http with allow_private_network)."""
    if spec.oauth_grant != "token_exchange":
        if _exchange_keys(spec):
            _invalid(
                f"{where}: oauth_subject_token* and oauth_idp_* go with "
                'oauth_grant = "token_exchange"'
            )
        return
    if not spec.oauth_client_id:
        _invalid(
            f"{where}: the token_exchange grant needs oauth_client_id (the client "
            "registered with the MCP server's authorization server)"
        )
    given = (spec.oauth_subject_token is not None) + (
        spec.oauth_subject_token_file is not None
    )
    if given != 1:
        _invalid(
            f"{where}: the token_exchange grant needs oauth_subject_token or "
            "oauth_subject_token_file (one of them)"
        )
    path = spec.oauth_subject_token_file
    if path is not None and (not path.startswith("/") or not _clean(path)):
        _invalid(f"{where}: oauth_subject_token_file must be an absolute path")
    token = spec.oauth_subject_token
    if (
        token is not None
        and not _reference(token)
        and (not _clean(token) or token.count(".") != 2)
    ):
        _invalid(
            f"{where}: oauth_subject_token must be an ID token (a JWT: "
            "header.payload.signature)"
        )
    if spec.oauth_idp_issuer is None and spec.oauth_idp_token_endpoint is None:
        _invalid(
            f"{where}: the token_exchange grant needs oauth_idp_issuer or "
            "oauth_idp_token_endpoint (the enterprise identity provider)"
        )
    for key in ("oauth_idp_issuer", "oauth_idp_token_endpoint"):
        url = getattr(spec, key)
        if url is None:
            continue
        parts = _split(url)
        allowed = ("https", "http") if spec.allow_private_network else ("https",)
        if (
            parts is None
            or not _clean(url)
            or parts.scheme not in allowed
            or not parts.hostname
            or parts.fragment
            or parts.username is not None
        ):
            _invalid(
                f"{where}: {key} must be an https URL (http only with "
                "allow_private_network), without credentials or a fragment"
            )
    if spec.oauth_idp_client_secret is not None and not spec.oauth_idp_client_id:
        _invalid(f"{where}: oauth_idp_client_secret needs oauth_idp_client_id")
    if spec.oauth_idp_client_secret is not None and not _clean(
        spec.oauth_idp_client_secret
    ):
        _invalid(f"{where}: oauth_idp_client_secret must be non-empty printable text")
    for key in ("oauth_idp_client_id", "oauth_idp_client_secret"):
        value = getattr(spec, key)
        if value is not None and value != "" and not _clean(value):
            _invalid(f"{where}: {key} must be non-empty printable text")
    if spec.oauth_idp_client_id == "":
        _invalid(f"{where}: oauth_idp_client_id must be non-empty printable text")


_REFERENCE = re.compile(r"[a-z][a-z0-9-]*:[^\s:/][^\s]*")
"""A credential store reference, ``PREFIX:NAME`` (``credential:NAME``): a
PEM key or a JWT never looks like one (the daemon resolves it at use)."""


def _reference(value: str) -> bool:
    return _REFERENCE.fullmatch(value) is not None


def _clean(value: str) -> bool:
    """Non-empty, visible ASCII or space/tab, no surrounding whitespace."""
    return (
        bool(value)
        and value == value.strip()
        and all(c == "\t" or " " <= c <= "~" for c in value)
    )
