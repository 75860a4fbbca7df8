"""The streaming size caps, byte by byte (pure: no sockets)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import httpx2
import msgspec
import pytest

from memorizzd.upstream.limits import (
    TOO_LARGE_MARKER,
    _CappedEvents,
    _CappedJSON,
    request_id_in,
)


class Chunks(httpx2.AsyncByteStream):
    def __init__(self, data: bytes, size: int) -> None:
        self.data, self.size = data, size

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for i in range(0, len(self.data), self.size):
            yield self.data[i : i + self.size]


def event(message_id: int, payload: str, *, crlf: bool = False) -> bytes:
    nl = b"\r\n" if crlf else b"\n"
    body = msgspec.json.encode(
        {"jsonrpc": "2.0", "id": message_id, "result": {"t": payload}}
    )
    return b"event: message" + nl + b"data: " + body + nl + nl


async def collect(stream: httpx2.AsyncByteStream) -> bytes:
    return b"".join([chunk async for chunk in stream])


@pytest.mark.parametrize("size", [1, 3, 7, 100, 65536])
@pytest.mark.parametrize("crlf", [False, True])
def test_oversize_events_are_replaced_and_others_pass_through(
    size: int, crlf: bool
) -> None:
    small, big, after = (
        event(1, "a", crlf=crlf),
        event(2, "x" * 5000, crlf=crlf),
        event(3, "b", crlf=crlf),
    )
    out = anyio.run(collect, _CappedEvents(Chunks(small + big + after, size), 1000))
    first, rest = out[: len(small)], out[len(small) :]
    assert first == small
    assert rest.endswith(after)
    replaced = rest[: -len(after)]
    data = replaced.split(b"data: ", 1)[1].strip()
    error = msgspec.json.decode(data)
    assert error["id"] == 2
    assert error["error"]["data"] == TOO_LARGE_MARKER
    assert len(replaced) < 400


def test_a_json_body_over_the_cap_becomes_an_error_for_the_request_id() -> None:
    body = b'{"jsonrpc":"2.0","id":"r-9","result":{"t":"' + b"x" * 5000 + b'"}}'
    out = anyio.run(collect, _CappedJSON(Chunks(body, 512), 1000, "r-9"))
    assert msgspec.json.decode(out)["id"] == "r-9"
    ok = anyio.run(collect, _CappedJSON(Chunks(body, 512), 10_000, "r-9"))
    assert ok == body


def test_request_ids_are_found_in_the_head_of_a_message() -> None:
    assert request_id_in(b'{"jsonrpc":"2.0","id":17,"result":') == 17
    assert request_id_in(b'{"jsonrpc":"2.0","id": "a\\"b","result":') == 'a\\"b'
    assert request_id_in(b'{"jsonrpc":"2.0","result":{}}') is None
