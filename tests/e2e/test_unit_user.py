"""The daemon as memorizzd.service runs it: as an unprivileged user of its own
(``User=memorizzd``), with the unit's environment: its directories from
``$RUNTIME_DIRECTORY``, ``$STATE_DIRECTORY``, ``$CONFIGURATION_DIRECTORY``,
the vault key from ``$CREDENTIALS_DIRECTORY``, and ``$NOTIFY_SOCKET`` with
``$WATCHDOG_USEC``, where the test plays systemd and hears READY=1 and the
watchdog's pings.

The uid is a number with no account (as a ``DynamicUser=`` one would be). The
test needs root to switch to it, and the interpreter must be reachable by
it: when it lives under a directory closed to others (pyenv under /root),
the daemon runs in a mount namespace of its own where that directory is
replaced by an open one holding only the interpreter's tree. Nothing of the
host is changed.
"""

from __future__ import annotations

import base64
import os
import pwd
import shutil
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from memorizz import Client
from memorizz.api.errors import DaemonUnreachableError
from tests.harness import DAEMON_EXE, spawned_spec, wait_until

UID = GID = 64_123
WATCHDOG_USEC = 600_000  # a ping every 0.2 s


def _free_uid() -> bool:
    try:
        pwd.getpwuid(UID)
    except KeyError:
        return True
    return False


def _closed_ancestor(path: str) -> Path | None:
    """The first directory above ``path`` that others may not enter (None: all open)."""
    for parent in reversed(Path(path).parents):
        if parent != Path("/") and not parent.stat().st_mode & stat.S_IXOTH:
            return parent
    return None


pytestmark = pytest.mark.skipif(
    os.geteuid() != 0
    or not (shutil.which("unshare") and shutil.which("setpriv"))
    or not _free_uid(),
    reason="needs root, unshare and setpriv (util-linux), and a free uid",
)


def _as_the_user(argv: list[str], view: Path) -> list[str]:
    """``argv`` as uid UID; with the interpreter's closed ancestor opened in
    a private mount namespace (the real one bound at ``view`` first)."""
    drop = ["setpriv", f"--reuid={UID}", f"--regid={GID}", "--clear-groups"]
    interpreter = os.path.realpath(sys.executable)
    closed = _closed_ancestor(interpreter)
    if closed is None:
        return [*drop, *argv]
    inner = Path(interpreter).relative_to(closed).parts[0]  # e.g. .pyenv
    script = (
        f'mount --bind "{closed / inner}" "{view}" && '
        f'mount -t tmpfs -o mode=0755 memorizzd-test "{closed}" && '
        f'mkdir "{closed / inner}" && mount --bind "{view}" "{closed / inner}" && '
        'exec "$@"'
    )
    return [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        script,
        "sh",
        *drop,
        *argv,
    ]


def test_the_daemon_runs_as_its_own_user_under_the_units_environment(
    base_dir: str,
) -> None:
    base = Path(base_dir)
    base.chmod(0o755)  # the user reaches its directories through it
    dirs = {
        kind: base / kind.lower()
        for kind in ("RUNTIME", "STATE", "CONFIGURATION", "CREDENTIALS")
    }
    for path in dirs.values():
        path.mkdir(mode=0o700)
        os.chown(path, UID, GID)
    view = base / "view"
    view.mkdir()
    spec = spawned_spec("as-the-user")  # the zygote is not the unit user's
    config = dirs["CONFIGURATION"] / "memorizzd.toml"
    config.write_text(
        "[operators]\n"
        "allow_root = true\n"  # this test's client is root; the socket is the user's
        "[[servers]]\n"
        f'name = "{spec.name}"\n'
        'transport = "stdio"\n'
        f'command = "{spec.command}"\n'
        f"args = {list(spec.args)!r}\n".replace("'", '"')
    )
    key = base64.urlsafe_b64encode(os.urandom(32)).decode()
    (dirs["CREDENTIALS"] / "memorizzd-key").write_text(key + "\n")
    os.chown(dirs["CREDENTIALS"] / "memorizzd-key", UID, GID)
    notify_path = base / "notify.sock"
    systemd = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    systemd.bind(str(notify_path))
    notify_path.chmod(0o777)  # the daemon's user sends to it
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("MEMORIZZ_", "LISTEN_", "NOTIFY_", "WATCHDOG_"))
    }
    env |= {f"{kind}_DIRECTORY": str(path) for kind, path in dirs.items()}
    env |= {
        "NOTIFY_SOCKET": str(notify_path),
        "WATCHDOG_USEC": str(WATCHDOG_USEC),
        "HOME": str(dirs["STATE"]),
    }
    socket_path = str(dirs["RUNTIME"] / "memorizzd.sock")

    def answers() -> bool:
        try:
            with Client(socket_path) as c:
                c.hello("memorizz-tests")
        except DaemonUnreachableError:
            return False
        return True

    log_path = base / "daemon.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            _as_the_user([DAEMON_EXE], view),  # no flags, as ExecStart=
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
        )
    try:
        wait_until(
            answers,
            what="the socket in $RUNTIME_DIRECTORY",
            alive=lambda: _alive(proc, log_path),
        )
        heard = _datagrams(systemd, seconds=1.5)
        assert b"READY=1" in heard
        assert heard.count(b"WATCHDOG=1") >= 3  # from the loop, as its user
        with Client(socket_path) as c:
            status = c.daemon_status()
            assert status.state_dir == str(dirs["STATE"])
            wait_until(lambda: c.server_status(spec.name)[0].state == "ready")
            result = c.call_tool(spec.name, "add", {"a": 2, "b": 3})
            assert not result.is_error
            pid = c.server_status(spec.name)[0].pid
        assert pid is not None
        # the daemon and its stdio server run as the user, and what they write is its
        assert os.stat(f"/proc/{proc.pid}").st_uid == UID
        assert os.stat(f"/proc/{pid}").st_uid == UID
        for name in ("state.db", "audit.key", "audit.spool"):
            written = (dirs["STATE"] / name).stat()
            assert (written.st_uid, written.st_mode & 0o777) == (UID, 0o600), name
        assert not (
            dirs["STATE"] / "vault.key"
        ).exists()  # the key was the credential's
        assert os.stat(socket_path).st_uid == UID
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0
        systemd.close()


def _alive(proc: subprocess.Popen[bytes], log_path: Path) -> None:
    if proc.poll() is not None:
        raise AssertionError(
            f"memorizzd exited with {proc.returncode}:\n{log_path.read_text()}"
        )


def _datagrams(sock: socket.socket, *, seconds: float) -> list[bytes]:
    """What ``sock`` hears in the next ``seconds``."""
    heard: list[bytes] = []
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            heard.append(sock.recv(4096))
        except TimeoutError:
            break
    return heard
