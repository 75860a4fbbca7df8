"""A stand-in for a self-hosted ``@neo4j-labs/agent-memory/mcp`` stdio server
(the ``neo4j-memory-local`` preset): its 12 documented tool names, written
with the SDK, plus one tool the preset's allow-list (``only``) must hide.
What the tools do is not the point; each answers with its own name."""

from __future__ import annotations

import gc

from mcp.server.mcpserver import MCPServer

mcp = MCPServer("stand-in", log_level="WARNING")

DOCUMENTED = (
    "memory_create_conversation",
    "memory_add_messages",
    "memory_get_context",
    "memory_search_messages",
    "memory_search_entities",
    "memory_get_entity",
    "memory_add_entity",
    "memory_get_entity_history",
    "memory_record_step",
    "memory_record_tool_call",
    "memory_get_trace",
    "memory_explain_decision",
)
EXTRA = "memory_clear_all"
"""Not one of the 12: the allow-list keeps it from every caller."""


def _answering(name: str) -> None:
    def tool(query: str = "") -> str:
        return f"{name}: {query}"

    mcp.add_tool(tool, name=name)


for _name in (*DOCUMENTED, EXTRA):
    _answering(_name)


if __name__ == "__main__":
    gc.freeze()  # as tests/mcp_server.py: a quick exit
    mcp.run("stdio")
