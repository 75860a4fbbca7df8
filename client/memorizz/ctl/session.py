"""Sessions on the MCP face's socket, for the HTTP bridge (``memorizz.ctl.serve_http``).

A ``Session`` is one connection to ``mcp.sock``: requests from any thread are
written to it as lines (one at a time), and a reader thread hands each answer
to the request whose ``id`` it carries. What the daemon sends before an
answer (progress, log messages, an upstream's requests during a call) goes to
the request in flight it belongs to, and the rest to the session's GET stream
(``Session`` says how each is told). When the daemon closes the connection,
every waiting request is woken without an answer (``SessionGoneError``) and
the GET stream ends.

``Sessions`` keeps them by id (a random token), at most ``limit`` of them;
when full, sessions idle for ``IDLE_S`` make room.

Standard library and msgspec only.
"""

from __future__ import annotations

import _socket
import collections
import itertools
import queue
import secrets
import threading
import time
from collections.abc import Callable, Generator
from typing import Final

import msgspec

from memorizz.api import mcp_meta
from memorizz.api.digits import ascii_int
from memorizz.ctl.serve import Bridge, Refused, check_refusal, scope_line

MAX_SESSIONS: Final = 64
IDLE_S: Final = 600.0
BACKLOG: Final = 256
"""Notifications kept for a GET stream not open yet (the oldest go first)."""
MAX_HELD: Final = 64
HELD_S: Final = 600.0
"""Sessionless connections held for a retry (``Sessionless``): how many, how long."""
KEEPALIVE_S: Final = 15.0
"""A GET stream silent this long gets a comment: a client that left is seen."""
RESUME_S: Final = 60.0
"""A request whose client left its event stream before the answer is kept this
long for the client to come back for the rest (``Last-Event-ID``)."""
GONE_POLL_S: Final = 0.5
"""How often a request outside a session looks whether its client closed its
connection (at 2026-07-28 how a client over HTTP cancels a request)."""
GONE_READ_S: Final = 1.0
"""When a write finds the connection closed, how long to wait for the reader
to read what the daemon sent before its close (a refusal, said as such)."""
RESUME_WAIT_S: Final = 5.0
"""How long a resumption waits for the stream's old reader to let go."""
QUIET_METHODS: Final = frozenset(
    {
        "initialize",
        "ping",
        "tools/list",
        "resources/list",
        "resources/templates/list",
        "prompts/list",
        "logging/setLevel",
        "resources/subscribe",
        "resources/unsubscribe",
        "completion/complete",
        "server/discover",
        "tasks/get",
        "tasks/list",
        "tasks/cancel",
    }
)
"""Requests during which the daemon asks the client nothing: never the one call
in flight that an upstream's request or log message is sent with."""

_CHUNK: Final = 1 << 16
_TAKEN: Final = b"\n"
"""Put in a request's events when a resumption takes it over (no line of the
daemon's is a newline): its old reader lets go there."""

_RESUMING: Final = object()
"""A request's reader while a resumption takes it over."""

RequestId = int | str
Event = tuple[bool, bytes, str]
"""What a request hears: ``(final, line, event id)``; the answer is final; a
line ``b""`` is a keep-alive (no id)."""


class _Token(msgspec.Struct, rename="camel"):
    progress_token: RequestId | None = None


class _Meta(msgspec.Struct):
    meta: _Token | None = msgspec.field(default=None, name="_meta")


class _Subscription(msgspec.Struct):
    id: RequestId | None = msgspec.field(default=None, name=mcp_meta.SUBSCRIPTION_ID)


class _Stamped(msgspec.Struct):
    meta: _Subscription | None = msgspec.field(default=None, name="_meta")


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

    def subscription_id(self) -> RequestId | None:
        """The listen stream a 2026-07-28 notification belongs to (its
        ``params._meta`` subscription id: the ``subscriptions/listen``
        request's id), or None."""
        try:
            meta = msgspec.json.decode(self.params, type=_Stamped).meta
        except (msgspec.ValidationError, msgspec.DecodeError):
            return None
        return None if meta is None else meta.id


class Outcome(msgspec.Struct):
    """Whether an answer is an error."""

    error: dict[str, object] | None = None


decode = msgspec.json.Decoder(Message).decode
decode_outcome = msgspec.json.Decoder(Outcome).decode


class SessionGoneError(Exception):
    """The session's connection is closed: its id is 404 from now on."""


class RefusedError(SessionGoneError):
    """The daemon refused the connection itself (this uid may not use the
    socket, or it has too many connections): its words, and the bridge's
    exit status for them (``memorizz.ctl.serve.Refused``)."""

    def __init__(self, refused: Refused) -> None:
        super().__init__(str(refused))
        self.status = refused.status


class FaceUnreachableError(Exception):
    """mcp.sock refused a new connection (the message says why)."""


class DuplicateIdError(Exception):
    """A request reuses the id of one still waiting in its session."""


class _Waiter:
    """A request waiting for its answer, and what comes before it."""

    __slots__ = (
        "cancelled",
        "count",
        "events",
        "left_at",
        "method",
        "number",
        "reader",
        "released",
        "reply",
        "sent",
        "streams",
        "token",
    )

    def __init__(
        self, method: str, token: RequestId | None, streams: bool, number: int
    ) -> None:
        self.method = method
        self.token = token
        """The request's progressToken: its progress notifications come here."""
        self.cancelled = False
        """Its client cancelled it: if no answer comes, none is owed."""
        self.streams = streams
        """Whether its client takes an event stream (else: only the answer)."""
        self.number = number
        """Its stream's number in the session: its events' ids are NUMBER-SEQ."""
        self.events: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        """What the daemon sends it before the answer, then None."""
        self.reply: bytes | None = None
        self.sent: collections.deque[bytes] = collections.deque(maxlen=BACKLOG)
        """The last events handed to its client (for a resumption)."""
        self.count = 0
        """How many events were handed to its client (the last one's SEQ)."""
        self.reader: object | None = None
        """Who reads its events now (None: nobody: its client left)."""
        self.released = threading.Event()
        """Set while nobody reads its events."""
        self.left_at: float | None = None
        """When its client left before the answer (kept for a resumption)."""

    def event_id(self, seq: int) -> str:
        return f"{self.number}-{seq}"


class Stream:
    """The session's standalone stream (an HTTP GET): what the daemon sends
    that belongs to no request in flight. Its events are numbered (``0-SEQ``)
    across the GETs of a session, so a GET with a ``Last-Event-ID`` gets again
    what a dropped one may have missed (the last ``BACKLOG``)."""

    __slots__ = ("_session", "events", "priming_id", "replay")

    def __init__(
        self, session: Session, replay: list[tuple[bytes, str]], sent: int
    ) -> None:
        self._session = session
        self.events: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self.replay = replay
        """Events sent before, sent again first (a resumption)."""
        self.priming_id = f"0-{sent}"
        """The id of the last event the session's GET streams sent before this one."""

    def next(self, timeout: float) -> tuple[bytes, str] | None:
        """The next line and its event id; ``(b"", "")`` when none came within
        ``timeout``; None once the stream is ended (the session closed, or a
        newer GET took over)."""
        if self.replay:
            return self.replay.pop(0)
        try:
            line = self.events.get(timeout=timeout)
        except queue.Empty:
            return b"", ""
        if line is None:
            return None
        return line, self._session.standalone_sent(line)


class _Cancelled(msgspec.Struct, rename="camel"):
    request_id: RequestId | None = None


_decode_cancelled = msgspec.json.Decoder(_Cancelled).decode
"""A ``notifications/cancelled``'s params."""


class Session:
    """One connection to mcp.sock, and the requests waiting for its answers.

    Where each line the daemon sends goes:

    * a response: to the request whose ``id`` it carries;
    * ``notifications/progress``: to the streamed request whose
      ``progressToken`` it names (none streamed: dropped);
    * a request of the daemon's (an upstream's ``elicitation/create`` or
      ``sampling/createMessage`` during a call) and ``notifications/message``:
      to the request in flight if exactly one may lead to them (any method but
      ``QUIET_METHODS``) and its client takes an event stream, else to the
      GET stream. A request with neither is refused at once (``-32603``), so
      the upstream is not kept waiting;
    * ``notifications/cancelled`` of such a request: where the request went;
    * any other notification (``list_changed``, ``resources/updated``,
      task status): to the GET stream; while none is open, the last
      ``BACKLOG`` of them wait for one.
    """

    def __init__(
        self,
        sock: _socket.socket,
        on_close: Callable[[Session], None] | None = None,
        *,
        where: str,
    ) -> None:
        self.sock = sock
        self._where = where
        """mcp.sock's path, as the daemon's refusal is said."""
        self.last_used = time.monotonic()
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()
        self._waiting: dict[RequestId, _Waiter] = {}
        self._stream: Stream | None = None
        self._backlog: collections.deque[bytes] = collections.deque(maxlen=BACKLOG)
        self._asked: dict[RequestId, _Waiter | Stream] = {}
        """The daemon's requests in flight, by id: where each went."""
        self._numbers = itertools.count(1)
        self._left: dict[int, tuple[RequestId, _Waiter]] = {}
        """Requests whose client left their stream before the answer, by number."""
        self._standalone: collections.deque[bytes] = collections.deque(maxlen=BACKLOG)
        self._standalone_count = 0
        """The last events of the GET streams, and how many there were."""
        self._closed = False
        self._refused: Refused | None = None
        """The daemon's refusal of the connection, if it sent one."""
        self._reader_done = threading.Event()
        self._on_close = on_close
        threading.Thread(target=self._read, daemon=True).start()

    @property
    def busy(self) -> bool:
        """Requests waiting, a GET stream open, or a stream its client may
        come back for (within ``RESUME_S``): not idle, not to be evicted."""
        with self._lock:
            self._expire_left()
            return bool(self._waiting) or self._stream is not None or bool(self._left)

    def send(self, line: bytes) -> None:
        with self._send_lock:
            if self._closed:
                raise self._gone()
            try:
                self.sock.sendall(line)
            except OSError:
                raise self._gone() from None

    def _gone(self) -> SessionGoneError:
        """Why the connection is over: the daemon's refusal (``RefusedError``),
        once the reader has read what came before the close, or its end."""
        self._reader_done.wait(GONE_READ_S)
        if self._refused is not None:
            return RefusedError(self._refused)
        return SessionGoneError()

    def cancel(self, message: Message, line: bytes) -> None:
        """Write the client's ``notifications/cancelled``; the request it
        names, if it waits here, is owed no answer (MCP: a cancelled request
        gets none): its exchange ends now, without one (its POST is closed
        while its client still reads: an answer to a request its client has
        given up, coming as the client closes, is one it may choke on)."""
        try:
            params: _Cancelled | None = _decode_cancelled(message.params)
        except (msgspec.ValidationError, msgspec.DecodeError):
            params = None
        self.send(line)
        if params is not None and params.request_id is not None:
            with self._lock:
                waiter = self._waiting.get(params.request_id)
                if waiter is not None and waiter.reply is None:
                    waiter.cancelled = True
                    waiter.events.put(None)

    def respond(self, response_id: RequestId, line: bytes) -> None:
        """Write the client's response to a request of the daemon's."""
        with self._lock:
            self._asked.pop(response_id, None)
        self.send(line)

    def exchange(
        self,
        request_id: RequestId,
        line: bytes,
        method: str,
        token: RequestId | None = None,
        *,
        streams: bool = True,
        keepalive_s: float | None = None,
        resumable: bool = False,
    ) -> Generator[Event]:
        """Write ``line``; yield ``(False, line, id)`` for each message the
        daemon sends this request before its answer (only if it ``streams``),
        then ``(True, answer, id)``. ``SessionGoneError``: the answer never
        came. ``keepalive_s``: after that long with nothing, ``(False, b"",
        "")`` (a long-lived stream's keep-alive, by which a client that left
        is seen). ``resumable``: a client that leaves before the answer may
        come back for the rest (``resume``) within ``RESUME_S``."""
        waiter = _Waiter(method, token, streams, next(self._numbers))
        with self._lock:
            closed = self._closed
        if closed:
            raise self._gone()
        with self._lock:
            if request_id in self._waiting:
                raise DuplicateIdError
            self._expire_left()
            self._waiting[request_id] = waiter
        try:
            self.send(line)
        except SessionGoneError:
            with self._lock:
                self._waiting.pop(request_id, None)
            raise
        return self._follow(request_id, waiter, 0, keepalive_s, resumable)

    def resume(
        self, last_event_id: str, keepalive_s: float | None = None
    ) -> Generator[Event] | None:
        """The rest of a request's stream that its client left (a GET with
        ``Last-Event-ID``): the events after that one, then what comes, then
        the answer. None: no such stream here (it ended, or it was never
        this session's, or it waited past ``RESUME_S``). A stream whose old
        reader has not seen its client leave is taken from it."""
        number, seq = _event_number(last_event_id)
        if number <= 0:
            return None
        with self._lock:
            self._expire_left()
            left = self._left.pop(number, None)
            if left is None:
                for request_id, waiter in self._waiting.items():
                    if waiter.number == number and waiter.streams:
                        left = request_id, waiter
                        break
            if left is None:
                return None
            request_id, waiter = left
            waiter.left_at = None
            taking = waiter.reader is not None
            if taking:
                waiter.reader = _RESUMING  # its old reader lets go at _TAKEN
        if taking:
            waiter.events.put(_TAKEN)
        return self._follow(request_id, waiter, seq, keepalive_s, True, taking)

    def _follow(
        self,
        request_id: RequestId,
        waiter: _Waiter,
        after: int,
        keepalive_s: float | None,
        resumable: bool,
        taking: bool = False,
    ) -> Generator[Event]:
        """A request's events after ``after`` (those already sent again, from
        ``sent``), then its answer; read by one reader at a time."""
        me = object()
        if taking and not waiter.released.wait(RESUME_WAIT_S):
            raise SessionGoneError  # its old reader is stuck writing
        with self._lock:
            waiter.reader = me
            waiter.released.clear()
        finished = False
        try:
            for seq, sent in _after(waiter.sent, waiter.count, after):
                yield False, sent, waiter.event_id(seq)
            while True:
                try:
                    event = waiter.events.get(timeout=keepalive_s)
                except queue.Empty:
                    yield False, b"", ""
                    continue
                if event == _TAKEN:
                    if waiter.reader is not me:
                        return  # a resumption took this stream
                    continue
                if event is None:
                    break
                waiter.sent.append(event)
                waiter.count += 1
                yield False, event, waiter.event_id(waiter.count)
            finished = True
        finally:
            with self._lock:
                if waiter.reader is me:
                    waiter.reader = None
                    if not finished and resumable and waiter.streams:
                        waiter.left_at = time.monotonic()
                        self._left[waiter.number] = request_id, waiter
                    elif self._waiting.get(request_id) is waiter:
                        del self._waiting[request_id]
                waiter.released.set()  # under the lock: a new reader clears it after
            self.last_used = time.monotonic()
        if waiter.reply is None:
            if waiter.cancelled:
                return  # its client cancelled it: no answer is owed
            raise self._gone()
        yield True, waiter.reply, waiter.event_id(waiter.count + 1)

    def _expire_left(self) -> None:
        """Forget the requests left past ``RESUME_S`` (under the lock)."""
        now = time.monotonic()
        for number, (request_id, waiter) in list(self._left.items()):
            if waiter.left_at is not None and now - waiter.left_at > RESUME_S:
                del self._left[number]
                if self._waiting.get(request_id) is waiter:
                    del self._waiting[request_id]

    def ask(self, request_id: RequestId, line: bytes) -> bytes:
        """Write ``line``, and return the line that answers ``request_id``."""
        for final, event, _ in self.exchange(request_id, line, "", streams=False):
            if final:
                return event
        raise SessionGoneError  # not reached: exchange ends with the answer

    def open_stream(self, last_event_id: str | None = None) -> Stream:
        """The session's GET stream, from now on (one at a time: an older one
        ends): first the events after ``last_event_id`` that a GET stream
        carried before (those still kept), then what waited for a stream."""
        replay: list[tuple[bytes, str]] = []
        with self._lock:
            if self._closed:
                raise SessionGoneError
            if last_event_id is not None:
                number, seq = _event_number(last_event_id)
                if number == 0 and seq >= 0:
                    replay = [
                        (line, f"0-{n}")
                        for n, line in _after(
                            self._standalone, self._standalone_count, seq
                        )
                    ]
            stream = Stream(self, replay, self._standalone_count)
            if self._stream is not None:
                self._stream.events.put(None)
            self._stream = stream
            while self._backlog:
                stream.events.put(self._backlog.popleft())
        return stream

    def standalone_sent(self, line: bytes) -> str:
        """A GET stream sends ``line``: its event id (kept for a resumption)."""
        with self._lock:
            self._standalone.append(line)
            self._standalone_count += 1
            return f"0-{self._standalone_count}"

    def close_stream(self, stream: Stream) -> None:
        with self._lock:
            if self._stream is stream:
                self._stream = None
        self.last_used = time.monotonic()

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
        self._reader_done.set()
        with self._lock:
            self._closed = True
            waiting = list(self._waiting.values())
            self._waiting.clear()
            stream, self._stream = self._stream, None
        for waiter in waiting:
            waiter.events.put(None)
        if stream is not None:
            stream.events.put(None)
        self.sock.close()
        if self._on_close is not None:
            self._on_close(self)

    def _answer(self, line: bytes) -> None:
        try:
            message = decode(line)
        except msgspec.DecodeError:
            return
        method = message.method
        if isinstance(method, msgspec.UnsetType):  # a response
            if message.id is None and self._refused is None:
                try:
                    check_refusal(line, self._where)
                except Refused as refused:  # then the daemon closes
                    self._refused = refused
                return
            if isinstance(message.id, int | str):
                with self._lock:
                    waiter = self._waiting.pop(message.id, None)
                if waiter is not None:
                    waiter.reply = line
                    waiter.events.put(None)
            return
        request_id = message.id if isinstance(message.id, int | str) else None
        with self._lock:
            target = self._route(message, method, request_id is not None)
            if request_id is not None and target is not None:
                if len(self._asked) >= BACKLOG:  # never answered: forget the oldest
                    del self._asked[next(iter(self._asked))]
                self._asked[request_id] = target
            elif target is None and request_id is None:
                if method != "notifications/progress":
                    self._backlog.append(line)
                return
        if target is not None:
            target.events.put(line)
            return
        refusal = msgspec.json.encode(
            {
                "jsonrpc": "2.0",
                "id": request_id,
                "error": {
                    "code": -32603,
                    "message": "no stream to the HTTP client to send this on"
                    " (it has no GET stream open, and not exactly one call"
                    " in flight that takes an event stream)",
                },
            }
        )
        try:
            self.send(refusal + b"\n")
        except SessionGoneError:
            pass

    def _route(
        self, message: Message, method: str, request: bool
    ) -> _Waiter | Stream | None:
        """Where a message of the daemon's goes (see the class); under the lock."""
        if method == "notifications/progress":
            token = message.progress_token()
            for waiter in self._waiting.values():
                if waiter.streams and token is not None and waiter.token == token:
                    return waiter
            return None
        if method == "notifications/cancelled":
            try:
                params: _Cancelled | None = _decode_cancelled(message.params)
            except (msgspec.ValidationError, msgspec.DecodeError):
                params = None
            went = None
            if params is not None and params.request_id is not None:
                went = self._asked.pop(params.request_id, None)
            if isinstance(went, _Waiter) and went in self._waiting.values():
                return went
            return self._stream
        if not request and (listen := message.subscription_id()) is not None:
            streamed = self._waiting.get(listen)  # 2026-07-28: its listen stream's
            if streamed is not None and streamed.streams:
                return streamed
        if request or method == "notifications/message":
            calls = [w for w in self._waiting.values() if w.method not in QUIET_METHODS]
            if len(calls) == 1 and calls[0].streams:
                return calls[0]
        return self._stream


def _after(
    sent: collections.deque[bytes], count: int, seq: int
) -> list[tuple[int, bytes]]:
    """The events of a stream after event ``seq``, with their numbers, of the
    last ones kept (``sent``; ``count`` were sent in all)."""
    kept = count - len(sent)
    first = max(seq, kept)
    return list(enumerate(list(sent)[first - kept :], first + 1))


def _event_number(event_id: str) -> tuple[int, int]:
    """``NUMBER-SEQ`` (an event id of ours) as numbers; (-1, -1): not one."""
    number_text, _, seq_text = event_id.strip().partition("-")
    number, seq = ascii_int(number_text), ascii_int(seq_text)
    if number is None or seq is None:
        return -1, -1
    return number, seq


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
            session = Session(
                sock,
                lambda s: self._forget(session_id, s),
                where=self.bridge.mcp_socket,
            )
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


class _State(msgspec.Struct, rename="camel"):
    result_type: str | None = None
    request_state: str | None = None


class _Answered(msgspec.Struct):
    result: _State | None = None


_decode_state = msgspec.json.Decoder(_State).decode
_decode_answered = msgspec.json.Decoder(_Answered).decode


def _state(raw: bytes, *, answer: bool) -> str | None:
    """A retry's ``params.requestState``, or an input-required answer's
    ``result.requestState`` (``answer``); None: none."""
    try:
        if answer:
            result = _decode_answered(raw).result
            if result is None or result.result_type != "input_required":
                return None
            return result.request_state
        return _decode_state(raw).request_state
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None


class Sessionless:
    """Requests outside any session (2026-07-28): each on its own connection,
    closed after the answer, except that an input-required answer's
    connection is held, by its ``requestState``, for the retry that echoes it
    (the face binds a held call to the connection it came on); at most
    ``MAX_HELD`` for at most ``HELD_S``."""

    def __init__(self, bridge: Bridge) -> None:
        self.bridge = bridge
        self._lock = threading.Lock()
        self._held: dict[str, tuple[float, Session]] = {}

    def exchange(
        self,
        request_id: RequestId,
        message: Message,
        line: bytes,
        *,
        streams: bool,
        keepalive_s: float | None = None,
    ) -> Generator[Event]:
        """A request's events, as ``Session.exchange``: what the daemon sends
        it before its answer (its progress, log messages; only if it
        ``streams``), then the answer."""
        state = _state(message.params, answer=False)
        with self._lock:
            held = self._held.pop(state, None) if state else None
        session = (
            held[1]
            if held is not None
            else Session(connect(self.bridge), where=self.bridge.mcp_socket)
        )
        kept = False
        try:
            for final, event, event_id in session.exchange(
                request_id,
                line,
                message.method if isinstance(message.method, str) else "",
                message.progress_token(),
                streams=streams,
                keepalive_s=keepalive_s,
            ):
                if final and (state := _state(event, answer=True)):
                    self._hold(state, session)  # before its client can retry
                    kept = True
                yield final, event, event_id
        finally:
            if not kept:
                session.close()

    def stream(
        self,
        request_id: RequestId,
        message: Message,
        line: bytes,
        *,
        streams: bool,
        keepalive_s: float,
    ) -> Generator[Event]:
        """A request whose answer is a stream (2026-07-28 ``subscriptions/listen``),
        on a connection of its own, closed when the stream ends or its client
        leaves (the face then ends the stream)."""
        session = Session(connect(self.bridge), where=self.bridge.mcp_socket)
        try:
            yield from session.exchange(
                request_id,
                line,
                message.method if isinstance(message.method, str) else "",
                streams=streams,
                keepalive_s=keepalive_s,
            )
        finally:
            session.close()

    def _hold(self, state: str, session: Session) -> None:
        now = time.monotonic()
        with self._lock:
            stale = [k for k, (since, _) in self._held.items() if now - since > HELD_S]
            for key in stale:
                self._held.pop(key)[1].close()
            while len(self._held) >= MAX_HELD:  # the oldest make room
                self._held.pop(next(iter(self._held)))[1].close()
            self._held[state] = (now, session)
