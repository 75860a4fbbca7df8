"""Resource subscriptions as a front's connections hold them, and who hears an update.

Both fronts take ``resources/subscribe``: the MCP face (its sessions route a
URI to the server that lists it) and the socket API (its connections name the
server). Either way the holder is the connection (a face session, a socket
API connection), and one ``Subscribers`` per front keeps what each holds:

* ``hold`` subscribes a holder to a URI of a server in its scope, once: the
  upstream counts holders across fronts and sends ``resources/subscribe``
  for the first only (``upstream/subscriptions.py``); a server that takes no
  subscriptions is refused there (``Upstream.subscribe_resource``), the same
  error on both fronts;
* ``let_go`` unsubscribes one URI; ``closed`` releases everything a holder
  held when its connection ends (the last holder's unsubscribe follows), on
  the very upstream it was held on, whatever the holder's scope is by then;
* ``updated`` passes a server's ``notifications/resources/updated`` to the
  holders of that URI of that server that still see the server
  (``sees``: the broker's scope, read per update, so a reload that takes
  the server out of a profile's scope stops its connections' updates at
  once), each as its front writes the line (``line``), and to no one else.

A slow reader is skipped after ``SEND_S``, never waited for.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Final, Generic, Protocol, TypeVar

import anyio
import msgspec

from memorizzd.caller import Caller

if TYPE_CHECKING:
    from memorizzd.upstream.actor import Upstream

SEND_S: Final = 1.0
"""How long one update may take to reach one holder."""
UPDATED: Final = "notifications/resources/updated"


class Holder(Protocol):
    """A connection that may hold subscriptions (``rpc.dispatch.Session``)."""

    caller: Caller

    async def send(self, line: bytes) -> None: ...


H = TypeVar("H", bound=Holder)
Line = Callable[[str, str, msgspec.Raw], bytes]
"""The line an update is to a holder: (server, URI, the server's params)."""


class _Updated(msgspec.Struct):
    uri: str


_decode_updated: Final = msgspec.json.Decoder(_Updated).decode


class Subscribers(Generic[H]):
    """One front's holders and the (server, URI) pairs each holds.

    ``sees(holder, server)``: whether the holder may hear of ``server`` now
    (its scope); ``line``: the line an update is to it."""

    def __init__(self, *, sees: Callable[[H, str], bool], line: Line) -> None:
        self._sees = sees
        self._line = line
        self._held: dict[H, dict[tuple[str, str], Upstream]] = {}
        """Each holder's subscriptions, with the upstream each is held on."""

    def holds(self, holder: H) -> bool:
        """Whether ``holder`` holds a subscription (it waits for updates)."""
        return bool(self._held.get(holder))

    def server_of(self, holder: H, uri: str) -> str | None:
        """The server whose ``uri`` ``holder`` holds (the face routes an
        unsubscribe by URI alone); None: it holds no such URI."""
        pairs = self._held.get(holder, {})
        return next((server for server, held_uri in pairs if held_uri == uri), None)

    async def hold(self, holder: H, upstream: Upstream, uri: str) -> None:
        """``holder`` subscribes to ``uri`` of ``upstream`` (one the caller
        may use: the front checked its scope); again is nothing."""
        held = self._held.setdefault(holder, {})  # only ``closed`` removes it
        key = (upstream.name, uri)
        if key in held:
            return
        await upstream.subscribe_resource(holder, uri)
        if self._held.get(holder) is not held:  # its connection closed meanwhile
            upstream.subscriptions.release(holder)
            return
        held[key] = upstream

    async def let_go(self, holder: H, server: str, uri: str) -> None:
        """``holder`` unsubscribes from ``uri`` of ``server`` (what it does
        not hold: nothing); the server hears it when nobody holds the URI."""
        upstream = self._held.get(holder, {}).pop((server, uri), None)
        if upstream is not None:
            await upstream.unsubscribe_resource(holder, uri)

    def closed(self, holder: H) -> None:
        """``holder``'s connection ended: it holds nothing more (the URIs
        nobody holds now are unsubscribed by each server's supervisor)."""
        upstreams = {id(u): u for u in self._held.pop(holder, {}).values()}
        for upstream in upstreams.values():
            upstream.subscriptions.release(holder)

    async def updated(self, server: str, params: msgspec.Raw) -> str | None:
        """A server's ``notifications/resources/updated``: to the holders of
        that URI of that server that still see it. Returns the URI (None: the
        params name none)."""
        try:
            uri = _decode_updated(params).uri
        except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
            return None
        key = (server, uri)
        holders = [h for h, held in self._held.items() if key in held]
        if holders:
            line = self._line(server, uri, params)
            for holder in holders:
                if self._sees(holder, server):
                    await _send(holder.send, line)
        return uri


async def _send(send: Callable[[bytes], Awaitable[None]], line: bytes) -> None:
    with anyio.move_on_after(SEND_S):
        await send(line)
