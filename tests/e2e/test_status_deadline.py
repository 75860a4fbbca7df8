"""``memorizzctl daemon status`` is what the Kubernetes probes run: it must
fail, not hang, when the daemon does not answer. A real daemon, stopped with
SIGSTOP (its socket still accepts: the kernel queues the connection), and the
real memorizzctl: exit 75 after ``--timeout``; the same line succeeds once
the daemon runs again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from tests.harness import daemon_process
from tests.process import DaemonProcess


@pytest.fixture
def daemon(base_dir: str) -> Iterator[DaemonProcess]:
    with daemon_process(base_dir) as d:
        yield d


def _status(socket: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "memorizz.cli", "--socket", socket,
         "daemon", "status", *extra],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_a_stuck_daemon_fails_the_status_probe_in_its_time(
    daemon: DaemonProcess,
) -> None:
    assert _status(daemon.socket).returncode == 0
    assert daemon.proc is not None
    os.kill(daemon.proc.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        stuck = _status(daemon.socket, "--timeout", "1")
        took = time.monotonic() - started
    finally:
        os.kill(daemon.proc.pid, signal.SIGCONT)
    assert stuck.returncode == 75, stuck.stderr
    assert stuck.stdout == ""
    assert stuck.stderr == (
        f"memorizzctl: error: memorizzd at {daemon.socket} did not answer"
        " daemon/status in time (timeout)\n"
    )
    assert took < 30  # it hung until the test's own timeout before
    assert _status(daemon.socket, "--timeout", "5").returncode == 0


def test_the_status_deadline_is_bounded_like_every_deadline(
    daemon: DaemonProcess,
) -> None:
    refused = _status(daemon.socket, "--timeout", "0")
    assert refused.returncode == 2
    assert "--timeout" in refused.stderr
