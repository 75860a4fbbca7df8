"""A real MCP test server (SDK 2.3 MCPServer), served over stdio, Streamable HTTP or SSE.

    python tests/mcp_server.py stdio
    python tests/mcp_server.py http PORT      # Streamable HTTP at /mcp
    python tests/mcp_server.py sse PORT       # legacy SSE at /sse
    python tests/mcp_server.py stdio-id-last  # stdio, each message's id written last

The id-last mode writes messages as the TypeScript SDK does (``{"result":...,
"jsonrpc":"2.0","id":3}``, see :func:`id_last`); in it ``request_back`` writes a
server-to-client request, reusing the call's id, straight onto the wire.

Tools cover the daemon's paths: echo/add (happy), fail (isError), slow (deadline),
chatty (progress notifications until it answers), huge (size cap), crash (dies
mid-call), spawn_child (leaves a grandchild);
record (destructive: appends its tag to $CALL_LOG, counting executions) and
evolving/evolve (evolve changes evolving's inputSchema and announces it);
delete_all_memories, search_memories, add_memory, annotated_read and
annotated_destroy (risk classes from the catalog and from annotations).

``$START_DELAY_S``: it waits that long before it reads anything (a server slow
to start).
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from typing import IO, cast

import anyio
import mcp_types
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.prompts import Prompt
from mcp_types import ToolAnnotations

mcp = MCPServer(
    "memorizz-test-server",
    version="1.2.3",
    log_level="WARNING",
    instructions=os.environ.get("SERVER_INSTRUCTIONS"),  # what it tells its clients
)

if start_log := os.environ.get("START_LOG"):  # one line per process start
    with open(start_log, "a", encoding="utf-8") as f:
        f.write(f"{os.getpid()}\n")


@mcp.tool()
def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


@mcp.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@mcp.tool()
def fail(reason: str = "boom") -> str:
    """Always fails with isError."""
    raise ToolError(reason)


@mcp.tool()
async def slow(seconds: float) -> str:
    """Sleep, then answer."""
    await anyio.sleep(seconds)
    return f"slept {seconds}"


@mcp.tool()
async def change_prompts(ctx: Context) -> str:
    """Add a prompt and announce prompts/list_changed."""
    count = len(await mcp.list_prompts())
    mcp.add_prompt(Prompt.from_function(lambda: "new", name=f"dyn_prompt_{count}"))
    if ctx.protocol_version and ctx.protocol_version >= "2026":
        await ctx.notify_prompts_changed()
    else:
        await ctx.session.send_prompt_list_changed()
    return "ok"


@mcp.tool()
async def logged(text: str, ctx: Context) -> str:
    """Log ``text`` at info (notifications/message), then answer."""
    await ctx.info(text)
    return "logged"


@mcp.tool()
async def progressing(steps: int, ctx: Context) -> str:
    """Report progress ``steps`` times under the caller's progressToken."""
    for step in range(1, steps + 1):
        await ctx.report_progress(step, steps, message=f"step {step}")
        await anyio.sleep(0.01)
    return f"done in {steps} steps"


@mcp.tool()
async def chatty(seconds: float, ctx: Context) -> str:
    """Send a progress notification (token: this request's id) every 20 ms
    for ``seconds``, then answer: progress must not extend a deadline."""
    request_id = ctx.request_context.request_id
    steps = max(1, int(seconds / 0.02))
    for step in range(steps):
        params = mcp_types.ProgressNotificationParams(
            progress_token=request_id, progress=step, total=steps
        )
        await ctx.session.send_notification(
            mcp_types.ProgressNotification(params=params), request_id
        )
        await anyio.sleep(0.02)
    return f"chatted {steps} times"


@mcp.tool()
def huge(n_bytes: int) -> str:
    """Return n_bytes characters."""
    return "x" * n_bytes


@mcp.tool()
def crash() -> str:
    """Kill the server process mid-call."""
    os._exit(3)


@mcp.tool()
async def gate(path: str) -> str:
    """Answer once the file ``path`` exists (a call a test holds in flight)."""
    while not await anyio.Path(path).exists():  # noqa: ASYNC110 - a test's file
        await anyio.sleep(0.02)
    return "opened"


@mcp.tool()
def pid() -> int:
    """The server's process id."""
    return os.getpid()


@mcp.tool()
def spawn_child() -> int:
    """Start a long-lived grandchild in our process group; return its pid."""
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return child.pid


@mcp.tool()
def env(name: str) -> str:
    """The value of an environment variable in the server, or '<unset>'."""
    return os.environ.get(name, "<unset>")


@mcp.tool()
def shout(text: str) -> str:
    """Write a line to stderr and return."""
    print(f"shouting: {text}", file=sys.stderr, flush=True)
    return text.upper()


@mcp.tool()
async def change_tools(ctx: Context) -> str:
    """Add a tool and announce tools/list_changed."""
    mcp.add_tool(lambda: "new", name=f"dyn_{len(await mcp.list_tools())}")
    if ctx.protocol_version and ctx.protocol_version >= "2026":
        await ctx.notify_tools_changed()
    else:
        await ctx.session.send_tool_list_changed()
    return "ok"


@mcp.tool()
def end_listens() -> str:
    """End every ``subscriptions/listen`` stream gracefully (2026-07-28), as a
    server that restarts its event bus does: its clients must listen again."""
    entry = mcp._lowlevel_server._request_handlers["subscriptions/listen"]
    entry.handler.close()
    return "ended"


@mcp.tool(annotations=ToolAnnotations(read_only_hint=True))
async def watched(seconds: float, tag: str) -> str:
    """Read-only: log start:TAG to $CALL_LOG, sleep, log done:TAG (or cancelled:TAG)."""
    _log_call(f"start:{tag}")
    try:
        await anyio.sleep(seconds)
    except anyio.get_cancelled_exc_class():
        _log_call(f"cancelled:{tag}")
        raise
    _log_call(f"done:{tag}")
    return tag


@mcp.tool(annotations=ToolAnnotations(destructive_hint=True))
async def slow_record(seconds: float, tag: str) -> str:
    """Destructive: sleep, then log TAG to $CALL_LOG (or cancelled:TAG)."""
    try:
        await anyio.sleep(seconds)
    except anyio.get_cancelled_exc_class():
        _log_call(f"cancelled:{tag}")
        raise
    _log_call(tag)
    return tag


def _log_call(line: str) -> None:
    with open(os.environ["CALL_LOG"], "a", encoding="utf-8") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


@mcp.tool(annotations=ToolAnnotations(destructive_hint=True))
def record(tag: str) -> str:
    """Destructive by annotation: append the tag to $CALL_LOG (one line per run)."""
    with open(os.environ["CALL_LOG"], "a", encoding="utf-8") as f:
        f.write(f"{tag}\n")
        f.flush()
        os.fsync(f.fileno())
    return f"recorded {tag}"


@mcp.tool(annotations=ToolAnnotations(destructive_hint=True))
def evolving(text: str) -> str:
    """Destructive; ``evolve`` replaces it with a different inputSchema."""
    return text


@mcp.tool()
async def evolve(ctx: Context) -> str:
    """Give ``evolving`` a new inputSchema and announce tools/list_changed."""
    mcp.remove_tool("evolving")

    def evolved(text: str, force: bool = False) -> str:
        return text

    mcp.add_tool(
        evolved,
        name="evolving",
        annotations=ToolAnnotations(destructive_hint=True),
    )
    if ctx.protocol_version and ctx.protocol_version >= "2026":
        await ctx.notify_tools_changed()
    else:
        await ctx.session.send_tool_list_changed()
    return "ok"


# Tools for the policy tests (tests/daemon/test_policy.py): names from the risk catalog
# and MCP annotations. They only answer; nothing is stored or deleted.


@mcp.tool(annotations=ToolAnnotations(read_only_hint=True))
def delete_all_memories() -> str:
    """A catalog-destructive name (Mem0) that claims to be read-only."""
    return "nothing deleted"


@mcp.tool()
def search_memories(query: str) -> str:
    """A catalog-read name (Mem0), no annotations."""
    return f"no memories about {query}"


@mcp.tool()
def add_memory(text: str) -> str:
    """Write for Mem0 and Zep, destructive for Supermemory: ambiguous here."""
    return "not stored"


@mcp.tool(annotations=ToolAnnotations(read_only_hint=True))
def annotated_read() -> str:
    """readOnlyHint: true."""
    return "read"


@mcp.tool(annotations=ToolAnnotations(destructive_hint=True))
def annotated_destroy() -> str:
    """destructiveHint: true."""
    return "destroyed nothing"


@mcp.resource("test://static", mime_type="text/plain")
def static_resource() -> str:
    return "static content"


@mcp.resource("test://crash", mime_type="text/plain")
def crash_resource() -> str:
    os._exit(4)


@mcp.resource("test://items/{item_id}", mime_type="application/json")
def item(item_id: str) -> str:
    return f'{{"id": "{item_id}"}}'


@mcp.resource("test://huge/{n_bytes}", mime_type="text/plain")
def huge_resource(n_bytes: str) -> str:
    return "y" * int(n_bytes)


def id_last(message: bytes) -> bytes:
    """A JSON-RPC message as the TypeScript SDK writes it: ``jsonrpc`` and ``id`` last."""
    import msgspec

    fields = msgspec.json.decode(message)
    if not isinstance(fields, dict):
        return message
    tail = {k: fields.pop(k) for k in ("jsonrpc", "id") if k in fields}
    return msgspec.json.encode(fields | tail)


class _IdLastStdout:
    """A text stdout for ``stdio_server`` that writes each line through :func:`id_last`."""

    def __init__(self) -> None:
        import threading

        self._lock = threading.Lock()
        self._pending = ""

    def write(self, text: str) -> int:
        with self._lock:
            self._pending += text
            *lines, self._pending = self._pending.split("\n")
            for line in lines:
                self.raw(id_last(line.encode()))
        return len(text)

    def raw(self, line: bytes) -> None:
        sys.stdout.buffer.write(line + b"\n")
        sys.stdout.buffer.flush()

    def flush(self) -> None:
        sys.stdout.buffer.flush()


_id_last_stdout: _IdLastStdout | None = None


@mcp.tool()
def request_back(n_bytes: int, ctx: Context) -> str:
    """(stdio-id-last) Write a server-to-client request of about n_bytes that
    reuses this call's id (written id first), then answer "answered"."""
    import msgspec

    if _id_last_stdout is None:
        raise ToolError("only in stdio-id-last mode")
    request_id: int | str = ctx.request_id
    if isinstance(request_id, str) and request_id.isdigit():
        request_id = int(request_id)
    request: dict[str, object] = {"jsonrpc": "2.0", "id": request_id}
    request |= {"method": "roots/list", "params": {"_meta": {"pad": "r" * n_bytes}}}
    _id_last_stdout.raw(msgspec.json.encode(request))
    return "answered"


async def _serve_stdio_id_last() -> None:
    global _id_last_stdout
    from mcp.server.stdio import stdio_server

    _id_last_stdout = _IdLastStdout()
    stdout = anyio.wrap_file(cast("IO[str]", _id_last_stdout))  # write and flush
    async with stdio_server(stdout=stdout) as (read, write):
        lowlevel = mcp._lowlevel_server
        await lowlevel.run(read, write, lowlevel.create_initialization_options())


@mcp.prompt()
def greet(name: str) -> str:
    """Greet someone."""
    return f"Say hello to {name}"


if __name__ == "__main__":
    # The SDK's module graph lives until exit: keep it out of the collector,
    # above all out of the final collection at exit, which took ~2 s and made
    # every stop of this server wait out the daemon's stdin-close grace.
    gc.freeze()
    if delay := os.environ.get("START_DELAY_S"):  # a server slow to start
        anyio.run(anyio.sleep, float(delay))
    mode = sys.argv[1] if len(sys.argv) > 1 else "stdio"
    if mode == "stdio":
        mcp.run("stdio")
    elif mode == "stdio-id-last":
        anyio.run(_serve_stdio_id_last)
    elif mode == "http":
        mcp.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    elif mode == "sse":
        mcp.run("sse", host="127.0.0.1", port=int(sys.argv[2]))
