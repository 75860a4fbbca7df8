"""Upstream MCP servers: the SDK adapter, transports, one actor per server, the pool."""
