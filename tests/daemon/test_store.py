"""The state database: migrations and durability of what it holds."""

from __future__ import annotations

import contextlib
import functools
import os
import sqlite3
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from memorizzd import audit, spool, state_dir
from memorizzd.caller import Caller
from memorizzd.store import (
    _MIGRATIONS,
    SCHEMA_VERSION,
    Negotiated,
    ProposalRow,
    Store,
    StoreError,
)
from memorizzd.stored import add_server, fingerprint, servers
from memorizzd.vault import keys
from tests.harness import stdio_spec
from tests.peers import needs_root


@pytest.fixture
def umask_022() -> Iterator[None]:
    """The usual login umask: what a directory made by hand gets."""
    old = os.umask(0o022)
    yield
    os.umask(old)


def _mode(path: str | Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_an_older_database_is_migrated_in_place(base_dir: str) -> None:
    os.makedirs(os.path.join(base_dir, "state"))
    path = os.path.join(base_dir, "state", "state.db")
    db = sqlite3.connect(path)
    db.executescript(f"{_MIGRATIONS[0]} PRAGMA user_version=1;")
    db.execute("INSERT INTO negotiated VALUES ('t', '2025-11-25', 0)")
    db.commit()
    db.close()

    store = Store(os.path.join(base_dir, "state"))
    try:
        assert store.negotiated("t") == Negotiated(
            "2025-11-25", ""
        )  # forgotten: no match
        store.set_negotiated(
            "t", Negotiated("2026-07-28", fingerprint(stdio_spec("t")))
        )
        assert store.negotiated("t") == Negotiated(
            "2026-07-28", fingerprint(stdio_spec("t"))
        )
    finally:
        store.close()
    check = sqlite3.connect(path)
    assert check.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
    check.close()


def test_the_database_is_private_and_servers_round_trip(base_dir: str) -> None:
    store = Store(os.path.join(base_dir, "state"))
    try:
        spec = stdio_spec("one", env={"K": "v"})
        assert add_server(store, spec)
        assert not add_server(store, spec)  # the name is taken
        assert servers(store) == [spec]
        assert store.remove_server("one")
        assert not store.remove_server("one")
    finally:
        store.close()
    mode = stat.S_IMODE(os.stat(os.path.join(base_dir, "state", "state.db")).st_mode)
    assert mode == 0o600
    assert stat.S_IMODE(os.stat(os.path.join(base_dir, "state")).st_mode) == 0o700


def _proposal(proposal_id: str, *, created: float, ttl: float = 60.0) -> ProposalRow:
    return ProposalRow(
        id=proposal_id,
        status="pending",
        server="t",
        tool="record",
        risk="destructive",
        argument_keys=["tag"],
        arguments_hmac="00",
        schema_hash="11",
        created=created,
        expires_at=created + ttl,
        caller_uid=0,
        caller_user="root",
        caller_pid=1,
        caller_profile="alpha",
    )


def test_proposal_steps_are_atomic_and_single_use(base_dir: str) -> None:
    store = Store(os.path.join(base_dir, "state"))
    try:
        now = time.time()
        store.insert_proposal(_proposal("p_a", created=now))
        store.insert_proposal(_proposal("p_old", created=now - 30 * 86400, ttl=1))
        assert store.proposal("p_a", now=now) == _proposal("p_a", created=now)
        assert not store.consume_proposal("p_a", now)  # pending: not yet
        approve = functools.partial(
            store.transition_proposal,
            from_status=("pending",),
            to_status="approved",
            now=now,
        )
        assert approve("p_a", decided_by_uid=7)
        assert not approve("p_a")  # only once
        assert store.consume_proposal("p_a", now)
        assert not store.consume_proposal("p_a", now)
        assert [p.id for p in store.expire_proposals(now)] == ["p_old"]
        assert store.proposal("p_old", now=now) is not None
        assert store.prune_proposals(now - 86400) == 1
        assert store.proposal("p_old", now=now) is None
        consumed = store.proposal("p_a", now=now)
        assert consumed is not None
        assert (consumed.status, consumed.decided_by_uid) == ("consumed", 7)
        assert store.proposals(now=now, profile="beta", any_profile=False) == []
        assert store.next_expiry() is None
    finally:
        store.close()


def test_the_state_files_the_daemon_keeps_are_all_known() -> None:
    assert keys.KEY_FILE in state_dir.PRIVATE_FILES
    assert audit.KEY_FILE in state_dir.PRIVATE_FILES
    assert f"{keys.KEY_FILE}.tmp" in state_dir.PRIVATE_FILES
    assert f"{audit.KEY_FILE}.tmp" in state_dir.PRIVATE_FILES
    assert spool.FILE_NAME in state_dir.PRIVATE_FILES


@pytest.mark.usefixtures("umask_022")
def test_a_state_directory_left_open_is_tightened_with_its_files(
    base_dir: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A state directory made by hand (0755) with a database and keys copied in
    (0644): the directory becomes 0700 and every file 0600, and it is logged.
    Before, all of it stayed as it was, and SQLite made its WAL and shm files
    0644 too, after the database file."""
    state = Path(base_dir, "state")
    state.mkdir(mode=0o755)
    db = sqlite3.connect(state / "state.db")
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("CREATE TABLE t (x)")
    db.close()
    for name in ("state.db", "vault.key", "audit.key"):
        (state / name).touch()
        os.chmod(state / name, 0o644)
    assert _mode(state) == 0o755
    store = Store(str(state))
    try:
        add_server(store, stdio_spec("one"))  # writes the WAL and shm files
        assert {p.name: _mode(p) for p in state.iterdir()} == {
            "state.db": 0o600,
            "state.db-wal": 0o600,
            "state.db-shm": 0o600,
            "vault.key": 0o600,
            "audit.key": 0o600,
        }
    finally:
        store.close()
    assert _mode(state) == 0o700
    assert f"state directory {state} was 0755, open to other users" in caplog.text
    assert f"file {state}/vault.key was 0644" in caplog.text


def test_a_new_state_directory_and_database_are_private_whatever_the_umask(
    base_dir: str,
) -> None:
    old = os.umask(0)
    try:
        store = Store(os.path.join(base_dir, "state"))
        add_server(store, stdio_spec("one"))
        store.close()
    finally:
        os.umask(old)
    state = Path(base_dir, "state")
    assert _mode(state) == 0o700
    assert {_mode(p) for p in state.iterdir()} == {0o600}


def _a_file(p: Path) -> None:
    p.write_text("x")


def _a_link(p: Path) -> None:
    p.symlink_to(p.parent / "elsewhere", target_is_directory=True)


def _a_linked_key(p: Path) -> None:
    p.mkdir()
    (p / "vault.key").symlink_to("/etc/hostname")


def _a_fifo_database(p: Path) -> None:
    p.mkdir()
    os.mkfifo(p / "state.db")


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (_a_file, "is not a directory; refusing to start"),
        (_a_link, "is a symbolic link; set state_dir to the directory itself"),
        (_a_linked_key, r"vault\.key is a symbolic link"),
        (_a_fifo_database, r"state\.db is not a regular file"),
    ],
)
def test_a_state_directory_that_is_not_a_private_directory_is_refused(
    base_dir: str, make: Callable[[Path], None], message: str
) -> None:
    state = Path(base_dir, "state")
    (state.parent / "elsewhere").mkdir(mode=0o755)
    make(state)
    with pytest.raises(StoreError, match=message):
        Store(str(state))
    assert _mode(state.parent / "elsewhere") == 0o755  # never followed
    assert not (state.parent / "elsewhere" / "state.db").exists()


@needs_root
def test_a_state_directory_owned_by_another_uid_is_refused(base_dir: str) -> None:
    """Its owner could read or replace the keys whatever its mode."""
    state = Path(base_dir, "state")
    state.mkdir(mode=0o755)
    os.chown(state, 4300, 4300)
    with pytest.raises(StoreError, match="is owned by uid 4300, and memorizzd runs"):
        Store(str(state))
    assert _mode(state) == 0o755
    assert list(state.iterdir()) == []
    os.chown(state, 0, 0)
    (state / "audit.key").touch()
    os.chown(state / "audit.key", 4300, 4300)
    with pytest.raises(StoreError, match=r"audit\.key is owned by uid 4300"):
        Store(str(state))


def test_wal_and_full_sync_where_a_lost_write_would_matter(base_dir: str) -> None:
    """SECURITY.md §6.2 #29. The main connection writes what must survive a
    power cut: server specs, the vault's ciphertexts (bearer and OAuth tokens,
    the rotated refresh token before it is used) and approval proposals, at
    ``synchronous=FULL``. The audit trail has its own connection at NORMAL: in
    WAL mode a committed record survives a crash of the daemon (see
    tests/e2e/test_crash_consistency.py), though not a power cut."""
    s = Store(os.path.join(base_dir, "state"))
    try:
        assert s._db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert s._db.execute("PRAGMA synchronous").fetchone() == (2,)  # FULL
        assert s._audit.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert s._audit.execute("PRAGMA synchronous").fetchone() == (1,)  # NORMAL
        assert s._audit.execute("PRAGMA wal_autocheckpoint").fetchone() == (0,)
    finally:
        s.close()
    # WAL is a property of the file: whoever opens it next is in WAL mode too.
    with contextlib.closing(sqlite3.connect(Path(base_dir, "state", "state.db"))) as db:
        assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_a_failing_database_is_a_store_error_to_its_callers(
    base_dir: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Only the store knows SQLite: what fails inside it reaches its callers as
    a StoreError, and the audit trail logs a record it could not write and goes on."""
    s = Store(os.path.join(base_dir, "state"))
    s.close()  # every statement now fails inside sqlite3
    with pytest.raises(StoreError) as failed:
        s.servers()
    assert isinstance(failed.value.__cause__, sqlite3.Error)
    auditor = audit.Auditor(s, b"k" * 32, mirror_to_journal=False)
    caller = Caller(pid=1, uid=2, gid=3, socket="/s", role="operator")
    with caplog.at_level("ERROR", logger="memorizzd.audit"):
        auditor.record(caller, action="ping", started=time.time(), outcome="ok")
    assert "could not write an audit record" in caplog.text
