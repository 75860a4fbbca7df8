"""The audit spool: a record is safe once written there, reaches the state
database in batches, and a spool left by a killed daemon is moved in at the
next start, each record once."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import anyio
import pytest

from memorizzd.audit import FLUSH_AT, Auditor
from memorizzd.caller import Caller
from memorizzd.spool import Spool
from memorizzd.store import Store
from tests.harness import daemon_process, stdio_spec

CALLER = Caller(pid=1, uid=2, gid=3, socket="/s", role="operator")


def _trail(store: Store) -> list[tuple[int, str]]:
    rows = store.list_audit(
        server=None, tool=None, outcome=None, since=None, before_id=None, limit=100
    )
    return [(row.id, row.action) for row in reversed(rows)]


async def _record(auditor: Auditor, *actions: str) -> None:
    for action in actions:
        auditor.record(CALLER, action=action, started=time.time(), outcome="ok")


def test_records_are_spooled_then_moved_in_one_batch(base_dir: str) -> None:
    state = os.path.join(base_dir, "state")
    store = Store(state)
    spool = Spool(state)
    try:
        auditor = Auditor(store, b"k" * 32, mirror_to_journal=False, spool=spool)

        async def main() -> None:
            await _record(auditor, "a", "b")
            assert _trail(store) == []  # safe in the spool, not yet moved
            assert len(spool.read()) == 2
            auditor.flush()

        anyio.run(main)
        assert _trail(store) == [(1, "a"), (2, "b")]
        assert spool.read() == []
    finally:
        spool.close()
        store.close()


def test_a_spool_left_behind_is_moved_in_once_at_start(base_dir: str) -> None:
    """A daemon killed before the batch (records only in the spool), or after
    the batch but before the spool was emptied (records in both): the next
    start moves each record in exactly once, and new ids follow on."""
    state = os.path.join(base_dir, "state")
    store = Store(state)
    spool = Spool(state)
    try:
        first = Auditor(store, b"k" * 32, mirror_to_journal=False, spool=spool)

        async def killed_after_a_batch() -> None:
            await _record(first, "a", "b")
            store.append_audit(spool.read())  # the batch, not the emptying
            await _record(first, "c")  # and one more, only spooled

        anyio.run(killed_after_a_batch)
        assert _trail(store) == [(1, "a"), (2, "b")]
        with open(spool.path, "ab") as f:
            f.write(b'{"id": 4, "time": 1.0, "act')  # cut short by the crash

        second = Auditor(store, b"k" * 32, mirror_to_journal=False, spool=spool)
        assert second.recover() == 3
        assert _trail(store) == [(1, "a"), (2, "b"), (3, "c")]
        assert spool.read() == []
        anyio.run(_record, second, "d")
        second.flush()
        assert _trail(store)[-1] == (4, "d")
    finally:
        spool.close()
        store.close()


def test_a_record_survives_sigkill_right_after_the_reply(base_dir: str) -> None:
    """The call is answered only once its record is in the spool: SIGKILL at
    once, and the restarted daemon's trail has it."""
    with daemon_process(base_dir) as d:
        with d.client() as c:
            c.add_server(stdio_spec("t"))
        assert d.proc is not None
        os.kill(d.proc.pid, signal.SIGKILL)
        d.proc.wait(10)
    spooled = Path(base_dir, "state", "audit.spool").read_bytes()
    with daemon_process(base_dir) as d, d.client() as c:
        actions = [(r.action, r.server) for r in c.audit().records]
    assert actions.count(("servers/add", "t")) == 1
    if spooled:  # killed before the batch: the start moved it in
        assert "audit records from" in d.log()


@pytest.mark.parametrize("records", [1, FLUSH_AT + 88])
def test_many_records_are_moved_without_waiting_for_the_timer(
    base_dir: str, records: int
) -> None:
    state = os.path.join(base_dir, "state")
    store = Store(state)
    spool = Spool(state)
    try:
        auditor = Auditor(store, b"k" * 32, mirror_to_journal=False, spool=spool)
        anyio.run(_record, auditor, *(["x"] * records))
        # the FLUSH_AT-th record moved all that waited; the timer, the rest
        assert store.last_audit_id() == (0 if records == 1 else FLUSH_AT)
    finally:
        spool.close()
        store.close()
