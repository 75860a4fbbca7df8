"""memorizzctl probed as a demanding operator would: odd but plausible input.

Each case runs the installed ``memorizzctl`` as a process against a real
daemon and holds what every error owes the operator (docs/operations.md, exit
codes; docs/protocol.md, errors): one line on stderr naming what is wrong,
nothing on stdout (with ``--json``, the one JSON error line there instead),
the documented exit status, and never a traceback. And what a result owes a
pipe: all of it, or exit 141 when the reader left, or an error when it could
not be written at all.
"""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from memorizz.ctl import args, oneshot
from tests.harness import (
    DaemonHarness,
    asking_spec,
    daemon_config,
    rmtree,
    short_tempdir,
    stdio_spec,
)
from tests.process import MEMORIZZCTL

OPERATIONS = Path(__file__).parents[2] / "docs" / "operations.md"

Word = str | bytes
"""A command-line word; bytes for what is not UTF-8."""


@pytest.fixture(scope="module")
def daemon() -> Iterator[DaemonHarness]:
    base = short_tempdir()
    try:
        config = daemon_config(base, servers=[stdio_spec("t"), asking_spec("ask")])
        with DaemonHarness.running(config) as harness:
            harness.wait_ready("t")
            harness.wait_ready("ask")
            yield harness
    finally:
        rmtree(base)


def ctl(
    *argv: Word,
    socket: str | None,
    stdin: bytes | None = b"",
    env: dict[str, str] | None = None,
    shell_redirect: str = "",
) -> subprocess.CompletedProcess[bytes]:
    """``memorizzctl --socket SOCKET ARGV...`` (no ``--socket`` when None),
    stdin ``stdin`` (None: closed); ``shell_redirect`` is applied by a shell
    that then execs it (``>&-``, ``>/dev/full``)."""
    words: list[Word] = [MEMORIZZCTL]
    if socket is not None:
        words += ["--socket", socket]
    words += argv
    redirects = shell_redirect + (" <&-" if stdin is None else "")
    if redirects:
        words = ["/bin/sh", "-c", f'exec "$0" "$@" {redirects}', *words]
    done = subprocess.run(
        words,
        input=stdin,
        stdin=subprocess.DEVNULL if stdin is None else None,
        capture_output=True,
        env={**os.environ, **(env or {})},
        timeout=20,
        check=False,
    )
    assert b"Traceback" not in done.stderr, done.stderr.decode(errors="replace")
    return done


def error_line(done: subprocess.CompletedProcess[bytes]) -> str:
    """The one ``memorizzctl: error:`` line, after at most a usage block;
    stdout empty."""
    assert done.stdout == b"", done.stdout
    err = done.stderr.decode()
    lines = [line for line in err.splitlines() if line.startswith("memorizzctl:")]
    assert len(lines) == 1, err
    assert lines[0].startswith("memorizzctl: error: "), err
    assert err.endswith(lines[0] + "\n"), err
    return lines[0]


def json_error(done: subprocess.CompletedProcess[bytes]) -> dict[str, Any]:
    assert done.stderr == b"", done.stderr
    assert done.stdout.count(b"\n") == 1, done.stdout
    body: dict[str, Any] = msgspec.json.decode(done.stdout)
    assert set(body) == {"error"}
    return body["error"]


# --- --arguments, secrets and names from odd sources ---------------------------------


@pytest.mark.parametrize(
    ("argv", "stdin", "message"),
    [
        (["--arguments", "-"], b"\xff\xfe{}", "not UTF-8 text"),
        (["--arguments", "-"], None, "argument --arguments: standard input is closed"),
        (["--arguments", b'{"text": "\xff"}'], b"", "argument --arguments: not UTF-8"),
        (
            ["--arguments", "-"],
            b"",
            "argument --arguments: not valid JSON: it is empty",
        ),
    ],
)
def test_arguments_that_cannot_be_read_say_why(
    argv: list[Word], stdin: bytes | None, message: str, daemon: DaemonHarness
) -> None:
    """Not argparse's "invalid json_object_source value: '-'", nor a traceback."""
    done = ctl("mcp", "call", "t", "echo", *argv, socket=daemon.socket, stdin=stdin)
    assert done.returncode == 2
    line = error_line(done)
    assert message in line, line
    assert "json_object_source" not in line


def test_arguments_nested_too_deeply_are_a_usage_error(
    daemon: DaemonHarness, tmp_path: Path
) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text('{"a":' * 5000 + "1" + "}" * 5000)
    done = ctl(
        "mcp", "call", "t", "echo", "--arguments", f"@{deep}", socket=daemon.socket
    )
    assert done.returncode == 2
    assert error_line(done).endswith("not valid JSON: nested too deeply")


def test_an_arguments_file_with_a_byte_order_mark_is_read(
    daemon: DaemonHarness, tmp_path: Path
) -> None:
    """What Windows editors save: RFC 8259 lets a parser ignore the BOM."""
    saved = tmp_path / "args.json"
    saved.write_bytes(b'\xef\xbb\xbf{"text": "bom"}\r\n')
    done = ctl(
        "mcp", "call", "t", "echo", "--arguments", f"@{saved}", socket=daemon.socket
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, b"bom\n", b"")


@pytest.mark.parametrize(
    ("argv", "stdin", "message"),
    [
        (
            [
                "mcp",
                "add",
                "x",
                "--url",
                "https://example.com/mcp",
                "--token-file",
                "@",
            ],
            b"",
            "cannot read --token-file",
        ),
        (
            ["mcp", "add", "x", "--url", "https://example.com/mcp", "--token", "-"],
            None,
            "--token -: standard input is closed",
        ),
        (
            ["mcp", "login", "x", "--callback-url", "-"],
            None,
            "standard input is closed",
        ),
    ],
)
def test_secrets_that_cannot_be_read_say_why(
    argv: list[str],
    stdin: bytes | None,
    message: str,
    daemon: DaemonHarness,
    tmp_path: Path,
) -> None:
    token = tmp_path / "token"
    token.write_bytes(b"\xff\xfe not text")
    argv = [str(token) if word == "@" else word for word in argv]
    done = ctl(*argv, socket=daemon.socket, stdin=stdin)
    assert done.returncode == 2
    assert message in error_line(done)


@pytest.mark.parametrize(
    "argv",
    [
        ["mcp", "tools", b"\xff"],
        ["mcp", "call", b"caf\xe9", "echo"],  # Latin-1 from an old script
        ["audit", "--server", b"\xff"],
        ["mcp", "prompt", "t", "greet", "--arg", b"name=\xff"],
    ],
)
def test_words_that_are_not_utf8_are_a_usage_error(
    argv: list[Word], daemon: DaemonHarness
) -> None:
    """They reach Python as lone surrogates, which no UTF-8 request can hold."""
    done = ctl(*argv, socket=daemon.socket)
    assert done.returncode == 2
    assert "is not UTF-8 text" in error_line(done)

    done = ctl(*argv, "--json", socket=daemon.socket)
    assert done.returncode == 2
    error = json_error(done)
    assert error["reason"] == "usage"
    assert "is not UTF-8 text" in error["message"]


# --- numbers the daemon would refuse ---------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["mcp", "call", "t", "echo", "--timeout", "3601"],
            "--timeout: must be at most 3600",
        ),
        (["mcp", "call", "t", "echo", "-v", "--timeout", "7200"], "at most 3600"),
        (["mcp", "test", "t", "--timeout", "1e9"], "--timeout: must be at most 3600"),
        (["mcp", "read", "t", "test://static", "--timeout", "5000"], "at most 3600"),
        (["mcp", "wait", "p_x", "--timeout", "301"], "--timeout: must be at most 300"),
        (["mcp", "task", "result", "x", "--timeout", "4000"], "at most 3600"),
        (["audit", "--limit", "1001"], "--limit: must be at most 1000"),
        (["mcp", "approvals", "--limit", "5000"], "--limit: must be at most 1000"),
        (["audit", "--before", str(2**63)], "--before: must be at most"),
    ],
)
def test_a_number_beyond_the_daemons_limit_is_a_usage_error(
    argv: list[str], message: str, daemon: DaemonHarness
) -> None:
    """Not the daemon's "invalid params: Expected `float` <= 3600.0 - at
    `$.timeout_s`" (exit 1), which names a wire field, not the option."""
    done = ctl(*argv, socket=daemon.socket)
    assert done.returncode == 2
    line = error_line(done)
    assert message in line, line
    assert "$." not in line


def test_the_one_shot_parser_holds_the_same_deadline() -> None:
    """It cannot import the wire contract; a larger deadline it let through
    would come back as the daemon's invalid_params (exit 1)."""
    assert oneshot.MAX_DEADLINE_S == args.MAX_DEADLINE_S


def test_audit_since_longer_ago_than_the_epoch_lists_everything(
    daemon: DaemonHarness,
) -> None:
    done = ctl("--json", "audit", "--since", "99999999999", socket=daemon.socket)
    assert done.returncode == 0, done.stdout
    assert "records" in msgspec.json.decode(done.stdout)


# --- where the daemon is ----------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["--socket", "", "mcp", "list"],
        ["--socket=", "mcp", "call", "t", "echo"],  # the one-shot way
        ["mcp", "call", "t", "echo", "--socket", ""],
        ["--socket", "", "mcp", "serve"],  # the bridge's own parser
        ["mcp", "serve", "--mcp-socket", ""],
        ["daemon", "metrics", "--metrics-socket", ""],
    ],
)
def test_an_empty_socket_path_is_a_usage_error(
    argv: list[str], daemon: DaemonHarness
) -> None:
    """``--socket "$SOCK"`` with the variable unset must not reach whatever
    daemon the environment names (here: a live one)."""
    done = ctl(*argv, socket=None, env={"MEMORIZZ_SOCKET": daemon.socket})
    assert done.returncode == 2
    assert error_line(done).endswith(": an empty path")


def test_metrics_from_a_socket_that_does_not_speak_http_fail_at_once(
    daemon: DaemonHarness,
) -> None:
    """The API socket answers JSON-RPC and waits for the next line: not 30 s
    of silence, then "timed out (is [metrics] enabled?)"."""
    done = ctl("daemon", "metrics", "--metrics-socket", daemon.socket, socket=None)
    assert done.returncode == 1
    assert error_line(done).endswith(
        "did not answer HTTP: it is not the metrics socket"
    )


# --- the command line itself -----------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "word"), [(["--verison"], "--verison"), (["mcp", "--jsno"], "--jsno")]
)
def test_a_mistyped_option_is_named_even_without_a_command(
    argv: list[str], word: str
) -> None:
    """Not "the following arguments are required: COMMAND"."""
    done = ctl(*argv, socket=None)
    assert done.returncode == 2
    assert error_line(done) == f"memorizzctl: error: unrecognized arguments: {word}"


def test_the_help_lists_every_documented_exit_status() -> None:
    table = OPERATIONS.read_text().split("`memorizzctl`:", 1)[1].split("\n## ", 1)[0]
    documented = re.findall(r"^\| (\d+) \|", table, flags=re.MULTILINE)
    assert "141" in documented
    help_text = ctl("--help", socket=None).stdout.decode()
    shown = re.findall(
        r"^  (\d+) ", help_text.split("exit status:", 1)[1], re.MULTILINE
    )
    assert shown == documented


# --- the output ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["mcp", "list"],
        ["mcp", "call", "t", "echo", "--arguments", '{"text": "hi"}'],  # one-shot
        ["--json", "mcp", "tools", "nosuch"],  # the JSON error itself
        ["completion", "bash"],
    ],
)
@pytest.mark.parametrize(
    ("redirect", "why"),
    [(">/dev/full", "No space left on device"), (">&-", "standard output is closed")],
)
def test_output_that_cannot_be_written_is_said_on_stderr(
    argv: list[str], redirect: str, why: str, daemon: DaemonHarness
) -> None:
    """Not "cannot reach memorizzd at SOCKET: [Errno 28] ..." (exit 69), and
    not a traceback."""
    done = ctl(*argv, socket=daemon.socket, shell_redirect=redirect)
    assert done.returncode == 1
    assert error_line(done) == f"memorizzctl: error: cannot write the output: {why}"


@pytest.mark.parametrize("verbose", [[], ["-v"]])  # the one-shot way, the general one
def test_a_reader_that_leaves_mid_output_gets_141_not_a_silent_truncation(
    verbose: list[str], daemon: DaemonHarness, tmp_path: Path
) -> None:
    """``memorizzctl mcp call ... | head -1`` on a result far larger than the
    pipe: the text layer drops what a short write left, and exited 0."""
    lines = tmp_path / "lines.json"
    lines.write_bytes(msgspec.json.encode({"text": "line\n" * 150_000}))
    argv = ["--socket", daemon.socket, "mcp", "call", "t", "echo"]
    proc = subprocess.Popen(
        [MEMORIZZCTL, *argv, "--arguments", f"@{lines}", *verbose],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"line\n"
    proc.stdout.close()  # what head does after one line
    _, err = proc.communicate(timeout=20)
    assert (proc.returncode, err) == (141, b"")


def test_a_character_the_outputs_encoding_lacks_is_escaped(
    daemon: DaemonHarness,
) -> None:
    """A Latin-1 terminal (or PYTHONIOENCODING) and a tool answering a snowman."""
    for verbose in ([], ["-v"]):
        done = ctl(
            "mcp", "call", "t", "echo", "--arguments", '{"text": "\\u00e9\\u2603"}',
            *verbose,
            socket=daemon.socket,
            env={"PYTHONIOENCODING": "latin-1"},
        )  # fmt: skip
        assert (done.returncode, done.stdout) == (0, "é\\u2603\n".encode("latin-1"))


def test_a_prompt_ended_with_ctrl_d_ends_its_line_on_the_terminal(
    daemon: DaemonHarness,
) -> None:
    """The server's elicitation, answered on a terminal: Ctrl-D declines, and
    the tool's answer comes on a line of its own, not glued to the prompt."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [MEMORIZZCTL, "--socket", daemon.socket, "mcp", "call", "ask", "ask_name"],
        stdin=follower,
        stdout=follower,
        stderr=follower,
    )
    os.close(follower)
    os.write(leader, b"\x04")  # Ctrl-D at the start of a line: end of input
    seen = b""
    while select.select([leader], [], [], 20)[0]:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # EIO: the terminal's last process is gone
            break
        if not chunk:
            break
        seen += chunk
    os.close(leader)
    assert proc.wait(timeout=20) == 0
    assert b"Name (string): \r\ndecline\r\n" in seen, seen
