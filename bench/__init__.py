"""Benchmarks of memorizzd against the bare MCP SDK."""
