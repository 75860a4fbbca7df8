"""What the OAuth battery tests share (tests/daemon/test_oauth_battery_flows.py,
tests/daemon/test_oauth_login_bounds.py): an MCP server that is also its own
authorization server, at one public name of a fake world (tests/egress_world.py)
whose every dial lands on a loopback site of the test's; a name outside the
host allowlist routed to the same site (so that a request that escapes the
guard is seen, never sent anywhere else); and the metadata it publishes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import pytest

from memorizzd.egress import client as egress_client
from tests.egress_world import PUBLIC_NAME, PUBLIC_V4, TLS, FakeDNS, LoopbackDial, World

BASE: Final = f"https://{PUBLIC_NAME}"
MCP_URL: Final = f"{BASE}/mcp"
PRM_PATH: Final = "/.well-known/oauth-protected-resource/mcp"
AS_PATH: Final = "/.well-known/oauth-authorization-server"
OUTSIDE: Final = "login.elsewhere.test"
"""A public name outside the host allowlist (``*.example.test``)."""
OUTSIDE_V4: Final = "1.1.1.1"
ALLOWLIST: Final = ["*.example.test"]


def metadata(**fields: Any) -> dict[str, Any]:
    """RFC 8414 metadata of ``BASE``, ``fields`` over it (None: left out)."""
    doc = {
        "issuer": BASE,
        "authorization_endpoint": f"{BASE}/authorize",
        "token_endpoint": f"{BASE}/token",
        "revocation_endpoint": f"{BASE}/revoke",
        "response_types_supported": ["code"],
        "code_challenge_methods_supported": ["S256"],
    }
    doc.update(fields)
    return {k: v for k, v in doc.items() if v is not None}


def site_world(
    tls: TLS,
    port: int,
    monkeypatch: pytest.MonkeyPatch,
    names: Mapping[str, list[str]] | None = None,
) -> World:
    """The daemon's network for this test: ``PUBLIC_NAME`` and ``OUTSIDE`` (and
    ``names``) resolved by a fake DNS, both dialled to the site on ``port``."""
    dns = FakeDNS({PUBLIC_NAME: [PUBLIC_V4], OUTSIDE: [OUTSIDE_V4], **(names or {})})
    world = World(tls, dns, LoopbackDial())
    world.route(PUBLIC_V4, 443, port)
    world.route(OUTSIDE_V4, 443, port)  # the same server, if ever dialled
    monkeypatch.setattr(egress_client, "DEFAULT_NETWORK", world.network())
    return world
