"""memorizzctl says every error one way (issue 13, item 9).

Without ``--json``: ``memorizzctl: error: MSG`` on stderr (a usage error after
its usage line); with ``--json``: one line on stdout,
``{"error": {"message", "reason", "data"}}``, and nothing on stderr; the exit
status is the same either way. The daemon's errors come from a real daemon;
``mcp serve`` says its errors on stderr even with ``--json`` (stdout is MCP's).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest

from memorizz import cli
from memorizzd.config import Profile
from tests.harness import DaemonHarness, daemon_config, short_tempdir, stdio_spec


@pytest.fixture(scope="module")
def harness() -> Iterator[DaemonHarness]:
    base = short_tempdir()
    config = daemon_config(
        base,
        servers=[stdio_spec("alpha")],
        profiles=[Profile(name="bot", servers=["alpha"], uids=[os.getuid()])],
    )
    with DaemonHarness.running(config) as harness:
        harness.wait_ready("alpha")
        yield harness


@pytest.fixture
def missing() -> str:
    return os.path.join(short_tempdir(), "none.sock")


def _json_error(out: str) -> dict[str, Any]:
    assert out.endswith("\n")
    assert out.count("\n") == 1, out  # one line
    body: dict[str, Any] = msgspec.json.decode(out)
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "reason", "data"}
    return body["error"]


@pytest.mark.parametrize(
    ("argv", "usage", "message"),
    [
        (  # argparse's own
            ["mcp", "call", "alpha"],
            "usage: memorizzctl mcp call ",
            "the following arguments are required: TOOL",
        ),
        (
            ["mcp", "frob"],
            "usage: memorizzctl mcp ",
            "argument COMMAND: invalid choice",
        ),
        (  # a command's UsageError
            ["mcp", "serve", "--listen", "127.0.0.1:1"],
            "usage: memorizzctl mcp serve ",
            "--listen, --token-file and --allow-remote go with --transport",
        ),
    ],
)
def test_a_usage_error_is_its_usage_then_one_error_line_or_json(
    argv: list[str],
    usage: str,
    message: str,
    missing: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["--socket", missing, *argv]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(usage), err
    last = err.splitlines()[-1]
    assert last.startswith(f"memorizzctl: error: {message}"), err

    assert cli.main(["--socket", missing, *argv, "--json"]) == 2
    out, err = capsys.readouterr()
    assert err == ""
    error = _json_error(out)
    assert error["message"].startswith(message)
    assert (error["reason"], error["data"]) == ("usage", {})


def test_an_unreachable_daemon_is_one_error_line_or_json_exit_69(
    missing: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["--socket", missing, "mcp", "list"]) == 69
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"memorizzctl: error: cannot reach memorizzd at {missing}")
    assert err.count("\n") == 1

    for argv in (["mcp", "list"], ["mcp", "call", "alpha", "echo"]):  # one-shot too
        assert cli.main(["--json", "--socket", missing, *argv]) == 69
        out, err = capsys.readouterr()
        assert err == ""
        error = _json_error(out)
        assert error["reason"] == "daemon_unreachable"
        assert error["data"] == {"socket": missing}
        assert missing in error["message"]


def test_the_daemons_error_carries_its_reason_and_data(
    harness: DaemonHarness, capsys: pytest.CaptureFixture[str]
) -> None:
    assert harness.ctl("mcp", "tools", "nosuch") == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err == "memorizzctl: error: unknown server 'nosuch' (unknown_server)\n"

    assert harness.ctl("mcp", "tools", "nosuch", "--json") == 1
    out, err = capsys.readouterr()
    assert err == ""
    error = _json_error(out)
    assert error["message"] == "unknown server 'nosuch'"
    assert error["reason"] == "unknown_server"


def test_a_call_that_needs_approval_says_how_to_approve_it(
    harness: DaemonHarness, capsys: pytest.CaptureFixture[str]
) -> None:
    """``record`` is destructive: decided ``ask``; the one-shot call's error
    reply is read the general way."""
    call = ("mcp", "call", "alpha", "record", "--arguments", '{"tag": "e"}')
    assert harness.ctl(*call) == 1
    out, err = capsys.readouterr()
    assert out == ""
    first, second = err.splitlines()
    assert first.startswith("memorizzctl: error: ")
    assert first.endswith("(approval_required)")
    assert second.startswith("  an operator approves with `memorizzctl mcp approve ")

    assert harness.ctl("--json", *call) == 1
    out, err = capsys.readouterr()
    assert err == ""
    error = _json_error(out)
    assert error["reason"] == "approval_required"
    proposal = error["data"]["proposal_id"]
    assert f"memorizzctl mcp approve {proposal}" not in error["message"]
    with harness.client() as c:
        assert {p.id for p in c.list_approvals(status="pending")} >= {proposal}


def test_a_tool_error_result_has_the_same_prefix(
    harness: DaemonHarness, capsys: pytest.CaptureFixture[str]
) -> None:
    for call in (  # the one-shot way, and the general one (--verbose)
        ("mcp", "call", "alpha", "fail", "--arguments", '{"reason": "nope"}'),
        ("mcp", "call", "alpha", "fail", "--arguments", '{"reason": "nope"}', "-v"),
    ):
        assert harness.ctl(*call) == 1
        out, err = capsys.readouterr()
        assert out == ""
        assert err.startswith("memorizzctl: error: "), err
        assert "nope" in err


def test_mcp_serve_says_its_errors_on_stderr_even_with_json(
    missing: str, capfd: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["--json", "--socket", missing, "mcp", "serve"]) == 69
    out, err = capfd.readouterr()
    assert out == ""  # stdout is MCP's
    # the API socket it was told about is not there: said before the face's
    assert err.startswith(f"memorizzctl: error: cannot reach memorizzd at {missing}: ")
    assert err.count("\n") == 1
