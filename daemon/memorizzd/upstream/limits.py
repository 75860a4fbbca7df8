"""Result size caps on every transport, without buffering more than the cap.

An upstream message larger than ``max_result_bytes`` is never assembled in
memory. Each transport drops it as it streams and, in its place, hands the SDK
a JSON-RPC error for the same request id carrying ``TOO_LARGE_MARKER``, so the
one request fails with ``result_too_large`` and the session lives on.

* stdio: ``stdio.py`` uses :func:`too_large_reply` on an oversize line.
* HTTP (Streamable HTTP and legacy SSE): :class:`CappedTransport` wraps the
  transport of the hardened client (``memorizzd.egress.client``). A JSON body
  is buffered up to the cap and replaced when it exceeds it; an event stream
  is filtered event by event, and an oversize event is replaced by an error
  event. Bodies are requested with ``Accept-Encoding: identity`` (and the
  hardened client refuses any other coding), so the bytes counted are the
  bytes decoded.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any, Final

import httpx2
import msgspec

TOO_LARGE_MARKER: Final = "memorizz.result_too_large"
"""``error.data`` of a synthesized reply to an oversize message."""

_HEAD: Final = 4096
_ID_RE: Final = re.compile(rb'"id"\s*:\s*("(?:[^"\\]|\\.){0,256}"|-?\d{1,20})')
_encoder: Final = msgspec.json.Encoder()


def request_id_in(head: bytes) -> int | str | None:
    """The JSON-RPC id near the start of a message, if it is visible there."""
    match = _ID_RE.search(head)
    if match is None:
        return None
    raw = match.group(1)
    if raw[:1] == b'"':
        return raw[1:-1].decode(errors="replace")
    return int(raw)


def too_large_error(request_id: int | str | None, limit: int) -> bytes:
    """A JSON-RPC error reply (one line of JSON) for the oversize message."""
    return _encoder.encode(
        {
            "jsonrpc": "2.0",
            "id": request_id,
            "error": {
                "code": -32603,
                "message": f"result larger than max_result_bytes ({limit})",
                "data": TOO_LARGE_MARKER,
            },
        }
    )


class _CappedJSON(httpx2.AsyncByteStream):
    def __init__(
        self, inner: httpx2.AsyncByteStream, limit: int, request_id: Any
    ) -> None:
        self._inner, self._limit, self._id = inner, limit, request_id

    async def __aiter__(self) -> AsyncIterator[bytes]:
        body = bytearray()
        async for chunk in self._inner:
            body += chunk
            if len(body) > self._limit:
                yield too_large_error(self._id, self._limit)
                return
        yield bytes(body)

    async def aclose(self) -> None:
        await self._inner.aclose()


class _CappedEvents(httpx2.AsyncByteStream):
    """Passes a text/event-stream through event by event; replaces oversize events."""

    def __init__(self, inner: httpx2.AsyncByteStream, limit: int) -> None:
        self._inner, self._limit = inner, limit

    async def __aiter__(self) -> AsyncIterator[bytes]:
        event = bytearray()  # complete lines of the current event
        line = bytearray()  # the current, incomplete line (empty while dropping)
        line_len, line_tail = 0, b""
        dropping, head = False, b""
        async for chunk in self._inner:
            pos = 0
            while pos < len(chunk):
                newline = chunk.find(b"\n", pos)
                end = len(chunk) if newline < 0 else newline + 1
                segment = chunk[pos:end]
                pos = end
                line_len += len(segment)
                line_tail = (line_tail + segment)[-2:]
                if not dropping:
                    line += segment
                    if len(event) + len(line) > self._limit:
                        head = bytes((event + line)[:_HEAD])
                        event.clear()
                        line.clear()
                        dropping = True
                if newline < 0:
                    continue
                blank = line_len == 1 or (line_len == 2 and line_tail == b"\r\n")
                if dropping:
                    if blank:
                        error = too_large_error(request_id_in(head), self._limit)
                        yield b"event: message\ndata: " + error + b"\n\n"
                        dropping = False
                else:
                    event += line
                    if blank:
                        yield bytes(event)
                        event.clear()
                line.clear()
                line_len, line_tail = 0, b""
        if not dropping and (event or line):
            yield bytes(event + line)

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
        capped: httpx2.AsyncByteStream
        if content_type.startswith("text/event-stream"):
            capped = _CappedEvents(stream, self._limit)
        elif content_type.startswith("application/json"):
            capped = _CappedJSON(stream, self._limit, _request_id(request))
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


def _request_id(request: httpx2.Request) -> Any:
    try:
        body = msgspec.json.decode(request.content)
    except (msgspec.DecodeError, httpx2.RequestNotRead):
        return None
    return body.get("id") if isinstance(body, dict) else None
