"""A socket ``tools/call`` that carries ``progress_token`` gets the upstream's
progress as ``notifications/progress`` lines before its reply (issue 11, item
6); one without gets exactly the reply, as before. Through a real daemon, the
SDK test server's ``progressing`` tool (``ctx.report_progress``), the real
``Client`` and ``memorizzctl mcp call`` (one-shot and general paths)."""

from __future__ import annotations

import io
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import msgspec
import pytest

from memorizz.api import methods as m
from memorizz.api.errors import DaemonUnreachableError
from tests.harness import (
    DaemonHarness,
    daemon_config,
    rmtree,
    short_tempdir,
    stdio_spec,
)
from tests.process import MEMORIZZCTL

STEPS = [(1.0, 3.0, "step 1"), (2.0, 3.0, "step 2"), (3.0, 3.0, "step 3")]
SHOWN = "progress: 1/3 (33%)  step 1\nprogress: 2/3 (67%)  step 2\nprogress: 3/3 (100%)  step 3\n"


@pytest.fixture(scope="module")
def harness() -> Iterator[DaemonHarness]:
    base = short_tempdir()
    try:
        config = daemon_config(base, servers=[stdio_spec("t")])
        with DaemonHarness.running(config) as running:
            running.wait_ready("t")
            yield running
    finally:
        rmtree(base)


def _lines(
    sock: socket.socket, lines: BinaryIO, request: bytes, until_id: object
) -> list[dict[str, Any]]:
    """Send ``request``; every line read up to the reply to ``until_id``."""
    sock.sendall(request + b"\n")
    seen: list[dict[str, Any]] = []
    for line in lines:
        seen.append(msgspec.json.decode(line))
        if seen[-1].get("id") == until_id:
            return seen
    raise AssertionError(f"no reply to {until_id}: {seen}")


def test_the_client_gets_each_report_in_order_then_the_result(
    harness: DaemonHarness,
) -> None:
    reports: list[m.ProgressParams] = []
    with harness.client() as client:
        result = client.call_tool(
            "t", "progressing", {"steps": 3}, on_progress=reports.append
        )
        again: list[m.ProgressParams] = []
        second = client.call_tool(
            "t", "progressing", {"steps": 1}, on_progress=again.append
        )
        assert client.ping().latency_ms >= 0  # the connection is in step
    assert result.content == [{"type": "text", "text": "done in 3 steps"}]
    assert [(r.progress, r.total, r.message) for r in reports] == STEPS
    assert {r.progress_token for r in reports} == {1}
    assert second.content[0]["text"] == "done in 1 steps"
    assert [(r.progress_token, r.progress) for r in again] == [(2, 1.0)]


def test_a_call_without_a_token_gets_only_its_reply(harness: DaemonHarness) -> None:
    """An old client's bytes (no ``progress_token``): the reply is the next
    line, and the next request's reply the one after (nothing in between)."""
    old = (
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":'
        b'{"server":"t","name":"progressing","arguments":{"steps":3}}}'
    )
    ping = b'{"jsonrpc":"2.0","id":2,"method":"ping","params":{}}'
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(harness.socket)
        with sock.makefile("rb") as lines:
            seen = _lines(sock, lines, old, 1) + _lines(sock, lines, ping, 2)
    assert [line.get("id") for line in seen] == [1, 2]
    assert seen[0]["result"]["content"] == [{"type": "text", "text": "done in 3 steps"}]


def test_the_wire_carries_the_callers_token_snake_case(harness: DaemonHarness) -> None:
    request = (
        b'{"jsonrpc":"2.0","id":"c1","method":"tools/call","params":{"server":"t",'
        b'"name":"progressing","arguments":{"steps":2},"progress_token":"job-7"}}'
    )
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(harness.socket)
        with sock.makefile("rb") as lines:
            seen = _lines(sock, lines, request, "c1")
    assert seen[:-1] == [
        {
            "jsonrpc": "2.0",
            "method": "notifications/progress",
            "params": {
                "progress_token": "job-7",
                "progress": n,
                "total": 2,
                "message": f"step {n}",
            },
        }
        for n in (1, 2)
    ]
    assert seen[-1]["result"]["content"] == [
        {"type": "text", "text": "done in 2 steps"}
    ]


def test_a_callback_that_raises_stops_the_call_and_the_client_goes_on(
    harness: DaemonHarness,
) -> None:
    def fail(report: m.ProgressParams) -> None:
        raise OSError("stderr is gone")

    with harness.client() as client:
        with pytest.raises(OSError, match="stderr is gone") as raised:
            client.call_tool("t", "progressing", {"steps": 2}, on_progress=fail)
        assert not isinstance(raised.value, DaemonUnreachableError)
        result = client.call_tool(
            "t", "progressing", {"steps": 1}
        )  # a fresh connection
    assert result.content[0]["text"] == "done in 1 steps"


# --- memorizzctl mcp call -------------------------------------------------------


def test_memorizzctl_prints_progress_on_stderr_and_the_result_on_stdout(
    harness: DaemonHarness, capsys: pytest.CaptureFixture[str]
) -> None:
    """The plain line goes the one-shot way."""
    status = harness.ctl(
        "mcp", "call", "t", "progressing", "--arguments", '{"steps": 3}'
    )
    out, err = capsys.readouterr()
    assert (status, out, err) == (0, "done in 3 steps\n", SHOWN)


def test_arguments_from_a_file(
    harness: DaemonHarness, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``@FILE`` goes the general way (argparse reads the file): same output."""
    path = tmp_path / "args.json"
    path.write_text('{\n  "steps": 3\n}\n')
    status = harness.ctl("mcp", "call", "t", "progressing", "--arguments", f"@{path}")
    out, err = capsys.readouterr()
    assert (status, out, err) == (0, "done in 3 steps\n", SHOWN)


def test_arguments_from_stdin_in_the_real_executable(harness: DaemonHarness) -> None:
    done = subprocess.run(
        [
            MEMORIZZCTL,
            "--socket",
            harness.socket,
            "mcp",
            "call",
            "t",
            "progressing",
            "--arguments",
            "-",
        ],
        input='{"steps": 3}',
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert (done.returncode, done.stdout, done.stderr) == (
        0,
        "done in 3 steps\n",
        SHOWN,
    )


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (None, "cannot read"),
        ("[1, 2]", "must be a JSON object, got an array"),
        ("{nope", "not valid JSON"),
        (b"\xff\xfe", "not UTF-8 text"),
    ],
)
def test_a_bad_arguments_file_is_a_usage_error(
    content: str | bytes | None,
    said: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from memorizz import cli

    path = tmp_path / "args.json"
    if isinstance(content, str):
        path.write_text(content)
    elif content is not None:
        path.write_bytes(content)
    missing = os.path.join(tmp_path, "no.sock")  # never reached: parsing fails first
    argv = ["--socket", missing, "mcp", "call", "s", "t", "--arguments", f"@{path}"]
    assert cli.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert "usage:" in err
    assert said in err


def test_arguments_from_stdin_in_process(
    harness: DaemonHarness,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO('{"steps": 1}'))
    status = harness.ctl(
        "--json", "mcp", "call", "t", "progressing", "--arguments", "-"
    )
    out, err = capsys.readouterr()
    assert status == 0
    assert msgspec.json.decode(out)["content"][0]["text"] == "done in 1 steps"
    assert err == "progress: 1/1 (100%)  step 1\n"
