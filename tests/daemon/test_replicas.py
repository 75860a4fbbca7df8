"""``replicas = N``: N processes of one stateless stdio server behind one name."""

from __future__ import annotations

import os
import signal
import sys
import threading

import pytest

from memorizz.api.errors import RemoteError
from tests.harness import LEGACY_SERVER, DaemonHarness, stdio_spec, wait_until


def _pid(daemon: DaemonHarness, name: str) -> int:
    with daemon.client() as c:
        result = c.call_tool(name, "pid")
    return int(result.content[0]["text"])


def test_concurrent_calls_spread_over_the_replicas(daemon: DaemonHarness) -> None:
    daemon.add(stdio_spec("pool", replicas=2))
    # One call at a time goes to the first replica: the least busy, first.
    assert len({_pid(daemon, "pool") for _ in range(5)}) == 1
    # Calls in flight together are spread: while one replica is busy, the
    # next call goes to the other.
    pids: list[int] = []

    def busy() -> None:
        with daemon.client() as c:
            c.call_tool("pool", "slow", {"seconds": 1.0})

    thread = threading.Thread(target=busy)
    thread.start()
    try:
        wait_until(lambda: daemon.daemon.pool.get("pool").in_flight == 1, what="busy")
        pids.append(_pid(daemon, "pool"))
    finally:
        thread.join()
    pids.append(_pid(daemon, "pool"))
    assert len(set(pids)) == 2
    with daemon.client() as c:
        (status,) = c.server_status("pool")
    assert status.state == "ready"


def test_the_primary_replica_that_dies_replaces_the_set(daemon: DaemonHarness) -> None:
    """The first replica (the primary) holds the listing, the tasks and the
    resource subscriptions: its death replaces the whole set (any other
    replica is started again alone: tests/e2e/test_replica_supervision.py)."""
    daemon.add(stdio_spec("pool", replicas=2))
    first = _pid(daemon, "pool")
    os.kill(first, signal.SIGKILL)
    wait_until(lambda: daemon.daemon.pool.get("pool").state != "ready", what="noticed")
    daemon.wait_ready("pool")
    assert _pid(daemon, "pool") != first


def test_replicas_are_for_stdio_servers_and_bounded(daemon: DaemonHarness) -> None:
    for spec in (
        stdio_spec("many", replicas=17),
        stdio_spec("none", replicas=0),
    ):
        with daemon.client() as c, pytest.raises(RemoteError) as raised:
            c.add_server(spec)
        assert raised.value.reason == "invalid_params"


def test_memorizzctl_adds_replicas_and_lists_them(daemon: DaemonHarness) -> None:
    # the hand-written server: three start in milliseconds (the listing is the subject)
    argv = ["--command", sys.executable, "--arg", LEGACY_SERVER]
    assert daemon.ctl("mcp", "add", "pool", "--replicas", "3", *argv) == 0
    daemon.wait_ready("pool")
    with daemon.client() as c:
        (info,) = [s for s in c.list_servers() if s.name == "pool"]
    assert info.replicas == 3
    assert len(daemon.daemon.pool.get("pool")._processes) == 3
