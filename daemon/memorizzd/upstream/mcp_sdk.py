"""The MCP SDK, as the upstream sessions use it: the one module in ``upstream``
that imports ``mcp`` and ``mcp_types``.

Every name the daemon takes from the SDK for talking to MCP servers comes
through here, so the SDK surface we depend on is one short list to check on an
SDK upgrade (``mcp>=2.3,<2.4``). Only the HTTP transports use it (stdio
servers are spoken to by ``jsonrpc.py``, without the SDK); ``session.py`` is
its one user, and loads only when an HTTP server is configured.
OAuth uses the SDK's metadata models through its own adapter,
``memorizzd.oauth.mcp_sdk``; nothing else in the daemon imports the SDK (a test
checks it: tests/test_layers.py).
"""

from __future__ import annotations

import mcp_types as types
from mcp.client.client import Client
from mcp.client.extension import ClientExtension, NotificationBinding
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from mcp.client.subscriptions import SubscriptionLost
from mcp.shared.dispatcher import CallOptions, ProgressFnT
from mcp.shared.exceptions import MCPError
from mcp_types.methods import validate_server_result

__all__ = [
    "CallOptions",
    "Client",
    "ClientExtension",
    "MCPError",
    "NotificationBinding",
    "ProgressFnT",
    "SubscriptionLost",
    "sse_client",
    "streamable_http_client",
    "types",
    "validate_server_result",
]
