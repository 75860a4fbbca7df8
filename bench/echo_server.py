"""The benchmark's upstream: a minimal MCP server with one trivial tool, over stdio.

python bench/echo_server.py
"""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer

mcp = MCPServer("memorizz-bench-echo", version="1.0", log_level="WARNING")


@mcp.tool()
def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


if __name__ == "__main__":
    mcp.run("stdio")
