"""Opening a legacy HTTP+SSE session without hanging.

The SDK's ``sse_client`` waits for the stream's ``endpoint`` event (where to
POST messages) inside its ``__aenter__``, and until that event it has no
reader for what it sees: an endpoint on another origin (a ``ValueError``), a
broken stream, or a ``message`` event first are all handed to a zero-buffer
stream that nobody reads yet, so connecting hangs for as long as the stream
stays open; an idle stream hangs for its 24-hour read timeout. Two guards:

* ``EndpointWatch`` sits in the hardened client's transport stack and reads
  the stream's first events before the SDK does (httpx2's own SSE parser, so
  both see the same events). The ``endpoint`` event must name the stream's own
  origin, as the SDK demands (same scheme and ``host[:port]`` as written);
  nothing but comments may come before it. Anything else, and the watch
  records why (``redirect_blocked``: the server directs our messages to
  another origin; ``upstream_error`` otherwise) and ends the stream: the SDK's
  reader then stops without starting, and ``open_connection`` raises the recorded
  error at once instead of the SDK's bare ``RuntimeError``.
* ``opened_within`` bounds the whole open (connect, TLS, the GET's headers,
  the endpoint event) by the server's ``timeout_s``: whatever else goes wrong
  before the session exists, connecting ends with ``timeout``.

Once open, the stream is the session: every answer comes on it. The SDK's
reader logs a stream that broke (a server that stopped or restarted) and
ends, and its session then fails each later request at once, unsent, but
says so to nobody. ``StreamEnd`` (``watched_to_the_end``) notes when the
stream the SDK reads ended, so that the session is given up at once
(``session.py``) instead of at the next call or health probe.
"""

from __future__ import annotations

import codecs
import math
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, Final, Self, TypeVar
from urllib.parse import urljoin, urlparse

import anyio
import httpx2
from httpx2._sse import _SSEParser  # the SDK's parser: the same events, or none

from memorizz.api.errors import (
    DeadlineExceededError,
    PermissionDeniedError,
    RemoteError,
    UpstreamError,
)

HOLD_MAX: Final = 64 * 1024
"""Bytes the stream may send before its endpoint event."""

T = TypeVar("T")


class EndpointWatch:
    """Checks one SSE stream's ``endpoint`` event before the SDK sees it."""

    def __init__(self, url: str) -> None:
        self.url = url
        """The stream's URL, as the SDK was given it (it joins the endpoint to it)."""
        self.error: RemoteError | None = None
        """Why the stream was ended before its endpoint event, if it was."""
        self._watching = True

    def wrap(self, inner: httpx2.AsyncBaseTransport) -> httpx2.AsyncBaseTransport:
        return _WatchTransport(inner, self)

    def check(self, data: str) -> bool:
        """Is ``data`` (an ``endpoint`` event) on the stream's origin?"""
        endpoint = urljoin(self.url, data)
        ours, theirs = urlparse(self.url), urlparse(endpoint)
        if (ours.scheme, ours.netloc) == (theirs.scheme, theirs.netloc):
            return True
        # Without userinfo, as a refused redirect's target is shown (transport.py).
        shown = f"{theirs.scheme}://{theirs.netloc.rpartition('@')[2]}"[:200]
        self.error = PermissionDeniedError(
            f"redirect_blocked: the SSE endpoint event names {shown!r}, not the "
            f"stream's origin {ours.scheme}://{ours.netloc}; messages go only to "
            "the server's own origin",
            reason="redirect_blocked",
        )
        return False

    def refuse(self, detail: str) -> None:
        self.error = UpstreamError(f"the SSE stream {detail}")


class _WatchTransport(httpx2.AsyncBaseTransport):
    def __init__(self, inner: httpx2.AsyncBaseTransport, watch: EndpointWatch) -> None:
        self._inner, self._watch = inner, watch

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self._inner.handle_async_request(request)
        content_type = response.headers.get("content-type", "")
        if not (
            self._watch._watching
            and request.method == "GET"
            and content_type.startswith("text/event-stream")
            and isinstance(response.stream, httpx2.AsyncByteStream)
        ):
            return response
        self._watch._watching = False  # the SDK opens one stream
        return httpx2.Response(
            status_code=response.status_code,
            headers=response.headers,
            stream=_Watched(response.stream, self._watch),
            extensions=response.extensions,
            request=request,
        )

    async def aclose(self) -> None:
        await self._inner.aclose()


class _Watched(httpx2.AsyncByteStream):
    def __init__(self, inner: httpx2.AsyncByteStream, watch: EndpointWatch) -> None:
        self._inner, self._watch = inner, watch

    async def __aiter__(self) -> AsyncIterator[bytes]:
        chunks = aiter(self._inner)
        parser = _SSEParser(HOLD_MAX)
        text = codecs.getincrementaldecoder("utf-8")(errors="replace")
        held = bytearray()
        while True:
            try:
                chunk = await anext(chunks)
            except StopAsyncIteration:
                self._watch.refuse("closed before its endpoint event")
                return
            except httpx2.TransportError as exc:
                self._watch.refuse(
                    f"broke before its endpoint event ({type(exc).__name__})"
                )
                return
            held += chunk
            if len(held) > HOLD_MAX:
                self._watch.refuse(f"sent {HOLD_MAX} bytes without an endpoint event")
                return
            try:
                events = list(parser.decode(text.decode(chunk)))
            except httpx2.SSEError:
                self._watch.refuse("sent an oversize event before its endpoint event")
                return
            verdict = _first_verdict(events, self._watch)
            if verdict is False:
                return
            if verdict:
                break
        yield bytes(held)  # the endpoint event and whatever came with it
        async for chunk in chunks:
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


def _first_verdict(
    events: list[httpx2.ServerSentEvent], watch: EndpointWatch
) -> bool | None:
    """True: a good endpoint event came; False: refused; None: read on."""
    for event in events:
        if event.event == "endpoint":
            return watch.check(event.data)
        if event.event == "message" and event.data:
            watch.refuse("sent a message before its endpoint event")
            return False
        # Other event types and empty keep-alive messages: the SDK skips them.
    return None


@asynccontextmanager
async def opened_within(
    transport: AbstractAsyncContextManager[T], seconds: float, watch: EndpointWatch
) -> AsyncIterator[T]:
    """Enter ``transport`` within ``seconds``; raise the watch's finding, if any.

    The cancel scope encloses the transport's whole life (its task group is
    entered inside it) and is lifted once the transport is open."""
    opened = False
    with anyio.CancelScope(deadline=anyio.current_time() + seconds) as scope:
        try:
            async with transport as streams:
                opened = True
                scope.deadline = math.inf
                yield streams
        except Exception:
            if not opened and watch.error is not None:
                raise watch.error from None
            raise
    if not opened:
        if watch.error is not None:
            raise watch.error
        raise DeadlineExceededError(
            f"the SSE stream did not open (no endpoint event) within {seconds:g} s"
        )


class StreamEnd:
    """Whether the event stream of an open legacy SSE session ended, and why."""

    def __init__(self) -> None:
        self.ended = anyio.Event()
        self.why = "the server closed it"

    def saw(self, failure: Exception) -> None:
        """The SDK's reader handed on why the stream broke (it ends next)."""
        self.why = f"it broke ({type(failure).__name__})"


class _ToTheEnd:
    """The SDK's read stream (its ``ContextReceiveStream``), as the session
    reads it, telling ``end`` when it ended."""

    def __init__(self, inner: Any, end: StreamEnd) -> None:
        self._inner, self._end = inner, end

    @property
    def last_context(self) -> Any:
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> Any:
        try:
            item = await self._inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            self._end.ended.set()
            raise
        if isinstance(item, Exception):
            self._end.saw(item)
        return item

    def close(self) -> None:
        self._inner.close()

    async def aclose(self) -> None:
        await self._inner.aclose()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


@asynccontextmanager
async def watched_to_the_end(
    transport: AbstractAsyncContextManager[tuple[Any, Any]], end: StreamEnd
) -> AsyncIterator[tuple[Any, Any]]:
    """``transport`` (the SDK's ``sse_client``: its read and write streams),
    with ``end.ended`` set once the read stream the session reads ended."""
    async with transport as (read_stream, write_stream):
        yield _ToTheEnd(read_stream, end), write_stream
