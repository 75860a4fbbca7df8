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

from memorizz import Client
from memorizzd.sdnotify import watchdog_interval
from tests.harness import (
    DAEMON_EXE,
    DaemonHarness,
    daemon_config,
    stdio_spec,
    wait_until,
)

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


def test_a_systemd_that_reads_nothing_never_blocks_the_loop(
    base_dir: str, systemd: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The notify socket's queue holds 10 datagrams (net.unix.max_dgram_qlen);
    sd_notify(3) then blocks, and so did the event loop, for good."""
    monkeypatch.setenv("NOTIFY_SOCKET", systemd.getsockname())
    monkeypatch.setenv("WATCHDOG_USEC", str(PERIOD_USEC))
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    with DaemonHarness.running(daemon_config(base_dir)) as d:
        threading.Event().wait(2.0)  # 20 pings, none read
        answered = threading.Event()

        def hello() -> None:
            with d.client() as c:
                c.hello()
            answered.set()

        threading.Thread(target=hello, daemon=True).start()
        assert answered.wait(10)
        assert len(_queued(systemd)) >= 10  # the queue was full
        assert systemd.recv(4096) == b"WATCHDOG=1"  # and the pings go on


def test_the_real_daemon_pings_after_ready_and_its_children_cannot(
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
        # A stdio child inherits none of it (SECURITY.md §5.2: a child that
        # pinged would keep a wedged daemon alive).
        with Client(os.path.join(base_dir, "d.sock")) as c:
            c.add_server(stdio_spec("t"))
            wait_until(lambda: c.server_status("t")[0].state == "ready")
            for name in ("WATCHDOG_USEC", "WATCHDOG_PID", "NOTIFY_SOCKET"):
                seen = c.call_tool("t", "env", {"name": name}).content[0]["text"]
                assert seen == "<unset>", name
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
