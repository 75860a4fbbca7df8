"""(f) and (g): the MCP face, as an MCP client nobody here wrote sees it.

(f) The official Python SDK ``Client`` over ``stdio_client`` running the
installed ``memorizzctl --socket SOCKET mcp serve`` (the bridge) -> the
daemon's ``mcp.sock`` -> the daemon's warm echo server; against the same
SDK client over ``stdio_client`` spawning bench/echo_server.py directly. Both
sessions live on one uvloop event loop in a background thread (an anyio
blocking portal, as bench/floor.py's), so their blocks can alternate; every
sample is timed inside the event loop. Calls go out as the floor's do (a fresh
``CallToolRequest`` through ``client.session.send_request``: no implicit
``tools/list``, no output-schema validation), so the two differ only in the
path: bridge + daemon, or nothing.

(g) ``sessions``: raw Unix-socket connections to a face's ``mcp.sock``, each
one an MCP session (``initialize``, its reply read, then
``notifications/initialized``), held open until closed.

This module imports mcp: keep it out of benchmark worker processes.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final, TextIO

import anyio
import anyio.from_thread
import mcp_types as types
import msgspec
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

from bench.harness import ECHO_SERVER, TEXT

TIMEOUT_S: Final = 60.0
MEMORIZZCTL: Final = os.path.join(os.path.dirname(sys.executable), "memorizzctl")
"""The installed console script, as an MCP client's config names it."""
WARM_TOOL: Final = "echo"
"""The warm server of the benchmark's daemon, and its one tool."""


async def _call(client: Client, name: str) -> None:
    request = types.CallToolRequest(
        params=types.CallToolRequestParams(name=name, arguments={"text": TEXT})
    )
    result = await client.session.send_request(
        request, types.CallToolResult, request_read_timeout_seconds=TIMEOUT_S
    )
    content = result.content
    if result.is_error or not content or getattr(content[0], "text", None) != TEXT:
        raise RuntimeError(f"unexpected echo result through {name}: {result!r}")


async def _sequential(client: Client, name: str, n: int) -> list[int]:
    samples: list[int] = []
    for _ in range(n):
        started = time.perf_counter_ns()
        await _call(client, name)
        samples.append(time.perf_counter_ns() - started)
    return samples


async def _echo_tool(client: Client) -> str:
    """The name the session lists for the echo server's ``echo``: unchanged when
    it is the one server in scope, ``echo__echo`` through a face that shows
    more (the operator's face, default separator)."""
    names: list[str] = []
    cursor: str | None = None
    while True:
        listed = await client.list_tools(cursor=cursor, cache_mode="bypass")
        names += [tool.name for tool in listed.tools]
        cursor = listed.next_cursor
        if cursor is None:
            break
    for name in (WARM_TOOL, f"{WARM_TOOL}__{WARM_TOOL}"):
        if name in names:
            return name
    raise RuntimeError(f"no echo tool listed; the session lists {names!r}")


class Session:
    """One warm SDK session on the portal's loop, and the tool it calls."""

    def __init__(
        self, portal: anyio.from_thread.BlockingPortal, client: Client, tool: str
    ) -> None:
        self._portal = portal
        self._client = client
        self.tool = tool
        self.protocol_version = client.protocol_version

    def sequential(self, n: int) -> list[int]:
        """``n`` sequential calls; the latency of each in ns."""
        return self._portal.call(_sequential, self._client, self.tool, n)


class Pair(msgspec.Struct, kw_only=True, frozen=True):
    face: Session
    direct: Session
    held: Session | None = None
    """Through the face to an upstream held at the handshake era (context)."""


def _children() -> set[int]:
    me = str(os.getpid())
    found: set[int] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                ppid = f.read().rsplit(b")", 1)[1].split()[1]
        except OSError:
            continue
        if ppid.decode() == me:
            found.add(int(entry))
    return found


@contextmanager
def face_and_direct(
    api_socket: str, mode: str, errlog: TextIO, held: str | None = None
) -> Iterator[tuple[Pair, int | None, int | None]]:
    """Two warm SDK sessions in ``mode`` ("legacy" or "auto"): through the
    bridge to the face beside ``api_socket``, and straight to a fresh echo
    server. Yields them with the pids of the bridge and of that echo server
    (children of this process; None if not found). ``held``: a third, through
    the bridge scoped to that server (``mcp serve --server``), in ``Pair.held``."""
    through_face = StdioServerParameters(
        command=MEMORIZZCTL, args=["--socket", api_socket, "mcp", "serve"]
    )
    direct = StdioServerParameters(command=sys.executable, args=[ECHO_SERVER])
    scoped = StdioServerParameters(
        command=MEMORIZZCTL,
        args=["--socket", api_socket, "mcp", "serve", "--server", held or ""],
    )
    before = _children()
    with (
        anyio.from_thread.start_blocking_portal(
            "asyncio", {"use_uvloop": True}, name=f"bench-face-{mode}"
        ) as portal,
        contextlib.ExitStack() as stack,
    ):
        sessions: list[Session] = []
        pids: list[int | None] = []
        for params in (through_face, direct, scoped)[: 3 if held else 2]:
            client = Client(
                stdio_client(params, errlog=errlog),
                mode=mode,
                read_timeout_seconds=TIMEOUT_S,
                cache=None,
            )
            entered = stack.enter_context(portal.wrap_async_context_manager(client))
            tool = portal.call(_echo_tool, entered)
            sessions.append(Session(portal, entered, tool))
            new = _children() - before
            before |= new
            pids.append(min(new) if len(new) == 1 else None)
        pair = Pair(
            face=sessions[0],
            direct=sessions[1],
            held=sessions[2] if held else None,
        )
        yield pair, pids[0], pids[1]


# --- (g) ----------------------------------------------------------------------------

INITIALIZE: Final = msgspec.json.encode(
    {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "memorizz-bench", "version": "1.0"},
        },
    }
)
INITIALIZED: Final = msgspec.json.encode(
    {"jsonrpc": "2.0", "method": "notifications/initialized"}
)


def _read_line(conn: socket.socket) -> bytes:
    buffer = b""
    while not buffer.endswith(b"\n"):
        chunk = conn.recv(1 << 16)
        if not chunk:
            raise RuntimeError(f"the face closed a session: {buffer[:200]!r}")
        buffer += chunk
    return buffer


def open_session(path: str) -> socket.socket:
    """One MCP session on the face at ``path``: initialized, held open."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.settimeout(TIMEOUT_S)
        conn.connect(path)
        conn.sendall(INITIALIZE + b"\n")
        reply = msgspec.json.decode(_read_line(conn))
        if not isinstance(reply, dict) or "result" not in reply:
            raise RuntimeError(f"initialize refused by the face: {reply!r}")
        conn.sendall(INITIALIZED + b"\n")
    except BaseException:
        conn.close()
        raise
    return conn
