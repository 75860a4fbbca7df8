"""The SQLite state database: run-time servers, negotiated versions, the audit
trail, the vault's ciphertexts, approval proposals.

The only module that knows SQL, and the only one that imports ``sqlite3``:
every error SQLite raises leaves a ``Store`` method as :class:`StoreError`
(the ``sqlite3`` error is its ``__cause__``, for the log). Calls are short and
synchronous; async callers run them with ``anyio.to_thread.run_sync``, except
``append_audit`` (below).
WAL mode; ``synchronous=FULL`` so an acknowledged ``servers/add`` survives a
power cut.

The audit trail is appended on every call, so it has its own connection:
``synchronous=NORMAL`` (in WAL mode a committed record survives a crash or
SIGKILL of the daemon, though not a power cut; an fsync per call would cost
~250 us each on this class of disk) and no automatic checkpoints, so an append
is a ~10 us write that can run on the event loop; ``checkpoint()`` folds the
WAL back from a worker thread now and then.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Final, ParamSpec, TypeVar

import msgspec

from memorizz.api.methods import AuditRecord, Proposal, ServerSpec
from memorizzd.state_dir import FILE_MODE, StateDirError, secure_state_dir

SCHEMA_VERSION: Final = 5
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
)
_AUDIT_COLUMNS: Final = (
    "time, action, caller_socket, caller_uid, caller_gid, caller_pid, server, tool, risk,"
    " decision, outcome, reason, duration_ms, argument_keys, arguments_hmac, result_bytes,"
    " proposal_id, caller_profile"
)
_PROPOSAL_COLUMNS: Final = (
    "id, status, server, tool, risk, argument_keys, arguments_hmac, schema_hash,"
    " created, expires_at, caller_uid, caller_user, caller_pid, caller_profile,"
    " decided_by_uid, decided_by_user, approver_label, decided_at, reason, consumed_at"
)
_ACTIVE: Final = ("pending", "approved")


class StoreError(Exception):
    """The state database cannot be opened, read or written."""


P = ParamSpec("P")
R = TypeVar("R")


def _sqlite_errors(method: Callable[P, R]) -> Callable[P, R]:
    """``sqlite3.Error`` out of ``method`` becomes :class:`StoreError`."""

    @wraps(method)
    def translated(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return method(*args, **kwargs)
        except sqlite3.Error as exc:
            raise StoreError(f"state database: {exc}") from exc

    return translated


class Negotiated(msgspec.Struct, frozen=True):
    protocol_version: str
    fingerprint: str
    """Of how the server is reached: a changed command or URL forgets the version."""


def fingerprint(spec: ServerSpec) -> str:
    identity = msgspec.json.encode([spec.transport, spec.command, spec.args, spec.url])
    return hashlib.sha256(identity).hexdigest()[:32]


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
            raise StoreError(f"cannot open state database {self.path}: {exc}") from None
        self._lock = threading.Lock()
        self._encoder = msgspec.json.Encoder()
        self._decoder = msgspec.json.Decoder(ServerSpec)
        try:
            self._audit = sqlite3.connect(
                self.path, check_same_thread=False, isolation_level=None
            )
            self._audit.execute("PRAGMA synchronous=NORMAL")
            self._audit.execute("PRAGMA wal_autocheckpoint=0")
            self._audit.execute("PRAGMA busy_timeout=5000")
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open state database {self.path}: {exc}") from None

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
        self._audit.close()
        self._db.close()

    # --- the audit trail ----------------------------------------------------

    @_sqlite_errors
    def append_audit(self, records: list[AuditRecord]) -> None:
        """Append records in one transaction and set their ids. Durable when it
        returns (see above); all or none are written."""
        db = self._audit
        db.execute("BEGIN IMMEDIATE")
        try:
            for record in records:
                record.id = self._insert_audit(record)
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    def _insert_audit(self, record: AuditRecord) -> int:
        cursor = self._audit.execute(
            f"INSERT INTO audit ({_AUDIT_COLUMNS}) VALUES"  # noqa: S608 - constant columns
            " (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
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
            ),
        )
        return cursor.lastrowid or 0

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
    ) -> list[AuditRecord]:
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
        with self._lock:
            rows = self._db.execute(sql, (*args, limit)).fetchall()
        return [
            AuditRecord(
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
                argument_keys=msgspec.json.decode(row[14]),
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
    def servers(self) -> list[ServerSpec]:
        with self._lock:
            rows = self._db.execute("SELECT spec FROM servers ORDER BY name").fetchall()
        return [self._decoder.decode(row[0]) for row in rows]

    @_sqlite_errors
    def add_server(self, spec: ServerSpec) -> bool:
        """Insert; False when the name is taken."""
        with self._lock:
            try:
                self._db.execute(
                    "INSERT INTO servers (name, spec, created) VALUES (?, ?, ?)",
                    (spec.name, self._encoder.encode(spec), time.time()),
                )
            except sqlite3.IntegrityError:
                return False
        return True

    @_sqlite_errors
    def remove_server(self, name: str) -> bool:
        with self._lock:
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
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany(
                    "INSERT INTO secrets (ref, token, updated) VALUES (?, ?, ?)"
                    " ON CONFLICT(ref) DO UPDATE SET"
                    " token = excluded.token, updated = excluded.updated",
                    [(ref, token, now) for ref, token in tokens],
                )
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    @_sqlite_errors
    def delete_secrets(self, refs: list[str]) -> int:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                deleted = sum(
                    self._db.execute(
                        "DELETE FROM secrets WHERE ref = ?", (ref,)
                    ).rowcount
                    for ref in refs
                )
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
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
    def insert_proposal(self, p: Proposal) -> None:
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
    def proposal(self, proposal_id: str) -> Proposal | None:
        with self._lock:
            row = self._db.execute(
                f"SELECT {_PROPOSAL_COLUMNS} FROM proposals WHERE id = ?",  # noqa: S608
                (proposal_id,),
            ).fetchone()
        return _proposal(row) if row else None

    @_sqlite_errors
    def proposals(
        self,
        *,
        status: str | None = None,
        profile: str | None = None,
        any_profile: bool = True,
        server: str | None = None,
        limit: int = 1000,
    ) -> list[Proposal]:
        """Newest first; ``any_profile=False`` keeps ``profile``'s own (None: the
        operator socket's)."""
        where: list[str] = []
        args: list[object] = []
        if status is not None:
            where.append("status = ?")
            args.append(status)
        if not any_profile:
            where.append("caller_profile IS ?")
            args.append(profile)
        if server is not None:
            where.append("server = ?")
            args.append(server)
        sql = f"SELECT {_PROPOSAL_COLUMNS} FROM proposals"  # noqa: S608 - constant
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY created DESC, id LIMIT ?"
        with self._lock:
            rows = self._db.execute(sql, (*args, limit)).fetchall()
        return [_proposal(row) for row in rows]

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
    def expire_proposals(self, now: float) -> list[Proposal]:
        """Mark every pending or approved proposal past its expiry; return them."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
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
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
        return [
            msgspec.structs.replace(_proposal(row), status="expired") for row in rows
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
        with self._lock:
            (value,) = self._db.execute(
                "SELECT MIN(expires_at) FROM proposals WHERE status IN (?, ?)", _ACTIVE
            ).fetchone()
        return None if value is None else float(value)


def _proposal(row: tuple[object, ...]) -> Proposal:
    names = [name.strip() for name in _PROPOSAL_COLUMNS.split(",")]
    fields = dict(zip(names, row, strict=True))
    fields["argument_keys"] = msgspec.json.decode(str(fields["argument_keys"]))
    return msgspec.convert(fields, Proposal)
