"""The broker, the pool and the approval book built in-process, without a socket.

``components()`` (tests/component/wiring.py) wires them as ``memorizzd.app.running_daemon`` does (store,
vault, pool, auditor, book, broker) but opens no listener: a test calls the
handlers the dispatcher would call, with a ``Caller`` it makes itself, and the
upstream is the real test server (tests/mcp_server.py over stdio). Params are
decoded from JSON, as the dispatcher decodes them.
"""

from __future__ import annotations

import os

import pytest

from memorizz.api.errors import ApprovalRequiredError, ConflictError, NotFoundError
from tests.component.wiring import AGENT, OPERATOR, Components

pytestmark = pytest.mark.anyio


def _calls(base: str) -> list[str]:
    try:
        with open(os.path.join(base, "calls.log"), encoding="utf-8") as f:
            return f.read().split()
    except FileNotFoundError:
        return []


async def test_a_tools_call_goes_through_the_broker_to_a_real_server(
    c: Components,
) -> None:
    result = await c.call(
        "tools/call",
        AGENT,
        {"server": "t", "name": "echo", "arguments": {"text": "no socket"}},
    )
    assert result["content"] == [{"type": "text", "text": "no socket"}]
    assert not result.get("isError", False)
    # The scope is the agent's profile: another server does not exist.
    with pytest.raises(NotFoundError):
        await c.call(
            "tools/call", AGENT, {"server": "u", "name": "echo", "arguments": {}}
        )
    records = (await c.call("audit/list", OPERATOR, {"limit": 10}))["records"]
    calls = [r for r in records if r["action"] == "tools/call" and r["tool"] == "echo"]
    assert [(r["tool"], r["outcome"]) for r in reversed(calls)] == [
        ("echo", "ok"),
        ("echo", "denied"),
    ]


async def test_an_approval_proposed_approved_and_resumed_runs_once(
    c: Components, base: str
) -> None:
    # record is destructive: ask, so the call becomes a durable proposal.
    with pytest.raises(ApprovalRequiredError) as asked:
        await c.call(
            "tools/call",
            AGENT,
            {"server": "t", "name": "record", "arguments": {"tag": "comp"}},
        )
    proposal_id = asked.value.data["proposal_id"]
    assert _calls(base) == []
    with pytest.raises(ConflictError):  # not approved yet
        await c.call("approvals/resume", AGENT, {"id": proposal_id})
    decided = await c.call("approvals/approve", OPERATOR, {"id": proposal_id})
    assert decided["proposal"]["status"] == "approved"
    result = await c.call("approvals/resume", AGENT, {"id": proposal_id})
    assert not result.get("isError", False)
    assert _calls(base) == ["comp"]
    with pytest.raises(ConflictError):  # consumed: never twice
        await c.call("approvals/resume", AGENT, {"id": proposal_id})
    assert _calls(base) == ["comp"]
    [proposal] = (await c.call("approvals/list", AGENT, {"status": "consumed"}))[
        "proposals"
    ]
    assert proposal["id"] == proposal_id
