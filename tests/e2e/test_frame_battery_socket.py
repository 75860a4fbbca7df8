"""Malformed frames at the socket API, the way an outside battery sends them.

A real ``memorizzd`` (``tests/process.py``) with a light stdio server ``t``
and one agent profile ``ag``; each case is one connection, written whole or in
pieces, half-closed after its last byte (the replies must still come), and
read until the daemon closes. Every frame gets the error its reason table
names (docs/protocol.md, "Errors") under the id it can still read, the
connection serves on, and the daemon's log holds no traceback nor error line.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest

from memorizz.api.protocol import MAX_FRAME
from tests import wire
from tests.harness import LEGACY_SERVER, configured_daemon, no_errors_logged
from tests.peers import ME
from tests.process import DaemonProcess

READ_S = 10.0
PING = b'{"jsonrpc":"2.0","id":"after","method":"ping"}'


@pytest.fixture(scope="module")
def daemon() -> Iterator[DaemonProcess]:
    def config(base: str) -> str:
        return f"""
agents_dir = "{base}/agents"

[[servers]]
name = "t"
transport = "stdio"
command = "{sys.executable}"
args = ["{LEGACY_SERVER}"]

[[profiles]]
name = "ag"
servers = ["t"]
uids = [{ME}]
"""

    with configured_daemon("mz-fbs-", config, ready=("t",)) as process:
        yield process


@pytest.fixture(params=["operator", "agent"])
def path(request: pytest.FixtureRequest, daemon: DaemonProcess) -> str:
    if request.param == "operator":
        return daemon.socket
    return os.path.join(daemon.base, "agents", "ag", "api.sock")


@pytest.fixture(autouse=True)
def clean_log(daemon: DaemonProcess) -> Iterator[None]:
    """No traceback and no error line in the daemon's log from this case."""
    with no_errors_logged(daemon):
        yield


def exchange(path: str, *pieces: bytes) -> list[dict[str, Any]]:
    """Write ``pieces`` one by one, half-close, and decode every reply line
    until the daemon closes the connection. The replies are read while the
    pieces are written (the daemon stops reading a client that does not
    read: that is its push-back)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(READ_S)
        sock.connect(path)
        received = wire.exchange(sock, *pieces)
    assert not received or received.endswith(b"\n"), received[-200:]
    return [msgspec.json.decode(line) for line in received.splitlines()]


def reason(reply: dict[str, Any]) -> str:
    found: str = reply["error"]["data"]["reason"]
    return found


@pytest.mark.parametrize(
    ("line", "request_id", "code", "why"),
    [
        (b'{"jsonrpc":"2.0","id":1,"method":"ping"', None, -32700, "parse_error"),
        (b"\xff\xfe", None, -32700, "parse_error"),
        (b"\x00", None, -32700, "parse_error"),
        (b"NaN", None, -32700, "parse_error"),
        (b'\xef\xbb\xbf{"jsonrpc":"2.0","id":2,"method":"ping"}', None, -32700, "parse_error"),
        (b'{"jsonrpc":"2.0","id":"\xff","method":"ping"}', None, -32700, "parse_error"),
        (b'{"jsonrpc":"2.0","id":"\\ud800","method":"ping"}', None, -32700, "parse_error"),
        (
            (b'{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"server":"t",'
            b'"name":"hello","arguments":{"s":"\\udc00"}}}'),
            3, -32700, "parse_error",
        ),
        (b"[]", None, -32600, "invalid_request"),
        (b'[{"jsonrpc":"2.0","id":4,"method":"ping"}]', None, -32600, "invalid_request"),
        (b'"ping"', None, -32600, "invalid_request"),
        (b'{"jsonrpc":"2.0","id":null,"method":"ping"}', None, -32600, "invalid_request"),
        (b'{"jsonrpc":"2.0","id":1.5,"method":"ping"}', None, -32600, "invalid_request"),
        (b'{"jsonrpc":"2.0","id":true,"method":"ping"}', None, -32600, "invalid_request"),
        (b'{"jsonrpc":"2.0","id":{},"method":"ping"}', None, -32600, "invalid_request"),
        (b'{"jsonrpc":"1.0","id":5,"method":"ping"}', 5, -32600, "invalid_request"),
        (b'{"jsonrpc":"2.0","id":6,"method":7}', 6, -32600, "invalid_request"),
        (b'{"jsonrpc":"2.0","id":7,"method":"ping","params":[]}', 7, -32602, "invalid_params"),
        (b'{"jsonrpc":"2.0","id":8,"method":"ping","params":null}', 8, -32602, "invalid_params"),
        (b'{"jsonrpc":"2.0","id":9,"method":"ping\\u0000"}', 9, -32601, "method_not_found"),
        (
            (b'{"jsonrpc":"2.0","id":10,"method":"tools/call","params":{"server":"t",'
            b'"name":"hello","progress_token":{"a":1}}}'),
            10, -32602, "invalid_params",
        ),
        (
            (b'{"jsonrpc":"2.0","id":11,"method":"tools/call","params":{"server":"t",'
            b'"name":"hello","_meta":[]}}'),
            11, -32602, "invalid_params",
        ),
        (
            (b'{"jsonrpc":"2.0","id":12,"method":"tools/call","params":{"server":"t",'
            b'"name":"hello","task":{"ttl":-1}}}'),
            12, -32602, "invalid_params",
        ),
        (b'{"jsonrpc":"2.0","id":13,"method":"tasks/get","params":{"task_id":5}}', 13, -32602, "invalid_params"),
        (
            (b'{"jsonrpc":"2.0","id":14,"method":"tasks/cancel",'
            b'"params":{"task_id":"t_000000000000000000000000"}}'),
            14, -32602, "invalid_params",
        ),
        (
            (b'{"jsonrpc":"2.0","id":15,"method":"prompts/get","params":{"server":"t",'
            b'"name":"p","arguments":{"a":5}}}'),
            15, -32602, "invalid_params",
        ),
        (
            (b'{"jsonrpc":"2.0","id":16,"method":"completion/complete","params":'
            b'{"server":"t","ref":{"type":"ref/nope"},"argument":{"name":"a","value":"b"}}}'),
            16, -32602, "invalid_params",
        ),
        (
            (b'{"jsonrpc":"2.0","id":17,"method":"resources/subscribe",'
            b'"params":{"server":"t","uri":5}}'),
            17, -32602, "invalid_params",
        ),
    ],
)  # fmt: skip
def test_a_malformed_frame_gets_its_error_and_the_connection_serves_on(
    path: str, line: bytes, request_id: object, code: int, why: str
) -> None:
    first, after = exchange(path, line + b"\n" + PING + b"\n")
    assert (first["id"], first["error"]["code"], reason(first)) == (
        request_id,
        code,
        why,
    ), first
    assert "Traceback" not in first["error"]["message"]
    assert after == {"jsonrpc": "2.0", "id": "after", "result": after["result"]}


@pytest.mark.parametrize(
    "params",
    [
        b'{"server":"t","name":"p","arguments":{"a":"\xff"}}',
        b'{"server":"\xc3","name":"p"}',
    ],
    ids=["in-arguments", "in-server"],
)
def test_invalid_utf8_in_params_is_said_as_such(path: str, params: bytes) -> None:
    """Bytes the line's decoder lets through into ``params`` were refused
    as "params must be a JSON object": they are, and the error says what
    is wrong with them."""
    line = b'{"jsonrpc":"2.0","id":1,"method":"prompts/get","params":' + params + b"}"
    (reply,) = exchange(path, line + b"\n")
    assert (reply["id"], reason(reply)) == (1, "invalid_params"), reply
    assert "UTF-8" in reply["error"]["message"], reply


@pytest.mark.parametrize(
    "response",
    [
        # the daemon's own reply to a line it could not read, sent back to it
        (
            b'{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"parse error:'
            b' the line is not valid UTF-8 JSON","data":{"reason":"parse_error"}}}'
        ),
        b'{"jsonrpc":"2.0","id":null,"result":{}}',
        b'{"jsonrpc":"2.0","error":{"code":-32600,"message":"x"}}',
        b'{"jsonrpc":"2.0","id":41,"result":{}}',
        b'{"jsonrpc":"2.0","id":"nobody-asked","error":{"code":1,"message":"x"}}',
    ],
    ids=[
        "own-error-echoed",
        "null-id-result",
        "no-id-error",
        "unasked",
        "unasked-error",
    ],
)
def test_a_response_is_never_answered(path: str, response: bytes) -> None:
    """A response line gets no reply, whatever its id: answering a null-id
    error with one (as the daemon did) loops forever between two peers that
    each answer the other's error."""
    replies = exchange(path, response + b"\n" + PING + b"\n")
    assert [r["id"] for r in replies] == ["after"], replies


def test_a_request_split_at_every_byte_is_answered_once(path: str) -> None:
    line = '{"jsonrpc":"2.0","id":"é😀","method":"ping","params":{"x":"€"}}\n'.encode()
    for cut in range(1, len(line)):
        (reply,) = exchange(path, line[:cut], line[cut:])
        assert (reply["id"], "result" in reply) == ("é😀", True), (cut, reply)


def test_a_request_written_a_byte_at_a_time_is_answered(path: str) -> None:
    line = PING + b"\n"
    (reply,) = exchange(path, *(line[i : i + 1] for i in range(len(line))))
    assert reply["id"] == "after"
    assert "result" in reply


def test_frames_at_and_over_the_limit(path: str) -> None:
    """A line of exactly ``MAX_FRAME`` bytes is read; one more byte is
    ``frame_too_large`` (id null) and the connection is closed, the requests
    before it answered."""
    head = b'{"jsonrpc":"2.0","id":"big","method":"ping","params":{"x":"'
    tail = b'"}}'
    exact = head + b"a" * (MAX_FRAME - len(head) - len(tail)) + tail
    assert len(exact) == MAX_FRAME
    (reply,) = exchange(path, exact + b"\n")
    assert reply["id"] == "big"
    assert "result" in reply
    over = head + b"a" * (MAX_FRAME + 1 - len(head) - len(tail)) + tail
    replies = exchange(path, PING + b"\n" + over + b"\n" + PING + b"\n")
    assert [r["id"] for r in replies] == ["after", None], replies
    assert reason(replies[1]) == "frame_too_large"


def test_the_daemon_serves_others_while_a_client_floods_garbage(
    daemon: DaemonProcess, path: str
) -> None:
    """Garbage from one client, on its own connection, does not slow the
    control client's pings on another."""
    garbage = b"".join(
        [b"\xff" * 1000 + b"\n", b"[" * 5000 + b"\n", b'{"jsonrpc":"2.0"}\n'] * 300
    )
    done = threading.Event()
    failures: list[BaseException] = []

    def flood() -> None:
        try:
            replies = exchange(path, garbage)
            assert len(replies) == 900, len(replies)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            failures.append(exc)
        finally:
            done.set()

    worker = threading.Thread(target=flood, daemon=True)
    worker.start()
    with daemon.client() as c:
        while not done.is_set():
            c.ping()
    worker.join(READ_S)
    assert not failures, failures


def _pinged(count: int) -> list[bytes]:
    """``count`` pings whose replies are about 1 KiB each (a long id)."""
    return [
        b'{"jsonrpc":"2.0","id":"%s-%d","method":"ping"}' % (b"x" * 1000, n)
        for n in range(count)
    ]


def _written_until_stalled(sock: socket.socket, lines: list[bytes]) -> int:
    """Write ``lines`` from a thread, reading nothing; the number of lines
    written when no more were taken for a second (all: never stalled)."""
    written = [0]

    def write() -> None:
        with contextlib.suppress(OSError):
            for line in lines:
                sock.sendall(line + b"\n")
                written[0] += 1
            sock.shutdown(socket.SHUT_WR)

    threading.Thread(target=write, daemon=True).start()
    pause, still, seen = threading.Event(), 0, -1
    while still < 10 and written[0] < len(lines):
        pause.wait(0.1)
        still, seen = (still + 1, seen) if written[0] == seen else (0, written[0])
    return written[0]


def test_a_client_that_reads_nothing_is_stalled_at_its_in_flight_limit(
    path: str,
) -> None:
    """docs/protocol.md, Framing: a request counts in flight until its reply
    is written to the socket, so a client that writes and never reads stops
    being read once the socket's buffer is full and 64 requests wait behind
    it: long before 8 MiB of replies. Not an error: once it reads, every
    request is answered."""
    lines = _pinged(8 << 10)  # 8 MiB of replies, were they all taken
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(READ_S)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 16)
        sock.connect(path)
        stalled_at = _written_until_stalled(sock, lines)
        assert stalled_at < len(lines) // 4, stalled_at
        received = b""
        while chunk := sock.recv(1 << 16):
            received += chunk
    replies = [msgspec.json.decode(line) for line in received.splitlines()]
    assert len(replies) == len(lines)
    assert all("result" in reply for reply in replies)


CUT_S = 1.0


@pytest.fixture(scope="module")
def impatient() -> Iterator[str]:
    """A daemon with no server whose agent socket has ``write_timeout_s`` 1."""

    def config(base: str) -> str:
        return f"""
agents_dir = "{base}/agents"

[[profiles]]
name = "cut"
uids = [{ME}]
limits = {{ write_timeout_s = {CUT_S} }}
"""

    with configured_daemon("mz-fbc-", config) as process:
        yield os.path.join(process.base, "agents", "cut", "api.sock")


def test_replies_left_unread_for_write_timeout_s_cut_the_connection(
    impatient: str,
) -> None:
    """docs/protocol.md, Framing: replies the socket could not take, waiting
    ``write_timeout_s`` (checked every quarter of it) for the client to read,
    close the connection; what was waiting is dropped."""
    lines = _pinged(8 << 10)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(READ_S)
        sock.connect(impatient)
        stalled_at = _written_until_stalled(sock, lines)  # a second, reading nothing
        assert stalled_at < len(lines), stalled_at
        threading.Event().wait(CUT_S * 1.5)
        received = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(1 << 16):
                received += chunk
    answered = received.rpartition(b"\n")[0].splitlines()  # a cut may halve one
    assert len(answered) < stalled_at, (len(answered), stalled_at)
    assert all("result" in msgspec.json.decode(line) for line in answered)
