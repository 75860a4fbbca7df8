"""Client lines that answer the daemon: responses to its requests.

While a call runs, the daemon may send its client a request (an upstream's
``elicitation/create`` or ``sampling/createMessage``, ``calllife.Asker``), on
the MCP face and on the socket API alike; the client's response comes back on
the same connection as a line with an ``id`` and a ``result`` or ``error``,
and no ``method``. A socket server knows lines only as requests
(``LineDispatcher.parse``), so a response is handed on as a notification of
its own (``ANSWER``, the line as its params), which ``take`` gives to the
request that waits for it. Requests never pay for this: a line is looked at
as a response only once it failed to be one.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from memorizz.api.protocol import Request
from memorizzd import calllife
from memorizzd.egress.envelope import EnvelopeScanner
from memorizzd.rpc.dispatch import Dispatcher, Session, parse_request

ANSWER: Final = "memorizz/answer"
"""The notification a response line is handed on as (never sent by a client
that means it: one that does answers only its own requests)."""


class _Response(msgspec.Struct):
    id: Any = None
    """Any: a response is never answered, whatever its id (one that is not an
    integer nor a string, ``2.5`` or ``true``, answers nothing of ours and
    is dropped: ``calllife.answered`` reads only those)."""
    method: str | None = None
    result: msgspec.Raw = msgspec.Raw(b"")
    error: msgspec.Raw = msgspec.Raw(b"")


_decode_response: Final = msgspec.json.Decoder(_Response).decode
_encode: Final = msgspec.json.encode
CANCELLED: Final = "notifications/cancelled"


def parse_line(line: bytes) -> Request | bytes:
    """``parse_request``, except that a response line becomes ``ANSWER``."""
    parsed = parse_request(line)
    if isinstance(parsed, bytes):
        try:
            response = _decode_response(line)
        except (msgspec.DecodeError, RecursionError, ValueError):
            # not JSON, too deep (the error says so), not a response; or a
            # response we cannot read, which its request must not wait out
            return _unreadable_answer(line) or parsed
        if response.method is None and (response.result or response.error):
            # a response is never answered, not even one with a null id (our
            # own error for a line we could not read, sent back: answering it
            # would start an endless exchange); one with an id goes to its
            # request, if any waits for it
            return Request(jsonrpc="2.0", method=ANSWER, params=msgspec.Raw(line))
    return parsed


def _unreadable_answer(line: bytes) -> Request | None:
    """A response line that cannot be decoded (a lone surrogate escape in its
    result, say) whose id is plain to see: an error answer under that id."""
    scanner = EnvelopeScanner()
    scanner.feed(line.strip())
    if not (scanner.done and scanner.answerable):
        return None
    error = {
        "jsonrpc": "2.0",
        "id": scanner.id,
        "error": {
            "code": -32700,
            "message": "the caller's client answered with a line that is not valid"
            " UTF-8 JSON",
        },
    }
    return Request(jsonrpc="2.0", method=ANSWER, params=msgspec.Raw(_encode(error)))


def take(session: Session, request: Request) -> bool:
    """An ``ANSWER``: handed to the request of ours it answers (an answer to
    nothing, late or unknown, is dropped). False: not an answer."""
    if request.method != ANSWER:
        return False
    calllife.answered(session, bytes(request.params))
    return True


class _Cancelled(msgspec.Struct, rename="camel"):
    request_id: int | str


class AnsweringDispatcher(Dispatcher):
    """The socket API's ``Dispatcher``, taking its clients' answers too, and
    ``notifications/cancelled`` (as MCP has it: ``requestId``), which cancels
    that request of the connection whatever its effects, its upstream request
    too, with no reply (``memorizzctl``'s Ctrl-C sends it)."""

    def parse(self, line: bytes) -> Request | bytes:
        return parse_line(line)

    def notified(self, session: Session, request: Request) -> bool:
        if request.method == CANCELLED:
            try:
                cancelled = msgspec.json.decode(request.params, type=_Cancelled)
            except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
                return False
            session.cancel(cancelled.request_id)
            return True
        return take(session, request)
