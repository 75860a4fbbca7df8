"""A real MCP server (SDK 2.3 MCPServer) over stdio whose one tool ``meta``
answers with its request's ``params._meta`` as JSON text: what a client sent
the server besides the arguments (``python tests/meta_server.py``)."""

from __future__ import annotations

import msgspec
from mcp.server.mcpserver import Context, MCPServer

mcp = MCPServer("memorizz-meta-server", version="1.0.0", log_level="WARNING")


@mcp.tool()
async def meta(ctx: Context) -> str:
    """The request's ``_meta`` object, as JSON."""
    return msgspec.json.encode(dict(ctx.request_context.meta or {})).decode()


if __name__ == "__main__":
    mcp.run("stdio")
