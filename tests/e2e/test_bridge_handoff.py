"""The bridge hands its client's stdio to the face (memorizzd/rpc/handoff.py).

With pipes for stdin and stdout (as every MCP client gives), ``memorizzctl mcp
serve`` passes them to the daemon and only waits: the daemon reads the
client's requests and writes its replies itself. A terminal or a file is
pumped as before, and so is anything when ``MEMORIZZ_BRIDGE=pump``. The daemon
takes exactly two pipes or sockets and nothing else.
"""

from __future__ import annotations

import array
import os
import socket
import subprocess
import tempfile
from collections.abc import Iterator

import msgspec
import pytest

from memorizzd.listeners import face_socket_path
from tests.harness import DaemonHarness, daemon_config, short_tempdir, stdio_spec
from tests.process import MEMORIZZCTL

WAIT_S = 20.0
INITIALIZE = (
    b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":'
    b'"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}\n'
)
INITIALIZED = b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n'
CALL = (
    b'{"jsonrpc":"2.0","id":2,"method":"tools/call","params":'
    b'{"name":"add","arguments":{"a":2,"b":3}}}\n'
)
HANDOFF = b'{"jsonrpc":"2.0","id":"mz-handoff","method":"memorizz/handoff"}\n'


@pytest.fixture(scope="module")
def daemon() -> Iterator[DaemonHarness]:
    base = short_tempdir()
    with DaemonHarness.running(daemon_config(base, servers=[stdio_spec("s")])) as h:
        h.wait_ready("s")
        yield h


def _bridge(daemon: DaemonHarness, **env: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [MEMORIZZCTL, "--socket", daemon.socket, "mcp", "serve", "--server", "s"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, **env},
    )


def _reply(proc: subprocess.Popen[bytes]) -> dict[str, object]:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, proc.stderr.read() if proc.stderr else b""
    decoded: dict[str, object] = msgspec.json.decode(line)
    return decoded


def _session(proc: subprocess.Popen[bytes]) -> None:
    """initialize, then one call of the server's tool under its own name."""
    assert proc.stdin is not None
    proc.stdin.write(INITIALIZE)
    proc.stdin.flush()
    assert _reply(proc)["id"] == 1
    proc.stdin.write(INITIALIZED + CALL)
    proc.stdin.flush()
    reply = _reply(proc)
    assert reply["id"] == 2
    assert "result" in reply, reply


def _stdio_of(pid: int) -> tuple[str, str]:
    return os.readlink(f"/proc/{pid}/fd/0"), os.readlink(f"/proc/{pid}/fd/1")


@pytest.mark.parametrize("mode", ["handoff", "pump"])
def test_the_bridge_hands_its_pipes_over_or_pumps_when_told(
    daemon: DaemonHarness, mode: str
) -> None:
    env = {"MEMORIZZ_BRIDGE": "pump"} if mode == "pump" else {}
    with _bridge(daemon, **env) as proc:
        _session(proc)
        stdin, stdout = _stdio_of(proc.pid)
        if mode == "handoff":  # the daemon has them; the bridge holds nothing
            assert (stdin, stdout) == (os.devnull, os.devnull)
        else:
            assert stdin.startswith("pipe:")
            assert stdout.startswith("pipe:")
        assert proc.stdin is not None
        proc.stdin.close()  # the client's end: the session is over
        assert proc.wait(timeout=WAIT_S) == 0
        assert proc.stdout is not None
        assert proc.stdout.read() == b""
        assert proc.stderr is not None
        assert proc.stderr.read() == b""


def test_a_file_for_stdin_is_pumped(daemon: DaemonHarness) -> None:
    with tempfile.TemporaryFile() as requests:
        requests.write(INITIALIZE + INITIALIZED + CALL)
        requests.seek(0)
        done = subprocess.run(
            [MEMORIZZCTL, "--socket", daemon.socket, "mcp", "serve", "--server", "s"],
            stdin=requests,
            capture_output=True,
            timeout=WAIT_S,
            check=False,
        )
    assert done.returncode == 0, done.stderr
    ids = [msgspec.json.decode(line)["id"] for line in done.stdout.splitlines()]
    assert ids == [1, 2]


def _offer(daemon: DaemonHarness, fds: list[int]) -> bytes:
    """A hand-over sent by hand with ``fds``; the daemon's answer line."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(WAIT_S)
        sock.connect(face_socket_path(daemon.socket))
        rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
        sock.sendmsg([HANDOFF], rights)
        with sock.makefile("rb") as lines:
            answer = lines.readline()
            # refused, the connection goes on as a plain one
            sock.sendall(INITIALIZE)
            assert msgspec.json.decode(lines.readline())["id"] == 1
    return answer


def test_the_daemon_takes_only_two_pipes_or_sockets(daemon: DaemonHarness) -> None:
    with tempfile.TemporaryFile() as file:
        refused = _offer(daemon, [file.fileno(), file.fileno()])
    error = msgspec.json.decode(refused)
    assert error["id"] == "mz-handoff"
    assert "two pipes or sockets" in error["error"]["message"]
    r, w = os.pipe()
    try:
        assert b'"error"' in _offer(daemon, [r])  # one is not two
    finally:
        os.close(r)
        os.close(w)


def test_the_bridge_and_the_daemon_spell_the_hand_over_alike() -> None:
    """serve.py keeps its own copies (it imports nothing of the daemon's)."""
    from memorizz.ctl import serve
    from memorizzd.rpc import handoff

    assert serve.HANDOFF_LINE == handoff.HANDOFF_LINE + b"\n" == HANDOFF
    assert serve.HANDOFF_ACK == handoff.HANDOFF_ACK
