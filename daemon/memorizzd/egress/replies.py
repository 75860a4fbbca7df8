"""An egress refusal fails the one MCP request it stopped, not the session.

An exception raised inside an httpx transport tears the SDK's whole
connection down. So when the hardened client refuses a JSON-RPC request (a
connection to a denied address, a redirect, a compressed body),
``RefusalReplies`` answers it in the upstream's place with a JSON-RPC error
for the same id that carries the refusal: the wire error (code, message,
``data.reason``) under a per-process token an upstream cannot know.
``refusal_in`` recognises such an error and rebuilds the exception, so the
caller gets ``permission_denied``/``redirect_blocked`` where the SDK would
have said "connection closed". Requests that are not JSON-RPC requests
(the SSE stream GET, DELETE, notifications, our replies to the server)
get the exception itself. A 429/503 answer to a JSON-RPC request is answered
the same way, with ``upstream_busy`` and its ``Retry-After`` (``busy.py``).

Which request a POST carries is read once (``request_id_of``): this transport
and the size caps around it (``limits.py``) share the one reading.
"""

from __future__ import annotations

import secrets
from typing import Any, Final

import httpx2
import msgspec

from memorizz.api.errors import RemoteError, from_wire
from memorizz.api.protocol import ErrorObject
from memorizzd.egress.busy import busy_error

REFUSAL_KEY: Final = "memorizz.refusal"
_TOKEN: Final = secrets.token_hex(16)
_ID_KEY: Final = "memorizz.request_id"
"""Where ``request_id_of`` keeps what it read, in the request's extensions."""
_encoder: Final = msgspec.json.Encoder()


class _Refusal(msgspec.Struct):
    token: str
    error: ErrorObject


class Head(msgspec.Struct):
    """The two members that say which JSON-RPC message a body is: a request
    or a notification has a ``method``, a request or an answer an ``id``.
    Everything else is skipped, never built."""

    method: str | None = None
    id: int | str | None = None


_decode_head: Final = msgspec.json.Decoder(Head).decode


def head_of(body: bytes) -> Head | None:
    """The head of the one JSON-RPC message ``body`` is, or None: not JSON,
    not an object (a batch), nested too deeply, a ``method`` that is not a
    string, an ``id`` that is neither an integer nor a string."""
    try:
        return _decode_head(body)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return None


def request_id_of(request: httpx2.Request) -> int | str | None:
    """The id of the JSON-RPC request a POST carries (the answer, a JSON body
    or an event stream, is its answer), or None: another method, a
    notification, a batch, our reply to a server's request, a body that is no
    JSON-RPC request. Read once per request, then kept in its extensions."""
    if request.method != "POST":
        return None
    if _ID_KEY in request.extensions:
        kept: int | str | None = request.extensions[_ID_KEY]
        return kept
    try:
        head = head_of(request.content)
    except httpx2.RequestNotRead:
        return None
    found = head.id if head is not None and head.method is not None else None
    request.extensions[_ID_KEY] = found
    return found


def refusal_reply(request_id: int | str, exc: RemoteError) -> bytes:
    """A JSON-RPC error reply to ``request_id`` carrying ``exc``."""
    return _encoder.encode(
        {
            "jsonrpc": "2.0",
            "id": request_id,
            "error": {
                "code": int(exc.code),
                "message": exc.message,
                "data": {REFUSAL_KEY: _Refusal(_TOKEN, exc.to_wire())},
            },
        }
    )


def refusal_in(data: Any) -> RemoteError | None:
    """The refusal a synthesized reply's ``error.data`` carries, if it is ours."""
    if not isinstance(data, dict) or REFUSAL_KEY not in data:
        return None
    try:
        refusal = msgspec.convert(data[REFUSAL_KEY], _Refusal)
    except msgspec.ValidationError:
        return None
    if not secrets.compare_digest(refusal.token, _TOKEN):
        return None
    return from_wire(refusal.error)


class RefusalReplies(httpx2.AsyncBaseTransport):
    def __init__(self, inner: httpx2.AsyncBaseTransport) -> None:
        self._inner = inner

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        try:
            response = await self._inner.handle_async_request(request)
            busy = busy_error(response)  # 429/503: this request's answer (busy.py)
            if busy is None or request_id_of(request) is None:
                return response
            await response.aclose()
            raise busy
        except RemoteError as exc:
            answered = request_id_of(request)
            if answered is None:
                raise
            return httpx2.Response(
                200,
                headers={"content-type": "application/json"},
                content=refusal_reply(answered, exc),
                request=request,
            )

    async def aclose(self) -> None:
        await self._inner.aclose()
