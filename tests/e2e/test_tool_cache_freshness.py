"""How long the warm tool cache of a Streamable HTTP server is trusted.

A server that gives the daemon no change signal (a 2026-07-28 server that
declares no ``tools.listChanged``, such as the official Python SDK's
low-level ``Server`` with its default notification options, or FastMCP 4.2;
a handshake-era server that gives no session id) has no session to lose and
no listen stream to break when it restarts with other tools: its listing,
and the listing's risk verdicts, go stale ``max(ttlMs, LISTING_FRESH_MIN_S)``
after they were fetched, and the next ``tools/call`` or ``tools/list`` fetches
them again (MCP 2026-07-28, server/utilities/caching: an absent ``ttlMs`` is
0). Any other server's listing is kept until it says it changed. Found by the
third-party-server probe (FastMCP 4.2, the SDK's low-level ``Server``).

Also here: an HTTP tool result is passed on with the members the server sent,
none that the SDK's model adds by default (``resultType``, ``isError``).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import mcp_types as types
import msgspec
import pytest

from memorizz.api.errors import ApprovalRequiredError, RemoteError
from memorizzd.upstream.tools import LISTING_FRESH_MIN_S
from tests.harness import (
    DaemonHarness,
    daemon_config,
    http_spec,
    rmtree,
    serve_asgi,
    short_tempdir,
    wait_until,
)

PAST_THE_FLOOR_S = LISTING_FRESH_MIN_S + 1.0


def _lowlevel_app(
    pages: list[list[types.Tool]],
    *,
    listed: list[str] | None = None,
    name: str = "ll",
    version: str = "v1",
    ttl_ms: list[int | None] | None = None,
    stateless: bool = False,
) -> Any:
    """The SDK's low-level ``Server`` (``tools.listChanged`` false) listing
    ``pages`` (by cursor, page ``i``'s ``ttlMs`` from ``ttl_ms``, absent when
    None); each ``tools/list`` is counted in ``listed`` (its ``name``); each
    tool answers ``"TOOL VERSION ran"``. ``stateless``: no session ids."""
    from mcp.server.lowlevel import Server

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        if listed is not None:
            listed.append(name)
        cursor = params.cursor if params is not None else None
        at = int(cursor) if cursor else 0
        fields: dict[str, Any] = {"tools": pages[at]}
        if at + 1 < len(pages):
            fields["next_cursor"] = str(at + 1)
        if ttl_ms is not None and ttl_ms[at] is not None:
            fields["ttl_ms"] = ttl_ms[at]
        return types.ListToolsResult(**fields)

    async def call_tool(ctx: Any, params: Any) -> types.CallToolResult:
        text = f"{params.name} {version} ran"
        return types.CallToolResult(content=[types.TextContent(text=text)])

    server = Server(
        "lowlevel-probe",
        version=version,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )
    return server.streamable_http_app(stateless_http=stateless)


def _tool(name: str, **annotations: Any) -> types.Tool:
    return types.Tool(
        name=name,
        description=name,
        input_schema={"type": "object"},
        annotations=types.ToolAnnotations(**annotations) if annotations else None,
    )


def _counted(listed: list[str], name: str) -> Callable[[Any], Any]:
    """An ASGI middleware that counts the 2026-07-28 ``tools/list`` requests
    (their ``Mcp-Method`` header) in ``listed``, as ``name``."""

    def wrap(app: Any) -> Any:
        async def counted(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "http" and scope["method"] == "POST":
                headers = dict(scope["headers"])
                if headers.get(b"mcp-method") == b"tools/list":
                    listed.append(name)
            await app(scope, receive, send)

        return counted

    return wrap


def _signalling_app(listed: list[str]) -> Any:
    """An MCPServer (2026-07-28: it serves ``subscriptions/listen``, so it
    declares ``tools.listChanged``), its ``tools/list`` requests counted."""
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("signalling", version="1")

    @server.tool()
    def ping() -> str:
        """Answer pong."""
        return "pong"

    return _counted(listed, "signals")(server.streamable_http_app())


def _past_the_floor() -> None:
    """Let a listing fetched now go stale (if it is one that can)."""
    threading.Event().wait(PAST_THE_FLOOR_S)


@contextlib.contextmanager
def _base() -> Iterator[str]:
    base = short_tempdir("mz-ttl-")
    try:
        yield base
    finally:
        rmtree(base)


def test_a_restarted_modern_http_server_without_list_changes_is_listed_afresh() -> None:
    """v1 (``wipe`` read-only) is replaced on its port by v2 (``wipe``
    destructive, one more tool) while the daemon runs, health probes every
    0.5 s: within the listing's freshness (the floor: the server sends no
    ``ttlMs``) the daemon lists v2's tools with v2's risks, and ``wipe``
    waits for an operator instead of running."""
    v1_tools = [_tool("wipe", read_only_hint=True)]
    v2_tools = [
        _tool("wipe", read_only_hint=False, destructive_hint=True),
        _tool("added_in_v2"),
    ]
    with _base() as base, contextlib.ExitStack() as daemons:
        with contextlib.ExitStack() as first:
            v1 = first.enter_context(serve_asgi(lambda _: _lowlevel_app([v1_tools])))
            port = int(v1.rsplit(":", 1)[1])
            config = daemon_config(
                base,
                servers=[http_spec("ll", f"{v1}/mcp", "streamable_http")],
                health_interval_s=0.5,
                health_timeout_s=2.0,
            )
            daemon = daemons.enter_context(DaemonHarness.running(config))
            daemon.wait_ready("ll")
            with daemon.client() as c:
                assert c.server_status("ll")[0].protocol_version == "2026-07-28"
                assert [(t.name, t.risk) for t in c.list_tools("ll")] == [
                    ("wipe", "read")
                ]
        # v1 has stopped; v2 takes its port, behind the daemon's back.
        daemons.enter_context(
            serve_asgi(lambda _: _lowlevel_app([v2_tools], version="v2"), port)
        )
        with daemon.client() as c:

            def reaches_v2() -> bool:
                try:  # one call may see v1's connection end (server_unavailable)
                    result = c.call_tool("ll", "added_in_v2")
                except RemoteError:
                    return False
                return bool(result.content[0]["text"] == "added_in_v2 v2 ran")

            wait_until(reaches_v2, timeout=PAST_THE_FLOOR_S + 10, what="v2 answers")

            def listed_afresh() -> bool:
                return {t.name for t in c.list_tools("ll")} == {"wipe", "added_in_v2"}

            wait_until(listed_afresh, timeout=PAST_THE_FLOOR_S + 5, what="v2's tools")
            risks = {t.name: t.risk for t in c.list_tools("ll")}
            assert risks["wipe"] == "destructive"
            with pytest.raises(ApprovalRequiredError):
                c.call_tool("ll", "wipe")


def test_only_a_server_without_a_change_signal_is_listed_again_past_the_floor() -> None:
    """Four HTTP servers, each listed once at connect; past the floor, a call
    and a listing of each: the two that give no change signal (a 2026-07-28
    server without ``tools.listChanged``; a handshake-era one without a
    session id) are listed again, once; the two that do (a 2026-07-28 server
    with ``tools.listChanged``, whose listen stream the daemon holds; a
    handshake-era session with an id) are not: their cache is kept."""
    listed: list[str] = []
    tools = [_tool("ping", read_only_hint=True)]
    with contextlib.ExitStack() as stack, _base() as base:
        silent = stack.enter_context(
            serve_asgi(lambda _: _lowlevel_app([tools], listed=listed, name="silent"))
        )
        stateless = stack.enter_context(
            serve_asgi(
                lambda _: _lowlevel_app(
                    [tools], listed=listed, name="stateless", stateless=True
                )
            )
        )
        stateful = stack.enter_context(
            serve_asgi(lambda _: _lowlevel_app([tools], listed=listed, name="stateful"))
        )
        signals = stack.enter_context(serve_asgi(lambda _: _signalling_app(listed)))
        servers = {
            "silent": http_spec("silent", f"{silent}/mcp", "streamable_http"),
            "stateless": http_spec(
                "stateless", f"{stateless}/mcp", "streamable_http", protocol="legacy"
            ),
            "stateful": http_spec(
                "stateful", f"{stateful}/mcp", "streamable_http", protocol="legacy"
            ),
            "signals": http_spec("signals", f"{signals}/mcp", "streamable_http"),
        }
        config = daemon_config(base, servers=list(servers.values()))
        daemon = stack.enter_context(DaemonHarness.running(config))
        for name in servers:
            daemon.wait_ready(name)
        with daemon.client() as c:
            versions = {s.name: s.protocol_version for s in c.server_status()}
            assert versions == {
                "silent": "2026-07-28",
                "stateless": "2025-11-25",
                "stateful": "2025-11-25",
                "signals": "2026-07-28",
            }
            for name in servers:
                assert [t.name for t in c.list_tools(name)] == ["ping"]
            at_connect = {name: listed.count(name) for name in servers}
            assert at_connect == dict.fromkeys(servers, 1)
            _past_the_floor()
            for name in servers:
                c.call_tool(name, "ping")
                assert [t.name for t in c.list_tools(name)] == ["ping"]
            again = {name: listed.count(name) - 1 for name in servers}
        assert again == {"silent": 1, "stateless": 1, "stateful": 0, "signals": 0}


def test_a_listing_is_fresh_for_its_smallest_page_ttl() -> None:
    """A 2026-07-28 server without ``tools.listChanged`` whose listing's two
    pages say ``ttlMs`` 60000 and 10000: past the floor but within 10 s of
    the listing, calls and listings take the cache; once 10 s have passed,
    the next call lists the tools again."""
    listed: list[str] = []
    pages = [[_tool("ping", read_only_hint=True)], [_tool("pong")]]
    with _base() as base, contextlib.ExitStack() as stack:
        url = stack.enter_context(
            serve_asgi(
                lambda _: _lowlevel_app(pages, listed=listed, ttl_ms=[60_000, 10_000])
            )
        )
        config = daemon_config(
            base, servers=[http_spec("ll", f"{url}/mcp", "streamable_http")]
        )
        daemon = stack.enter_context(DaemonHarness.running(config))
        daemon.wait_ready("ll")
        ready = time.monotonic()
        assert len(listed) == 2  # both pages, at connect
        with daemon.client() as c:
            _past_the_floor()
            c.call_tool("ll", "ping")
            assert [t.name for t in c.list_tools("ll")] == ["ping", "pong"]
            assert time.monotonic() - ready < 10, "too slow to tell (not a failure)"
            assert len(listed) == 2  # fresh for 10 s: not listed again

            def listed_again() -> bool:
                c.call_tool("ll", "ping")
                return len(listed) > 2

            wait_until(listed_again, timeout=15, every=0.5, what="a new listing")


def test_an_http_tool_result_has_the_members_the_server_sent() -> None:
    """A handshake-era Streamable HTTP server (the SDK's low-level
    ``Server``) answers ``{"content": [...], "isError": false}``: the caller
    gets those members, and no ``resultType`` (a member of 2026-07-28 only,
    which the SDK's model has by default)."""
    with _base() as base, contextlib.ExitStack() as stack:
        url = stack.enter_context(
            serve_asgi(lambda _: _lowlevel_app([[_tool("ping", read_only_hint=True)]]))
        )
        config = daemon_config(
            base,
            servers=[
                http_spec("ll", f"{url}/mcp", "streamable_http", protocol="legacy")
            ],
        )
        daemon = stack.enter_context(DaemonHarness.running(config))
        daemon.wait_ready("ll")
        with daemon.client() as c:
            assert c.server_status("ll")[0].protocol_version == "2025-11-25"
            raw = c.call_tool("ll", "ping", raw=True)
        result = msgspec.json.decode(raw)
        content = [{"type": "text", "text": "ping v1 ran"}]
        assert result == {"content": content, "isError": False}
