"""The SQLite state database: run-time servers and what each server negotiated.

The only module that knows SQL. Calls are short and synchronous; async callers
run them with ``anyio.to_thread.run_sync``. WAL mode; ``synchronous=FULL`` so
an acknowledged ``servers/add`` survives a power cut.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Final

import msgspec

from memorizz.api.methods import ServerSpec

SCHEMA_VERSION: Final = 2
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
)


class StoreError(Exception):
    """The state database cannot be opened or written."""


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
            os.makedirs(state_dir, mode=0o700, exist_ok=True)
            fd = os.open(
                self.path, os.O_RDWR | os.O_CREAT, 0o600
            )  # never world-readable
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

    def close(self) -> None:
        self._db.close()

    def servers(self) -> list[ServerSpec]:
        with self._lock:
            rows = self._db.execute("SELECT spec FROM servers ORDER BY name").fetchall()
        return [self._decoder.decode(row[0]) for row in rows]

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

    def remove_server(self, name: str) -> bool:
        with self._lock:
            cursor = self._db.execute("DELETE FROM servers WHERE name = ?", (name,))
            self._db.execute("DELETE FROM negotiated WHERE name = ?", (name,))
        return cursor.rowcount > 0

    def negotiated(self, name: str) -> Negotiated | None:
        with self._lock:
            row = self._db.execute(
                "SELECT protocol_version, fingerprint FROM negotiated WHERE name = ?",
                (name,),
            ).fetchone()
        return Negotiated(row[0], row[1]) if row else None

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
