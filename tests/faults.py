"""Faults at the edge of the world, between the daemon and a real MCP server
(what Toxiproxy would do, in-process): a slow drip on stdio and over HTTP, an
HTTP upstream that answers 429/503 with ``Retry-After``, a listener that
accepts and never answers, requests that hang, responses cut mid-way, a
server that forgets its sessions (404) and SSE streams dropped mid-response;
and in front of an HTTP server of ours, a relay that breaks one connection
mid-stream (``cutting_proxy``). And the ASGI plumbing of every test
middleware (this module's, tests/oauth_world.py's, the batteries' own): a
request's body read and handed on (``read_body``, ``replaying``), an app's
answer captured (``captured``), an answer sent in one go (``respond``).

    python tests/faults.py drip RATE -- CMD ARG...   # stdio: CMD's big lines at RATE bytes/s

``drip`` relays a stdio server's stdout and sends every line longer than
``DRIP_OVER`` bytes at ``RATE`` bytes a second (1 KiB pieces), as a slow link
would: each read makes progress, the message takes minutes. Lines behind it
wait (one pipe). stdin and stderr are the child's own.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import socket
import subprocess
import sys
import threading
from collections.abc import Awaitable, Callable, Iterable, Iterator, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import anyio
import msgspec

DRIP_OVER = 16 * 1024
PIECE = 1024

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


def dripping(app: App, *, rate: int = 1024) -> App:
    """ASGI: send every response body part longer than ``DRIP_OVER`` at
    ``rate`` bytes a second (SSE events included); the rest at once."""

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return

        async def slow_send(message: Message) -> None:
            body = message.get("body", b"")
            if message["type"] != "http.response.body" or len(body) <= DRIP_OVER:
                await send(message)
                return
            for start in range(0, len(body), PIECE):
                piece = body[start : start + PIECE]
                await send(
                    {"type": "http.response.body", "body": piece, "more_body": True}
                )
                await anyio.sleep(len(piece) / rate)
            more = message.get("more_body", False)
            await send({"type": "http.response.body", "body": b"", "more_body": more})

        await app(scope, receive, slow_send)

    return wrapped


class _Call(msgspec.Struct):
    method: str = ""
    params: dict[str, Any] = {}


Match = Callable[[str, dict[str, Any]], bool]


def _never(method: str, params: dict[str, Any]) -> bool:
    return False


def _decoded(body: bytes) -> _Call | None:
    try:
        return msgspec.json.decode(body, type=_Call)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


async def read_body(receive: Receive) -> bytes:
    """A request's whole body."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


def replaying(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands the app the body already read, then the rest."""
    replayed = False

    async def replay() -> Message:
        nonlocal replayed
        if replayed:
            return await receive()
        replayed = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


async def captured(app: App, scope: Scope, receive: Receive) -> tuple[int, bytes]:
    """What ``app`` answers (status, body), not yet sent."""
    messages: list[Message] = []

    async def capture(message: Message) -> None:
        messages.append(message)

    await app(scope, receive, capture)
    body = b"".join(m.get("body", b"") for m in messages[1:])
    return messages[0]["status"], body


async def respond(
    send: Send,
    status: int,
    body: bytes = b"",
    headers: Iterable[tuple[bytes, bytes]] = (),
) -> None:
    """One answer: ``status``, ``headers`` and a ``Content-Length``, ``body``."""
    length = (b"content-length", str(len(body)).encode())
    start = {"type": "http.response.start", "status": status}
    await send({**start, "headers": [*headers, length]})
    await send({"type": "http.response.body", "body": body})


async def _wait_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


@dataclass
class _PostFault:
    """What the faults on POSTs share: which JSON-RPC requests they match
    (``tool``, ``method``), and ``seen``, how many matching ones arrived."""

    matches: Match = _never
    seen: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def tool(self, name: str) -> Any:
        self.matches = lambda method, params: (
            method == "tools/call" and params.get("name") == name
        )
        return self

    def method(self, name: str) -> Any:
        self.matches = lambda method, params: method == name
        return self

    def _next_of(self, body: bytes, used: str) -> bool:
        """Whether ``body`` matches and is one of the first ``self.times``
        to (counted in ``seen``, and in the field named ``used``)."""
        if not self._arrived(body):
            return False
        with self._lock:
            if getattr(self, used) >= getattr(self, "times"):  # noqa: B009
                return False
            setattr(self, used, getattr(self, used) + 1)
            return True

    def _arrived(self, body: bytes) -> bool:
        """Whether ``body`` matches (counted in ``seen``)."""
        call = _decoded(body)
        if call is None or not self.matches(call.method, call.params):
            return False
        with self._lock:
            self.seen += 1
        return True

    def _on_posts(self, app: App, hit: Callable[[bytes], bool], fault: App) -> App:
        """ASGI: ``app``, except that a POST whose body ``hit`` accepts (e.g.
        ``_arrived``) goes to ``fault``; either can receive the body again."""

        async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != "http" or scope["method"] != "POST":
                await app(scope, receive, send)
                return
            body = await read_body(receive)
            to = fault if hit(body) else app
            await to(scope, replaying(body, receive), send)

        return wrapped


@dataclass
class Seen(_PostFault):
    """ASGI: no fault, a count: ``seen`` of the POSTs whose request matches."""

    def wrap(self, app: App) -> App:
        return self._on_posts(app, self._arrived, app)  # counted, then served


@dataclass
class Busy(_PostFault):
    """ASGI: answer ``status`` with ``Retry-After: retry_after`` to the next
    ``times`` POSTs whose JSON-RPC request ``matches`` (e.g. a tool name);
    everything else reaches the real server. ``seen`` counts the matching
    requests that arrived, answered busy or not."""

    status: int = 429
    retry_after: str | None = "1"
    times: int = 1
    busy_answers: int = 0

    def wrap(self, app: App) -> App:
        async def busy(scope: Scope, receive: Receive, send: Send) -> None:
            headers = [(b"content-type", b"text/plain")]
            if self.retry_after is not None:
                headers.append((b"retry-after", self.retry_after.encode()))
            await send(
                {
                    "type": "http.response.start",
                    "status": self.status,
                    "headers": headers,
                }
            )
            await send({"type": "http.response.body", "body": b"busy"})

        return self._on_posts(app, self._busy_now, busy)

    def _busy_now(self, body: bytes) -> bool:
        return self._next_of(body, "busy_answers")


@dataclass
class Hang(_PostFault):
    """ASGI: a POST whose JSON-RPC request ``matches`` is read and never
    answered, not one byte, until the client goes away (Toxiproxy's
    ``timeout=0`` after connect). While ``everything`` is set, every request
    hangs so (GET streams, pings, handshakes included): a server that is up
    but stuck. ``seen`` counts the matching requests that arrived."""

    everything: bool = False
    times: int | None = None
    """Hang only the first ``times`` matching requests (None: all of them)."""
    accept: bool = False
    """Answer the POST ``202 Accepted`` at once and drop the request (legacy
    SSE: the answer would come on the stream, and never does)."""

    def wrap(self, app: App) -> App:
        async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != "http":
                await app(scope, receive, send)
                return
            if self.everything:
                await _wait_disconnect(receive)
                return
            if scope["method"] != "POST":
                await app(scope, receive, send)
                return
            body = await read_body(receive)
            if self._arrived(body) and (self.times is None or self.seen <= self.times):
                if self.accept:
                    await send({"type": "http.response.start", "status": 202})
                    await send({"type": "http.response.body", "body": b"Accepted"})
                    return
                await _wait_disconnect(receive)
                return
            await app(scope, replaying(body, receive), send)

        return wrapped


@dataclass
class Cut(_PostFault):
    """ASGI: the response to the next ``times`` POSTs whose request
    ``matches`` is cut mid-way (Toxiproxy's ``limit_data``): the server runs
    the request and answers, the client gets the status line and headers
    (a JSON answer's ``content-length`` included) and the first half of the
    first body part (an SSE answer: half its ``data:`` line), then the
    connection is closed. ``seen`` counts the matching requests that arrived."""

    times: int = 1
    cuts: int = 0

    def wrap(self, app: App) -> App:
        async def cut_short(scope: Scope, receive: Receive, send: Send) -> None:
            cut = False

            async def cutting(message: Message) -> None:
                nonlocal cut
                part = message.get("body", b"")
                if cut or (message["type"] == "http.response.body" and not part):
                    return
                if message["type"] != "http.response.body":
                    await send(message)
                    return
                cut = True
                half = {"type": "http.response.body", "body": part[: len(part) // 2]}
                await send(half | {"more_body": True})

            # The rest of the answer is thrown away; returning with the
            # response incomplete makes the server close the connection.
            await app(scope, receive, cutting)

        return self._on_posts(app, self._cut_now, cut_short)

    def _cut_now(self, body: bytes) -> bool:
        return self._next_of(body, "cuts")


@dataclass
class WrongId(_PostFault):
    """ASGI: the answer to the next POST whose request ``matches`` carries
    another id than the request's (the server runs it; the answer, JSON or
    an event stream, has ``"id":N`` turned into ``"id":N+1000``, a string
    id into another); ``times``
    such answers, then the server's own."""

    times: int = 1
    wrongs: int = 0

    def wrap(self, app: App) -> App:
        async def wrong(scope: Scope, receive: Receive, send: Send) -> None:
            async def renumbered(message: Message) -> None:
                if message["type"] == "http.response.body":
                    body = re.sub(
                        rb'"id":\s*(?:(\d+)|"([^"]*)")',
                        lambda m: (
                            b'"id":%d' % (int(m.group(1)) + 1000)
                            if m.group(1) is not None
                            else b'"id":"%s-other"' % m.group(2)
                        ),
                        message.get("body", b""),
                        count=1,
                    )
                    message = message | {"body": body}
                elif message["type"] == "http.response.start":
                    message = message | {
                        "headers": [
                            (k, v)
                            for k, v in message["headers"]
                            if k.lower() != b"content-length"
                        ]
                    }
                await send(message)

            await app(scope, receive, renumbered)

        return self._on_posts(app, self._wrong_now, wrong)

    def _wrong_now(self, body: bytes) -> bool:
        return self._next_of(body, "wrongs")


SESSION_NOT_FOUND = {
    # What a server answers for a session it no longer knows (HTTP 404).
    "python_sdk": (
        b"application/json",
        (
            b'{"jsonrpc":"2.0","id":null,"error":'
            b'{"code":-32600,"message":"Session not found"}}'
        ),
    ),
    "typescript_sdk": (
        b"application/json",
        (
            b'{"jsonrpc":"2.0","error":{"code":-32001,"message":"Session not found"},'
            b'"id":null}'
        ),
    ),
    "bare": (b"text/plain", b"Not Found"),
}


@dataclass
class SessionLoss(_PostFault):
    """ASGI: after ``forget()``, every request that carries a session id the
    server had issued is answered 404 with ``answer`` (a key of
    ``SESSION_NOT_FOUND``), as by a server that restarted or expired the
    session; a new session (``initialize``) is served. ``seen`` counts the
    matching requests that reached the server; ``refused``, the 404s."""

    answer: str = "python_sdk"
    refused: int = 0
    issued: set[str] = field(default_factory=set)
    forgotten: set[str] = field(default_factory=set)

    def forget(self) -> None:
        with self._lock:
            self.forgotten |= self.issued

    def wrap(self, app: App) -> App:
        async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != "http":
                await app(scope, receive, send)
                return
            headers = dict(scope["headers"])
            if headers.get(b"mcp-session-id", b"").decode() in self.forgotten:
                with self._lock:
                    self.refused += 1
                content_type, text = SESSION_NOT_FOUND[self.answer]
                start = {"type": "http.response.start", "status": 404}
                await send(start | {"headers": [(b"content-type", content_type)]})
                await send({"type": "http.response.body", "body": text})
                return

            async def noting(message: Message) -> None:
                if message["type"] == "http.response.start":
                    for name, value in message.get("headers", []):
                        if name.lower() == b"mcp-session-id":
                            with self._lock:
                                self.issued.add(value.decode())
                await send(message)

            if scope["method"] != "POST":
                await app(scope, receive, noting)
                return
            body = await read_body(receive)
            self._arrived(body)
            await app(scope, replaying(body, receive), noting)

        return wrapped


@dataclass
class DropStream(_PostFault):
    """ASGI: the SSE answer to the next POST whose request ``matches`` ends
    after its first event (with an event store, the priming event, which
    carries an id): the client must resume with GET and ``Last-Event-ID``.
    ``abrupt``: the connection is closed without ending the response
    (a dropped stream) instead of the stream being closed cleanly. The server
    goes on and its events land in its event store. ``seen`` counts the
    matching requests that arrived; ``resumed``, GETs with a Last-Event-ID."""

    abrupt: bool = False
    dropped: int = 0
    resumed: int = 0

    def wrap(self, app: App) -> App:
        async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != "http":
                await app(scope, receive, send)
                return
            if scope["method"] != "POST":
                if b"last-event-id" in dict(scope["headers"]):
                    with self._lock:
                        self.resumed += 1
                await app(scope, receive, send)
                return
            body = await read_body(receive)
            if not self._arrived(body) or self.dropped:
                await app(scope, replaying(body, receive), send)
                return
            self.dropped += 1
            pending = bytearray()  # the first event, until it is whole
            ended = False

            async def dropping(message: Message) -> None:
                nonlocal ended
                if ended:
                    return
                if message["type"] != "http.response.body":
                    await send(message)
                    return
                pending.extend(message.get("body", b""))
                end = _first_event_end(bytes(pending))
                if end is None:
                    return
                ended = True
                part = {"type": "http.response.body", "body": bytes(pending[:end])}
                await send(part | {"more_body": True})
                if not self.abrupt:
                    await send({"type": "http.response.body", "body": b""})

            await app(scope, replaying(body, receive), dropping)

        return wrapped


def _first_event_end(stream: bytes) -> int | None:
    """Where the first SSE event in ``stream`` ends (after its blank line)."""
    ends = [
        i + len(sep) for sep in (b"\r\n\r\n", b"\n\n") if (i := stream.find(sep)) >= 0
    ]
    return min(ends) if ends else None


@contextlib.contextmanager
def silent_listener() -> Iterator[tuple[str, list[socket.socket]]]:
    """A TCP listener on 127.0.0.1 that accepts every connection and never
    answers (reads and drops what it is sent); yields ``http://127.0.0.1:PORT``
    and the connections accepted so far."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    port = listener.getsockname()[1]
    accepted: list[socket.socket] = []
    stop_r, stop_w = os.pipe()

    def serve() -> None:
        watched: list[Any] = [listener, stop_r]
        while True:
            readable, _, _ = select.select(watched, [], [])
            if stop_r in readable:
                return
            for ready in readable:
                if ready is listener:
                    conn, _ = listener.accept()
                    accepted.append(conn)
                    watched.append(conn)
                elif not ready.recv(65536):
                    watched.remove(ready)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}", accepted
    finally:
        os.write(stop_w, b"x")
        thread.join(5)
        for conn in accepted:
            conn.close()
        listener.close()
        os.close(stop_r)
        os.close(stop_w)


@dataclass
class Cuts:
    """What ``cutting_proxy`` did: whether it cut, and every request's bytes
    (as sent by the client, per connection, in the order they connected)."""

    cut: threading.Event = field(default_factory=threading.Event)
    requests: list[bytearray] = field(default_factory=list)

    def heads(self, method: str) -> list[bytes]:
        """The heads of the ``method`` requests sent, on any connection (a
        kept connection carries several, each after the body before it),
        lower-cased."""
        line = re.compile(method.encode() + rb" /\S* HTTP/1\.1\r\n")
        return [
            sent[m.start() : sent.find(b"\r\n\r\n", m.start())].lower()
            for sent in map(bytes, self.requests)
            for m in line.finditer(sent)
        ]


@contextlib.contextmanager
def cutting_proxy(target: str, marker: bytes) -> Iterator[tuple[str, Cuts]]:
    """A TCP relay on 127.0.0.1 to ``target`` (``http://127.0.0.1:PORT...``)
    that breaks one connection: the first whose response bytes hold
    ``marker`` is closed, both ways, right after the piece that holds it is
    relayed (a network lost mid-stream). A request's ``Host`` is the target's,
    as a reverse proxy in front of it would send (the bridge serves its own
    Host only); every other byte passes as it is. Yields ``target`` with the
    relay's port in place of its own."""
    head, _, rest = target.partition("//")
    host_port, slash, path = rest.partition("/")
    port = int(host_port.rsplit(":", 1)[1])
    named = b"Host: " + host_port.encode()
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    cuts = Cuts()
    conns: list[socket.socket] = []

    def pump(src: socket.socket, dst: socket.socket, seen: bytearray | None) -> None:
        with contextlib.suppress(OSError):
            while chunk := src.recv(65536):
                if seen is not None:  # a request: named for the target
                    seen += chunk
                    dst.sendall(re.sub(rb"(?im)^host: [^\r\n]*", named, chunk))
                    continue
                dst.sendall(chunk)
                if not cuts.cut.is_set() and marker in chunk:
                    cuts.cut.set()
                    break
        for end in (src, dst):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)

    def serve() -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # closed
            upstream = socket.create_connection(("127.0.0.1", port))
            conns.extend((client, upstream))
            cuts.requests.append(seen := bytearray())
            for args in ((client, upstream, seen), (upstream, client, None)):
                threading.Thread(target=pump, args=args, daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"{head}//127.0.0.1:{listener.getsockname()[1]}{slash}{path}", cuts
    finally:
        with contextlib.suppress(OSError):
            listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        thread.join(5)
        for conn in conns:
            conn.close()


def _drip_main(rate: int, argv: list[str]) -> int:
    child = subprocess.Popen(argv, stdout=subprocess.PIPE)
    assert child.stdout is not None
    out = sys.stdout.buffer
    line = bytearray()
    pause = threading.Event()  # never set: a wait that is a sleep
    while chunk := os.read(child.stdout.fileno(), 65536):
        line += chunk
        while (end := line.find(b"\n")) >= 0:
            message, line = bytes(line[: end + 1]), line[end + 1 :]
            if len(message) <= DRIP_OVER:
                out.write(message)
                out.flush()
                continue
            for start in range(0, len(message), PIECE):
                out.write(message[start : start + PIECE])
                out.flush()
                pause.wait(PIECE / rate)
    return child.wait()


if __name__ == "__main__":
    if len(sys.argv) < 4 or sys.argv[1] != "drip" or sys.argv[3] != "--":
        sys.exit(__doc__)
    sys.exit(_drip_main(int(sys.argv[2]), sys.argv[4:]))
