"""The socket protocol itself: framing, bad input, errors, the schema contract."""

from __future__ import annotations

import socket
from typing import Any

import anyio
import msgspec
import pytest

from memorizz import Client
from memorizz.api import errors
from memorizz.api.errors import ErrorCode, InvalidParamsError, UnsupportedProtocolError
from memorizz.api.methods import METHODS, ServerSpec
from memorizz.api.protocol import MAX_FRAME, PROTOCOL_VERSION
from memorizz.api.schema import SCHEMA_PATH, generate
from memorizzd.caller import Caller
from memorizzd.rpc.dispatch import Dispatcher
from tests.harness import DaemonHarness


class Line:
    """A raw NDJSON conversation on one connection, as socat would have it."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect(path)
        self.sock.settimeout(10)
        self.buffer = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def reply(self) -> dict[str, Any]:
        while b"\n" not in self.buffer:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        decoded: dict[str, Any] = msgspec.json.decode(line)
        return decoded

    def call(
        self, method: str, params: object = None, request_id: object = 1
    ) -> dict[str, Any]:
        body: dict[str, object] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            body["params"] = params
        self.send(msgspec.json.encode(body) + b"\n")
        return self.reply()

    def close(self) -> None:
        self.sock.close()


@pytest.mark.parametrize(
    ("frame", "code", "reason"),
    [
        (b"this is not json", ErrorCode.PARSE_ERROR, "parse_error"),
        (
            b'{"jsonrpc": "2.0", "id": 1, "method": ',
            ErrorCode.PARSE_ERROR,
            "parse_error",
        ),
        (b"\xff\xfe\x00garbage", ErrorCode.PARSE_ERROR, "parse_error"),
        (b"[" * 100_000, ErrorCode.INVALID_REQUEST, "invalid_request"),
        (b'{"a":' * 100_000, ErrorCode.PARSE_ERROR, "parse_error"),
        (b"{}", ErrorCode.INVALID_REQUEST, "invalid_request"),
        (b"[]", ErrorCode.INVALID_REQUEST, "invalid_request"),
        (
            b'{"jsonrpc": "1.0", "id": 1, "method": "ping"}',
            ErrorCode.INVALID_REQUEST,
            "invalid_request",
        ),
        (
            b'{"jsonrpc": "2.0", "id": 1.5, "method": "ping"}',
            ErrorCode.INVALID_REQUEST,
            "invalid_request",
        ),
        (
            b'{"jsonrpc": "2.0", "id": 1, "method": "nope"}',
            ErrorCode.METHOD_NOT_FOUND,
            "method_not_found",
        ),
        (
            b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"server": 1}}',
            ErrorCode.INVALID_PARAMS,
            "invalid_params",
        ),
        (
            b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": [1]}',
            ErrorCode.INVALID_PARAMS,
            "invalid_params",
        ),
        (
            b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"server": "t"}}',
            ErrorCode.INVALID_PARAMS,
            "invalid_params",
        ),
        (
            b'{"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"server": "t", "x": 1'
            + b"9" * 5000
            + b"}}",
            ErrorCode.NOT_FOUND,
            "unknown_server",
        ),
    ],
)
def test_bad_frames_get_an_error_and_the_connection_survives(
    daemon: DaemonHarness, frame: bytes, code: int, reason: str
) -> None:
    line = Line(daemon.socket)
    try:
        line.send(frame + b"\n")
        reply = line.reply()
        assert reply["jsonrpc"] == "2.0"
        assert reply["error"]["code"] == code, reply
        assert reply["error"]["data"]["reason"] == reason
        assert "result" not in reply
        pong = line.call("ping", request_id=8)
        assert pong["id"] == 8
        assert "result" in pong
    finally:
        line.close()


def test_an_invalid_request_with_a_readable_id_is_answered_by_that_id(
    daemon: DaemonHarness,
) -> None:
    line = Line(daemon.socket)
    reply = line.call("tools/call", {"server": 5}, request_id="abc")
    assert reply["id"] == "abc"
    line.send(b'{"jsonrpc": "2.0", "id": 42}\n')
    assert line.reply()["id"] == 42
    line.close()


def test_notifications_are_never_answered(daemon: DaemonHarness) -> None:
    line = Line(daemon.socket)
    line.send(b'{"jsonrpc": "2.0", "method": "ping"}\n')
    line.send(b'{"jsonrpc": "2.0", "method": "no/such/method"}\n')
    assert line.call("ping", request_id=3)["id"] == 3  # the first reply is ours
    line.close()


def test_an_oversize_frame_closes_only_that_connection(daemon: DaemonHarness) -> None:
    other = Line(daemon.socket)
    line = Line(daemon.socket)
    line.send(b'{"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"pad": "')
    for _ in range(MAX_FRAME // 65536 + 4):  # read out, not refused
        line.send(b"x" * 65536)
    line.send(b'"}}\n')
    assert line.reply()["error"]["data"]["reason"] == "frame_too_large"
    with pytest.raises((EOFError, BrokenPipeError)):  # noqa: PT012 - closed: either
        line.send(b"more\n")
        line.reply()
    line.close()
    assert other.call("ping", request_id=2)["id"] == 2
    other.close()


@pytest.mark.parametrize("over", [10, 4 << 20])
def test_the_oversize_error_is_sent_before_the_close(
    daemon: DaemonHarness, over: int
) -> None:
    """A client that sends its whole line before it reads (``over`` bytes
    past the limit) reads why, then the end: the daemon reads out the rest
    of the line before it closes (closed with it unread, the client's send
    failed: a broken pipe or a reset, the reason never read)."""
    line = Line(daemon.socket)
    line.send(b"x" * (MAX_FRAME + over))
    reply = line.reply()
    assert reply["error"]["data"]["reason"] == "frame_too_large"
    assert reply["id"] is None
    line.close()


def test_hello_checks_the_protocol_version(daemon: DaemonHarness) -> None:
    with Client(daemon.socket) as c:
        hello = c.hello()
        assert hello.protocol_version == PROTOCOL_VERSION
    line = Line(daemon.socket)
    reply = line.call("daemon/hello", {"protocol_version": PROTOCOL_VERSION + 1})
    assert reply["error"]["data"] == {
        "reason": "unsupported_protocol",
        "supported": [1],
    }
    line.close()
    err = errors.from_wire(errors.UnsupportedProtocolError("x").to_wire())
    assert isinstance(err, UnsupportedProtocolError)


def test_servers_add_validates_its_input(daemon: DaemonHarness) -> None:
    with Client(daemon.socket) as c:
        for spec in (
            ServerSpec(name="bad name!", transport="stdio", command="x"),
            ServerSpec(name="nocmd", transport="stdio"),
            ServerSpec(name="nourl", transport="sse"),
            ServerSpec(name="t0", transport="stdio", command="x", timeout_s=0),
        ):
            with pytest.raises(InvalidParamsError) as err:
                c.add_server(spec)
            assert err.value.reason == "invalid_params"
        assert c.list_servers() == []


def test_an_internal_error_never_leaks_its_text() -> None:
    secret = "sk-live-SECRET-marker-123"  # noqa: S105 - a marker, not a password

    async def broken(caller: Caller, params: object) -> Any:
        raise KeyError(secret)

    dispatcher = Dispatcher(dict.fromkeys(METHODS, broken))
    caller = Caller(pid=1, uid=0, gid=0, socket="/test", role="operator")
    request = dispatcher.parse(b'{"jsonrpc":"2.0","id":1,"method":"ping","params":{}}')
    assert not isinstance(request, bytes)
    reply = anyio.run(dispatcher.run, caller, request)
    assert secret.encode() not in reply
    decoded = msgspec.json.decode(reply)
    assert decoded["error"] == {
        "code": ErrorCode.INTERNAL_ERROR,
        "message": "internal error",
        "data": {"reason": "internal"},
    }


def test_every_error_class_round_trips_with_its_code_and_reason() -> None:
    for cls in errors.RemoteError.__subclasses__():
        original = cls("message", data={"k": 1})
        back = errors.from_wire(original.to_wire())
        assert type(back) is cls
        assert (back.code, back.reason, back.data) == (
            original.code,
            original.reason,
            {"k": 1},
        )
    unknown = errors.from_wire(
        errors.ErrorObject(code=-32099, message="m", data={"reason": "r"})
    )
    assert type(unknown) is errors.RemoteError
    assert (unknown.code, unknown.reason) == (-32099, "r")


def test_the_committed_schema_matches_the_code() -> None:
    assert SCHEMA_PATH.read_bytes() == generate(), (
        "the wire contract changed: run `make schema` and commit "
        f"{SCHEMA_PATH.relative_to(SCHEMA_PATH.parents[3])}"
    )


def test_every_documented_reason_is_known() -> None:
    assert {
        cls.default_reason for cls in errors.RemoteError.__subclasses__()
    } <= errors.REASONS
