"""Approvals: an ``ask`` call becomes a durable proposal that runs at most once.

The tool ``record`` (tests/mcp_server.py, destructive, so ``ask`` by default)
appends its tag to a log file: the log counts real upstream executions.
Agents are this process's uid on the ``alpha``/``beta`` agent sockets (root in
CI: root there is an agent like anyone else); the operator is the same uid on
the operator socket (the daemon's own uid).
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterator

import pytest

from memorizz import Client
from memorizz.api.errors import (
    ApprovalRequiredError,
    ConflictError,
    NotFoundError,
    PermissionDeniedError,
)
from memorizz.api.methods import Proposal
from memorizzd.vault import CANARY_REF
from tests.harness import DaemonHarness, tempdir_fixture, wait_until
from tests.peers import ME, ME_NAME, agent_socket, calls, profiles_config

shared = tempdir_fixture()
"""One daemon for the module; each test uses tags and ids of its own."""


@pytest.fixture(scope="module")
def approvals(shared: str) -> Iterator[DaemonHarness]:
    with DaemonHarness.running(profiles_config(shared)) as harness:
        harness.wait_ready("t")
        yield harness


def _propose(c: Client, tag: str, *, server: str = "t", tool: str = "record") -> str:
    with pytest.raises(ApprovalRequiredError) as asked:
        c.call_tool(server, tool, {"tag": tag} if tool == "record" else {"text": tag})
    data = asked.value.data
    assert asked.value.reason == "approval_required"
    assert isinstance(data["expires_at"], float)
    proposal_id = data["proposal_id"]
    assert isinstance(proposal_id, str)
    return proposal_id


def _agent(base: str, profile: str = "alpha") -> Client:
    return Client(agent_socket(base, profile))


def _status(c: Client, proposal_id: str) -> str:
    found = [p for p in c.list_approvals() if p.id == proposal_id]
    assert found, proposal_id
    return found[0].status


def test_approve_then_resume_runs_exactly_once(
    approvals: DaemonHarness, shared: str
) -> None:
    with _agent(shared) as agent, approvals.client() as operator:
        proposal_id = _propose(agent, "once")
        assert "once" not in calls(shared)
        [mine] = [
            p for p in agent.list_approvals(status="pending") if p.id == proposal_id
        ]
        assert (mine.id, mine.tool, mine.risk) == (proposal_id, "record", "destructive")
        assert (mine.caller_uid, mine.caller_user, mine.caller_profile) == (
            ME,
            ME_NAME,
            "alpha",
        )
        assert mine.argument_keys == ["tag"]
        assert mine.arguments is None
        with pytest.raises(ConflictError) as early:  # not approved yet
            agent.resume(proposal_id)
        assert early.value.data["status"] == "pending"
        with pytest.raises(PermissionDeniedError):  # an agent never approves
            agent.approve(proposal_id)

        approved = operator.approve(proposal_id, approver="alice")
        assert approved.status == "approved"
        assert (approved.decided_by_uid, approved.decided_by_user) == (ME, ME_NAME)
        assert approved.approver_label == "alice"

        result = agent.resume(proposal_id)
        assert result.content[0]["text"] == "recorded once"
        assert calls(shared).count("once") == 1
        with pytest.raises(ConflictError) as again:
            agent.resume(proposal_id)
        assert (again.value.reason, again.value.data["status"]) == (
            "not_approved",
            "consumed",
        )
        with pytest.raises(ConflictError):
            operator.resume(proposal_id)
        assert calls(shared).count("once") == 1

        trail = [
            (r.action, r.outcome)
            for r in operator.audit(limit=20).records
            if r.proposal_id == proposal_id
        ]
        assert trail[::-1][:3] == [
            ("tools/call", "approval_required"),
            ("approvals/approve", "ok"),
            ("approvals/resume", "ok"),
        ]
        resumed = next(
            r
            for r in operator.audit(limit=20).records
            if r.action == "approvals/resume"
        )
        assert resumed.caller_profile == "alpha"
        assert resumed.argument_keys == ["tag"]
        assert resumed.arguments_hmac == mine.arguments_hmac


def test_concurrent_resumes_run_it_once(approvals: DaemonHarness, shared: str) -> None:
    with approvals.client() as operator:
        proposal_id = _propose(operator, "race")
        operator.approve(proposal_id)
    outcomes: list[str] = []
    barrier = threading.Barrier(10)

    def resume() -> None:
        with _agent(shared) if len(outcomes) % 2 else approvals.client() as c:
            c.hello()
            barrier.wait()
            try:
                c.resume(proposal_id)
            except ConflictError as exc:
                outcomes.append(exc.reason)
            else:
                outcomes.append("ran")

    threads = [threading.Thread(target=resume) for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(outcomes) == ["not_approved"] * 9 + ["ran"]
    assert calls(shared).count("race") == 1


def test_rejected_cancelled_and_foreign_proposals_cannot_run(
    approvals: DaemonHarness, shared: str
) -> None:
    with (
        _agent(shared) as alpha,
        _agent(shared, "beta") as beta,
        approvals.client() as operator,
    ):
        rejected = _propose(alpha, "rejected")
        cancelled = _propose(alpha, "cancelled")
        approved_then_cancelled = _propose(alpha, "late")
        assert operator.reject(rejected, reason="not today").reason == "not today"
        assert alpha.cancel_approval(cancelled).status == "cancelled"
        operator.approve(approved_then_cancelled)
        assert alpha.cancel_approval(approved_then_cancelled).status == "cancelled"
        for proposal_id, status in (
            (rejected, "rejected"),
            (cancelled, "cancelled"),
            (approved_then_cancelled, "cancelled"),
        ):
            with pytest.raises(ConflictError) as err:
                alpha.resume(proposal_id)
            assert err.value.data["status"] == status
            with pytest.raises(ConflictError):
                operator.approve(proposal_id)
        # Another profile's proposal does not exist for beta: same error as a made-up id.
        foreign = _propose(alpha, "foreign")
        operator.approve(foreign)
        assert beta.list_approvals() == []
        for attempt in (
            beta.resume,
            beta.cancel_approval,
            lambda i: beta.wait_approval(i, timeout_s=0),
        ):
            with pytest.raises(NotFoundError) as hidden:
                attempt(foreign)
            with pytest.raises(NotFoundError) as missing:
                attempt("p_nope")
            assert hidden.value.reason == missing.value.reason == "not_found"
            assert hidden.value.message == missing.value.message.replace(
                "p_nope", foreign
            )
        ran = set(calls(shared))
        assert not ran & {"rejected", "cancelled", "late", "foreign"}
        actions = {r.action for r in operator.audit(limit=50).records}
        assert {"approvals/reject", "approvals/cancel", "approvals/approve"} <= actions


def test_argument_values_only_to_an_operator_who_asks(
    approvals: DaemonHarness, shared: str
) -> None:
    with _agent(shared) as agent, approvals.client() as operator:
        proposal_id = _propose(agent, "secret-ish")
        [plain] = [p for p in operator.list_approvals() if p.id == proposal_id]
        assert plain.arguments is None
        [shown] = [
            p
            for p in operator.list_approvals(show_arguments=True)
            if p.id == proposal_id
        ]
        assert shown.arguments == {"tag": "secret-ish"}
        with pytest.raises(PermissionDeniedError):
            agent.list_approvals(show_arguments=True)
        for record in operator.audit(limit=20).records:
            assert "secret-ish" not in repr(record)
        assert proposal_id == shown.id
    # The arguments live in the vault, which wrote its canary with them.
    store_path = os.path.join(shared, "state", "state.db")
    with sqlite3.connect(store_path) as db:
        refs = {row[0] for row in db.execute("SELECT ref FROM secrets")}
    assert CANARY_REF in refs
    assert f"proposal/{proposal_id}/arguments" in refs


def test_wait_returns_on_a_decision_or_at_the_deadline(
    approvals: DaemonHarness, shared: str
) -> None:
    with _agent(shared) as agent, approvals.client() as operator:
        proposal_id = _propose(agent, "waited")
        still = agent.wait_approval(proposal_id, timeout_s=0.2)
        assert (still.decided, still.proposal.status) == (False, "pending")

        def approve_later() -> None:
            with Client(approvals.socket) as c:
                c.approve(proposal_id)

        timer = threading.Timer(0.3, approve_later)
        timer.start()
        decided = agent.wait_approval(proposal_id, timeout_s=20)
        timer.join()
        assert (decided.decided, decided.proposal.status) == (True, "approved")
        assert operator.wait_approval(proposal_id, timeout_s=0).decided


def test_proposals_expire(base_dir: str) -> None:
    config = profiles_config(base_dir, approval_ttl_s=0.4)
    with DaemonHarness.running(config) as harness:
        harness.wait_ready("t")
        with _agent(base_dir) as agent, harness.client() as operator:
            pending = _propose(agent, "too-slow")
            approved = _propose(agent, "approved-too-slow")
            operator.approve(approved)
            waited = agent.wait_approval(pending, timeout_s=20)
            assert (waited.decided, waited.proposal.status) == (True, "expired")
            wait_until(lambda: _status(operator, approved) == "expired", timeout=5)
            for proposal_id in (pending, approved):
                with pytest.raises(ConflictError) as err:
                    agent.resume(proposal_id)
                assert err.value.data["status"] == "expired"
            with pytest.raises(ConflictError):
                operator.approve(pending)

            def expired() -> list[str]:
                return sorted(
                    r.proposal_id or ""
                    for r in operator.audit(limit=50).records
                    if r.action == "approvals/expire"
                )

            # A proposal reads as expired at its deadline; the book's sweep
            # writes it down (and audits it) just after.
            wait_until(lambda: expired() == sorted([pending, approved]), timeout=5)
        assert calls(base_dir) == []


def test_a_changed_tool_schema_invalidates(
    approvals: DaemonHarness, shared: str
) -> None:
    with _agent(shared) as agent, approvals.client() as operator:
        approved = _propose(agent, "a", tool="evolving")
        pending = _propose(agent, "b", tool="evolving")
        operator.approve(approved)
        assert operator.call_tool("t", "evolve").is_error is False
        # The next resume sees the new schema: the approval no longer fits.
        with pytest.raises(ConflictError) as err:
            agent.resume(approved)
        assert err.value.data["status"] == "invalidated"
        # tools/list_changed led to a fresh listing, which invalidated the other.
        assert _status(operator, pending) == "invalidated"
        [record] = [p for p in operator.list_approvals() if p.id == approved]
        assert record.reason == "the tool's schema changed"
        # A proposal made against the new schema runs.
        fresh = _propose(agent, "c", tool="evolving")
        operator.approve(fresh)
        assert agent.resume(fresh).content[0]["text"] == "c"


def test_the_cli_shows_and_decides_proposals(
    approvals: DaemonHarness, shared: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        approvals.ctl("mcp", "call", "t", "record", "--arguments", '{"tag": "x"}') == 1
    )
    err = capsys.readouterr().err
    assert "approval_required" in err
    assert "mcp approve p_" in err
    with approvals.client() as c:
        proposal = c.list_approvals()[0]  # the newest
        assert proposal.argument_keys == ["tag"]
    assert approvals.ctl("mcp", "approvals", "--status", "pending") == 0
    table = capsys.readouterr().out
    for shown in (
        proposal.id,
        "record",
        "destructive",
        "tag",
        f"{ME_NAME}({ME})",
        "in 14m",
    ):
        assert shown in table
    assert '"x"' not in table
    assert approvals.ctl("mcp", "approvals", "--show-arguments") == 0
    assert '"tag": "x"' in capsys.readouterr().out
    assert approvals.ctl("mcp", "approve", proposal.id, "--approver", "alice") == 0
    assert f"approved by {ME_NAME}({ME}) [alice]" in capsys.readouterr().out
    assert approvals.ctl("mcp", "resume", proposal.id) == 0
    assert capsys.readouterr().out == "recorded x\n"
    assert approvals.ctl("mcp", "resume", proposal.id) == 1
    assert "consumed" in capsys.readouterr().err
    with _agent(shared) as agent:
        other = _propose(agent, "y")
    assert approvals.ctl("mcp", "reject", other, "--reason", "no") == 0
    assert f"rejected by {ME_NAME}({ME}): no" in capsys.readouterr().out
    assert approvals.ctl("audit", "--limit", "5") == 0
    trail = capsys.readouterr().out
    assert "proposal" in trail.splitlines()[0].lower()
    assert other in trail
    assert (
        approvals.ctl("--socket", agent_socket(shared, "alpha"), "mcp", "status") == 77
    )
    assert calls(shared).count("x") == 1
    assert "y" not in calls(shared)


def test_proposal_struct_keeps_argument_values_optional() -> None:
    assert "arguments" in Proposal.__struct_fields__
