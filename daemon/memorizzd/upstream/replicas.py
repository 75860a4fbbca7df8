"""Replicas: N processes of one stateless stdio server behind one name.

A stdio server answers its requests in one process; an SDK server spends
about a millisecond of CPU on each, which caps one name near 1,000 calls a
second whatever the daemon does. A server that keeps no state between calls
(``replicas = N`` in its entry) runs as N processes, each with its own
session (``jsonrpc.py``), and ``ReplicaSet`` is the one ``Connection`` the
rest of the daemon sees:

* the replicas start together, each in a task of its own (an anyio session
  is entered and left in one task): the set's start costs one process's
  start, and each process has the whole handshake budget;
* every request goes to the replica in the rotation with the fewest requests
  in flight (the first such, so a quiet server keeps using one process);
* one replica is the primary (the first, to begin with): the listings
  (tools, resources, their templates, prompts), capabilities and identity are
  its own (the replicas run the same command), and so are the tasks and the
  resource subscriptions;
* notifications of every replica reach the one handler (a ``tools/list_changed``
  from any empties the one tool cache, and the primary is listed again), and
  each replica's ``subscriptions/listen`` stream is held, and opened again
  when it ends, on its own;
* each replica is kept here, alone: when it dies (its exit, its stdout
  closed, a failed probe) it leaves the rotation at once, only the calls in
  flight on it fail, and it is started again after the supervisor's backoff
  (``Care``), while the others serve on. When it was the primary, the first
  replica still in the rotation becomes the primary: it is subscribed to the
  resources the old one was, and the tools are listed again (the tasks the
  old one held are gone with its process). Only when no replica is left in
  the rotation is the set lost: the supervisor replaces it. The health probe
  asks each replica that has not answered within the interval (``check``).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from functools import partial
from typing import Any, Final, TypeVar

import anyio
import msgspec

from memorizz.api import methods as m
from memorizz.api.errors import RemoteError
from memorizzd.upstream.connection import ProgressHandler, ToolResult
from memorizzd.upstream.errors import ConnectionLost, leaves
from memorizzd.upstream.jsonrpc import MODERN, JsonRpcSession, Launch, open_session
from memorizzd.upstream.stdio import (
    StdioProcess,
    no_handshake,
    stdio_handshake_budget,
)

T = TypeVar("T")

log = logging.getLogger("memorizzd.upstream")

OUT: Final = 1 << 30
"""Added to the load of a replica out of the rotation (lost, starting again):
never the least busy while any other is in."""
PROBED: Final = 1 << 20
"""Added to the load of a replica while its health probe waits for its answer:
a call goes to it only when every replica in the rotation is being probed (a
frozen one, probed after a call on it timed out, is not sent the next)."""
EXIT_WAIT_S: Final = 0.5
"""How long a lost replica's exit is waited for, so that its code is told."""
_SAID_BY_EXIT: Final = ("closed its stdout", "lost its connection")
"""Why a replica is lost that an exit says better, by its code."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Care:
    """What the supervisor lends a set for its replicas (``Supervisor._open``)."""

    budget_s: float
    """A replica's start and handshake, when it is started again alone."""
    backoff: Callable[[int], float]
    """The wait before a replica's start after ``n`` failed in a row."""
    lost: Callable[[str], None]
    """A replica was lost and starts again (the reason, naming it): counted
    in ``restarts`` and logged."""
    set_lost: Callable[[str], None]
    """No replica is left in the rotation: the set is lost (the supervisor
    replaces it)."""
    relist: Callable[[], None]
    """Another replica became the primary: the tools are listed again."""
    listen: Callable[[JsonRpcSession, int], Coroutine[Any, Any, None]]
    """Hold one replica's list-change stream while it lives (``Supervisor._watch_tool_changes``)."""
    describe: Callable[[BaseException], str]
    """A failed start, in a few words."""
    back: Callable[[str], None]
    """A replica started again serves (naming it): the set's error is over."""


class ReplicaSet:
    def __init__(
        self, launch: Launch, processes: list[StdioProcess], care: Care
    ) -> None:
        if not processes:
            raise ValueError("a replica set needs a process")
        self._launch = launch
        self._processes = processes
        """The supervisor's list: a replica started again puts its new process in."""
        self._care = care
        count = len(processes)
        self._sessions: list[JsonRpcSession] = []
        """Each replica's session, the latest (filled once all have started)."""
        self._busy = [OUT] * count
        """Requests in flight on each replica; plus ``OUT`` while out of the rotation."""
        self._answered = [0.0] * count
        """When each replica last answered (``check``)."""
        self._lost = [anyio.Event() for _ in range(count)]
        self._why: list[str | None] = [None] * count
        """Why each lost replica was (None: its process exited)."""
        self._waits = [0.0] * count
        """The backoff before each replica's next start."""
        self._started: dict[int, JsonRpcSession] = {}
        self._settled = anyio.Event()
        """Set when every replica started, or one failed to (``_failure``)."""
        self._failure: Exception | None = None
        self._leaving = False
        self._first = 0
        """The primary's index."""
        self._handed = [False] * count
        """Each replica that was the primary when it left, until ``_follow``."""
        self._orphaned = False
        """The primary was lost with no replica left in the rotation to follow it."""
        self._subscribed: set[str] = set()
        """The resources the primary is subscribed to (its heir is, in turn)."""
        self.protocol_version: str | None = None
        self.server_name: str | None = None
        self.server_version: str | None = None
        self.instructions: str | None = None

    @property
    def _primary(self) -> JsonRpcSession:
        return self._sessions[self._first]

    @property
    def primary_pid(self) -> int | None:
        """The primary's process (``servers/status``): after a hand-over,
        the heir's, not the first replica's."""
        return self._processes[self._first].pid

    # --- the requests ------------------------------------------------------

    async def _on(self, at: int, op: Callable[[JsonRpcSession], Awaitable[T]]) -> T:
        busy = self._busy
        session = self._sessions[at]
        busy[at] += 1
        try:
            result = await op(session)
        except ConnectionLost as exc:
            self._lose(at, session, f"lost its connection: {exc}")
            raise
        finally:
            busy[at] -= 1
        self._answered[at] = anyio.current_time()
        return result

    async def _on_least_busy(self, op: Callable[[JsonRpcSession], Awaitable[T]]) -> T:
        busy = self._busy
        return await self._on(busy.index(min(busy)), op)

    async def _on_primary(self, op: Callable[[JsonRpcSession], Awaitable[T]]) -> T:
        return await self._on(self._first, op)

    def take(self) -> tuple[JsonRpcSession, Callable[[], None]]:
        """The least busy replica for one request, and what to call when it
        ends (the warm relay's way). Its end counts as the replica's answer
        for the health probe (``check``): a replica busy with relayed calls
        is not probed behind them (a request that timed out has the probe
        ask every replica at once, ``Supervisor._suspect``)."""
        busy = self._busy
        answered = self._answered
        at = busy.index(min(busy))
        busy[at] += 1

        def release() -> None:
            busy[at] -= 1
            answered[at] = anyio.current_time()

        return self._sessions[at], release

    def lost(self) -> bool:
        """A request on the set lost its connection (the caller does not know
        on which replica): each replica whose session ended leaves the
        rotation now; whether none is left in it (the set is lost)."""
        for at, session in enumerate(self._sessions):
            if session.ended.is_set():
                self._lose(at, session, "lost its connection")
        return self._orphaned

    def declares(self, capability: str) -> bool:
        return self._primary.declares(capability)

    async def call_tool(
        self, name: str, arguments: bytes, progress: ProgressHandler | None = None
    ) -> ToolResult:
        return await self._on_least_busy(
            lambda s: s.call_tool(name, arguments, progress)
        )

    async def list_tools(self, *, page_limit: int) -> list[m.Tool]:
        """The primary's, always: a listing that depended on the load could
        read a replica that has not heard of a change yet."""
        return await self._on_primary(lambda s: s.list_tools(page_limit=page_limit))

    async def list_resources(self, *, page_limit: int) -> list[m.Resource]:
        return await self._on_primary(lambda s: s.list_resources(page_limit=page_limit))

    async def list_resource_templates(
        self, *, page_limit: int
    ) -> list[m.ResourceTemplate]:
        return await self._on_primary(
            lambda s: s.list_resource_templates(page_limit=page_limit)
        )

    async def read_resource(self, uri: str) -> m.ResourcesReadResult:
        return await self._on_least_busy(lambda s: s.read_resource(uri))

    async def list_prompts(self, *, page_limit: int) -> list[m.Prompt]:
        return await self._on_primary(lambda s: s.list_prompts(page_limit=page_limit))

    async def get_prompt(
        self, name: str, arguments: dict[str, str]
    ) -> m.PromptsGetResult:
        return await self._on_least_busy(lambda s: s.get_prompt(name, arguments))

    def takes_tool_tasks(self) -> bool:
        return self._primary.takes_tool_tasks()

    async def call_tool_task(
        self, name: str, arguments: bytes, task: bytes
    ) -> msgspec.Raw:
        """On the primary only: a task lives in the process that made it,
        and every ``tasks/*`` request goes there too."""
        return await self._on_primary(lambda s: s.call_tool_task(name, arguments, task))

    async def task_request(self, method: str, params: dict[str, Any]) -> msgspec.Raw:
        return await self._on_primary(lambda s: s.task_request(method, params))

    def can_subscribe(self) -> bool:
        return self._primary.can_subscribe()

    async def subscribe_resource(self, uri: str) -> None:
        """On the primary only: its updates are the ones told."""
        await self._on_primary(lambda s: s.subscribe_resource(uri))
        self._subscribed.add(uri)

    async def unsubscribe_resource(self, uri: str) -> None:
        self._subscribed.discard(uri)
        await self._on_primary(lambda s: s.unsubscribe_resource(uri))

    async def complete(self, params: dict[str, Any]) -> dict[str, Any]:
        return await self._on_least_busy(lambda s: s.complete(params))

    async def probe(self) -> None:
        """Every replica in the rotation, together (the caller bounds the wait)."""
        await self.check(None, quiet_s=None)

    async def check(
        self,
        timeout_s: float | None,
        *,
        quiet_s: float | None,
        vouched: Callable[[], None] | None = None,
    ) -> None:
        """Probe, together, each replica in the rotation (with ``quiet_s``:
        each that has not answered within it), each within ``timeout_s``.
        One that fails is lost (started again alone); when none is left in
        the rotation, the first failure is raised (the set is lost). While
        its probe waits, a replica is sent no call that another could take
        (``PROBED``); ``vouched`` is called once one replica has answered
        (the requests held for the verdict may go: to that one)."""
        now = anyio.current_time()
        failed: list[BaseException] = []
        busy = self._busy

        async def probe(at: int, session: JsonRpcSession) -> None:
            busy[at] += PROBED
            try:
                with anyio.fail_after(timeout_s):
                    await session.probe()
            except (RemoteError, ConnectionLost, TimeoutError) as exc:
                failed.append(exc)
                said = str(exc) or f"no answer within {timeout_s:g} s"
                self._lose(at, session, f"failed its health probe: {said}")
            else:
                self._answered[at] = anyio.current_time()
                if vouched is not None:
                    vouched()
            finally:
                busy[at] -= PROBED

        async with anyio.create_task_group() as tg:
            for at, session in enumerate(self._sessions):
                if self._busy[at] >= OUT:
                    continue
                if quiet_s is None or now - self._answered[at] >= quiet_s:
                    tg.start_soon(probe, at, session)
        if failed and self._orphaned:
            raise failed[0]

    def answered_within(self, seconds: float) -> bool:
        """Whether every replica in the rotation answered within ``seconds``."""
        since = anyio.current_time() - seconds
        return all(
            self._answered[at] > since
            for at in range(len(self._sessions))
            if self._busy[at] < OUT
        )

    async def watch_tool_changes(self, on_change: Callable[[], None]) -> bool:
        """Nothing to hold here: each replica's stream, the primary's too, is
        held by its own task (``_serve``) and opened again on its own."""
        return False

    # --- the replicas' lives -----------------------------------------------

    def _name(self, at: int) -> str:
        pid = self._processes[at].pid
        return f"replica {at}" + (f" (pid {pid})" if pid is not None else "")

    def _lose(self, at: int, session: JsonRpcSession, why: str | None) -> None:
        """Replica ``at`` (its ``session``) is lost: out of the rotation now;
        its task stops it and starts it again."""
        if self._sessions[at] is not session or self._busy[at] >= OUT:
            return  # an earlier session of it, or out already
        self._why[at] = why
        self._lost[at].set()
        self._leave(at)

    def _leave(self, at: int) -> None:
        """Replica ``at`` leaves the rotation now. If it was the primary, the
        first replica still in the rotation is from now on (none: the set is
        lost); ``_follow`` tells the heir what the primary held."""
        if self._busy[at] < OUT:
            self._busy[at] += OUT
        if at != self._first or self._orphaned:
            return
        heir = next((i for i, busy in enumerate(self._busy) if busy < OUT), None)
        if heir is None:
            self._orphaned = True
        else:
            self._first = heir
            self._handed[at] = True

    async def _follow(self, at: int) -> str:
        """If replica ``at`` left as the primary: its heir is subscribed to
        what it was and the tools are listed again; what to say of it."""
        if not self._handed[at]:
            return ""
        self._handed[at] = False
        heir = self._first
        if self._orphaned or self._leaving:
            return ""
        self._care.relist()
        for uri in sorted(self._subscribed):
            try:
                with anyio.fail_after(self._care.budget_s):
                    await self._on_primary(partial(_subscribe, uri=uri))
            except (RemoteError, ConnectionLost, TimeoutError) as exc:
                log.info(
                    "%s: %s, the primary now, was not subscribed to %s: %s",
                    self._launch.server,
                    self._name(heir),
                    uri,
                    exc,
                )
        return f"; {self._name(heir)} is the primary now"

    def _join(self, at: int, session: JsonRpcSession) -> None:
        self._lost[at] = anyio.Event()
        self._why[at] = None
        self._answered[at] = anyio.current_time()
        if self._settled.is_set():  # started again
            self._sessions[at] = session
            self._busy[at] -= OUT
            if not self._leaving:
                self._care.back(self._name(at))
            return
        self._started[at] = session
        if len(self._started) == len(self._processes):  # the last to start
            self._sessions = [self._started[i] for i in range(len(self._processes))]
            self._started.clear()
            self._busy = [0] * len(self._sessions)
            first = self._sessions[0]
            self.protocol_version = first.protocol_version
            self.server_name = first.server_name
            self.server_version = first.server_version
            self.instructions = first.instructions
            self._settled.set()

    async def _keep(self, at: int) -> None:
        """Replica ``at``'s life: started, served until it is lost; but for the
        primary, started again after the backoff, until the set leaves."""
        failures = slow = 0
        first = True
        while True:
            process = self._processes[at]
            if not first:
                process = self._processes[at] = StdioProcess(process.name)
                mode = MODERN if self.protocol_version == MODERN else "legacy"
                launch = dataclasses.replace(self._launch, mode=mode)
            else:
                launch = self._launch  # the supervisor's handshake scope bounds it
            # A replica started again has its own budget (doubled after each
            # start in a row that ran out of it, as the supervisor's).
            budget = (
                math.inf if first else stdio_handshake_budget(self._care.budget_s, slow)
            )
            starting = anyio.CancelScope(deadline=anyio.current_time() + budget)
            ready = told = False
            try:
                with starting:
                    async with open_session(launch, process) as session:
                        starting.deadline = math.inf
                        ready = True
                        slow = 0
                        self._join(at, session)
                        await self._settled.wait()
                        if self._failure is not None:
                            return  # another could not start: the set fails
                        why = await self._serve(at, process, session)
                        told = True
                        if self._orphaned:
                            self._set_lost(f"{self._name(at)} {why}")
                            return
                        why += await self._follow(at)
                        failures = 1  # it was ready: the backoff starts afresh
                        self._restart(at, why, failures)
                if starting.cancelled_caught:
                    slow += 1
                    raise no_handshake(
                        budget, stdio_handshake_budget(self._care.budget_s, slow)
                    )
            except Exception as exc:  # noqa: BLE001 - a replica's start: its failure
                if not self._settled.is_set() or self._failure is not None:
                    if self._failure is None:  # the set's start fails: the first
                        self._failure = await self._start_failed(at, process, exc)
                    self._settled.set()
                    return
                if not told:
                    said = self._care.describe(exc)
                    self._leave(at)
                    if self._orphaned:
                        self._set_lost(f"{self._name(at)} failed: {said}")
                        return
                    why = f"failed: {said}" if ready else f"could not start: {said}"
                    why += await self._follow(at)
                    failures = 1 if ready else failures + 1
                    self._restart(at, why, failures)
            first = False
            if self._leaving:
                return
            await anyio.sleep(self._waits[at])

    async def _start_failed(
        self, at: int, process: StdioProcess, exc: Exception
    ) -> Exception:
        """What the set's failed start says: a process that died while
        starting is named, with its exit code."""
        if not any(isinstance(leaf, ConnectionLost) for leaf in leaves(exc)):
            return exc
        with anyio.move_on_after(EXIT_WAIT_S):
            await process.exited.wait()
        said = (
            f"exited with code {process.returncode}"
            if process.exited.is_set()
            else str(exc)
        )
        return ConnectionLost(f"{self._name(at)} {said} while starting")

    def _restart(self, at: int, why: str, failures: int) -> None:
        """Say why replica ``at`` is started again, and when (after ``failures``
        failed in a row, ``Care.backoff``)."""
        wait = self._waits[at] = self._care.backoff(max(failures, 1))
        if not self._leaving:
            self._care.lost(
                f"{self._name(at)} {why}; starting it again in {wait:.2g} s"
            )

    def _set_lost(self, why: str) -> None:
        if not self._leaving:
            self._care.set_lost(f"{why}, and no other replica serves")

    async def _serve(
        self, at: int, process: StdioProcess, session: JsonRpcSession
    ) -> str:
        """Until replica ``at`` is lost: why (naming its exit code if it exited)."""
        lost = self._lost[at]

        async def on(event: anyio.Event, why: str | None) -> None:
            await event.wait()
            self._lose(at, session, why)

        async with anyio.create_task_group() as tg:
            tg.start_soon(on, process.exited, None)
            tg.start_soon(on, process.stdout_closed, "closed its stdout")
            tg.start_soon(self._care.listen, session, at)
            await lost.wait()
            tg.cancel_scope.cancel()
        with anyio.move_on_after(EXIT_WAIT_S):
            await process.exited.wait()
        why = self._why[at]
        if process.exited.is_set():
            exited = f"exited with code {process.returncode}"
            if why is None or why.startswith(_SAID_BY_EXIT):
                return exited  # what its exit said first
            return f"{why} ({exited})"
        if why == "closed its stdout":
            why += " (its process goes on)"
        return why or "was lost"


async def _subscribe(session: JsonRpcSession, *, uri: str) -> None:
    await session.subscribe_resource(uri)


@asynccontextmanager
async def open_replicas(
    launch: Launch, processes: list[StdioProcess], care: Care
) -> AsyncIterator[ReplicaSet]:
    """Start one replica per entry of ``processes``, together (each opened,
    served and closed in a task of its own), and yield the set once every
    one has negotiated; the first failure to start is raised. On leaving,
    the replicas are stopped together."""
    replicas = ReplicaSet(launch, processes, care)
    async with anyio.create_task_group() as tg:
        for at in range(len(processes)):
            tg.start_soon(replicas._keep, at)
        await replicas._settled.wait()
        if replicas._failure is None:
            try:
                yield replicas
            finally:
                replicas._leaving = True
                tg.cancel_scope.cancel()  # each stops its process (shielded)
        else:
            tg.cancel_scope.cancel()
    if replicas._failure is not None:
        raise replicas._failure
