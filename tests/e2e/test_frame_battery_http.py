"""Malformed requests at ``memorizzctl mcp serve --transport streamable-http``.

The installed bridge (``tests.harness.http_bridge``) on a loopback port in
front of a real daemon's face; each request is written by hand on a
connection of its own, so that every header can be wrong: Host and Origin
tricks, tokens, lengths and transfer codings, session and version garbage,
bodies that are no single JSON-RPC message. Each gets its status, and the
bridge serves the next client.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import dataclass

import msgspec
import pytest

from tests.harness import INITIALIZE, http_bridge, light_daemon

WAIT_S = 20.0
BODY = msgspec.json.encode(INITIALIZE)


@dataclass
class Bridge:
    port: int
    token: str

    def exchange(self, head: str, body: bytes = b"", *, raw: bytes = b"") -> bytes:
        """One request (``head``'s lines, latin-1, then ``raw`` header bytes),
        and the whole answer, read until the bridge closes or its body ends."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=WAIT_S) as s:
            s.sendall(head.encode("latin-1") + raw + b"\r\n" + body)
            answer = b""
            while b"\r\n\r\n" not in answer or not self._whole(answer):
                chunk = s.recv(1 << 16)
                if not chunk:
                    break
                answer += chunk
            return answer

    @staticmethod
    def _whole(answer: bytes) -> bool:
        head, _, body = answer.partition(b"\r\n\r\n")
        for line in head.split(b"\r\n"):
            name, _, value = line.partition(b":")
            if name.lower() == b"content-length":
                return len(body) >= int(value)
        return False

    def head(self, host: str | None = None, body: bytes = BODY, **headers: str) -> str:
        fields = {
            "Host": f"127.0.0.1:{self.port}" if host is None else host,
            "Authorization": f"Bearer {self.token}",
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            "Content-Length": str(len(body)),
        }
        fields.update({k.replace("_", "-"): v for k, v in headers.items()})
        lines = [f"{name}: {value}" for name, value in fields.items() if value]
        return "POST /mcp HTTP/1.1\r\n" + "".join(line + "\r\n" for line in lines)

    def status(
        self, host: str | None = None, body: bytes = BODY, **headers: str
    ) -> int:
        return status_of(self.exchange(self.head(host, body, **headers), body))

    def serves(self) -> bool:
        return self.status() == 200


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


@pytest.fixture(scope="module")
def bridge() -> Iterator[Bridge]:
    with light_daemon("t") as running, http_bridge(running.socket) as (url, token):
        yield Bridge(int(url.rsplit(":", 1)[1].split("/")[0]), token)


@pytest.mark.parametrize(
    "host",
    [
        "[::1",  # a bracket not closed
        "::1",  # an IPv6 literal without its brackets
        "127.0.0.1]",
        "[127.0.0.1]",  # an IPv4 literal in brackets
        "127.0.0.1.",
        "localhost.",
        "127.1",
        "2130706433",
        "0.0.0.0",  # noqa: S104 - a Host header, not an address bound
        "evil@127.0.0.1",
        "evil.example",
    ],
)
def test_a_host_that_is_not_a_plain_literal_of_ours_is_421(
    bridge: Bridge, host: str
) -> None:
    """Only ``localhost`` or an address literal, as a URL writes it, names
    the listener: ``[::1`` and ``127.0.0.1]`` were taken for ``::1`` and
    ``127.0.0.1``."""
    assert bridge.status(f"{host}:{bridge.port}") == 421
    assert bridge.serves()


@pytest.mark.parametrize(
    "host", ["LOCALHOST", "localhost", "127.0.0.1", "[::1]", "127.9.9.9"]
)
def test_the_hosts_that_name_the_listener_are_served(bridge: Bridge, host: str) -> None:
    assert bridge.status(f"{host}:{bridge.port}") == 200


@pytest.mark.parametrize(
    ("headers", "raw"),
    [
        ({"Transfer_Encoding": "chunked"}, b""),  # beside a Content-Length
        ({}, b"Content-Length: 5\r\n"),  # two that differ
        ({}, f"Content-Length: {len(BODY)}\r\n".encode()),  # two that agree
        ({"Content_Length": "", "Transfer_Encoding": "chunked"}, b""),
    ],
    ids=["te-and-cl", "two-lengths", "two-equal-lengths", "chunked"],
)
def test_a_body_whose_length_is_not_plain_is_411_and_the_connection_closed(
    bridge: Bridge, headers: dict[str, str], raw: bytes
) -> None:
    """The body is taken by one Content-Length, and never beside a transfer
    coding: read by the first of two lengths, or by a length a chunked
    body contradicts, the rest would be read as the next request."""
    answer = bridge.exchange(bridge.head(**headers), BODY, raw=raw)
    assert status_of(answer) == 411, answer
    assert bridge.serves()


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({"Authorization": "Bearer " + "x" * 32}, 401),
        ({"Authorization": "Basic x"}, 401),
        ({"Authorization": ""}, 401),
        ({"Origin": "http://evil.example"}, 403),
        ({"Origin": "null"}, 403),
        ({"Origin": "https://127.0.0.1:{port}"}, 403),
        ({"Origin": "http://evil@127.0.0.1:{port}"}, 403),
        ({"Origin": "http://[::1:{port}"}, 403),
        ({"MCP_Protocol_Version": "garbage"}, 400),
        ({"Mcp_Session_Id": "../../no-such-session"}, 404),
        ({"Content_Length": "+5"}, 411),
        ({"Content_Length": str(64 << 20)}, 413),  # past what is drained
    ],
)
def test_refused_heads_get_their_status(
    bridge: Bridge, headers: dict[str, str], status: int
) -> None:
    given = {k: v.format(port=bridge.port) for k, v in headers.items()}
    if given.get("Authorization", "-").startswith("Bearer x"):
        given["Authorization"] = "Bearer " + "x" * len(bridge.token)  # same length
    assert bridge.status(**given) == status
    assert bridge.serves()


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b"", 400, -32700),
        (b"\x00", 400, -32700),
        (b"\xff\xfe", 400, -32700),
        (b"[" + BODY + b"]", 400, -32600),
        (b"[" * 100_000 + b"]" * 100_000, 400, -32600),
        (b'{"jsonrpc":"2.0","id":null,"method":"ping"}', 400, -32600),
        (b'{"jsonrpc":"2.0","id":1.5,"method":"ping"}', 400, -32600),
        (b'{"jsonrpc":"2.0","id":true,"method":"ping"}', 400, -32600),
    ],
)
def test_a_body_that_is_not_one_request_is_400(
    bridge: Bridge, body: bytes, status: int, code: int
) -> None:
    answer = bridge.exchange(bridge.head(body=body), body)
    assert status_of(answer) == status, answer
    error = msgspec.json.decode(answer.partition(b"\r\n\r\n")[2])["error"]
    assert error["code"] == code
    assert bridge.serves()


def test_a_null_id_response_in_a_session_is_taken_and_the_session_serves_on(
    bridge: Bridge,
) -> None:
    answer = bridge.exchange(bridge.head(), BODY)
    assert status_of(answer) == 200
    session_id = next(
        line.split(b":", 1)[1].strip().decode()
        for line in answer.split(b"\r\n")
        if line.lower().startswith(b"mcp-session-id:")
    )
    echoed = (
        b'{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"parse error"}}'
    )
    assert bridge.status(body=echoed, Mcp_Session_Id=session_id) == 202
    ping = b'{"jsonrpc":"2.0","id":2,"method":"ping"}'
    answer = bridge.exchange(bridge.head(body=ping, Mcp_Session_Id=session_id), ping)
    assert status_of(answer) == 200
    reply = msgspec.json.decode(answer.partition(b"\r\n\r\n")[2])
    assert reply == {"jsonrpc": "2.0", "id": 2, "result": {}}


def _headers_of(answer: bytes) -> dict[str, str]:
    head = answer.partition(b"\r\n\r\n")[0].decode("latin-1")
    fields = (line.partition(":") for line in head.split("\r\n")[1:])
    return {name.lower(): value.strip() for name, _, value in fields}


PING = b'{"jsonrpc":"2.0","id":"after","method":"ping"}'


def pings(bridge: Bridge) -> bool:
    """The bridge serves a ping outside a session (``serves`` keeps one open:
    the bridge holds at most 64)."""
    answer = bridge.exchange(bridge.head(body=PING), PING)
    reply = msgspec.json.decode(answer.partition(b"\r\n\r\n")[2])
    return status_of(answer) == 200 and reply == {
        "jsonrpc": "2.0",
        "id": "after",
        "result": {},
    }


@pytest.mark.parametrize("method", ["PUT", "PATCH", "OPTIONS", "HEAD", "TRACE", "FOO"])
def test_a_method_the_endpoint_does_not_take_is_405_with_allow(
    bridge: Bridge, method: str
) -> None:
    """MCP's Streamable HTTP wants ``405`` and ``Allow`` for a method the
    endpoint does not take (http.server answered ``501`` with its HTML page),
    in the bridge's own error format (for HEAD, its headers only); and only
    once the request is admitted: without the token it is ``401``."""
    head = bridge.head().replace("POST ", f"{method} ", 1)
    answer = bridge.exchange(head, BODY)
    assert status_of(answer) == 405, answer
    headers = _headers_of(answer)
    assert headers["allow"] == "GET, POST, DELETE"
    assert headers["content-type"] == "application/json"
    body = answer.partition(b"\r\n\r\n")[2]
    if method == "HEAD":
        assert body == b""
    else:
        assert msgspec.json.decode(body)["error"]["code"] == -32600
    unauthenticated = bridge.head(Authorization="").replace("POST ", f"{method} ", 1)
    answer = bridge.exchange(unauthenticated, BODY)
    assert status_of(answer) == 401, answer
    assert "allow" not in _headers_of(answer)
    assert pings(bridge)


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({"Content_Type": "text/plain"}, 415),
        ({"Content_Type": "application/x-www-form-urlencoded"}, 415),
        ({"Content_Type": "application/jsonx"}, 415),
        ({"Content_Type": ""}, 415),  # none
        ({"Content_Type": "application/json; charset=utf-8"}, 200),
        ({"Content_Type": "Application/JSON"}, 200),
        ({"Accept": "text/html"}, 406),
        ({"Accept": "image/*, text/plain"}, 406),
        ({"Accept": "application/json"}, 200),
        ({"Accept": "text/event-stream"}, 200),
        ({"Accept": "application/*"}, 200),
        ({"Accept": "*/*"}, 200),
        ({"Accept": ""}, 200),  # none: anything
        ({"Content_Type": "text/plain", "Authorization": ""}, 401),
        ({"Accept": "text/html", "Authorization": ""}, 401),
    ],
)
def test_a_post_is_json_to_a_client_that_takes_json_or_events(
    bridge: Bridge, headers: dict[str, str], status: int
) -> None:
    """A POST's body is ``application/json`` (else ``415``), and its
    ``Accept`` admits JSON or an event stream (else ``406``), as the MCP SDK's
    server has it; both after the token."""
    answer = bridge.exchange(bridge.head(body=PING, **headers), PING)
    assert status_of(answer) == status, answer
    if status != 200:
        body = answer.partition(b"\r\n\r\n")[2]
        assert msgspec.json.decode(body)["id"] is None
    assert pings(bridge)


LONE = (
    b'{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"hello",'
    b'"arguments":{"s":"\\udc00"}}}'
)


@pytest.mark.parametrize("in_session", [False, True], ids=["sessionless", "session"])
def test_a_lone_surrogate_in_a_body_is_answered_under_its_id(
    bridge: Bridge, in_session: bool
) -> None:
    """A lone surrogate escape is valid JSON but no Unicode: the socket API
    answers it ``parse_error`` under the request's id, and so does the face
    behind the bridge (the bridge answered ``400`` under id null); one in
    the id itself is id null on both."""
    session: dict[str, str] = {}
    if in_session:
        answer = bridge.exchange(bridge.head(), BODY)
        session["Mcp_Session_Id"] = _headers_of(answer)["mcp-session-id"]
    answer = bridge.exchange(bridge.head(body=LONE, **session), LONE)
    assert status_of(answer) == 200, answer
    reply = msgspec.json.decode(answer.partition(b"\r\n\r\n")[2])
    assert (reply["id"], reply["error"]["code"]) == (7, -32700), reply
    assert reply["error"]["data"]["reason"] == "parse_error"
    in_id = b'{"jsonrpc":"2.0","id":"\\ud800","method":"ping"}'
    answer = bridge.exchange(bridge.head(body=in_id, **session), in_id)
    assert status_of(answer) == 400, answer
    reply = msgspec.json.decode(answer.partition(b"\r\n\r\n")[2])
    assert (reply["id"], reply["error"]["code"]) == (None, -32700)
    if in_session:
        ended = "DELETE" + bridge.head(Content_Length="", **session)[4:]
        assert status_of(bridge.exchange(ended)) == 200
    assert pings(bridge)


def _answers(bridge: Bridge, request: bytes) -> list[int]:
    """The statuses of every answer the bridge writes on one connection to
    ``request`` (bytes as they are), read until it closes the connection."""
    with socket.create_connection(("127.0.0.1", bridge.port), timeout=WAIT_S) as s:
        s.sendall(request)
        answer = b""
        while chunk := s.recv(1 << 16):
            answer += chunk
    return [int(part.split(b" ", 1)[0]) for part in answer.split(b"HTTP/1.1 ")[1:]]


@pytest.mark.parametrize("method", ["GET", "DELETE"])
@pytest.mark.parametrize("framing", ["length", "chunked"])
def test_a_body_beside_a_get_or_delete_is_never_read_as_the_next_request(
    bridge: Bridge, method: str, framing: str
) -> None:
    """A GET or DELETE takes no body: one sent with it (a length, or a
    transfer coding) is not left on the connection for the next request to
    be read from (a proxy in front took it for this one's body: two
    answers to one request desynchronise every client behind it). Refused
    and the connection closed, as a POST with a body whose length is not
    plain is."""
    smuggled = (
        f"DELETE /mcp HTTP/1.1\r\nHost: 127.0.0.1:{bridge.port}\r\n"
        f"Authorization: Bearer {bridge.token}\r\nMcp-Session-Id: x\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    if framing == "length":
        framed = f"Content-Length: {len(smuggled)}\r\n\r\n".encode() + smuggled
    else:
        framed = (
            b"Transfer-Encoding: chunked\r\n\r\n%x\r\n" % len(smuggled)
            + smuggled
            + b"\r\n0\r\n\r\n"
        )
    head = (
        f"{method} /mcp HTTP/1.1\r\nHost: 127.0.0.1:{bridge.port}\r\n"
        f"Authorization: Bearer {bridge.token}\r\n"
        "Accept: text/event-stream\r\n"
    ).encode()
    statuses = _answers(bridge, head + framed)
    assert len(statuses) == 1, statuses
    assert pings(bridge)
