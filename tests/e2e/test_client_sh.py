"""The shell client (clients/sh/mz, POSIX sh over socat) against a real daemon
and a real stdio server: hello, tools, a call, a tool's own failure, errors
with their message, reason and exit code, any method through ``raw``. Run by
/bin/sh (dash on Debian: no bashisms)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import msgspec
import pytest

from tests.harness import DaemonHarness, light_daemon

HELD_CALL = '{"server": "t", "name": "gate", "arguments": {"path": "/nonexistent"}, "timeout_s": 0.1}'
MZ = str(Path(__file__).parents[2] / "clients" / "sh" / "mz")


@pytest.fixture(scope="module", autouse=True)
def _socat() -> None:
    if shutil.which("socat") is None:
        if os.geteuid() == 0 or os.environ.get("CI"):
            pytest.fail("socat is not installed: scripts/bootstrap installs it as root")
        pytest.skip("socat is not installed (scripts/bootstrap installs it as root)")


def mz(socket: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["/bin/sh", MZ, *argv],
        capture_output=True,
        text=True,
        env={**os.environ, "MEMORIZZ_SOCKET": socket},
        timeout=60,
        check=False,
    )


def ok(socket: str, *argv: str) -> Any:
    done = mz(socket, *argv)
    assert (done.returncode, done.stderr) == (0, ""), done
    return msgspec.json.decode(done.stdout)


def test_the_shell_client_calls_tools(shared_stdio_daemon: DaemonHarness) -> None:
    sock = shared_stdio_daemon.socket
    hello = ok(sock, "hello")
    assert hello["protocol_version"] == 1
    assert "t" in hello["servers"]
    tools = ok(sock, "tools", "t")["tools"]
    assert {"echo", "fail"} <= {tool["name"] for tool in tools}
    result = ok(sock, "call", "t", "echo", '{"text": "hi \\"from\\" sh"}')
    assert result["content"] == [{"type": "text", "text": 'hi "from" sh'}]
    # arguments written over several lines are sent on one
    result = ok(sock, "call", "t", "add", '{\n  "a": 2,\n  "b": 3\n}')
    assert result["structuredContent"] == {"result": 5}
    # any method, through raw
    (status,) = ok(sock, "raw", "servers/status", '{"name": "t"}')["servers"]
    assert status["state"] == "ready"
    # -s wins over MEMORIZZ_SOCKET
    assert ok("/nonexistent.sock", "-s", sock, "hello")["protocol_version"] == 1


def test_a_tools_own_failure_is_printed_and_exits_1(
    shared_stdio_daemon: DaemonHarness,
) -> None:
    done = mz(
        shared_stdio_daemon.socket, "call", "t", "fail", '{"reason": "on purpose"}'
    )
    assert done.returncode == 1
    assert msgspec.json.decode(done.stdout)["isError"] is True


def test_a_failure_written_with_spaces_or_iserror_first_exits_1() -> None:
    """A stdio server's result is relayed as it wrote it: ``{"isError": true,``
    (json.dumps' spacing, the member first) is a failure too."""
    with light_daemon("l") as running:
        done = mz(running.socket, "call", "l", "hello", '{"fail": true}')
    assert (done.returncode, done.stderr) == (1, ""), done
    assert msgspec.json.decode(done.stdout)["isError"] is True


@pytest.mark.parametrize(
    ("argv", "code", "stderr"),
    [
        (
            ("call", "nope", "echo", "{}"),
            1,
            "mz: unknown server 'nope' (unknown_server)\n",
        ),
        (
            ("raw", "tools/call", '{"server": "t"}'),
            1,
            "mz: invalid params: Object missing required field `name` (invalid_params)\n",
        ),
        (
            ("raw", "tools/frobnicate"),
            1,
            "mz: unknown method 'tools/frobnicate' (method_not_found)\n",
        ),
        (
            (
                "raw",
                "tools/call",
                HELD_CALL,
            ),
            75,
            "mz: t: no answer within 0.1 s (timeout)\n",
        ),
    ],
    ids=["unknown_server", "invalid_params", "method_not_found", "timeout"],
)
def test_errors_print_the_message_and_reason(
    shared_stdio_daemon: DaemonHarness, argv: tuple[str, ...], code: int, stderr: str
) -> None:
    done = mz(shared_stdio_daemon.socket, *argv)
    assert (done.returncode, done.stdout, done.stderr) == (code, "", stderr)


def test_no_reply_within_mz_timeout_is_a_timeout_not_an_unreachable_daemon(
    shared_stdio_daemon: DaemonHarness,
) -> None:
    """``$MZ_TIMEOUT`` running out is mz giving up, not the daemon going away:
    exit 75 (worth retrying), and no advice to start a daemon that is running."""
    held = HELD_CALL.replace('"timeout_s": 0.1', '"timeout_s": 5')
    done = subprocess.run(
        ["/bin/sh", MZ, "raw", "tools/call", held],
        capture_output=True,
        text=True,
        env={
            **os.environ,
            "MEMORIZZ_SOCKET": shared_stdio_daemon.socket,
            "MZ_TIMEOUT": "1",
        },
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stdout) == (75, ""), done
    assert done.stderr == (
        "mz: no reply within 1 s (MZ_TIMEOUT); the request may still be running"
        " in memorizzd\n"
    )


def test_an_unreachable_daemon_exits_69(base_dir: str) -> None:
    missing = os.path.join(base_dir, "none.sock")
    done = mz(missing, "hello")
    assert done.returncode == 69
    assert done.stderr.startswith(f"mz: cannot reach memorizzd at {missing}: ")


def test_usage_errors_exit_2() -> None:
    done = mz("/nonexistent.sock", "call", "only-a-server")
    assert done.returncode == 2
    assert "mz call SERVER TOOL" in done.stderr
