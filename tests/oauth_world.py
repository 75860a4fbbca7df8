"""A real OAuth world on 127.0.0.1 for the tests: an authorization server
(the SDK's own auth routes over an in-memory provider) and, on the same
origin, an MCP server that wants its bearer tokens.

The provider records what it was asked (``grants``: register,
authorization_code, refresh_token; ``revoked``) so tests can count requests
at the authorization server itself. It auto-approves ``/authorize`` with a
302 to the redirect URI, as a browser session with a remembered consent would.

It rotates refresh tokens and detects reuse (RFC 9700 §4.14.2): a refresh
token presented again after it was rotated revokes its whole family, access
tokens included. Fault switches for the OAuth lifecycle tests: a refresh held
at a gate (``refresh_gate``), refresh responses lost after the rotation
(``lose_refresh_responses``: the client gets a 502), every access token
refused (``reject_access``), RFC 9207 ``iss`` advertised (``advertise_iss``)
and sent (``send_iss``); ``token_posts`` lists every ``POST /token`` at the
HTTP level (its ``grant_type``), before the SDK's handler can refuse it.
"""

from __future__ import annotations

import contextlib
import secrets
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import parse_qs

import anyio
import msgspec
from mcp.server.auth.provider import (
    AccessToken,
    AuthorizationCode,
    AuthorizationParams,
    RefreshToken,
    TokenError,
    construct_redirect_uri,
)
from mcp.server.auth.settings import (
    AuthSettings,
    ClientRegistrationOptions,
    RevocationOptions,
)
from mcp.server.mcpserver import MCPServer
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken
from pydantic import AnyHttpUrl, AnyUrl

from tests.faults import captured, read_body, replaying, respond
from tests.harness import serve_asgi

PRE_CLIENT_ID = "memorizz-preregistered"
PRE_CLIENT_SECRET = "pre-secret-marker-71c2e9"  # noqa: S105 - a test marker
VALID_SCOPES = ("mcp", "admin")
ADMIN_SCOPE = "mcp admin"
"""What the ``admin`` tool's 403 asks for."""
PRM_PATH = "/.well-known/oauth-protected-resource/mcp"
"""Where the SDK serves the protected resource metadata (RFC 9728, path-based)."""
PRM_ROOT = "/.well-known/oauth-protected-resource"
AS_PATH = "/.well-known/oauth-authorization-server"
"""Where the SDK serves the authorization server metadata (RFC 8414)."""
OIDC_PATH = "/.well-known/openid-configuration"
TokenReply = Callable[[dict[str, str]], "tuple[int, bytes] | None"]
"""A ``POST`` form -> the answer to give instead (status, body), or None."""


class TestAuthorizationServer:
    """``OAuthAuthorizationServerProvider`` in memory; thread-safe enough for
    one uvicorn loop."""

    __test__ = False

    def __init__(self, access_ttl: int = 3600, *, rotate: bool = True) -> None:
        self.access_ttl = access_ttl
        self.rotate = rotate
        self.clients: dict[str, OAuthClientInformationFull] = {}
        self.codes: dict[str, AuthorizationCode] = {}
        self.access: dict[str, AccessToken] = {}
        self.refresh: dict[str, RefreshToken] = {}
        self.grants: list[str] = []
        self.revoked: list[str] = []
        self.resources: list[str | None] = []
        self.refuse_refresh = False
        self.tool_calls = 0
        self.grantable: set[str] | None = None
        """Scopes the server will grant (None: whatever is asked); a login that
        asks for more gets less, as an authorization server that says no."""
        self.scope_refusals = 0
        """``403 insufficient_scope`` answers of the ``admin`` tool's gate."""
        self.family: dict[str, int] = {}
        """Token (access or refresh) -> the login it descends from."""
        self.rotated: dict[str, int] = {}
        """Refresh tokens already exchanged -> their family (reuse detection)."""
        self.reuse_detected = 0
        self.refresh_gate: threading.Event | None = None
        """Set: a refresh waits here (after ``refresh_arrived``) until it is set."""
        self.refresh_arrived = threading.Event()
        self.lose_refresh_responses = 0
        """This many refresh responses are lost after the rotation (a 502)."""
        self.reject_access = False
        """Every access token is refused (401), fresh or not."""
        self.advertise_iss = False
        """Metadata says ``authorization_response_iss_parameter_supported``."""
        self.send_iss = False
        """The authorization response carries ``iss`` (RFC 9207)."""
        self.issuer = ""
        self.token_posts: list[str] = []
        """``grant_type`` of every ``POST /token``, as it arrived."""
        self.token_forms: list[dict[str, str]] = []
        """Every ``POST /token`` form (the PKCE verifier among it)."""
        self.on_bearer: Callable[[str], None] | None = None
        """Called with the access token of every MCP request (the server's thread)."""
        self._families = 0
        # --- misbehaviour (``_misbehaviour``): all off by default -----------------
        self.seen: list[str] = []
        """``"<METHOD> <path>"`` of every request, as it arrived."""
        self.authorize_queries: list[dict[str, str]] = []
        """The query of every ``GET /authorize`` (what the browser carried)."""
        self.register_bodies: list[dict[str, Any]] = []
        """The JSON of every ``POST /register`` (RFC 7591), as sent."""
        self.mcp_requests: list[tuple[str, str, str, str]] = []
        """``(method, query string, Authorization, MCP-Protocol-Version)`` of
        every MCP request (headers as sent, "" when absent)."""
        self.challenge: str | None = None
        """The ``WWW-Authenticate`` of a 401 to an MCP request without a token
        (None: the SDK's own, naming ``PRM_PATH``)."""
        self.documents: dict[str, Any] = {}
        """``GET path -> JSON`` served as is, before anything else."""
        self.hidden: set[str] = set()
        """GET paths answered 404 (a document that is not there)."""
        self.aliases: dict[str, str] = {}
        """``GET path -> path``: the document of the second served at the first."""
        self.prm_edit: Callable[[dict[str, Any]], dict[str, Any]] | None = None
        """Rewrites the protected resource metadata (wherever it is served)."""
        self.metadata_edit: Callable[[dict[str, Any]], dict[str, Any]] | None = None
        """Rewrites the authorization server metadata (wherever it is served)."""
        self.token_reply: TokenReply | None = None
        """Answers a ``POST /token`` instead of the server (None: as usual)."""
        self.token_edit: Callable[[str, dict[str, Any]], bytes] | None = None
        """``(grant_type, answer) -> body``: a 200 token answer rewritten after
        the server did its work (a refresh has rotated by then)."""
        self.revoke_reply: TokenReply | None = None
        """Answers a ``POST /revoke`` instead of the server (None: as usual)."""

    def count(self, grant: str) -> int:
        return self.grants.count(grant)

    def preregister(
        self, redirect_uri: str, method: str = "client_secret_basic"
    ) -> None:
        self.clients[PRE_CLIENT_ID] = OAuthClientInformationFull(
            client_id=PRE_CLIENT_ID,
            client_secret=PRE_CLIENT_SECRET,
            redirect_uris=[AnyUrl(redirect_uri)],
            token_endpoint_auth_method=method,
            grant_types=["authorization_code", "refresh_token"],
            scope="mcp",
        )

    def expire_access_tokens(self) -> None:
        for token in self.access.values():
            token.expires_at = int(time.time()) - 1

    async def get_client(self, client_id: str) -> OAuthClientInformationFull | None:
        return self.clients.get(client_id)

    async def register_client(self, client_info: OAuthClientInformationFull) -> None:
        # Every registered client may ask for every scope; what is granted is
        # the authorization server's decision (``grantable``).
        client_info.scope = " ".join(VALID_SCOPES)
        self.clients[client_info.client_id] = client_info
        self.grants.append("register")

    async def authorize(
        self, client: OAuthClientInformationFull, params: AuthorizationParams
    ) -> str:
        code = secrets.token_urlsafe(32)
        self.codes[code] = AuthorizationCode(
            code=code,
            scopes=params.scopes or [],
            expires_at=time.time() + 300,
            client_id=client.client_id,
            code_challenge=params.code_challenge,
            redirect_uri=params.redirect_uri,
            redirect_uri_provided_explicitly=params.redirect_uri_provided_explicitly,
            resource=params.resource,
        )
        extra = {"iss": self.issuer} if self.send_iss else {}
        return construct_redirect_uri(
            str(params.redirect_uri), code=code, state=params.state, **extra
        )

    async def load_authorization_code(
        self, client: OAuthClientInformationFull, authorization_code: str
    ) -> AuthorizationCode | None:
        return self.codes.get(authorization_code)

    def _issue(
        self,
        client_id: str,
        scopes: list[str],
        resource: str | None,
        family: int | None = None,
    ) -> OAuthToken:
        at, rt = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
        if family is None:
            self._families += 1
            family = self._families
        self.family[at] = self.family[rt] = family
        self.resources.append(resource)
        self.access[at] = AccessToken(
            token=at,
            client_id=client_id,
            scopes=scopes,
            expires_at=int(time.time()) + self.access_ttl,
            resource=resource,
        )
        self.refresh[rt] = RefreshToken(
            token=rt, client_id=client_id, scopes=scopes, resource=resource
        )
        return OAuthToken(
            access_token=at,
            expires_in=self.access_ttl,
            refresh_token=rt,
            scope=" ".join(scopes),
        )

    async def exchange_authorization_code(
        self, client: OAuthClientInformationFull, authorization_code: AuthorizationCode
    ) -> OAuthToken:
        del self.codes[authorization_code.code]
        self.grants.append("authorization_code")
        scopes = authorization_code.scopes
        if self.grantable is not None:
            scopes = [scope for scope in scopes if scope in self.grantable]
        return self._issue(client.client_id, scopes, authorization_code.resource)

    async def load_refresh_token(
        self, client: OAuthClientInformationFull, refresh_token: str
    ) -> RefreshToken | None:
        family = self.rotated.get(refresh_token)
        if family is not None:
            # Reuse of a rotated refresh token: the family is compromised.
            self.reuse_detected += 1
            for member in [t for t, f in self.family.items() if f == family]:
                self.access.pop(member, None)
                self.refresh.pop(member, None)
            return None
        token = self.refresh.get(refresh_token)
        return token if token and token.client_id == client.client_id else None

    async def exchange_refresh_token(
        self,
        client: OAuthClientInformationFull,
        refresh_token: RefreshToken,
        scopes: list[str],
    ) -> OAuthToken:
        self.grants.append("refresh_token")
        gate = self.refresh_gate
        self.refresh_arrived.set()
        if gate is not None:
            await anyio.to_thread.run_sync(gate.wait, 30)
        if self.refuse_refresh:
            raise TokenError("invalid_grant", "the grant was revoked")
        family = self.family.get(refresh_token.token)
        if self.rotate:
            if self.refresh.pop(refresh_token.token, None) is None:
                raise TokenError("invalid_grant", "refresh token already used")
            self.rotated[refresh_token.token] = family or 0
        return self._issue(
            client.client_id,
            scopes or refresh_token.scopes,
            refresh_token.resource,
            family,
        )

    async def load_access_token(self, token: str) -> AccessToken | None:
        if self.reject_access:
            return None
        found = self.access.get(token)
        if found is not None and found.expires_at and found.expires_at < time.time():
            return None
        return found

    async def revoke_token(self, token: AccessToken | RefreshToken) -> None:
        self.revoked.append(type(token).__name__)
        self.access.pop(token.token, None)
        self.refresh.pop(token.token, None)


def protected_app(base: str, provider: TestAuthorizationServer) -> Any:
    server = MCPServer(
        "protected",
        auth_server_provider=provider,
        auth=AuthSettings(
            issuer_url=AnyHttpUrl(base),
            resource_server_url=AnyHttpUrl(base + "/mcp"),
            validate_token_resource=True,
            required_scopes=["mcp"],
            client_registration_options=ClientRegistrationOptions(
                enabled=True, valid_scopes=list(VALID_SCOPES), default_scopes=["mcp"]
            ),
            revocation_options=RevocationOptions(enabled=True),
        ),
        log_level="WARNING",
    )

    @server.tool()
    def whoami() -> str:
        """Who the server thinks we are."""
        provider.tool_calls += 1
        return "authorized"

    @server.tool()
    def echo(text: str) -> str:
        """Echo text."""
        provider.tool_calls += 1
        return text

    @server.tool()
    def admin() -> str:
        """Needs the ``admin`` scope (the gate answers 403 insufficient_scope)."""
        provider.tool_calls += 1
        return "admin done"

    provider.issuer = str(AnyHttpUrl(base))  # as its metadata writes it (RFC 9207)
    return _misbehaviour(
        _faults(_scope_gate(server.streamable_http_app(), provider, base), provider),
        provider,
    )


def _scope_gate(app: Any, provider: TestAuthorizationServer, base: str) -> Any:
    """A ``tools/call`` of ``admin`` with a token without the ``admin`` scope
    gets ``403`` and an RFC 6750 ``insufficient_scope`` challenge naming the
    scope it needs (step-up authorization, as MCP describes it)."""
    challenge = (
        f'Bearer error="insufficient_scope", scope="{ADMIN_SCOPE}", '
        f'resource_metadata="{base}/.well-known/oauth-protected-resource/mcp"'
    )

    async def gated(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await app(scope, receive, send)
            return
        body = await read_body(receive)
        if _calls_admin(body) and not _has_admin(scope, provider):
            provider.scope_refusals += 1
            await send(
                {
                    "type": "http.response.start",
                    "status": 403,
                    "headers": [(b"www-authenticate", challenge.encode())],
                }
            )
            await send({"type": "http.response.body", "body": b""})
            return
        await app(scope, replaying(body, receive), send)

    return gated


async def _respond(send: Any, status: int, body: bytes, content_type: bytes) -> None:
    await respond(send, status, body, [(b"content-type", content_type)])


def _faults(app: Any, provider: TestAuthorizationServer) -> Any:
    """The fault switches of ``TestAuthorizationServer`` at the HTTP level."""

    async def faulty(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        path, method = scope["path"], scope["method"]
        if path == "/token" and method == "POST":
            body = await read_body(receive)
            form = {k: v[0] for k, v in parse_qs(body.decode()).items()}
            provider.token_forms.append(form)
            grant_type = form.get("grant_type", "")
            provider.token_posts.append(grant_type)
            replay = replaying(body, receive)
            if grant_type == "refresh_token" and provider.lose_refresh_responses:
                provider.lose_refresh_responses -= 1

                async def lost(message: dict[str, Any]) -> None:
                    return None  # processed (and rotated), never delivered

                await app(scope, replay, lost)
                await _respond(send, 502, b"bad gateway", b"text/plain")
                return
            await app(scope, replay, send)
            return
        if path == "/.well-known/oauth-authorization-server" and provider.advertise_iss:
            status, body = await captured(app, scope, receive)
            doc = msgspec.json.decode(body)
            doc["authorization_response_iss_parameter_supported"] = True
            await _respond(send, status, msgspec.json.encode(doc), b"application/json")
            return
        if path.startswith("/mcp") and provider.on_bearer is not None:
            headers = dict(scope["headers"])
            token = headers.get(b"authorization", b"").decode()
            provider.on_bearer(token.removeprefix("Bearer "))
        await app(scope, receive, send)

    return faulty


def _content_type(body: bytes) -> bytes:
    return b"application/json" if body[:1] in (b"{", b"[") else b"text/html"


def _misbehaviour(app: Any, provider: TestAuthorizationServer) -> Any:
    """The misbehaviour switches of ``TestAuthorizationServer``, outside every
    other layer; all off, it only records what arrived."""

    async def layer(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        path, method = scope["path"], scope["method"]
        provider.seen.append(f"{method} {path}")
        if path.startswith("/mcp"):
            await _mcp(app, provider, scope, receive, send)
        elif method == "GET":
            await _get(app, provider, scope, receive, send)
        elif method == "POST" and path in ("/token", "/revoke", "/register"):
            await _post(app, provider, scope, receive, send)
        else:
            await app(scope, receive, send)

    return layer


async def _mcp(
    app: Any,
    provider: TestAuthorizationServer,
    scope: dict[str, Any],
    receive: Any,
    send: Any,
) -> None:
    headers = dict(scope["headers"])
    authorization = headers.get(b"authorization", b"").decode()
    version = headers.get(b"mcp-protocol-version", b"").decode()
    query = scope.get("query_string", b"").decode()
    provider.mcp_requests.append((scope["method"], query, authorization, version))
    if provider.challenge is not None and not authorization:
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [(b"www-authenticate", provider.challenge.encode())],
            }
        )
        await send({"type": "http.response.body", "body": b""})
        return
    await app(scope, receive, send)


async def _get(
    app: Any,
    provider: TestAuthorizationServer,
    scope: dict[str, Any],
    receive: Any,
    send: Any,
) -> None:
    path = scope["path"]
    if path == "/authorize":
        query = parse_qs(scope.get("query_string", b"").decode())
        provider.authorize_queries.append({k: v[0] for k, v in query.items()})
    if path in provider.documents:
        body = msgspec.json.encode(provider.documents[path])
        await _respond(send, 200, body, b"application/json")
        return
    if path in provider.hidden:
        await _respond(send, 404, b"not here", b"text/plain")
        return
    target = provider.aliases.get(path, path)
    edit = {PRM_PATH: provider.prm_edit, AS_PATH: provider.metadata_edit}.get(target)
    if target == path and edit is None:
        await app(scope, receive, send)
        return
    moved = dict(scope, path=target, raw_path=target.encode())
    status, body = await captured(app, moved, receive)
    if status == 200 and edit is not None:
        body = msgspec.json.encode(edit(msgspec.json.decode(body)))
    await _respond(send, status, body, _content_type(body))


async def _post(
    app: Any,
    provider: TestAuthorizationServer,
    scope: dict[str, Any],
    receive: Any,
    send: Any,
) -> None:
    path = scope["path"]
    body = await read_body(receive)
    replay = replaying(body, receive)
    if path == "/register":
        provider.register_bodies.append(msgspec.json.decode(body))
        await app(scope, replay, send)
        return
    form = {k: v[0] for k, v in parse_qs(body.decode()).items()}
    reply = provider.token_reply if path == "/token" else provider.revoke_reply
    answer = reply(form) if reply is not None else None
    if answer is not None:
        if path == "/token":  # recorded as ``_faults`` records what reaches it
            provider.token_forms.append(form)
            provider.token_posts.append(form.get("grant_type", ""))
        status, content = answer
        await _respond(send, status, content, _content_type(content))
        return
    edit = provider.token_edit if path == "/token" else None
    if edit is None:
        await app(scope, replay, send)
        return
    status, content = await captured(app, scope, replay)
    if status == 200:
        content = edit(form.get("grant_type", ""), msgspec.json.decode(content))
    await _respond(send, status, content, _content_type(content))


class _Call(msgspec.Struct):
    method: str = ""
    params: dict[str, Any] = {}


def _calls_admin(body: bytes) -> bool:
    try:
        call = msgspec.json.decode(body, type=_Call)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return False
    return call.method == "tools/call" and call.params.get("name") == "admin"


def _has_admin(scope: dict[str, Any], provider: TestAuthorizationServer) -> bool:
    headers = dict(scope["headers"])
    token = headers.get(b"authorization", b"").decode().removeprefix("Bearer ")
    found = provider.access.get(token)
    return found is not None and "admin" in found.scopes


@contextlib.contextmanager
def serve_protected(provider: TestAuthorizationServer) -> Iterator[str]:
    """Serve the world on a free port of 127.0.0.1; yields the MCP URL."""
    with serve_asgi(lambda base: protected_app(base, provider)) as base:
        yield base + "/mcp"


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def browser(authorization_url: str) -> str:
    """A person who clicks "allow": GET the authorization URL, return where
    the authorization server redirects (the callback URL with code and state)."""
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        opener.open(authorization_url, timeout=10)
    except urllib.error.HTTPError as exc:
        if exc.code in (302, 303, 307):
            return str(exc.headers["Location"])
        raise
    raise AssertionError("the authorization server did not redirect")
