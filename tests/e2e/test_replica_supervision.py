"""``replicas = N`` kept alive one replica at a time (the real executable, real
stdio servers): the set starts together, a replica other than the first
(the primary) dies and is started again alone while the others serve on,
each replica's list-change stream is its own, the listings are the
primary's, and the health probe asks each replica (``upstream/replicas.py``).
"""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from memorizz.api.errors import RemoteError
from memorizz.api.methods import ServerSpec
from tests.harness import LEGACY_SERVER, daemon_process, stdio_spec, wait_until
from tests.process import DaemonProcess

SLOW_START = """\
import os, sys, time
time.sleep(float(sys.argv[1]))
os.execv(sys.executable, [sys.executable, *sys.argv[2:]])
"""

DIE_ONCE = """\
import os, sys
try:  # the first replica to get here dies, once
    os.close(os.open(sys.argv[1], os.O_CREAT | os.O_EXCL))
except FileExistsError:
    os.execv(sys.executable, [sys.executable, *sys.argv[2:]])
sys.exit(3)
"""


def _pause(seconds: float) -> None:
    threading.Event().wait(seconds)


@pytest.fixture
def d(base_dir: str) -> Iterator[DaemonProcess]:
    with daemon_process(base_dir) as process:
        yield process


def _add(d: DaemonProcess, spec: ServerSpec, *, timeout: float = 30.0) -> None:
    with d.client() as c:
        c.add_server(spec)
    d.wait_ready(spec.name, timeout=timeout)


def _call(d: DaemonProcess, tool: str, args: dict[str, Any] | None = None) -> str:
    with d.client() as c:
        result = c.call_tool("pool", tool, args or {})
    assert not result.is_error, result
    return str(result.content[0]["text"])


class _InFlight:
    """One ``gate`` call held in flight (on the least busy replica) until ``open``."""

    def __init__(self, d: DaemonProcess, path: Path) -> None:
        self.path = path
        self.outcome: str | RemoteError | None = None
        self._thread = threading.Thread(target=self._run, args=(d,), daemon=True)
        self._thread.start()

    def _run(self, d: DaemonProcess) -> None:
        try:
            self.outcome = _call(d, "gate", {"path": str(self.path)})
        except RemoteError as exc:
            self.outcome = exc

    def open(self) -> str | RemoteError | None:
        self.path.touch()
        self._thread.join(20)
        return self.outcome


def _second_pid(d: DaemonProcess, gate: Path) -> int:
    """The second replica's pid: asked while the first is busy."""
    busy = _InFlight(d, gate)
    wait_until(lambda: _in_flight(d) == 1, what="the first replica busy")
    pid = int(_call(d, "pid"))
    busy.open()
    wait_until(lambda: _in_flight(d) == 0, what="nothing in flight")
    return pid


def _in_flight(d: DaemonProcess) -> int:
    with d.client() as c:
        return c.server_status("pool")[0].in_flight


def test_replicas_start_together_each_within_the_handshake_budget(
    d: DaemonProcess, base_dir: str
) -> None:
    """The replicas start concurrently: the set costs one process's start, and
    each process has the whole budget (max(timeout_s, 5 s)). Before, they
    started one after another under one budget and the set never got ready."""
    # each process needs 1.6 s to answer (well inside timeout_s = 5): four
    # of them, one after another, need 6.4 s
    script = os.path.join(base_dir, "slow_start.py")
    Path(script).write_text(SLOW_START)
    spec = ServerSpec(
        name="pool",
        transport="stdio",
        command=sys.executable,
        args=[script, "1.6", LEGACY_SERVER],
        replicas=4,
        timeout_s=5.0,
    )
    _add(d, spec, timeout=25.0)
    with d.client() as c:
        (status,) = c.server_status("pool")
    assert status.restarts == 0, status


def test_a_replica_that_dies_while_the_set_starts_is_named(
    d: DaemonProcess, base_dir: str
) -> None:
    """A set whose start fails because one replica died says which, with its
    pid and exit code (not an internal class name: "Unsent: ..."); the next
    start, all replicas up, is ready."""
    script = os.path.join(base_dir, "die_once.py")
    Path(script).write_text(DIE_ONCE)
    marker = os.path.join(base_dir, "died")
    spec = ServerSpec(
        name="pool",
        transport="stdio",
        command=sys.executable,
        args=[script, marker, LEGACY_SERVER],
        replicas=3,
    )
    _add(d, spec)
    said = r"pool: connection failed: connection lost: replica \d \(pid \d+\) exited with code 3 while starting"
    assert re.search(said, d.log()), d.log_tail()
    with d.client() as c:
        (status,) = c.server_status("pool")
    assert (status.state, status.restarts, status.last_error) == ("ready", 1, None)


def test_a_killed_replica_fails_only_its_calls_and_is_started_again_alone(
    d: DaemonProcess, tmp_path: Path
) -> None:
    """A replica other than the primary that dies fails only the calls in
    flight on it; the other replica's call completes, the set stays ready,
    and the dead one is started again on its own, counted and logged by
    index, pid and exit code. Before, the whole set was replaced and every
    call in flight failed ("connection lost during the request")."""
    # spawned, not forked by the zygote: its launcher would outlive the kill
    # for a moment, and the set's teardown would come after the answer
    _add(d, stdio_spec("pool", replicas=2, spawn=True))
    second = _second_pid(d, tmp_path / "probe")
    kept = _InFlight(d, tmp_path / "kept")  # on the first replica
    wait_until(lambda: _in_flight(d) == 1, what="the first call in flight")
    doomed = _InFlight(d, tmp_path / "doomed")  # on the second
    wait_until(lambda: _in_flight(d) == 2, what="the second call in flight")
    os.kill(second, signal.SIGKILL)
    wait_until(lambda: _in_flight(d) <= 1, what="the second replica's call ended")
    assert isinstance(doomed.open(), RemoteError)  # it may have run: fair
    assert kept.open() == "opened"  # it was cancelled with the set before
    said = f"pool: replica 1 (pid {second}) exited with code -9; starting it again"
    wait_until(lambda: said in d.log(), what="the lost replica logged")
    with d.client() as c:
        (status,) = c.server_status("pool")
    assert (status.state, status.restarts) == ("ready", 1), status
    # the second replica serves again, a new process (not the first's), and
    # its loss is no longer the server's last error
    wait_until(
        lambda: (
            "pool: replica 1 (pid " in d.log().split(said)[-1]
            and " serves again" in d.log().split(said)[-1]
        ),
        what="the replica started again",
    )
    first = int(_call(d, "pid"))  # an idle set sends to the first
    restarted = _second_pid(d, tmp_path / "again")
    assert restarted not in (second, first)
    assert f"pool: replica 1 (pid {restarted}) serves again" in d.log()
    with d.client() as c:
        (status,) = c.server_status("pool")
    assert (status.state, status.restarts, status.last_error) == ("ready", 1, None)


def test_the_listing_is_the_primarys_whatever_the_load(
    d: DaemonProcess, tmp_path: Path
) -> None:
    """The tool listing (and its relist after tools/list_changed) is asked of
    the primary, never of the least busy replica: before, a relist while the
    primary was busy read the second replica, which had not changed."""
    _add(d, stdio_spec("pool", replicas=2))
    # an idle set sends each call to the first replica: two changes there;
    # the second one's relist waits out RELIST_EVERY_S, and by then the
    # first replica is busy, so the relist is asked of the second replica
    _call(d, "change_tools")
    _call(d, "change_tools")
    busy = _InFlight(d, tmp_path / "busy")
    _pause(2.0)
    busy.open()
    _pause(1.5)
    with d.client() as c:
        listed = {t.name for t in c.list_tools("pool")}
    # the first replica has the new tools and serves every idle call
    assert {name for name in listed if name.startswith("dyn_")}, sorted(listed)


def test_each_replica_list_change_stream_is_opened_again_on_its_own(
    d: DaemonProcess, tmp_path: Path
) -> None:
    """2026-07-28: a replica whose subscriptions/listen stream ends is listened
    to again on its own, as one session is. Before, the set's watch returned
    only once every replica's stream had ended."""
    _add(d, stdio_spec("pool", replicas=2))
    with d.client() as c:
        assert c.server_status("pool")[0].protocol_version == "2026-07-28"
    busy = _InFlight(d, tmp_path / "busy")  # the first replica busy...
    wait_until(lambda: _in_flight(d) == 1, what="the first replica busy")
    _call(d, "end_listens")  # ... so the second ends its streams
    busy.open()
    # with one process, the daemon says so and listens again after 1 s
    wait_until(
        lambda: "pool: the server ended its list-change stream (replica 1)" in d.log(),
        timeout=6.0,
        what="the ended stream noticed",
    )


def test_a_frozen_replica_is_found_by_the_health_probe(base_dir: str) -> None:
    """The health probe asks each replica that has not answered within the
    interval: a frozen (SIGSTOP) one is lost and started again alone while
    the other serves steady traffic. Before, any replica's answer skipped the
    probe of all of them."""
    config = os.path.join(base_dir, "c.toml")
    Path(config).write_text("health_interval_s = 0.5\nhealth_timeout_s = 0.5\n")
    with daemon_process(base_dir, config=config) as d:
        _add(d, stdio_spec("pool", replicas=2))
        first = int(_call(d, "pid"))
        frozen = _second_pid(d, Path(base_dir) / "gate")
        assert frozen != first
        os.kill(frozen, signal.SIGSTOP)
        try:
            deadline = time.monotonic() + 5.0  # ten health intervals
            while time.monotonic() < deadline:
                _call(d, "pid")  # steady traffic, one call at a time
                with d.client() as c:
                    (status,) = c.server_status("pool")
                if status.restarts:
                    break
                _pause(0.1)
            assert (status.state, status.restarts) == ("ready", 1), status
            # the pid is the zygote launcher's (the server is its fork)
            said = r"pool: replica 1 \(pid \d+\) failed its health probe"
            assert re.search(said, d.log())
        finally:
            os.kill(frozen, signal.SIGCONT)
