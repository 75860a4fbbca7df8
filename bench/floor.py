"""The floor: the same echo call made in-process on a warm MCP SDK session.

The session lives on a uvloop event loop in a background thread (an anyio
blocking portal), as the daemon's sessions live on uvloop, so that blocks of
floor calls can alternate with blocks of socket calls made from the main thread.
Every sample is timed inside the event loop: the portal hop is not counted.

Calls go out the way the daemon's SDK sessions (its HTTP servers) send them
(``memorizzd.upstream.session.SdkConnection.call_tool``): a fresh
``CallToolRequest`` per call through ``client.session.send_request``, with a
read timeout, no output-schema validation and no implicit ``tools/list``. The
daemon speaks to stdio servers without the SDK (``upstream/jsonrpc.py``); this
floor stays the in-process SDK client that an agent would otherwise use.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final

import anyio
import anyio.from_thread
import mcp_types as types
from mcp import Client, StdioServerParameters

from bench.harness import ECHO_SERVER, TEXT

TIMEOUT_S: Final = 60.0


async def _call(client: Client) -> None:
    request = types.CallToolRequest(
        params=types.CallToolRequestParams(name="echo", arguments={"text": TEXT})
    )
    result = await client.session.send_request(
        request, types.CallToolResult, request_read_timeout_seconds=TIMEOUT_S
    )
    content = result.content
    if result.is_error or not content or getattr(content[0], "text", None) != TEXT:
        raise RuntimeError(f"unexpected echo result: {result!r}")


async def _sequential(client: Client, n: int) -> list[int]:
    samples: list[int] = []
    for _ in range(n):
        started = time.perf_counter_ns()
        await _call(client)
        samples.append(time.perf_counter_ns() - started)
    return samples


async def _concurrent(client: Client, calls: int, workers: int) -> int:
    """``workers`` tasks, each with one call outstanding, ``calls`` in all; wall ns."""
    per_worker = calls // workers

    async def worker() -> None:
        for _ in range(per_worker):
            await _call(client)

    started = time.perf_counter_ns()
    async with anyio.create_task_group() as tg:
        for _ in range(workers):
            tg.start_soon(worker)
    return time.perf_counter_ns() - started


class Floor:
    def __init__(self, portal: anyio.from_thread.BlockingPortal, client: Client):
        self._portal = portal
        self._client = client
        self.protocol_version = client.protocol_version

    def sequential(self, n: int) -> list[int]:
        """``n`` sequential calls; the latency of each in ns."""
        return self._portal.call(_sequential, self._client, n)

    def throughput(self, calls: int, workers: int) -> float:
        """Calls per second with ``workers`` calls in flight on the one session."""
        per_worker = calls // workers
        wall_ns = self._portal.call(_concurrent, self._client, calls, workers)
        return per_worker * workers / (wall_ns / 1e9)


@contextmanager
def floor_session() -> Iterator[Floor]:
    """A warm SDK session to a fresh echo server (auto mode, as the daemon connects)."""
    params = StdioServerParameters(command=sys.executable, args=[ECHO_SERVER])
    with anyio.from_thread.start_blocking_portal(
        "asyncio", {"use_uvloop": True}, name="bench-floor"
    ) as portal:
        client = Client(params, read_timeout_seconds=TIMEOUT_S, cache=None)
        with portal.wrap_async_context_manager(client) as entered:
            yield Floor(portal, entered)


COLD_DIRECT: Final = """
import sys
import anyio
from mcp import Client, StdioServerParameters

async def main() -> None:
    params = StdioServerParameters(command=sys.executable, args=[sys.argv[1]])
    async with Client(params) as client:
        result = await client.call_tool("echo", {"text": sys.argv[2]})
    assert result.content[0].text == sys.argv[2], result

anyio.run(main)
"""
"""(c): what a thin client without the daemon does: start, import mcp, spawn the
server, initialize (auto mode), one ``call_tool`` (the SDK's public call, which
also lists tools once), close, exit. argv: server script, text."""

COLD_VIA_DAEMON: Final = """
import sys
from memorizz.client import Client

with Client(sys.argv[1]) as client:
    result = client.call_tool("echo", "echo", {"text": sys.argv[2]})
assert result.content[0]["text"] == sys.argv[2], result
"""
"""Context for (c): a thin client that uses the daemon (start, import memorizz,
one call over the socket, exit). argv: socket path, text."""
