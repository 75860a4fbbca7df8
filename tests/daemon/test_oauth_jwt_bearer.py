"""The JWT bearer grant (RFC 7523 §2.1; workload identity federation,
SEP-1933) through the real daemon against a real local authorization server
and MCP server: the workload's JWT, from a file (read at each token request,
as its platform rotates it) or from the vault, exchanged for a token; no
login; renewed after a 401 with the assertion of the moment. The assertion
is verified here with PyJWT."""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

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
from tests.harness import (
    DaemonHarness,
    daemon_config,
    serve_asgi,
    wait_until,
)

GRANT = "urn:ietf:params:oauth:grant-type:jwt-bearer"


class Workloads:
    """An authorization server that takes workload JWTs of one identity provider."""

    def __init__(self) -> None:
        self.idp_key = ec.generate_private_key(ec.SECP256R1())
        self.issuer = ""
        self.tokens: set[str] = set()
        self.subjects: list[str] = []
        self.forms: list[dict[str, str]] = []

    def workload_jwt(self, subject: str) -> str:
        now = int(time.time())
        claims = {"iss": "https://idp.test", "sub": subject, "aud": self.issuer}
        claims |= {"iat": now, "exp": now + 300}
        return jwt.encode(claims, self.idp_key, algorithm="ES256")

    def app(self, origin: str) -> Any:
        self.issuer = origin
        mcp = MCPServer("workload", log_level="WARNING")

        @mcp.tool()
        def whoami() -> str:
            """Who we are."""
            return "workload-authorized"

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
                    "grant_types_supported": [GRANT],
                    "token_endpoint_auth_methods_supported": ["none"],
                }
            )

        async def token(request: Request) -> Response:
            body = (await request.body()).decode()
            form = {k: v[0] for k, v in parse_qs(body).items()}
            self.forms.append(form)
            if form.get("grant_type") != GRANT:
                return JSONResponse(
                    {"error": "unsupported_grant_type"}, status_code=400
                )
            try:
                claims = jwt.decode(
                    form.get("assertion", ""),
                    self.idp_key.public_key(),
                    algorithms=["ES256"],
                    audience=origin,
                )
            except jwt.PyJWTError:
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
def serve(world: Workloads) -> Iterator[str]:
    with serve_asgi(world.app) as origin:
        yield origin + "/mcp"


def spec(url: str, **fields: Any) -> m.ServerSpec:
    return m.ServerSpec(
        name="wl",
        transport="streamable_http",
        url=url,
        allow_private_network=True,
        auth="oauth",
        oauth_grant="jwt_bearer",
        oauth_client_id="workload-1",
        **fields,
    )


def _whoami(d: DaemonHarness) -> str:
    with d.client() as c:
        result = c.call_tool("wl", "whoami", {})
    assert not result.is_error
    return msgspec.json.encode(result.content).decode()


def test_the_assertion_file_is_read_at_each_token_request(base_dir: str) -> None:
    world = Workloads()
    assertion = Path(base_dir, "token.jwt")
    with serve(world) as url, DaemonHarness.running(daemon_config(base_dir)) as d:
        assertion.write_text(world.workload_jwt("pod-a") + "\n")
        with d.client() as c:
            c.add_server(spec(url, oauth_assertion_file=str(assertion)))
        d.wait_ready("wl")
        assert "workload-authorized" in _whoami(d)
        # the platform rotates the token on disk; the server forgets ours
        assertion.write_text(world.workload_jwt("pod-b"))
        world.tokens.clear()
        keeper = d.daemon.pool.get("wl").keeper
        assert keeper is not None
        generation = keeper.generation
        with d.client() as c, contextlib.suppress(Exception):
            c.call_tool("wl", "whoami", {})  # its 401 asks for a new token
        d.wait_ready("wl")
        wait_until(lambda: keeper.generation > generation, what="a new token")
        assert "workload-authorized" in _whoami(d)
    assert world.subjects == ["pod-a", "pod-b"]
    form = world.forms[0]
    assert form["grant_type"] == GRANT
    assert form["client_id"] == "workload-1"
    assert "client_secret" not in form


def test_an_inline_assertion_goes_to_the_vault_only(base_dir: str) -> None:
    world = Workloads()
    with serve(world) as url, DaemonHarness.running(daemon_config(base_dir)) as d:
        token = world.workload_jwt("job-7")
        with d.client() as c:
            c.add_server(spec(url, oauth_assertion=token))
            listed = repr(c.list_servers())
        d.wait_ready("wl")
        assert "workload-authorized" in _whoami(d)
    assert world.subjects == ["job-7"]
    assert token not in listed
    for path in Path(base_dir, "state").iterdir():
        if path.is_file():
            assert token.encode() not in path.read_bytes()


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({}, "oauth_assertion or oauth_assertion_file"),
        ({"oauth_assertion_file": "token.jwt"}, "absolute path"),
        ({"oauth_assertion": "not-a-jwt"}, "must be a JWT"),
    ],
)
def test_the_grant_needs_one_assertion(
    base_dir: str, fields: dict[str, str], words: str
) -> None:
    with (
        DaemonHarness.running(daemon_config(base_dir)) as d,
        d.client() as c,
        pytest.raises(InvalidParamsError, match=words),
    ):
        c.add_server(spec("https://mcp.example.com/mcp", **fields))
