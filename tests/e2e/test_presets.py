"""Connection presets end to end: hosted providers' local stand-ins on
127.0.0.1 (``--url`` overrides the preset's endpoint, with
``--allow-private-network``), added from the preset by ``memorizzctl mcp add
--preset``, credentials given or logged in, tools listed with the preset's
risk catalog, a read call made, a write call classified and held when the
policy says ask; the connection instructions on the socket API and the MCP
face; presets in the config file; and no credential in any preset."""

from __future__ import annotations

import os
import re
import secrets
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from mcp.server.auth.settings import AuthSettings, ClientRegistrationOptions
from mcp.server.mcpserver import MCPServer
from pydantic import AnyHttpUrl

from memorizz.api import methods as m
from memorizz.api.errors import ApprovalRequiredError, InvalidParamsError
from memorizz.api.presets import PRESETS, apply_preset, find_preset
from memorizzd.config import ConfigError, Decisions, load
from memorizzd.listeners import face_socket_path
from memorizzd.oauth.login import DEFAULT_REDIRECT_URI
from memorizzd.presets import CATALOG, catalog_named
from tests.harness import DaemonHarness, daemon_config, serve_asgi
from tests.oauth_world import TestAuthorizationServer, browser

ASK_WRITES = Decisions(write="ask")


def bearer_guard(app: Any, token: str) -> Any:
    """401 unless ``Authorization: Bearer <token>``."""

    async def guarded(scope: Any, receive: Any, send: Any) -> None:
        wanted = f"Bearer {token}".encode()
        if (
            scope["type"] == "http"
            and dict(scope["headers"]).get(b"authorization") != wanted
        ):
            await send({"type": "http.response.start", "status": 401, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        await app(scope, receive, send)

    return guarded


def mem0_stand_in() -> MCPServer:
    """Mem0's hosted tools by name (what they do is not the point)."""
    server = MCPServer("mem0-stand-in", log_level="WARNING")

    @server.tool()
    def search_memories(query: str) -> str:
        return f"found: {query}"

    @server.tool()
    def add_memory(text: str) -> str:
        return "added"

    @server.tool()
    def delete_memory(memory_id: str) -> str:
        return "deleted"

    return server


def honcho_stand_in() -> MCPServer:
    """Honcho's tools take the workspace as an argument; they echo it back."""
    server = MCPServer("honcho-stand-in", log_level="WARNING")

    @server.tool()
    def inspect_workspace(workspace_id: str) -> str:
        return f"workspace={workspace_id}"

    @server.tool()
    def create_session(workspace_id: str, session_id: str) -> str:
        return f"session {session_id} in {workspace_id}"

    return server


@pytest.fixture(scope="module")
def token() -> str:
    # made here (no credential in this file); a letter first: one beginning
    # with "-" would be read as an option (memorizzctl ... --token TOKEN)
    return "t" + secrets.token_urlsafe(16)


@pytest.fixture(scope="module")
def mem0_url(token: str) -> Iterator[str]:
    app = mem0_stand_in().streamable_http_app()
    with serve_asgi(lambda base: bearer_guard(app, token)) as base:
        yield base + "/mcp"


@pytest.fixture(scope="module")
def honcho_url(token: str) -> Iterator[str]:
    app = honcho_stand_in().streamable_http_app()
    with serve_asgi(lambda base: bearer_guard(app, token)) as base:
        yield base + "/mcp"


def notion_app(base: str, provider: TestAuthorizationServer) -> Any:
    """Notion's hosted shape: OAuth with dynamic registration, its tool names."""
    server = MCPServer(
        "notion-stand-in",
        auth_server_provider=provider,
        auth=AuthSettings(
            issuer_url=AnyHttpUrl(base),
            resource_server_url=AnyHttpUrl(base + "/mcp"),
            validate_token_resource=True,
            required_scopes=["mcp"],
            client_registration_options=ClientRegistrationOptions(
                enabled=True, valid_scopes=["mcp"], default_scopes=["mcp"]
            ),
        ),
        log_level="WARNING",
    )

    @server.tool(name="notion-search")
    def search(query: str) -> str:
        return f"pages about {query}"

    @server.tool(name="notion-create-pages")
    def create_pages(title: str) -> str:
        return f"created {title}"

    provider.issuer = base
    return server.streamable_http_app()


def add_from_preset(d: DaemonHarness, *argv: str) -> int:
    """``memorizzctl mcp add ... --allow-private-network`` (the stand-ins
    live on loopback)."""
    return d.ctl("mcp", "add", *argv, "--allow-private-network")


def test_presets_are_listed_with_their_tools_risks(
    base_dir: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with DaemonHarness.running(daemon_config(base_dir)) as d:
        capsys.readouterr()
        assert d.ctl("mcp", "presets", "--json") == 0
        listed = msgspec.json.decode(capsys.readouterr().out, type=m.PresetsListResult)
        assert d.ctl("mcp", "presets") == 0
        text = capsys.readouterr().out
    by_name = {p.name: p for p in listed.presets}
    assert set(by_name) == {
        "notion",
        "google-calendar",
        "mem0",
        "zep",
        "supermemory",
        "honcho",
        "neo4j-memory",
        "neo4j-memory-local",
        "cognee",
    }
    assert by_name["supermemory"].tools["add_memory"] == "destructive"
    assert by_name["mem0"].tools["delete_memory"] == "destructive"
    assert by_name["zep"].oauth_scopes == ["graph:read", "graph:write"]
    assert by_name["honcho"].tools["create_session"] == "write"
    assert by_name["google-calendar"].tools["delete_event"] == "destructive"
    assert by_name["notion"].tools["notion-search"] == "read"
    assert len(by_name["neo4j-memory-local"].only) == 12
    assert all(p.tools for p in listed.presets)  # every one has its catalog
    assert "https://mcp.mem0.ai/mcp/" in text
    assert "destructive: add_memory" in text  # supermemory
    # a preset kept to some tools lists those, not the provider's whole catalog
    blocks: dict[str, str] = {}  # each preset's lines, by its name
    for line in text.splitlines():
        if not line.startswith(" "):
            name = line.split(":", 1)[0]
        blocks[name] = blocks.get(name, "") + line + "\n"
    local = blocks["neo4j-memory-local"]
    catalog = by_name["neo4j-memory-local"].tools
    assert f"kept to these 12 of the provider's {len(catalog)}" in local
    hidden = set(catalog) - set(by_name["neo4j-memory-local"].only)
    assert hidden
    assert not any(tool in local.split() or f"{tool}," in local for tool in hidden)
    # the built-in bridge runs no command: it is given the tenant's URL
    cognee = blocks["cognee"]
    assert "builtin (the daemon's own bridge: give --url)" in cognee
    assert "(your command)" not in cognee


def test_mem0_preset_with_a_key_reads_and_holds_writes(
    base_dir: str, mem0_url: str, token: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with DaemonHarness.running(daemon_config(base_dir, decisions=ASK_WRITES)) as d:
        argv = ("mem0", "--preset", "mem0", "--url", mem0_url, "--token", token)
        assert add_from_preset(d, *argv) == 0
        d.wait_ready("mem0")
        with d.client() as c:
            (info,) = c.list_servers()
            assert (info.preset, info.auth, info.url) == ("mem0", "bearer", mem0_url)
            tools = {t.name: t for t in c.list_tools("mem0")}
            assert {n: t.risk for n, t in tools.items()} == {
                "search_memories": "read",
                "add_memory": "write",
                "delete_memory": "destructive",
            }  # the preset's catalog: the server calls itself mem0-stand-in
            found = c.call_tool("mem0", "search_memories", {"query": "tea"})
            assert found.content[0]["text"] == "found: tea"
            with pytest.raises(ApprovalRequiredError) as held:
                c.call_tool("mem0", "add_memory", {"text": "likes tea"})
            assert held.value.data["risk"] == "write"  # type: ignore[index]
            (status,) = c.server_status("mem0")
            assert status.instructions == find_preset("mem0").instructions
            listed = c.request(
                "tools/list", m.ToolsListParams(server="mem0"), m.ToolsListResult
            )
            assert listed.instructions == find_preset("mem0").instructions
        out = capsys.readouterr()
        assert token not in out.out + out.err


def test_honcho_preset_projects_its_workspace_into_every_call(
    base_dir: str, honcho_url: str, token: str
) -> None:
    with DaemonHarness.running(daemon_config(base_dir, decisions=ASK_WRITES)) as d:
        argv = ("h", "--preset", "honcho", "--url", honcho_url, "--token", token)
        assert add_from_preset(d, *argv) == 2  # no --workspace: refused here
        assert add_from_preset(d, *argv, "--workspace", "ws-one") == 0
        d.wait_ready("h")
        with d.client() as c:
            (info,) = c.list_servers()
            assert info.workspace == "ws-one"
            tools = {t.name: t for t in c.list_tools("h")}
            schema = tools["inspect_workspace"].input_schema
            assert "workspace_id" not in schema.get("properties", {})
            assert "workspace_id" not in schema.get("required", [])
            assert tools["create_session"].risk == "write"
            plain = c.call_tool("h", "inspect_workspace", {})
            assert plain.content[0]["text"] == "workspace=ws-one"
            forced = c.call_tool("h", "inspect_workspace", {"workspace_id": "other"})
            assert forced.content[0]["text"] == "workspace=ws-one"  # never the caller's
            with pytest.raises(ApprovalRequiredError):
                c.call_tool("h", "create_session", {"session_id": "s1"})
            (proposal,) = c.list_approvals(show_arguments=True)
            assert proposal.arguments == {"session_id": "s1", "workspace_id": "ws-one"}


def test_notion_preset_logs_in_then_reads_and_holds_writes(base_dir: str) -> None:
    world = TestAuthorizationServer()
    config = daemon_config(base_dir, decisions=ASK_WRITES)
    with (
        serve_asgi(lambda base: notion_app(base, world)) as base,
        DaemonHarness.running(config) as d,
    ):
        url = base + "/mcp"
        assert add_from_preset(d, "notion", "--preset", "notion", "--url", url) == 0
        with d.client() as c:
            (info,) = c.list_servers()
            assert (info.auth, info.preset) == ("oauth", "notion")
            before = c.test_server("notion")
            assert before.outcome in ("login_required", "authorization_required")
            started = c.auth_login("notion")
            c.auth_complete("notion", browser(started.authorization_url))
        d.wait_ready("notion")
        with d.client() as c:
            assert c.test_server("notion").outcome == "ok"
            tools = {t.name: t.risk for t in c.list_tools("notion")}
            assert tools == {"notion-search": "read", "notion-create-pages": "write"}
            found = c.call_tool("notion", "notion-search", {"query": "plans"})
            assert found.content[0]["text"] == "pages about plans"
            with pytest.raises(ApprovalRequiredError):
                c.call_tool("notion", "notion-create-pages", {"title": "x"})


def test_notion_preset_takes_a_bearer_integration_token_instead(
    base_dir: str, mem0_url: str, token: str
) -> None:
    """``--auth bearer`` drops the preset's OAuth settings (any endpoint will
    do for the spec: the mem0 stand-in takes the same token)."""
    with DaemonHarness.running(daemon_config(base_dir)) as d:
        argv = ("n", "--preset", "notion", "--url", mem0_url, "--token", token)
        assert add_from_preset(d, *argv, "--auth", "bearer") == 0
        d.wait_ready("n")
        with d.client() as c:
            (info,) = c.list_servers()
            assert (info.auth, info.oauth_scopes) == ("bearer", [])


def test_google_calendar_preset_needs_a_client_and_prints_its_redirect_uri(
    base_dir: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with DaemonHarness.running(daemon_config(base_dir)) as d:
        nowhere = ("--url", "http://127.0.0.1:9/mcp")  # never reached: no login
        assert add_from_preset(d, "cal", "--preset", "google-calendar", *nowhere) == 2
        capsys.readouterr()
        code = add_from_preset(
            d, "cal", "--preset", "google-calendar", *nowhere,
            "--client-id", "client-id-1.apps.example",
        )  # fmt: skip
        out = capsys.readouterr().out
    assert code == 0
    assert (
        f"register this redirect URI with the OAuth client: {DEFAULT_REDIRECT_URI}"
        in out
    )
    assert m.DEFAULT_REDIRECT_URI == DEFAULT_REDIRECT_URI


def test_instructions_reach_the_face_per_scope(
    base_dir: str, mem0_url: str, honcho_url: str, token: str
) -> None:
    with DaemonHarness.running(daemon_config(base_dir)) as d:
        add_from_preset(
            d, "mem0", "--preset", "mem0", "--url", mem0_url, "--token", token
        )
        assert _initialize(d)["instructions"] == find_preset("mem0").instructions
        text = "Ask it about the team."
        add_from_preset(
            d, "h", "--preset", "honcho", "--url", honcho_url, "--token", token,
            "--workspace", "w", "--instructions", text,
        )  # fmt: skip
        combined = _initialize(d)["instructions"]
        assert f"h: {text}" in combined
        assert f"mem0: {find_preset('mem0').instructions}" in combined
        add_from_preset(
            d, "quiet", "--preset", "mem0", "--url", mem0_url, "--token", token,
            "--no-instructions",
        )  # fmt: skip
        with d.client() as c:
            (status,) = c.server_status("quiet")
            assert status.instructions is None
        assert "quiet:" not in _initialize(d)["instructions"]


def _initialize(d: DaemonHarness) -> dict[str, Any]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(face_socket_path(d.socket))
        sock.sendall(
            b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":'
            b'{"protocolVersion":"2025-11-25","capabilities":{},'
            b'"clientInfo":{"name":"raw","version":"0"}}}\n'
        )
        reply = msgspec.json.decode(sock.makefile("rb").readline())
    result: dict[str, Any] = reply["result"]
    return result


def test_a_config_file_server_may_name_a_preset(base_dir: str) -> None:
    path = Path(base_dir, "memorizzd.toml")
    path.write_text(
        "[[servers]]\n"
        'name = "mem"\npreset = "mem0"\nauth = "bearer"\ntoken = "x"\n'
        "instructions = false\n"
        "[[servers]]\n"
        'name = "zep"\npreset = "zep"\n'
    )
    config = load(str(path), socket=os.path.join(base_dir, "s"), state_dir=base_dir)
    mem, zep = config.servers
    assert (mem.transport, mem.url, mem.instructions) == (
        "streamable_http",
        "https://mcp.mem0.ai/mcp/",
        False,
    )
    assert (zep.auth, zep.oauth_scopes) == ("oauth", ["graph:read", "graph:write"])
    assert zep.instructions == find_preset("zep").instructions
    path.write_text('[[servers]]\nname = "h"\npreset = "honcho"\ntoken = "x"\n')
    with pytest.raises(ConfigError, match="needs a workspace"):
        load(str(path), socket=os.path.join(base_dir, "s"), state_dir=base_dir)
    path.write_text('[[servers]]\nname = "x"\npreset = "nope"\n')
    with pytest.raises(ConfigError, match="unknown preset"):
        load(str(path), socket=os.path.join(base_dir, "s"), state_dir=base_dir)


def test_servers_add_refuses_an_unknown_preset_and_a_stray_workspace(
    base_dir: str,
) -> None:
    spec = m.ServerSpec(name="x", transport="streamable_http", preset="nope")
    with DaemonHarness.running(daemon_config(base_dir)) as d, d.client() as c:
        with pytest.raises(InvalidParamsError) as unknown:
            c.add_server(spec)
        assert unknown.value.reason == "unknown_preset"
        stray = m.ServerSpec(
            name="x",
            transport="streamable_http",
            preset="mem0",
            auth="bearer",
            token="t",  # noqa: S106 - never sent anywhere: refused first
            workspace="w",
        )
        with pytest.raises(InvalidParamsError, match="takes no workspace"):
            c.add_server(stray)


# Things that look like a credential: provider key prefixes, JWTs, bearer
# values, long hex or base64 runs, URLs with a user or password in them.
_CREDENTIAL = re.compile(
    r"(sk[-_][A-Za-z0-9]{8,}|m0-[A-Za-z0-9]{8,}|ghp_[A-Za-z0-9]{8,}|secret_[A-Za-z0-9]{8,}"
    r"|ntn_[A-Za-z0-9]{8,}|eyJ[A-Za-z0-9_-]{10,}\.|Bearer\s+[A-Za-z0-9._~+/-]{8,}"
    r"|[A-Fa-f0-9]{32,}|://[^/\s:@]+:[^/\s@]+@"
    r"|(?=[A-Za-z0-9+/_-]*\d)(?=[A-Za-z0-9+/_-]*[A-Z])[A-Za-z0-9+/_-]{32,})"
)


def test_no_preset_and_no_fixture_holds_a_credential() -> None:
    for sample in ("A1" + "b" * 40, "0f" * 16, "sk-abcdef123456"):
        assert _CREDENTIAL.search(sample)  # the scan would see one
    for preset in PRESETS:
        encoded = msgspec.json.encode(preset).decode()
        assert not _CREDENTIAL.search(encoded), preset.name
        assert "token" not in msgspec.to_builtins(preset)
    docs = Path(__file__).parents[2] / "docs" / "presets.md"
    assert not _CREDENTIAL.search(docs.read_text())
    assert not _CREDENTIAL.search(Path(__file__).read_text().split("_CREDENTIAL =")[0])
    for entry in CATALOG:
        assert not _CREDENTIAL.search(" ".join(entry.tools))


def test_every_preset_names_a_catalog_entry_and_expands_to_a_valid_spec() -> None:
    from memorizz.api.spec import check_server_spec

    for preset in PRESETS:
        assert catalog_named(preset.provider) is not None, preset.name
        spec = m.ServerSpec(
            name="s",
            transport=preset.transport,
            preset=preset.name,
            command="/bin/true" if preset.transport == "stdio" else None,
            url="https://t.aws.cognee.ai" if preset.transport == "builtin" else None,
            auth=preset.auth,
            token="t" if preset.auth == "bearer" else None,
            oauth_client_id="c"
            if preset.oauth_registration == "pre_registered"
            else None,
            workspace="w" if preset.workspace_arguments else None,
        )
        check_server_spec(apply_preset(spec, preset))
