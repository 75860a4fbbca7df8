"""SECURITY.md 6.2 #17: a stdio server that misbehaves.

The servers are tests/legacy_server.py (hand-written, no SDK, so it starts
fast) in its fault modes. Covered elsewhere:

* a 10 MB (20 MB) line on stdout: tests/e2e/test_lifecycle.py::test_a_huge_result_does_not_grow_the_daemon,
  tests/daemon/test_reliability.py::test_a_huge_result_is_refused_without_hurting_the_session,
  tests/e2e/test_id_last.py (the id written last);
* a server that exits mid-call:
  tests/daemon/test_reliability.py::test_a_crash_mid_call_fails_that_call_and_the_next_one_succeeds;
* a server that forks a grandchild: tests/e2e/test_lifecycle.py::test_a_crashed_server_leaves_no_orphan,
  ::test_removing_a_server_or_stopping_the_daemon_leaves_no_process_behind;
* a request the SDK cannot encode: tests/daemon/test_deep_arguments.py.
"""

from __future__ import annotations

import itertools
import logging
import math
import sys
import time

import psutil
import pytest

from memorizz.api.errors import UnavailableError
from memorizz.api.methods import ServerSpec
from memorizzd.upstream.stdio import STDERR_LINE_MAX, STDERR_LINES_PER_S
from memorizzd.upstream.supervisor import FAILED_AFTER
from tests.harness import (
    LEGACY_SERVER,
    DaemonHarness,
    daemon_config,
    wait_until,
)

FAST_S = 2.0
"""A generous bound for "stays fast": a warm call takes milliseconds."""


def legacy(name: str, **env: str) -> ServerSpec:
    return ServerSpec(
        name=name,
        transport="stdio",
        command=sys.executable,
        args=[LEGACY_SERVER],
        env=env,
        timeout_s=10.0,
    )


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_junk_lines_on_stdout_are_ignored_and_logged(
    daemon: DaemonHarness, caplog: pytest.LogCaptureFixture
) -> None:
    daemon.add(legacy("noisy", NOISE="1"))
    with daemon.client() as c:
        for _ in range(5):
            result = c.call_tool("noisy", "hello")
            assert result.content[0]["text"] == "hello from legacy"
        assert [t.name for t in c.list_tools("noisy")] == ["hello"]
        assert c.server_status("noisy")[0].restarts == 0
        assert c.server_status("noisy")[0].state == "ready"
    assert any(
        "noisy: ignored a non-JSON-RPC line on stdout" in m for m in caplog.messages
    )


def test_a_stderr_flood_is_rate_limited_truncated_and_counted(
    daemon: DaemonHarness, caplog: pytest.LogCaptureFixture
) -> None:
    """2000 lines of 10 KB: at most 50 lines a second are logged, each cut at
    4 KiB; every other line is counted in a warning that comes even when the
    server falls silent after the flood; its calls stay fast meanwhile."""
    caplog.set_level(logging.INFO, logger="memorizzd.upstream.stderr")
    daemon.add(legacy("flood", STDERR_FLOOD="1"))
    lines = 2000
    with daemon.client() as c:
        c.call_tool("flood", "flood", {"lines": lines, "size": 10_240})
        slowest = 0.0
        for _ in range(20):  # served while its stderr floods
            started = time.monotonic()
            assert c.call_tool("flood", "hello").content
            c.ping()
            slowest = max(slowest, time.monotonic() - started)
        assert slowest < FAST_S, f"a call took {slowest:.2f} s during the flood"

        def accounted() -> int:
            logged = len(_stderr_lines(caplog, "flood"))
            return logged + sum(_dropped(caplog, "flood"))

        # the server is silent now: the count of what was not logged still comes
        wait_until(lambda: accounted() >= lines, timeout=5, what="the dropped count")
        assert accounted() == lines
        assert c.server_status("flood")[0].restarts == 0

    records = _stderr_lines(caplog, "flood")
    for record in records:
        text = record.args[1] if isinstance(record.args, tuple) else ""
        assert isinstance(text, str)
        assert text.endswith(" [truncated]")
        assert len(text) <= STDERR_LINE_MAX + len(" [truncated]")
    span = records[-1].created - records[0].created
    assert len(records) <= STDERR_LINES_PER_S * (math.ceil(span) + 1), (
        len(records),
        span,
    )
    assert len(records) < lines  # most were counted, not logged


def _stderr_lines(
    caplog: pytest.LogCaptureFixture, name: str
) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == "memorizzd.upstream.stderr"
        and r.levelno == logging.INFO
        and r.getMessage().startswith(f"{name}: ")
    ]


def _dropped(caplog: pytest.LogCaptureFixture, name: str) -> list[int]:
    return [
        int(r.getMessage().split()[1])
        for r in caplog.records
        if r.name == "memorizzd.upstream.stderr"
        and r.getMessage().startswith(f"{name}: ")
        and r.getMessage().endswith("stderr lines not logged")
    ]


def test_a_server_that_ignores_sigterm_is_killed_on_removal(
    daemon: DaemonHarness, caplog: pytest.LogCaptureFixture
) -> None:
    """Closing stdin does not end it, nor does SIGTERM: SIGKILL does, in about
    EXIT_GRACE_S + TERM_GRACE_S (4 s)."""
    daemon.add(legacy("stubborn", IGNORE_TERM="1"))
    with daemon.client() as c:
        pid = c.server_status("stubborn")[0].pid
        assert pid is not None
        started = time.monotonic()
        c.remove_server("stubborn")
    wait_until(lambda: _gone(pid), timeout=6, what="the stubborn server's end")
    assert time.monotonic() - started < 6.5
    assert any(
        f"stubborn: pid {pid} ignored SIGTERM; killing" in m for m in caplog.messages
    )
    with daemon.client() as c:
        c.ping()


def test_a_server_that_exits_at_once_backs_off_then_reads_failed(
    base_dir: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Each attempt waits longer (backoff_initial_s doubling, with jitter in
    [0.5, 1], up to backoff_max_s); after FAILED_AFTER failed connects in a row
    the state is ``failed`` (it keeps retrying at backoff_max_s); the daemon
    and its other servers are unaffected."""
    caplog.set_level(logging.INFO, logger="memorizzd.upstream.stdio")
    initial, most = 0.1, 0.8
    config = daemon_config(
        base_dir,
        servers=[legacy("calm")],
        backoff_initial_s=initial,
        backoff_max_s=most,
    )
    with DaemonHarness.running(config) as harness:
        harness.wait_ready("calm")
        seen: list[tuple[str, int]] = []
        with harness.client() as c:
            c.add_server(legacy("quitter", EXIT_AT_ONCE="1"))

            def failed() -> bool:
                status = c.server_status("quitter")[0]
                seen.append((status.state, status.restarts))
                return status.state == "failed"

            wait_until(failed, timeout=15, what="the state failed")
            with pytest.raises(UnavailableError) as err:
                c.call_tool("quitter", "hello")
            assert err.value.reason == "server_unavailable"
            assert c.call_tool("calm", "hello").content
            assert c.server_status("calm")[0].restarts == 0
            c.ping()
        events = [
            ("failed" if "connection failed" in r.getMessage() else "start", r.created)
            for r in caplog.records
            if r.getMessage().startswith(
                ("quitter: started pid", "quitter: connection failed")
            )
        ]
    assert all(
        restarts < FAILED_AFTER for state, restarts in seen if state == "backoff"
    )
    assert all(
        restarts >= FAILED_AFTER for state, restarts in seen if state == "failed"
    )
    # the wait between a failed connect and the next start: the backoff itself
    waits = [
        start - failure
        for (kind, failure), (next_kind, start) in itertools.pairwise(events)
        if kind == "failed" and next_kind == "start"
    ]
    assert len(waits) >= FAILED_AFTER - 1, events
    for attempt, wait in enumerate(waits, start=1):
        base = min(most, initial * 2 ** (attempt - 1))
        assert base * 0.5 <= wait < base + FAST_S, (attempt, waits)
    # so the fourth wait is at least 0.4 s where the first was at most 0.1 s
