"""Malformed requests at the metrics listeners, the way an outside battery sends them.

A real daemon (``light_daemon``, in this process: its head timeout made short)
serves ``GET /metrics`` on ``metrics.sock`` and on a loopback TCP port; each
case is one connection (or a few), its bytes written whole, dripped, cut or
reset, and read until the daemon closes it. What comes back is one
well-formed HTTP/1.1 answer with its Content-Length and ``Connection:
close``, or nothing at all. After each case both listeners scrape 200 with
the ``memorizz_`` metrics, the API socket answers a client, the metrics server
logged no error, and the process's descriptors are back to what they were.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import socket
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from memorizzd.config import Metrics
from memorizzd.telemetry.http import CONNECTIONS_MAX
from tests import wire
from tests.harness import DaemonHarness, light_daemon, wait_until
from tests.peers import NOBODY, as_user, needs_root

HEAD_TIMEOUT_S = 0.5
"""The daemon's ``HEAD_TIMEOUT_S`` here (10 s in production)."""
READ_S = 10.0
_pause = threading.Event()
GET = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"


@dataclass(frozen=True)
class Listener:
    name: str
    address: str | tuple[str, int]

    def connect(self) -> socket.socket:
        family = socket.AF_UNIX if isinstance(self.address, str) else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.settimeout(READ_S)
        sock.connect(self.address)
        return sock


@dataclass
class Metered:
    harness: DaemonHarness
    unix: Listener
    tcp: Listener


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def daemon() -> Iterator[Metered]:
    port = _free_port()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("memorizzd.telemetry.http.HEAD_TIMEOUT_S", HEAD_TIMEOUT_S)
        with light_daemon(
            "lite", metrics=Metrics(listen=f"127.0.0.1:{port}")
        ) as running:
            base = os.path.dirname(running.socket)
            os.chmod(base, 0o755)  # noqa: S103 - a dropped-privilege child reaches in
            metered = Metered(
                running,
                Listener("unix", os.path.join(base, "metrics.sock")),
                Listener("tcp", ("127.0.0.1", port)),
            )
            for listener in (metered.unix, metered.tcp):
                _scrape(listener)  # prometheus-client loaded, the store's reader open
            yield metered


@pytest.fixture(params=["unix", "tcp"])
def where(request: pytest.FixtureRequest, daemon: Metered) -> Listener:
    found: Listener = getattr(daemon, request.param)
    return found


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture(autouse=True)
def serves_on(daemon: Metered, caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """After the case: both listeners scrape, the API socket answers, the
    metrics server logged nothing at warning or above (its boundary was not
    reached), and no descriptor is left behind."""
    caplog.set_level(logging.WARNING, logger="memorizzd")
    wait_until(lambda: _fds() == _fds(), what="a steady descriptor count")
    baseline = _fds()
    yield
    for listener in (daemon.unix, daemon.tcp):
        _scrape(listener)
    with daemon.harness.client() as c:
        assert [s.name for s in c.list_servers()] == ["lite"]
    counted: list[int] = []

    def back() -> bool:
        counted.append(_fds())  # fewer: one the daemon was closing at the start
        return counted[-1] <= baseline

    wait_until(back, timeout=5, what=f"descriptors back to {baseline}: {counted[-5:]}")
    logged = [
        f"{r.name}: {r.getMessage()}"
        for r in caplog.records
        if r.name == "memorizzd.metrics" and r.levelno >= logging.WARNING
    ]
    assert not logged, logged


def exchange(
    listener: Listener,
    *pieces: bytes,
    gap: float = 0.0,
    shut: bool = False,
    answered: bool = True,
) -> bytes:
    """Write ``pieces`` (``gap`` seconds apart), half-close if ``shut``, and
    read everything until the daemon closes the connection. Read while
    writing: the daemon may answer, or close, before the last piece. A
    connection it answers closes in stages, never with a reset; one it closes
    unanswered (``answered=False``: a head past the limit, a peer the socket
    does not admit) may be reset: it has nothing to lose."""
    with listener.connect() as sock:
        return wire.exchange(
            sock, *pieces, gap=gap, shut=shut, reset_is_close=not answered
        )


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes


def answer_of(received: bytes, *, head_only: bool = False) -> Answer:
    """The one answer in ``received``, checked well-formed: an HTTP/1.1
    status line, ``name: value`` fields each once, ``Connection: close``, and
    a body of exactly its Content-Length (none for HEAD), then nothing."""
    head, blank, body = received.partition(b"\r\n\r\n")
    assert blank, received[:300]
    status_line, *lines = head.decode("latin-1").split("\r\n")
    version, code, reason = status_line.split(" ", 2)
    assert version == "HTTP/1.1", status_line
    assert re.fullmatch(r"[1-5][0-9][0-9]", code), status_line
    assert reason, status_line
    headers: dict[str, str] = {}
    for line in lines:
        name, colon, value = line.partition(":")
        assert colon, line
        assert re.fullmatch(r"[A-Za-z0-9-]+", name), line
        assert name.lower() not in headers, line
        headers[name.lower()] = value.strip()
    assert headers["connection"] == "close", headers
    length = int(headers["content-length"])
    assert body == b"" if head_only else len(body) == length, (length, body[:300])
    return Answer(int(code), headers, body)


def _scrape(listener: Listener) -> None:
    answer = answer_of(exchange(listener, GET))
    assert answer.status == 200, answer
    assert answer.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert b"\nmemorizz_upstream_state{" in answer.body


def status(listener: Listener, request: bytes) -> int:
    return answer_of(exchange(listener, request)).status


# -- heads that never come ----------------------------------------------------


@pytest.mark.parametrize(
    "pieces",
    [
        (),
        (b'{"jsonrpc":"2.0","id":1,"method":"servers/list"}\n',),
        (b"GET /metrics\r\n",),  # HTTP/0.9: no blank line follows
        (b"GET /metrics HTTP/1.1\nHost: x\n\n",),  # bare LFs
        (bytes(range(256)),),
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 64,),  # TLS
    ],
    ids=["silence", "json-rpc", "http-0.9", "bare-lf", "binary", "tls-hello"],
)
def test_a_head_that_never_ends_is_closed_unanswered_at_the_timeout(
    where: Listener, pieces: tuple[bytes, ...]
) -> None:
    """Silence, a JSON-RPC line (``memorizzctl`` pointed at the wrong
    socket), a TLS hello: closed at the head timeout, no answer."""
    started = time.monotonic()
    assert exchange(where, *pieces) == b""
    assert HEAD_TIMEOUT_S * 0.8 <= time.monotonic() - started < READ_S


def test_a_dripped_head_is_cut_at_the_head_timeout(where: Listener) -> None:
    """One byte every 50 ms (a 2 s head): the timeout bounds the whole head,
    not each read."""
    drip = b"GET /metrics HTTP/1.1\r\nHost: x\r\nUser-Agent: drip\r\n\r\n"
    started = time.monotonic()
    received = exchange(where, *(bytes([b]) for b in drip), gap=0.05)
    took = time.monotonic() - started
    assert received == b""
    assert HEAD_TIMEOUT_S * 0.8 <= took < len(drip) * 0.05, took


def test_a_head_cut_by_a_half_close_is_closed_at_once(where: Listener) -> None:
    started = time.monotonic()
    assert exchange(where, b"GET /metrics HTTP/1.1\r\n", shut=True) == b""
    assert time.monotonic() - started < HEAD_TIMEOUT_S


@pytest.mark.parametrize(
    "head",
    [
        b"X" * (1 << 20),  # 1 MiB, no blank line
        b"GET /metrics HTTP/1.1\r\n"
        + b"".join(b"X-H%d: v\r\n" % i for i in range(5000)),
        b"GET /" + b"m" * 20_000 + b" HTTP/1.1\r\n\r\n",
    ],
    ids=["1-mib", "5000-headers", "long-target"],
)
def test_a_head_past_the_limit_is_closed_before_the_timeout(
    where: Listener, head: bytes
) -> None:
    started = time.monotonic()
    assert exchange(where, head + b"\r\n", answered=False) == b""
    assert time.monotonic() - started < HEAD_TIMEOUT_S


# -- heads that come, and their answers -----------------------------------------


@pytest.mark.parametrize(
    ("request_line", "code"),
    [
        (b"GET /metrics HTTP/1.0", 200),
        (b"GET /metrics?x=1 HTTP/1.1", 200),
        (b"GET /metrics? HTTP/1.1", 200),
        (b"GET /metrics?name[]=memorizz_calls_total&x=%ff HTTP/1.1", 200),
        (b"GET /metrics?\xff\x00\xc3 HTTP/1.1", 200),
        (b"GET http://127.0.0.1/metrics HTTP/1.1", 200),  # absolute-form
        (b"GET http://127.0.0.1:9464/metrics?x=1 HTTP/1.1", 200),
        (b"GET HTTP://X/metrics HTTP/1.1", 200),
        (b"GET http://127.0.0.1/ HTTP/1.1", 404),
        (b"GET http://127.0.0.1 HTTP/1.1", 404),
        (b"GET http:/metrics HTTP/1.1", 404),
        (b"GET http://x?a/metrics HTTP/1.1", 404),  # a query, not a path
        (b"GET ftp://x/metrics HTTP/1.1", 404),
        (b"GET * HTTP/1.1", 404),  # asterisk-form
        (b"GET / HTTP/1.1", 404),
        (b"GET /metricsx HTTP/1.1", 404),
        (b"GET /metrics/ HTTP/1.1", 404),
        (b"GET /Metrics HTTP/1.1", 404),
        (b"GET /metrics\xff HTTP/1.1", 404),
        (b"GET /met\x00rics HTTP/1.1", 404),
        (b"GET /metrics", 400),  # HTTP/0.9, with a blank line
        (b"GET /metrics HTTP/2.0", 400),
        (b"GET  /metrics HTTP/1.1", 400),
        (b"GET /metrics HTTP/1.1 x", 400),
        (b"", 400),
        (b"\x00\xff\xfe\x80garbage\x01", 400),
        (b'{"jsonrpc":"2.0","id":1,"method":"ping"}', 400),
    ],
)
def test_a_request_line_gets_its_status(
    where: Listener, request_line: bytes, code: int
) -> None:
    answer = answer_of(exchange(where, request_line + b"\r\nHost: x\r\n\r\n"))
    assert answer.status == code, answer
    if code != 200:
        assert answer.headers["content-type"] == "text/plain; charset=utf-8"


@pytest.mark.parametrize(
    "method",
    [b"POST", b"PUT", b"DELETE", b"PATCH", b"OPTIONS", b"TRACE", b"CONNECT", b"get"],
)
@pytest.mark.parametrize("target", [b"/metrics", b"*"])
def test_a_method_other_than_get_or_head_is_405_with_allow(
    where: Listener, method: bytes, target: bytes
) -> None:
    """RFC 9110, 15.5.6: a 405 MUST say in ``Allow`` what the target takes
    (methods are case-sensitive: ``get`` is not GET)."""
    answer = answer_of(exchange(where, method + b" " + target + b" HTTP/1.1\r\n\r\n"))
    assert answer.status == 405, answer
    assert answer.headers["allow"] == "GET, HEAD"


def test_head_is_the_get_without_its_body(where: Listener) -> None:
    answer = answer_of(
        exchange(where, b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n"), head_only=True
    )
    assert answer.status == 200
    assert answer.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert int(answer.headers["content-length"]) > 1000
    missing = exchange(where, b"HEAD /nothing HTTP/1.1\r\n\r\n")
    assert answer_of(missing, head_only=True).status == 404


@pytest.mark.parametrize(
    "fields",
    [
        b"X-Bytes: \xff\xfe\xc3\x28\r\n",
        b"X-Nul: a\x00b\r\n\x00: \x00\r\n",
        b"no colon here\r\n",
        b": no name\r\n",
        b"Host : x\r\n",  # space before the colon
        b"  folded\r\n",
        b"".join(b"X-%d: v\r\n" % i for i in range(300)),  # many, under the limit
    ],
    ids=["invalid-utf8", "nul", "no-colon", "no-name", "space-colon", "fold", "300"],
)
def test_header_fields_are_not_read_and_the_scrape_is_answered(
    where: Listener, fields: bytes
) -> None:
    """The responder reads nothing past the request line: odd fields neither
    fail the scrape nor reach the log."""
    answer = exchange(where, b"GET /metrics HTTP/1.1\r\n" + fields + b"\r\n")
    assert answer_of(answer).status == 200


SMUGGLED = b"GET /nowhere HTTP/1.1\r\nHost: x\r\n\r\n"


@pytest.mark.parametrize(
    "request_bytes",
    [
        GET + GET,
        GET + b"HEAD /metrics HTTP/1.1\r\n\r\n",
        GET + SMUGGLED,
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
        % (len(SMUGGLED), SMUGGLED),
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"%x\r\n%s\r\n0\r\n\r\n" % (len(SMUGGLED), SMUGGLED),
        b"GET /metrics HTTP/1.1\r\nContent-Length: 100000\r\n\r\n" + b"b" * 100_000,
    ],
    ids=["two-gets", "get-head", "get-then-404", "length-body", "chunked-body", "big"],
)
def test_what_follows_the_head_is_never_a_second_answer(
    where: Listener, request_bytes: bytes
) -> None:
    """Pipelined requests, or a GET's body framed either way: one answer to
    the first head (``answer_of`` wants nothing after its body), and the
    connection closed."""
    assert answer_of(exchange(where, request_bytes)).status == 200


def test_a_half_close_after_the_request_still_gets_the_answer(where: Listener) -> None:
    assert answer_of(exchange(where, GET, shut=True)).status == 200


@pytest.mark.parametrize("read_first", [0, 64])
def test_a_client_that_resets_mid_answer_costs_nothing(
    where: Listener, read_first: int
) -> None:
    """SO_LINGER 0: the close is a reset, before the answer or in the middle
    of it (a small receive buffer keeps most of it unsent)."""
    with where.connect() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
        sock.sendall(GET)
        if read_first:
            assert sock.recv(read_first).startswith(b"HTTP/1.1 200 ")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def test_connections_past_the_cap_are_closed_and_the_next_scrape_served(
    where: Listener, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``CONNECTIONS_MAX`` silent connections held: the next one is closed
    unanswered at once; once they go, scrapes are served again (the fixture)."""
    monkeypatch.setattr("memorizzd.telemetry.http.HEAD_TIMEOUT_S", READ_S)
    with contextlib.ExitStack() as held:
        for _ in range(CONNECTIONS_MAX):
            sock = held.enter_context(where.connect())
            sock.sendall(b"GET /metrics HTTP/1.1\r\n")  # never finished
        started = time.monotonic()
        assert exchange(where, GET, answered=False) == b""  # past the cap
        assert time.monotonic() - started < HEAD_TIMEOUT_S
        # the last one held is being answered: finishing its head is served
        sock.sendall(b"\r\n")
        assert answer_of(_read_all(sock)).status == 200


def test_a_listener_full_of_connections_leaves_the_other_one_serving(
    daemon: Metered, where: Listener, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The TCP listener takes any local process; ``metrics.sock`` only
    operators. Connections held on one listener do not close the other's
    scrapes: a non-operator filling the TCP listener's slots shut the
    operator's ``memorizzctl daemon metrics`` out."""
    monkeypatch.setattr("memorizzd.telemetry.http.HEAD_TIMEOUT_S", READ_S)
    other = daemon.tcp if where is daemon.unix else daemon.unix
    with contextlib.ExitStack() as held:
        for _ in range(CONNECTIONS_MAX):
            held.enter_context(where.connect()).sendall(b"GET /metrics HTTP/1.1\r\n")
        assert exchange(where, GET, answered=False) == b""  # that one is full
        assert status(other, GET) == 200


def _read_all(sock: socket.socket) -> bytes:
    received = b""
    while chunk := sock.recv(1 << 16):
        received += chunk
    return received


@needs_root
def test_a_non_operator_is_refused_on_the_socket_and_served_on_tcp(
    daemon: Metered,
) -> None:
    """``metrics.sock`` admits whom the operator socket admits (peer
    credentials): nobody, with the socket's group so that it can connect at
    all, is closed unanswered. The TCP listener has no admission (any local
    process may scrape it: docs/operations.md, "Metrics")."""

    def scrape(listener: Listener) -> str:
        unix = listener is daemon.unix  # refused unanswered
        return exchange(listener, GET, answered=not unix).decode("latin-1")

    gid = os.stat(daemon.unix.address).st_gid  # type: ignore[arg-type]
    (kind, unix) = as_user(lambda: scrape(daemon.unix), uid=NOBODY, gid=gid)
    assert (kind, unix) == ("ok", "")
    (kind, tcp) = as_user(lambda: scrape(daemon.tcp), uid=NOBODY, gid=NOBODY)
    assert kind == "ok"
    assert answer_of(tcp.encode("latin-1")).status == 200


def test_input_after_the_request_does_not_reset_the_client(where: Listener) -> None:
    """A second request pipelined behind the first and more bytes after it,
    all written before the client reads: the client reads the one answer
    and then the end of the connection, not a reset. Closed with those bytes
    unread, the connection would be reset, and a reset may cost a client its
    answer (RFC 9112 9.6): the daemon half-closes and reads what is left first."""
    for extra in (10_000, 200_000):
        with where.connect() as sock:
            sock.sendall(GET + GET + b"x" * extra)
            _pause.wait(0.2)  # the daemon has answered by now
            try:
                received = _read_all(sock)
            except ConnectionResetError:
                pytest.fail("the connection was reset: the client's bytes went unread")
        assert answer_of(received).status == 200
