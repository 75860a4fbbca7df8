"""A proposal never outlives its profile: a profile that leaves the config
(a reload removes it, or the daemon starts with a config that no longer gives
it) has its open proposals (pending, approved) invalidated, so a profile of
the same name added later (another profile: other uids, another team) never
sees its approvals run. A profile that stays, changed or not, keeps its
proposals; the operator socket's are never touched; ended ones stay history.

A real daemon from a config file, the real client on real sockets. The tool
``record`` (tests/mcp_server.py, destructive, so ``ask`` by default) appends
its tag to <base>/calls.log: the log counts real upstream executions. Agents
are this process's uid on the profiles' sockets; the operator is the same uid
on the operator socket (the daemon's own uid).
"""

from __future__ import annotations

import os
from functools import partial

import msgspec
import pytest

from memorizz import Client
from memorizz.api.errors import ConflictError
from memorizzd.audit import CallArguments
from memorizzd.caller import Caller
from memorizzd.config import load
from tests import proposals_world as pw
from tests.harness import DaemonHarness
from tests.peers import ME, NOBODY, agent_socket, calls

GONE = "the caller's profile was removed"


def _write_config(base: str, profiles: dict[str, list[int]]) -> str:
    """Server ``t`` and each of ``profiles`` (name: uids) reaching it."""
    return pw.write_config(
        base, ["t"], {n: (["t"], uids) for n, uids in profiles.items()}
    )


def _propose(c: Client, tag: str) -> str:
    return pw.propose(c, "t", tag)


def test_a_reload_that_removes_a_profile_invalidates_its_open_proposals(
    base_dir: str,
) -> None:
    config_file = _write_config(base_dir, {"alpha": [ME], "beta": [ME]})
    with DaemonHarness.running(load(config_file)) as h:
        h.wait_ready("t")
        with pw.agent(base_dir, "alpha") as alpha, h.client() as operator:
            pending = _propose(alpha, "left-pending")
            approved = _propose(alpha, "left-approved")
            assert operator.approve(approved).status == "approved"

        _write_config(base_dir, {"beta": [ME]})
        with h.client() as operator:
            assert operator.daemon_reload().profiles_removed == ["alpha"]
            shown = pw.shown(operator)
            for proposal_id in (pending, approved):
                assert (shown[proposal_id].status, shown[proposal_id].reason) == (
                    "invalidated",
                    GONE,
                )
                # approvals/wait says so too: a waiter hears of it as of a decision
                waited = operator.wait_approval(proposal_id, timeout_s=0)
                assert (waited.decided, waited.proposal.status) == (True, "invalidated")
            # audited as any invalidation: by the daemon itself
            assert pw.invalidations(operator) == {
                (pending, GONE, "memorizzd"),
                (approved, GONE, "memorizzd"),
            }

        # The same name again is another profile: the old approval is not its.
        _write_config(base_dir, {"alpha": [ME, NOBODY], "beta": [ME]})
        with h.client() as operator:
            assert operator.daemon_reload().profiles_added == ["alpha"]
        with pw.agent(base_dir, "alpha") as alpha:
            for proposal_id in (pending, approved):
                with pytest.raises(ConflictError) as refused:
                    alpha.resume(proposal_id)
                assert (refused.value.reason, refused.value.data["status"]) == (
                    "not_approved",
                    "invalidated",
                )
            # the same call again is a new proposal, not the old approval run
            again = _propose(alpha, "left-approved")
            assert again not in (pending, approved)
    assert calls(base_dir) == []


def test_a_start_without_the_profile_invalidates_its_open_proposals(
    base_dir: str,
) -> None:
    config_file = _write_config(base_dir, {"alpha": [ME], "beta": [ME]})
    with DaemonHarness.running(load(config_file)) as h:
        h.wait_ready("t")
        with (
            pw.agent(base_dir, "alpha") as alpha,
            pw.agent(base_dir, "beta") as beta,
            h.client() as operator,
        ):
            pending = _propose(alpha, "stopped-pending")
            approved = _propose(alpha, "stopped-approved")
            operator.approve(approved)
            kept = _propose(beta, "kept")
            operator.approve(kept)
            mine = _propose(operator, "operator's")
            operator.approve(mine)

    # The config is edited while the daemon is stopped: alpha is gone.
    _write_config(base_dir, {"beta": [ME]})
    with DaemonHarness.running(load(config_file)) as h, h.client() as operator:
        shown = pw.shown(operator)
        for proposal_id in (pending, approved):
            assert (shown[proposal_id].status, shown[proposal_id].reason) == (
                "invalidated",
                GONE,
            )
        assert (shown[kept].status, shown[mine].status) == ("approved", "approved")
        assert pw.invalidations(operator) == {
            (pending, GONE, "memorizzd"),
            (approved, GONE, "memorizzd"),
        }

    # alpha comes back (another profile of the same name): nothing of the old runs
    _write_config(base_dir, {"alpha": [ME], "beta": [ME]})
    with DaemonHarness.running(load(config_file)) as h:
        h.wait_ready("t")
        with (
            pw.agent(base_dir, "alpha") as alpha,
            pw.agent(base_dir, "beta") as beta,
            h.client() as operator,
        ):
            with pytest.raises(ConflictError) as refused:
                alpha.resume(approved)
            assert (refused.value.reason, refused.value.data["status"]) == (
                "not_approved",
                "invalidated",
            )
            assert beta.resume(kept).content[0]["text"] == "recorded kept"
            assert operator.resume(mine).content[0]["text"] == "recorded operator's"
    assert calls(base_dir) == ["kept", "operator's"]


def test_a_reload_leaves_the_proposals_of_those_that_stay(base_dir: str) -> None:
    """beta stays (changed: another uid), the operator socket is no profile,
    and an ended proposal of alpha is history: the reload that removes alpha
    touches none of them."""
    config_file = _write_config(base_dir, {"alpha": [ME], "beta": [ME]})
    with DaemonHarness.running(load(config_file)) as h:
        h.wait_ready("t")
        with (
            pw.agent(base_dir, "alpha") as alpha,
            pw.agent(base_dir, "beta") as beta,
            h.client() as operator,
        ):
            alpha_pending = _propose(alpha, "alpha-pending")
            alpha_rejected = _propose(alpha, "alpha-rejected")
            operator.reject(alpha_rejected, reason="not today")
            beta_pending = _propose(beta, "beta-pending")
            beta_approved = _propose(beta, "beta-approved")
            operator.approve(beta_approved)
            op_pending = _propose(operator, "op-pending")
            op_approved = _propose(operator, "op-approved")
            operator.approve(op_approved)
            before = pw.shown(operator)

        _write_config(base_dir, {"beta": [ME, NOBODY]})
        with h.client() as operator:
            done = operator.daemon_reload()
            assert (done.profiles_removed, done.profiles_changed) == (
                ["alpha"],
                ["beta"],
            )
            after = pw.shown(operator)
            assert pw.invalidations(operator) == {(alpha_pending, GONE, "memorizzd")}
        assert (after[alpha_pending].status, after[alpha_pending].reason) == (
            "invalidated",
            GONE,
        )
        for untouched in (
            alpha_rejected,
            beta_pending,
            beta_approved,
            op_pending,
            op_approved,
        ):
            assert after[untouched] == before[untouched], untouched
        assert after[alpha_rejected].reason == "not today"
        with pw.agent(base_dir, "beta") as beta, h.client() as operator:
            assert beta.resume(beta_approved).content[0]["text"] == (
                "recorded beta-approved"
            )
            assert operator.resume(op_approved).content[0]["text"] == (
                "recorded op-approved"
            )
            operator.approve(beta_pending)
            assert beta.resume(beta_pending).content[0]["text"] == (
                "recorded beta-pending"
            )
    assert calls(base_dir) == ["beta-approved", "op-approved", "beta-pending"]


def test_a_call_on_its_way_when_its_profile_leaves_proposes_nothing_that_lasts(
    base_dir: str,
) -> None:
    """An alpha call that passed its scope check before the reload removed
    alpha, and reaches the book after it (listing a cold server takes a round
    trip): its proposal is invalidated at once, and the caller told so. The
    race is set up in-process: the book is handed that call directly."""
    config_file = _write_config(base_dir, {"alpha": [ME], "beta": [ME]})
    with DaemonHarness.running(load(config_file)) as h:
        _write_config(base_dir, {"beta": [ME]})
        with h.client() as operator:
            assert operator.daemon_reload().profiles_removed == ["alpha"]
        on_its_way = Caller(
            pid=os.getpid(),
            uid=ME,
            gid=os.getgid(),
            socket=agent_socket(base_dir, "alpha"),
            profile="alpha",
            role="agent",
        )
        value = {"tag": "late"}
        arguments = CallArguments(msgspec.json.encode(value), value, ["tag"], "0" * 64)
        with pytest.raises(ConflictError) as refused:
            h.portal.call(
                partial(
                    h.daemon.book.propose,
                    on_its_way,
                    server="t",
                    tool="record",
                    arguments=arguments,
                    risk="destructive",
                    schema=None,
                )
            )
        assert (refused.value.reason, refused.value.data["status"]) == (
            "not_approved",
            "invalidated",
        )
        proposal_id = refused.value.data["id"]
        with h.client() as operator:
            shown = pw.shown(operator)[proposal_id]
            assert (shown.status, shown.reason, shown.caller_profile) == (
                "invalidated",
                GONE,
                "alpha",
            )
            assert pw.invalidations(operator) == {(proposal_id, GONE, "memorizzd")}
