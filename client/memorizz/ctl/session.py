"""Sessions on the MCP face's socket, for the HTTP bridge (``memorizz.ctl.serve_http``).

A ``Session`` is one connection to ``mcp.sock``: requests from any thread are
written to it as lines (one at a time), and a reader thread hands each answer
to the request whose ``id`` it carries. When the daemon closes the
connection, every waiting request is woken without an answer (``SessionGoneError``).
What the daemon says outside an answer has nowhere to go: a notification is
dropped, a request of its own is answered ``-32601`` at once, so an upstream
waiting on it is not kept waiting.

``Sessions`` keeps them by id (a random token), at most ``limit`` of them;
when full, sessions idle for ``IDLE_S`` make room.

Standard library and msgspec only.
"""

from __future__ import annotations

import _socket
import queue
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from typing import Final

import msgspec

from memorizz.ctl.serve import Bridge, scope_line

MAX_SESSIONS: Final = 64
IDLE_S: Final = 600.0

_CHUNK: Final = 1 << 16

RequestId = int | str


class _Token(msgspec.Struct, rename="camel"):
    progress_token: RequestId | None = None


class _Meta(msgspec.Struct):
    meta: _Token | None = msgspec.field(default=None, name="_meta")


class _Progress(msgspec.Struct, rename="camel"):
    progress_token: RequestId | None = None


class Message(msgspec.Struct):
    """What the bridge reads of a message: the rest goes through unread."""

    id: RequestId | msgspec.UnsetType | None = msgspec.UNSET
    method: str | msgspec.UnsetType = msgspec.UNSET
    params: msgspec.Raw = msgspec.field(default_factory=lambda: msgspec.Raw(b"{}"))

    def progress_token(self) -> RequestId | None:
        """A request's ``params._meta.progressToken``, or a progress
        notification's ``params.progressToken`` (None: none)."""
        try:
            if self.method == "notifications/progress":
                return msgspec.json.decode(self.params, type=_Progress).progress_token
            meta = msgspec.json.decode(self.params, type=_Meta).meta
        except (msgspec.ValidationError, msgspec.DecodeError):
            return None
        return None if meta is None else meta.progress_token


class Outcome(msgspec.Struct):
    """Whether an answer is an error."""

    error: dict[str, object] | None = None


decode = msgspec.json.Decoder(Message).decode
decode_outcome = msgspec.json.Decoder(Outcome).decode


class SessionGoneError(Exception):
    """The session's connection is closed: its id is 404 from now on."""


class FaceUnreachableError(Exception):
    """mcp.sock refused a new connection (the message says why)."""


class DuplicateIdError(Exception):
    """A request reuses the id of one still waiting in its session."""


class _Waiter:
    __slots__ = ("done", "notes", "reply", "token")

    def __init__(self, token: RequestId | None = None) -> None:
        self.done = threading.Event()
        self.reply: bytes | None = None
        self.token = token
        """The request's progressToken: its progress notifications come here."""
        self.notes: queue.SimpleQueue[bytes | None] | None = None
        """While the request is streamed: its notifications, then None."""


class Session:
    """One connection to mcp.sock, and the requests waiting for its answers."""

    def __init__(
        self,
        sock: _socket.socket,
        on_close: Callable[[Session], None] | None = None,
    ) -> None:
        self.sock = sock
        self.last_used = time.monotonic()
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()
        self._waiting: dict[RequestId, _Waiter] = {}
        self._closed = False
        self._on_close = on_close
        threading.Thread(target=self._read, daemon=True).start()

    @property
    def busy(self) -> bool:
        return bool(self._waiting)

    def send(self, line: bytes) -> None:
        with self._send_lock:
            if self._closed:
                raise SessionGoneError
            try:
                self.sock.sendall(line)
            except OSError:
                raise SessionGoneError from None

    def ask_streamed(
        self, request_id: RequestId, line: bytes, token: RequestId
    ) -> Iterator[bytes]:
        """Write ``line``; yield each progress notification of ``token`` as it
        comes, then the line that answers ``request_id``."""
        waiter = _Waiter(token)
        waiter.notes = queue.SimpleQueue()
        with self._lock:
            if self._closed:
                raise SessionGoneError
            if request_id in self._waiting:
                raise DuplicateIdError
            self._waiting[request_id] = waiter
        try:
            self.send(line)
            while (note := waiter.notes.get()) is not None:
                yield note
        finally:
            with self._lock:
                self._waiting.pop(request_id, None)
            self.last_used = time.monotonic()
        if waiter.reply is None:
            raise SessionGoneError
        yield waiter.reply

    def ask(self, request_id: RequestId, line: bytes) -> bytes:
        """Write ``line``, and return the line that answers ``request_id``."""
        waiter = _Waiter()
        with self._lock:
            if self._closed:
                raise SessionGoneError
            if request_id in self._waiting:
                raise DuplicateIdError
            self._waiting[request_id] = waiter
        try:
            self.send(line)
            waiter.done.wait()
        finally:
            with self._lock:
                self._waiting.pop(request_id, None)
            self.last_used = time.monotonic()
        if waiter.reply is None:
            raise SessionGoneError
        return waiter.reply

    def close(self) -> None:
        try:
            self.sock.shutdown(_socket.SHUT_RDWR)
        except OSError:
            pass

    def _read(self) -> None:
        pending = b""
        try:
            while data := self.sock.recv(_CHUNK):
                *lines, pending = (pending + data).split(b"\n")
                for line in lines:
                    self._answer(line.rstrip(b"\r"))
        except OSError:
            pass
        with self._lock:
            self._closed = True
            waiting = list(self._waiting.values())
        for waiter in waiting:
            waiter.done.set()
            if waiter.notes is not None:
                waiter.notes.put(None)
        self.sock.close()
        if self._on_close is not None:
            self._on_close(self)

    def _answer(self, line: bytes) -> None:
        try:
            message = decode(line)
        except msgspec.DecodeError:
            return
        if not isinstance(message.method, msgspec.UnsetType):
            # A call's progress goes to its streamed answer; other requests and
            # notifications of the daemon's have no stream to travel on (no GET
            # stream): a request is told so at once.
            if message.method == "notifications/progress":
                token = message.progress_token()
                with self._lock:
                    found = [
                        w
                        for w in self._waiting.values()
                        if w.notes is not None
                        and token is not None
                        and w.token == token
                    ]
                for streamed in found:
                    if streamed.notes is not None:
                        streamed.notes.put(line)
                return
            if isinstance(message.id, int | str):
                refusal = msgspec.json.encode(
                    {
                        "jsonrpc": "2.0",
                        "id": message.id,
                        "error": {
                            "code": -32601,
                            "message": "this client's HTTP transport takes no requests",
                        },
                    }
                )
                try:
                    self.send(refusal + b"\n")
                except SessionGoneError:
                    pass
            return
        if isinstance(message.id, int | str):
            with self._lock:
                waiter = self._waiting.get(message.id)
            if waiter is not None:
                waiter.reply = line
                waiter.done.set()
                if waiter.notes is not None:
                    waiter.notes.put(None)


class Sessions:
    """The live sessions by id, at most ``limit`` of them."""

    def __init__(self, bridge: Bridge, limit: int = MAX_SESSIONS) -> None:
        self.bridge = bridge
        self.limit = limit
        self._lock = threading.Lock()
        self._by_id: dict[str, Session] = {}

    def open(self) -> tuple[str, Session] | None:
        """A new session, or ``None`` when full (``FaceUnreachableError``: no daemon)."""
        sock = connect(self.bridge)
        session_id = secrets.token_urlsafe(24)
        with self._lock:
            if len(self._by_id) >= self.limit and not self._evict_idle():
                sock.close()
                return None
            session = Session(sock, lambda s: self._forget(session_id, s))
            self._by_id[session_id] = session
        return session_id, session

    def get(self, session_id: str) -> Session | None:
        with self._lock:
            return self._by_id.get(session_id)

    def end(self, session_id: str) -> bool:
        with self._lock:
            session = self._by_id.pop(session_id, None)
        if session is None:
            return False
        session.close()
        return True

    def _forget(self, session_id: str, session: Session) -> None:
        with self._lock:
            if self._by_id.get(session_id) is session:
                del self._by_id[session_id]

    def _evict_idle(self) -> bool:
        now = time.monotonic()
        idle = [
            (sid, s)
            for sid, s in self._by_id.items()
            if not s.busy and now - s.last_used > IDLE_S
        ]
        for sid, s in idle:
            del self._by_id[sid]
            s.close()
        return bool(idle)


def connect(bridge: Bridge) -> _socket.socket:
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.connect(bridge.mcp_socket)
    except OSError as exc:
        sock.close()
        raise FaceUnreachableError(
            f"cannot reach memorizzd's MCP socket at {bridge.mcp_socket}:"
            f" {exc.strerror or exc}"
        ) from None
    if bridge.server is not None:  # --server NAME: before anything of the client's
        try:
            sock.sendall(scope_line(bridge.server))
        except OSError as exc:
            sock.close()
            raise FaceUnreachableError(
                f"cannot reach memorizzd's MCP socket at {bridge.mcp_socket}: {exc}"
            ) from None
    return sock


def one_shot(bridge: Bridge, request_id: RequestId, line: bytes) -> bytes:
    """A request outside any session: its own connection, closed after the answer."""
    session = Session(connect(bridge))
    try:
        return session.ask(request_id, line)
    finally:
        session.close()
