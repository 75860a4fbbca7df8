"""``memorizzctl mcp serve --transport streamable-http``: the MCP face over HTTP.

For MCP clients that only speak HTTP, the same bridge as the stdio one
(``memorizz.ctl.serve``), with MCP's Streamable HTTP transport on the outside:
one endpoint, ``http://HOST:PORT/mcp``, where each POST carries one JSON-RPC
message.

    initialize, no Mcp-Session-Id   a new session: a connection of its own to
                                    mcp.sock, its id (a random token) in the
                                    reply's ``Mcp-Session-Id`` header
    a request                       written to the session's connection as one
                                    line; the line whose ``id`` matches is the
                                    answer: ``application/json`` when it is the
                                    first the request hears, else an event
                                    stream (``text/event-stream``) of what came
                                    first (its progress, log messages, an
                                    upstream's requests of its call), then the
                                    answer
    a notification or a response    written; ``202 Accepted`` (a response: the
                                    client's answer to a request of the daemon's)
    a request without a session     its own connection (2026-07-28 has no
                                    sessions), its answer as above; closed
                                    after it, or when the client closes (its
                                    cancellation), or
                                    held for the retry of an input-required
                                    answer (memorizz.ctl.session.Sessionless)
    GET with a session              the session's stream: what the daemon sends
                                    outside a request (list changes, resource
                                    updates, log messages and requests that no
                                    one call can be told from); one at a time, a
                                    newer GET ends the older; notifications sent
                                    while no GET is open wait for the next (the
                                    last 256)
    GET with a Last-Event-ID        resumption: a session's events carry ids
                                    (NUMBER-SEQ; the GET stream's number is 0),
                                    each stream opening with a priming event (an
                                    id, no data, a retry time); a client whose
                                    stream broke gets the events after the one
                                    it names again (the last 256 of that
                                    stream), then the rest: a request's stream
                                    ends with its answer (a request is kept
                                    RESUME_S for its client to come back), the
                                    GET stream goes on
    GET without a session           ``405``
    DELETE                          the session's connection is closed
    any other method                ``405``, ``Allow: GET, POST, DELETE`` (not
                                    http.server's 501 page)

Which request a line of the daemon's belongs to: a response's ``id`` is the
request's; progress names its request's ``progressToken``; an upstream's
request (elicitation, sampling) and a log message name nothing, and go with the
one request in flight that can lead to them (memorizz.ctl.session.Session), or
to the GET stream when there are none or several; a request with neither is
refused at once, so that the upstream is not kept waiting.

A session ends on DELETE or when the daemon closes its connection; its id is
then ``404``, as is a request still waiting for an answer there.

Who may talk to it: every request needs ``Authorization: Bearer TOKEN`` (the
token read from ``--token-file``, or made up at start and printed to stderr),
compared in constant time, else ``401``. Against DNS rebinding (a page whose
name now resolves to 127.0.0.1), the ``Host`` must name the listening port
on an address literal or ``localhost`` (else ``421``), and an ``Origin``, when
sent, must be such a host over http (else ``403``). It listens on loopback
unless ``--allow-remote`` says otherwise. These come first, in that order, then
the path (``404``) and ``MCP-Protocol-Version`` (``400``): whatever its method
or its media types, a request without the token learns no more than ``401``.
Then the method (``405``), and a POST's media types as the MCP SDK's server
checks them: a ``Content-Type`` other than ``application/json`` is ``415``, an
``Accept`` that admits neither ``application/json`` nor ``text/event-stream``
(wildcards count; no ``Accept`` admits both) is ``406``. A GET or DELETE
with a body beside it (a length other than 0, a transfer coding) is ``400``,
its connection closed: the body is never read as the next request.

A body that is JSON but that msgspec cannot read for a lone surrogate escape in
it (``"\\ud800"``: no Unicode character) goes on to the face as it is, which
answers it under its id, as the socket API does (``_past_surrogates``).

Bounded: a body over ``MAX_BODY`` is ``413``, at most ``MAX_SESSIONS`` sessions
(``memorizz.ctl.session``; when full, idle ones make room, else ``503``), at
most ``MAX_CONNECTIONS`` connections at once (one more is ``503`` and closed
before anything is read), a connection that takes ``HEAD_TIMEOUT_S`` to send
a request's head (or to send the next) is closed, however slowly its bytes
come, and one silent for ``TIMEOUT_S`` in a body or an answer.

Standard library and msgspec only, imported only when this transport is chosen.
"""

from __future__ import annotations

import _socket
import contextlib
import hmac
import http.server
import io
import ipaddress
import re
import secrets
import select
import sys
import threading
import time
from collections.abc import Generator
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import SplitResult, urlsplit

import msgspec

from memorizz.api.digits import ascii_int
from memorizz.ctl.exits import (
    EXIT_ERROR,
    EXIT_NOPERM,
    EXIT_OK,
    PROG,
    UNREACHABLE,
    UsageError,
    report,
)
from memorizz.ctl.serve import Bridge, Refused, check_refusal, connect
from memorizz.ctl.session import (
    GONE_POLL_S,
    KEEPALIVE_S,
    MAX_SESSIONS,
    RESUME_S,
    DuplicateIdError,
    Event,
    FaceUnreachableError,
    Message,
    RefusedError,
    RequestId,
    Session,
    SessionGoneError,
    Sessionless,
    Sessions,
    decode,
    decode_outcome,
)

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

ENDPOINT: Final = "/mcp"
METHODS: Final = ("GET", "POST", "DELETE")
"""What the endpoint takes; any other method is ``405`` with ``Allow`` naming these."""
MAX_BODY: Final = 4 << 20
VERSIONS: Final = frozenset({"2025-06-18", "2025-11-25", "2026-07-28"})
"""``MCP-Protocol-Version`` values let through (the face negotiates)."""
STREAMED: Final = frozenset({"subscriptions/listen"})
"""2026-07-28 requests whose answer is a long-lived stream: each on a
connection of its own, held while its client reads."""

TIMEOUT_S: Final = 60.0
"""A read or write of a request's body or answer (not the wait for the daemon's)."""
HEAD_TIMEOUT_S: Final = 10.0
"""What a request's head may take, from the wait for it (on a kept connection,
the wait for the next request) to its blank line: a deadline for the whole
head, not for each read, so that a connection that sends nothing, or a byte
now and then, is closed before any token."""
MAX_CONNECTIONS: Final = 128
"""Connections served at once (a thread each). One more is answered ``503``
at once and closed, so a flood of idle connections cannot exhaust the
bridge's threads; each of them is closed within ``HEAD_TIMEOUT_S``."""
RETRY_MS: Final = 1000
"""What a client whose event stream broke waits before it comes back (SSE ``retry``)."""
_DRAIN: Final = 4 * MAX_BODY  # a larger declared body is not read before the 413
LINGER_S: Final = 1.0
"""A connection's close, in stages (RFC 9112 9.6): its writing side shut after
the last answer, what the client still sends is read and dropped for at most
this long (until it closes, or ``LINGER_QUIET_S`` passes without a byte), then
the close. Closed with bytes of the client's unread (a body the bridge refused
without reading it), the kernel resets the connection, and a client still
sending that body fails before it reads the refusal."""
LINGER_QUIET_S: Final = 0.2
MAX_LINGERING: Final = 16
"""Connections refused past ``MAX_CONNECTIONS`` that linger at once (a thread
each); past it, closed at once."""


class Listen:
    """``--listen HOST:PORT``: the address, and which Host headers name it."""

    def __init__(self, text: str, *, allow_remote: bool) -> None:
        host, sep, port_text = text.rpartition(":")
        host = host.removeprefix("[").removesuffix("]")
        port = ascii_int(port_text, max_digits=5)
        if not sep or not host or port is None or port > 65535:
            raise UsageError(
                f"--listen {text!r}: expected HOST:PORT, e.g. 127.0.0.1:8765"
            )
        if host == "localhost":
            host = "127.0.0.1"
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            raise UsageError(
                f"--listen {text!r}: HOST must be an IP address (or localhost)"
            ) from None
        if not address.is_loopback and not allow_remote:
            raise UsageError(
                f"--listen {text!r} is not a loopback address: add --allow-remote"
                " to serve other hosts (each still needs the bearer token)"
            )
        self.host = str(address)
        self.port = port
        self.family = _socket.AF_INET6 if address.version == 6 else _socket.AF_INET
        self.loopback = address.is_loopback

    def url(self) -> str:
        host = f"[{self.host}]" if self.family == _socket.AF_INET6 else self.host
        return f"http://{host}:{self.port}{ENDPOINT}"

    def names_us(self, netloc: str) -> bool:
        """Whether ``netloc`` (a Host header, an Origin's) names this listener:
        this port, on localhost or an address literal (a DNS name could be
        rebound; loopback listeners take only loopback names)."""
        host, sep, port = netloc.rpartition(":")
        if not sep or "]" in port:  # no port: http's own
            host, port = netloc, "80"
        if port != str(self.port):
            return False
        host = host.lower()
        if host == "localhost":
            return True
        bracketed = host.startswith("[") and host.endswith("]")
        try:
            address = ipaddress.ip_address(host[1:-1] if bracketed else host)
        except ValueError:
            return False
        if bracketed != (address.version == 6):  # "[::1", "::1", "[127.0.0.1]"
            return False
        return address.is_loopback if self.loopback else True


# --- HTTP -----------------------------------------------------------------------


def _error_body(code: int, message: str, request_id: RequestId | None = None) -> bytes:
    return msgspec.json.encode(
        {
            "jsonrpc": "2.0",
            "id": request_id,
            "error": {"code": code, "message": message},
        }
    )


class _Reads(io.RawIOBase):
    """A connection's reads, under its buffered ``rfile``: while ``deadline``
    is set (a request's head), each waits only for the time left to it (a
    socket's timeout is for one read: a byte now and then would renew it)."""

    def __init__(self, sock: Any) -> None:
        super().__init__()
        self._sock = sock
        self.deadline: float | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: WriteableBuffer) -> int:
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the request's head took too long")
            self._sock.settimeout(left)
        n: int = self._sock.recv_into(buffer)
        return n


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = TIMEOUT_S  # reads and writes; not the wait for the daemon's answer
    server_version = "memorizzctl"
    sys_version = ""
    server: _Server

    def log_message(self, format: str, *args: object) -> None:
        pass  # no access log: errors only, and those are said where they happen

    def setup(self) -> None:
        super().setup()
        self.rfile.close()  # the socket's own file: reads that keep a deadline instead
        self._reads = _Reads(self.connection)
        self.rfile = io.BufferedReader(self._reads)

    def handle_one_request(self) -> None:
        self._reads.deadline = time.monotonic() + HEAD_TIMEOUT_S
        super().handle_one_request()  # a TimeoutError closes the connection

    def parse_request(self) -> bool:
        parsed = super().parse_request()  # reads the headers too
        self._reads.deadline = None
        self.connection.settimeout(TIMEOUT_S)
        if parsed and self.command not in METHODS:
            # answered here: http.server would send its 501 page (no do_ method)
            if self._admitted():
                self._refuse_unread(
                    405,
                    f"the MCP endpoint takes {', '.join(METHODS)}",
                    headers={"Allow": ", ".join(METHODS)},
                )
            return False
        return parsed

    # -- answers

    def _send(
        self,
        status: int,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
    ) -> None:
        self.send_response(status)
        if body:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        headers = headers or {}
        if self.close_connection and "Connection" not in headers:
            # said, not only done: a client that keeps connections alive
            # would take this one back and may send its next request on it
            # as it closes (RFC 9112 9.6)
            headers = {**headers, "Connection": "close"}
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        if body and self.command != "HEAD":  # HEAD: the headers a GET would get
            self.wfile.write(body)

    def _refuse(
        self,
        status: int,
        message: str,
        code: int = -32600,
        headers: dict[str, str] | None = None,
    ) -> None:
        self._send(status, _error_body(code, message), headers)

    def _refused(self, refused: RefusedError) -> None:
        """The daemon refused this user on the socket (or had too many
        connections): said on stderr, as the stdio bridge says it, and to the
        client: ``403``, or ``503`` to retry."""
        _error(str(refused))
        if refused.status == EXIT_NOPERM:
            self._refuse(403, str(refused), code=-32001)
        else:
            self._refuse(503, str(refused), code=-32603, headers={"Retry-After": "1"})

    def _refuse_unread(
        self,
        status: int,
        message: str,
        code: int = -32600,
        headers: dict[str, str] | None = None,
    ) -> None:
        """A refusal before the body was read: the body is read (up to
        ``_DRAIN``) so that no next request is read from its middle, and the
        connection closes after the answer."""
        self.close_connection = True
        length = ascii_int(self.headers.get("Content-Length") or "0") or 0
        if length <= _DRAIN:
            while length > 0:
                chunk = self.rfile.read(min(length, 1 << 16))
                if not chunk:
                    break
                length -= len(chunk)
        self._refuse(status, message, code, {**(headers or {}), "Connection": "close"})

    def _admitted(self) -> bool:
        """Host, Origin, the bearer token and the path, in that order."""
        listen = self.server.listen
        hosts = self.headers.get_all("Host") or []
        if len(hosts) != 1 or not listen.names_us(hosts[0]):
            self._refuse_unread(421, "this Host is not served here")
            return False
        origins = self.headers.get_all("Origin") or []
        if origins:
            origin = _split(origins[0])
            if (
                len(origins) != 1
                or origin is None
                or origin.scheme != "http"
                or not listen.names_us(origin.netloc)
            ):
                self._refuse_unread(403, "this Origin may not use this server")
                return False
        scheme, _, token = (self.headers.get("Authorization") or "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            token.strip().encode(), self.server.token
        ):
            self._refuse_unread(
                401,
                "a bearer token is required",
                headers={"WWW-Authenticate": "Bearer"},
            )
            return False
        target = _split(self.path)
        if target is None or target.path != ENDPOINT:
            self._refuse_unread(404, f"the MCP endpoint is {ENDPOINT}")
            return False
        version = self.headers.get("MCP-Protocol-Version")
        if version is not None and version not in VERSIONS:
            self._refuse_unread(400, f"unsupported MCP-Protocol-Version: {version}")
            return False
        return True

    # -- methods

    def do_GET(self) -> None:
        if not self._admitted() or not self._bodiless():
            return
        session_id = self.headers.get("Mcp-Session-Id")
        if session_id is None:  # 2026-07-28, or a client before initialize
            self._refuse(
                405,
                "a stream is offered to a session only",
                headers={"Allow": "POST, DELETE"},
            )
            return
        session = self.server.sessions.get(session_id)
        if session is None:
            self._refuse(404, "no such session")
            return
        if not self._takes_events():
            self._refuse(406, "a GET must accept text/event-stream")
            return
        last_event_id = self.headers.get("Last-Event-ID")
        if last_event_id is not None and not last_event_id.startswith("0-"):
            self._resume(session, last_event_id)
            return
        try:
            stream = session.open_stream(last_event_id)
        except SessionGoneError:
            self._refuse(404, "the session ended")
            return
        try:
            self._start_events(stream.priming_id if last_event_id is None else None)
            # (no line: a comment, by which a client that left is found out)
            while (sent := stream.next(KEEPALIVE_S)) is not None:
                self._event(*sent)
        except OSError:
            return  # the client left
        finally:
            session.close_stream(stream)

    def _resume(self, session: Session, last_event_id: str) -> None:
        """The rest of a request's event stream that its client left."""
        try:
            events = session.resume(last_event_id, KEEPALIVE_S)
        except SessionGoneError:
            self._refuse(404, "the session ended")
            return
        if events is None:
            self._refuse(
                400,
                f"no stream to resume after event {last_event_id[:40]!r}: its"
                f" answer was sent, or it waited more than {RESUME_S:g} s",
            )
            return
        self._stream(events, None, started=False)

    def do_DELETE(self) -> None:
        if not self._admitted() or not self._bodiless():
            return
        session_id = self.headers.get("Mcp-Session-Id")
        if session_id is None:
            self._refuse(400, "Mcp-Session-Id is required")
        elif self.server.sessions.end(session_id):
            self._send(200)
        else:
            self._refuse(404, "no such session")

    def do_POST(self) -> None:
        if not self._admitted() or not self._media_types():
            return
        body = self._body()
        if body is None:
            return
        try:
            message = decode(body)
        except msgspec.ValidationError:
            self._refuse(400, "not a single JSON-RPC message")
            return
        except (msgspec.DecodeError, RecursionError) as exc:  # not JSON, too deep
            read = None if isinstance(exc, RecursionError) else _past_surrogates(body)
            if read is None:
                self._refuse(400, "parse error", code=-32700)
                return
            message = read
        # Valid JSON: a raw newline can only be whitespace, and the socket
        # takes one message per line.
        line = body.replace(b"\r", b" ").replace(b"\n", b" ") + b"\n"
        self._post(message, line)

    def _bodiless(self) -> bool:
        """A GET or DELETE comes without a body (else ``400``, the connection
        closed): one beside it, left unread, would be read as the next
        request (what a proxy in front took for this one's body)."""
        lengths = self.headers.get_all("Content-Length") or []
        if "Transfer-Encoding" not in self.headers and all(
            ascii_int(length) == 0 for length in lengths
        ):
            return True
        self._refuse_unread(400, f"a {self.command} takes no body")
        return False

    def _media_types(self) -> bool:
        """A POST's ``Content-Type`` (``415``) and ``Accept`` (``406``), as
        the MCP SDK's server checks them, before its body is read."""
        types = self.headers.get_all("Content-Type") or []
        if len(types) != 1 or _media(types[0]) != "application/json":
            self._refuse_unread(415, "a POST's Content-Type must be application/json")
            return False
        if not (
            self._accepts("application/json") or self._accepts("text/event-stream")
        ):
            self._refuse_unread(
                406, "Accept must admit application/json or text/event-stream"
            )
            return False
        return True

    def _accepts(self, media: str) -> bool:
        """Whether the ``Accept`` header admits ``media`` (``*/*`` and
        ``type/*`` count; parameters do not); none admits anything."""
        accept = self.headers.get_all("Accept")
        if accept is None:
            return True
        ranges = {_media(r) for r in ",".join(accept).split(",")}
        return bool(ranges & {media, media.partition("/")[0] + "/*", "*/*"})

    def _body(self) -> bytes | None:
        lengths = self.headers.get_all("Content-Length") or []
        length = ascii_int(lengths[0]) if len(lengths) == 1 else None
        if length is None or "Transfer-Encoding" in self.headers:
            # no length, two of them, or a transfer coding beside one: which
            # bytes are the body is not plain, so none is read as it
            self.close_connection = True
            self._refuse(411, "a Content-Length is required")
            return None
        if length > MAX_BODY:
            self.close_connection = True
            if length <= _DRAIN:  # read so the client reads the answer, not a reset
                while length > 0:
                    chunk = self.rfile.read(min(length, 1 << 16))
                    if not chunk:
                        break
                    length -= len(chunk)
            self._refuse(413, f"a message is at most {MAX_BODY} bytes")
            return None
        return self.rfile.read(length)

    def _post(self, message: Message, line: bytes) -> None:
        sessions = self.server.sessions
        session_id = self.headers.get("Mcp-Session-Id")
        request_id = message.id
        if isinstance(message.method, msgspec.UnsetType):
            if isinstance(request_id, msgspec.UnsetType):
                self._refuse(400, "not a JSON-RPC request, notification or response")
                return
            request_id = None  # a response: nothing comes back
        elif request_id is None:
            self._refuse(400, "a request's id may not be null")
            return
        elif isinstance(request_id, msgspec.UnsetType):
            request_id = None  # a notification
        responds = isinstance(message.method, msgspec.UnsetType) and isinstance(
            message.id, int | str
        )
        try:
            if session_id is None:
                if message.method == "initialize" and request_id is not None:
                    self._initialize(request_id, line)
                elif request_id is not None and message.method in STREAMED:
                    self._exchange(
                        self.server.sessionless.stream(
                            request_id,
                            message,
                            line,
                            streams=self._takes_events(),
                            keepalive_s=KEEPALIVE_S,
                        ),
                        request_id,
                        ids=False,  # no session: nothing to resume with a GET
                    )
                elif request_id is not None:
                    self._exchange(
                        self._watched(
                            self.server.sessionless.exchange(
                                request_id,
                                message,
                                line,
                                streams=self._takes_events(),
                                keepalive_s=GONE_POLL_S,
                            )
                        ),
                        request_id,
                        ids=False,
                    )
                else:
                    self._send(202)  # nowhere to go without a session
                return
            session = sessions.get(session_id)
            if session is None:
                self._refuse(404, "no such session")
            elif request_id is not None and isinstance(message.method, str):
                self._exchange(
                    session.exchange(
                        request_id,
                        line,
                        message.method,
                        message.progress_token(),
                        streams=self._takes_events(),
                        resumable=True,
                    ),
                    request_id,
                )
            elif responds and isinstance(message.id, int | str):
                session.respond(message.id, line)
                self._send(202)
            elif message.method == "notifications/cancelled":
                session.cancel(message, line)
                self._send(202)
            else:
                session.send(line)
                self._send(202)
        except RefusedError as exc:
            self._refused(exc)
        except SessionGoneError:
            self._refuse(404, "the session ended")
        except DuplicateIdError:
            self._refuse(400, "a request with this id is still waiting")
        except FaceUnreachableError as exc:
            _error(str(exc))
            self._refuse(503, "memorizzd is unreachable", code=-32603)

    def _initialize(self, request_id: RequestId, line: bytes) -> None:
        opened = self.server.sessions.open()
        if opened is None:
            self._refuse(
                503, "too many sessions", code=-32603, headers={"Retry-After": "1"}
            )
            return
        session_id, session = opened
        try:
            reply = session.ask(request_id, line)
        except RefusedError as exc:
            self.server.sessions.end(session_id)
            self._refused(exc)
            return
        except SessionGoneError:  # not a session's end: there never was one
            self._refuse(503, "memorizzd closed the connection", code=-32603)
            return
        if decode_outcome(reply).error is not None:  # refused: no session to keep
            self.server.sessions.end(session_id)
            self._reply(reply)
            return
        self._reply(reply, {"Mcp-Session-Id": session_id})

    def _watched(self, events: Generator[Event]) -> Generator[Event]:
        """``events`` without their keep-alives, at which it only looks
        whether the client closed its connection: at 2026-07-28 that is how
        it cancels a request. Then ``ConnectionAbortedError``, and ``events``
        closed: their connection to the face closes, which stops the call."""
        try:
            for event in events:
                if event[0] or event[1]:
                    yield event
                elif self._client_left():
                    raise ConnectionAbortedError("the client closed its connection")
        finally:
            events.close()

    def _client_left(self) -> bool:
        """Whether the client closed its connection (poll, not select: a
        descriptor past 1024 is one select cannot take)."""
        poller = select.poll()
        poller.register(self.connection, select.POLLIN)
        try:
            events = poller.poll(0)
            if not events:
                return False
            if events[0][1] & (select.POLLHUP | select.POLLERR | select.POLLNVAL):
                return True
            return not self.connection.recv(1, _socket.MSG_PEEK)
        except OSError:
            return True

    def _takes_events(self) -> bool:
        return "text/event-stream" in (self.headers.get("Accept") or "")

    def _exchange(
        self, events: Generator[Event], request_id: RequestId, *, ids: bool = True
    ) -> None:
        """A request's answer: JSON when the answer is the first line the
        request hears, else an event stream of what came first, then the
        answer; the connection closes after it (the stream has no length).
        ``ids``: the events carry ids (a priming event first), so a client
        whose stream breaks comes back for the rest (``_resume``)."""
        try:
            # SessionGoneError: a 404, before the headers
            began = next(events, None)
        except BaseException:
            events.close()
            raise
        if began is None:  # cancelled by its client, the session ended: no answer
            self.close_connection = True
            self._send(202)
            return
        final, first, first_id = began
        if final:
            events.close()
            self._reply(first)
            return
        number = first_id.partition("-")[0]
        self._start_events(f"{number}-0" if ids and first_id else None)
        self._stream(events, request_id, ids=ids, first=(first, first_id))

    def _stream(
        self,
        events: Generator[Event],
        request_id: RequestId | None,
        *,
        ids: bool = True,
        started: bool = True,
        first: tuple[bytes, str] | None = None,
    ) -> None:
        """Write ``events`` as an event stream (begun unless ``started``) to
        its end: the answer. If it never comes (the session ended), the
        request's error, so that its client does not come back for it."""
        try:
            if not started:
                self._start_events()
            if first is not None:
                self._event(first[0], first[1] if ids else "")
            try:
                for _, line, event_id in events:
                    self._event(line, event_id if ids else "")
            except SessionGoneError:
                if request_id is not None:
                    self._event(
                        _error_body(-32603, "memorizzd closed the session", request_id)
                    )
        except OSError:
            return  # the client left: it may come back for the rest (_resume)
        finally:
            events.close()  # a client that left: the request is kept, or stops waiting

    def _start_events(self, priming_id: str | None = None) -> None:
        """The event stream's headers; ``priming_id``: first an event with
        that id and no data, which tells the client it may resume after it
        (MCP's Streamable HTTP transport, SEP-1699), and when to retry."""
        self.close_connection = True
        self.send_response(200)
        self.send_header("Connection", "close")  # the stream ends with it
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        if priming_id is not None:
            self.wfile.write(
                b"id: %s\nretry: %d\ndata: \n\n" % (priming_id.encode(), RETRY_MS)
            )
        self.wfile.flush()

    def _event(self, line: bytes, event_id: str = "") -> None:
        """One event (an empty line: a keep-alive comment)."""
        if not line:
            self.wfile.write(b": keep-alive\n\n")
        elif event_id:
            self.wfile.write(
                b"id: "
                + event_id.encode()
                + b"\nevent: message\ndata: "
                + line
                + b"\n\n"
            )
        else:
            self.wfile.write(b"event: message\ndata: " + line + b"\n\n")
        self.wfile.flush()

    def _reply(self, line: bytes, headers: dict[str, str] | None = None) -> None:
        self._send(200, line, headers)


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = MAX_CONNECTIONS
    """The listen backlog (socketserver's 5 made a burst wait for SYN retries)."""

    def __init__(self, listen: Listen, token: bytes, sessions: Sessions) -> None:
        self.address_family = listen.family
        self.listen = listen
        self.token = token
        self.sessions = sessions
        self.sessionless = Sessionless(sessions.bridge)
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._lingering = threading.BoundedSemaphore(MAX_LINGERING)
        super().__init__((listen.host, listen.port), _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            with contextlib.suppress(OSError):
                request.settimeout(1.0)
                request.sendall(_BUSY)
            if self._lingering.acquire(blocking=False):  # not in the accepting thread
                threading.Thread(target=self._busy_closed, args=(request,)).start()
            else:
                self.close_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def shutdown_request(self, request: Any) -> None:
        """After a connection's last answer: closed in stages (``LINGER_S``)."""
        close_in_stages(request)

    def _busy_closed(self, request: Any) -> None:
        try:
            close_in_stages(request)
        finally:
            self._lingering.release()

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: object, client_address: object) -> None:
        exc = sys.exc_info()[1]
        if not isinstance(exc, ConnectionError):  # a client that left is no news
            _error(f"error serving a request: {exc!r}")


def close_in_stages(sock: _socket.socket) -> None:
    """Shut the writing side (the client reads all that was sent, then the
    end), read and drop what the client still sends (``LINGER_S``), close."""
    try:
        sock.shutdown(_socket.SHUT_WR)
        deadline = time.monotonic() + LINGER_S
        while (left := deadline - time.monotonic()) > 0:
            sock.settimeout(min(left, LINGER_QUIET_S))
            if not sock.recv(1 << 16):
                break
    except OSError:  # TimeoutError: quiet; else it closed or reset: done either way
        pass
    finally:
        sock.close()


_BUSY: Final = (
    b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: 0\r\n"
    b"Connection: close\r\n\r\n"
)
"""The answer to a connection over ``MAX_CONNECTIONS``, before reading it."""


# --- the command ----------------------------------------------------------------


def _error(message: str) -> None:
    """``memorizzctl: error: MSG`` on stderr (never JSON: see ``memorizz.ctl.serve``)."""
    report(message, reason=UNREACHABLE)


def _say(message: str) -> None:
    """What the bridge tells its operator: ``memorizzctl: MSG`` on stderr."""
    sys.stderr.write(f"{PROG}: {message}\n")
    sys.stderr.flush()


def _read_token(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            token = f.read().strip()
    except OSError as exc:
        raise UsageError(f"--token-file {path}: {exc.strerror or exc}") from None
    if not token or any(c < 0x21 or c > 0x7E for c in token):
        raise UsageError(
            f"--token-file {path}: the token must be one word of printable ASCII"
        )
    return token


PROBE_LINE: Final = b'{"jsonrpc":"2.0","id":"mz-probe","method":"ping"}\n'
"""What the bridge asks at start, to hear whether the daemon admits it."""
PROBE_S: Final = 5.0


def serve(
    bridge: Bridge,
    listen_text: str | None,
    *,
    token_file: str | None = None,
    allow_remote: bool = False,
    max_sessions: int = MAX_SESSIONS,
) -> int:
    """Serve until interrupted; return the exit status."""
    if not listen_text:
        raise UsageError("--transport streamable-http needs --listen HOST:PORT")
    listen = Listen(listen_text, allow_remote=allow_remote)
    token = _read_token(token_file) if token_file else None
    checked = connect(bridge)  # the daemon's there now, or say why not
    if isinstance(checked, int):
        return checked
    try:
        _admitted(checked, bridge.mcp_socket)
    except Refused as exc:  # this user, on an agent socket that admits others
        _error(str(exc))
        return exc.status
    finally:
        checked.close()
    printed = token is None
    if token is None:
        token = secrets.token_urlsafe(32).encode()
    try:
        server = _Server(listen, token, Sessions(bridge, max_sessions))
    except OSError as exc:
        _error(f"cannot listen on {listen_text}: {exc.strerror or exc}")
        return EXIT_ERROR
    with server:
        listen.port = server.server_address[1]  # when PORT was 0
        _say(f"serving MCP (Streamable HTTP) at {listen.url()}")
        if printed:
            _say(f"bearer token: {token.decode()}")
        server.serve_forever()
    return EXIT_OK


def _admitted(sock: _socket.socket, path: str) -> None:
    """``Refused`` when the daemon refuses this connection (it says so at
    once, then closes); a ``ping`` it answers, or no word within
    ``PROBE_S``, is taken as admitted (each session is told again)."""
    sock.settimeout(PROBE_S)
    try:
        sock.sendall(PROBE_LINE)
        first = sock.recv(1 << 16)
    except OSError:  # closed at once (its refusal is read below) or silent
        first = b""
    if not first:
        with contextlib.suppress(OSError):
            sock.setblocking(False)
            first = sock.recv(1 << 16)
    check_refusal(first, path)


def _media(value: str) -> str:
    """A media type of a header (``Application/JSON; charset=utf-8``) as
    compared: without its parameters, in lower case."""
    return value.partition(";")[0].strip().lower()


def _past_surrogates(body: bytes) -> Message | None:
    """What the bridge reads of a body msgspec refused for a lone surrogate
    escape in it (``"\\ud800"``: valid JSON, no Unicode character): read
    with each such escape in place of another character (twice, with two),
    the body itself going on unchanged. None when that does not make it
    readable, or when its id holds one (the socket API answers that under
    id null: no answer would come under it)."""
    first, second = (_marked(body, mark) for mark in (rb"\ufffd", rb"\ufffc"))
    if first is None or second is None or first.id != second.id:
        return None
    return first  # a method with one is routed as none the bridge knows


_LONE: Final = re.compile(
    rb"(?<!\\)((?:\\\\)*)"  # an escape: after an even run of backslashes
    rb"(\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}"  # a pair
    rb"|\\u[dD][89a-fA-F][0-9a-fA-F]{2})"  # a lone half
)


def _marked(body: bytes, mark: bytes) -> Message | None:
    def swap(found: re.Match[bytes]) -> bytes:
        escape = found[2]
        return found[1] + (escape if len(escape) == 12 else mark)

    try:
        return decode(_LONE.sub(swap, body))
    except (msgspec.DecodeError, RecursionError):
        return None


def _split(url: str) -> SplitResult | None:
    """``url`` split, or None where urllib cannot (``http://[::1``, an
    unclosed IPv6 bracket): refused like any other that is not ours."""
    try:
        return urlsplit(url)
    except ValueError:
        return None
