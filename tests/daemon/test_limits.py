"""The streaming size caps, byte by byte (pure: no sockets)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import httpx2
import msgspec
import pytest

from memorizzd.egress.limits import (
    TOO_LARGE_MARKER,
    _CappedEvents,
    _CappedJSON,
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


class Hanging(httpx2.AsyncByteStream):
    """Sends its chunks, then nothing more, ever (the rest of a slow message)."""

    def __init__(self, *chunks: bytes) -> None:
        self.chunks = chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk
        await anyio.sleep_forever()


async def first_error(stream: httpx2.AsyncByteStream) -> dict[str, object]:
    """The first event out of ``stream`` (within a second), decoded."""
    with anyio.fail_after(1):
        async for out in stream:
            data = out.split(b"data: ", 1)[1].strip()
            decoded: dict[str, object] = msgspec.json.decode(data)
            return decoded
    raise AssertionError("the stream ended")


def id_last_event(message_id: int, payload: str) -> bytes:
    body = b'{"result":{"t":"' + payload.encode() + b'"},"jsonrpc":"2.0","id":'
    return b"event: message\ndata: " + body + str(message_id).encode() + b"}\n\n"


@pytest.mark.parametrize("size", [1, 3, 7, 100, 65536])
def test_an_oversize_event_with_its_id_last_is_answered_for_that_id(
    size: int,
) -> None:
    data = id_last_event(1, "a") + id_last_event(2, "x" * 5000) + id_last_event(3, "b")
    out = anyio.run(collect, _CappedEvents(Chunks(data, size), 1000))
    events = out.split(b"\n\n")
    assert events[0] + b"\n\n" == id_last_event(1, "a")
    error = msgspec.json.decode(events[1].split(b"data: ", 1)[1])
    assert (error["id"], error["error"]["data"]) == (2, TOO_LARGE_MARKER)
    assert events[2] + b"\n\n" == id_last_event(3, "b")


def test_the_error_goes_out_once_the_id_has_passed_not_when_the_event_ends() -> None:
    unfinished = id_last_event(7, "x" * 5000)[:-2]  # the event's last lines never come
    error = anyio.run(first_error, _CappedEvents(Hanging(unfinished), 1000))
    assert error["id"] == 7


def test_a_streamable_http_reply_is_answered_for_its_post_at_the_cap() -> None:
    """A POST's event stream carries the response to that POST: once the
    oversize message shows it is a response, its id is known."""
    head = b'event: message\ndata: {"result":{"t":"' + b"x" * 5000
    error = anyio.run(first_error, _CappedEvents(Hanging(head), 1000, request_id=9))
    assert error["id"] == 9


def test_data_spread_over_several_lines_is_one_message() -> None:
    event = (
        b'id: 5\nevent: message\ndata: {"result":\ndata:"'
        + b"x" * 5000
        + b'"\r\n: a comment\r\ndata: ,"id":4}\n\n'
    )
    for size in (1, 5, 4096):
        out = anyio.run(collect, _CappedEvents(Chunks(event, size), 1000))
        assert msgspec.json.decode(out.split(b"data: ", 1)[1])["id"] == 4


def test_an_oversize_request_from_the_server_is_dropped_without_an_answer() -> None:
    """Its id is the server's; an error for it would fail our own request of that id."""
    request = msgspec.json.encode(
        {"jsonrpc": "2.0", "id": 1, "method": "sampling/createMessage", "params": {}}
    )
    request = request[:-1] + b',"pad":"' + b"x" * 5000 + b'"}'
    data = b"event: message\ndata: " + request + b"\n\n" + event(3, "b")
    out = anyio.run(collect, _CappedEvents(Chunks(data, 64), 1000))
    assert out == event(3, "b")
