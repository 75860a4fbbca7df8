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
import math
import os
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


class Clock:
    """``now`` of the loop running where it is made, kept: finding the running
    loop costs a system call (``getpid``) on every use, and a warm call would
    ask for it several times."""

    __slots__ = ("_loop", "now")

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.now: Callable[[], float] = self._loop.time


class Deadlines:
    """Many deadlines, one loop timer, armed for the earliest.

    Setting and clearing a deadline is a dict insert and delete: a uvloop
    ``call_later`` and its ``cancel`` cost ~2.7 us, and every relayed call
    sets a deadline and clears it. The timer moves only for a deadline more
    than ``slack`` earlier than the one it is armed for (rare: calls mostly
    share a timeout, so each new deadline is later); a cleared one leaves it
    where it is. When it fires it runs what is due and is armed again for the
    earliest left, if any. So a run of calls that all end in time wakes the
    loop about once a timeout, not ten times a second. A deadline's callback
    runs in the loop, at most ``slack`` after it is due (and the loop's lag);
    one that raises is logged."""

    __slots__ = ("_armed", "_due", "_loop", "_slack", "_timer")

    def __init__(self, slack: float = 0.05) -> None:
        self._loop = asyncio.get_running_loop()
        self._slack = slack
        self._due: dict[object, tuple[float, Callable[[], object]]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._armed = math.inf
        """When the timer fires (inf: it is not armed)."""

    def set(self, key: object, delay: float, callback: Callable[[], object]) -> None:
        """``callback`` in ``delay`` seconds, unless ``clear(key)`` comes first."""
        when = self._loop.time() + delay
        self._due[key] = (when, callback)
        if when < self._armed - self._slack:
            self._arm(when)

    def clear(self, key: object) -> None:
        self._due.pop(key, None)

    def _arm(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._armed = when
        self._timer = self._loop.call_at(when, self._fire)

    def _fire(self) -> None:
        self._timer, self._armed = None, math.inf
        now = self._loop.time()
        due = [(key, then) for key, (when, then) in self._due.items() if when <= now]
        for key, _ in due:
            del self._due[key]
        if self._due:
            self._arm(min(when for when, _ in self._due.values()))
        for _, then in due:
            try:
                then()
            except Exception:  # a bug: logged; the other deadlines still run
                log.exception("a deadline's callback failed")


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


class Inbox:
    """A descriptor's bytes, read by the loop as they arrive, for one task.

    The loop reads (a reader callback, registered once: no registration per
    wait, no read that cannot succeed); ``receive`` returns everything read
    since the last call, waiting for some if there is none, and b"" once the
    other end closed. Past ``limit`` bytes not yet received, reading pauses
    until they are, so a consumer that stops receiving pushes back on the
    writer as before. A read error is raised by ``receive``. The descriptor's
    owner closes the inbox before it closes the descriptor."""

    __slots__ = (
        "_chunks",
        "_ended",
        "_error",
        "_fd",
        "_limit",
        "_loop",
        "_read",
        "_reading",
        "_size",
        "_waiter",
        "taken",
    )

    def __init__(
        self, fd: int, read: Callable[[], bytes] | None = None, limit: int = 1 << 16
    ) -> None:
        self._fd = fd
        self._read: Callable[[], bytes] = read or (lambda: os.read(fd, 1 << 16))
        self._limit = limit
        self._chunks: list[bytes] = []
        self._size = 0
        self._ended = False
        self._error: OSError | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._loop = asyncio.get_running_loop()
        self._reading = False
        self.taken: Callable[[bytes], bytes] | None = None
        """Takes bytes in the reader callback itself, when the consumer waits
        with nothing queued; returns what it left, which goes to the consumer
        (b"": all taken)."""
        self._start()

    def _start(self) -> None:
        if not self._reading and not self._ended:
            self._reading = True
            self._loop.add_reader(self._fd, self._on_readable)

    def _stop(self) -> None:
        if self._reading:
            self._reading = False
            self._loop.remove_reader(self._fd)

    def _on_readable(self) -> None:
        try:
            data = self._read()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._error, data = exc, b""
        if data:
            if self._waiter is not None and not self._chunks:
                data = self._take(data)
                if not data:
                    return
            self._chunks.append(data)
            self._size += len(data)
            if self._size >= self._limit:
                self._stop()
        else:
            self._ended = True
            self._stop()
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _take(self, data: bytes) -> bytes:
        taken = self.taken
        if taken is None:
            return data
        try:
            return taken(data)
        except Exception:  # a bug: logged; the bytes are not handed on twice
            log.exception(
                "taking %d bytes from descriptor %d failed", len(data), self._fd
            )
            return b""

    async def receive(self) -> bytes:
        while not self._chunks:
            if self._ended:
                if self._error is not None:
                    raise self._error
                return b""
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        chunks, self._chunks, self._size = self._chunks, [], 0
        self._start()
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def close(self) -> None:
        """Stop reading; ``receive`` returns what was read, then b""."""
        self._ended = True
        self._stop()
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class Outbox:
    """Whole messages to one non-blocking descriptor, in order, never interleaved.

    ``put`` writes what the descriptor takes now and keeps the rest, which the
    loop writes as the descriptor becomes writable (a writer callback: no task,
    no lock). Anyone may ``put``, from a task or a callback; a message is never
    split by another. ``drained`` waits until nothing is kept. The first write
    error closes the box: what was kept is dropped and every later ``put`` and
    ``drained`` raises it (the reader of the descriptor went away).

    The descriptor's owner closes the box before it closes the descriptor."""

    __slots__ = (
        "_fd",
        "_kept",
        "_loop",
        "_waiters",
        "_watching",
        "_write",
        "error",
        "since",
    )

    def __init__(
        self, fd: int, write: Callable[[bytes | bytearray], int] | None = None
    ) -> None:
        self._fd = fd
        self._write: Callable[[bytes | bytearray], int] = write or (
            lambda data: os.write(fd, data)
        )
        self._kept = bytearray()
        self._loop = asyncio.get_running_loop()
        self._waiters: list[asyncio.Future[None]] = []
        self._watching = False
        self.error: OSError | None = None
        self.since: float | None = None
        """When the bytes kept now began to wait (the loop's clock), else None."""

    @property
    def kept(self) -> int:
        """Bytes put but not yet written."""
        return len(self._kept)

    def put(self, data: bytes) -> None:
        if self.error is not None:
            raise self.error
        if self._kept:
            self._kept += data
            return
        try:
            written = self._write(data)
        except BlockingIOError:
            written = 0
        except OSError as exc:
            self._fail(exc)
            raise
        if written < len(data):
            self._kept += memoryview(data)[written:]
            self.since = self._loop.time()
            self._watching = True
            self._loop.add_writer(self._fd, self._flush)

    def _flush(self) -> None:
        try:
            written = self._write(self._kept)
        except BlockingIOError:
            return
        except OSError as exc:
            self._fail(exc)
            return
        del self._kept[:written]
        if not self._kept:
            self._unwatch()
            self.since = None
            self._wake()

    async def drained(self) -> None:
        """Return once everything put is written; raise the error if it cannot be."""
        while self._kept and self.error is None:
            waiter = self._loop.create_future()
            self._waiters.append(waiter)
            await waiter
        if self.error is not None:
            raise self.error

    def close(self) -> None:
        """Stop writing (what is kept is dropped); later puts raise."""
        if self.error is None:
            self._fail(BrokenPipeError("the outbox is closed"))

    def _fail(self, exc: OSError) -> None:
        self.error = exc
        self._kept.clear()
        self.since = None
        self._unwatch()
        self._wake()

    def _unwatch(self) -> None:
        if self._watching:
            self._watching = False
            self._loop.remove_writer(self._fd)

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)


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
