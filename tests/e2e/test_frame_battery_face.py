"""Malformed frames at the MCP face (``mcp.sock``), both eras.

A real ``memorizzd`` (``tests/process.py``) with the light stdio server ``t``
and ``feat`` (tests/features_server.py: completions, subscriptions), on the
operator's face and on an agent profile's. Each case is one session, written
whole and half-closed (the replies must still come), read until the daemon
closes it: every malformed request gets a precise JSON-RPC error under its
id, a response is never answered, the session serves on, and the daemon's log
holds no traceback nor error line.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest

from tests import wire
from tests.harness import (
    FEATURES_SERVER,
    LEGACY_SERVER,
    configured_daemon,
    no_errors_logged,
)
from tests.peers import ME
from tests.process import DaemonProcess

READ_S = 10.0
INIT = msgspec.json.encode(
    {
        "jsonrpc": "2.0",
        "id": "init",
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "battery", "version": "0"},
        },
    }
)
MODERN = {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}
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

[[servers]]
name = "feat"
transport = "stdio"
protocol = "legacy"
command = "{sys.executable}"
args = ["{FEATURES_SERVER}", "stdio"]

[[profiles]]
name = "ag"
servers = ["t", "feat"]
uids = [{ME}]
"""

    with configured_daemon("mz-fbf-", config, ready=("t", "feat")) as process:
        yield process


@pytest.fixture(params=["operator", "agent"])
def face(request: pytest.FixtureRequest, daemon: DaemonProcess) -> str:
    if request.param == "operator":
        return os.path.join(daemon.base, "mcp.sock")
    return os.path.join(daemon.base, "agents", "ag", "mcp.sock")


@pytest.fixture(autouse=True)
def clean_log(daemon: DaemonProcess) -> Iterator[None]:
    """No traceback and no error line in the daemon's log from this case."""
    with no_errors_logged(daemon):
        yield


def session(path: str, *lines: bytes) -> list[dict[str, Any]]:
    """``lines`` on one face session, half-closed; every line it answers
    (notifications skipped), read while the lines are written."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(READ_S)
        sock.connect(path)
        whole = b"".join(line + b"\n" for line in lines)
        received = wire.exchange(sock, whole, reset_is_close=False)
    decoded = [msgspec.json.decode(line) for line in received.splitlines()]
    return [m for m in decoded if "method" not in m]


def request(request_id: object, method: str, params: object) -> bytes:
    message = {"jsonrpc": "2.0", "id": request_id, "method": method}
    return msgspec.json.encode({**message, "params": params})


def answer(replies: list[dict[str, Any]], request_id: object) -> dict[str, Any]:
    (found,) = [r for r in replies if r.get("id") == request_id]
    return found


def error_of(reply: dict[str, Any]) -> tuple[int, str]:
    return reply["error"]["code"], reply["error"]["data"]["reason"]


def _invalid_params_and_served_on(face: str, method: str, params: object) -> None:
    """``method`` with ``params`` is answered ``-32602`` under its id, and the
    session serves on."""
    replies = session(face, INIT, request(7, method, params), PING)
    assert error_of(answer(replies, 7)) == (-32602, "invalid_params"), replies
    assert "result" in answer(replies, "after")


COMPLETE_REF = {"type": "ref/prompt", "name": "feat__pick"}


@pytest.mark.parametrize(
    ("method", "params"),
    [
        ("completion/complete", {"ref": COMPLETE_REF, "argument": "x"}),
        ("completion/complete", {"ref": COMPLETE_REF}),
        ("completion/complete", {"ref": COMPLETE_REF, "argument": {"name": 5, "value": "r"}}),
        (
            "completion/complete",
            {"ref": COMPLETE_REF, "argument": {"name": "color", "value": "r"}, "context": {"arguments": "x"}},
        ),
        (
            "completion/complete",
            {"ref": COMPLETE_REF, "argument": {"name": "color", "value": "r"}, "context": {"arguments": {"a": 1}}},
        ),
        ("completion/complete", {"ref": "x", "argument": {"name": "color", "value": "r"}}),
        ("completion/complete", {"ref": {"type": 5}, "argument": {"name": "c", "value": "r"}}),
        ("completion/complete", {"ref": {"type": "ref/tool", "name": "x"}, "argument": {"name": "c", "value": "r"}}),
        ("logging/setLevel", {"level": "loud"}),
        ("logging/setLevel", {"level": "DEBUG"}),
        ("logging/setLevel", {"level": 7}),
        ("logging/setLevel", {}),
        ("tasks/get", {"taskId": "t_000000000000000000000000"}),
        ("tasks/get", {"taskId": 5}),
        ("tasks/result", {"taskId": "../../etc"}),
        ("tasks/cancel", {}),
        ("tools/call", {"name": "t__hello", "arguments": [1]}),
        ("tools/call", {"name": "t__hello", "_meta": []}),
        ("tools/call", {"name": "t__hello", "_meta": {"progressToken": 1.5}}),
        ("tools/call", {"name": "t__hello", "_meta": {"progressToken": True}}),
        ("tools/call", {"name": "t__hello", "_meta": {"progressToken": {"a": 1}}}),
        ("tools/call", {"name": "t__hello", "task": 5}),
        ("tools/call", {"name": 5}),
        ("resources/read", {"uri": 5}),
        ("resources/subscribe", {}),
        ("prompts/get", {"name": "feat__pick", "arguments": {"color": 5}}),
        ("prompts/get", {"name": "feat__pick", "arguments": "red"}),
        ("initialize", {"protocolVersion": 5, "capabilities": {}, "clientInfo": {}}),
        ("initialize", []),
    ],
)  # fmt: skip
def test_params_of_the_wrong_type_are_invalid_params(
    face: str, method: str, params: object
) -> None:
    """Each is the client's error, ``-32602`` under its id: the face checks
    what it forwards (a completion's ``argument`` went on to the server
    unchecked, and came back as the server's ``upstream_error``)."""
    _invalid_params_and_served_on(face, method, params)


def test_a_wellformed_completion_still_goes_to_its_server(face: str) -> None:
    params = {
        "ref": COMPLETE_REF,
        "argument": {"name": "color", "value": "r"},
        "context": {"arguments": {}},
    }
    replies = session(face, INIT, request(7, "completion/complete", params))
    assert answer(replies, 7)["result"]["completion"]["values"] == ["red@prompt"]


@pytest.mark.parametrize(
    "response",
    [
        (
            b'{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"parse error:'
            b' the line is not valid UTF-8 JSON","data":{"reason":"parse_error"}}}'
        ),
        b'{"jsonrpc":"2.0","id":null,"result":{}}',
        b'{"jsonrpc":"2.0","error":{"code":-32600,"message":"x"}}',
        b'{"jsonrpc":"2.0","id":"never-asked","result":{}}',
    ],
    ids=["own-error-echoed", "null-id-result", "no-id-error", "unasked"],
)
@pytest.mark.parametrize("era", ["handshake", "modern"])
def test_a_response_is_never_answered(face: str, response: bytes, era: str) -> None:
    first = INIT if era == "handshake" else request("init", "server/discover", {})
    replies = session(face, first, response, PING)
    assert [r["id"] for r in replies] == ["init", "after"], replies


def test_requests_before_and_around_initialize_are_served(face: str) -> None:
    """Before ``initialize``, after one the face refused, and after a second:
    the session serves each request, and garbage between them changes nothing."""
    refused = request("bad-init", "initialize", {"protocolVersion": []})
    replies = session(
        face,
        request(1, "tools/list", {}),
        refused,
        request(2, "ping", {}),
        b"\xff\x00garbage",
        INIT,
        request("init-2", "initialize", {**msgspec.json.decode(INIT)["params"]}),
        request(3, "tools/list", {"_meta": {"progressToken": 1}}),
        request(4, "tools/list", {"_meta": 5}),
        PING,
    )
    assert error_of(answer(replies, "bad-init")) == (-32602, "invalid_params")
    assert [r["id"] for r in replies if r["id"] is None] == [None]  # the garbage
    for request_id in (1, 2, "init", "init-2", 3, 4, "after"):
        assert "result" in answer(replies, request_id), replies
    assert (
        answer(replies, 1)["result"]["tools"] == answer(replies, 3)["result"]["tools"]
    )


def test_modern_requests_with_odd_stamps_are_answered(face: str) -> None:
    replies = session(
        face,
        request(1, "server/discover", []),
        request(2, "tools/list", {"_meta": {**MODERN, "extra": [1]}}),
        request(3, "tools/call", {"name": "t__hello", "requestState": 5, "_meta": MODERN}),
        request(4, "tools/call", {"name": "t__hello", "inputResponses": "x", "_meta": MODERN}),
        request(5, "subscriptions/listen", {"notifications": 5, "_meta": MODERN}),
        request(6, "tools/call", {"name": "t__hello", "_meta": {**MODERN, "io.modelcontextprotocol/clientCapabilities": "x"}}),
    )  # fmt: skip
    assert answer(replies, 1)["result"]["supportedVersions"] == ["2026-07-28"]
    assert "result" in answer(replies, 2)
    for request_id in (3, 4, 5, 6):
        assert error_of(answer(replies, request_id)) == (-32602, "invalid_params")


def test_odd_ids_on_one_session(face: str) -> None:
    """A huge integer, an empty string, a negative id: echoed as they came; a
    float or an array is ``invalid_request`` under id null."""
    huge = 123456789012345678901234567890
    line = b'{"jsonrpc":"2.0","id":%d,"method":"ping"}' % huge
    replies = session(
        face,
        INIT,
        line,
        request("", "ping", {}),
        request(-1, "ping", {}),
        b'{"jsonrpc":"2.0","id":1.5,"method":"ping"}',
        b'{"jsonrpc":"2.0","id":[1],"method":"ping"}',
    )
    ids = sorted(repr(r["id"]) for r in replies)  # refusals come first
    assert ids == sorted(map(repr, ["init", huge, "", -1, None, None])), replies
    refused = [error_of(r) for r in replies if r["id"] is None]
    assert refused == [(-32600, "invalid_request")] * 2


@pytest.mark.parametrize(
    "method",
    [
        "tools/list",
        "resources/list",
        "resources/templates/list",
        "prompts/list",
        "tasks/list",
    ],
)
def test_a_cursor_the_face_never_gave_is_invalid_params(face: str, method: str) -> None:
    """The face lists everything in one page (no ``nextCursor``): any cursor
    is one it never gave, ``-32602`` as MCP has it (it was ignored, and the
    first page answered again); a cursor of the wrong type too, and the
    same request without one is answered."""
    replies = session(
        face,
        INIT,
        request(1, method, {"cursor": "bm90LWEtY3Vyc29y"}),
        request(2, method, {"cursor": 5}),
        request(3, method, {"cursor": None}),
        request(4, method, {}),
    )
    assert error_of(answer(replies, 1)) == (-32602, "invalid_params"), replies
    assert error_of(answer(replies, 2)) == (-32602, "invalid_params"), replies
    assert "result" in answer(replies, 3)
    assert "result" in answer(replies, 4)


def test_a_session_narrowed_to_a_server_it_cannot_see_is_told_so(face: str) -> None:
    """``memorizz/scope`` (``mcp serve --server NAME``) naming a server not in
    the session's scope: every listing and call is ``unknown_server`` naming
    it (the session saw an empty server, its tools silently absent)."""
    scope = b'{"jsonrpc":"2.0","method":"memorizz/scope","params":{"server":"nope"}}'
    replies = session(
        face,
        scope,
        INIT,
        request(1, "tools/list", {}),
        request(2, "prompts/list", {}),
        request(3, "tools/call", {"name": "hello", "arguments": {}}),
        PING,
    )
    for request_id in (1, 2, 3):
        reply = answer(replies, request_id)
        assert error_of(reply) == (-32002, "unknown_server"), replies
        assert "nope" in reply["error"]["message"]
    assert "result" in answer(replies, "after")


INIT_PARAMS = msgspec.json.decode(INIT)["params"]


@pytest.mark.parametrize(
    ("method", "params"),
    [
        ("tools/call", {"name": "t__hello", "_meta": {"progressToken": "x" * 257}}),
        ("tools/call", {"name": "t__hello", "_meta": {"progressToken": "x" * 5000}}),
        ("initialize", {**INIT_PARAMS, "clientInfo": 5}),
        ("initialize", {**INIT_PARAMS, "clientInfo": None}),
        ("initialize", {**INIT_PARAMS, "clientInfo": ["battery", "0"]}),
        ("initialize", {**INIT_PARAMS, "clientInfo": {"name": 5, "version": "0"}}),
        ("initialize", {**INIT_PARAMS, "clientInfo": {"name": "b", "version": 0}}),
        ("initialize", {**INIT_PARAMS, "clientInfo": {"name": "battery"}}),
        ("initialize", {**INIT_PARAMS, "clientInfo": {"version": "0"}}),
    ],
)  # fmt: skip
def test_what_the_socket_api_refuses_the_face_refuses(
    face: str, method: str, params: object
) -> None:
    """A progress token over the socket API's 256 characters (the face took
    5,000), and a ``clientInfo`` that is not MCP's ``Implementation`` (a name
    and a version, strings; ``5`` was taken): ``invalid_params`` under the
    request's id, and the session serves on."""
    _invalid_params_and_served_on(face, method, params)


def test_a_token_at_the_cap_and_a_client_info_with_more_members_are_served(
    face: str,
) -> None:
    info = {"name": "battery", "version": "0", "title": "B", "icons": [], "x": 1}
    replies = session(
        face,
        request("init", "initialize", {**INIT_PARAMS, "clientInfo": info}),
        request(7, "tools/call", {"name": "t__hello", "_meta": {"progressToken": "x" * 256}}),
    )  # fmt: skip
    assert "result" in answer(replies, "init"), replies
    assert "result" in answer(replies, 7), replies
