"""The daemon loads the MCP SDK's client side only (memorizzd/sdk_client_side.py).

Run in a fresh interpreter each, since the point is what a process loads.
The daemon's own tests over HTTP upstreams and OAuth (test_transports,
test_oauth*, ...) run the real ``memorizzd`` entry point, and so the SDK's
client side loaded this way."""

from __future__ import annotations

import subprocess
import sys

LOAD_THE_ADAPTERS = """
import json, sys
from memorizzd import sdk_client_side
installed = {install} and sdk_client_side.install()
import memorizzd.upstream.session, memorizzd.oauth.mcp_sdk
real = lambda m: getattr(sys.modules[m], "__file__", None) is not None
print(json.dumps({{
    "installed": installed,
    "server_side": sorted(m for m in sys.modules if m.startswith("mcp.server") and real(m)),
    "web": sorted(m for m in ("starlette", "uvicorn", "click") if m in sys.modules),
}}))
"""


def _loaded(install: bool) -> dict[str, object]:
    import msgspec

    out = subprocess.run(
        [sys.executable, "-c", LOAD_THE_ADAPTERS.format(install=install)],
        capture_output=True,
        check=True,
        timeout=60,
    )
    loaded: dict[str, object] = msgspec.json.decode(out.stdout.splitlines()[-1])
    return loaded


def test_the_daemons_sdk_adapters_load_no_server_side() -> None:
    loaded = _loaded(install=True)
    assert loaded == {"installed": True, "server_side": [], "web": []}


def test_without_it_the_sdk_brings_its_server_and_web_stack() -> None:
    """What it saves (and so that the test above can fail)."""
    loaded = _loaded(install=False)
    assert loaded["installed"] is False
    assert "mcp.server.lowlevel.server" in loaded["server_side"]  # type: ignore[operator]
    assert loaded["web"] == ["click", "starlette", "uvicorn"]


def test_what_reaches_for_the_server_side_is_refused_clearly() -> None:
    script = (
        "from memorizzd import sdk_client_side\n"
        "assert sdk_client_side.install()\n"
        "assert not sdk_client_side.install()  # once\n"
        "from mcp.server import Server\n"
        "from mcp.server.mcpserver import MCPServer\n"
        "assert not isinstance(object(), (Server, MCPServer))\n"
        "try:\n"
        "    Server()\n"
        "except sdk_client_side.ServerSideNotLoaded as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert "mcp.server.Server is part of the MCP SDK's server side" in out.stdout
