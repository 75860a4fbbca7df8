"""What an approvals step says when its proposal is in the wrong state.

approve and reject need a pending proposal, cancel a pending or approved one,
resume an approved one: each refusal is ``not_approved`` (``data.id``,
``data.status``) and its message says what that step needs, never another
step's rule ("only an approved proposal runs" is resume's).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from memorizz import Client
from memorizz.api.errors import ConflictError
from tests import proposals_world as pw
from tests.harness import DaemonHarness, stdio_spec, tempdir_fixture, wait_until
from tests.peers import agent_socket, profiles_config

shared = tempdir_fixture()


@pytest.fixture(scope="module")
def approvals(shared: str) -> Iterator[DaemonHarness]:
    with DaemonHarness.running(profiles_config(shared)) as harness:
        harness.wait_ready("t")
        yield harness


def _propose(c: Client, tag: str, *, server: str = "t", tool: str = "record") -> str:
    return pw.propose(c, server, tag, tool=tool)


def _status(c: Client, proposal_id: str) -> str:
    [found] = [p for p in c.list_approvals() if p.id == proposal_id]
    return found.status


def _refused(step: Callable[[str], object], proposal_id: str) -> ConflictError:
    with pytest.raises(ConflictError) as refused:
        step(proposal_id)
    assert refused.value.reason == "not_approved"
    return refused.value


def _says(err: ConflictError, proposal_id: str, status: str, rule: str) -> None:
    assert err.data == {"id": proposal_id, "status": status}
    assert err.message == f"proposal {proposal_id} is {status}; {rule}"


APPROVE = "only a pending proposal can be approved"
REJECT = "only a pending proposal can be rejected"
CANCEL = "only a pending or approved proposal can be cancelled"
RESUME = "only an approved proposal runs"


def _ended(operator: Client, agent: Client) -> dict[str, str]:
    """A proposal in each state a step can end it in: state -> id."""
    cancelled = _propose(agent, "cancelled")
    agent.cancel_approval(cancelled)
    rejected = _propose(agent, "rejected")
    operator.reject(rejected)
    consumed = _propose(agent, "consumed")
    operator.approve(consumed)
    agent.resume(consumed)
    approved = _propose(agent, "approved")
    operator.approve(approved)
    return {
        "cancelled": cancelled,
        "rejected": rejected,
        "consumed": consumed,
        "approved": approved,
    }


def test_approve_and_reject_say_a_pending_proposal_is_needed(
    approvals: DaemonHarness, shared: str
) -> None:
    with Client(agent_socket(shared, "alpha")) as agent, approvals.client() as operator:
        for status, proposal_id in _ended(operator, agent).items():
            assert _status(operator, proposal_id) == status
            _says(_refused(operator.approve, proposal_id), proposal_id, status, APPROVE)
            _says(_refused(operator.reject, proposal_id), proposal_id, status, REJECT)
            if status != "approved":
                cancel = _refused(agent.cancel_approval, proposal_id)
                _says(cancel, proposal_id, status, CANCEL)
                # resume keeps its own message
                _says(_refused(agent.resume, proposal_id), proposal_id, status, RESUME)


def test_approving_an_invalidated_proposal_says_so(
    approvals: DaemonHarness, shared: str
) -> None:
    with Client(agent_socket(shared, "alpha")) as agent, approvals.client() as operator:
        stale = _propose(agent, "a", tool="evolving")
        assert operator.call_tool("t", "evolve").is_error is False
        wait_until(lambda: _status(operator, stale) == "invalidated", timeout=10)
        _says(_refused(operator.approve, stale), stale, "invalidated", APPROVE)
        _says(_refused(operator.reject, stale), stale, "invalidated", REJECT)
        # A proposal whose server is gone: invalidated (by the removal, or by
        # approve's own check), and approve says it with its own rule.
        approvals.add(stdio_spec("v"))
        orphan = _propose(operator, "orphan", server="v")
        operator.remove_server("v")
        _says(_refused(operator.approve, orphan), orphan, "invalidated", APPROVE)
        _says(_refused(operator.resume, orphan), orphan, "invalidated", RESUME)


def test_approving_an_expired_proposal_says_so(base_dir: str) -> None:
    with DaemonHarness.running(profiles_config(base_dir, approval_ttl_s=0.3)) as h:
        h.wait_ready("t")
        with h.client() as operator:
            late = _propose(operator, "late")
            assert (
                operator.wait_approval(late, timeout_s=20).proposal.status == "expired"
            )
            _says(_refused(operator.approve, late), late, "expired", APPROVE)
            _says(_refused(operator.reject, late), late, "expired", REJECT)


def test_the_cli_says_approves_rule(
    approvals: DaemonHarness, shared: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with approvals.client() as operator:
        proposal_id = _propose(operator, "cli")
        operator.cancel_approval(proposal_id)
    capsys.readouterr()
    assert approvals.ctl("mcp", "approve", proposal_id) == 1
    assert capsys.readouterr().err == (
        f"memorizzctl: error: proposal {proposal_id} is cancelled; {APPROVE} (not_approved)\n"
    )
    assert approvals.ctl("mcp", "reject", proposal_id) == 1
    assert capsys.readouterr().err == (
        f"memorizzctl: error: proposal {proposal_id} is cancelled; {REJECT} (not_approved)\n"
    )
