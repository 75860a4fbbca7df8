"""MCP's reserved ``_meta`` keys, spelled once.

The daemon's upstream client (``memorizzd.upstream.jsonrpc``), its MCP face
(``memorizzd.face``, ``memorizzd.upstream.tasks``) and the HTTP bridge
(``memorizz.ctl.session``) read and write these on the wire. The 2026-07-28
ones stamp each request (the era without sessions) and a listen stream's
frames; ``RELATED_TASK`` is 2025-11-25's.

Standard library only.
"""

from __future__ import annotations

from typing import Final

PROTOCOL_VERSION: Final = "io.modelcontextprotocol/protocolVersion"
CLIENT_INFO: Final = "io.modelcontextprotocol/clientInfo"
CLIENT_CAPABILITIES: Final = "io.modelcontextprotocol/clientCapabilities"
SERVER_INFO: Final = "io.modelcontextprotocol/serverInfo"
LOG_LEVEL: Final = "io.modelcontextprotocol/logLevel"
"""A request's log level (2026-07-28: a server logs only to requests that ask)."""
SUBSCRIPTION_ID: Final = "io.modelcontextprotocol/subscriptionId"
"""A listen stream's frames carry its request's id under this key."""
RELATED_TASK: Final = "io.modelcontextprotocol/related-task"
"""A task's messages name it under this key (2025-11-25)."""
