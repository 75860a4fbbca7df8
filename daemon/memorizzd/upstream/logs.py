"""A server's log messages, passed to the socket callers with a call on it.

The socket API's client opts in on its connection (``daemon/hello``
capabilities: ``{"logging": {}}``, or ``{"logging": {"level": "warning"}}``).
The daemon's sessions are shared by every caller of a server, and MCP's
``notifications/message`` names no request, so a server's log message goes
to every connection that opted in and has a call in flight on that server
(its own scope: a caller only ever calls its scope's servers), at or above
its level, with the server's name. A call's ``LogSink`` is listening from
before its policy is asked until its result is in; the messages the server
sent before its result are on the caller's connection before the reply
(the session hands them over in order, as it reads them: ``heard``).

A 2026-07-28 server logs only to requests that ask for it: such a call's
request carries the level in ``_meta`` (``calllife.want_logs``).
"""

from __future__ import annotations

import collections
from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeVar

import anyio
import msgspec

T = TypeVar("T")

LEVELS: Final = (
    "debug",
    "info",
    "notice",
    "warning",
    "error",
    "critical",
    "alert",
    "emergency",
)
"""MCP's log levels, lowest first (RFC 5424's, as MCP spells them)."""
LOG_SEND_S: Final = 1.0
"""How long one log message may take to reach its client before it is dropped."""
QUEUED_MAX: Final = 256
"""Messages waiting for a slow client; past it the oldest are dropped."""


class _Logged(msgspec.Struct):
    level: str
    data: Any = None
    logger: str | None = None


_decode_logged: Final = msgspec.json.Decoder(_Logged).decode
Note = Callable[[str, str, Any, "str | None"], bytes]
"""The line a front makes of (server, level, data, logger)."""


class LogSink:
    """One call's way to its client for its server's log messages."""

    __slots__ = ("_closed", "_lines", "_more", "_note", "_rank", "_send")

    def __init__(
        self, send: Callable[[bytes], Awaitable[None]], level: str, note: Note
    ) -> None:
        self._send = send
        self._rank = LEVELS.index(level)
        self._note = note
        self._lines: collections.deque[bytes] = collections.deque(maxlen=QUEUED_MAX)
        self._more = anyio.Event()
        self._closed = False

    def heard(self, server: str, params: msgspec.Raw) -> None:
        """A log message of the call's server (in the session's reader: never
        waits): queued for the client if at or above its level."""
        try:
            logged = _decode_logged(params)
        except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
            return
        if logged.level not in LEVELS or LEVELS.index(logged.level) < self._rank:
            return
        self._lines.append(self._note(server, logged.level, logged.data, logged.logger))
        self._more.set()

    async def forwarding(
        self, listeners: set[LogSink], body: Callable[[], Awaitable[T]]
    ) -> T:
        """Run ``body`` (the call) listening to ``listeners``' server; what it
        heard before ``body`` returned is sent before this returns."""
        listeners.add(self)
        failed: Exception | None = None
        async with anyio.create_task_group() as tg:  # cancelled: nothing more is sent
            tg.start_soon(self._drain)
            try:
                result = await body()
            except Exception as exc:  # noqa: BLE001 - raised again, outside the group
                failed = exc
            finally:
                listeners.discard(self)
                self._closed = True
                self._more.set()
        if failed is not None:
            raise failed
        return result

    async def _drain(self) -> None:
        while True:
            await self._more.wait()
            self._more = anyio.Event()
            while self._lines:
                line = self._lines.popleft()
                with anyio.move_on_after(LOG_SEND_S):
                    await self._send(line)
            if self._closed:
                return


def tell(listeners: set[LogSink], server: str, params: msgspec.Raw) -> None:
    """A server's ``notifications/message``, to every call listening to it."""
    for sink in list(listeners):
        sink.heard(server, params)
