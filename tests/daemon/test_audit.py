"""The audit trail: one record per call and per operator action, never a value."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from memorizz.api.errors import (
    DeadlineExceededError,
    NotFoundError,
    PermissionDeniedError,
    TooLargeError,
)
from tests.harness import DaemonHarness, daemon_config, light_spec, stdio_spec

MARKER = "zebra-7c1f-MARKER-value"


@pytest.fixture
def audited(base_dir: str) -> DaemonHarness:
    config = daemon_config(
        base_dir,
        servers=[stdio_spec("t", max_result_bytes=100_000, block_tools=["crash"])],
    )
    with DaemonHarness.running(config) as harness:
        harness.wait_ready("t")
        yield harness


def test_every_call_leaves_one_record_with_its_outcome(audited: DaemonHarness) -> None:
    with audited.client() as c:
        c.call_tool("t", "echo", {"text": MARKER})
        c.call_tool("t", "fail", {"reason": MARKER})
        with pytest.raises(DeadlineExceededError):
            c.call_tool("t", "slow", {"seconds": 5}, timeout_s=0.2)
        with pytest.raises(TooLargeError):
            c.call_tool("t", "huge", {"n_bytes": 500_000})
        with pytest.raises(PermissionDeniedError):
            c.call_tool("t", "crash")
        with pytest.raises(NotFoundError):
            c.call_tool("nope", "echo", {"text": MARKER})
        records = c.audit().records
    calls = [r for r in records if r.action == "tools/call"]
    assert [(r.tool, r.outcome, r.reason) for r in reversed(calls)] == [
        ("echo", "ok", None),
        ("fail", "tool_error", None),
        ("slow", "timeout", "timeout"),
        ("huge", "result_too_large", "result_too_large"),
        ("crash", "denied", "tool_blocked"),
        ("echo", "denied", "unknown_server"),
    ]
    ok = calls[-1]
    assert ok.argument_keys == ["text"]
    assert ok.result_bytes is not None
    assert ok.result_bytes > len(MARKER)
    assert ok.caller_pid == os.getpid()
    assert ok.caller_uid == os.getuid()
    assert ok.caller_socket == audited.socket
    assert ok.duration_ms > 0
    # Equal arguments, equal digests (correlation); the value itself is not there.
    assert calls[0].arguments_hmac == ok.arguments_hmac
    assert calls[-2].arguments_hmac != ok.arguments_hmac
    assert len(ok.arguments_hmac or "") == 64


def test_no_argument_value_reaches_the_database_or_the_logs(
    audited: DaemonHarness, base_dir: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("DEBUG", logger="memorizzd"), audited.client() as c:
        c.call_tool("t", "echo", {"text": MARKER})
        c.call_tool("t", "fail", {"reason": MARKER})
        with pytest.raises(NotFoundError):
            c.call_tool("nope", "echo", {"text": MARKER})
        assert len(c.audit().records) >= 3
    state = Path(base_dir, "state")
    files = [p for p in state.iterdir() if p.is_file()]
    assert any(p.name == "state.db" for p in files)
    for path in files:
        assert MARKER.encode() not in path.read_bytes(), path
    assert not [m for m in caplog.messages if MARKER in m]


def test_operator_actions_are_audited_and_the_trail_pages(
    daemon: DaemonHarness,
) -> None:
    with daemon.client() as c:
        for i in range(3):
            c.add_server(light_spec(f"s{i}"))
        c.remove_server("s1")
        with pytest.raises(NotFoundError):
            c.remove_server("s1")
        first = c.audit(limit=2)
        assert [(r.action, r.server, r.outcome) for r in first.records] == [
            ("servers/remove", "s1", "failed"),
            ("servers/remove", "s1", "ok"),
        ]
        assert first.next_before_id is not None
        rest = c.audit(before_id=first.next_before_id)
        assert [(r.action, r.server) for r in rest.records] == [
            ("servers/add", "s2"),
            ("servers/add", "s1"),
            ("servers/add", "s0"),
        ]
        assert rest.next_before_id is None
        assert [r.server for r in c.audit(server="s0").records] == ["s0"]
        assert len(c.audit(outcome="failed").records) == 1


def test_the_trail_is_append_only(daemon: DaemonHarness, base_dir: str) -> None:
    with daemon.client() as c:
        c.add_server(light_spec("x"))
        assert c.audit().records  # read: the spooled record is in the database
    db = sqlite3.connect(Path(base_dir, "state", "state.db"))
    try:
        for sql in ("UPDATE audit SET outcome = 'ok'", "DELETE FROM audit"):
            with pytest.raises(sqlite3.DatabaseError, match="append-only"):
                db.execute(sql)
    finally:
        db.close()


def test_memorizzctl_shows_the_trail(
    audited: DaemonHarness, capsys: pytest.CaptureFixture[str]
) -> None:
    with audited.client() as c:
        c.call_tool("t", "echo", {"text": "x"})
    capsys.readouterr()
    assert audited.ctl("audit", "--server", "t", "--limit", "5") == 0
    out = capsys.readouterr().out
    assert "tools/call" in out
    assert "echo" in out
    assert "ok" in out


def test_the_audit_key_is_private_and_stable(base_dir: str) -> None:
    from memorizzd.audit import load_key

    state = os.path.join(base_dir, "state")
    os.makedirs(state)
    key = load_key(state)
    assert load_key(state) == key
    assert os.stat(os.path.join(state, "audit.key")).st_mode & 0o777 == 0o600


def test_records_carry_the_policy_verdict(audited: DaemonHarness) -> None:
    with audited.client() as c:
        c.call_tool("t", "echo", {"text": "x"})
        with pytest.raises(PermissionDeniedError):
            c.call_tool("t", "crash")
        echo, crash = (
            c.audit(tool=name, limit=1).records[0] for name in ("echo", "crash")
        )
    assert (echo.risk, echo.decision, echo.outcome) == ("write", "allow", "ok")
    assert (crash.decision, crash.outcome, crash.reason) == (
        "deny",
        "denied",
        "tool_blocked",
    )


def test_concurrent_calls_share_commits_and_lose_no_record(
    audited: DaemonHarness,
) -> None:
    import threading

    def worker() -> None:
        with audited.client() as c:
            for i in range(10):
                c.call_tool("t", "echo", {"text": str(i)})

    threads = [threading.Thread(target=worker) for _ in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    with audited.client() as c:
        records = c.audit(tool="echo", limit=1000).records
    assert len(records) == 100
    assert len({r.id for r in records}) == 100
    assert {r.outcome for r in records} == {"ok"}
