"""The SQLite state database: run-time servers, negotiated versions, the audit
trail, the vault's ciphertexts, approval proposals.

The only module that knows SQL, and the only one that imports ``sqlite3``:
every error SQLite raises leaves a ``Store`` method as :class:`StoreError`
(the ``sqlite3`` error is its ``__cause__``, for the log), and a write the
full file system refused as :class:`StorageFullError`: SQLite took it back
whole (every transaction here is rolled back when any part of it, its
``COMMIT`` included, fails), so the database is as it was. Calls are short and
synchronous; async callers run them with ``anyio.to_thread.run_sync``, except
``append_audit`` (below).
WAL mode; ``synchronous=FULL`` so an acknowledged ``servers/add`` survives a
power cut.

The rows are the store's own types (``ServerRow``, ``AuditRow``,
``ProposalRow``), never the wire structs: this module imports nothing from
``memorizz``, so a change to the wire contract cannot change the schema. A
server's spec is kept as the JSON document it was given, with its format's
version; ``memorizzd.stored`` converts between rows and wire structs.

Reads that must answer whoever holds the write lock (proposals, the audit
trail) go through a third connection that is ``query_only``: it never opens a
write transaction, and in WAL mode a reader never waits for a writer. A
proposal past its deadline reads as ``expired`` before the book's sweep
(``expire_proposals``) has written it so.

The audit trail is appended in batches (each record is made safe first in
``memorizzd.spool``, one write per call), so it has its own connection:
``synchronous=NORMAL`` (in WAL mode a committed record survives a crash or
SIGKILL of the daemon, though not a power cut; an fsync per batch would cost
~250 us each on this class of disk) and no automatic checkpoints, so a batch
is a short write that can run on the event loop; ``checkpoint()`` folds the
WAL back from a worker thread now and then.
"""

from __future__ import annotations

import errno
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import wraps
from pathlib import Path
from typing import Final, ParamSpec, TypeVar

import msgspec

from memorizzd.state_dir import FILE_MODE, StateDirError, no_room, secure_state_dir

SCHEMA_VERSION: Final = 6
_MIGRATIONS: Final = (
    """
    CREATE TABLE servers (
        name TEXT PRIMARY KEY,
        spec BLOB NOT NULL,
        created REAL NOT NULL
    );
    CREATE TABLE negotiated (
        name TEXT PRIMARY KEY,
        protocol_version TEXT NOT NULL,
        updated REAL NOT NULL
    );
    """,
    # 2: the version is remembered per way of reaching the server
    "ALTER TABLE negotiated ADD COLUMN fingerprint TEXT NOT NULL DEFAULT '';",
    # 3: the append-only audit trail
    """
    CREATE TABLE audit (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        time REAL NOT NULL,
        action TEXT NOT NULL,
        caller_socket TEXT NOT NULL,
        caller_uid INTEGER NOT NULL,
        caller_gid INTEGER NOT NULL,
        caller_pid INTEGER NOT NULL,
        server TEXT,
        tool TEXT,
        risk TEXT,
        decision TEXT,
        outcome TEXT NOT NULL,
        reason TEXT,
        duration_ms REAL NOT NULL,
        argument_keys TEXT NOT NULL,
        arguments_hmac TEXT,
        result_bytes INTEGER
    );
    CREATE INDEX audit_server_time ON audit (server, time);
    CREATE TRIGGER audit_no_update BEFORE UPDATE ON audit
        BEGIN SELECT RAISE(ABORT, 'the audit trail is append-only'); END;
    CREATE TRIGGER audit_no_delete BEFORE DELETE ON audit
        BEGIN SELECT RAISE(ABORT, 'the audit trail is append-only'); END;
    """,
    # 4: the vault: Fernet tokens, each binding its own ref (memorizzd.vault)
    """
    CREATE TABLE secrets (
        ref TEXT PRIMARY KEY,
        token BLOB NOT NULL,
        updated REAL NOT NULL
    );
    """,
    # 5: approval proposals (their arguments live in the vault), and the audit
    # trail names the proposal and the caller's profile
    """
    CREATE TABLE proposals (
        id TEXT PRIMARY KEY,
        status TEXT NOT NULL,
        server TEXT NOT NULL,
        tool TEXT NOT NULL,
        risk TEXT,
        argument_keys TEXT NOT NULL,
        arguments_hmac TEXT NOT NULL,
        schema_hash TEXT NOT NULL,
        created REAL NOT NULL,
        expires_at REAL NOT NULL,
        caller_uid INTEGER NOT NULL,
        caller_user TEXT,
        caller_pid INTEGER NOT NULL,
        caller_profile TEXT,
        decided_by_uid INTEGER,
        decided_by_user TEXT,
        approver_label TEXT,
        decided_at REAL,
        reason TEXT,
        consumed_at REAL
    );
    CREATE INDEX proposals_status ON proposals (status, expires_at);
    ALTER TABLE audit ADD COLUMN proposal_id TEXT;
    ALTER TABLE audit ADD COLUMN caller_profile TEXT;
    """,
    # 6: a server's spec is a JSON document with the version of its format
    # (until now, version 1: the wire's ServerSpec as it was)
    "ALTER TABLE servers ADD COLUMN spec_version INTEGER NOT NULL DEFAULT 1;",
)
_AUDIT_COLUMNS: Final = (
    "time, action, caller_socket, caller_uid, caller_gid, caller_pid, server, tool, risk,"
    " decision, outcome, reason, duration_ms, argument_keys, arguments_hmac, result_bytes,"
    " proposal_id, caller_profile"
)
_INSERT_AUDIT: Final = (
    f"INSERT OR IGNORE INTO audit (id, {_AUDIT_COLUMNS}) VALUES"  # noqa: S608 - constant columns
    " (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
"""A record with its id; one already in the trail (a replayed spool) is left."""
_PROPOSAL_FIELDS: Final = (
    "id",
    "status",
    "server",
    "tool",
    "risk",
    "argument_keys",
    "arguments_hmac",
    "schema_hash",
    "created",
    "expires_at",
    "caller_uid",
    "caller_user",
    "caller_pid",
    "caller_profile",
    "decided_by_uid",
    "decided_by_user",
    "approver_label",
    "decided_at",
    "reason",
    "consumed_at",
)
_PROPOSAL_COLUMNS: Final = ", ".join(_PROPOSAL_FIELDS)
_ACTIVE: Final = ("pending", "approved")
_STATUS_AT: Final = (
    "CASE WHEN status IN ('pending', 'approved') AND expires_at <= ?"
    " THEN 'expired' ELSE status END"
)
"""A proposal's status at a time (one ``?``): past its deadline, an open one
has expired, whether or not the sweep has written it yet."""
_PROPOSAL_AT: Final = ", ".join(
    _STATUS_AT if name == "status" else name for name in _PROPOSAL_FIELDS
)


class StoreError(Exception):
    """The state database cannot be opened, read or written."""


class StorageFullError(StoreError):
    """The file system of the state directory is full (SQLite's
    ``SQLITE_FULL``, ``ENOSPC`` or ``EDQUOT``): the write was not made, and
    what the database held before is whole. Reads still answer; writes
    succeed again once there is room."""


P = ParamSpec("P")
R = TypeVar("R")

_FULL_ERRNOS: Final = frozenset({errno.ENOSPC, errno.EDQUOT})
_IO_CODES: Final = frozenset({sqlite3.SQLITE_IOERR, sqlite3.SQLITE_CANTOPEN})


def _null(value: None) -> None:
    return None


# sqlite3 binds None as NULL only after looking for an adapter of it, a look-up
# that fails by formatting an AttributeError (about 1 us; an audit record binds
# four Nones): the obvious adapter, registered, answers at once.
sqlite3.register_adapter(type(None), _null)


def full(exc: BaseException, directory: str | os.PathLike[str] | None = None) -> bool:
    """Whether ``exc`` says the file system is full: SQLite's word
    (``SQLITE_FULL``) or the kernel's (``ENOSPC``, ``EDQUOT``); or, for an
    I/O error of SQLite's that names no cause (a shared-memory file it could
    not grow: ``disk I/O error``), ``directory``'s file system has no room."""
    if isinstance(exc, sqlite3.Error):
        code = getattr(exc, "sqlite_errorcode", None)
        if code is None:
            return False
        if code & 0xFF == sqlite3.SQLITE_FULL:
            return True
        return (
            code & 0xFF in _IO_CODES
            and directory is not None
            and no_room(os.fspath(directory))
        )
    return isinstance(exc, OSError) and exc.errno in _FULL_ERRNOS


def _sqlite_errors(method: Callable[P, R]) -> Callable[P, R]:
    """``sqlite3.Error`` out of ``method`` becomes :class:`StoreError`
    (:class:`StorageFullError` when the file system is full)."""

    @wraps(method)
    def translated(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return method(*args, **kwargs)
        except sqlite3.Error as exc:
            store = args[0] if args else None
            directory = store.path.parent if isinstance(store, Store) else None
            kind = StorageFullError if full(exc, directory) else StoreError
            raise kind(f"state database: {exc}") from exc

    return translated


@contextmanager
def _transaction(db: sqlite3.Connection) -> Iterator[None]:
    """``BEGIN IMMEDIATE`` ... ``COMMIT``, all or nothing: whatever fails
    inside, the ``COMMIT`` too (a full disk), the transaction is rolled back
    if SQLite has not already done so, so that no later statement on the
    connection runs inside it (and is never committed)."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise


# --- the rows: the store's own types (the schema), never the wire structs -----


class Negotiated(msgspec.Struct, frozen=True):
    protocol_version: str
    fingerprint: str
    """Of how the server is reached: a changed command or URL forgets the version."""


class ServerRow(msgspec.Struct, frozen=True, kw_only=True):
    """A server added at run time."""

    name: str
    spec: bytes
    """The spec, as the JSON document it was given (never decoded here)."""
    spec_version: int
    """The document's format; ``memorizzd.stored`` knows how to read it."""
    created: float


class AuditRow(msgspec.Struct, kw_only=True):
    """One record of the append-only audit trail."""

    id: int
    """Given by the auditor, in order (``Store.last_audit_id`` + 1, ...)."""
    time: float
    action: str
    caller_socket: str
    caller_uid: int
    caller_gid: int
    caller_pid: int
    server: str | None
    tool: str | None
    risk: str | None
    decision: str | None
    outcome: str
    reason: str | None
    duration_ms: float
    argument_keys: list[str]
    arguments_hmac: str | None
    result_bytes: int | None
    proposal_id: str | None
    caller_profile: str | None


class ProposalRow(msgspec.Struct, frozen=True, kw_only=True):
    """An approval proposal (its arguments live in the vault, not here)."""

    id: str
    status: str
    server: str
    tool: str
    risk: str | None
    argument_keys: list[str]
    arguments_hmac: str
    schema_hash: str
    created: float
    expires_at: float
    caller_uid: int
    caller_user: str | None
    caller_pid: int
    caller_profile: str | None
    decided_by_uid: int | None = None
    decided_by_user: str | None = None
    approver_label: str | None = None
    decided_at: float | None = None
    reason: str | None = None
    consumed_at: float | None = None


class Store:
    def __init__(self, state_dir: str) -> None:
        self.path = Path(state_dir) / "state.db"
        try:
            # 0700 and the daemon's own, its files 0600: before SQLite opens
            # anything (its WAL and shm files copy the database file's mode).
            secure_state_dir(state_dir)
        except StateDirError as exc:
            raise StoreError(str(exc)) from None
        try:
            fd = os.open(
                self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
            )
            try:
                os.fchmod(fd, FILE_MODE)  # 0600 whatever the umask
            finally:
                os.close(fd)
            self._db = sqlite3.connect(
                self.path, check_same_thread=False, isolation_level=None
            )
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute("PRAGMA busy_timeout=5000")
            self._migrate()
        except (OSError, sqlite3.Error) as exc:
            if full(exc, state_dir):
                raise StorageFullError(
                    f"cannot open state database {self.path}: {exc}"
                ) from None
            raise StoreError(f"cannot open state database {self.path}: {exc}") from None
        self._lock = threading.Lock()
        self._encoder = msgspec.json.Encoder()
        self._keys = msgspec.json.Decoder(list[str])
        try:
            self._audit = sqlite3.connect(
                self.path, check_same_thread=False, isolation_level=None
            )
            self._audit.execute("PRAGMA synchronous=NORMAL")
            self._audit.execute("PRAGMA wal_autocheckpoint=0")
            self._audit.execute("PRAGMA busy_timeout=5000")
            self._reader = sqlite3.connect(
                self.path, check_same_thread=False, isolation_level=None
            )
            self._reader.execute("PRAGMA query_only=ON")  # a write here fails
            self._reader.execute("PRAGMA busy_timeout=5000")
        except sqlite3.Error as exc:
            kind = StorageFullError if full(exc, state_dir) else StoreError
            raise kind(f"cannot open state database {self.path}: {exc}") from None
        self._read_lock = threading.Lock()

    def _migrate(self) -> None:
        (version,) = self._db.execute("PRAGMA user_version").fetchone()
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"{self.path} was written by a newer memorizzd (schema {version})"
            )
        for i in range(version, SCHEMA_VERSION):
            self._db.executescript(
                f"BEGIN; {_MIGRATIONS[i]} PRAGMA user_version={i + 1}; COMMIT;"
            )

    @_sqlite_errors
    def close(self) -> None:
        self._reader.close()
        self._audit.close()
        self._db.close()

    # --- the audit trail ----------------------------------------------------

    @_sqlite_errors
    def append_audit(self, records: list[AuditRow]) -> None:
        """Append records, each with its id (given by the auditor), in one
        transaction: all or none are written. A record whose id is already
        in the trail is left as it is (a spool replayed after a crash)."""
        db = self._audit
        rows = [self._audit_row(record) for record in records]
        if len(rows) == 1:  # one statement is its own transaction
            db.execute(_INSERT_AUDIT, rows[0])
            return
        with _transaction(db):
            db.executemany(_INSERT_AUDIT, rows)

    def _audit_row(self, record: AuditRow) -> tuple[object, ...]:
        return (
            record.id,
            record.time,
            record.action,
            record.caller_socket,
            record.caller_uid,
            record.caller_gid,
            record.caller_pid,
            record.server,
            record.tool,
            record.risk,
            record.decision,
            record.outcome,
            record.reason,
            record.duration_ms,
            self._encoder.encode(record.argument_keys).decode(),
            record.arguments_hmac,
            record.result_bytes,
            record.proposal_id,
            record.caller_profile,
        )

    @_sqlite_errors
    def last_audit_id(self) -> int:
        """The highest id ever given to a record (0: none yet)."""
        (highest,) = self._audit.execute("SELECT max(id) FROM audit").fetchone()
        return int(highest or 0)

    @_sqlite_errors
    def list_audit(
        self,
        *,
        server: str | None,
        tool: str | None,
        outcome: str | None,
        since: float | None,
        before_id: int | None,
        limit: int,
    ) -> list[AuditRow]:
        """Newest first, filtered; ``before_id`` pages towards older records."""
        where: list[str] = []
        args: list[str | float] = []
        for column, value in (("server", server), ("tool", tool), ("outcome", outcome)):
            if value is not None:
                where.append(f"{column} = ?")
                args.append(value)
        if since is not None:
            where.append("time >= ?")
            args.append(since)
        if before_id is not None:
            where.append("id < ?")
            args.append(before_id)
        sql = f"SELECT id, {_AUDIT_COLUMNS} FROM audit"  # noqa: S608 - constant columns
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY id DESC LIMIT ?"
        with self._read_lock:
            rows = self._reader.execute(sql, (*args, limit)).fetchall()
        return [
            AuditRow(
                id=row[0],
                time=row[1],
                action=row[2],
                caller_socket=row[3],
                caller_uid=row[4],
                caller_gid=row[5],
                caller_pid=row[6],
                server=row[7],
                tool=row[8],
                risk=row[9],
                decision=row[10],
                outcome=row[11],
                reason=row[12],
                duration_ms=row[13],
                argument_keys=self._keys.decode(row[14]),
                arguments_hmac=row[15],
                result_bytes=row[16],
                proposal_id=row[17],
                caller_profile=row[18],
            )
            for row in rows
        ]

    @_sqlite_errors
    def checkpoint(self) -> None:
        """Fold the WAL back into the database (PASSIVE: never blocks writers)."""
        with self._lock:
            self._db.execute("PRAGMA wal_checkpoint(PASSIVE)")

    @_sqlite_errors
    def servers(self) -> list[ServerRow]:
        with self._lock:
            rows = self._db.execute(
                "SELECT name, spec, spec_version, created FROM servers ORDER BY name"
            ).fetchall()
        return [
            ServerRow(
                name=row[0], spec=bytes(row[1]), spec_version=row[2], created=row[3]
            )
            for row in rows
        ]

    @_sqlite_errors
    def add_server(self, name: str, spec: bytes, *, spec_version: int) -> bool:
        """Keep ``spec`` (a JSON document, in format ``spec_version``) under
        ``name``; False when the name is taken."""
        with self._lock:
            try:
                self._db.execute(
                    "INSERT INTO servers (name, spec, spec_version, created)"
                    " VALUES (?, ?, ?, ?)",
                    (name, spec, spec_version, time.time()),
                )
            except sqlite3.IntegrityError:
                return False
        return True

    @_sqlite_errors
    def remove_server(self, name: str) -> bool:
        """Its row and its negotiated version, in one transaction."""
        with self._lock, _transaction(self._db):
            cursor = self._db.execute("DELETE FROM servers WHERE name = ?", (name,))
            self._db.execute("DELETE FROM negotiated WHERE name = ?", (name,))
        return cursor.rowcount > 0

    @_sqlite_errors
    def negotiated(self, name: str) -> Negotiated | None:
        with self._lock:
            row = self._db.execute(
                "SELECT protocol_version, fingerprint FROM negotiated WHERE name = ?",
                (name,),
            ).fetchone()
        return Negotiated(row[0], row[1]) if row else None

    @_sqlite_errors
    def set_negotiated(self, name: str, negotiated: Negotiated) -> None:
        with self._lock:
            self._db.execute(
                "INSERT INTO negotiated (name, fingerprint, protocol_version, updated)"
                " VALUES (?, ?, ?, ?) ON CONFLICT(name) DO UPDATE SET"
                " fingerprint = excluded.fingerprint,"
                " protocol_version = excluded.protocol_version, updated = excluded.updated",
                (
                    name,
                    negotiated.fingerprint,
                    negotiated.protocol_version,
                    time.time(),
                ),
            )

    # --- the vault's ciphertexts (memorizzd.vault encrypts; this only stores) --

    @_sqlite_errors
    def secret(self, ref: str) -> bytes | None:
        with self._lock:
            row = self._db.execute(
                "SELECT token FROM secrets WHERE ref = ?", (ref,)
            ).fetchone()
        return bytes(row[0]) if row else None

    @_sqlite_errors
    def put_secrets(self, tokens: list[tuple[str, bytes]]) -> None:
        """Insert or replace, all in one transaction (durable: synchronous=FULL)."""
        now = time.time()
        with self._lock, _transaction(self._db):
            self._db.executemany(
                "INSERT INTO secrets (ref, token, updated) VALUES (?, ?, ?)"
                " ON CONFLICT(ref) DO UPDATE SET"
                " token = excluded.token, updated = excluded.updated",
                [(ref, token, now) for ref, token in tokens],
            )

    @_sqlite_errors
    def rewrite_secrets(self, tokens: list[tuple[str, bytes, bytes]]) -> int:
        """``(ref, old, new)``: each row that still holds ``old`` gets ``new``,
        all in one transaction; a row deleted or rewritten since ``old`` was
        read is left as it is (never written back). The rows rewritten."""
        now = time.time()
        with self._lock, _transaction(self._db):
            rewritten = sum(
                self._db.execute(
                    "UPDATE secrets SET token = ?, updated = ?"
                    " WHERE ref = ? AND token = ?",
                    (new, now, ref, old),
                ).rowcount
                for ref, old, new in tokens
            )
        return rewritten

    @_sqlite_errors
    def delete_secrets(self, refs: list[str]) -> int:
        with self._lock, _transaction(self._db):
            deleted = sum(
                self._db.execute("DELETE FROM secrets WHERE ref = ?", (ref,)).rowcount
                for ref in refs
            )
        return deleted

    @_sqlite_errors
    def secret_refs(self) -> list[str]:
        with self._lock:
            rows = self._db.execute("SELECT ref FROM secrets ORDER BY ref").fetchall()
        return [row[0] for row in rows]

    @_sqlite_errors
    def all_secrets(self) -> list[tuple[str, bytes]]:
        with self._lock:
            rows = self._db.execute(
                "SELECT ref, token FROM secrets ORDER BY ref"
            ).fetchall()
        return [(row[0], bytes(row[1])) for row in rows]

    @_sqlite_errors
    def clear_secrets(self) -> int:
        with self._lock:
            cursor = self._db.execute("DELETE FROM secrets")
        return cursor.rowcount

    # --- approval proposals (memorizzd.approvals decides; this only stores) --

    @_sqlite_errors
    def insert_proposal(self, p: ProposalRow) -> None:
        """Durable when it returns (synchronous=FULL)."""
        with self._lock:
            self._db.execute(
                f"INSERT INTO proposals ({_PROPOSAL_COLUMNS}) VALUES"  # noqa: S608 - constant
                " (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    p.id,
                    p.status,
                    p.server,
                    p.tool,
                    p.risk,
                    self._encoder.encode(p.argument_keys).decode(),
                    p.arguments_hmac,
                    p.schema_hash,
                    p.created,
                    p.expires_at,
                    p.caller_uid,
                    p.caller_user,
                    p.caller_pid,
                    p.caller_profile,
                    p.decided_by_uid,
                    p.decided_by_user,
                    p.approver_label,
                    p.decided_at,
                    p.reason,
                    p.consumed_at,
                ),
            )

    @_sqlite_errors
    def proposal(self, proposal_id: str, *, now: float) -> ProposalRow | None:
        """As it stands at ``now`` (read-only: past its deadline, an open one
        reads as expired)."""
        with self._read_lock:
            row = self._reader.execute(
                f"SELECT {_PROPOSAL_AT} FROM proposals WHERE id = ?",  # noqa: S608
                (now, proposal_id),
            ).fetchone()
        return self._proposal(row) if row else None

    @_sqlite_errors
    def proposals(
        self,
        *,
        now: float,
        status: str | None = None,
        profile: str | None = None,
        any_profile: bool = True,
        server: str | None = None,
        call: tuple[int, str, str] | None = None,
        limit: int = 1000,
    ) -> list[ProposalRow]:
        """Newest first, as they stand at ``now`` (read-only, as ``proposal``);
        ``any_profile=False`` keeps ``profile``'s own (None: the operator
        socket's); ``call``: only those of this caller uid, tool (of
        ``server``) and arguments HMAC."""
        where: list[str] = []
        args: list[object] = [now]
        if status is not None:
            where.append(f"{_STATUS_AT} = ?")
            args.extend((now, status))
        if not any_profile:
            where.append("caller_profile IS ?")
            args.append(profile)
        if server is not None:
            where.append("server = ?")
            args.append(server)
        if call is not None:
            where.append("caller_uid = ? AND tool = ? AND arguments_hmac = ?")
            args.extend(call)
        sql = f"SELECT {_PROPOSAL_AT} FROM proposals"  # noqa: S608 - constant
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY created DESC, id LIMIT ?"
        with self._read_lock:
            rows = self._reader.execute(sql, (*args, limit)).fetchall()
        return [self._proposal(row) for row in rows]

    @_sqlite_errors
    def open_proposals(
        self, *, now: float, server: str | None = None
    ) -> list[ProposalRow]:
        """Every pending or approved proposal not past its deadline at ``now``
        (``server``'s only, if given), oldest first, however many (read-only,
        as ``proposal``)."""
        sql = (
            f"SELECT {_PROPOSAL_COLUMNS} FROM proposals"  # noqa: S608 - constant
            " WHERE status IN (?, ?) AND expires_at > ?"
        )
        args: tuple[object, ...] = (*_ACTIVE, now)
        if server is not None:
            sql += " AND server = ?"
            args += (server,)
        with self._read_lock:
            rows = self._reader.execute(sql + " ORDER BY created, id", args).fetchall()
        return [self._proposal(row) for row in rows]

    @_sqlite_errors
    def count_open_proposals(self, *, profile: str | None, now: float) -> int:
        """How many of ``profile``'s proposals (None: the operator socket's)
        are pending or approved and not past their deadline at ``now``."""
        with self._read_lock:
            (count,) = self._reader.execute(
                "SELECT COUNT(*) FROM proposals WHERE status IN (?, ?)"
                " AND expires_at > ? AND caller_profile IS ?",
                (*_ACTIVE, now, profile),
            ).fetchone()
        return int(count)

    @_sqlite_errors
    def transition_proposal(
        self,
        proposal_id: str,
        *,
        from_status: tuple[str, ...],
        to_status: str,
        now: float,
        **fields: object,
    ) -> bool:
        """One atomic step: ``from_status`` -> ``to_status`` unless expired;
        True when this call made it (rowcount 1). Durable when it returns."""
        sets = ", ".join(f"{name} = ?" for name in fields)
        placeholders = ", ".join("?" for _ in from_status)
        sql = (
            f"UPDATE proposals SET status = ?{', ' + sets if sets else ''}"  # noqa: S608
            f" WHERE id = ? AND status IN ({placeholders}) AND expires_at > ?"
        )
        with self._lock:
            cursor = self._db.execute(
                sql, (to_status, *fields.values(), proposal_id, *from_status, now)
            )
        return cursor.rowcount == 1

    @_sqlite_errors
    def consume_proposal(self, proposal_id: str, now: float) -> bool:
        """approved -> consumed, exactly once, before the call is sent."""
        with self._lock:
            cursor = self._db.execute(
                "UPDATE proposals SET status = 'consumed', consumed_at = ?"
                " WHERE id = ? AND status = 'approved' AND expires_at > ?",
                (now, proposal_id, now),
            )
        return cursor.rowcount == 1

    @_sqlite_errors
    def expire_proposals(self, now: float) -> list[ProposalRow]:
        """Mark every pending or approved proposal past its expiry; return them."""
        with self._lock, _transaction(self._db):
            rows = self._db.execute(
                f"SELECT {_PROPOSAL_COLUMNS} FROM proposals"  # noqa: S608
                " WHERE status IN (?, ?) AND expires_at <= ?",
                (*_ACTIVE, now),
            ).fetchall()
            self._db.execute(
                "UPDATE proposals SET status = 'expired'"
                " WHERE status IN (?, ?) AND expires_at <= ?",
                (*_ACTIVE, now),
            )
        return [
            msgspec.structs.replace(self._proposal(row), status="expired")
            for row in rows
        ]

    @_sqlite_errors
    def prune_proposals(self, before: float) -> int:
        """Forget proposals that ended (any state but pending/approved) and were
        made before ``before``; the audit trail keeps their story."""
        with self._lock:
            cursor = self._db.execute(
                "DELETE FROM proposals WHERE status NOT IN (?, ?) AND created < ?",
                (*_ACTIVE, before),
            )
        return cursor.rowcount

    @_sqlite_errors
    def next_expiry(self) -> float | None:
        with self._read_lock:
            (value,) = self._reader.execute(
                "SELECT MIN(expires_at) FROM proposals WHERE status IN (?, ?)", _ACTIVE
            ).fetchone()
        return None if value is None else float(value)

    def _proposal(self, row: tuple[object, ...]) -> ProposalRow:
        fields = dict(zip(_PROPOSAL_FIELDS, row, strict=True))
        fields["argument_keys"] = self._keys.decode(str(fields["argument_keys"]))
        return msgspec.convert(fields, ProposalRow)
