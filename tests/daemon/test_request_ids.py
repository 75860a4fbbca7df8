"""The one reader of which JSON-RPC request a POST carries (``request_id_of``)
and of which message an answer is (``head_of``), shared by the size caps
(``egress/limits.py``) and the refusal replies (``egress/replies.py``); pure,
no sockets."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import anyio
import httpx2
import msgspec
import pytest

from memorizz.api.errors import PermissionDeniedError
from memorizzd.egress import replies
from memorizzd.egress.limits import CappedTransport, _under_its_id
from memorizzd.egress.replies import RefusalReplies, head_of, request_id_of
from tests.daemon.test_fuzz_findings import nested

URL = "https://mcp.example/mcp"


def post(body: bytes) -> httpx2.Request:
    return httpx2.Request("POST", URL, content=body)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{}}', 7),
        (b'{"jsonrpc":"2.0","id":"r-1","method":"ping"}', "r-1"),
        (b'{"params":{"a":[1,2]},"id":-3,"method":"ping","jsonrpc":"2.0"}', -3),
        (b'{"jsonrpc":"2.0","method":"notifications/initialized"}', None),
        (b'{"jsonrpc":"2.0","id":null,"method":"ping"}', None),
        (b'{"jsonrpc":"2.0","id":4,"result":{}}', None),  # our reply to the server
        (b'{"jsonrpc":"2.0","id":1.5,"method":"ping"}', None),
        (b'{"jsonrpc":"2.0","id":true,"method":"ping"}', None),
        (b'{"jsonrpc":"2.0","id":{"n":1},"method":"ping"}', None),
        (b'{"jsonrpc":"2.0","id":1,"method":3}', None),
        (b'[{"jsonrpc":"2.0","id":1,"method":"ping"}]', None),  # a batch
        (b'"ping"', None),
        (b"not json", None),
        (b"", None),
        (b'{"jsonrpc":"2.0","id":1,"method":"ping","params":' + nested() + b"}", None),
        (nested(), None),
    ],
)
def test_the_id_of_a_post_is_its_json_rpc_request_id_or_none(
    body: bytes, expected: int | str | None
) -> None:
    assert request_id_of(post(body)) == expected


def test_a_request_other_than_a_post_carries_no_request() -> None:
    body = b'{"jsonrpc":"2.0","id":7,"method":"ping"}'
    for method in ("GET", "DELETE", "PUT"):
        assert request_id_of(httpx2.Request(method, URL, content=body)) is None


def test_a_body_not_read_yet_is_no_request_and_is_read_again_later() -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"jsonrpc":"2.0","id":7,"method":"ping"}'

    request = httpx2.Request("POST", URL, content=chunks())
    assert request_id_of(request) is None
    anyio.run(request.aread)
    assert request_id_of(request) == 7


def test_the_body_is_decoded_once_however_often_its_id_is_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    decoded = counting_decoder(monkeypatch)
    request = post(b'{"jsonrpc":"2.0","id":7,"method":"ping"}')
    assert [request_id_of(request) for _ in range(3)] == [7, 7, 7]
    notification = post(b'{"jsonrpc":"2.0","method":"notifications/initialized"}')
    assert [request_id_of(notification) for _ in range(3)] == [None] * 3
    assert decoded == [request.content, notification.content]


@pytest.mark.parametrize(
    ("body", "method", "id_"),
    [
        (b'{"jsonrpc":"2.0","id":2,"result":{"t":[[1]]}}', None, 2),
        (b'{"jsonrpc":"2.0","id":"a","error":{"code":1,"message":"m"}}', None, "a"),
        (
            b'{"jsonrpc":"2.0","method":"notifications/message"}',
            "notifications/message",
            None,
        ),
    ],
)
def test_the_head_of_a_message_is_its_method_and_id(
    body: bytes, method: str | None, id_: int | str | None
) -> None:
    head = head_of(body)
    assert head is not None
    assert (head.method, head.id) == (method, id_)


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b'[{"jsonrpc":"2.0","id":1,"result":{}}]',
        b'{"jsonrpc":"2.0","id":1.5,"result":{}}',
        b'{"jsonrpc":"2.0","id":false,"result":{}}',
        b'{"jsonrpc":"2.0","id":1,"result":' + nested() + b"}",
    ],
)
def test_a_body_that_is_no_one_message_has_no_head(body: bytes) -> None:
    assert head_of(body) is None


def test_an_answer_under_another_id_becomes_an_error_for_the_request() -> None:
    ours = b'{"jsonrpc":"2.0","id":7,"result":{}}'
    assert _under_its_id(ours, 7) == ours
    for passes in (
        b'{"jsonrpc":"2.0","method":"ping","id":8}',  # the server's own request
        b'{"jsonrpc":"2.0","result":{}}',
        b"not json",
        b'{"jsonrpc":"2.0","id":8,"result":' + nested() + b"}",
    ):
        assert _under_its_id(passes, 7) == passes
    other = msgspec.json.decode(
        _under_its_id(b'{"jsonrpc":"2.0","id":8,"result":{}}', 7)
    )
    assert other["id"] == 7
    assert "under another id" in other["error"]["message"]


class _Refusing(httpx2.AsyncBaseTransport):
    """Refuses every request, as the guarded transport refuses a denied address."""

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        raise PermissionDeniedError("address not allowed")


def test_one_request_through_both_transports_is_decoded_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The refusal replies read the request's id to answer it, the cap reads it
    again to check the answer's: the request is decoded once (and the answer's
    head once, by the cap)."""
    decoded = counting_decoder(monkeypatch)
    transport = CappedTransport(RefusalReplies(_Refusing()), 1 << 20)
    request = post(b'{"jsonrpc":"2.0","id":7,"method":"tools/call"}')

    async def main() -> bytes:
        response = await transport.handle_async_request(request)
        return await response.aread()

    body = anyio.run(main)
    answer = msgspec.json.decode(body)
    assert answer["id"] == 7
    assert isinstance(
        replies.refusal_in(answer["error"]["data"]), PermissionDeniedError
    )
    assert decoded == [request.content, body]


def counting_decoder(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """The bodies the shared reader decodes, from now on."""
    decoded: list[bytes] = []
    decode: Callable[[bytes], replies.Head] = replies._decode_head

    def counted(body: bytes) -> replies.Head:
        decoded.append(body)
        return decode(body)

    monkeypatch.setattr(replies, "_decode_head", counted)
    return decoded
