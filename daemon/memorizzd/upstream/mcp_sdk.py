"""The MCP SDK, as the upstream sessions use it: the one module in ``upstream``
that imports ``mcp`` and ``mcp_types``.

Every name the daemon takes from the SDK for talking to MCP servers comes
through here, so the SDK surface we depend on is one short list to check on an
SDK upgrade (``mcp>=2.3,<2.4``). Two of them are private APIs of the SDK and
are pinned by that bound: ``TransportStreams`` (``mcp.client._transport``, the
streams our own stdio transport hands to ``ClientSession``) and the
``MCP_NAME_HEADER``/``encode_header_value`` pair of ``mcp.shared.inbound``.
OAuth uses the SDK's metadata models through its own adapter,
``memorizzd.oauth.mcp_sdk``; nothing else in the daemon imports the SDK (a test
checks it: tests/test_layers.py).
"""

from __future__ import annotations

import mcp_types as types
from mcp import Client
from mcp.client._transport import TransportStreams
from mcp.client.session import ClientSession
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.dispatcher import CallOptions
from mcp.shared.exceptions import MCPError
from mcp.shared.inbound import MCP_NAME_HEADER, encode_header_value
from mcp.shared.message import SessionMessage

__all__ = [
    "MCP_NAME_HEADER",
    "CallOptions",
    "Client",
    "ClientSession",
    "MCPError",
    "SessionMessage",
    "TransportStreams",
    "encode_header_value",
    "sse_client",
    "streamable_http_client",
    "types",
]
