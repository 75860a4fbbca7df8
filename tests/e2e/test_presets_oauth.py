"""The OAuth presets (zep, supermemory, neo4j-memory) and the self-hosted
stdio one (neo4j-memory-local) end to end, against local stand-ins.

Each hosted stand-in is an MCP resource server on 127.0.0.1 whose protected
resource metadata names an authorization server where the provider's is
(zep: ``/v1/oauth``, supermemory: ``/api/auth``, issuers with a path, found
through RFC 8414's path-inserted well-known URL), the SDK's auth routes over
``tests.oauth_world``'s in-memory provider. ``--url`` overrides the preset's
endpoint (``--allow-private-network``: loopback); the login is headless (the
``browser`` of oauth_world). Each test sees the preset's scopes requested at
the authorization server, the tools listed with the preset's risk catalog
(the stand-ins call themselves ``stand-in``: the preset says which provider
it is), a read call answered, and write and destructive calls held
(``write = "ask"``; destructive asks by default). Zep's tokens are short
lived: the keeper refreshes between calls and the caller sees nothing of it.
One daemon serves the module."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import (
    AuthorizationParams,
    ProviderTokenVerifier,
)
from mcp.server.auth.routes import create_auth_routes
from mcp.server.auth.settings import (
    AuthSettings,
    ClientRegistrationOptions,
    RevocationOptions,
)
from mcp.server.mcpserver import MCPServer
from mcp.shared.auth import OAuthClientInformationFull
from pydantic import AnyHttpUrl
from starlette.routing import Route

from memorizz.api.errors import ApprovalRequiredError, PermissionDeniedError
from memorizz.api.presets import find_preset
from memorizzd.config import Decisions
from tests.harness import (
    NEO4J_SERVER,
    DaemonHarness,
    command_options,
    daemon_config,
    rmtree,
    serve_asgi,
    short_tempdir,
)
from tests.neo4j_memory_server import DOCUMENTED, EXTRA
from tests.oauth_world import TestAuthorizationServer, browser
from tests.process import wait_until

WELL_KNOWN_AS = "/.well-known/oauth-authorization-server"


class HostedAuthorizationServer(TestAuthorizationServer):
    """The provider's authorization server: grants its own scopes, records
    what a login asked for (at registration and at ``/authorize``) and the
    access token each tool call came with."""

    __test__ = False

    def __init__(self, scopes: list[str], access_ttl: int = 3600) -> None:
        super().__init__(access_ttl)
        self.scopes = scopes
        self.registered_scopes: list[str | None] = []
        self.requested_scopes: list[list[str]] = []
        self.call_tokens: list[str] = []

    async def register_client(self, client_info: OAuthClientInformationFull) -> None:
        self.registered_scopes.append(client_info.scope)
        client_info.scope = " ".join(self.scopes)
        self.clients[client_info.client_id] = client_info
        self.grants.append("register")

    async def authorize(
        self, client: OAuthClientInformationFull, params: AuthorizationParams
    ) -> str:
        self.requested_scopes.append(list(params.scopes or []))
        return await super().authorize(client, params)

    def called(self) -> None:
        """In a tool: note the access token this call was made with."""
        token = get_access_token()
        assert token is not None
        self.call_tokens.append(token.token)


Tools = Callable[[MCPServer, HostedAuthorizationServer], None]


def hosted_app(
    base: str,
    world: HostedAuthorizationServer,
    as_path: str,
    tools: Tools,
    required: list[str],
) -> Any:
    """A hosted provider's shape on one origin: ``/mcp`` (tokens required,
    ``required`` scopes advertised as its ``scopes_supported``) and its
    authorization server at ``as_path``."""
    issuer = AnyHttpUrl(base + as_path)
    server = MCPServer(
        "stand-in",
        token_verifier=ProviderTokenVerifier(world),
        auth=AuthSettings(
            issuer_url=issuer,
            resource_server_url=AnyHttpUrl(base + "/mcp"),
            required_scopes=required,
            validate_token_resource=True,
        ),
        log_level="WARNING",
    )
    tools(server, world)
    app = server.streamable_http_app()
    routes = create_auth_routes(
        world,
        issuer,
        client_registration_options=ClientRegistrationOptions(
            enabled=True, valid_scopes=world.scopes, default_scopes=world.scopes
        ),
        revocation_options=RevocationOptions(enabled=True),
    )
    for route in routes:
        assert isinstance(route, Route)
        path = (
            WELL_KNOWN_AS + as_path  # RFC 8414 §3.1: inserted before the path
            if route.path == WELL_KNOWN_AS
            else as_path + route.path
        )
        app.router.routes.insert(
            0, Route(path, endpoint=route.endpoint, methods=route.methods)
        )
    world.issuer = str(issuer)
    return app


def zep_tools(server: MCPServer, world: HostedAuthorizationServer) -> None:
    """Zep's Memory MCP Server: three tools since 2026-06."""

    @server.tool()
    def search_graph(query: str) -> str:
        world.called()
        return f"context for {query}"

    @server.tool()
    def get_user_summary() -> str:
        world.called()
        return "summary"

    @server.tool()
    def add_memory(content: str) -> str:
        world.called()
        return "added"


def supermemory_tools(server: MCPServer, world: HostedAuthorizationServer) -> None:
    @server.tool()
    def search_memory(query: str) -> str:
        world.called()
        return f"memories about {query}"

    @server.tool()
    def get_profile() -> str:
        world.called()
        return "profile"

    @server.tool()
    def add_memory(content: str, action: str = "save") -> str:
        world.called()
        return f"{action}d"


def nams_tools(server: MCPServer, world: HostedAuthorizationServer) -> None:
    """Hosted NAMS: some memory_* names; the delete one by the catalog's pattern."""

    @server.tool()
    def memory_search(query: str) -> str:
        world.called()
        return f"found {query}"

    @server.tool()
    def memory_add_fact(fact: str) -> str:
        world.called()
        return "stored"

    @server.tool()
    def memory_delete_entity(entity_id: str) -> str:
        world.called()
        return "deleted"


@contextlib.contextmanager
def hosted(
    scopes: list[str],
    as_path: str,
    tools: Tools,
    *,
    required: list[str],
    access_ttl: int = 3600,
) -> Iterator[tuple[HostedAuthorizationServer, str]]:
    """A stand-in provider served on 127.0.0.1: its world and its MCP URL."""
    world = HostedAuthorizationServer(scopes, access_ttl)
    with serve_asgi(
        lambda base: hosted_app(base, world, as_path, tools, required)
    ) as base:
        yield world, base + "/mcp"


@pytest.fixture(scope="module")
def daemon() -> Iterator[DaemonHarness]:
    base = short_tempdir()
    try:
        config = daemon_config(base, decisions=Decisions(write="ask"))
        with DaemonHarness.running(config) as d:
            yield d
    finally:
        rmtree(base)


@contextlib.contextmanager
def logged_in(d: DaemonHarness, name: str, preset: str, url: str) -> Iterator[None]:
    """``mcp add NAME --preset P --url URL``, then a headless login; the
    server is removed at the end (its stand-in goes away)."""
    argv = ("mcp", "add", name, "--preset", preset, "--url", url)
    assert d.ctl(*argv, "--allow-private-network") == 0
    try:
        with d.client() as c:
            (info,) = [s for s in c.list_servers() if s.name == name]
            assert (info.preset, info.auth, info.url) == (preset, "oauth", url)
            assert c.test_server(name).outcome in (
                "login_required",
                "authorization_required",
            )  # not success before a login
            started = c.auth_login(name)
            c.auth_complete(name, browser(started.authorization_url))
        d.wait_ready(name)
        with d.client() as c:
            assert c.test_server(name).outcome == "ok"
        yield
    finally:
        with d.client() as c:
            c.remove_server(name)


def held(d: DaemonHarness, server: str, tool: str, arguments: dict[str, Any]) -> str:
    """Call a tool that must be held for approval; the risk it was held as."""
    with d.client() as c, pytest.raises(ApprovalRequiredError) as raised:
        c.call_tool(server, tool, arguments)
    data = raised.value.data
    assert isinstance(data, dict)
    assert data["decision"] == "ask"
    return str(data["risk"])


def text_of(d: DaemonHarness, server: str, tool: str, arguments: dict[str, Any]) -> str:
    with d.client() as c:
        result = c.call_tool(server, tool, arguments)
    assert not result.is_error
    return str(result.content[0]["text"])


def test_zep_logs_in_with_its_scopes_and_refreshes_between_calls_unseen(
    daemon: DaemonHarness,
) -> None:
    scopes = find_preset("zep").oauth_scopes
    assert scopes == ["graph:read", "graph:write"]
    # Tokens of two seconds (Zep's live about five minutes): the keeper
    # refreshes at half the lifetime, so between any two calls a second apart.
    with (
        hosted(
            scopes, "/v1/oauth", zep_tools, required=["graph:read"], access_ttl=2
        ) as (world, url),
        logged_in(daemon, "zep", "zep", url),
    ):
        assert world.registered_scopes == ["graph:read graph:write"]
        assert world.requested_scopes == [scopes]  # not just scopes_supported
        with daemon.client() as c:
            tools = {t.name: t.risk for t in c.list_tools("zep")}
        assert tools == {
            "search_graph": "read",
            "get_user_summary": "read",
            "add_memory": "write",
        }
        assert text_of(daemon, "zep", "search_graph", {"query": "tea"}) == (
            "context for tea"
        )
        first = world.call_tokens[-1]
        expires = world.access[first].expires_at or 0
        wait_until(
            lambda: world.count("refresh_token") >= 1 and time.time() > expires,
            what="a refresh, and the first access token's expiry",
        )
        assert text_of(daemon, "zep", "get_user_summary", {}) == "summary"
        assert world.call_tokens[-1] != first  # a refreshed token, unasked
        assert world.count("authorization_code") == 1  # no second login
        assert "authorization_code" not in world.token_posts[1:]
        assert held(daemon, "zep", "add_memory", {"content": "likes tea"}) == "write"


def test_supermemory_logs_in_with_its_scopes_and_holds_add_memory_as_destructive(
    daemon: DaemonHarness,
) -> None:
    scopes = find_preset("supermemory").oauth_scopes
    assert scopes == ["openid", "profile", "email", "offline_access"]
    with (
        hosted(scopes, "/api/auth", supermemory_tools, required=["openid"]) as (
            world,
            url,
        ),
        logged_in(daemon, "sm", "supermemory", url),
    ):
        assert world.requested_scopes == [scopes]
        with daemon.client() as c:
            tools = {t.name: t.risk for t in c.list_tools("sm")}
        assert tools == {
            "search_memory": "read",
            "get_profile": "read",
            "add_memory": "destructive",  # it can forget, too
        }
        assert text_of(daemon, "sm", "search_memory", {"query": "tea"}) == (
            "memories about tea"
        )
        risk = held(daemon, "sm", "add_memory", {"content": "x", "action": "forget"})
        assert risk == "destructive"
        assert len(world.call_tokens) == 1  # the held call never reached it


def test_neo4j_memory_hosted_logs_in_and_classes_its_memory_tools(
    daemon: DaemonHarness,
) -> None:
    preset = find_preset("neo4j-memory")
    assert preset.oauth_scopes == []  # the server's own scopes_supported serve
    with (
        hosted(["memory"], "", nams_tools, required=["memory"]) as (world, url),
        logged_in(daemon, "nams", "neo4j-memory", url),
    ):
        assert world.requested_scopes == [["memory"]]
        with daemon.client() as c:
            tools = {t.name: t.risk for t in c.list_tools("nams")}
        assert tools == {
            "memory_search": "read",
            "memory_add_fact": "write",
            "memory_delete_entity": "destructive",  # the catalog's pattern
        }
        assert text_of(daemon, "nams", "memory_search", {"query": "x"}) == "found x"
        assert held(daemon, "nams", "memory_add_fact", {"fact": "f"}) == "write"
        assert held(daemon, "nams", "memory_delete_entity", {"entity_id": "e"}) == (
            "destructive"
        )


def test_neo4j_memory_local_runs_the_given_command_and_shows_only_its_12_tools(
    daemon: DaemonHarness,
) -> None:
    argv = ("mcp", "add", "nl", "--preset", "neo4j-memory-local")
    assert daemon.ctl(*argv) == 2  # no --command: refused
    command = command_options(NEO4J_SERVER)
    assert daemon.ctl(*argv, *command) == 0
    daemon.wait_ready("nl")
    with daemon.client() as c:
        (info,) = [s for s in c.list_servers() if s.name == "nl"]
        assert (info.preset, info.transport) == ("neo4j-memory-local", "stdio")
        tools = {t.name: t.risk for t in c.list_tools("nl")}
        assert sorted(tools) == sorted(DOCUMENTED)  # EXTRA is hidden
        assert tools["memory_get_context"] == "read"
        assert tools["memory_add_entity"] == "write"
        with pytest.raises(PermissionDeniedError) as blocked:
            c.call_tool("nl", EXTRA, {})
        assert blocked.value.reason == "tool_blocked"
    answer = text_of(daemon, "nl", "memory_get_context", {"query": "q"})
    assert answer == "memory_get_context: q"
    assert held(daemon, "nl", "memory_add_entity", {"query": "e"}) == "write"
