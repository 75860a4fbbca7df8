"""Result size caps on every transport, without buffering more than the cap.

An upstream message larger than ``max_result_bytes`` is never assembled in
memory. Each transport drops it as it streams, and scans it on the way
(:class:`~memorizzd.egress.envelope.EnvelopeScanner`) for its ``id``, wherever
it is: servers on the TypeScript SDK write it last. As soon as the message is
known to be a response to one of our requests, the transport hands the SDK a
JSON-RPC error for that id carrying ``TOO_LARGE_MARKER`` (:class:`OversizeMessage`),
so the one request fails with ``result_too_large`` at once and the session
lives on. A request or notification from the server is dropped, never
answered: its id is the server's, not ours.

* stdio: ``stdio.py`` feeds an oversize line to an :class:`OversizeMessage`
  (``oversize.py``: no HTTP client is imported where only stdio servers run).
* HTTP (Streamable HTTP and legacy SSE): :class:`CappedTransport` wraps the
  transport of the hardened client (``memorizzd.egress.client``). A JSON body
  is buffered up to the cap and replaced when it exceeds it (the request says
  which id it answers); an event stream is filtered event by event, and an
  oversize event's ``data`` is scanned and replaced by an error event. Bodies
  are requested with ``Accept-Encoding: identity`` (and the hardened client
  refuses any other coding), so the bytes counted are the bytes decoded.

What the answers to a block's requests take together is counted here too
(``counted``: a listing's pages, capped together by ``upstream/session.py``).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Final

import httpx2

from memorizz.api.errors import UpstreamError
from memorizzd.egress.oversize import TOO_LARGE_MARKER, OversizeMessage, too_large_error
from memorizzd.egress.replies import head_of, refusal_reply, request_id_of

__all__ = ["TOO_LARGE_MARKER", "CappedTransport", "too_large_error"]

log = logging.getLogger("memorizzd.egress.limits")


class _CappedJSON(httpx2.AsyncByteStream):
    def __init__(
        self,
        inner: httpx2.AsyncByteStream,
        limit: int,
        request_id: Any,
        *,
        answer: bool = True,
    ) -> None:
        self._inner, self._limit, self._id = inner, limit, request_id
        self._answer = answer
        """A success status: the body is the request's answer (``_under_its_id``)."""

    async def __aiter__(self) -> AsyncIterator[bytes]:
        body = bytearray()
        async for chunk in self._inner:
            body += chunk
            if len(body) > self._limit:
                yield too_large_error(self._id, self._limit)
                return
        yield _under_its_id(bytes(body), self._id) if self._answer else bytes(body)

    async def aclose(self) -> None:
        await self._inner.aclose()


class _EventData:
    """Feeds the ``data`` of one server-sent event to ``sink``, line piece by
    line piece (a piece that ends a line ends with ``\n``); data lines are
    joined with ``\n``, other fields are skipped."""

    _NAME_MAX: Final = 16

    def __init__(self, sink: Callable[[bytes], None]) -> None:
        self._sink = sink
        self._name = bytearray()  # the field name, until its colon
        self._state = "name"  # name | space | data | other
        self._data_lines = 0

    def feed(self, piece: bytes) -> None:
        ends = piece.endswith(b"\n")
        if ends:
            piece = piece[:-1]
        if self._state == "name":
            colon = piece.find(b":")
            if colon >= 0:
                self._field(bytes(self._name + piece[:colon]))
                piece = piece[colon + 1 :]
            else:
                self._name += piece
                piece = b""
                if ends:  # a line without a colon names a field with an empty value
                    self._field(bytes(self._name))
                elif len(self._name) > self._NAME_MAX:
                    self._state = "other"
        if self._state == "space" and piece:
            piece = piece[1:] if piece[:1] == b" " else piece
            self._state = "data"
        if self._state == "data" and piece:
            self._sink(piece)
        if ends:
            self._name.clear()
            self._state = "name"

    def _field(self, name: bytes) -> None:
        if name != b"data":
            self._state = "other"
            return
        self._state = "space"
        if self._data_lines:
            self._sink(b"\n")
        self._data_lines += 1


class _CappedEvents(httpx2.AsyncByteStream):
    """Passes a text/event-stream through event by event; replaces oversize
    events by an error event, sent as soon as the id it answers is known."""

    def __init__(
        self,
        inner: httpx2.AsyncByteStream,
        limit: int,
        *,
        host: str = "",
        request_id: int | str | None = None,
    ) -> None:
        self._inner, self._limit = inner, limit
        self._host, self._request_id = host, request_id

    async def __aiter__(self) -> AsyncIterator[bytes]:
        event = bytearray()  # complete lines of the current event
        line = bytearray()  # the current, incomplete line (empty while dropping)
        line_len, line_tail = 0, b""
        oversize: OversizeMessage | None = None
        data: _EventData | None = None
        async for chunk in self._inner:
            pos = 0
            while pos < len(chunk):
                newline = chunk.find(b"\n", pos)
                end = len(chunk) if newline < 0 else newline + 1
                segment = chunk[pos:end]
                pos = end
                line_len += len(segment)
                line_tail = (line_tail + segment)[-2:]
                if data is not None:
                    data.feed(segment)
                else:
                    line += segment
                    if len(event) + len(line) > self._limit:
                        oversize = OversizeMessage(self._limit, self._request_id)
                        data = _EventData(oversize.feed)
                        for complete in bytes(event).split(b"\n")[:-1]:
                            data.feed(complete + b"\n")
                        data.feed(bytes(line))
                        event.clear()
                        line.clear()
                if oversize is not None and (reply := oversize.take_reply()):
                    yield b"event: message\ndata: " + reply + b"\n\n"
                if newline < 0:
                    continue
                blank = line_len == 1 or (line_len == 2 and line_tail == b"\r\n")
                if oversize is not None:
                    if blank:
                        log.warning("%s: %s", self._host, oversize.outcome())
                        oversize = data = None
                else:
                    event += line
                    if blank:
                        yield bytes(event)
                        event.clear()
                line.clear()
                line_len, line_tail = 0, b""
        if oversize is None and (event or line):
            yield bytes(event + line)

    async def aclose(self) -> None:
        await self._inner.aclose()


class ReadBytes:
    """The bytes read of the answers to the requests a block sent (``counted``)."""

    __slots__ = ("total",)

    def __init__(self) -> None:
        self.total = 0


_reading: ContextVar[ReadBytes | None] = ContextVar("memorizz_read_bytes", default=None)


@contextmanager
def counted() -> Iterator[ReadBytes]:
    """Count the bytes read of the answers to the requests sent in the block,
    as they are read. The SDK's Streamable HTTP client sends each request,
    and reads its answer, in a task of the context the request was sent from
    (its context propagation), where ``CappedTransport`` finds the count. An
    answer that comes on a stream of its own (legacy SSE's) is not counted."""
    read = ReadBytes()
    token = _reading.set(read)
    try:
        yield read
    finally:
        _reading.reset(token)


class _Counted(httpx2.AsyncByteStream):
    """A body whose bytes are counted to ``read`` as they are read."""

    def __init__(self, inner: httpx2.AsyncByteStream, read: ReadBytes) -> None:
        self._inner, self._read = inner, read

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            self._read.total += len(chunk)
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class CappedTransport(httpx2.AsyncBaseTransport):
    def __init__(self, inner: httpx2.AsyncBaseTransport, limit: int) -> None:
        self._inner, self._limit = inner, limit

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        request.headers["Accept-Encoding"] = "identity"
        response = await self._inner.handle_async_request(request)
        content_type = response.headers.get("content-type", "")
        stream = response.stream
        if not isinstance(stream, httpx2.AsyncByteStream):  # pragma: no cover
            return response
        if (read := _reading.get()) is not None:
            stream = _Counted(stream, read)
        capped: httpx2.AsyncByteStream
        if content_type.startswith("text/event-stream"):
            capped = _CappedEvents(
                stream,
                self._limit,
                host=request.url.host,
                request_id=request_id_of(request),
            )
        elif content_type.startswith("application/json"):
            capped = _CappedJSON(
                stream,
                self._limit,
                request_id_of(request),
                answer=response.is_success,
            )
        else:
            return response
        headers = httpx2.Headers(response.headers)
        headers.pop("content-length", None)
        return httpx2.Response(
            status_code=response.status_code,
            headers=headers,
            stream=capped,
            extensions=response.extensions,
            request=request,
        )

    async def aclose(self) -> None:
        await self._inner.aclose()


def _under_its_id(body: bytes, request_id: Any) -> bytes:
    """``body``, the JSON answer to the request ``request_id``; one that
    answers under another id becomes an error for the request (the SDK drops
    such an answer as nobody's, and the call waited for its deadline)."""
    if request_id is None:
        return body
    answer = head_of(body)
    if answer is None:
        return body  # not one JSON-RPC message: the SDK says what it is
    if answer.method is not None or answer.id is None or answer.id == request_id:
        return body
    error = UpstreamError(
        f"the server answered request {request_id!r} under another id"
        f" ({str(answer.id)[:40]!r}); the answer was not taken"
    )
    return refusal_reply(request_id, error)
