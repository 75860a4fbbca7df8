"""A low-level MCP server that declares only some capabilities, as most public
servers do (a TypeScript ``server-memory`` declares tools and nothing else).

    python tests/bare_server.py stdio tools      # tools only: no prompts, no resources
    python tests/bare_server.py stdio prompts    # prompts only: no tools, no resources

The SDK's ``MCPServer`` declares every capability; this one declares exactly
the handlers it has, and answers ``-32601`` to any other method.
"""

from __future__ import annotations

import gc
import sys
from typing import Any

import anyio
import mcp_types as types
from mcp.server import Server
from mcp.server.stdio import stdio_server


async def _list_tools(ctx: Any, params: types.PaginatedRequestParams | None) -> Any:
    schema = {"type": "object", "properties": {"text": {"type": "string"}}}
    return types.ListToolsResult(
        tools=[types.Tool(name="echo", description="Echo.", input_schema=schema)]
    )


async def _call_tool(ctx: Any, params: types.CallToolRequestParams) -> Any:
    text = str((params.arguments or {}).get("text", ""))
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)])


async def _list_prompts(ctx: Any, params: types.PaginatedRequestParams | None) -> Any:
    return types.ListPromptsResult(prompts=[types.Prompt(name="hello")])


def server(kind: str) -> Server[Any]:
    if kind == "tools":
        return Server("bare-tools", on_list_tools=_list_tools, on_call_tool=_call_tool)
    return Server("bare-prompts", on_list_prompts=_list_prompts)


async def _stdio(kind: str) -> None:
    app = server(kind)
    async with stdio_server() as (read, write):
        await app.run(read, write, app.create_initialization_options())


if __name__ == "__main__":
    gc.freeze()  # as tests/mcp_server.py: no 2 s final collection of the SDK at exit
    anyio.run(_stdio, sys.argv[2] if len(sys.argv) > 2 else "tools")
