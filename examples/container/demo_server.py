"""A tiny stdio MCP server for examples/container (run by memorizzd, in its
container, with the MCP SDK the daemon's image already has)."""

from mcp.server.mcpserver import MCPServer

mcp = MCPServer("demo")


@mcp.tool()
def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


if __name__ == "__main__":
    mcp.run("stdio")
