"""The daemon's secrets stay in the daemon: children's environment, /proc/<pid>/environ."""

from __future__ import annotations

import base64
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import sys
import termios
from collections.abc import Iterator
from pathlib import Path

import pytest

from memorizz import Client
from memorizzd.execution import scrub_environment
from memorizzd.upstream.stdio import child_environment
from tests.harness import (
    DAEMON_EXE,
    daemon_process,
    light_spec,
    stdio_spec,
    wait_until,
)
from tests.process import EMPTY_CONFIG, OWN_CONFIG, daemon_argv

MARKER = "marker-7f3c9e1d-not-a-real-key"
# A valid Fernet key (the daemon reads it as the vault key) made of the marker.
FERNET_KEY = base64.urlsafe_b64encode(MARKER.encode().ljust(32, b"!")).decode()
BASE_KEYS = {"HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER", "LANG", "TZ"}
DAEMON_ONLY = {
    "MEMORIZZ_MCP_ENCRYPTION_KEY": FERNET_KEY,
    "MEMORIZZ_MCP_STDIO_ALLOWLIST": "",
    "NOTIFY_SOCKET": "/nonexistent/notify.sock",
    "LISTEN_FDS": "0",
    "LISTEN_PID": "1",
    "LISTEN_FDNAMES": "agent",
    "SOME_OTHER_SECRET": MARKER,
}


def test_child_environment_is_a_small_base_plus_the_servers_own(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for key, value in DAEMON_ONLY.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    env = child_environment(stdio_spec(env={"OWN": "1", "PATH": "/opt/bin"}).env)
    assert set(env) <= BASE_KEYS | {"OWN"}
    assert env["OWN"] == "1"
    assert env["PATH"] == "/opt/bin"  # the server's own wins
    assert MARKER not in repr(env)


def test_scrub_environment_removes_every_memorizz_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MEMORIZZ_MCP_ENCRYPTION_KEY", MARKER)
    monkeypatch.setenv("MEMORIZZ_SOCKET", "/tmp/x.sock")
    monkeypatch.setenv("NOT_MEMORIZZ", "kept")
    removed = scrub_environment()
    assert removed["MEMORIZZ_MCP_ENCRYPTION_KEY"] == MARKER
    assert removed["MEMORIZZ_SOCKET"] == "/tmp/x.sock"
    assert not [k for k in os.environ if k.startswith("MEMORIZZ_")]
    assert os.environ["NOT_MEMORIZZ"] == "kept"


def test_a_stdio_child_of_the_real_daemon_sees_none_of_its_secrets(
    base_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in DAEMON_ONLY.items():
        monkeypatch.setenv(key, value)
    credentials = os.path.join(base_dir, "credentials")
    os.mkdir(credentials, 0o700)
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", credentials)
    notify_path = os.path.join(base_dir, "notify.sock")
    monkeypatch.setenv("NOTIFY_SOCKET", notify_path)  # a real one: the daemon uses it
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(notify_path)
    with notify, daemon_process(base_dir) as d:
        with d.client() as c:
            c.add_server(stdio_spec("t", env={"OWN": "1"}))
        d.wait_ready("t")
        with d.client() as c:

            def seen(name: str) -> str:
                text: str = c.call_tool("t", "env", {"name": name}).content[0]["text"]
                return text

            for key in [*DAEMON_ONLY, "CREDENTIALS_DIRECTORY"]:
                assert seen(key) == "<unset>", key
            assert seen("OWN") == "1"
            pid = c.server_status("t")[0].pid
        assert pid is not None
        # Everything the child was started with (its exec-time environment).
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    keys = {item.split(b"=", 1)[0].decode() for item in raw.split(b"\0") if item}
    assert keys <= BASE_KEYS | {"OWN"}
    assert MARKER.encode() not in raw
    assert FERNET_KEY.encode() not in raw


# --- /proc/<daemon pid>/environ -----------------------------------------------------


def _as_plain_same_uid() -> list[str]:
    """A command prefix making the child an ordinary process of our uid.

    As root: the same uid without capabilities (util-linux ``setpriv`` empties
    the bounding set, so the exec'd program has none: no CAP_SYS_PTRACE, no DAC
    override). Otherwise nothing: we already are an ordinary process of our uid.
    """
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root and setpriv (util-linux) is not installed")
    return [setpriv, "--bounding-set=-all", "--inh-caps=-all"]


def _no_capabilities(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
    return int(fields["CapEff"], 16) == 0 and int(fields["CapPrm"], 16) == 0


READER = """
import sys
try:
    data = open(f"/proc/{sys.argv[1]}/environ", "rb").read()
except PermissionError:
    print("denied")
else:
    print("read", sys.argv[2].encode() in data)
"""


def _read_environ_as_peer(pid: int, prefix: list[str]) -> str:
    out = subprocess.run(
        [*prefix, sys.executable, "-c", READER, str(pid), MARKER],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    return out.stdout.strip()


def _wait_answering(proc: subprocess.Popen[bytes], socket_path: str) -> None:
    """Until the daemon ``proc`` answers on ``socket_path`` (fails if it exits)."""

    def answers() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"memorizzd exited with {proc.returncode}")
        try:
            with Client(socket_path) as c:
                c.hello()
        except ConnectionError:
            return False
        return True

    wait_until(answers, what="the daemon socket")


@pytest.fixture
def peer_daemon(base_dir: str) -> Iterator[tuple[int, list[str]]]:
    """The real memorizzd, as an ordinary process of our uid, with the marker key."""
    prefix = _as_plain_same_uid()
    socket_path = os.path.join(base_dir, "d.sock")
    with open(os.path.join(base_dir, "daemon.log"), "ab") as log:
        proc = subprocess.Popen(
            [
                *prefix,
                DAEMON_EXE,
                "--socket",
                socket_path,
                "--state-dir",
                os.path.join(base_dir, "state"),
            ],
            env=os.environ | {"MEMORIZZ_MCP_ENCRYPTION_KEY": FERNET_KEY},
            stdout=log,
            stderr=log,
        )
    try:
        _wait_answering(proc, socket_path)
        assert _no_capabilities(proc.pid) or not prefix
        yield proc.pid, prefix
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux")
def test_proc_environ_of_the_daemon_is_unreadable_to_same_uid_processes(
    peer_daemon: tuple[int, list[str]],
) -> None:
    pid, prefix = peer_daemon
    # Control: the same reader can read a dumpable process of the same uid that
    # holds the marker (so a "denied" below is the daemon's doing).
    control = subprocess.Popen(
        [*prefix, sys.executable, "-c", "import time; time.sleep(60)"],
        env={"MEMORIZZ_MCP_ENCRYPTION_KEY": MARKER},
    )
    try:
        wait_until(
            lambda: MARKER.encode() in Path(f"/proc/{control.pid}/environ").read_bytes()
        )
        assert _read_environ_as_peer(control.pid, prefix) == "read True"
    finally:
        control.kill()
        control.wait()
    # The daemon removed the key from os.environ, but /proc/<pid>/environ is the
    # exec-time copy: only PR_SET_DUMPABLE=0 keeps it from same-uid processes.
    assert _read_environ_as_peer(pid, prefix) == "denied"


# --- the child's process group, session and terminal ------------------------------


def _stat(pid: int) -> tuple[int, int, int]:
    """A process's group, session and controlling terminal (0: none), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[2]), int(fields[3]), int(fields[4])


def _take_the_terminal() -> None:
    """In the daemon's child, after setsid: stdin (a pty) becomes its terminal."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux")
def test_a_stdio_child_leads_a_group_in_the_daemons_session_with_no_terminal(
    base_dir: str,
) -> None:
    """The daemon run from a terminal (a pty, its controlling terminal): its
    stdio server leads a process group of its own (stopping it signals the
    group), in the daemon's session (one scheduling group with the daemon
    where the kernel groups tasks by session), and has no controlling
    terminal: it cannot open /dev/tty, nor can anything it starts."""
    Path(base_dir, OWN_CONFIG).write_text(EMPTY_CONFIG)
    primary, secondary = os.openpty()
    try:
        with open(os.path.join(base_dir, "daemon.log"), "ab") as log:
            proc = subprocess.Popen(
                daemon_argv(base_dir),
                stdin=secondary,
                stdout=log,
                stderr=log,
                start_new_session=True,
                preexec_fn=_take_the_terminal,  # noqa: PLW1509 - no lock taken
            )
        socket_path = os.path.join(base_dir, "d.sock")
        try:
            _wait_answering(proc, socket_path)
            daemon_group, daemon_session, daemon_tty = _stat(proc.pid)
            assert (daemon_session, daemon_tty != 0) == (proc.pid, True)
            with Client(socket_path) as c:
                c.add_server(light_spec("t"))
                wait_until(lambda: c.server_status("t")[0].state == "ready")
                pid = c.server_status("t")[0].pid
            assert pid is not None
            assert _stat(pid) == (pid, daemon_session, 0)
            assert daemon_group != pid
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0
    finally:
        os.close(primary)
        os.close(secondary)
