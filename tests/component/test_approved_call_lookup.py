"""A call finds its caller's approved proposal of exactly that call, however
many approved ones others have.

A component test: the real store, vault, audit trail and approval book, no
socket. Before, the look-up read the caller's kind of socket's 100 newest
approved proposals and picked its own among them: another uid of the same
profile with 100 approved, unused ones hid the caller's, whose call was then
proposed again instead of running.
"""

from __future__ import annotations

import os
import time

import anyio
import msgspec

from memorizzd.approvals import arguments_ref, schema_hash
from memorizzd.audit import Auditor
from memorizzd.caller import Caller
from memorizzd.store import Store
from tests.component.wiring import components, proposal_row, stored_book, wired_config
from tests.peers import calls

OTHERS = 150
"""More than the window the look-up used to read."""

ALPHA = Caller(
    pid=2, uid=1000, gid=1000, socket="/alpha.sock", profile="alpha", role="agent"
)
ALPHA_OTHER_UID = msgspec.structs.replace(ALPHA, uid=1001, pid=3)
BETA = msgspec.structs.replace(ALPHA, profile="beta", socket="/beta.sock")
OPERATOR = Caller(pid=1, uid=1000, gid=0, socket="/op.sock", role="operator")


def _others(store: Store, auditor: Auditor, now: float, uid: int) -> None:
    """``OTHERS`` approved proposals of ``uid``'s in profile ``alpha``, each
    newer than the caller's (made ``now - 10``)."""
    for n in range(OTHERS):
        other = proposal_row(
            auditor,
            f"other{n}",
            status="approved",
            created=now - 5 + n / 1000,
            expires_at=now + 60,
        )
        store.insert_proposal(msgspec.structs.replace(other, caller_uid=uid))


def test_a_callers_approved_call_is_found_behind_many_of_another_uids(
    base_dir: str,
) -> None:
    with stored_book(base_dir, ttl_s=60.0) as booked:
        store, auditor, book = booked.store, booked.auditor, booked.book
        now = time.time()
        mine = proposal_row(
            auditor, "mine", status="approved", created=now - 10, expires_at=now + 60
        )
        store.insert_proposal(mine)
        _others(store, auditor, now, ALPHA_OTHER_UID.uid)
        digest = auditor.digest({"tag": "mine"})

        async def scenario() -> None:
            found = await book.approved_call(ALPHA, "t", "record", digest)
            assert found is not None
            assert found.id == mine.id
            # only the caller's own: not another uid's, profile's or socket's
            for caller in (ALPHA_OTHER_UID, BETA, OPERATOR):
                assert await book.approved_call(caller, "t", "record", digest) is None
            # only exactly that call
            assert await book.approved_call(ALPHA, "t", "other", digest) is None
            assert await book.approved_call(ALPHA, "u", "record", digest) is None
            other = auditor.digest({"tag": "other0"})
            assert await book.approved_call(ALPHA, "t", "record", other) is None

        anyio.run(scenario)


def test_a_face_call_runs_its_approved_proposal_behind_many_of_another_uids(
    base_dir: str,
) -> None:
    """The call pipeline as the face runs it (``reuse_approved``): the real
    broker, pool and server ``t``; the caller's approved call runs, once,
    instead of being proposed again."""
    config = wired_config(base_dir)
    caller = msgspec.structs.replace(ALPHA, uid=os.getuid())

    async def scenario() -> None:
        async with components(config) as wired:
            auditor = wired.broker.tool_calls._auditor  # the daemon's own key
            view = wired.pool.get("t").tools_view
            assert view is not None
            listed = view.tool("record")
            assert listed is not None
            now = time.time()
            mine = proposal_row(
                auditor,
                "mine",
                status="approved",
                created=now - 10,
                expires_at=now + 60,
                schema_hash=schema_hash(listed.input_schema),
            )
            mine = msgspec.structs.replace(mine, caller_uid=caller.uid)
            store = wired.book._store
            await anyio.to_thread.run_sync(
                wired.book._vault.put, arguments_ref(mine.id), '{"tag":"mine"}'
            )
            store.insert_proposal(mine)
            _others(store, auditor, now, caller.uid + 1)
            await wired.broker.tool_calls.call(
                caller,
                "t",
                tool="record",
                arguments=msgspec.Raw(b'{"tag":"mine"}'),
                timeout_s=20,
                reuse_approved=True,
            )
            assert (await wired.book.get_any(mine.id)).status == "consumed"

    anyio.run(scenario)
    assert calls(base_dir) == ["mine"]
