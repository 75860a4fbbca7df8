"""The test-server zygote (tests/zygote.py) behaves as a spawn would, for what
the daemon sees: the argv, environment, working directory and stdio of the
launcher it was given, its exit status, its signals, and no child left when
the launcher is killed."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from tests.harness import ZYGOTE_LAUNCH, zygote_socket
from tests.process import wait_until

SCRIPT = """
import os, sys, time
print(sys.argv[1:], os.environ.get("ZYGOTE_PROBE"), os.getcwd(), os.getpid(), flush=True)
line = sys.stdin.readline()
if line == "sleep\\n":
    time.sleep(600)
sys.exit(int(line))
"""


def _launch(tmp_path: Path) -> subprocess.Popen[str]:
    script = tmp_path / "probe.py"
    script.write_text(SCRIPT)
    return subprocess.Popen(
        [sys.executable, ZYGOTE_LAUNCH, zygote_socket(), str(script), "a", "b"],
        env={"ZYGOTE_PROBE": "given"},
        cwd=tmp_path,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_the_forked_server_has_the_launchers_argv_env_cwd_and_exit_status(
    tmp_path: Path,
) -> None:
    proc = _launch(tmp_path)
    assert proc.stdout is not None
    assert proc.stdin is not None
    argv, probe, cwd, pid = proc.stdout.readline().rsplit(" ", 3)
    assert (argv, probe, cwd) == ("['a', 'b']", "given", str(tmp_path))
    assert int(pid) != proc.pid  # forked by the zygote, not the launcher itself
    proc.stdin.write("3\n")
    proc.stdin.close()
    assert proc.wait(timeout=30) == 3
    assert proc.stdout.read() == ""  # its stdout closed with it
    proc.stdout.close()


@contextlib.contextmanager
def _sleeping(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """A launched server that sleeps: its launcher, and the server's own pid."""
    proc = _launch(tmp_path)
    assert proc.stdout is not None
    assert proc.stdin is not None
    try:
        pid = int(proc.stdout.readline().rsplit(" ", 1)[1])
        proc.stdin.write("sleep\n")
        proc.stdin.flush()
        yield proc, pid
    finally:
        proc.stdin.close()
        proc.stdout.close()


def test_a_signal_to_the_launcher_reaches_the_server(tmp_path: Path) -> None:
    with _sleeping(tmp_path) as (proc, pid):
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == -signal.SIGTERM  # died of it, as the server did
        wait_until(lambda: not _alive(pid), what="the server to end")


def test_a_killed_launcher_takes_its_server_with_it(tmp_path: Path) -> None:
    with _sleeping(tmp_path) as (proc, pid):
        proc.kill()
        proc.wait(timeout=30)
        wait_until(lambda: not _alive(pid), what="the orphaned server to be killed")


def test_a_launcher_that_dies_before_it_asks_leaves_the_zygote_serving(
    tmp_path: Path,
) -> None:
    import socket

    for junk in (b"", b"not json"):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(zygote_socket())
            sock.sendall(junk)
    proc = _launch(tmp_path)
    assert proc.stdout is not None
    assert proc.stdin is not None
    assert "given" in proc.stdout.readline()
    proc.stdin.write("0\n")
    proc.stdin.close()
    assert proc.wait(timeout=30) == 0
    proc.stdout.close()
