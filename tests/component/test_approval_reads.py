"""Approval reads open no write transaction (issue 10, part 2).

A component test: the real store, vault, audit trail and approval book, no
socket. Another connection holds the state database's write lock (``BEGIN
IMMEDIATE``, as a backup tool or a second writer would) while every read of
the book answers, a proposal past its deadline already reading as expired.
Before, each ``get``, ``list_for`` and ``wait`` swept expiries first, in a
write transaction that waited out the lock (5 s) and then failed.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import anyio

from memorizz.api.errors import NotFoundError
from memorizzd.approvals import arguments_ref
from memorizzd.caller import Caller
from memorizzd.store import ProposalRow
from memorizzd.vault import VaultError
from tests.component.wiring import proposal_row, stored_book

OPERATOR = Caller(pid=1, uid=0, gid=0, socket="/op.sock", role="operator")
AGENT = Caller(
    pid=2, uid=1000, gid=1000, socket="/alpha.sock", profile="alpha", role="agent"
)
READ_BUDGET_S = 3.0
"""Bounds a hang: a read that waits for the lock waits 5 s (busy_timeout)."""


@contextlib.contextmanager
def _write_locked(state: str) -> Iterator[None]:
    """Another connection holds the database's write lock."""
    other = sqlite3.connect(Path(state, "state.db"), isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        yield
        other.execute("ROLLBACK")
    finally:
        other.close()


def test_approval_reads_answer_while_another_connection_holds_the_write_lock(
    base_dir: str,
) -> None:
    state = os.path.join(base_dir, "state")
    with stored_book(base_dir, ttl_s=60.0) as booked:
        store, vault, auditor, book = (
            booked.store,
            booked.vault,
            booked.auditor,
            booked.book,
        )

        def stored_proposal(tag: str, expires_at: float) -> ProposalRow:
            """A pending proposal of AGENT's, its arguments in the vault."""
            row = proposal_row(
                auditor, tag, created=expires_at - 60.0, expires_at=expires_at
            )
            vault.put(arguments_ref(row.id), f'{{"tag":"{tag}"}}')
            store.insert_proposal(row)
            return row

        now = time.time()
        late = stored_proposal("late", now - 60.0)  # a minute past its deadline
        live = stored_proposal("live", now + 60.0)

        async def scenario() -> None:
            with _write_locked(state), anyio.fail_after(READ_BUDGET_S):
                assert (await book.get(AGENT, live.id)).status == "pending"
                assert (await book.get(OPERATOR, late.id)).status == "expired"
                assert (await book.get_any(late.id)).status == "expired"
                waited = await book.wait(AGENT, live.id, 0.0)
                assert waited.status == "pending"
                assert (await book.wait(AGENT, late.id, 5.0)).status == "expired"
                listed = await book.list_for(AGENT, status=None, limit=10)
                assert [(p.id, p.status) for p in listed] == [
                    (live.id, "pending"),
                    (late.id, "expired"),
                ]
                expired = await book.list_for(OPERATOR, status="expired", limit=10)
                assert [p.id for p in expired] == [late.id]
                pending = await book.list_for(OPERATOR, status="pending", limit=10)
                assert [p.id for p in pending] == [live.id]

            # The sweep (the book's background task) writes it down, once the
            # lock is free: status, an audit record, the arguments gone.
            await book.sweep()
            row = store.proposal(late.id, now=0.0)
            assert row is not None
            assert row.status == "expired"
            records = store.list_audit(
                server=None,
                tool=None,
                outcome=None,
                since=None,
                before_id=None,
                limit=10,
            )
            assert [(r.action, r.proposal_id) for r in records] == [
                ("approvals/expire", late.id)
            ]
            try:
                vault.get(arguments_ref(late.id))
            except VaultError:
                pass
            else:
                raise AssertionError("the expired proposal's arguments are kept")
            assert vault.get(arguments_ref(live.id)) == '{"tag":"live"}'

        anyio.run(scenario)


def test_waits_that_end_keep_nothing_and_a_decision_wakes_every_waiter(
    base_dir: str,
) -> None:
    """Waits on an unknown id, on a decided proposal and ones that time out
    leave the book holding nothing for them (an agent looping on
    ``approvals/wait`` with made-up ids cost a dict entry each); three
    waiters of one proposal all wake at its approval, at once."""
    with stored_book(base_dir, ttl_s=60.0) as booked:
        now = time.time()
        row = proposal_row(booked.auditor, "w", created=now, expires_at=now + 60.0)
        booked.vault.put(arguments_ref(row.id), '{"tag":"w"}')
        booked.store.insert_proposal(row)
        book = booked.book

        async def scenario() -> None:
            for i in range(50):
                with contextlib.suppress(NotFoundError):
                    await book.wait(AGENT, f"p_{i:024x}", 1.0)
            assert (await book.wait(AGENT, row.id, 0.01)).status == "pending"
            assert book._changed == {}
            woken: list[str] = []

            async def waiter() -> None:
                woken.append((await book.wait(AGENT, row.id, 30.0)).status)

            with anyio.fail_after(10):
                async with anyio.create_task_group() as tg:
                    for _ in range(3):
                        tg.start_soon(waiter)
                    await anyio.wait_all_tasks_blocked()
                    await book.approve(OPERATOR, row.id, label=None)
            assert woken == ["approved"] * 3
            assert (await book.wait(AGENT, row.id, 1.0)).status == "approved"
            assert book._changed == {}
            assert book._waiters == {}

        anyio.run(scenario)
