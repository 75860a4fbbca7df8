"""Structured logs (issue 13, item 6): ``memorizzd --log-format json`` writes
one JSON object per line (time in RFC 3339 UTC, level, logger, message and the
records' fields without their ``MEMORIZZ_`` prefix), with a line for every
call and every upstream state change; never an argument value."""

from __future__ import annotations

import subprocess
from datetime import datetime
from typing import Any

import msgspec

from tests.harness import DAEMON_EXE, daemon_process, light_spec, wait_until

SECRET = "sk-never-in-a-log-4711"  # noqa: S105 - a test marker


def lines(log: str) -> list[dict[str, Any]]:
    # every line is one object
    return [msgspec.json.decode(line) for line in log.splitlines() if line.strip()]


def test_json_logs_carry_the_fields_of_a_call_and_a_state_change(
    base_dir: str,
) -> None:
    with daemon_process(base_dir, "--log-format", "json") as d:
        with d.client() as c:
            c.add_server(light_spec("lite"))
        d.wait_ready("lite")
        with d.client() as c:
            c.call_tool("lite", "hello", {"token": SECRET})

        def audited() -> bool:
            return any(r.get("action") == "tools/call" for r in lines(d.log()))

        wait_until(audited, timeout=10, what="the call's log line")
        assert d.stop() == 0
        log = d.log()
    assert SECRET not in log
    records = lines(log)
    for record in records:
        assert {"time", "level", "logger", "message"} <= record.keys()
        when = datetime.fromisoformat(record["time"])
        assert record["time"].endswith("Z")
        assert when.utcoffset() is not None
        assert when.utcoffset().total_seconds() == 0  # type: ignore[union-attr]
    (call,) = [r for r in records if r.get("action") == "tools/call"]
    assert call["logger"] == "memorizzd.audit"
    assert call["level"] == "info"
    assert {
        k: call[k] for k in ("server", "tool", "profile", "outcome", "proposal")
    } == {
        "server": "lite",
        "tool": "hello",
        "profile": "operator",
        "outcome": "ok",
        "proposal": "",
    }
    assert not any(k.startswith("MEMORIZZ_") for r in records for k in r)
    states = [(r["server"], r["state"]) for r in records if "state" in r]
    # every state, the first connect's too (it was the initial state: unlogged)
    assert states[:2] == [("lite", "connecting"), ("lite", "ready")]
    assert ("lite", "stopped") in states


def test_an_unknown_log_format_is_a_usage_error(base_dir: str) -> None:
    done = subprocess.run(
        [DAEMON_EXE, "--log-format", "xml", "--check-config"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert "invalid log format 'xml': use text or json" in done.stderr
