"""A real MCP test server (SDK 2.3 MCPServer), served over stdio, Streamable HTTP or SSE.

    python tests/mcp_server.py stdio
    python tests/mcp_server.py http PORT      # Streamable HTTP at /mcp
    python tests/mcp_server.py sse PORT       # legacy SSE at /sse

Tools cover the daemon's paths: echo/add (happy), fail (isError), slow (deadline),
chatty (progress notifications until it answers), huge (size cap), crash (dies
mid-call), spawn_child (leaves a grandchild);
record (destructive: appends its tag to $CALL_LOG, counting executions) and
evolving/evolve (evolve changes evolving's inputSchema and announces it);
delete_all_memories, search_memories, add_memory, annotated_read and
annotated_destroy (risk classes from the catalog and from annotations).
"""

from __future__ import annotations

import os
import subprocess
import sys

import anyio
import mcp_types
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations

mcp = MCPServer("memorizz-test-server", version="1.2.3", log_level="WARNING")

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


# Tools for the policy tests (tests/test_policy.py): names from the risk catalog
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


@mcp.prompt()
def greet(name: str) -> str:
    """Greet someone."""
    return f"Say hello to {name}"


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else "stdio"
    if mode == "stdio":
        mcp.run("stdio")
    elif mode == "http":
        mcp.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    elif mode == "sse":
        mcp.run("sse", host="127.0.0.1", port=int(sys.argv[2]))
