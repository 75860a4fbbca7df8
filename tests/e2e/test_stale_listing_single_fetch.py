"""Calls that arrive together once a push-less Streamable HTTP server's
listing went stale (``ToolCache.stale_at``) share one fetch of it
(``Upstream._fresh_view``). Each used to fetch ``tools/list`` itself, so N
concurrent calls cost the server N listings (times its pages) every
``max(ttlMs, 5 s)`` (found by a review)."""

from __future__ import annotations

import threading
import time
from typing import Any

import anyio
import mcp_types as types

from memorizzd.upstream.tools import LISTING_FRESH_MIN_S
from tests.harness import (
    DaemonHarness,
    daemon_config,
    http_spec,
    rmtree,
    serve_asgi,
    short_tempdir,
)


def test_concurrent_calls_past_staleness_share_one_listing() -> None:
    listed: list[float] = []

    def app(_: Any) -> Any:
        from mcp.server.lowlevel import Server

        async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
            listed.append(time.monotonic())
            await anyio.sleep(0.3)  # a listing takes a round trip or two
            tool = types.Tool(
                name="t",
                description="t",
                input_schema={"type": "object"},
                annotations=types.ToolAnnotations(read_only_hint=True),
            )
            return types.ListToolsResult(tools=[tool])

        async def call_tool(ctx: Any, params: Any) -> types.CallToolResult:
            return types.CallToolResult(content=[types.TextContent(text="ok")])

        server = Server(
            "ll", version="1", on_list_tools=list_tools, on_call_tool=call_tool
        )
        return server.streamable_http_app()

    base = short_tempdir("mz-herd-")
    try:
        with serve_asgi(app) as url:
            spec = http_spec("ll", f"{url}/mcp", "streamable_http")
            with DaemonHarness.running(daemon_config(base, servers=[spec])) as d:
                d.wait_ready("ll")
                threading.Event().wait(LISTING_FRESH_MIN_S + 0.5)
                before = len(listed)

                def call() -> None:
                    with d.client() as c:
                        c.call_tool("ll", "t")

                threads = [threading.Thread(target=call) for _ in range(20)]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join()
                assert len(listed) - before <= 2, len(listed) - before
    finally:
        rmtree(base)
