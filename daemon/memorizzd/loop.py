"""The hot path's primitives, taken from the running asyncio loop directly.

The daemon is written with anyio, and runs on asyncio (uvloop) only. A warm
``tools/call`` spawns a task for the request, waits for the upstream's answer
by a deadline, and waits for its audit record; anyio's versions of those
three cost several times the loop's own, and they are paid on every call.
Measured on the 2-vCPU dev VM (``/tmp``-style micro-benchmarks, CPU per use):
a task spawned and awaited 37 us with a task group against 5 us on the loop;
``anyio.fail_after`` 25 us against 11 us for ``asyncio.timeout_at``; an
``anyio.Event`` made, set and awaited about 10 us against 2 us for a future.
``python -m bench.anyio_floor`` measures the same floor in a line server.

So this module, and only this one, imports ``asyncio`` (ruff's TID251 bans it
everywhere else), for these few exact equivalents. They keep anyio's
semantics where it matters:

- cancellation still comes from anyio cancel scopes: a task awaiting a
  future here is cancelled like any other, and a shielded scope shields it;
- ``deadline_at`` raises the built-in ``TimeoutError``, as ``fail_after`` does;
- a ``TaskSet`` is joined by its owner, and a join that is cancelled cancels
  the set's tasks and waits for them (shielded), as a task group would; a task
  that raises is logged, never lost.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, Final

import anyio

log = logging.getLogger("memorizzd.loop")

deadline_at: Final = asyncio.timeout_at
"""``async with deadline_at(when):`` (``when`` on ``anyio.current_time()``'s
clock, which is the loop's): ``TimeoutError`` if the body is not done by then."""


def now() -> float:
    """``anyio.current_time()``: the loop's clock, without anyio's backend lookup."""
    return asyncio.get_running_loop().time()


def call_later(delay: float, callback: Callable[[], object]) -> Callable[[], None]:
    """Run ``callback`` on the loop in ``delay`` seconds; returns what cancels it."""
    return asyncio.get_running_loop().call_later(delay, callback).cancel


class Signal:
    """A one-shot event for one waiter (the cheap kind: a loop future).

    ``set`` may be called from the loop any number of times, also after the
    waiter was cancelled; only one task may ``wait``."""

    __slots__ = ("_future",)

    def __init__(self) -> None:
        self._future: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def set(self) -> None:
        if not self._future.done():
            self._future.set_result(None)

    async def wait(self) -> None:
        await self._future


class TaskSet:
    """Tasks one owner spawns and later joins (a connection's requests).

    Unlike an anyio task group, spawning takes no cancel scope and no
    bookkeeping beyond a set; the owner must ``join`` before it returns."""

    __slots__ = ("_empty", "_tasks")

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()
        self._empty: Signal | None = None

    def __len__(self) -> int:
        return len(self._tasks)

    def spawn(
        self,
        function: Callable[..., Coroutine[Any, Any, None]],
        *args: object,
        name: str | None = None,
    ) -> None:
        task = asyncio.get_running_loop().create_task(function(*args), name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("task %s failed", task.get_name(), exc_info=exc)
        if not self._tasks and self._empty is not None:
            self._empty.set()

    async def join(self) -> None:
        """Wait until every task has ended. Cancelled while waiting: cancel
        them all, wait for them to end (shielded), then go on being cancelled."""
        try:
            while self._tasks:
                self._empty = Signal()
                await self._empty.wait()
        except BaseException:
            tasks = list(self._tasks)
            for task in tasks:
                task.cancel()
            if tasks:
                with anyio.CancelScope(shield=True):
                    await asyncio.wait(tasks)
            raise
        finally:
            self._empty = None
