"""The MCP face against adversarial but plausible traffic, from a raw socket.

Each test is a bug an outside probe found: a request left without its answer
(or with an answer that is no JSON-RPC response), a call wedged by a client's
malformed answer, an internal error where the params were at fault, an
error line that says back all of what the client sent. The clients are raw
``AF_UNIX`` connections to the face's ``mcp.sock``, framed as MCP stdio;
behind the face, the daemon's warm sessions to real SDK servers
(``tests/mcp_server.py``, ``tests/asking_server.py``,
``tests/features_server.py``).
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest

from memorizzd.listeners import face_socket_path
from tests.harness import (
    DaemonHarness,
    asking_spec,
    daemon_config,
    features_spec,
    light_spec,
    rmtree,
    short_tempdir,
    stdio_spec,
)

READ_S = 8.0
"""Long enough for any answer here, short of every wait that a bug falls into
(the daemon's ``upstream_request_wait_s``, a call's 60 s deadline)."""
MODERN = {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}
HANDSHAKE_ASKS = {
    "protocolVersion": "2025-11-25",
    "capabilities": {"elicitation": {"form": {}}, "sampling": {}},
    "clientInfo": {"name": "probe", "version": "0"},
}


@pytest.fixture(scope="module")
def harness() -> Iterator[DaemonHarness]:
    """``alpha`` (tests/mcp_server.py), ``ask`` (asks its client, handshake
    era), ``feat`` (completions) and ``dup`` (lists its tool twice); an
    upstream question waits 60 s."""
    base = short_tempdir()
    servers = [
        stdio_spec("alpha"),
        asking_spec("ask"),
        features_spec("feat"),
        light_spec("dup", env={"DUPLICATE_TOOL": "1"}),
    ]
    config = daemon_config(base, servers=servers, upstream_request_wait_s=60.0)
    with DaemonHarness.running(config) as running:
        for name in ("alpha", "ask", "feat", "dup"):
            running.wait_ready(name)
        yield running
    rmtree(base)


class Face:
    """One MCP session on the face: raw lines in, decoded lines out."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(READ_S)
        self.sock.connect(path)
        self.buffer = b""

    def send(self, *lines: bytes) -> None:
        self.sock.sendall(b"".join(line + b"\n" for line in lines))

    def request(self, request_id: object, method: str, params: Any) -> bytes:
        message = {"jsonrpc": "2.0", "id": request_id, "method": method}
        return msgspec.json.encode({**message, "params": params})

    def line(self) -> bytes:
        while b"\n" not in self.buffer:
            chunk = self.sock.recv(1 << 16)  # a timeout fails the test
            assert chunk, "the face closed the session"
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line

    def message(self) -> dict[str, Any]:
        decoded: dict[str, Any] = msgspec.json.decode(self.line())
        return decoded

    def reply(self) -> dict[str, Any]:
        """The next line that answers a request (notifications skipped)."""
        while "method" in (found := self.message()):
            pass
        return found

    def serves(self) -> bool:
        """The session still answers: a ping under a fresh id."""
        self.send(self.request("still-there", "ping", {}))
        return self.reply() == {"jsonrpc": "2.0", "id": "still-there", "result": {}}

    def close(self) -> None:
        self.sock.close()


@contextlib.contextmanager
def face(harness: DaemonHarness) -> Iterator[Face]:
    session = Face(face_socket_path(harness.socket))
    try:
        yield session
    finally:
        session.close()


def _call(request_id: object, arguments: bytes) -> bytes:
    return (
        b'{"jsonrpc":"2.0","id":'
        + msgspec.json.encode(request_id)
        + b',"method":"tools/call","params":{"name":"alpha__echo","arguments":'
        + arguments
        + b"}}"
    )


@pytest.mark.parametrize(
    ("line", "request_id", "code"),
    [
        # A string cut in the middle of a surrogate pair, as JavaScript's
        # JSON.stringify writes it: the decoder refuses the lone escape.
        (_call(41, b'{"text":"cut \\ud83d"}'), 41, -32700),
        (_call("deep", b'{"text":' + b"[" * 2000 + b"]" * 2000 + b"}"), "deep", -32600),
        # ... but an id that is itself unreadable stays unknown
        (b'{"jsonrpc":"2.0","id":"\\ud800","method":"ping"}', None, -32700),
    ],
    ids=["lone-surrogate", "too-deep", "unreadable-id"],
)
def test_a_request_the_decoder_refuses_is_answered_under_its_id(
    harness: DaemonHarness, line: bytes, request_id: object, code: int
) -> None:
    """A line the decoder cannot read whose id is plain to see is answered
    under that id (the client waits for it; an ``id: null`` error answers
    nothing), and the session goes on."""
    with face(harness) as session:
        session.send(line)
        reply = session.reply()
        assert reply["id"] == request_id
        assert reply["error"]["code"] == code
        assert session.serves()


def test_a_number_out_of_range_in_a_completion_is_invalid_params(
    harness: DaemonHarness,
) -> None:
    """``1e400`` is valid JSON that no float holds: the params are at fault
    (``-32602``), never an internal error with a traceback in the log."""
    params = (
        b'{"ref":{"type":"ref/resource","uri":"feat://colors/{color}"},'
        b'"argument":{"name":"color","value":"r"},"context":{"n":1e400}}'
    )
    with face(harness) as session:
        session.send(
            b'{"jsonrpc":"2.0","id":1,"method":"completion/complete","params":'
            + params
            + b"}"
        )
        reply = session.reply()
        assert reply["error"]["code"] == -32602, reply
        assert reply["error"]["data"]["reason"] == "invalid_params"
        assert session.serves()


@pytest.mark.parametrize(
    ("method", "params"),
    [
        ("tools/call", {"name": "n" * 100_000}),
        ("prompts/get", {"name": "p" * 100_000}),
        ("n" * 100_000, {}),
    ],
    ids=["tool", "prompt", "method"],
)
def test_an_unknown_name_is_said_back_bounded(
    harness: DaemonHarness, method: str, params: dict[str, Any]
) -> None:
    """An error names what it did not find, but not all 100 KB of it (twice
    over, for a tool: in the message and in ``data``)."""
    with face(harness) as session:
        session.send(session.request(7, method, params))
        line = session.line()
        reply = msgspec.json.decode(line)
        assert reply["id"] == 7
        assert reply["error"]["code"] in (-32601, -32602)
        assert len(line) < 1024, len(line)


@pytest.mark.parametrize(
    "answer",
    [
        b'"result":null',
        b'"result":"yes"',
        b'"error":"no"',
        b'"error":{"code":"x","message":5}',
        b'"result":{"action":"accept","content":{"name":"cut \\ud83d"}}',
    ],
    ids=[
        "null-result",
        "string-result",
        "string-error",
        "malformed-error",
        "unreadable-result",
    ],
)
def test_a_malformed_answer_to_an_upstreams_question_ends_the_call_at_once(
    harness: DaemonHarness, answer: bytes
) -> None:
    """The client answers the upstream's ``elicitation/create`` with what is
    no JSON-RPC answer, or none the daemon can read. It was ignored (the call
    waited out ``upstream_request_wait_s``) or passed on (a result that is
    not an object: the SDK server dropped it and waited for the call's
    deadline, refusing every other caller's question meanwhile); now the
    upstream is answered with an error at once, and the call ends with it."""
    with face(harness) as session:
        session.send(session.request("init", "initialize", HANDSHAKE_ASKS))
        assert session.reply()["id"] == "init"
        session.send(session.request(1, "tools/call", {"name": "ask__ask_name"}))
        asked = session.message()
        assert asked["method"] == "elicitation/create"
        session.send(
            b'{"jsonrpc":"2.0","id":'
            + msgspec.json.encode(asked["id"])
            + b","
            + answer
            + b"}"
        )
        reply = session.reply()
        assert reply["id"] == 1
        assert reply["error"]["data"]["reason"] == "upstream_error", reply
        assert session.serves()


def test_a_retry_whose_call_was_cancelled_meanwhile_gets_an_error(
    harness: DaemonHarness,
) -> None:
    """A 2026-07-28 client's call is held for its retry; the client cancels
    the first request as it retries. The retry was answered
    ``{"jsonrpc":"2.0","id":2}``, neither result nor error (the cancelled
    call had none to give); now it is ``input_state_unknown``."""
    meta = {
        **MODERN,
        "io.modelcontextprotocol/clientCapabilities": {"elicitation": {"form": {}}},
    }
    with face(harness) as session:
        session.send(
            session.request(
                1,
                "tools/call",
                {"name": "ask__ask_name", "arguments": {}, "_meta": meta},
            )
        )
        first = session.reply()["result"]
        assert first["resultType"] == "input_required"
        (key,) = first["inputRequests"]
        retry = {
            "name": "ask__ask_name",
            "arguments": {},
            "requestState": first["requestState"],
            "inputResponses": {key: {"action": "accept", "content": {"name": "Ada"}}},
            "_meta": meta,
        }
        session.send(
            session.request(2, "tools/call", retry),
            b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1}}',
        )
        reply = session.reply()
        assert reply["id"] == 2
        assert "result" in reply or "error" in reply, reply
        if "error" in reply:
            assert reply["error"]["data"]["reason"] == "input_state_unknown"
        assert session.serves()


def test_a_tool_its_server_lists_twice_is_listed_once_under_its_name(
    harness: DaemonHarness,
) -> None:
    """``dup`` lists ``hello`` twice. The face listed it twice under one
    renamed name (``dup__hello_<hash>``: a listing that model APIs refuse, for
    every session that sees the server) and not under ``dup__hello``, the name
    it answers to; now it is listed once, under that name."""
    with face(harness) as session:
        session.send(session.request(1, "tools/list", {}))
        names = [tool["name"] for tool in session.reply()["result"]["tools"]]
        assert len(names) == len(set(names)), names
        assert [name for name in names if name.startswith("dup__")] == ["dup__hello"]
        session.send(session.request(2, "tools/call", {"name": "dup__hello"}))
        assert "result" in session.reply()


def test_a_uri_built_from_a_template_goes_to_the_server_whose_template_it_matches() -> (
    None
):
    """Two servers with templates: ``a-paint`` (``paint://colors/{color}``)
    sorts before ``feat`` (``feat://colors/{color}``). A URI built from
    ``feat``'s template went to ``a-paint``, the first server with any
    template, which knows no such resource; one that matches no template
    went there too, instead of being ``not_found``."""
    base = short_tempdir()
    servers = [features_spec("a-paint", env={"FEAT_SCHEME": "paint"}), features_spec()]
    try:
        with DaemonHarness.running(daemon_config(base, servers=servers)) as running:
            for name in ("a-paint", "feat"):
                running.wait_ready(name)
            with face(running) as session:
                for request_id, uri, text in (
                    (1, "feat://colors/red", "the colour red"),
                    (2, "paint://colors/blue", "the colour blue"),
                ):
                    session.send(
                        session.request(request_id, "resources/read", {"uri": uri})
                    )
                    reply = session.reply()
                    assert reply["result"]["contents"][0]["text"] == text, reply
                session.send(session.request(3, "resources/read", {"uri": "zz://no"}))
                assert session.reply()["error"]["data"]["reason"] == "not_found"
    finally:
        rmtree(base)


@pytest.mark.parametrize(
    "line",
    [
        b'{"jsonrpc":"2.0","id":null,"method":"ping"}',
        (
            b'{"jsonrpc":"2.0","method":"tools/call","id":null,'
            b'"params":{"name":"alpha__echo","arguments":{"text":"x"}}}'
        ),
    ],
    ids=["ping", "tools-call"],
)
def test_a_request_with_a_null_id_is_an_invalid_request_under_a_null_id(
    harness: DaemonHarness, line: bytes
) -> None:
    """MCP forbids a null request id, and JSON-RPC 2.0's notification has
    no ``id`` member at all. ``"id": null`` was taken for a notification: not
    run and never answered, so the client waited for its reply forever; now
    it is ``invalid_request`` (-32600) under a null id, and the session goes
    on. A true notification (no ``id``) is still not answered."""
    with face(harness) as session:
        session.send(line, b'{"jsonrpc":"2.0","method":"ping"}')
        reply = session.reply()
        assert reply["id"] is None, reply
        assert reply["error"]["code"] == -32600, reply
        assert reply["error"]["data"]["reason"] == "invalid_request"
        assert "null" in reply["error"]["message"]
        assert session.serves()  # the next reply is the ping's: nothing between
