"""memorizzd: the per-host MCP connection broker daemon."""

__version__ = "0.1.0"
