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
_encoder: Final = msgspec.json.Encoder()


class _Refusal(msgspec.Struct):
    token: str
    error: ErrorObject


class _Request(msgspec.Struct):
    method: str
    id: int | str


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
            if busy is None or _jsonrpc_request_id(request) is None:
                return response
            await response.aclose()
            raise busy
        except RemoteError as exc:
            request_id = _jsonrpc_request_id(request)
            if request_id is None:
                raise
            return httpx2.Response(
                200,
                headers={"content-type": "application/json"},
                content=refusal_reply(request_id, exc),
                request=request,
            )

    async def aclose(self) -> None:
        await self._inner.aclose()


def _jsonrpc_request_id(request: httpx2.Request) -> int | str | None:
    if request.method != "POST":
        return None
    try:
        return msgspec.json.decode(request.content, type=_Request).id
    except (
        msgspec.DecodeError,
        msgspec.ValidationError,
        RecursionError,
        httpx2.RequestNotRead,
    ):
        return None
