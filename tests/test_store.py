"""The state database: migrations and durability of what it holds."""

from __future__ import annotations

import os
import sqlite3
import stat

from memorizzd.store import _MIGRATIONS, SCHEMA_VERSION, Negotiated, Store, fingerprint
from tests.harness import stdio_spec


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
        assert store.add_server(spec)
        assert not store.add_server(spec)  # the name is taken
        assert store.servers() == [spec]
        assert store.remove_server("one")
        assert not store.remove_server("one")
    finally:
        store.close()
    mode = stat.S_IMODE(os.stat(os.path.join(base_dir, "state", "state.db")).st_mode)
    assert mode == 0o600
    assert stat.S_IMODE(os.stat(os.path.join(base_dir, "state")).st_mode) == 0o700
