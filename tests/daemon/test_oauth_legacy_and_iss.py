"""RFC 9207 ``iss`` compared exactly (MCP 2026-07-28), and servers of the
2025-03-26 era (no protected resource metadata; no metadata at all: the
default endpoints on the MCP origin), through the real daemon against real
local servers on 127.0.0.1."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import msgspec
import pytest
from mcp.server.mcpserver import MCPServer
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from memorizz.api import methods as m
from memorizz.api.errors import LoginError
from tests.harness import (
    DaemonHarness,
    daemon_config,
    serve_asgi,
)
from tests.oauth_world import TestAuthorizationServer, browser, serve_protected


def oauth_spec(url: str) -> m.ServerSpec:
    return m.ServerSpec(
        name="cal",
        transport="streamable_http",
        url=url,
        allow_private_network=True,
        auth="oauth",
    )


@pytest.mark.parametrize("advertised", [True, False])
def test_iss_with_a_trailing_slash_is_another_issuer(
    base_dir: str, advertised: bool
) -> None:
    """The issuer ``http://127.0.0.1:P/`` and ``http://127.0.0.1:P`` differ:
    no URL normalization before the comparison (RFC 9207 §2.4), advertised or
    not; the token endpoint never sees the code."""
    world = TestAuthorizationServer()
    world.advertise_iss = advertised
    world.send_iss = True
    with (
        serve_protected(world) as url,
        DaemonHarness.running(daemon_config(base_dir)) as d,
        d.client() as c,
    ):
        c.add_server(oauth_spec(url))
        exact = world.issuer
        assert exact.endswith("/")
        world.issuer = exact.rstrip("/")  # what a lenient comparison would accept
        callback = browser(c.auth_login("cal").authorization_url)
        with pytest.raises(LoginError) as refused:
            c.auth_complete("cal", callback)
        assert refused.value.reason == "invalid_state"
        assert world.token_posts == []
        world.issuer = exact  # the issuer exactly as its metadata writes it
        callback = browser(c.auth_login("cal").authorization_url)
        assert c.auth_complete("cal", callback).auth.state == "ok"
    assert world.token_posts == ["authorization_code"]


class Legacy:
    """A 2025-03-26 server: its MCP endpoint wants a bearer token; no
    protected resource metadata; RFC 8414 metadata at its origin or none."""

    def __init__(self, *, metadata: bool) -> None:
        self.metadata = metadata
        self.tokens: set[str] = set()
        self.codes: dict[str, str] = {}
        self.seen: list[str] = []
        """``<method> <path>`` of every request but the MCP ones."""
        self.forms: list[dict[str, str]] = []

    def app(self, origin: str) -> Any:
        mcp = MCPServer("legacy", log_level="WARNING")

        @mcp.tool()
        def whoami() -> str:
            """Who we are."""
            return "authorized"

        mcp_app = mcp.streamable_http_app()
        prefix = "/oauth" if self.metadata else ""

        async def metadata(request: Request) -> Response:
            self.seen.append(f"GET {request.url.path}")
            if not self.metadata:
                return Response(status_code=404)
            return JSONResponse(
                {
                    "issuer": origin,
                    "authorization_endpoint": f"{origin}{prefix}/authorize",
                    "token_endpoint": f"{origin}{prefix}/token",
                    "registration_endpoint": f"{origin}{prefix}/register",
                    "response_types_supported": ["code"],
                    "code_challenge_methods_supported": ["S256"],
                }
            )

        async def not_found(request: Request) -> Response:
            self.seen.append(f"GET {request.url.path}")
            return Response(status_code=404)

        async def register(request: Request) -> Response:
            self.seen.append(f"POST {request.url.path}")
            body = msgspec.json.decode(await request.body())
            return JSONResponse(
                {"client_id": "legacy-client", "redirect_uris": body["redirect_uris"]},
                status_code=201,
            )

        async def authorize(request: Request) -> Response:
            self.seen.append(f"GET {request.url.path}")
            q = request.query_params
            assert q["code_challenge_method"] == "S256"
            code = secrets.token_urlsafe(16)
            self.codes[code] = q["code_challenge"]
            query = urlencode({"code": code, "state": q["state"]})
            return RedirectResponse(f"{q['redirect_uri']}?{query}", status_code=302)

        async def token(request: Request) -> Response:
            self.seen.append(f"POST {request.url.path}")
            form = {
                k: v[0] for k, v in parse_qs((await request.body()).decode()).items()
            }
            self.forms.append(form)
            if form.get("code") not in self.codes:
                return JSONResponse({"error": "invalid_grant"}, status_code=400)
            access = secrets.token_urlsafe(16)
            self.tokens.add(access)
            return JSONResponse(
                {"access_token": access, "token_type": "Bearer", "expires_in": 3600}
            )

        oauth = Starlette(
            routes=[
                Route("/.well-known/oauth-authorization-server", metadata),
                Route("/.well-known/oauth-protected-resource{rest:path}", not_found),
                Route("/.well-known/openid-configuration", not_found),
                Route(f"{prefix}/register", register, methods=["POST"]),
                Route(f"{prefix}/authorize", authorize),
                Route(f"{prefix}/token", token, methods=["POST"]),
            ]
        )

        async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
            if scope["type"] != "http" or scope["path"].startswith("/mcp"):
                if scope["type"] == "http":
                    auth = dict(scope["headers"]).get(b"authorization", b"")
                    if auth.decode().removeprefix("Bearer ") not in self.tokens:
                        await Response(
                            status_code=401, headers={"WWW-Authenticate": "Bearer"}
                        )(scope, receive, send)
                        return
                await mcp_app(scope, receive, send)
                return
            await oauth(scope, receive, send)

        return asgi


@contextlib.contextmanager
def serve_legacy(legacy: Legacy) -> Iterator[str]:
    with serve_asgi(legacy.app) as origin:
        yield origin + "/mcp"


@pytest.mark.parametrize("metadata", [True, False], ids=["origin-metadata", "none"])
def test_a_2025_03_26_server_logs_in_without_resource_metadata(
    base_dir: str, metadata: bool
) -> None:
    legacy = Legacy(metadata=metadata)
    with (
        serve_legacy(legacy) as url,
        DaemonHarness.running(daemon_config(base_dir)) as d,
        d.client() as c,
    ):
        c.add_server(oauth_spec(url))
        started = c.auth_login("cal")
        prefix = "/oauth" if metadata else ""
        assert urlsplit(started.authorization_url).path == f"{prefix}/authorize"
        assert c.auth_complete("cal", browser(started.authorization_url))
        d.wait_ready("cal")
        result = c.call_tool("cal", "whoami", {})
    assert not result.is_error
    assert "authorized" in msgspec.json.encode(result.content).decode()
    assert f"POST {prefix}/register" in legacy.seen
    assert f"POST {prefix}/token" in legacy.seen
    form = legacy.forms[0]
    assert form["grant_type"] == "authorization_code"
    assert form["code_verifier"]  # PKCE, as 2025-03-26 made it a MUST
