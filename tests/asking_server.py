"""A real MCP server (SDK 2.3 MCPServer) whose tools ask their client: elicitation
(form and URL) and sampling (with and without tools).

    python tests/asking_server.py stdio

Served over Streamable HTTP in-process with ``mcp.streamable_http_app()``.
The daemon speaks the handshake era to it (``protocol = "legacy"``): the
2026-07-28 way of asking is an input-required result.

* ``ask_name()``: form elicitation of ``name``; "hello NAME", or what the
  client did (``declined``, ``cancel``), or isError with the error it got;
* ``ask_url()``: URL elicitation; the client's action;
* ``sample(prompt)``: ``sampling/createMessage``; the model's text;
* ``sample_tools(prompt)``: the same with a tool offered (sampling with tools);
* ``gather_then_ask(n)``: waits until ``n`` calls of it are in flight, then
  elicits like ``ask_name`` (two calls at once: which caller would answer?);
* ``ask_tied(n)``: as ``gather_then_ask``, its elicitation naming the call by
  the progress token the call carries (``_meta.progressToken``).
"""

from __future__ import annotations

import sys
import warnings

import anyio
import mcp_types as types
from mcp.server.mcpserver import Context, MCPServer
from mcp.shared.exceptions import MCPDeprecationWarning
from pydantic import BaseModel

mcp = MCPServer("memorizz-asking-server", version="0.1", log_level="WARNING")


class Name(BaseModel):
    name: str


_arrived: dict[str, int] = {}
_together: dict[str, anyio.Event] = {}


async def _gather(group: str, n: int) -> None:
    """Return once ``n`` calls of ``group`` are in flight."""
    event = _together.setdefault(group, anyio.Event())
    _arrived[group] = _arrived.get(group, 0) + 1
    if _arrived[group] >= n:
        event.set()
        _arrived[group] = 0
        del _together[group]
    await event.wait()


def _said(result: types.ElicitResult) -> str:
    if result.action == "accept" and result.content:
        return f"hello {result.content.get('name')}"
    return result.action


@mcp.tool()
async def ask_name(ctx: Context) -> str:
    """Ask the user's name (form elicitation)."""
    result = await ctx.elicit("What is your name?", Name)
    if result.action == "accept":
        return f"hello {result.data.name}"
    return result.action


@mcp.tool()
async def ask_url(ctx: Context) -> str:
    """Send the user to a URL (URL elicitation)."""
    result = await ctx.elicit_url(
        "Log in at the example page", "https://example.invalid/login", "el-1"
    )
    return result.action


def _message(prompt: str) -> list[types.SamplingMessage]:
    return [types.SamplingMessage(role="user", content=types.TextContent(text=prompt))]


@mcp.tool()
async def sample(prompt: str, ctx: Context) -> str:
    """Ask the client's model (sampling/createMessage)."""
    with warnings.catch_warnings():  # the handshake era's way; still ours
        warnings.simplefilter("ignore", MCPDeprecationWarning)
        result = await ctx.session.create_message(
            _message(prompt), max_tokens=64, related_request_id=ctx.request_id
        )
    content = result.content
    return f"{result.model}: {content.text if content.type == 'text' else content.type}"


@mcp.tool()
async def sample_tools(prompt: str, ctx: Context) -> str:
    """Ask the client's model, offering it a tool (sampling with tools)."""
    tool = types.Tool(name="lookup", input_schema={"type": "object"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MCPDeprecationWarning)
        result = await ctx.session.create_message(
            _message(prompt),
            max_tokens=64,
            tools=[tool],
            related_request_id=ctx.request_id,
        )
    kinds = [item.type for item in result.content_as_list]
    return f"{result.model}: {','.join(kinds)}"


@mcp.tool()
async def gather_then_ask(n: int, ctx: Context) -> str:
    """Wait until n calls of this tool are in flight, then ask the name."""
    await _gather("plain", n)
    result = await ctx.elicit("What is your name?", Name)
    return f"hello {result.data.name}" if result.action == "accept" else result.action


@mcp.tool()
async def ask_tied(n: int, ctx: Context) -> str:
    """As gather_then_ask, the elicitation naming its call (progress token)."""
    await _gather("tied", n)
    meta = ctx.request_context.meta
    token = (meta or {}).get("progress_token")  # a TypedDict, snake_case
    request = types.ElicitRequest(
        params=types.ElicitRequestFormParams(
            message="What is your name?",
            requested_schema={
                "type": "object",
                "properties": {"name": {"type": "string"}},
                "required": ["name"],
            },
            _meta={"progressToken": token},
        )
    )
    result = await ctx.session.send_request(request, types.ElicitResult)
    return _said(result)


if __name__ == "__main__":
    if (sys.argv[1] if len(sys.argv) > 1 else "stdio") == "stdio":
        mcp.run("stdio")
