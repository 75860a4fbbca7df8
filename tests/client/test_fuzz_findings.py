"""What fuzzing found in the client's parsers of untrusted bytes: the HTTP
bridge (``memorizzctl mcp serve --transport streamable-http``) reading a
request. Each request here is answered (an HTTP status), not dropped by an
exception out of the handler (an Origin or a request target urllib cannot
split raised ValueError; a body nested 5000 deep, RecursionError).
"""

from __future__ import annotations

import contextlib
import io
import socket
from typing import Any

import pytest

from memorizz.ctl import serve_http

TOKEN = b"tok"
HEAD = b"Host: 127.0.0.1:8765\r\nAuthorization: Bearer tok\r\n"
DEEP = b"[" * 5000 + b"]" * 5000


class _Server:
    """What the handler needs of its server: no session, no daemon."""

    listen = serve_http.Listen("127.0.0.1:8765", allow_remote=False)
    token = TOKEN

    class sessions:  # stands for an instance
        @staticmethod
        def get(session_id: str) -> None:
            return None

        @staticmethod
        def end(session_id: str) -> bool:
            return False

    class sessionless:  # stands for an instance
        @staticmethod
        def ask(*args: Any) -> bytes:
            raise serve_http.FaceUnreachableError("no daemon here")


def _served(request: bytes) -> bytes:
    """The handler's answer to ``request``; an exception out of it is raised."""
    ours, theirs = socket.socketpair()
    with ours, theirs:
        ours.sendall(request)
        ours.shutdown(socket.SHUT_WR)
        with contextlib.redirect_stderr(io.StringIO()):
            serve_http._Handler(theirs, ("127.0.0.1", 1), _Server)  # type: ignore[arg-type]
        theirs.close()
        ours.settimeout(5)
        answer = b""
        while chunk := ours.recv(1 << 16):
            answer += chunk
        return answer


def _post(body: bytes) -> bytes:
    return (
        b"POST /mcp HTTP/1.1\r\n"
        + HEAD
        + b"Content-Type: application/json\r\n"
        + b"Content-Length: %d\r\n\r\n" % len(body)
        + body
    )


def test_the_harness_answers_a_plain_request() -> None:
    deleted = b"DELETE /mcp HTTP/1.1\r\n" + HEAD + b"Mcp-Session-Id: x\r\n\r\n"
    assert _served(deleted).startswith(b"HTTP/1.1 404 ")
    assert _served(_post(b"[1")).startswith(b"HTTP/1.1 400 ")


def test_an_origin_urllib_cannot_split_is_refused() -> None:
    answer = _served(b"GET /mcp HTTP/1.1\r\n" + HEAD + b"Origin: http://[::1\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 403 ")


def test_a_request_target_urllib_cannot_split_is_refused() -> None:
    answer = _served(b"GET http://[x/mcp HTTP/1.1\r\n" + HEAD + b"\r\n")
    assert answer.startswith(b"HTTP/1.1 404 ")


@pytest.mark.parametrize(
    "body",
    [
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":' + DEEP + b"}",
        b'{"x":' + DEEP + b"}",
    ],
)
def test_a_body_nested_too_deeply_is_a_parse_error(body: bytes) -> None:
    assert _served(_post(body)).startswith(b"HTTP/1.1 400 ")
