"""Replicas: N processes of one stateless stdio server behind one name.

A stdio server answers its requests in one process; an SDK server spends
about a millisecond of CPU on each, which caps one name near 1,000 calls a
second whatever the daemon does. A server that keeps no state between calls
(``replicas = N`` in its entry) runs as N processes, each with its own
session (``jsonrpc.py``), and ``ReplicaSet`` is the one ``Connection`` the
rest of the daemon sees:

* every request goes to the replica with the fewest requests in flight
  (the first such, so a quiet server keeps using one process);
* the listing, capabilities and identity are the first replica's (the
  replicas run the same command);
* notifications of every replica reach the one handler (a ``tools/list_changed``
  from any empties the one tool cache), and a ``subscriptions/listen``
  stream is held on each;
* the set lives and dies as one: a probe asks every replica, and the
  supervisor replaces the whole set when any process exits.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, TypeVar

import anyio
import msgspec

from memorizz.api import methods as m
from memorizzd.upstream.connection import ProgressHandler, ToolResult
from memorizzd.upstream.jsonrpc import JsonRpcSession, Launch, open_session
from memorizzd.upstream.stdio import StdioProcess

T = TypeVar("T")


class ReplicaSet:
    def __init__(self, sessions: Sequence[JsonRpcSession]) -> None:
        if not sessions:
            raise ValueError("a replica set needs a session")
        self._sessions = list(sessions)
        self._busy = [0] * len(sessions)
        first = sessions[0]
        self.protocol_version = first.protocol_version
        self.server_name = first.server_name
        self.server_version = first.server_version

    async def _on_least_busy(self, op: Callable[[JsonRpcSession], Awaitable[T]]) -> T:
        busy = self._busy
        at = busy.index(min(busy))
        busy[at] += 1
        try:
            return await op(self._sessions[at])
        finally:
            busy[at] -= 1

    def take(self) -> tuple[JsonRpcSession, Callable[[], None]]:
        """The least busy replica for one request, and what to call when it ends."""
        busy = self._busy
        at = busy.index(min(busy))
        busy[at] += 1

        def release() -> None:
            busy[at] -= 1

        return self._sessions[at], release

    def declares(self, capability: str) -> bool:
        return self._sessions[0].declares(capability)

    async def call_tool(
        self, name: str, arguments: bytes, progress: ProgressHandler | None = None
    ) -> ToolResult:
        return await self._on_least_busy(
            lambda s: s.call_tool(name, arguments, progress)
        )

    async def list_tools(self, *, page_limit: int) -> list[m.Tool]:
        return await self._on_least_busy(lambda s: s.list_tools(page_limit=page_limit))

    async def list_resources(self, *, page_limit: int) -> list[m.Resource]:
        return await self._on_least_busy(
            lambda s: s.list_resources(page_limit=page_limit)
        )

    async def list_resource_templates(
        self, *, page_limit: int
    ) -> list[m.ResourceTemplate]:
        return await self._on_least_busy(
            lambda s: s.list_resource_templates(page_limit=page_limit)
        )

    async def read_resource(self, uri: str) -> m.ResourcesReadResult:
        return await self._on_least_busy(lambda s: s.read_resource(uri))

    async def list_prompts(self, *, page_limit: int) -> list[m.Prompt]:
        return await self._on_least_busy(
            lambda s: s.list_prompts(page_limit=page_limit)
        )

    async def get_prompt(
        self, name: str, arguments: dict[str, str]
    ) -> m.PromptsGetResult:
        return await self._on_least_busy(lambda s: s.get_prompt(name, arguments))

    def takes_tool_tasks(self) -> bool:
        return self._sessions[0].takes_tool_tasks()

    async def call_tool_task(
        self, name: str, arguments: bytes, task: bytes
    ) -> msgspec.Raw:
        """On the first replica only: a task lives in the process that made it,
        and every ``tasks/*`` request goes there too."""
        return await self._sessions[0].call_tool_task(name, arguments, task)

    async def task_request(self, method: str, params: dict[str, Any]) -> msgspec.Raw:
        return await self._sessions[0].task_request(method, params)

    def can_subscribe(self) -> bool:
        return self._sessions[0].can_subscribe()

    async def subscribe_resource(self, uri: str) -> None:
        """On the first replica only: its updates are the ones told."""
        await self._sessions[0].subscribe_resource(uri)

    async def unsubscribe_resource(self, uri: str) -> None:
        await self._sessions[0].unsubscribe_resource(uri)

    async def complete(self, params: dict[str, Any]) -> dict[str, Any]:
        return await self._on_least_busy(lambda s: s.complete(params))

    async def probe(self) -> None:
        for session in self._sessions:  # every one must answer
            await session.probe()

    async def watch_tool_changes(self, on_change: Callable[[], None]) -> bool:
        held: list[bool] = []

        async def watch(session: JsonRpcSession) -> None:
            held.append(await session.watch_tool_changes(on_change))

        async with anyio.create_task_group() as tg:
            for session in self._sessions:
                tg.start_soon(watch, session)
        return any(held)


@asynccontextmanager
async def open_replicas(
    launch: Launch, processes: Sequence[StdioProcess]
) -> AsyncIterator[ReplicaSet]:
    """Start one process per entry of ``processes`` (in turn: each is
    entered and left in this task), negotiate with each, and yield the set."""
    async with AsyncExitStack() as stack:
        sessions = [
            await stack.enter_async_context(open_session(launch, process))
            for process in processes
        ]
        yield ReplicaSet(sessions)
