"""SIGKILL around the consume-and-call step: a call never runs twice, every
pending proposal survives the restart, and every consumed one is audited.

Two lanes (own state directory, own daemon) run in parallel; each loop:
start the real ``memorizzd``, check what the last kill left, propose and
approve a call, send ``approvals/resume`` on a raw socket, SIGKILL the daemon
after a random delay (before, during or after the consume and the upstream
call), and start again. The upstream is tests/legacy_server.py (no SDK: it
starts in milliseconds), whose ``tools/call`` appends its ``tag`` to a log
with fsync: the log is the count of real executions.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import sys
import threading
import time
from collections import Counter

import msgspec
import pytest

from memorizz.api.errors import ApprovalRequiredError, ConflictError
from tests.harness import LEGACY_SERVER, DaemonProcess, rmtree, short_tempdir

LANES = 2
KILLS_PER_LANE = 12
BUDGET_S = 180.0  # bounds a hang, not the speed: about 30 s on two idle cores


def _config(base: str) -> str:
    path = os.path.join(base, "memorizzd.toml")
    with open(path, "w", encoding="utf-8") as f:
        f.write(
            f"""
[[servers]]
name = "t"
transport = "stdio"
command = "{sys.executable}"
args = ["{LEGACY_SERVER}"]
env = {{ CALL_LOG = "{base}/calls.log" }}
require_approval = true
"""
        )
    return path


def _calls(base: str) -> Counter[str]:
    try:
        with open(os.path.join(base, "calls.log"), encoding="utf-8") as f:
            return Counter(f.read().split())
    except FileNotFoundError:
        return Counter()


def _propose(process: DaemonProcess, tag: str) -> str:
    with process.client() as c:
        try:
            c.call_tool("t", "hello", {"tag": tag})
        except ApprovalRequiredError as exc:
            proposal_id = exc.data["proposal_id"]
            assert isinstance(proposal_id, str)
            return proposal_id
    raise AssertionError("the call ran without approval")


def _lane(lane: int, deadline: float, failures: list[BaseException]) -> None:
    base = short_tempdir(f"mz-kill{lane}-")
    rng = random.Random(lane)  # noqa: S311 - kill timing, not crypto
    config = _config(base)
    keep: list[str] = []  # pending proposals that must survive every kill
    resumed: dict[str, str] = {}  # proposal id -> its tag
    process: DaemonProcess | None = None
    try:
        for i in range(KILLS_PER_LANE + 1):
            if time.monotonic() > deadline:
                raise AssertionError(f"lane {lane}: over the time budget at kill {i}")
            process = DaemonProcess(base, ["--config", config]).start()
            with process.client() as c:
                proposals = {p.id: p for p in c.list_approvals(limit=1000)}
                for proposal_id in keep:
                    assert proposals[proposal_id].status == "pending", proposal_id
                counts = _calls(base)
                audited = {
                    r.proposal_id
                    for r in c.audit(limit=1000).records
                    if r.action == "approvals/resume"
                }
                for proposal_id, tag in resumed.items():
                    status = proposals[proposal_id].status
                    assert counts[tag] <= 1, f"{tag} ran {counts[tag]} times"
                    # consumed (its call ran, or was running): it has a record,
                    # "interrupted" if the kill came before the call's own
                    assert status != "consumed" or proposal_id in audited, tag
                    if status == "approved":  # killed before the consume: still runs
                        assert counts[tag] == 0
                        c.resume(proposal_id)
                        assert _calls(base)[tag] == 1
                    else:  # consumed: ran once, or burned by the kill; never again
                        assert status == "consumed", status
                        with pytest.raises(ConflictError):
                            c.resume(proposal_id)
                        assert _calls(base)[tag] <= 1
            resumed.clear()
            if i == KILLS_PER_LANE:
                break
            tag = f"l{lane}k{i}"
            keep.append(_propose(process, f"keep-{tag}"))
            proposal_id = _propose(process, tag)
            with process.client() as c:
                c.approve(proposal_id)
            resumed[proposal_id] = tag
            request = {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "approvals/resume",
                "params": {"id": proposal_id},
            }
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(process.socket)
                s.sendall(msgspec.json.encode(request) + b"\n")
                threading.Event().wait(rng.uniform(0, 0.02))  # the kill point
                process.stop(signal.SIGKILL)
        assert max(_calls(base).values(), default=0) <= 1
    except BaseException as exc:  # noqa: BLE001 - reported by the test
        failures.append(exc)
    finally:
        if (
            process is not None
            and process.proc is not None
            and process.proc.poll() is None
        ):
            process.stop()
        rmtree(base)


def test_sigkill_around_consume_never_runs_a_call_twice() -> None:
    deadline = time.monotonic() + BUDGET_S
    failures: list[BaseException] = []
    lanes = [
        threading.Thread(target=_lane, args=(lane, deadline, failures))
        for lane in range(LANES)
    ]
    for lane in lanes:
        lane.start()
    for lane in lanes:
        lane.join(BUDGET_S + 30)
    if failures:
        raise failures[0]
