"""The state database: migrations and durability of what it holds."""

from __future__ import annotations

import os
import sqlite3
import stat
import time

from memorizz.api.methods import Proposal
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


def _proposal(proposal_id: str, *, created: float, ttl: float = 60.0) -> Proposal:
    return Proposal(
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
        assert store.proposal("p_a") == _proposal("p_a", created=now)
        assert not store.consume_proposal("p_a", now)  # pending: not yet
        step = {"from_status": ("pending",), "to_status": "approved", "now": now}
        assert store.transition_proposal("p_a", decided_by_uid=7, **step)
        assert not store.transition_proposal("p_a", **step)  # only once
        assert store.consume_proposal("p_a", now)
        assert not store.consume_proposal("p_a", now)
        assert [p.id for p in store.expire_proposals(now)] == ["p_old"]
        assert store.proposal("p_old") is not None
        assert store.prune_proposals(now - 86400) == 1
        assert store.proposal("p_old") is None
        consumed = store.proposal("p_a")
        assert consumed is not None
        assert (consumed.status, consumed.decided_by_uid) == ("consumed", 7)
        assert store.proposals(profile="beta", any_profile=False) == []
        assert store.next_expiry() is None
    finally:
        store.close()
