"""``replicas = N``: N processes of one stateless stdio server behind one name."""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path

import pytest

from memorizz.api.errors import RemoteError
from tests.harness import (
    LEGACY_SERVER,
    TESTS,
    DaemonHarness,
    features_spec,
    stdio_spec,
    wait_until,
)


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


def _pids(daemon: DaemonHarness, name: str) -> tuple[int, int]:
    """The server processes of a set of two: the one a lone call goes to (the
    least busy, first), and the one a call goes to while the first is busy."""
    lone = _pid(daemon, name)

    def slow() -> None:
        with daemon.client() as c:
            c.call_tool(name, "slow", {"seconds": 1.0})

    busy = threading.Thread(target=slow)
    upstream = daemon.daemon.pool.get(name)
    busy.start()
    try:
        wait_until(lambda: upstream.in_flight == 1, what="busy")
        other = _pid(daemon, name)
    finally:
        busy.join()
    return lone, other


def test_the_primary_replica_that_dies_hands_over_to_another(
    daemon: DaemonHarness,
) -> None:
    """The primary (the first, to begin with) holds the listing, the tasks and
    the resource subscriptions. When it dies, the next replica in the rotation
    becomes the primary: the set is not replaced, the other replica serves on
    (its process the same), and the dead one is started again alone. Before,
    the primary's death replaced the whole set: every call in flight on the
    others failed, and none was served until the set had started again.
    ``servers/status`` shows the primary's pid (spawned, not forked by the
    zygote: the process is the server's own)."""
    daemon.add(stdio_spec("pool", replicas=2, spawn=True))
    upstream = daemon.daemon.pool.get("pool")
    first, second = _pids(daemon, "pool")
    assert first != second
    os.kill(first, signal.SIGKILL)
    wait_until(lambda: upstream.restarts == 1, what="the loss noticed")
    assert upstream.state == "ready"
    # the heir serves the calls and the listing while the first starts again
    assert _pid(daemon, "pool") == second
    with daemon.client() as c:
        assert "pid" in {t.name for t in c.list_tools("pool", refresh=True)}
        (status,) = c.server_status("pool")
    assert status.state == "ready"
    assert status.pid == second  # the primary's, not the dead first's
    wait_until(  # a real start (import mcp): seconds of CPU, more on a loaded host
        lambda: _pid(daemon, "pool") != second, timeout=60, what="the first back"
    )
    again, other = _pids(daemon, "pool")
    assert again not in (first, second)
    assert other == second  # never replaced
    assert upstream.state == "ready"
    with daemon.client() as c:
        (status,) = c.server_status("pool")
    assert status.pid == second  # the heir stays the primary


def test_a_replica_slower_to_start_than_its_budget_comes_back_later(
    daemon: DaemonHarness,
) -> None:
    """A replica started again alone had the same budget on every try: one
    slower to start than that (an interpreter importing a large SDK on a
    loaded host) never came back. Each of its starts in a row that runs out
    of the budget doubles the next one's, as the set's own start does (the
    set below starts on its second try too)."""
    slow = stdio_spec(
        "pool",
        args=[str(TESTS / "probe_server.py")],
        env={"PROBE": "slow_start", "START_S": "6"},
        protocol="legacy",
        timeout_s=1.0,
        replicas=2,
    )
    daemon.add(slow)
    upstream = daemon.daemon.pool.get("pool")
    lost = upstream._processes[1].pid
    assert lost is not None
    os.kill(lost, signal.SIGKILL)
    with daemon.client() as c:

        def said() -> str:
            return c.server_status("pool")[0].last_error or ""

        wait_until(
            lambda: "the next start has 10 s" in said(),
            timeout=30,
            what="the replica's first start again cut off",
        )
        assert "could not start: no answer to the handshake within 5 s" in said()
        wait_until(lambda: said() == "", timeout=30, what="the replica back")
        (status,) = c.server_status("pool")
    assert status.state == "ready"
    assert upstream._processes[1].pid not in (None, lost)


def test_a_set_with_no_replica_left_is_replaced(daemon: DaemonHarness) -> None:
    daemon.add(stdio_spec("pool", replicas=2))
    upstream = daemon.daemon.pool.get("pool")
    old = _pids(daemon, "pool")
    for pid in old:
        os.kill(pid, signal.SIGKILL)
    wait_until(lambda: upstream.state != "ready", what="the set lost")
    daemon.wait_ready("pool")
    assert not set(_pids(daemon, "pool")) & set(old)


def test_the_heir_of_the_primary_is_subscribed_to_what_it_was(
    daemon: DaemonHarness, tmp_path: Path
) -> None:
    """A resource subscription is the primary's: its heir is subscribed in
    turn, and the updates it sends reach the subscriber."""
    log = tmp_path / "subs.log"
    log.touch()
    # spawned, not forked by the zygote: the process is the server's own
    daemon.add(features_spec("feat", replicas=2, env={"SUB_LOG": str(log)}, spawn=True))
    uri = "feat://watched"
    first = daemon.daemon.pool.get("feat")._processes[0].pid
    assert first is not None
    with daemon.client() as c:
        c.subscribe_resource("feat", uri)
        assert log.read_text().splitlines() == [f"subscribe {uri}"]
        os.kill(first, signal.SIGKILL)
        wait_until(
            lambda: log.read_text().splitlines().count(f"subscribe {uri}") == 2,
            what="the heir subscribed",
        )
        with daemon.client() as operator:
            touched = operator.call_tool("feat", "touch", {"uri": uri})
        assert touched.is_error is False
        update = next(iter(c.resource_updates(15.0)), None)
    assert update is not None
    assert (update.server, update.uri) == ("feat", uri)


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
