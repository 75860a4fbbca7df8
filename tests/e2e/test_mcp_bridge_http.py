"""``memorizzctl mcp serve --transport streamable-http``: the face over HTTP.

The installed ``memorizzctl`` serves on a loopback port (``--listen
127.0.0.1:0``: the kernel picks, the bridge says which on stderr) in front of
a real daemon with a real upstream; the official MCP Python SDK client lists
and calls its tools, and plain HTTP requests hold the transport's rules: the
bearer token, Host and Origin against DNS rebinding, the body bound, sessions
(404 once ended), 202 for what gets no answer, 405 for GET.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from memorizz import cli
from memorizz.ctl import serve_http
from memorizz.ctl.serve import Bridge
from memorizz.ctl.session import Sessions
from memorizzd.listeners import face_socket_path
from tests.harness import (
    INITIALIZE,
    DaemonHarness,
    daemon_config,
    short_tempdir,
    stdio_spec,
    wait_until,
)
from tests.process import MEMORIZZCTL

WAIT_S = 30  # a guard against a hang, never a measurement
TOKEN = secrets.token_urlsafe(24)


@dataclass
class Served:
    proc: subprocess.Popen[bytes]
    url: str
    port: int
    token: str

    def headers(self, **extra: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}", **extra}

    def post(self, body: object, **headers: str) -> httpx2.Response:
        with httpx2.Client(timeout=WAIT_S) as http:
            return http.post(self.url, json=body, headers=self.headers(**headers))


def _start(*args: str, token: str | None) -> Served:
    """The bridge, started; ``token=None``: it makes one up and prints it."""
    proc = subprocess.Popen(
        [MEMORIZZCTL, "mcp", "serve", "--transport", "streamable-http", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    assert proc.stderr is not None
    first = proc.stderr.readline().decode()
    assert " at http://127.0.0.1:" in first, first
    url = first.rsplit(" ", 1)[1].strip()
    if token is None:
        token = proc.stderr.readline().decode().rsplit(" ", 1)[1].strip()
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    return Served(proc, url, port, token)


def _stop(served: Served) -> bytes:
    """Stop the bridge; what it said on stderr after its start."""
    served.proc.terminate()
    served.proc.wait(timeout=WAIT_S)
    assert served.proc.stderr is not None
    with served.proc.stderr:
        return served.proc.stderr.read()


@pytest.fixture(scope="module")
def daemon() -> Iterator[DaemonHarness]:
    base = short_tempdir()
    with DaemonHarness.running(
        daemon_config(base, servers=[stdio_spec("alpha")])
    ) as harness:
        harness.wait_ready("alpha")
        yield harness


@pytest.fixture(scope="module")
def served(daemon: DaemonHarness) -> Iterator[Served]:
    token_file = os.path.join(os.path.dirname(daemon.socket), "token")
    with open(token_file, "w") as f:
        f.write(TOKEN + "\n")
    running = _start(
        "--socket",
        daemon.socket,
        "--listen",
        "127.0.0.1:0",
        "--token-file",
        token_file,
        token=TOKEN,
    )
    try:
        yield running
    finally:
        assert _stop(running) == b""  # no request made it say anything


# --- the official SDK client -------------------------------------------------------


def _sdk(served: Served, mode: str, session_ids: set[str]) -> tuple[list[str], str]:
    async def capture(response: httpx2.Response) -> None:
        if sid := response.headers.get("mcp-session-id"):
            session_ids.add(sid)

    async def work() -> tuple[list[str], str]:
        async with httpx2.AsyncClient(
            headers=served.headers(),
            timeout=WAIT_S,
            event_hooks={"response": [capture]},
        ) as http:
            transport = streamable_http_client(served.url, http_client=http)
            async with Client(transport, mode=mode) as client:
                tools = await client.list_tools()
                result = await client.call_tool("echo", {"text": "over http"})
                assert not result.is_error
                text = result.content[0].text  # type: ignore[union-attr]
                return sorted(t.name for t in tools.tools), text

    return anyio.run(work)


def test_the_sdk_client_lists_and_calls_tools_in_a_session_ended_on_close(
    served: Served,
) -> None:
    session_ids: set[str] = set()
    names, text = _sdk(served, "legacy", session_ids)
    assert "echo" in names  # one server in scope: its names unchanged
    assert text == "over http"
    (session_id,) = session_ids
    # The client's DELETE on close ended it.
    ping = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
    assert served.post(ping, **{"Mcp-Session-Id": session_id}).status_code == 404


def test_the_sdk_client_of_the_sessionless_era_is_served_too(served: Served) -> None:
    """``auto`` negotiates 2026-07-28: no session, each request on its own."""
    session_ids: set[str] = set()
    names, text = _sdk(served, "auto", session_ids)
    assert "echo" in names
    assert text == "over http"
    assert session_ids == set()


# --- the transport's rules, by plain requests ---------------------------------------


def _session(served: Served) -> str:
    reply = served.post(INITIALIZE)
    assert reply.status_code == 200, reply.text
    assert reply.headers["content-type"] == "application/json"
    assert reply.json()["result"]["protocolVersion"] == "2025-11-25"
    return reply.headers["mcp-session-id"]


def test_a_session_answers_requests_and_takes_notifications_with_202(
    served: Served,
) -> None:
    sid = {"Mcp-Session-Id": _session(served)}
    initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    reply = served.post(initialized, **sid, **{"MCP-Protocol-Version": "2025-11-25"})
    assert (reply.status_code, reply.content) == (202, b"")
    pretty = b'{\n  "jsonrpc": "2.0",\n  "id": "p",\n  "method": "ping"\n}'
    with httpx2.Client(timeout=WAIT_S) as http:
        reply = http.post(
            served.url,
            content=pretty,  # one message over several lines: sent as one
            headers=served.headers(**sid, **{"Content-Type": "application/json"}),
        )
        assert reply.json() == {"jsonrpc": "2.0", "id": "p", "result": {}}
        assert http.delete(served.url, headers=served.headers(**sid)).status_code == 200
        assert http.delete(served.url, headers=served.headers(**sid)).status_code == 404


@pytest.mark.parametrize(
    "authorization",
    [None, "Bearer wrong-token", "Basic {token}", "Bearer", "Bearer {token}x"],
)
def test_a_request_without_the_token_is_401(
    served: Served, authorization: str | None
) -> None:
    headers = {}
    if authorization is not None:
        headers["Authorization"] = authorization.format(token=TOKEN)
    with httpx2.Client(timeout=WAIT_S) as http:
        reply = http.post(served.url, json=INITIALIZE, headers=headers)
    assert reply.status_code == 401
    assert reply.headers["www-authenticate"] == "Bearer"
    assert "mcp-session-id" not in reply.headers


@pytest.mark.parametrize(
    ("origin", "status"),
    [
        ("http://evil.example", 403),
        ("http://evil.example:{port}", 403),
        ("https://127.0.0.1:{port}", 403),
        ("http://127.0.0.1:1", 403),
        ("null", 403),
        ("http://localhost:{port}", 200),
        ("http://127.0.0.1:{port}", 200),
    ],
)
def test_an_origin_other_than_this_listener_is_403(
    served: Served, origin: str, status: int
) -> None:
    reply = served.post(INITIALIZE, Origin=origin.format(port=served.port))
    assert reply.status_code == status, reply.text


@pytest.mark.parametrize(
    ("host", "status"),
    [
        ("evil.example:{port}", 421),
        ("rebound.example:{port}", 421),
        ("127.0.0.1:1", 421),
        ("127.0.0.1", 421),
        ("localhost:{port}", 200),
        ("[::1]:{port}", 200),
    ],
)
def test_a_host_other_than_this_listener_is_refused(
    served: Served, host: str, status: int
) -> None:
    """The connection goes to 127.0.0.1 all the same: only the header differs."""
    reply = served.post(INITIALIZE, Host=host.format(port=served.port))
    assert reply.status_code == status, reply.text


def test_a_body_over_4_mib_is_413(served: Served) -> None:
    with httpx2.Client(timeout=WAIT_S) as http:
        reply = http.post(
            served.url,
            content=b" " * (serve_http.MAX_BODY + 1),
            headers=served.headers(**{"Content-Type": "application/json"}),
        )
    assert reply.status_code == 413


@pytest.mark.parametrize(
    ("body", "headers", "status"),
    [
        ({"jsonrpc": "2.0", "id": 9, "method": "ping"}, {"Mcp-Session-Id": "nope"}, 404),
        ({"jsonrpc": "2.0", "method": "x"}, {"Mcp-Session-Id": "nope"}, 404),
        (INITIALIZE, {"MCP-Protocol-Version": "1999-01-01"}, 400),
        ([INITIALIZE], {}, 400),
        ({"jsonrpc": "2.0", "id": None, "method": "ping"}, {}, 400),
        ({"jsonrpc": "2.0", "method": "notifications/initialized"}, {}, 202),
    ],
    ids=["unknown-session", "unknown-session-notification", "bad-version", "batch",
         "null-id", "sessionless-notification"],
)  # fmt: skip
def test_requests_the_transport_does_not_take(
    served: Served, body: object, headers: dict[str, str], status: int
) -> None:
    assert served.post(body, **headers).status_code == status


def test_get_offers_no_stream_and_other_paths_are_404(served: Served) -> None:
    with httpx2.Client(timeout=WAIT_S) as http:
        get = http.get(served.url, headers=served.headers())
        assert get.status_code == 405
        assert get.headers["allow"] == "POST, DELETE"
        other = served.url.replace("/mcp", "/other")
        assert (
            http.post(other, json=INITIALIZE, headers=served.headers()).status_code
            == 404
        )


def _closing_face(path: str) -> socket.socket:
    """A stand-in mcp.sock that answers one line per connection, then hangs up."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen()

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn, conn.makefile("rb") as lines:
                if lines.readline():
                    conn.sendall(b'{"jsonrpc":"2.0","id":1,"result":{}}\n')

    threading.Thread(target=serve, daemon=True).start()
    return listener


def test_a_session_whose_socket_closed_is_404_and_the_token_is_printed() -> None:
    base = short_tempdir()
    face = face_socket_path(os.path.join(base, "d.sock"))
    listener = _closing_face(face)  # named directly: no API socket beside it
    served = _start("--mcp-socket", face, "--listen", "127.0.0.1:0", token=None)
    try:
        assert len(served.token) >= 32
        sid = {"Mcp-Session-Id": _initialized_id(served)}
        ping = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
        assert served.post(ping, **sid).status_code == 404
    finally:
        _stop(served)
        listener.close()


def _initialized_id(served: Served) -> str:
    reply = served.post(INITIALIZE)
    assert reply.status_code == 200, reply.text
    return reply.headers["mcp-session-id"]


# --- the command line ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "status", "said"),
    [
        (["--listen", "0.0.0.0:8765"], 2, "add --allow-remote"),
        (["--listen", "example.com:8765"], 2, "must be an IP address"),
        (["--listen", "127.0.0.1"], 2, "expected HOST:PORT"),
        ([], 2, "needs --listen"),
        (
            ["--listen", "127.0.0.1:0", "--token-file", "/nonexistent/t"],
            2,
            "--token-file",
        ),
        (["--listen", "127.0.0.1:0"], 69, "cannot reach memorizzd at "),
    ],
)
def test_bad_lines_and_a_missing_daemon_are_said_with_memorizzctls_statuses(
    args: list[str], status: int, said: str, capfd: pytest.CaptureFixture[str]
) -> None:
    base = short_tempdir()
    argv = ["--socket", os.path.join(base, "d.sock"), "mcp", "serve"]
    assert cli.main([*argv, "--transport", "streamable-http", *args]) == status
    captured = capfd.readouterr()
    assert said in captured.err
    assert captured.out == ""


def test_the_http_options_need_the_http_transport(
    capfd: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["mcp", "serve", "--listen", "127.0.0.1:1"]) == 2
    assert "go with --transport streamable-http" in capfd.readouterr().err


def test_sessions_are_bounded() -> None:
    """Past the limit, a new session is refused (the bridge answers 503) while
    the others stay; one ended makes room."""
    base = short_tempdir()
    path = os.path.join(base, "mcp.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(8)  # connections wait in the backlog, open: sessions that stay
    sessions = Sessions(Bridge(path, None), limit=2)
    try:
        first = sessions.open()
        assert first is not None
        assert sessions.open() is not None
        assert sessions.open() is None
        assert sessions.end(first[0])
        assert sessions.open() is not None
    finally:
        listener.close()


def _raw_request(served: Served, head: str, body: bytes = b"") -> bytes:
    """One request written by hand (latin-1 headers, as the bridge reads
    them: "\u00b2" is one byte); the status line of the answer."""
    with socket.create_connection(("127.0.0.1", served.port), timeout=WAIT_S) as s:
        s.sendall(head.encode("latin-1") + b"\r\n" + body)
        return s.makefile("rb").readline()


@pytest.mark.parametrize("length", ["\u00b2", "9" * 5000, "-1", ""])
def test_a_content_length_that_is_not_ascii_digits_is_411(
    served: Served, length: str
) -> None:
    head = (
        f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{served.port}\r\n"
        f"Authorization: Bearer {served.token}\r\nContent-Type: application/json\r\n"
        f"Accept: application/json, text/event-stream\r\nContent-Length: {length}\r\n"
    )
    assert _raw_request(served, head, b"{}").split(b" ", 2)[1] == b"411"
    assert served.post(INITIALIZE).status_code == 200  # and it serves on


@pytest.mark.parametrize(
    ("framing", "body", "status"),
    [
        # declared past what the bridge reads before its 413 (_DRAIN)
        (f"Content-Length: {4 * serve_http.MAX_BODY + 1}\r\n", None, b"413"),
        # no length: the bridge reads none of it
        ("Transfer-Encoding: chunked\r\n", b"800000\r\n" + b" " * 0x800000, b"411"),
    ],
    ids=["over-drain", "chunked"],
)
def test_a_client_that_sends_its_whole_body_before_it_reads_reads_the_refusal(
    served: Served, framing: str, body: bytes | None, status: bytes
) -> None:
    """A refusal the bridge answers without reading the body: it closes as
    RFC 9112 9.6 asks, its writing side first, reading out what still comes
    (for a bounded time) before it closes. Closed with the body unread, the
    client's sending failed (a reset) before it could read the refusal."""
    head = (
        f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{served.port}\r\n"
        f"Authorization: Bearer {served.token}\r\nContent-Type: application/json\r\n"
        f"Accept: application/json, text/event-stream\r\n{framing}"
    )
    sent = b" " * (4 * serve_http.MAX_BODY + 1) if body is None else body
    for _ in range(3):
        assert _raw_request(served, head, sent).split(b" ", 2)[1] == status
    assert served.post(INITIALIZE).status_code == 200  # and it serves on


def test_connections_over_the_cap_are_503_at_once_and_the_bridge_serves_on(
    served: Served,
) -> None:
    """A flood of connections that send nothing holds at most MAX_CONNECTIONS
    threads (each closed within HEAD_TIMEOUT_S, before any token is read)."""
    flood = [
        socket.create_connection(("127.0.0.1", served.port), timeout=WAIT_S)
        for _ in range(serve_http.MAX_CONNECTIONS)
    ]
    try:
        wait_until(
            lambda: _status_of_one_more(served) == b"503",
            what="a connection over the cap refused",
        )
    finally:
        for conn in flood:
            conn.close()
    wait_until(
        lambda: served.post(INITIALIZE).status_code == 200,
        what="the bridge to serve once the flood left",
    )


def _status_of_one_more(served: Served) -> bytes:
    """The status a new connection hears before it sends anything (b"": none)."""
    with socket.create_connection(("127.0.0.1", served.port), timeout=1.0) as s:
        try:
            line = s.makefile("rb").readline()
        except TimeoutError:  # served: the bridge waits for a request
            return b""
    return line.split(b" ", 2)[1] if line else b""


TRICKLE_S = serve_http.HEAD_TIMEOUT_S * 0.3
"""A byte now and then: each well within HEAD_TIMEOUT_S of the last (a timeout
per read would never end), none near the head's deadline."""


@pytest.mark.parametrize("trickle", [False, True], ids=["silent", "trickling"])
def test_a_head_not_finished_in_head_timeout_s_is_closed_and_the_bridge_serves_on(
    served: Served, trickle: bool
) -> None:
    """Part of a request's head, then nothing, or a byte of a header now and
    then (slowloris): the bridge closes the connection HEAD_TIMEOUT_S after
    it opened, not sooner, before any token is read."""
    head_s = serve_http.HEAD_TIMEOUT_S
    with socket.create_connection(("127.0.0.1", served.port), timeout=WAIT_S) as s:
        s.sendall(f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{served.port}\r\n".encode())
        sent = time.monotonic()
        heard = _heard_until_closed(s, sent + head_s + WAIT_S, trickle=trickle)
        closed_after = time.monotonic() - sent
    assert heard == b"" or heard.split(b" ", 2)[1] in {b"400", b"408"}, heard
    assert closed_after >= head_s * 0.8, f"closed after {closed_after:.1f} s"
    assert served.post(INITIALIZE).status_code == 200


def _heard_until_closed(conn: socket.socket, give_up: float, *, trickle: bool) -> bytes:
    """What the bridge sent on ``conn`` before it closed it (failing at
    ``give_up``); ``trickle``: meanwhile, a header's bytes every TRICKLE_S."""
    heard = b""
    next_byte = time.monotonic() + TRICKLE_S if trickle else give_up
    try:
        if trickle:
            conn.sendall(b"X-Slow: ")
        while (now := time.monotonic()) < give_up:
            if now >= next_byte:
                conn.sendall(b"x")
                next_byte += TRICKLE_S
            conn.settimeout(max(min(next_byte, give_up) - now, 0.01))
            try:
                chunk = conn.recv(4096)
            except TimeoutError:
                continue
            if not chunk:
                return heard
            heard += chunk
    except ConnectionError:  # closed with a byte of ours unread: a reset
        return heard
    pytest.fail(f"the connection is still open (it heard {heard!r})")


def test_a_refused_request_does_not_poison_its_connection(served: Served) -> None:
    """A request refused before its body is read (here: a Host from elsewhere)
    has its body read and its connection closed: the next request, on the same
    client connection, is answered on its own (it was read from the middle of
    the refused body and answered 501)."""
    with httpx2.Client(timeout=WAIT_S) as http:
        refused = http.post(
            served.url,
            json=INITIALIZE,
            headers=served.headers(Host=f"evil.example:{served.port}"),
        )
        assert refused.status_code == 421
        answered = http.post(served.url, json=INITIALIZE, headers=served.headers())
    assert answered.status_code == 200, answered.text


def test_a_call_that_asks_for_progress_is_answered_as_an_event_stream(
    served: Served,
) -> None:
    """The SDK client sends a progressToken: the bridge answers with
    text/event-stream, each progress notification as it comes, then the result."""
    seen: list[tuple[float, float | None, str | None]] = []

    async def work() -> str:
        async def on_progress(
            progress: float, total: float | None, message: str | None
        ) -> None:
            seen.append((progress, total, message))

        http = httpx2.AsyncClient(headers=served.headers(), timeout=WAIT_S)
        async with http:
            transport = streamable_http_client(served.url, http_client=http)
            async with Client(transport, mode="legacy") as client:
                result = await client.call_tool(
                    "progressing", {"steps": 2}, progress_callback=on_progress
                )
        return result.content[0].text  # type: ignore[union-attr]

    assert anyio.run(work) == "done in 2 steps"
    assert seen == [(1, 2, "step 1"), (2, 2, "step 2")]


def test_a_call_cancelled_by_its_client_is_answered_with_connection_close(
    served: Served,
) -> None:
    """A call whose client cancels it has no answer: its POST is answered 202
    and its connection closed, and the 202 says ``Connection: close``. Without
    it a client that keeps connections alive (Node's fetch) takes the
    connection back into its pool and may send its next request on it as the
    bridge closes it: "fetch failed" (seen in a full run)."""
    sid = _session(served)
    era = {"Mcp-Session-Id": sid, "MCP-Protocol-Version": "2025-11-25"}
    initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    assert served.post(initialized, **era).status_code == 202
    call = {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "tools/call",
        "params": {"name": "slow", "arguments": {"seconds": WAIT_S}},
    }
    answered: list[httpx2.Response] = []

    def calling() -> None:
        with httpx2.Client(timeout=WAIT_S) as http:
            answered.append(
                http.post(served.url, json=call, headers=served.headers(**era))
            )

    caller = threading.Thread(target=calling)
    caller.start()
    cancel = {
        "jsonrpc": "2.0",
        "method": "notifications/cancelled",
        "params": {"requestId": 7, "reason": "the user gave up"},
    }
    deadline = time.monotonic() + WAIT_S
    while caller.is_alive():  # until the call has reached the face and is cancelled
        assert time.monotonic() < deadline, "the cancelled call was never answered"
        assert served.post(cancel, **era).status_code == 202
        caller.join(0.1)
    (reply,) = answered
    assert (reply.status_code, reply.content) == (202, b"")
    assert reply.headers.get("connection") == "close"
