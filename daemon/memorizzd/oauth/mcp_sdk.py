"""The MCP SDK, as OAuth uses it: the one module in ``oauth`` that imports ``mcp``.

The daemon runs its own OAuth flows (discovery, registration, token, refresh,
all through ``memorizzd.egress``), but it keeps the SDK's pydantic models of
the metadata documents (RFC 8414, RFC 9728, RFC 7591, the token response) and
its helpers that build the discovery URLs and compare issuers and resources,
so that both sides of a login agree on the same parsing. They come through
here, and only here; the MCP sessions use the SDK through
``memorizzd.upstream.mcp_sdk`` (a test checks both: tests/test_layers.py).
"""

from __future__ import annotations

from mcp.client.auth.utils import (
    build_oauth_authorization_server_metadata_discovery_urls,
    build_protected_resource_metadata_discovery_urls,
    get_client_metadata_scopes,
    issuers_match,
    union_scopes,
)
from mcp.shared.auth import (
    OAuthClientInformationFull,
    OAuthClientMetadata,
    OAuthMetadata,
    OAuthToken,
    ProtectedResourceMetadata,
)
from mcp.shared.auth_utils import check_resource_allowed, resource_url_from_server_url

__all__ = [
    "OAuthClientInformationFull",
    "OAuthClientMetadata",
    "OAuthMetadata",
    "OAuthToken",
    "ProtectedResourceMetadata",
    "build_oauth_authorization_server_metadata_discovery_urls",
    "build_protected_resource_metadata_discovery_urls",
    "check_resource_allowed",
    "get_client_metadata_scopes",
    "issuers_match",
    "resource_url_from_server_url",
    "union_scopes",
]
