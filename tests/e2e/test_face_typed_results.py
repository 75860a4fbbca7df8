"""A result the daemon makes for a face call (not approved, a question its
caller could not answer) fits a tool that declares an ``outputSchema``: its
facts go in ``_meta["memorizz/error"]``, not in ``structuredContent``, which
would not match the schema. The TypeScript SDK client checks a result's
``structuredContent`` against the tool's schema, errors too, and raised
``-32602`` ("does not match the tool's output schema") instead of showing the
proposal. A tool without a schema keeps ``structuredContent`` as documented.

The official TypeScript SDK client (tests/node/face_typed_call.mjs) through
the real bridge and the real daemon: tests/mcp_server.py's destructive tool
(the SDK declares an output schema for every tool that returns a value) and
the light server's tool without one (``require_approval``), each held for
``face_approval_wait_s`` and not approved.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.harness import (
    NODE_DIR,
    DaemonHarness,
    daemon_config,
    light_spec,
    node_client,
    rmtree,
    short_tempdir,
    stdio_spec,
)
from tests.process import MEMORIZZCTL

CLIENT = str(NODE_DIR / "face_typed_call.mjs")
RUN_TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def harness() -> Iterator[DaemonHarness]:
    base = short_tempdir()
    try:
        servers = [stdio_spec("alpha"), light_spec("lite", require_approval=True)]
        config = daemon_config(base, servers=servers, face_approval_wait_s=0.2)
        with DaemonHarness.running(config) as running:
            running.wait_ready("alpha")
            running.wait_ready("lite")
            yield running
    finally:
        rmtree(base)


def _call(harness: DaemonHarness, tool: str) -> dict[str, Any]:
    plan = {"memorizzctl": MEMORIZZCTL, "socket": harness.socket, "tool": tool}
    return node_client(CLIENT, plan, timeout=RUN_TIMEOUT_S)


def test_a_call_not_approved_of_a_typed_tool_reaches_the_typescript_client(
    harness: DaemonHarness,
) -> None:
    seen = _call(harness, "alpha__annotated_destroy")
    assert seen["outputSchema"] is not None  # the SDK server declares one
    assert "error" not in seen, seen
    result = seen["result"]
    assert result["isError"] is True
    assert "structuredContent" not in result
    facts = result["_meta"]["memorizz/error"]
    assert facts["reason"] == "approval_required"
    assert facts["status"] == "pending"
    assert facts["proposal_id"] in result["content"][0]["text"]


def test_a_tool_without_a_schema_keeps_the_facts_in_structured_content(
    harness: DaemonHarness,
) -> None:
    seen = _call(harness, "lite__hello")
    assert seen["outputSchema"] is None
    result = seen["result"]
    assert result["isError"] is True
    assert result["structuredContent"]["reason"] == "approval_required"
    assert result["structuredContent"] == result["_meta"]["memorizz/error"]
