"""The MCP face, used by the official TypeScript SDK client (issue 11).

A client nobody here wrote: npm ``@modelcontextprotocol/sdk`` (tests/node/,
installed by scripts/bootstrap from its lockfile), whose ``Client`` and
``StdioClientTransport`` start the real bridge (``memorizzctl --socket
API_SOCKET mcp serve``) in front of the face; behind it, the daemon's warm
sessions to two real stdio servers. tests/node/face_client.mjs lists and calls
tools, gets a prompt, reads a resource and prints one JSON line of what it saw.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest

from memorizzd.config import Profile
from memorizzd.listeners import agent_socket_path, face_socket_path
from tests.harness import (
    NODE_DIR,
    DaemonHarness,
    daemon_config,
    node_client,
    short_tempdir,
    stdio_spec,
)
from tests.process import MEMORIZZCTL

FACE_CLIENT = str(NODE_DIR / "face_client.mjs")
RUN_TIMEOUT_S = 60.0
"""A bound on a hung client only, far above its usual run (well under 1 s)."""


@pytest.fixture(scope="module")
def faced() -> Iterator[DaemonHarness]:
    base = short_tempdir()
    config = daemon_config(
        base,
        servers=[stdio_spec("alpha"), stdio_spec("beta")],
        profiles=[
            Profile(
                name="bot",
                servers=["beta"],
                uids=[os.getuid()],
            )
        ],
    )
    with DaemonHarness.running(config) as harness:
        harness.wait_ready("alpha")
        harness.wait_ready("beta")
        yield harness


class Called(msgspec.Struct, frozen=True, rename="camel"):
    text: list[str]
    is_error: bool


class ServerInfo(msgspec.Struct, frozen=True):
    name: str
    version: str


class Failure(msgspec.Struct, frozen=True):
    message: str
    code: int | None = None


class Seen(msgspec.Struct, frozen=True, rename="camel"):
    """What face_client.mjs saw (its one JSON line)."""

    protocol_version: str | None = None
    server_info: ServerInfo | None = None
    tools: list[str] = []
    call: Called | None = None
    prompts: list[str] = []
    prompt: list[str] | None = None
    resources: list[str] = []
    read: list[str | None] | None = None
    error: Failure | None = None


def typescript_client(api_socket: str, **plan: Any) -> Seen:
    """Run tests/node/face_client.mjs against the face beside ``api_socket``."""
    plan = {"memorizzctl": MEMORIZZCTL, "socket": api_socket, **plan}
    return msgspec.convert(node_client(FACE_CLIENT, plan, timeout=RUN_TIMEOUT_S), Seen)


def test_the_typescript_sdk_client_uses_every_server_through_the_bridge(
    faced: DaemonHarness,
) -> None:
    seen = typescript_client(
        faced.socket,
        tool="beta__echo",
        arguments={"text": "through the face, from TypeScript"},
        prompt="alpha__greet",
        promptArguments={"name": "Ada"},
        resource="test://static",
    )
    # the TypeScript SDK's newest version, which the face offers
    assert seen.protocol_version == "2025-11-25"
    assert seen.server_info is not None
    assert seen.server_info.name == "memorizzd"
    assert {"alpha__echo", "beta__echo", "alpha__add", "beta__add"} <= set(seen.tools)
    assert all("__" in name for name in seen.tools)
    assert seen.call == Called(["through the face, from TypeScript"], is_error=False)
    assert {"alpha__greet", "beta__greet"} <= set(seen.prompts)
    assert seen.prompt == ["Say hello to Ada"]
    assert "test://static" in seen.resources
    assert seen.read == ["static content"]
    # the newest audit record is the call (prompts and reads are not audited),
    # the same record as a socket tools/call, on the face's socket
    with faced.client() as c:
        record = c.audit(limit=1).records[0]
    assert (record.action, record.server, record.tool) == ("tools/call", "beta", "echo")
    assert record.outcome == "ok"
    assert record.caller_socket == face_socket_path(faced.socket)


def test_the_typescript_sdk_client_on_an_agents_face_sees_its_server_only(
    faced: DaemonHarness,
) -> None:
    api = agent_socket_path(faced.config, "bot")
    seen = typescript_client(
        api,
        tool="echo",
        arguments={"text": "agent, from TypeScript"},
        prompt="greet",
        promptArguments={"name": "Bob"},
        resource="test://static",
    )
    # a scope of one server: beta's names unchanged, nothing of alpha's
    assert "echo" in seen.tools
    assert not any("__" in name for name in seen.tools)
    assert seen.call == Called(["agent, from TypeScript"], is_error=False)
    assert "greet" in seen.prompts
    assert seen.prompt == ["Say hello to Bob"]
    assert seen.read == ["static content"]
    with faced.client() as c:
        record = c.audit(limit=1).records[0]
    assert (record.action, record.server, record.tool) == ("tools/call", "beta", "echo")
    assert record.caller_profile == "bot"
    assert record.caller_socket == face_socket_path(api)
