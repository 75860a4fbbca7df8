"""The broker, the pool and the approval book built in-process, without a socket.

``components()`` wires them as ``memorizzd.app.running_daemon`` does (store,
vault, pool, auditor, book, broker) but opens no listener: a test calls the
handlers the dispatcher would call, with a ``Caller`` it makes itself, and the
upstream is the real test server (tests/mcp_server.py over stdio). Params are
decoded from JSON, as the dispatcher decodes them.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import msgspec
import pytest

from memorizz.api import methods as m
from memorizz.api.errors import ApprovalRequiredError, ConflictError, NotFoundError
from memorizzd.approvals import ApprovalBook
from memorizzd.audit import Auditor, load_key
from memorizzd.broker import Broker
from memorizzd.caller import Caller, Handler
from memorizzd.config import Config, Profile
from memorizzd.store import Store
from memorizzd.upstream.pool import Pool, running_pool
from memorizzd.vault import FernetCredentialStore, keys_for
from tests.harness import daemon_config, rmtree, short_tempdir, stdio_spec

pytestmark = pytest.mark.anyio

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


@pytest.fixture(scope="module")
def anyio_backend() -> tuple[str, dict[str, Any]]:
    return ("asyncio", {"use_uvloop": True})


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    path = short_tempdir()
    yield path
    rmtree(path)


@pytest.fixture(scope="module")
async def c(base: str) -> AsyncIterator[Components]:
    """One set of components for the module (the server's start is the cost);
    each test uses tools and tags of its own."""
    async with components(_config(base)) as wired:
        yield wired


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


def _config(base: str) -> Config:
    log = os.path.join(base, "calls.log")
    return daemon_config(
        base,
        servers=[stdio_spec("t", env={"CALL_LOG": log})],
        profiles=[Profile(name="alpha", servers=["t"], uids=[os.getuid()])],
    )


def _calls(base: str) -> list[str]:
    try:
        with open(os.path.join(base, "calls.log"), encoding="utf-8") as f:
            return f.read().split()
    except FileNotFoundError:
        return []


async def test_a_tools_call_goes_through_the_broker_to_a_real_server(
    c: Components,
) -> None:
    result = await c.call(
        "tools/call",
        AGENT,
        {"server": "t", "name": "echo", "arguments": {"text": "no socket"}},
    )
    assert result["content"] == [{"type": "text", "text": "no socket"}]
    assert not result.get("isError", False)
    # The scope is the agent's profile: another server does not exist.
    with pytest.raises(NotFoundError):
        await c.call(
            "tools/call", AGENT, {"server": "u", "name": "echo", "arguments": {}}
        )
    records = (await c.call("audit/list", OPERATOR, {"limit": 10}))["records"]
    calls = [r for r in records if r["action"] == "tools/call" and r["tool"] == "echo"]
    assert [(r["tool"], r["outcome"]) for r in reversed(calls)] == [
        ("echo", "ok"),
        ("echo", "denied"),
    ]


async def test_an_approval_proposed_approved_and_resumed_runs_once(
    c: Components, base: str
) -> None:
    # record is destructive: ask, so the call becomes a durable proposal.
    with pytest.raises(ApprovalRequiredError) as asked:
        await c.call(
            "tools/call",
            AGENT,
            {"server": "t", "name": "record", "arguments": {"tag": "comp"}},
        )
    proposal_id = asked.value.data["proposal_id"]
    assert _calls(base) == []
    with pytest.raises(ConflictError):  # not approved yet
        await c.call("approvals/resume", AGENT, {"id": proposal_id})
    decided = await c.call("approvals/approve", OPERATOR, {"id": proposal_id})
    assert decided["proposal"]["status"] == "approved"
    result = await c.call("approvals/resume", AGENT, {"id": proposal_id})
    assert not result.get("isError", False)
    assert _calls(base) == ["comp"]
    with pytest.raises(ConflictError):  # consumed: never twice
        await c.call("approvals/resume", AGENT, {"id": proposal_id})
    assert _calls(base) == ["comp"]
    [proposal] = (await c.call("approvals/list", AGENT, {"status": "consumed"}))[
        "proposals"
    ]
    assert proposal["id"] == proposal_id
