"""Kill trials: SIGKILL the real daemon at points the other crash tests do not
reach, start it again on the same state directory, and check what it finds.

Each kill point is one the test can see (a write system call stopped by
strace, a database row gone, a line in the daemon's log), not a random delay.
The random trials (load from several clients, servers added and removed,
proposals, reloads, drains, vault rotations, kills at start-up) found nothing
the existing crash tests miss; these are what they did find:

* A first start killed as it writes a key file (the vault's, the audit
  trail's): the next start must not find an empty key and refuse to run.
* A record spooled once a full disk has room again: the piece of the record
  the full disk cut short must not swallow it (the spool is on a tiny tmpfs).
* A server removed while it is being stopped: once its row is gone, so must
  its secrets be, as ``memorizzctl mcp remove`` promises (docs/auth.md).
* A call answered during the drain of a clean stop (SIGTERM): its record
  must be in the database when the daemon exits 0, not left in the spool.
* A read-only state directory whose modes need tightening: one line and
  exit 1, as for any other state directory the daemon refuses.

The tmpfs and the read-only mount need root (CAP_SYS_ADMIN); without it those
tests skip, as the strace ones do without strace.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import shutil
import signal
import sqlite3
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import psutil
import pytest

from memorizz.api.errors import MemorizzError
from memorizzd.audit import load_key
from tests.harness import (
    DaemonProcess,
    daemon_process,
    light_spec,
    sigterm_during_a_call,
    wait_until,
)
from tests.process import ROOT, daemon_argv, empty_config


def _kill(d: DaemonProcess) -> None:
    os.kill(d.pid, signal.SIGKILL)
    assert d.proc is not None
    assert d.proc.wait(10) == -signal.SIGKILL


def _digest(key: bytes, arguments: dict[str, Any]) -> str:
    canonical = msgspec.json.Encoder(order="sorted").encode(arguments)
    return hmac.new(key, canonical, hashlib.sha256).hexdigest()


def _rows(state: str, sql: str) -> list[tuple[Any, ...]]:
    """A query on the state database, read-only, beside the running daemon."""
    uri = f"file:{Path(state, 'state.db')}?mode=ro"
    with contextlib.closing(sqlite3.connect(uri, uri=True)) as db:
        return db.execute(sql).fetchall()


def _mount(*argv: str) -> None:
    mount = shutil.which("mount")
    if mount is None:
        pytest.skip("needs mount(8)")
    done = subprocess.run([mount, *argv], capture_output=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount ({done.stderr.decode().strip()}): needs root")


def _umount(path: str) -> None:
    umount = shutil.which("umount")
    assert umount is not None  # it came with mount(8)
    subprocess.run([umount, "-l", path], capture_output=True, check=False)


# --- a first start killed as it writes a key file ---------------------------


def _strace() -> str:
    strace = shutil.which("strace")
    if strace is None:
        pytest.skip("needs strace, to kill the daemon at one write")
    probe = subprocess.run(
        [strace, "-qq", "-o", os.devnull, "true"], capture_output=True, check=False
    )
    if probe.returncode != 0:
        pytest.skip(f"strace cannot trace here: {probe.stderr.decode().strip()}")
    return strace


@pytest.mark.parametrize("key_file", ["vault.key", "audit.key"])
def test_a_first_start_killed_as_it_writes_a_key_leaves_a_state_that_starts(
    base_dir: str, key_file: str
) -> None:
    """strace delivers SIGKILL to the first start as it enters its first
    ``write`` to the key file (or to a temporary file of that name and
    ``.tmp``, where it is written first). A key file made in place, then
    written, was left empty: every later start stopped at it (the vault's:
    exit 78 "no key in it"; the audit's: a traceback, exit 1), until someone
    deleted it by hand. A fresh state directory must start again, and its
    vault and audit trail must work."""
    strace = _strace()
    key = Path(base_dir, "state", key_file)
    first = subprocess.Popen(
        [strace, "-f", "-qq", "-o", os.devnull,
         "-P", str(key), "-P", f"{key}.tmp",
         "-e", "trace=write", "-e", "inject=write:signal=KILL:when=1",
         *daemon_argv(base_dir, config=empty_config(base_dir))],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=ROOT,
    )  # fmt: skip
    probe = DaemonProcess(base_dir)
    try:
        wait_until(
            lambda: first.poll() is not None or probe.answers(),
            what="the first start killed at its key's write",
        )
    finally:
        if first.poll() is None:  # it wrote no such file: nothing was cut
            for child in psutil.Process(first.pid).children():
                child.terminate()
        first.wait(30)

    with daemon_process(base_dir) as d:
        with d.client() as c:
            c.add_server(light_spec("t", secret_env={"API_KEY": "s3cret"}))
        d.wait_ready("t")
        with d.client() as c:
            c.call_tool("t", "hello", {"text": "after"})
            assert [r.action for r in c.audit().records] == [
                "tools/call",
                "servers/add",
            ]
        assert d.stop() == 0
    with daemon_process(base_dir) as d:  # the secret decrypts with the key made
        d.wait_ready("t")


# --- a record spooled once a full disk has room again -----------------------


@pytest.fixture
def tiny_spool(base_dir: str) -> Iterator[tuple[str, str]]:
    """``state/audit.spool`` bound to a file on a 16 KiB tmpfs (the database
    stays on the real disk, so that batches still move in); yields the spool
    and a filler file on the same tmpfs."""
    state = Path(base_dir, "state")
    state.mkdir(mode=0o700)
    small = Path(base_dir, "small")
    small.mkdir(mode=0o700)
    spool = state / "audit.spool"
    _mount("-t", "tmpfs", "-o", "size=16k,mode=0700", "tmpfs", str(small))
    try:
        for path in (small / "spool", spool):
            path.touch(mode=0o600)
        _mount("--bind", str(small / "spool"), str(spool))
        try:
            yield str(spool), str(small / "filler")
        finally:
            _umount(str(spool))
    finally:
        _umount(str(small))


def test_a_record_spooled_once_a_full_disk_has_room_again_survives_sigkill(
    base_dir: str, tiny_spool: tuple[str, str]
) -> None:
    """The spool has one page left: the record that does not fit is cut
    short (the daemon logs it and answers anyway, as documented). Then there
    is room again and the next call is answered, its record spooled, and the
    daemon is killed before its batch moves (within the second). Its record
    used to follow the piece the full disk had left, on the same line, and
    the replay skipped that line, record and all."""
    spool, filler = tiny_spool
    with daemon_process(base_dir) as d:
        with d.client() as c:
            c.add_server(light_spec("t"))
        d.wait_ready("t")
        with d.client() as c:
            c.audit()  # the servers/add record moved in: the spool is empty
        assert os.path.getsize(spool) == 0
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            size = 0
            with contextlib.suppress(OSError):  # ENOSPC: the tmpfs is full
                while True:
                    size += os.write(fd, bytes(4096))
            os.ftruncate(fd, size - 4096)  # one page left for the spool
            with d.client() as c:
                for i in range(100):
                    c.call_tool("t", "hello", {"text": f"filling-{i}"})
                    if "could not write an audit record" in d.log():
                        break
                else:
                    raise AssertionError("the spool never filled its page")
                os.ftruncate(fd, size - 8192)  # room again
                c.call_tool("t", "hello", {"text": "after"})
            _kill(d)  # well within FLUSH_AFTER_S of the first of these calls
        finally:
            os.close(fd)

    with daemon_process(base_dir) as d, d.client() as c:
        recorded = {r.arguments_hmac for r in c.audit(limit=200).records}
        key = load_key(os.path.join(base_dir, "state"))
        assert _digest(key, {"text": "after"}) in recorded


# --- a server removed while it is being stopped ------------------------------


def test_a_removal_killed_while_the_server_stops_leaves_none_of_its_secrets(
    base_dir: str,
) -> None:
    """``servers/remove`` deletes the row, stops the server, and only then
    deletes its secrets. A server that stays up after its stdin closes is
    stopped in about four seconds (stdin, SIGTERM, SIGKILL); the daemon is
    killed in between, once the row is gone. After the restart the server is
    gone, and so must its secret be ("memorizzctl mcp remove deletes the
    server's secrets", docs/auth.md): nothing else would ever delete it."""
    state = os.path.join(base_dir, "state")
    refs_of_slow = "SELECT ref FROM secrets WHERE ref LIKE 'server/slow/%'"
    with daemon_process(base_dir) as d:
        with d.client() as c:
            c.add_server(
                light_spec(
                    "slow", env={"IGNORE_TERM": "1"}, secret_env={"API_KEY": "s3cret"}
                )
            )
        d.wait_ready("slow")
        with d.client() as c:
            (status,) = c.server_status("slow")
        assert status.pid is not None
        assert _rows(state, refs_of_slow) == [("server/slow/env/API_KEY",)]
        removing = threading.Thread(target=_remove, args=(d, "slow"))
        removing.start()
        try:
            wait_until(
                lambda: _rows(state, "SELECT name FROM servers") == [],
                what="the server's row deleted",
            )
            assert psutil.pid_exists(status.pid)  # still being stopped
            _kill(d)
        finally:
            removing.join(10)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(status.pid, signal.SIGKILL)  # it outlives the daemon

    with daemon_process(base_dir) as d, d.client() as c:
        assert [s.name for s in c.list_servers()] == []
        assert _rows(state, refs_of_slow) == []


def test_a_removal_killed_between_the_row_and_the_secrets_is_finished_at_start(
    base_dir: str,
) -> None:
    """The window the trial above hits only by chance, made exact: the row
    deleted (as ``servers/remove`` does first), the daemon killed before it
    deleted the secrets. The next start deletes them: a server that is gone
    keeps no secret. Another server's stay."""
    state = os.path.join(base_dir, "state")
    refs = "SELECT ref FROM secrets WHERE ref LIKE 'server/%' ORDER BY ref"
    with daemon_process(base_dir) as d:
        with d.client() as c:
            c.add_server(light_spec("gone", secret_env={"API_KEY": "s3cret-1"}))
            c.add_server(light_spec("kept", secret_env={"API_KEY": "s3cret-2"}))
        d.wait_ready("gone")
        d.wait_ready("kept")
        _kill(d)
    with contextlib.closing(sqlite3.connect(Path(state, "state.db"))) as db:
        db.execute("DELETE FROM servers WHERE name = 'gone'")
        db.commit()
    assert _rows(state, refs) == [
        ("server/gone/env/API_KEY",),
        ("server/kept/env/API_KEY",),
    ]
    with daemon_process(base_dir) as d, d.client() as c:
        assert [s.name for s in c.list_servers()] == ["kept"]
        assert _rows(state, refs) == [("server/kept/env/API_KEY",)]
        d.wait_ready("kept")


def _remove(d: DaemonProcess, name: str) -> None:
    with contextlib.suppress(MemorizzError, OSError), d.client() as c:
        c.remove_server(name)


# --- the drain of a clean stop ----------------------------------------------


def test_a_call_answered_during_the_drain_is_in_the_database_after_a_clean_stop(
    base_dir: str,
) -> None:
    """SIGTERM with a call in flight: the drain lets it finish and answers it,
    then the daemon exits 0. Its record must be in ``state.db`` by then
    ("moved into the database ... when the daemon stops", docs/security.md;
    ``audit.spool`` is "moved in at the next start if the daemon was
    killed", docs/operations.md): a copy of ``state.db`` taken after a clean
    stop is the documented backup. The spool was moved in when the acceptors
    stopped, before the drain, and never again."""
    state = os.path.join(base_dir, "state")
    with daemon_process(base_dir) as d:
        assert sigterm_during_a_call(d, 0.5) == ["slept 0.5"]
    assert _rows(state, "SELECT action FROM audit ORDER BY id") == [
        ("servers/add",),
        ("tools/call",),
    ]
    assert os.path.getsize(os.path.join(state, "audit.spool")) == 0


# --- a read-only state directory --------------------------------------------


def test_a_read_only_state_directory_that_needs_tightening_is_refused_in_one_line(
    base_dir: str,
) -> None:
    """A state directory on a read-only mount whose database was left 0644:
    the start cannot tighten it. It used to die of the ``fchmod`` with a
    traceback; docs/operations.md promises one line and exit 1 for a state
    directory the daemon refuses, and the socket it bound removed."""
    state = os.path.join(base_dir, "state")
    with daemon_process(base_dir) as d:
        assert d.stop() == 0
    os.chmod(os.path.join(state, "state.db"), 0o644)
    _mount("--bind", state, state)
    try:
        _mount("-o", "remount,bind,ro", state)
        done = subprocess.run(
            daemon_argv(base_dir, log_level="warning"),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            cwd=ROOT,
            timeout=30,
            check=False,
        )
    finally:
        _umount(state)
    said = done.stderr.decode()
    assert done.returncode == 1, said
    assert "Traceback" not in said
    (line,) = said.splitlines()
    assert line.startswith("memorizzd: "), line
    assert f"{state}/state.db" in line
    assert "Read-only file system" in line
    assert not os.path.exists(os.path.join(base_dir, "d.sock"))
