"""A real MCP server (SDK 2.3 MCPServer) whose tools ask their client the
2026-07-28 way (SEP-2322): an input-required result (``resultType``
``input_required``, ``inputRequests``, ``requestState``), then the client's
retry with ``inputResponses`` and the state echoed.

    python tests/modern_asking_server.py stdio

Served over Streamable HTTP in-process with ``mcp.streamable_http_app()``.
The daemon must speak 2026-07-28 to it (``protocol = "2026-07-28"``).

* ``ask_name()``: a form elicitation of ``name``; "hello NAME", or the action;
* ``sample(prompt)``: a ``sampling/createMessage``; "MODEL: TEXT";
* ``ask_twice()``: two rounds (a name, then a colour; the name rides the
  ``requestState``); "NAME likes COLOUR";
* ``ask_forever()``: asks again on every round (the rounds must be bounded);
* ``capabilities()``: the client capabilities its request declared, as JSON.
"""

from __future__ import annotations

import sys

import mcp_types as types
import msgspec
from mcp.server.mcpserver import Context, MCPServer

mcp = MCPServer("memorizz-modern-asking-server", version="0.1", log_level="WARNING")


def _form(message: str, field: str) -> types.ElicitRequest:
    return types.ElicitRequest(
        params=types.ElicitRequestFormParams(
            message=message,
            requested_schema={
                "type": "object",
                "properties": {field: {"type": "string"}},
                "required": [field],
            },
        )
    )


def _given(ctx: Context, key: str) -> types.ElicitResult | None:
    answer = (ctx.input_responses or {}).get(key)
    return answer if isinstance(answer, types.ElicitResult) else None


@mcp.tool()
async def ask_name(ctx: Context) -> str | types.InputRequiredResult:
    """Ask the user's name (form elicitation, 2026-07-28)."""
    answer = _given(ctx, "name")
    if answer is None:
        return types.InputRequiredResult(
            input_requests={"name": _form("What is your name?", "name")}
        )
    if answer.action == "accept" and answer.content:
        return f"hello {answer.content.get('name')}"
    return answer.action


@mcp.tool()
async def sample(prompt: str, ctx: Context) -> str | types.InputRequiredResult:
    """Ask the client's model (sampling, 2026-07-28)."""
    answer = (ctx.input_responses or {}).get("model")
    if not isinstance(answer, types.CreateMessageResult):
        message = types.SamplingMessage(
            role="user", content=types.TextContent(text=prompt)
        )
        request = types.CreateMessageRequest(
            params=types.CreateMessageRequestParams(messages=[message], max_tokens=64)
        )
        return types.InputRequiredResult(input_requests={"model": request})
    content = answer.content
    text = content.text if isinstance(content, types.TextContent) else content.type
    return f"{answer.model}: {text}"


@mcp.tool()
async def ask_twice(ctx: Context) -> str | types.InputRequiredResult:
    """Two rounds: the name, then the colour (the name kept in requestState)."""
    name = _given(ctx, "name")
    if ctx.request_state is None:
        if name is None:
            return types.InputRequiredResult(
                input_requests={"name": _form("What is your name?", "name")}
            )
        who = str((name.content or {}).get("name"))
        return types.InputRequiredResult(
            input_requests={"colour": _form(f"{who}, your colour?", "colour")},
            request_state=who,
        )
    colour = _given(ctx, "colour")
    said = None if colour is None else (colour.content or {}).get("colour")
    return f"{ctx.request_state} likes {said}"


@mcp.tool()
async def ask_forever(ctx: Context) -> types.InputRequiredResult:
    """Ask the name on every round, whatever the answer."""
    return types.InputRequiredResult(
        input_requests={"name": _form("What is your name?", "name")},
        request_state=str(len(ctx.request_state or "") + 1),
    )


@mcp.tool()
async def capabilities(ctx: Context) -> str:
    """The client capabilities this request declared (``_meta``), as JSON."""
    meta = dict(ctx.request_context.meta or {})
    declared = meta.get("io.modelcontextprotocol/clientCapabilities")
    return msgspec.json.encode(declared).decode()


if __name__ == "__main__":
    if (sys.argv[1] if len(sys.argv) > 1 else "stdio") == "stdio":
        mcp.run("stdio")
