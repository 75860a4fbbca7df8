"""The one-shot ``memorizzctl mcp call``: what it imports, and that it says what
the general path says.

``memorizz.ctl.oneshot`` reads a plain ``mcp call`` line by hand, talks to the
socket with ``_socket`` and ``_json`` and prints a text-only result itself;
everything else goes the general way (argparse, ``Client``, renderers). These
tests hold the import set of the installed entry point (a structure, not a
timing: the time is in ``scripts/bench``), and check the hand-written parts
against the general ones, line by line and reply by reply.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from memorizz import cli
from memorizz.api import methods as m
from memorizz.api.errors import MemorizzError
from memorizz.api.paths import default_socket_path
from memorizz.api.replies import decode_reply
from memorizz.ctl import oneshot, run
from memorizz.ctl.commands import show_call
from memorizz.ctl.parser import build_parser
from tests.harness import (
    DaemonHarness,
    daemon_config,
    rmtree,
    short_tempdir,
    stdio_spec,
)
from tests.process import MEMORIZZCTL

"""The installed console script: what users run."""
TINY_ECHO_SERVER = str(Path(__file__).parents[2] / "bench" / "tiny_echo_server.py")

HEAVY = frozenset(
    {
        # the daemon's world
        "anyio", "asyncio", "uvloop", "ssl", "mcp", "mcp_types", "pydantic",
        "httpx2", "cryptography", "memorizzd",
        # the general path's
        "msgspec", "argparse", "typing", "json", "socket", "re", "enum",
        "email", "uuid", "inspect", "importlib.metadata", "http",
    }
)  # fmt: skip
ONE_SHOT_MODULES = frozenset(
    {
        "memorizz",
        "memorizz.api",
        "memorizz.api.paths",
        "memorizz.cli",
        "memorizz.ctl",
        "memorizz.ctl.run",
        "memorizz.ctl.oneshot",
        "memorizz.ctl.exits",
    }
)


@pytest.fixture(scope="module")
def warm() -> Iterator[DaemonHarness]:
    """A daemon with a warm echo server ``t``: the benchmark's minimal one,
    which starts in a tenth of the SDK server's time (the SDK server's
    results go through the one-shot path in tests/e2e/test_cli_e2e.py's tour)."""
    base = short_tempdir()
    try:
        spec = stdio_spec("t", args=[TINY_ECHO_SERVER], protocol="legacy")
        config = daemon_config(base, servers=[spec])
        with DaemonHarness.running(config) as harness:
            harness.wait_ready("t")
            yield harness
    finally:
        rmtree(base)


def _imported(importtime: str) -> set[str]:
    """The modules ``-X importtime`` (``PYTHONPROFILEIMPORTTIME``) reports."""
    names = set()
    for line in importtime.splitlines():
        if line.startswith("import time:") and "|" in line:
            name = line.rsplit("|", 1)[1].strip()
            if name != "imported package":
                names.add(name)
    return names


def test_a_one_shot_call_imports_no_heavy_module(warm: DaemonHarness) -> None:
    argv = ["--socket", warm.socket, "mcp", "call", "t", "echo", "--arguments"]
    done = subprocess.run(
        [MEMORIZZCTL, *argv, '{"text": "hi"}'],
        env={**os.environ, "PYTHONPROFILEIMPORTTIME": "1"},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert (done.returncode, done.stdout) == (0, "hi\n"), done.stderr
    imported = _imported(done.stderr)
    heavy = {
        name for name in imported if name in HEAVY or name.partition(".")[0] in HEAVY
    }
    assert not heavy, sorted(heavy)
    ours = {name for name in imported if name.partition(".")[0] == "memorizz"}
    assert ours == ONE_SHOT_MODULES


def test_other_commands_still_import_the_general_path(warm: DaemonHarness) -> None:
    """The import check above would pass vacuously if nothing was imported at
    all: the same probe sees argparse and msgspec for ``mcp list``."""
    done = subprocess.run(
        [MEMORIZZCTL, "--socket", warm.socket, "mcp", "list"],
        env={**os.environ, "PYTHONPROFILEIMPORTTIME": "1"},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    imported = _imported(done.stderr)
    assert {"argparse", "msgspec", "memorizz.client"} <= imported
    assert "memorizz.ctl.login" not in imported  # http.server: only for `mcp login`


# --- the line: the hand parser against argparse ----------------------------------

ACCEPTED = [
    ["mcp", "call", "s", "t"],
    ["--socket", "/x.sock", "mcp", "call", "s", "t"],
    ["mcp", "--socket", "/a", "call", "s", "t", "--socket=/b"],
    ["--socket=/a", "mcp", "call", "--socket", "/b", "s", "--socket=/c", "t"],
    ["mcp", "call", "--timeout", "2", "s", "t"],
    ["mcp", "call", "s", "t", "--timeout=1e3", "--timeout", " 7.5 "],
    ["mcp", "call", "s", "--arguments", '{"a": [1, 2.5, null, true, "é\\n"]}', "t"],
    ["mcp", "call", "s", "t", "--arguments=  {\n}\n"],
    ["mcp", "call", "s", "t", "--arguments", '{"a":1}', "--arguments", '{"b":2}'],
    ["mcp", "call", "s", "t", "--arguments", '{"n": 123456789012345678901234567890}'],
    ["mcp", "call", "s", "t", "--arguments", '{"a": 1, "a": 2, "t": "\\u00e9\\/"}'],
    ["mcp", "call", "s", "t", "--arguments", '{"x": {"y": [[], {}]}, "z": -0.0}'],
    ["--json", "mcp", "call", "s", "t"],
    ["mcp", "call", "s", "t", "--json"],
    ["mcp", "call", "", "t"],
    ["mcp", "call", "café", "tool name"],
]

DECLINED = [
    [],
    ["mcp", "list"],
    ["mcp", "call", "s"],
    ["mcp", "call", "s", "t", "u"],
    ["call", "s", "t"],
    ["mcp", "call", "s", "t", "--arguments", "[1]"],
    ["mcp", "call", "s", "t", "--arguments", "{nope"],
    ["mcp", "call", "s", "t", "--arguments", '{"a":1} x'],
    ["mcp", "call", "s", "t", "--arguments", '{"x": NaN}'],
    ["mcp", "call", "s", "t", "--arguments", '{"x": 1e400}'],
    ["mcp", "call", "s", "t", "--arguments", '{"x": "\\ud800"}'],
    ["mcp", "call", "s", "t", "--arguments", '{"x": 01}'],
    ["mcp", "call", "s", "t", "--arguments", '{"x": "a\x01"}'],
    ["mcp", "call", "s", "t", "--arguments", "-1"],
    ["mcp", "call", "s", "t", "--arguments="],
    ["mcp", "call", "s", "t", "--timeout", "0"],
    ["mcp", "call", "s", "t", "--timeout", "-1"],
    ["mcp", "call", "s", "t", "--timeout", "nan"],
    ["mcp", "call", "s", "t", "--timeout", "inf"],
    ["mcp", "call", "s", "t", "--timeout", "soon"],
    ["mcp", "call", "s", "t", "--timeout", "3601"],  # the daemon's limit: 3600
    ["mcp", "call", "s", "t", "--socket="],  # an empty path is a usage error
    ["--socket", "", "mcp", "call", "s", "t"],
    ["mcp", "call", "s", "t", "--timeout", "0", "--timeout", "5"],
    ["mcp", "call", "s", "t", "--arguments", "[1]", "--arguments", "{}"],
    ["mcp", "--arguments", "{}", "call", "s", "t"],
    ["--timeout", "1", "mcp", "call", "s", "t"],
    ["mcp", "call", "s", "t", "--json=1"],
    ["mcp", "call", "s", "t", "--arg", "{}"],
    ["mcp", "call", "s", "t", "--socket"],
    ["mcp", "call", "s", "t", "--socket", "--json"],
    ["mcp", "call", "-s", "t"],
    ["mcp", "call", "s", "t", "--"],
    ["mcp", "call", "s", "t", "-h"],
    ["mcp", "call", "--help"],
    ["mcp", "call", "s", "\udcff"],
]


def _argparse(argv: list[str]) -> argparse.Namespace | None:
    """What the general path parses, or ``None`` where it reports a usage error."""
    try:
        return build_parser().parse_args(argv)
    except SystemExit:
        return None


def _expected_line(args: argparse.Namespace) -> dict[str, Any]:
    """The request ``Client.call_tool`` sends for this line (memorizzctl asks
    for progress: its first token), decoded."""
    params = m.ToolsCallParams(
        server=args.server,
        name=args.tool,
        arguments=args.arguments,
        timeout_s=args.timeout,
        progress_token=1,
    )
    envelope = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}
    decoded: dict[str, Any] = msgspec.json.decode(msgspec.json.encode(envelope))
    for key in ("task", "_meta"):  # a plain call's: absent and null are one
        if decoded["params"].get(key) is None:
            decoded["params"].pop(key, None)
    return decoded


@pytest.mark.parametrize("argv", ACCEPTED)
def test_the_hand_parser_reads_a_plain_call_as_argparse_does(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    call = oneshot.parse(argv)
    args = _argparse(argv)
    assert call is not None
    assert args is not None, capsys.readouterr().err
    assert call.socket_path == (getattr(args, "socket", None) or default_socket_path())
    assert call.as_json == bool(getattr(args, "json", False))
    assert call.line.endswith(b"\n")
    assert call.line.count(b"\n") == 1  # one NDJSON line, whatever the input held
    assert msgspec.json.decode(call.line) == _expected_line(args)


@pytest.mark.parametrize("argv", DECLINED)
def test_the_hand_parser_leaves_everything_else_to_argparse(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Usage errors, help and unusual JSON: argparse (and msgspec) say what is wrong."""
    assert oneshot.parse(argv) is None


# --- the reply: the hand renderer against the general one -------------------------


def _reply(result: object, **envelope: object) -> bytes:
    fields: dict[str, object] = {"jsonrpc": "2.0", "id": 1, "result": result}
    fields.update(envelope)
    return msgspec.json.encode(fields)


def _text(text: str) -> dict[str, str]:
    return {"type": "text", "text": text}


SHOWN = [
    _reply({"content": [_text("hi")]}),
    _reply({"content": [_text("a\n"), _text(""), _text("b\n\n")], "isError": False}),
    _reply({"content": [_text("bad query")], "isError": True}),
    _reply({"content": [_text("3")], "structuredContent": {"result": 3}}),
    _reply({"content": [_text("x")], "_meta": {"k": 1}, "extra": [1]}),
    _reply({"content": [_text("é \u2603 \x1b[31m")]}),
    b'{"id":1,"result":{"content":[{"text":"last","type":"text"}]},"jsonrpc":"2.0"}',
]

NOT_SHOWN = [
    _reply({"content": []}),
    _reply({"content": [], "isError": True}),
    _reply({"content": [], "structuredContent": {"result": 3}}),
    _reply({"content": [{"type": "image", "data": "AAAA", "mimeType": "image/png"}]}),
    _reply({"content": [_text("a"), {"type": "resource_link", "uri": "x://y"}]}),
    _reply({"content": [{"type": "text"}]}),
    _reply({"content": [{"type": "text", "text": 3}]}),
    _reply({"content": [_text("x")], "isError": 1}),
    _reply({"content": [_text("x")], "structuredContent": [1]}),
    _reply({"content": [_text("x")], "_meta": "m"}),
    _reply({"content": [_text("x")]}, id=2),
    _reply({"content": [_text("x")]}, id=True),
    _reply({"content": [_text("x")]}, id="1"),
    _reply({"content": [_text("x")]}, jsonrpc="1.0"),
    _reply({"content": "x"}),
    _reply(None, error={"code": -32002, "message": "no", "data": {"reason": "x"}}),
    _reply({"content": [_text("x")]}, error={"code": -32603, "message": "both"}),
    b'{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"\\ud800"}]}}',
    b'{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"x"}],"n":1e400}}',
    b'{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"x"}]}',
    b'{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"\xff"}]}}',
    b"",
]


def _general(raw: bytes, *, as_json: bool = False) -> int:
    try:
        return show_call(decode_reply(raw, 1, m.ToolsCallResult), as_json=as_json)
    except MemorizzError:
        return -1


@pytest.mark.parametrize("raw", SHOWN)
def test_a_text_result_prints_as_the_general_renderer_prints_it(
    raw: bytes, capsys: pytest.CaptureFixture[str]
) -> None:
    expected_status = _general(raw)
    expected = capsys.readouterr()
    assert oneshot.show(oneshot.Call("/unused", b"", as_json=False), raw) == (
        expected_status
    )
    assert capsys.readouterr() == expected


@pytest.mark.parametrize("raw", NOT_SHOWN)
def test_any_other_reply_is_left_to_the_general_renderer(raw: bytes) -> None:
    assert oneshot.show(oneshot.Call("/unused", b"", as_json=False), raw) is None


def test_json_output_is_left_to_the_general_renderer() -> None:
    call = oneshot.Call("/unused", b"", as_json=True)
    assert oneshot.show(call, _reply({"content": [_text("hi")]})) is None


# --- end to end: the same line, both ways, against a real daemon ---------------------

LINES = [
    ["mcp", "call", "t", "echo", "--arguments", '{"text": "hello\\nworld"}'],
    ["mcp", "call", "t", "echo", "--arguments", '{"text": "hi"}', "--timeout", "5"],
    ["mcp", "call", "t", "echo", "--arguments", '{"text": "é \\u2603"}'],
    ["mcp", "call", "t", "echo", "--arguments", '{"text": ""}'],
    ["--json", "mcp", "call", "t", "echo", "--arguments", '{"text": "hi"}'],
    ["mcp", "call", "t", "no_such_tool"],
    ["mcp", "call", "nope", "echo"],
    ["mcp", "call", "t", "echo", "--timeout", "3600"],  # the longest deadline
]


@pytest.mark.parametrize("argv", LINES)
def test_a_one_shot_call_says_what_the_general_path_says(
    argv: list[str], warm: DaemonHarness, capsys: pytest.CaptureFixture[str]
) -> None:
    line = ["--socket", warm.socket, *argv]
    assert oneshot.parse(line) is not None
    status = cli.main(line)
    one_shot = capsys.readouterr()
    assert run._general(line) == status
    assert capsys.readouterr() == one_shot
    assert one_shot.out or one_shot.err


def test_an_unreachable_daemon_is_reported_by_the_general_path(
    capsys: pytest.CaptureFixture[str],
) -> None:
    base = short_tempdir()
    try:
        missing = os.path.join(base, "nothing-here.sock")
        assert cli.main(["--socket", missing, "mcp", "call", "s", "t"]) == 69
    finally:
        rmtree(base)
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"memorizzctl: error: cannot reach memorizzd at {missing}: ")
    assert "is memorizzd running?" in err


def test_a_connection_lost_after_the_request_is_not_sent_again(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The call may have run: exit 69, never a second request by the general path."""
    base = short_tempdir()
    requests: list[bytes] = []
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    path = os.path.join(base, "d.sock")
    listener.bind(path)
    listener.listen()
    listener.settimeout(0.05)
    stop = threading.Event()

    def hang_up_after_reading() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn, conn.makefile("rb") as lines:
                requests.append(lines.readline())

    thread = threading.Thread(target=hang_up_after_reading, daemon=True)
    thread.start()
    try:
        assert cli.main(["--socket", path, "mcp", "call", "s", "t"]) == 69
    finally:
        stop.set()
        thread.join(timeout=10)
        listener.close()
        rmtree(base)
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (
        f"memorizzctl: error: connection to memorizzd at {path} broke: "
        "daemon closed the connection\n"
    )
    assert len(requests) == 1
    assert msgspec.json.decode(requests[0])["method"] == "tools/call"


def test_the_general_path_builds_only_the_parsers_of_the_chosen_command() -> None:
    """argparse asks gettext for every title of every parser it builds: a
    command builds its own, its group's and the top one, not the thirty."""
    parser = build_parser()
    args = parser.parse_args(["mcp", "status"])
    assert args.func.__name__ == "cmd_mcp_status"
    top = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert set(top._name_parser_map) == {"mcp"}
    mcp = top._name_parser_map["mcp"]
    group = next(a for a in mcp._actions if isinstance(a, argparse._SubParsersAction))
    assert set(group._name_parser_map) == {"status"}
    assert "call" in group.choices  # every command is still a choice
