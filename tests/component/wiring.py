"""The broker, the pool and the approval book wired in-process, without a
socket, as ``memorizzd.app.running_daemon`` wires them (store, vault, pool,
auditor, book, broker) but with no listener: a test calls the handlers the
dispatcher would call, with a ``Caller`` it makes itself (``OPERATOR``,
``AGENT``); the upstream is the real test server (tests/mcp_server.py over
stdio). The fixtures (``c``, ``base``) are in this package's conftest.py.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import msgspec

from memorizz.api import methods as m
from memorizzd.approvals import ApprovalBook
from memorizzd.audit import Auditor, load_key
from memorizzd.broker import Broker
from memorizzd.caller import Caller, Handler
from memorizzd.config import Config, Profile
from memorizzd.store import ProposalRow, Store
from memorizzd.upstream.pool import Pool, running_pool
from memorizzd.upstream.tasks import TaskBook
from memorizzd.vault import FernetCredentialStore, keys_for
from tests.harness import daemon_config, stdio_spec

OPERATOR = Caller(
    pid=os.getpid(), uid=os.getuid(), gid=os.getgid(), socket="-", role="operator"
)
AGENT = Caller(
    pid=os.getpid(),
    uid=os.getuid(),
    gid=os.getgid(),
    socket="-",
    profile="alpha",
    role="agent",
)


@dataclass
class Components:
    pool: Pool
    book: ApprovalBook
    broker: Broker
    handlers: dict[str, Handler]

    async def call(self, method: str, caller: Caller, params: dict[str, Any]) -> Any:
        """``method`` as the dispatcher runs it: Params decoded from JSON."""
        kind = m.METHODS[method].params
        decoded = msgspec.json.decode(msgspec.json.encode(params), type=kind)
        result = await self.handlers[method](caller, decoded)
        return msgspec.json.decode(msgspec.json.encode(result))


@asynccontextmanager
async def components(config: Config) -> AsyncIterator[Components]:
    store = await anyio.to_thread.run_sync(Store, config.state_dir)
    try:
        vault = FernetCredentialStore.open(store, keys_for(store, config.state_dir))
        async with running_pool(config, store, vault) as pool:
            for spec in config.servers:
                await pool.start(spec, source="config")
            auditor = Auditor(
                store, load_key(config.state_dir), mirror_to_journal=False
            )
            book = ApprovalBook(store, vault, auditor, ttl_s=config.approval_ttl_s)
            pool.on_tools = book.tools_listed
            broker = Broker(
                config,
                store,
                pool,
                connections=lambda: 0,
                in_flight=lambda: 0,
                auditor=auditor,
                vault=vault,
                book=book,
            )
            async with anyio.create_task_group() as tg:
                await tg.start(auditor.run)
                await tg.start(book.run)
                for spec in config.servers:
                    with anyio.fail_after(20):
                        await pool.get(spec.name).wait_ready()
                yield Components(pool, book, broker, dict(broker.handlers()))
                tg.cancel_scope.cancel()
    finally:
        await anyio.to_thread.run_sync(store.close)


@dataclass
class Booked:
    """The approval book over the real store, vault and audit trail."""

    store: Store
    vault: FernetCredentialStore
    auditor: Auditor
    book: ApprovalBook


@contextmanager
def stored_book(base: str, *, ttl_s: float) -> Iterator[Booked]:
    """``Booked`` in ``base``/state (an audit key of the test's), the store
    closed at the end."""
    state = os.path.join(base, "state")
    store = Store(state)
    try:
        vault = FernetCredentialStore.open(store, keys_for(store, state))
        auditor = Auditor(store, b"k" * 32, mirror_to_journal=False)
        yield Booked(
            store, vault, auditor, ApprovalBook(store, vault, auditor, ttl_s=ttl_s)
        )
    finally:
        store.close()


def wired_config(base: str) -> Config:
    """The server ``t`` (its calls logged to ``calls.log``) and the profile ``alpha``."""
    log = os.path.join(base, "calls.log")
    return daemon_config(
        base,
        servers=[stdio_spec("t", env={"CALL_LOG": log})],
        profiles=[Profile(name="alpha", servers=["t"], uids=[os.getuid()])],
    )


def proposal_row(
    auditor: Auditor,
    tag: str,
    *,
    status: str = "pending",
    created: float,
    expires_at: float,
    schema_hash: str = "",
) -> ProposalRow:
    """A proposal of profile ``alpha``'s (uid 1000) on server ``t``'s tool
    ``record`` with the arguments ``{"tag": tag}``, as the store keeps it
    (its arguments, if wanted, are the test's to put in the vault)."""
    return ProposalRow(
        id=f"p_{tag}",
        status=status,
        server="t",
        tool="record",
        risk="destructive",
        argument_keys=["tag"],
        arguments_hmac=auditor.digest({"tag": tag}),
        schema_hash=schema_hash,
        created=created,
        expires_at=expires_at,
        caller_uid=1000,
        caller_user=None,
        caller_pid=2,
        caller_profile="alpha",
    )


def task_made(book: TaskBook, caller: Caller, upstream_id: str) -> str:
    """The daemon's id of a task ``caller`` made on server ``s``'s ``tool``,
    which the server calls ``upstream_id`` (working)."""
    raw = msgspec.json.encode({"task": {"taskId": upstream_id, "status": "working"}})
    entry, _ = book.created(caller, "s", "tool", raw, None)
    return entry.id
