"""Resource subscriptions of one server, counted across the callers that hold them.

Callers (the MCP face's sessions) share one warm session per server, so a
URI is subscribed upstream once: the first holder's ``resources/subscribe``
goes to the server, later holders only join; the last holder to let go (an
``unsubscribe``, or its session closing) has ``resources/unsubscribe`` sent.
A replaced session is subscribed again to every URI still held
(``supervisor.py``).

A session that closes cannot wait for the server (``release`` is called
while its connection is torn down): the URIs it was the last to hold are
queued, and the supervisor's task sends their unsubscribes (``flush``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio

Send = Callable[[str], Awaitable[None]]
"""Sends ``resources/subscribe`` or ``resources/unsubscribe`` for one URI."""


class Subscriptions:
    def __init__(self) -> None:
        self._holders: dict[str, set[object]] = {}
        self._lock = anyio.Lock()
        """Held while a subscribe or unsubscribe is on its way upstream, so
        that the count and the server agree."""
        self._released: list[str] = []
        self._wake = anyio.Event()

    def renewed(self) -> list[str]:
        """A new session: the URIs held now, to subscribe on it (what was
        released before it is nothing to it)."""
        self._released = []
        return list(self._holders)

    async def hold(self, holder: object, uri: str, subscribe: Send) -> None:
        """``holder`` subscribes to ``uri``; the first holder's subscribe goes
        upstream (its failure is the caller's, and nothing is held)."""
        async with self._lock:
            holders = self._holders.get(uri)
            if holders is None:
                await subscribe(uri)
                holders = self._holders[uri] = set()
            holders.add(holder)

    async def let_go(self, holder: object, uri: str, unsubscribe: Send) -> None:
        """``holder`` unsubscribes from ``uri``; the last one's goes upstream."""
        async with self._lock:
            holders = self._holders.get(uri)
            if holders is None or holder not in holders:
                return
            holders.discard(holder)
            if not holders:
                del self._holders[uri]
                await unsubscribe(uri)

    def release(self, holder: object) -> None:
        """``holder`` is gone: it holds nothing more; the URIs nobody holds
        now wait for ``flush``."""
        for uri, holders in list(self._holders.items()):
            if holder in holders:
                holders.discard(holder)
                if not holders:
                    del self._holders[uri]
                    self._released.append(uri)
        if self._released:
            self._wake.set()

    async def flush(self, unsubscribe: Send) -> None:
        """Wait for released URIs and unsubscribe each that nobody took again
        meanwhile; once per wake-up (the supervisor calls it in a loop)."""
        await self._wake.wait()
        self._wake = anyio.Event()
        released, self._released = self._released, []
        for uri in released:
            async with self._lock:
                if uri not in self._holders:
                    await unsubscribe(uri)
