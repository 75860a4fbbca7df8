"""journald's structured fields (issue 13, item 6): under systemd the daemon
logs through systemd-python's journal handler, and every call and upstream
state change carries ``MEMORIZZ_*`` fields (``journalctl MEMORIZZ_SERVER=x``).

The logging set-up is the daemon's own (``setup_logging`` with
``$JOURNAL_STREAM`` set); only the edge is a stand-in: ``systemd.journal.send``,
which would write to a journal this machine may not have."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from typing import Any

import pytest

journal = pytest.importorskip("systemd.journal")

from memorizzd.sdnotify import setup_logging
from memorizzd.telemetry.logs import JsonFormatter, fields_kept
from tests.harness import DaemonHarness, daemon_config, light_spec

SECRET = "sk-never-in-the-journal-4711"  # noqa: S105 - a test marker


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, Any]]]:
    """What the journal handler sends, each entry as its fields."""
    entries: list[dict[str, Any]] = []

    def send(message: str, **fields: Any) -> None:
        entries.append({"MESSAGE": message, **fields})

    monkeypatch.setattr(journal, "send", send)
    monkeypatch.setenv("JOURNAL_STREAM", "8:4711")
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        setup_logging("info")
        yield entries
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def test_calls_and_state_changes_reach_the_journal_with_their_fields(
    sent: list[dict[str, Any]], base_dir: str
) -> None:
    assert fields_kept()
    config = daemon_config(base_dir, servers=[light_spec("lite")])
    with DaemonHarness.running(config) as harness:
        harness.wait_ready("lite")
        with harness.client() as c:
            c.call_tool("lite", "hello", {"token": SECRET})
    assert all(e["SYSLOG_IDENTIFIER"] == "memorizzd" for e in sent)
    assert not any(SECRET in str(value) for e in sent for value in e.values())
    (call,) = [e for e in sent if e.get("MEMORIZZ_ACTION") == "tools/call"]
    assert {
        k: call[k]
        for k in (
            "MEMORIZZ_SERVER",
            "MEMORIZZ_TOOL",
            "MEMORIZZ_PROFILE",
            "MEMORIZZ_OUTCOME",
            "MEMORIZZ_PROPOSAL",
        )
    } == {
        "MEMORIZZ_SERVER": "lite",
        "MEMORIZZ_TOOL": "hello",
        "MEMORIZZ_PROFILE": "operator",
        "MEMORIZZ_OUTCOME": "ok",
        "MEMORIZZ_PROPOSAL": "",
    }
    assert call["PRIORITY"] == "6"  # info
    states = [
        (e["MEMORIZZ_SERVER"], e["MEMORIZZ_STATE"])
        for e in sent
        if "MEMORIZZ_STATE" in e
    ]
    assert states[:2] == [("lite", "connecting"), ("lite", "ready")]
    assert states[-1] == ("lite", "stopped")


def test_json_lines_name_the_fields_without_their_prefix_and_the_exception() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord(
            "memorizzd.upstream",
            logging.WARNING,
            __file__,
            1,
            "%s: lost",
            ("x",),
            sys.exc_info(),
        )
    record.MEMORIZZ_SERVER = "x"
    record.MEMORIZZ_STATE = "backoff"
    import msgspec

    line = msgspec.json.decode(JsonFormatter().format(record))
    assert line["message"] == "x: lost"
    assert line["level"] == "warning"
    assert (line["server"], line["state"]) == ("x", "backoff")
    assert line["exc"].startswith("Traceback")
    assert "ValueError: boom" in line["exc"]
