"""A Streamable HTTP session that the server no longer knows.

A server that restarted, or expired an idle session, answers HTTP 404 to any
request that carries the old ``Mcp-Session-Id``; the MCP transport spec says
the client must then start a new session, and the request was not run. The
SDK turns that 404 into a JSON-RPC error for the request, but which one
depends on the server's body: the Python SDK's ``-32600 "Session not
found"``, the TypeScript SDK's ``-32001`` (the SDK's own code for a timeout),
or ``-32600 "Session terminated"`` when there is no JSON body. Nothing in it
says "404" reliably.

``expired_answers`` sits in the hardened client's transport stack and
replaces the body of such a 404 with one JSON-RPC error that carries
``SESSION_EXPIRED`` as its data, so the session layer can tell a lost session
(reconnect, and send the request again on the new session: it was not run)
from a server's error, whatever the server wrote.
"""

from __future__ import annotations

from typing import Final

import httpx2
import msgspec

SESSION_EXPIRED: Final = "memorizzd:session_expired"
"""The ``data`` of the JSON-RPC error that stands for such a 404."""

_SESSION_HEADER: Final = "mcp-session-id"
_BODY: Final = msgspec.json.encode(
    {
        "jsonrpc": "2.0",
        "id": None,
        "error": {
            "code": -32600,
            "message": "Session expired",
            "data": SESSION_EXPIRED,
        },
    }
)


def expired_answers(inner: httpx2.AsyncBaseTransport) -> httpx2.AsyncBaseTransport:
    """``inner``, with a 404 to a request in a session rewritten (see above)."""
    return _ExpiredAnswers(inner)


class _ExpiredAnswers(httpx2.AsyncBaseTransport):
    def __init__(self, inner: httpx2.AsyncBaseTransport) -> None:
        self._inner = inner

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self._inner.handle_async_request(request)
        if response.status_code != 404 or _SESSION_HEADER not in request.headers:
            return response
        await response.aclose()  # what the server wrote is not read
        return httpx2.Response(
            status_code=404,
            headers={"content-type": "application/json"},
            content=_BODY,
            request=request,
        )

    async def aclose(self) -> None:
        await self._inner.aclose()
