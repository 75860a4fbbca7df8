"""The systemd watchdog (SECURITY.md §6.2 #30, fault A): ``WATCHDOG=1`` comes
from a task of the event loop, so a blocked loop stops the pings and systemd
(``WatchdogSec=`` in systemd/memorizzd.service) kills and restarts the daemon.

systemd is played by a datagram socket the test binds as ``$NOTIFY_SOCKET``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest

from memorizzd.sdnotify import watchdog_interval
from tests.harness import DAEMON_EXE, DaemonHarness, daemon_config

PERIOD_USEC = 300_000
"""``WatchdogSec=0.3s``: a ping every 0.1 s."""


@pytest.fixture
def systemd(base_dir: str) -> Iterator[socket.socket]:
    path = os.path.join(base_dir, "notify.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(path)
        sock.settimeout(10)
        yield sock


def _pings_within(sock: socket.socket, seconds: float) -> int:
    """``WATCHDOG=1`` datagrams received in the next ``seconds``."""
    count = 0
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            message = sock.recv(4096)
        except TimeoutError:
            break
        count += message == b"WATCHDOG=1"
    sock.settimeout(10)
    return count


def _queued(sock: socket.socket) -> list[bytes]:
    """Every datagram waiting on ``sock`` now, without waiting for more."""
    found: list[bytes] = []
    sock.setblocking(False)
    try:
        while True:
            found.append(sock.recv(4096))
    except BlockingIOError:
        return found
    finally:
        sock.settimeout(10)


def test_the_event_loop_pings_and_a_blocked_loop_stops_the_pings(
    base_dir: str, systemd: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", systemd.getsockname())
    monkeypatch.setenv("WATCHDOG_USEC", str(PERIOD_USEC))
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))  # the daemon is us
    with DaemonHarness.running(daemon_config(base_dir)) as d:
        assert systemd.recv(4096) == b"WATCHDOG=1"
        # Three per period: about 10 a second (at least 3, on a busy machine).
        assert _pings_within(systemd, 1.0) >= 3

        def block_the_loop() -> list[bytes]:
            # Runs on the event loop's own thread: nothing else runs on the
            # loop meanwhile, so whatever is queued was sent before the block.
            _queued(systemd)
            threading.Event().wait(1.0)  # 10 periods, the loop blocked
            return _queued(systemd)

        assert d.portal.call(block_the_loop) == []
        # Unblocked, the pings resume at once.
        assert systemd.recv(4096) == b"WATCHDOG=1"
        with d.client() as c:
            assert c.hello().protocol_version == 1


def test_the_real_daemon_pings_after_ready_until_it_stops(
    base_dir: str, systemd: socket.socket
) -> None:
    env = {
        **os.environ,
        "NOTIFY_SOCKET": systemd.getsockname(),
        "WATCHDOG_USEC": str(PERIOD_USEC),
    }
    env.pop("WATCHDOG_PID", None)  # absent: the daemon pings (sd_watchdog_enabled)
    proc = subprocess.Popen(
        [
            DAEMON_EXE,
            "--socket",
            os.path.join(base_dir, "d.sock"),
            "--state-dir",
            os.path.join(base_dir, "state"),
        ],
        env=env,
        stderr=subprocess.DEVNULL,
    )
    try:
        messages = [systemd.recv(4096)]
        while messages[-1] != b"READY=1":
            messages.append(systemd.recv(4096))
        assert _pings_within(systemd, 1.0) >= 3
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize(
    ("environ", "interval"),
    [
        ({"WATCHDOG_USEC": "30000000"}, 10.0),
        ({"WATCHDOG_USEC": "300000", "WATCHDOG_PID": str(os.getpid())}, 0.1),
        ({}, None),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}, None),  # not for us
        ({"WATCHDOG_USEC": "0"}, None),
        ({"WATCHDOG_USEC": "soon"}, None),
    ],
)
def test_the_ping_interval_is_a_third_of_the_period_when_it_is_ours(
    environ: dict[str, str], interval: float | None
) -> None:
    assert watchdog_interval(environ) == pytest.approx(interval)
