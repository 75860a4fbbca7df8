"""A proposal never outlives its server: a server that is removed (``servers/
remove``, or a reload whose config drops it and whose state database does not
give it either) has its open proposals (pending, approved) invalidated at once,
audited (``approvals/invalidate``) and heard by their waiters, so nobody
approves, rejects or counts a call that can never run, and a server of the same
name added later (another server) never runs them. A server a reload only
takes out of one profile's scope is still there: its proposals stay as they
are, and are checked when resumed.

A real daemon from a config file, the real client on real sockets. The tool
``record`` (tests/mcp_server.py, destructive, so ``ask`` by default) appends
its tag to <base>/calls.log: the log counts real upstream executions. Agents
are this process's uid on the profiles' sockets; the operator is the same uid
on the operator socket (the daemon's own uid).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import anyio
import pytest

from memorizz import Client
from memorizz.api.errors import ConflictError
from memorizz.api.methods import ApprovalsWaitResult, Proposal
from memorizzd.config import load
from tests import proposals_world as pw
from tests.daemon.test_metrics import scrape, value
from tests.harness import DaemonHarness
from tests.peers import ME, agent_socket, calls

GONE = "the server was removed or is out of the caller's scope"


def _write_config(base: str, servers: list[str], profiles: dict[str, list[str]]) -> str:
    """``servers`` and each of ``profiles`` (name: its servers; this uid)."""
    return pw.write_config(
        base, servers, {n: (reach, [ME]) for n, reach in profiles.items()}
    )


def _refused(c: Client, proposal_id: str, *, resume: bool) -> tuple[Any, Any]:
    """Resume (an agent) or approve (an operator) ``proposal_id``: refused,
    its reason and the status said."""
    step = c.resume if resume else c.approve
    with pytest.raises(ConflictError) as refused:
        step(proposal_id)
    return refused.value.reason, refused.value.data["status"]


@contextmanager
def _waiting(socket: str, proposal_id: str) -> Iterator[list[ApprovalsWaitResult]]:
    """A client waiting on ``proposal_id`` (``approvals/wait``, 30 s) while
    the block runs, and seen still waiting when it begins; at its end the
    waiter must have returned: the list holds what it got."""
    got: list[ApprovalsWaitResult] = []

    def wait() -> None:
        with Client(socket) as c:
            got.append(c.wait_approval(proposal_id, timeout_s=30))

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    waiter.join(0.5)
    assert waiter.is_alive(), got  # waiting: the proposal is pending
    yield got
    waiter.join(10)
    assert not waiter.is_alive(), "the waiter did not hear of the invalidation"


def _heard_invalidated(got: list[ApprovalsWaitResult]) -> None:
    [waited] = got
    assert (waited.decided, waited.proposal.status, waited.proposal.reason) == (
        True,
        "invalidated",
        GONE,
    )


def test_servers_remove_invalidates_its_open_proposals_at_once(
    base_dir: str,
) -> None:
    config_file = _write_config(base_dir, ["keep"], {"alpha": ["demo", "keep"]})
    with DaemonHarness.running(load(config_file)) as h:
        h.wait_ready("keep")
        h.add(pw.record_spec(base_dir, "demo"))
        with pw.agent(base_dir, "alpha") as alpha, h.client() as operator:
            pending = pw.propose(alpha, "demo", "demo-pending")
            approved = pw.propose(alpha, "demo", "demo-approved")
            assert operator.approve(approved).status == "approved"
            mine = pw.propose(operator, "demo", "demo-operator")
            kept_pending = pw.propose(alpha, "keep", "keep-pending")
            kept_approved = pw.propose(alpha, "keep", "keep-approved")
            operator.approve(kept_approved)
            before = pw.shown(operator)
            assert value(scrape(h), "memorizz_approvals_pending") == 3

            with _waiting(agent_socket(base_dir, "alpha"), pending) as got:
                assert operator.remove_server("demo").name == "demo"
            _heard_invalidated(got)

            shown = pw.shown(operator)
            for proposal_id in (pending, approved, mine):
                assert (shown[proposal_id].status, shown[proposal_id].reason) == (
                    "invalidated",
                    GONE,
                ), proposal_id
            # the other server's are untouched
            for kept in (kept_pending, kept_approved):
                assert shown[kept] == before[kept], kept
            # audited as any invalidation: by the daemon itself
            assert pw.invalidations(operator) == {
                (pending, GONE, "memorizzd"),
                (approved, GONE, "memorizzd"),
                (mine, GONE, "memorizzd"),
            }
            # nothing left to decide, nor counted as waiting for a decision
            with pytest.raises(ConflictError) as rejected:
                operator.reject(pending, reason="too late")
            assert rejected.value.data["status"] == "invalidated"
            assert value(scrape(h), "memorizz_approvals_pending") == 1
            assert alpha.resume(kept_approved).content[0]["text"] == (
                "recorded keep-approved"
            )
    assert calls(base_dir) == ["keep-approved"]


def test_a_reload_that_drops_a_server_invalidates_its_open_proposals_at_once(
    base_dir: str,
) -> None:
    config_file = _write_config(base_dir, ["t", "u"], {"alpha": ["t", "u"]})
    with DaemonHarness.running(load(config_file)) as h:
        h.wait_ready("t")
        h.wait_ready("u")
        with pw.agent(base_dir, "alpha") as alpha, h.client() as operator:
            pending = pw.propose(alpha, "t", "t-pending")
            approved = pw.propose(alpha, "t", "t-approved")
            operator.approve(approved)
            kept_pending = pw.propose(alpha, "u", "u-pending")
            kept_approved = pw.propose(alpha, "u", "u-approved")
            operator.approve(kept_approved)
            before = pw.shown(operator)

            _write_config(base_dir, ["u"], {"alpha": ["u"]})
            with _waiting(agent_socket(base_dir, "alpha"), pending) as got:
                assert operator.daemon_reload().servers_stopped == ["t"]
            _heard_invalidated(got)

            shown = pw.shown(operator)
            for proposal_id in (pending, approved):
                assert (shown[proposal_id].status, shown[proposal_id].reason) == (
                    "invalidated",
                    GONE,
                ), proposal_id
            for kept in (kept_pending, kept_approved):
                assert shown[kept] == before[kept], kept
            assert pw.invalidations(operator) == {
                (pending, GONE, "memorizzd"),
                (approved, GONE, "memorizzd"),
            }
            assert value(scrape(h), "memorizz_approvals_pending") == 1

        # t comes back (another server of the same name): nothing of the old runs
        _write_config(base_dir, ["t", "u"], {"alpha": ["t", "u"]})
        with h.client() as operator:
            assert operator.daemon_reload().servers_started == ["t"]
        h.wait_ready("t")
        with pw.agent(base_dir, "alpha") as alpha, h.client() as operator:
            assert _refused(alpha, approved, resume=True) == (
                "not_approved",
                "invalidated",
            )
            assert _refused(operator, pending, resume=False) == (
                "not_approved",
                "invalidated",
            )
            assert alpha.resume(kept_approved).content[0]["text"] == (
                "recorded u-approved"
            )
    assert calls(base_dir) == ["u-approved"]


def test_a_server_added_again_under_the_same_name_does_not_revive_its_proposals(
    base_dir: str,
) -> None:
    config_file = _write_config(base_dir, [], {"alpha": ["demo"]})
    with DaemonHarness.running(load(config_file)) as h:
        h.add(pw.record_spec(base_dir, "demo"))
        with pw.agent(base_dir, "alpha") as alpha, h.client() as operator:
            pending = pw.propose(alpha, "demo", "again-pending")
            approved = pw.propose(alpha, "demo", "again-approved")
            operator.approve(approved)
            operator.remove_server("demo")
        h.add(pw.record_spec(base_dir, "demo"))  # the same spec, the same name
        with pw.agent(base_dir, "alpha") as alpha, h.client() as operator:
            assert _refused(alpha, approved, resume=True) == (
                "not_approved",
                "invalidated",
            )
            assert _refused(operator, pending, resume=False) == (
                "not_approved",
                "invalidated",
            )
            # the same call again is a new proposal, not the old approval run
            again = pw.propose(alpha, "demo", "again-approved")
            assert again not in (pending, approved)
            shown = pw.shown(operator)
            assert (shown[approved].status, shown[approved].reason) == (
                "invalidated",
                GONE,
            )
    assert calls(base_dir) == []


def test_a_call_on_its_way_when_its_server_is_removed_proposes_nothing_that_lasts(
    base_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call that passed its scope check and its listing before servers/remove
    took its server away, and reaches the book after it: its proposal is
    invalidated at once, and the caller told so. The race is set up by making
    the removal (a real one, over the socket) happen just before the call's
    proposal is stored."""
    config_file = _write_config(base_dir, [], {})
    with DaemonHarness.running(load(config_file)) as h:
        h.add(pw.record_spec(base_dir, "demo"))
        book = h.daemon.book
        propose = book.propose

        def remove() -> None:
            with Client(h.socket) as c:
                c.remove_server("demo")

        async def late(*args: Any, **kwargs: Any) -> Proposal:
            await anyio.to_thread.run_sync(remove)
            return await propose(*args, **kwargs)

        monkeypatch.setattr(book, "propose", late)
        with h.client() as operator:
            with pytest.raises(ConflictError) as refused:
                operator.call_tool("demo", "record", {"tag": "late"})
            monkeypatch.undo()
            assert (refused.value.reason, refused.value.data["status"]) == (
                "not_approved",
                "invalidated",
            )
            proposal_id = refused.value.data["id"]
            shown = pw.shown(operator)[proposal_id]
            assert (shown.status, shown.reason, shown.server) == (
                "invalidated",
                GONE,
                "demo",
            )
            assert pw.invalidations(operator) == {(proposal_id, GONE, "memorizzd")}
    assert calls(base_dir) == []


def test_a_reload_that_narrows_a_profile_leaves_its_proposals_as_they_are(
    base_dir: str,
) -> None:
    """The server is still there, out of alpha's scope only: nothing is
    invalidated by the reload; a resume finds it out (as before)."""
    config_file = _write_config(base_dir, ["t", "u"], {"alpha": ["t", "u"]})
    with DaemonHarness.running(load(config_file)) as h:
        h.wait_ready("t")
        with pw.agent(base_dir, "alpha") as alpha, h.client() as operator:
            pending = pw.propose(alpha, "t", "narrowed-pending")
            approved = pw.propose(alpha, "t", "narrowed-approved")
            operator.approve(approved)
            before = pw.shown(operator)
            _write_config(base_dir, ["t", "u"], {"alpha": ["u"]})
            done = operator.daemon_reload()
            assert (done.servers_stopped, done.profiles_changed) == ([], ["alpha"])
            after = pw.shown(operator)
            assert after[pending] == before[pending]
            assert after[approved] == before[approved]
            assert pw.invalidations(operator) == set()
            assert _refused(alpha, approved, resume=True) == (
                "not_approved",
                "invalidated",
            )
            assert pw.invalidations(operator) == {(approved, GONE, "memorizzd")}
    assert calls(base_dir) == []


def test_a_config_server_the_state_database_gives_too_keeps_its_proposals(
    base_dir: str,
) -> None:
    """A server added through the API and then given by the file too (the
    file wins); the file drops it again: the state database's runs again, as
    after a restart, and its proposals stand."""
    config_file = _write_config(base_dir, [], {})
    with DaemonHarness.running(load(config_file)) as h:
        h.add(pw.record_spec(base_dir, "s"))
        _write_config(base_dir, ["s"], {})
        with h.client() as operator:
            assert operator.daemon_reload().servers_started == ["s"]
        h.wait_ready("s")
        with h.client() as operator:
            pending = pw.propose(operator, "s", "shadowed-pending")
            approved = pw.propose(operator, "s", "shadowed-approved")
            operator.approve(approved)
            before = pw.shown(operator)
            _write_config(base_dir, [], {})
            assert operator.daemon_reload().servers_stopped == ["s"]
            assert [s.name for s in operator.list_servers()] == ["s"]
            after = pw.shown(operator)
            assert after[pending] == before[pending]
            assert after[approved] == before[approved]
            assert pw.invalidations(operator) == set()
        h.wait_ready("s")
        with h.client() as operator:
            assert operator.resume(approved).content[0]["text"] == (
                "recorded shadowed-approved"
            )
    assert calls(base_dir) == ["shadowed-approved"]


def test_a_start_without_the_server_invalidates_its_open_proposals(
    base_dir: str,
) -> None:
    """A server taken out of the file while the daemon was stopped (and not in
    the state database) is gone at the next start, and its proposals with it:
    a server of that name given again later never runs them."""
    config_file = _write_config(base_dir, ["t", "u"], {"alpha": ["t", "u"]})
    with (
        DaemonHarness.running(load(config_file)) as h,
        pw.agent(base_dir, "alpha") as alpha,
        h.client() as operator,
    ):
        pending = pw.propose(alpha, "t", "start-pending")
        approved = pw.propose(alpha, "t", "start-approved")
        kept = pw.propose(alpha, "u", "start-kept")
        operator.approve(approved)
        operator.approve(kept)
    config_file = _write_config(base_dir, ["u"], {"alpha": ["u"]})
    with DaemonHarness.running(load(config_file)) as h, h.client() as operator:
        shown = pw.shown(operator)
        for proposal_id in (pending, approved):
            assert (shown[proposal_id].status, shown[proposal_id].reason) == (
                "invalidated",
                GONE,
            )
        assert shown[kept].status == "approved"
        assert {(pending, GONE), (approved, GONE)} <= {
            (p, r) for p, r, _ in pw.invalidations(operator)
        }
    config_file = _write_config(base_dir, ["t", "u"], {"alpha": ["t", "u"]})
    with (
        DaemonHarness.running(load(config_file)) as h,
        pw.agent(base_dir, "alpha") as alpha,
    ):
        assert _refused(alpha, approved, resume=True) == (
            "not_approved",
            "invalidated",
        )
        assert alpha.resume(kept).content[0]["text"] == "recorded start-kept"
    assert calls(base_dir) == ["start-kept"]
