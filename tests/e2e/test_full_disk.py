"""A full disk: the daemon's whole state directory (``state.db``, the keys,
``audit.spool``) on a 4 MiB tmpfs, filled with a file until writes fail,
under a real ``memorizzd`` driven by the real client, ``memorizzctl`` and a
raw MCP face client.

What it must do (docs/operations.md, "A full disk"): every write the disk
refuses is a precise error, ``storage_full`` (-32003), in one log line and
never a traceback; nothing is half done (no server half added, no proposal
without its arguments); reads and calls on the servers it has go on; the
daemon neither stops nor refuses to start for it; and once there is room,
everything works again, nothing acknowledged is lost, and the database is
whole (``PRAGMA integrity_check``). No secret reaches an error or the log.

What these found, each failing before its fix:

* every write answered ``internal`` with a traceback in the log;
* the approval book's own write (its time, an expiry) ended the daemon
  (exit 1) within seconds of the disk filling while a proposal was open, and
  the next start stopped at it ("state database: database or disk is full");
* audit records a killed daemon left in the spool stopped the next start;
* a server connecting while the disk was full (SIGHUP added it) could never
  be ready: writing down its protocol version failed its connection;
* a reload that removed a profile with open proposals answered ``internal``,
  and its proposals outlived it: approved and run once there was room;
* ``vault/rotate`` answered ``internal``, and a new key file's piece stayed.

Each test fills the disk within seconds of its daemon's start, well before
the auditor's first WAL checkpoint (30 s): a WAL checkpointed and reset
would take a few more writes in the room it already has.

The tmpfs needs root (CAP_SYS_ADMIN): without it, or where mounting fails,
every test here skips, as tests/e2e/test_kill_trials.py does.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from memorizz import Client
from memorizz.api.errors import (
    ConflictError,
    RemoteError,
    UnavailableError,
)
from memorizzd.audit import load_key
from tests import proposals_world as pw
from tests.harness import (
    LEGACY_SERVER,
    DaemonProcess,
    light_spec,
    wait_until,
)
from tests.peers import ME, agent_socket
from tests.process import MEMORIZZCTL
from tests.trials import digest, face_call

SECRET = "s3cret-full-disk-7f2c"  # noqa: S105 - a test value
"""A server's secret: it must never reach an error or the daemon's log."""
GONE = "the caller's profile was removed"


# --- the disk ------------------------------------------------------------------


class Disk:
    """The state directory, a tmpfs of its own; ``fill`` it, ``free`` it."""

    def __init__(self, state: str) -> None:
        self.state = state
        self.filler = os.path.join(state, "filler")

    def fill(self) -> None:
        """Write until the file system refuses another byte (ENOSPC)."""
        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            for size in (65536, 512, 1):
                with contextlib.suppress(OSError):
                    while True:
                        os.write(fd, bytes(size))
        finally:
            os.close(fd)
        found = os.statvfs(self.state)
        assert found.f_bavail == 0, "the tmpfs did not fill"

    def free(self) -> None:
        os.unlink(self.filler)


def _which(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        pytest.skip(f"needs {name}(8)")
    return found


@pytest.fixture
def disk(base_dir: str) -> Iterator[Disk]:
    """``base_dir/state`` on a 4 MiB tmpfs (0700), unmounted at the end."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a tmpfs")
    mount, umount = _which("mount"), _which("umount")
    state = os.path.join(base_dir, "state")
    os.mkdir(state, 0o700)
    done = subprocess.run(
        [mount, "-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs", state],
        capture_output=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs ({done.stderr.decode().strip()})")
    try:
        yield Disk(state)
    finally:
        subprocess.run([umount, "-l", state], capture_output=True, check=False)


# --- helpers -----------------------------------------------------------------


def _config(base: str, body: str = "") -> str:
    path = os.path.join(base, "memorizzd.toml")
    Path(path).write_text(body, encoding="utf-8")
    return path


def _asking_server(calls_log: str) -> str:
    """``[[servers]]`` ``a``: the legacy test server, every call held for
    approval, each call it runs written to ``calls_log``."""
    return (
        "[[servers]]\n"
        'name = "a"\n'
        'transport = "stdio"\n'
        f"command = {msgspec.json.encode(sys.executable).decode()}\n"
        f"args = [{msgspec.json.encode(LEGACY_SERVER).decode()}]\n"
        f"env = {{ CALL_LOG = {msgspec.json.encode(calls_log).decode()} }}\n"
        "require_approval = true\n"
    )


def _refused(work: Callable[[], object]) -> RemoteError:
    """``work()`` must be refused for the full disk: ``storage_full``, -32003."""
    with pytest.raises(RemoteError) as refused:
        work()
    error = refused.value
    assert (type(error), error.code, error.reason) == (
        UnavailableError,
        -32003,
        "storage_full",
    ), error
    assert "state directory is full" in error.message
    assert SECRET not in repr(error) + str(error.data)
    return error


def _rows(state: str, sql: str) -> list[tuple[Any, ...]]:
    uri = f"file:{Path(state, 'state.db')}?mode=ro"
    with contextlib.closing(sqlite3.connect(uri, uri=True)) as db:
        return db.execute(sql).fetchall()


def _whole(state: str) -> None:
    """The database passes ``integrity_check``; every open proposal has its
    arguments, and no arguments are left of one that is over or never was."""
    assert _rows(state, "PRAGMA integrity_check") == [("ok",)]
    open_ids = {
        row[0]
        for row in _rows(
            state, "SELECT id FROM proposals WHERE status IN ('pending', 'approved')"
        )
    }
    kept = {
        row[0].split("/")[1]
        for row in _rows(state, "SELECT ref FROM secrets WHERE ref LIKE 'proposal/%'")
    }
    assert kept == open_ids
    ids = [row[0] for row in _rows(state, "SELECT id FROM audit ORDER BY id")]
    assert len(ids) == len(set(ids))


def _no_traceback_nor_secret(d: DaemonProcess) -> str:
    said = d.log()
    assert "Traceback" not in said
    assert SECRET not in said
    return said


def _names(d: DaemonProcess) -> list[str]:
    with d.client() as c:
        return sorted(s.name for s in c.list_servers())


# --- every write path, refused and then whole --------------------------------


def test_a_full_disk_refuses_each_write_with_storage_full_and_loses_nothing(
    base_dir: str, disk: Disk
) -> None:
    """servers/add (the database, the vault for its secret), servers/remove,
    a call that needs approval (the proposal, its arguments in the vault),
    approve, reject and resume: each is refused with ``storage_full`` while
    the disk is full, through the client, memorizzctl and the MCP face, and
    changes nothing. Reads and calls on the servers the daemon has go on.
    Then there is room, and each works, on the state it had."""
    d = DaemonProcess(base_dir, config=_config(base_dir)).start()
    try:
        with d.client() as c:
            c.add_server(light_spec("t"))
            c.add_server(
                light_spec("a", require_approval=True, secret_env={"API_KEY": SECRET})
            )
        d.wait_ready("t")
        d.wait_ready("a")
        with d.client() as c:
            pending = pw.propose(c, "a", "pending", tool="hello")
            approved = pw.propose(c, "a", "approved", tool="hello")
            c.approve(approved)
            rejected = pw.propose(c, "a", "to-reject", tool="hello")
            c.call_tool("t", "hello", {"text": "before"})
            before = [(r.id, r.action) for r in c.audit(limit=100).records]
            shown = {p.id: p.status for p in c.list_approvals()}

        disk.fill()
        with d.client() as c:
            # what writes nothing but its audit record goes on
            assert [tool.name for tool in c.list_tools("t")] == ["hello"]
            assert c.call_tool("t", "hello", {"text": "full"}).content
            assert sorted(s.name for s in c.list_servers()) == ["a", "t"]
            assert {p.id: p.status for p in c.list_approvals()} == shown
            # every write: storage_full, nothing changed
            _refused(
                lambda: c.add_server(light_spec("n", secret_env={"API_KEY": SECRET}))
            )
            _refused(lambda: c.add_server(light_spec("m")))
            _refused(lambda: c.remove_server("t"))
            _refused(lambda: c.call_tool("a", "hello", {"tag": "while-full"}))
            _refused(lambda: c.approve(pending))
            _refused(lambda: c.reject(rejected))
            _refused(lambda: c.resume(approved))
            assert sorted(s.name for s in c.list_servers()) == ["a", "t"]
            assert {p.id: p.status for p in c.list_approvals()} == shown
            assert c.call_tool("t", "hello", {"text": "still"}).content
        # memorizzctl: one line, the reason, exit 75 (worth retrying)
        done = subprocess.run(
            [MEMORIZZCTL, "--socket", d.socket, "mcp", "remove", "t"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert done.returncode == 75, done.stderr
        assert done.stderr.endswith(" (storage_full)\n"), done.stderr
        # the MCP face: the same error, on its own wire
        reply = face_call(
            os.path.join(base_dir, "mcp.sock"), "a__hello", {"tag": "face"}
        )
        assert reply["error"]["code"] == -32003, reply
        assert reply["error"]["data"]["reason"] == "storage_full", reply
        said = _no_traceback_nor_secret(d)
        assert "servers/add (id " in said
        assert "refused, the state directory is full" in said

        disk.free()
        with d.client() as c:
            assert {p.id: p.status for p in c.list_approvals()} == shown
            arguments = {
                p.id: p.arguments for p in c.list_approvals(show_arguments=True)
            }
            assert arguments[pending] == {"tag": "pending"}
            assert c.resume(approved).content
            assert c.approve(pending).status == "approved"
            assert c.reject(rejected).status == "rejected"
            assert c.add_server(light_spec("n", secret_env={"API_KEY": SECRET}))
            assert c.remove_server("t").name == "t"
            after = [(r.id, r.action) for r in c.audit(limit=200).records]
        assert set(before) <= set(after)  # nothing acknowledged was lost
        d.wait_ready("n")
        _no_traceback_nor_secret(d)
        assert d.stop() == 0
    finally:
        if d.running:
            d.stop()
    _whole(disk.state)
    assert _rows(
        disk.state, "SELECT ref FROM secrets WHERE ref LIKE 'server/%' ORDER BY ref"
    ) == [("server/a/env/API_KEY",), ("server/n/env/API_KEY",)]
    assert _rows(disk.state, "SELECT name FROM servers ORDER BY name") == [
        ("a",),
        ("n",),
    ]


# --- the approval book's own writes --------------------------------------------


def test_an_open_proposal_that_expires_on_a_full_disk_does_not_stop_the_daemon(
    base_dir: str, disk: Disk
) -> None:
    """The book writes down an expiry (and its time) on its own: refused by
    the full disk, it used to end the daemon (exit 1, every client cut off).
    Now the daemon serves on; the proposal reads as expired at once, and the
    expiry is written (and audited) once there is room."""
    config = _config(base_dir, "approval_ttl_s = 2.0\n")
    d = DaemonProcess(base_dir, config=config).start()
    try:
        with d.client() as c:
            c.add_server(light_spec("t"))
            c.add_server(light_spec("a", require_approval=True))
        d.wait_ready("t")
        d.wait_ready("a")
        with d.client() as c:
            proposal = pw.propose(c, "a", "expiring", tool="hello")
            (open_one,) = c.list_approvals()
        disk.fill()
        wait_until(  # a second past its expiry: the book's sweep was refused
            lambda: time.time() > open_one.expires_at + 1.0,
            timeout=15,
            what="the proposal's expiry",
            alive=d.check,  # it used to exit here
        )
        assert "cannot write to the state database" in d.log()
        with d.client() as c:
            assert c.call_tool("t", "hello", {"text": "alive"}).content
            (shown,) = c.list_approvals()
            assert (shown.id, shown.status) == (proposal, "expired")
        _no_traceback_nor_secret(d)

        disk.free()
        wait_until(
            lambda: _rows(disk.state, "SELECT status FROM proposals") == [("expired",)],
            timeout=15,
            what="the expiry written once there is room",
            alive=d.check,
        )
        with d.client() as c:
            assert "approvals/expire" in {r.action for r in c.audit().records}
        assert d.stop() == 0
    finally:
        if d.running:
            d.stop()
    _whole(disk.state)


# --- a restart on a full disk --------------------------------------------------


def test_a_restart_on_a_full_disk_starts_and_keeps_the_spooled_records(
    base_dir: str, disk: Disk
) -> None:
    """A daemon killed with records in its spool and a proposal open; the
    disk fills; the next start used to stop at once (exit 1: the spool could
    not be moved in, nor the book's time written). Now it starts, says the
    disk is full, serves, and refuses writes; once there is room the spooled
    records are in the trail, once each."""
    config = _config(base_dir)
    d = DaemonProcess(base_dir, config=config).start()
    try:
        with d.client() as c:
            c.add_server(light_spec("t"))
            c.add_server(light_spec("a", require_approval=True))
        d.wait_ready("t")
        d.wait_ready("a")
        with d.client() as c:
            proposal = pw.propose(c, "a", "kept", tool="hello")
            c.audit()  # in the database so far: the spool is empty
            tags = [f"spooled-{i}" for i in range(3)]
            for tag in tags:
                c.call_tool("t", "hello", {"tag": tag})
        os.kill(d.pid, signal.SIGKILL)  # within FLUSH_AFTER_S of those calls
        assert d.proc is not None
        d.proc.wait(10)
    finally:
        if d.running:
            d.stop()
    assert os.path.getsize(os.path.join(disk.state, "audit.spool")) > 0

    disk.fill()
    again = DaemonProcess(base_dir, config=config, log_name="again.log")
    again.start()
    try:
        again.wait_ready("t")
        with again.client() as c:
            assert c.call_tool("t", "hello", {"tag": "full"}).content
            assert [(p.id, p.status) for p in c.list_approvals()] == [
                (proposal, "pending")
            ]
            _refused(lambda: c.add_server(light_spec("n")))
        said = _no_traceback_nor_secret(again)
        assert "is full (0 bytes free)" in said

        disk.free()
        with again.client() as c:
            records = c.audit(limit=200).records
        key = load_key(disk.state)
        digests = [r.arguments_hmac for r in records]
        for tag in tags:  # each spooled record in the trail, once
            assert digests.count(digest(key, {"tag": tag})) == 1, tag
        ids = [r.id for r in records]
        assert len(ids) == len(set(ids))
        assert again.stop() == 0
    finally:
        if again.running:
            again.stop()
    _whole(disk.state)


# --- a server that connects while the disk is full -----------------------------


def test_a_server_a_sighup_adds_on_a_full_disk_becomes_ready(
    base_dir: str, disk: Disk
) -> None:
    """SIGHUP with a new server in the file, on a full disk: the reload
    persists nothing but its audit record, and the server must connect.
    Writing down its negotiated protocol version (a hint for next time)
    failed its connection, again and again, for as long as the disk was full."""
    config = _config(base_dir)
    d = DaemonProcess(base_dir, config=config).start()
    try:
        disk.fill()
        _config(
            base_dir,
            "[[servers]]\n"
            'name = "c"\n'
            'transport = "stdio"\n'
            f"command = {msgspec.json.encode(sys.executable).decode()}\n"
            f"args = [{msgspec.json.encode(LEGACY_SERVER).decode()}]\n",
        )
        os.kill(d.pid, signal.SIGHUP)
        wait_until(lambda: _names(d) == ["c"], what="the reload", alive=d.check)
        d.wait_ready("c", timeout=15)
        with d.client() as c:
            assert c.call_tool("c", "hello", {}).content
            assert c.daemon_status().last_reload is not None
        _no_traceback_nor_secret(d)
        disk.free()
        assert d.stop() == 0
    finally:
        if d.running:
            d.stop()
    _whole(disk.state)


# --- a reload that removes a profile with open proposals -----------------------


def test_a_profile_removed_on_a_full_disk_takes_its_proposals_along(
    base_dir: str, disk: Disk
) -> None:
    """A reload removes profile ``alpha`` while the disk is full: the
    invalidation of its open proposals cannot be written. The reload used to
    answer ``internal`` and leave them open: approved and run once there was
    room, outliving their profile. Now the reload is applied, the
    invalidations are owed: while they cannot be written an operator's
    approve or resume is refused (``storage_full``), and once there is room
    they are written, and neither proposal ever runs."""
    calls_log = os.path.join(base_dir, "calls.log")
    server = _asking_server(calls_log)
    agents = f"agents_dir = {msgspec.json.encode(os.path.join(base_dir, 'agents')).decode()}\n"
    alpha = f'[[profiles]]\nname = "alpha"\nservers = ["a"]\nuids = [{ME}]\n'
    beta = f'[[profiles]]\nname = "beta"\nservers = ["a"]\nuids = [{ME}]\n'
    config = _config(base_dir, agents + server + alpha + beta)
    d = DaemonProcess(base_dir, config=config).start()
    try:
        d.wait_ready("a")
        with Client(agent_socket(base_dir, "alpha")) as agent, d.client() as c:
            pending = pw.propose(agent, "a", "alpha-pending", tool="hello")
            approved = pw.propose(agent, "a", "alpha-approved", tool="hello")
            c.approve(approved)
        disk.fill()
        _config(base_dir, agents + server + beta)
        with d.client() as c:
            assert c.daemon_reload().profiles_removed == ["alpha"]
            _refused(lambda: c.approve(pending))
            _refused(lambda: c.resume(approved))
        _no_traceback_nor_secret(d)

        disk.free()
        with d.client() as c:
            for proposal_id in (pending, approved):
                with pytest.raises(ConflictError) as refused:
                    c.resume(proposal_id)
                assert refused.value.data["status"] == "invalidated"
            shown = {p.id: (p.status, p.reason) for p in c.list_approvals()}
        assert shown == {
            pending: ("invalidated", GONE),
            approved: ("invalidated", GONE),
        }
        assert d.stop() == 0
    finally:
        if d.running:
            d.stop()
    assert not os.path.exists(calls_log)  # neither ever ran
    _whole(disk.state)


# --- the vault's key ------------------------------------------------------------


def test_a_vault_rotation_on_a_full_disk_is_refused_whole(
    base_dir: str, disk: Disk
) -> None:
    """``vault/rotate`` re-encrypts every secret in one transaction, and with
    ``new_key`` first writes the key file anew: on a full disk both used to
    answer ``internal`` with a traceback (the key file's ``ENOSPC`` too), and
    the new key file's piece was left behind as ``vault.key.tmp``. Now both
    are ``storage_full``, the key file is as it was, and once there is room
    the rotation works and the secret still reaches its server."""
    config = _config(base_dir)
    key_file = os.path.join(disk.state, "vault.key")
    d = DaemonProcess(base_dir, config=config).start()
    try:
        with d.client() as c:
            c.add_server(light_spec("t", secret_env={"API_KEY": SECRET}))
        d.wait_ready("t")
        key = Path(key_file).read_bytes()
        disk.fill()
        with d.client() as c:
            _refused(c.rotate_vault)
            _refused(lambda: c.rotate_vault(new_key=True))
        assert Path(key_file).read_bytes() == key
        assert not os.path.exists(f"{key_file}.tmp")
        _no_traceback_nor_secret(d)
        disk.free()
        with d.client() as c:
            assert c.rotate_vault(new_key=True).reencrypted == 2  # and the canary
        assert d.stop() == 0
    finally:
        if d.running:
            d.stop()
    again = DaemonProcess(base_dir, config=config, log_name="again.log").start()
    try:
        again.wait_ready("t")  # its secret decrypts under the new key
    finally:
        again.stop()
    _whole(disk.state)


# --- a start with the wall clock behind ------------------------------------------

_AHEAD = """\
import os, sys, time
from memorizzd.approvals import CLOCK_REF
from memorizzd.store import Store
from memorizzd.vault import FernetCredentialStore
from memorizzd.vault.fernet import keys_for
store = Store(sys.argv[1])
vault = FernetCredentialStore.open(store, keys_for(store, sys.argv[1]))
vault.put(CLOCK_REF, repr(time.time() + 3600.0))
os._exit(0)
"""
"""The approval book's last time seen, an hour ahead of the wall clock,
written by a process that never closes the database (nor does the daemon,
killed): ``state.db-shm`` stays, so SQLite can open it on a full disk."""


def test_a_start_on_a_full_disk_with_the_clock_behind_serves_and_fails_closed(
    base_dir: str, disk: Disk
) -> None:
    """The wall clock is an hour behind the approval book's last time (an RTC
    reset, NTP not synced yet at boot) and the disk is full: every open
    proposal must end (their age cannot be told), and the writes that end
    them may be refused. The start used to fail (exit 1) on that write. Now
    it serves, and an approved proposal never runs: refused while its end is
    owed (``storage_full``), over once there is room."""
    calls_log = os.path.join(base_dir, "calls.log")
    server = _asking_server(calls_log)
    config = _config(base_dir, server)
    d = DaemonProcess(base_dir, config=config).start()
    try:
        d.wait_ready("a")
        with d.client() as c:
            approved = pw.propose(c, "a", "approved", tool="hello")
            c.approve(approved)
        subprocess.run([sys.executable, "-c", _AHEAD, disk.state], check=True)
        os.kill(d.pid, signal.SIGKILL)
        assert d.proc is not None
        d.proc.wait(10)
    finally:
        if d.running:
            d.stop()
    disk.fill()
    again = DaemonProcess(base_dir, config=config, log_name="again.log")
    try:
        again.start(timeout=15)
        again.wait_ready("a")
        with again.client() as c:
            with pytest.raises(RemoteError) as refused:  # its end owed, or made
                c.resume(approved)
            error = refused.value
            assert error.reason == "storage_full" or isinstance(error, ConflictError)
        disk.free()
        with again.client() as c:
            with pytest.raises(ConflictError) as over:
                c.resume(approved)
            assert over.value.data["status"] in ("expired", "invalidated")
        assert again.stop() == 0
    finally:
        if again.running:
            again.stop()
    assert not os.path.exists(calls_log)  # it never ran
