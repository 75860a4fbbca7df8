"""Enterprise-managed authorization (SEP-990; RFC 8693 then RFC 7523) through
the real daemon against a real local enterprise identity provider and a real
local authorization server with its MCP server, each on its own loopback
origin: the operator's ID token, from a file (read at each exchange) or from
the vault, exchanged at the identity provider for an ID-JAG whose audience is
the authorization server's issuer and whose resource is the MCP server; the
ID-JAG presented with the JWT bearer grant; no login; renewed after a 401
with the ID token of the moment. Both sides check what they are sent with
PyJWT, as an independent parser; the secrets stay in the vault."""

from __future__ import annotations

import base64
import contextlib
import secrets
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote

import jwt
import msgspec
import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from mcp.server.mcpserver import MCPServer
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from memorizz.api import methods as m
from memorizz.api.errors import InvalidParamsError
from tests.daemon.test_oauth_jwt_bearer import Workloads
from tests.daemon.test_oauth_jwt_bearer import serve as serve_workloads
from tests.harness import (
    DaemonHarness,
    daemon_config,
    serve_asgi,
    wait_until,
)

EXCHANGE = "urn:ietf:params:oauth:grant-type:token-exchange"
JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"
ID_TOKEN = "urn:ietf:params:oauth:token-type:id_token"  # noqa: S105
ID_JAG = "urn:ietf:params:oauth:token-type:id-jag"
IDP_CLIENT = "memorizz-at-idp"
IDP_SECRET = "idp-secret-marker-5d1f0a"  # noqa: S105 - a test marker
AS_CLIENT = "memorizz-at-as"
AS_SECRET = "as-secret-marker-93be27"  # noqa: S105 - a test marker


def _form(body: bytes) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(body.decode()).items()}


def _basic(request: Request) -> tuple[str, str] | None:
    header = request.headers.get("authorization", "")
    if not header.startswith("Basic "):
        return None
    pair = base64.b64decode(header[6:]).decode()
    user, _, password = pair.partition(":")
    return unquote(user), unquote(password)


class Enterprise:
    """An identity provider that signs ID tokens and ID-JAGs, and an
    authorization server (with its MCP server) that trusts its ID-JAGs."""

    def __init__(self) -> None:
        self.idp_key = ec.generate_private_key(ec.SECP256R1())
        self.idp = ""
        self.issuer = ""
        self.exchanges: list[dict[str, str]] = []
        self.idp_auth: list[tuple[str, str] | None] = []
        self.idp_metadata_reads = 0
        self.grants: list[dict[str, str]] = []
        self.subjects: list[str] = []
        self.tokens: set[str] = set()
        self.refuse_exchange = False

    def id_token(self, subject: str) -> str:
        now = int(time.time())
        claims = {"iss": self.idp, "sub": subject, "aud": IDP_CLIENT}
        return jwt.encode(
            claims | {"iat": now, "exp": now + 3600}, self.idp_key, "ES256"
        )

    def idp_app(self, origin: str) -> Any:
        self.idp = origin

        async def metadata(request: Request) -> Response:
            self.idp_metadata_reads += 1
            return JSONResponse(
                {
                    "issuer": origin,
                    "authorization_endpoint": f"{origin}/authorize",
                    "token_endpoint": f"{origin}/oauth2/token",
                    "jwks_uri": f"{origin}/jwks",
                    "grant_types_supported": [EXCHANGE],
                    "token_endpoint_auth_methods_supported": ["client_secret_basic"],
                }
            )

        async def token(request: Request) -> Response:
            form = _form(await request.body())
            self.exchanges.append(form)
            self.idp_auth.append(_basic(request))
            if self.refuse_exchange:
                return JSONResponse(
                    {"error": "invalid_grant", "error_description": "policy says no"},
                    status_code=400,
                )
            if _basic(request) != (IDP_CLIENT, IDP_SECRET):
                return JSONResponse({"error": "invalid_client"}, status_code=401)
            try:
                claims = jwt.decode(
                    form["subject_token"],
                    self.idp_key.public_key(),
                    algorithms=["ES256"],
                    audience=IDP_CLIENT,
                    issuer=origin,
                )
            except (KeyError, jwt.PyJWTError):
                return JSONResponse({"error": "invalid_grant"}, status_code=400)
            now = int(time.time())
            jag = jwt.encode(
                {
                    "iss": origin,
                    "sub": claims["sub"],
                    "aud": form["audience"],
                    "resource": form["resource"],
                    "client_id": AS_CLIENT,
                    "jti": str(uuid.uuid4()),
                    "iat": now,
                    "exp": now + 300,
                },
                self.idp_key,
                "ES256",
                headers={"typ": "oauth-id-jag+jwt"},
            )
            return JSONResponse(
                {"access_token": jag, "issued_token_type": ID_JAG, "token_type": "N_A"}
            )

        return Starlette(
            routes=[
                Route("/.well-known/openid-configuration", metadata),
                Route("/oauth2/token", token, methods=["POST"]),
            ]
        )

    def mcp_app(self, origin: str) -> Any:
        self.issuer = origin
        mcp = MCPServer("enterprise", log_level="WARNING")

        @mcp.tool()
        def whoami() -> str:
            """Who we are."""
            return "enterprise-authorized"

        mcp_app = mcp.streamable_http_app()

        async def prm(request: Request) -> Response:
            return JSONResponse(
                {"resource": origin + "/mcp", "authorization_servers": [origin]}
            )

        async def metadata(request: Request) -> Response:
            return JSONResponse(
                {
                    "issuer": origin,
                    "authorization_endpoint": f"{origin}/authorize",
                    "token_endpoint": f"{origin}/token",
                    "response_types_supported": ["code"],
                    "grant_types_supported": [JWT_BEARER],
                    "token_endpoint_auth_methods_supported": ["client_secret_basic"],
                }
            )

        async def token(request: Request) -> Response:
            form = _form(await request.body())
            self.grants.append(form)
            if _basic(request) != (AS_CLIENT, AS_SECRET):
                return JSONResponse({"error": "invalid_client"}, status_code=401)
            if form.get("grant_type") != JWT_BEARER:
                return JSONResponse(
                    {"error": "unsupported_grant_type"}, status_code=400
                )
            assertion = form.get("assertion", "")
            try:
                header = jwt.get_unverified_header(assertion)
                claims = jwt.decode(
                    assertion,
                    self.idp_key.public_key(),
                    algorithms=["ES256"],
                    audience=origin,
                    issuer=self.idp,
                )
            except jwt.PyJWTError:
                return JSONResponse({"error": "invalid_grant"}, status_code=400)
            if (
                header.get("typ") != "oauth-id-jag+jwt"
                or claims["client_id"] != AS_CLIENT
                or claims["resource"] != origin + "/mcp"
            ):
                return JSONResponse({"error": "invalid_grant"}, status_code=400)
            self.subjects.append(claims["sub"])
            access = secrets.token_urlsafe(16)
            self.tokens.add(access)
            return JSONResponse(
                {"access_token": access, "token_type": "Bearer", "expires_in": 3600}
            )

        oauth = Starlette(
            routes=[
                Route("/.well-known/oauth-protected-resource{rest:path}", prm),
                Route("/.well-known/oauth-authorization-server", metadata),
                Route("/token", token, methods=["POST"]),
            ]
        )
        challenge = f'Bearer resource_metadata="{origin}/.well-known/oauth-protected-resource/mcp"'

        async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
            if scope["type"] == "http" and scope["path"].startswith("/mcp"):
                auth = dict(scope["headers"]).get(b"authorization", b"").decode()
                if auth.removeprefix("Bearer ") not in self.tokens:
                    await Response(
                        status_code=401, headers={"WWW-Authenticate": challenge}
                    )(scope, receive, send)
                    return
            if scope["type"] != "http" or scope["path"].startswith("/mcp"):
                await mcp_app(scope, receive, send)
                return
            await oauth(scope, receive, send)

        return asgi


@contextlib.contextmanager
def serve(world: Enterprise) -> Iterator[str]:
    with serve_asgi(world.idp_app), serve_asgi(world.mcp_app) as origin:
        yield origin + "/mcp"


def spec(url: str, **fields: Any) -> m.ServerSpec:
    defaults: dict[str, Any] = {
        "allow_private_network": True,
        "oauth_grant": "token_exchange",
        "oauth_client_secret": AS_SECRET,
        "oauth_idp_client_id": IDP_CLIENT,
        "oauth_idp_client_secret": IDP_SECRET,
    }
    return m.ServerSpec(
        name="corp",
        transport="streamable_http",
        url=url,
        auth="oauth",
        oauth_client_id=AS_CLIENT,
        **(defaults | fields),
    )


def _whoami(d: DaemonHarness) -> str:
    with d.client() as c:
        result = c.call_tool("corp", "whoami", {})
    assert not result.is_error
    return msgspec.json.encode(result.content).decode()


def test_the_id_token_file_is_exchanged_for_an_id_jag_at_each_renewal(
    base_dir: str,
) -> None:
    world = Enterprise()
    id_token = Path(base_dir, "id_token.jwt")
    with serve(world) as url, DaemonHarness.running(daemon_config(base_dir)) as d:
        id_token.write_text(world.id_token("alice") + "\n")
        with d.client() as c:
            c.add_server(
                spec(
                    url,
                    oauth_subject_token_file=str(id_token),
                    oauth_idp_issuer=world.idp,
                )
            )
        d.wait_ready("corp")
        assert "enterprise-authorized" in _whoami(d)
        # a new sign-in rewrites the ID token; the server forgets our token
        id_token.write_text(world.id_token("bob"))
        world.tokens.clear()
        keeper = d.daemon.pool.get("corp").keeper
        assert keeper is not None
        generation = keeper.generation
        with d.client() as c, contextlib.suppress(Exception):
            c.call_tool("corp", "whoami", {})  # its 401 asks for a new token
        d.wait_ready("corp")
        wait_until(lambda: keeper.generation > generation, what="a new token")
        assert "enterprise-authorized" in _whoami(d)
    assert world.subjects == ["alice", "bob"]
    assert world.idp_metadata_reads == 1  # discovered once, from the issuer
    exchange = world.exchanges[0]
    assert exchange["grant_type"] == EXCHANGE
    assert exchange["requested_token_type"] == ID_JAG
    assert exchange["subject_token_type"] == ID_TOKEN
    assert exchange["audience"] == world.issuer  # the authorization server's issuer
    assert exchange["resource"] == url  # the MCP server (its protected resource)
    assert "client_secret" not in exchange  # client_secret_basic, as offered
    assert world.idp_auth == [(IDP_CLIENT, IDP_SECRET)] * 2
    grant = world.grants[0]
    assert grant["grant_type"] == JWT_BEARER
    assert grant["resource"] == url
    assert "client_secret" not in grant


def test_inline_secrets_go_to_the_vault_only(base_dir: str) -> None:
    world = Enterprise()
    with serve(world) as url, DaemonHarness.running(daemon_config(base_dir)) as d:
        token = world.id_token("carol")
        with d.client() as c:
            c.add_server(
                spec(
                    url,
                    oauth_subject_token=token,
                    oauth_idp_token_endpoint=world.idp + "/oauth2/token",
                )
            )
            listed = repr(c.list_servers())
        d.wait_ready("corp")
        assert "enterprise-authorized" in _whoami(d)
        with d.client() as c:
            status = repr(c.server_status("corp"))
    assert world.subjects == ["carol"]
    assert world.idp_metadata_reads == 0  # the token endpoint was given
    for text in (listed, status):
        for secret in (token, IDP_SECRET, AS_SECRET):
            assert secret not in text
    for path in Path(base_dir).rglob("*"):
        if path.is_file() and path.suffix != ".sock":
            data = path.read_bytes()
            for secret in (token, IDP_SECRET, AS_SECRET):
                assert secret.encode() not in data, path


def test_a_refused_exchange_is_reported_without_its_secrets(base_dir: str) -> None:
    world = Enterprise()
    world.refuse_exchange = True
    with serve(world) as url, DaemonHarness.running(daemon_config(base_dir)) as d:
        token = world.id_token("dave")
        with d.client() as c:
            c.add_server(
                spec(url, oauth_subject_token=token, oauth_idp_issuer=world.idp)
            )

        def refused() -> m.ServerStatus:
            with d.client() as c:
                return c.server_status("corp")[0]

        wait_until(
            lambda: bool((auth := refused().auth) and auth.last_refresh_error),
            what="the refusal reported",
        )
        status = refused()
        assert status.auth is not None
        error = status.auth.last_refresh_error or ""
        with d.client() as c, pytest.raises(Exception, match="token exchange") as call:
            c.call_tool("corp", "whoami", {})
    assert "the token exchange grant failed" in str(call.value)
    assert "invalid_grant" in error
    assert "policy says no" in error
    assert token not in error
    assert IDP_SECRET not in error
    assert world.grants == []  # nothing reached the authorization server


def test_memorizzctl_adds_a_token_exchange_server(base_dir: str) -> None:
    world = Enterprise()
    id_token = Path(base_dir, "id.jwt")
    with serve(world) as url, DaemonHarness.running(daemon_config(base_dir)) as d:
        id_token.write_text(world.id_token("erin"))
        code = d.ctl(
            "mcp", "add", "corp", "--url", url, "--allow-private-network",
            "--oauth-grant", "token-exchange", "--client-id", AS_CLIENT,
            "--client-secret", AS_SECRET, "--subject-token-file", str(id_token),
            "--idp-issuer", world.idp, "--idp-client-id", IDP_CLIENT,
            "--idp-client-secret", IDP_SECRET,
        )  # fmt: skip
        assert code == 0
        d.wait_ready("corp")
        assert "enterprise-authorized" in _whoami(d)
        with d.client() as c:
            info = c.list_servers()[0]
    assert info.auth == "oauth"
    assert info.oauth_grant == "token_exchange"
    # the grant's settings are shown (they were not); its secrets never are
    assert (
        info.oauth_subject_token_file,
        info.oauth_idp_issuer,
        info.oauth_idp_token_endpoint,
        info.oauth_idp_client_id,
    ) == (str(id_token), world.idp, None, IDP_CLIENT)
    assert IDP_SECRET not in repr(info)
    assert AS_SECRET not in repr(info)
    assert world.subjects == ["erin"]


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"oauth_idp_issuer": "https://idp.example"}, "oauth_subject_token or"),
        (
            {"oauth_subject_token_file": "id.jwt", "oauth_idp_issuer": "https://i.x"},
            "absolute path",
        ),
        (
            {"oauth_subject_token": "opaque", "oauth_idp_issuer": "https://i.x"},
            "must be an ID token",
        ),
        ({"oauth_subject_token_file": "/run/id.jwt"}, "oauth_idp_issuer or"),
        (
            {
                "oauth_subject_token_file": "/run/id.jwt",
                "oauth_idp_issuer": "http://idp.example",
                "allow_private_network": False,
            },
            "must be an https URL",
        ),
        (
            {"oauth_grant": "jwt_bearer", "oauth_assertion_file": "/run/a.jwt"},
            'go with oauth_grant = "token_exchange"',
        ),
    ],
)
def test_a_token_exchange_that_cannot_work_is_refused(
    base_dir: str, fields: dict[str, Any], words: str
) -> None:
    with (
        DaemonHarness.running(daemon_config(base_dir)) as d,
        d.client() as c,
        pytest.raises(InvalidParamsError, match=words),
    ):
        c.add_server(spec("https://mcp.example.com/mcp", **fields))


def test_memorizzctl_adds_a_jwt_bearer_server(base_dir: str) -> None:
    workloads = Workloads()
    assertion = Path(base_dir, "wl.jwt")
    with (
        serve_workloads(workloads) as url,
        DaemonHarness.running(daemon_config(base_dir)) as d,
    ):
        assertion.write_text(workloads.workload_jwt("pod-c"))
        code = d.ctl(
            "mcp", "add", "wl", "--url", url, "--allow-private-network",
            "--oauth-grant", "jwt-bearer", "--client-id", "workload-1",
            "--assertion-file", str(assertion),
        )  # fmt: skip
        assert code == 0
        d.wait_ready("wl")
        with d.client() as c:
            info = c.list_servers()[0]
            assert not c.call_tool("wl", "whoami", {}).is_error
    assert info.oauth_grant == "jwt_bearer"
    assert workloads.subjects == ["pod-c"]
