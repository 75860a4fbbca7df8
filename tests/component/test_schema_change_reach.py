"""A fresh listing reaches every open proposal of its server, however many
later ones there are.

A component test: the real store, vault, audit trail and approval book, no
socket. ``ApprovalBook.tools_listed`` (a connect or ``tools/list_changed``)
invalidates the open proposals whose tool changed its schema. It read the
server's proposals through ``Store.proposals``, which stops at the newest
1,000: an open proposal older than 1,000 later ones (rejected, expired, run)
kept its approval across a schema change.
"""

from __future__ import annotations

import time

import anyio

from memorizz.api import methods as m
from memorizzd.approvals import arguments_ref, schema_hash
from memorizzd.store import ProposalRow
from tests.component.wiring import proposal_row, stored_book

LATER = 1_001
"""Later, closed proposals of the same server: one more than a listing page."""
OLD_SCHEMA = {"type": "object", "properties": {"tag": {"type": "string"}}}
NEW_SCHEMA = {"type": "object", "properties": {"tag": {"type": "integer"}}}


def test_a_schema_change_reaches_an_open_proposal_behind_a_thousand_later_ones(
    base_dir: str,
) -> None:
    with stored_book(base_dir, ttl_s=3600.0) as booked:
        store, vault, auditor, book = (
            booked.store,
            booked.vault,
            booked.auditor,
            booked.book,
        )
        now = time.time()

        def row(tag: str, status: str, created: float) -> ProposalRow:
            return proposal_row(
                auditor,
                tag,
                status=status,
                created=created,
                expires_at=now + 3600.0,
                schema_hash=schema_hash(OLD_SCHEMA),
            )

        old = row("old", "approved", now - 100.0)
        vault.put(arguments_ref(old.id), '{"tag":"old"}')
        store.insert_proposal(old)
        for i in range(LATER):
            store.insert_proposal(row(f"later{i}", "rejected", now - 50.0 + i / 1e4))
        unchanged = [m.Tool(name="record", input_schema=OLD_SCHEMA)]
        changed = [m.Tool(name="record", input_schema=NEW_SCHEMA)]

        async def scenario() -> None:
            await book.tools_listed("t", unchanged)
            assert (await book.get_any(old.id)).status == "approved"
            await book.tools_listed("t", changed)
            assert (await book.get_any(old.id)).status == "invalidated"

        anyio.run(scenario)
