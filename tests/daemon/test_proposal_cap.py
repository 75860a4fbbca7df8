"""An agent's profile holds at most ``limits.max_open_proposals`` open
proposals (pending or approved): past it, a call that would propose one is
answered ``overloaded`` and nothing is stored. Each proposal keeps its
arguments (up to a request's size) in the state database until it ends: with
no cap, one agent that looped on a tool decided ``ask`` filled the disk and
the operator's list. Another profile, and the operator socket, are not
counted against it; one proposal decided makes room again.

A real daemon from a config file, the real client on the real sockets; the
tool ``record`` (tests/mcp_server.py, destructive, so ``ask``) counts real
upstream executions in <base>/calls.log.
"""

from __future__ import annotations

import pytest

from memorizz.api.errors import UnavailableError
from memorizzd.config import load
from tests import proposals_world as pw
from tests.harness import DaemonHarness
from tests.peers import ME, calls


def test_a_profile_at_its_open_proposals_cap_is_refused_until_one_is_decided(
    base_dir: str,
) -> None:
    config_file = pw.write_config(
        base_dir,
        ["t"],
        {"alpha": (["t"], [ME]), "beta": (["t"], [ME])},
        limits={"alpha": "{ max_open_proposals = 2 }"},
    )
    with DaemonHarness.running(load(config_file)) as h:
        h.wait_ready("t")
        with (
            pw.agent(base_dir, "alpha") as alpha,
            pw.agent(base_dir, "beta") as beta,
            h.client() as operator,
        ):
            first = pw.propose(alpha, "t", "one")
            second = pw.propose(alpha, "t", "two")
            with pytest.raises(UnavailableError) as refused:
                alpha.call_tool("t", "record", {"tag": "three"})
            error = refused.value
            assert error.reason == "overloaded"
            assert "limits.max_open_proposals = 2" in error.message
            assert error.data["retry_after_s"] > 0
            assert len(pw.shown(operator)) == 2  # nothing stored for it
            # another profile and the operator are not counted against alpha
            pw.propose(beta, "t", "beta's")
            pw.propose(operator, "t", "the operator's")
            # approved still counts (it may run); rejected makes room
            operator.approve(first)
            with pytest.raises(UnavailableError):
                alpha.call_tool("t", "record", {"tag": "still three"})
            operator.reject(second)
            pw.propose(alpha, "t", "three")
    assert calls(base_dir) == []  # nothing ran
