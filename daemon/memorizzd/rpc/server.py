"""The socket listener and the per-connection loop (NDJSON framing).

A connection is a failure boundary: nothing one client sends can disturb
another, and nothing it sends grows the daemon without bound:

* Before anything is read, a connection must pass its socket's rule (who) and
  caps (how many on the socket, how many from that uid). A refused one gets
  one error line and is closed at once: it holds its descriptor for
  microseconds, never for a linger.
* The accept loop survives descriptor exhaustion (EMFILE/ENFILE, which anyio
  raises as ``BrokenResourceError``): it sheds the connections waiting in the
  kernel's queue with a reserved descriptor, backs off, logs once per interval,
  and keeps serving the connections it has.
* Requests are pipelined: each admitted line runs in its own task (a plain
  warm ``tools/call`` with none: ``relay.py``) and is answered when it
  finishes, matched by id; replies are put whole in the connection's outbox
  (``loop.Outbox``), never interleaved. A connection stops being read
  while it has ``max_in_flight_per_connection`` requests pending or more than
  ``MAX_UNSENT_BYTES`` of replies waiting for the client to read them; lines
  refused at once (``overloaded``, a duplicate id, a malformed line) are
  answered by the reader itself, so they cost no task and no memory.
* A request without an id (a notification) is never run: every method of this
  API has an effect or an answer, and nobody would learn either. It is logged.
* A client that half-closes still gets its replies; one that stops reading is
  cut off after ``write_timeout_s`` (30 s on the operator socket); an oversize frame gets an error and
  closes that connection only.
"""

from __future__ import annotations

import errno
import logging
import os
import select
import socket
import stat
from collections.abc import Callable, Coroutine
from contextlib import suppress
from functools import partial
from typing import Any, Final

import anyio
import anyio.abc

from memorizz.api.errors import (
    DeadlineExceededError,
    InvalidRequestError,
    RemoteError,
    UnavailableError,
)
from memorizz.api.protocol import MAX_FRAME, Request, RequestId
from memorizzd import calllife
from memorizzd.caller import Caller
from memorizzd.calllife import CallLife
from memorizzd.config import Limits
from memorizzd.loop import Clock, Inbox, Outbox, TaskSet
from memorizzd.rpc.authority import SocketRule
from memorizzd.rpc.dispatch import LineDispatcher, Relayed, encode_error
from memorizzd.rpc.handoff import (
    ANCILLARY_SPACE,
    HANDOFF_ACK,
    HANDOFF_LINE,
    RECV_FLAGS,
    SCOPE_PREFIX,
    Pipes,
    close_all,
    received_fds,
)
from memorizzd.rpc.peer import peer_of

log = logging.getLogger("memorizzd.rpc")

RefusedConnection = Callable[[Caller, RemoteError], Coroutine[Any, Any, None]]
"""Told of every connection refused before it was read (the broker audits them)."""

_READ: Final = 1 << 16
_WRITE_TIMEOUT_S: Final = 30.0
MAX_UNSENT_BYTES: Final = 8 << 20
"""Replies waiting for one client to read them; past this it is not read."""
OPERATOR_MAX_CONNECTIONS: Final = 128
"""The operator socket's connection cap (its own, so agents cannot use it up)."""
_ACCEPT_BACKOFF_MAX_S: Final = 1.0
_LOG_EVERY_S: Final = 10.0
_SHED_PER_ROUND: Final = 64
_HANGUP_POLL_S: Final = 0.1
_REFUSED_LINGER_S: Final = 1.0
"""A connection the daemon closes with a line saying why (refused; idle,
too slow with its first request, revoked by a reload), that line said and
its writing side shut, is read (and what comes dropped) for at most this
long, then closed: closed with bytes of the client's unread, the client
would get a reset (ECONNRESET, or EPIPE on its next write) where it should
read the line and then the end of the stream."""
_REFUSED_IDLE_S: Final = 0.2
"""... and no longer than this after the last bytes it sent."""
_REFUSED_LINGERING_MAX: Final = 64
"""At most this many connections linger at once (per socket); past it,
closed at once."""
_EXHAUSTED: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


class SocketInUseError(Exception):
    """Another live daemon answers on the socket path."""


class ListenError(Exception):
    """An address the daemon was told to listen on cannot be had (in use,
    not on this host): said in one line, like a socket in use."""


def prepare_socket_path(path: str) -> None:
    """Create the directory; replace a stale socket left by a crashed daemon."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, mode=0o755 if os.geteuid() == 0 else 0o700, exist_ok=True)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise SocketInUseError(f"{path} exists and is not a socket; not touching it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError as exc:
        if exc.errno not in (errno.ECONNREFUSED, errno.ENOENT):
            raise
        os.unlink(path)  # stale: nobody listens
        log.info("removed a stale socket at %s", path)
    else:
        raise SocketInUseError(f"another memorizzd is already listening on {path}")
    finally:
        probe.close()


class _Every:
    """A gate for a log line that a flood would repeat: open at most once per period."""

    __slots__ = ("last",)

    def __init__(self) -> None:
        self.last = -_LOG_EVERY_S

    def open(self) -> bool:
        now = anyio.current_time()
        if now - self.last < _LOG_EVERY_S:
            return False
        self.last = now
        return True


class _Reserve:
    """One descriptor held in reserve: when the process runs out, it is freed
    to accept a waiting connection and close it at once (shedding the newest
    connections instead of leaving them to hang in the kernel's queue)."""

    def __init__(self) -> None:
        self.fd: int | None = None
        self.take()

    def take(self) -> None:
        if self.fd is None:
            with suppress(OSError):
                self.fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)

    def shed(self, raw: socket.socket) -> int:
        """Accept and close waiting connections; how many were shed."""
        shed = 0
        while shed < _SHED_PER_ROUND:
            if self.fd is not None:
                os.close(self.fd)
                self.fd = None
            try:
                conn, _ = raw.accept()
            except OSError:  # nothing waiting (EAGAIN), or still no descriptor
                break
            finally:
                self.take()
            conn.close()
            shed += 1
        return shed


_reserve: _Reserve | None = None


def _reserve_fd() -> _Reserve:
    global _reserve  # one per process, made on first use
    if _reserve is None:
        _reserve = _Reserve()
    return _reserve


class SocketServer:
    """One listening socket: its rule (who may connect, as which role) and limits."""

    def __init__(
        self,
        path: str,
        dispatcher: LineDispatcher,
        *,
        max_in_flight: int,
        rule: SocketRule,
        limits: Limits | None = None,
        on_refused: RefusedConnection | None = None,
        handoff: bool = False,
    ) -> None:
        self.path = path
        self.handoff = handoff
        """A bridge may hand its client's stdio over (the MCP face: handoff.py)."""
        self._on_refused = on_refused
        self.rule = rule
        self.limits = limits
        self._dispatcher = dispatcher
        self._max_in_flight = max_in_flight
        if limits is None:
            self.max_connections = OPERATOR_MAX_CONNECTIONS
            self.max_connections_per_uid = OPERATOR_MAX_CONNECTIONS
        else:
            self.max_connections = limits.max_connections
            self.max_connections_per_uid = limits.max_connections_per_uid
        self.connections = 0
        self.by_uid: dict[int, int] = {}
        self.in_flight = 0
        self.refused = 0
        self.lingering = 0
        """Connections being read out before their close (``_read_out``)."""
        """Connections refused (rule or caps) since start."""
        self.shed = 0
        """Connections shed because the process had no descriptor to spare."""
        self._idle: anyio.Event | None = None
        """Set when nothing is in flight, for a drain that waits (made by it)."""
        self._readers: set[anyio.CancelScope] = set()
        self._open: set[_Connection] = set()
        """This socket's connections (a drain tells the protocol of each)."""
        self._draining = False
        self._accept_log = _Every()

    def reconfigure(
        self, rule: SocketRule, limits: Limits | None, *, max_in_flight: int
    ) -> None:
        """A reload's rule and limits, for the connections accepted from now on;
        an open connection whose peer the new rule refuses is cut at once."""
        self.rule, self.limits, self._max_in_flight = rule, limits, max_in_flight
        if limits is not None:
            self.max_connections = limits.max_connections
            self.max_connections_per_uid = limits.max_connections_per_uid
        for connection in list(self._open):
            if not rule.admits(connection.caller):
                connection.revoke(rule.refusal(connection.caller))

    async def serve(
        self,
        listener: anyio.abc.SocketListener,
        connections: anyio.abc.TaskGroup,
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Accept until cancelled; connections live in ``connections`` so that a
        drain can stop accepting while in-flight calls finish."""
        reserve = _reserve_fd()
        raw_listener = listener.extra(anyio.abc.SocketAttribute.raw_socket)
        backoff = 0.0
        async with listener:
            task_status.started()
            while True:
                try:
                    stream = await listener.accept()
                except (OSError, anyio.BrokenResourceError) as exc:
                    # anyio wraps the accept()'s OSError in BrokenResourceError
                    cause = exc if isinstance(exc, OSError) else exc.__cause__
                    code = cause.errno if isinstance(cause, OSError) else None
                    if code in (errno.ECONNABORTED, errno.EINTR, errno.EPROTO):
                        continue  # the peer gave up before we took it: normal
                    backoff = min(max(backoff * 2, 0.01), _ACCEPT_BACKOFF_MAX_S)
                    shed = reserve.shed(raw_listener) if code in _EXHAUSTED else 0
                    self.shed += shed
                    self._log_accept_failure(cause or exc, shed, backoff)
                    await anyio.sleep(backoff)
                    continue
                backoff = 0.0
                self._admit(stream, connections)

    def _log_accept_failure(
        self, exc: BaseException, shed: int, backoff: float
    ) -> None:
        if not self._accept_log.open():
            return
        log.error(
            "%s: accept failed (%s); shed %d waiting connections, retrying in %.2f s"
            " (%d shed since start; logged at most every %.0f s)",
            self.path,
            exc,
            shed,
            backoff,
            self.shed,
            _LOG_EVERY_S,
        )

    def _admit(
        self, stream: anyio.abc.SocketStream, connections: anyio.abc.TaskGroup
    ) -> None:
        """Who and how many, before anything is read; refusals close at once
        (and are logged and audited by ``on_refused``, within a budget)."""
        raw = stream.extra(anyio.abc.SocketAttribute.raw_socket)
        caller = peer_of(raw, self.path, profile=self.rule.profile, role=self.rule.role)
        error: RemoteError | None = None
        if not self.rule.admits(caller):
            error = self.rule.refusal(caller)
        elif self.connections >= self.max_connections:
            error = _too_many("connections on this socket", self.max_connections)
        elif self.by_uid.get(caller.uid, 0) >= self.max_connections_per_uid:
            error = _too_many(
                f"connections from uid {caller.uid} on this socket",
                self.max_connections_per_uid,
            )
        if error is not None:
            self.refused += 1
            said = _refuse(raw, error)
            if said and self.lingering < _REFUSED_LINGERING_MAX:
                self.lingering += 1
                connections.start_soon(self._linger_refused, stream)
            else:
                _close_now(raw)
            if self._on_refused is not None:
                connections.start_soon(self._on_refused, caller, error)
            return
        self.connections += 1
        self.by_uid[caller.uid] = self.by_uid.get(caller.uid, 0) + 1
        connections.start_soon(self._connection, stream, raw, caller)

    async def _linger_refused(self, stream: anyio.abc.SocketStream) -> None:
        """Read what a refused client still writes (its first request, most
        likely), dropping it, then close: closed with that request unread, its
        write fails (EPIPE) and a client that writes before it reads never
        reads why (``_read_out``). Nothing it sends is looked at."""
        try:
            await _read_out(stream.extra(anyio.abc.SocketAttribute.raw_socket))
        finally:
            self.lingering -= 1
            with (
                anyio.CancelScope(shield=True),
                suppress(OSError, RuntimeError, anyio.BrokenResourceError),
            ):
                await stream.aclose()  # RuntimeError: uvloop's word for a reset peer

    async def read_out(self, raw: socket.socket) -> None:
        """A served connection the daemon closes with a line saying why (its
        writing side shut): what its client still sends is read and dropped
        (``_read_out``), counted with the refused ones that linger."""
        if self.lingering >= _REFUSED_LINGERING_MAX:
            return
        self.lingering += 1
        try:
            await _read_out(raw)
        finally:
            self.lingering -= 1

    async def drain(self) -> None:
        """Stop reading new requests on every connection; wait until none is in flight."""
        self._draining = True
        for connection in list(self._open):
            self._dispatcher.draining(connection)
        for scope in list(self._readers):
            scope.cancel()
        while self.in_flight:
            self._idle = anyio.Event()
            await self._idle.wait()

    def _track(self, delta: int) -> None:
        self.in_flight += delta
        if self.in_flight == 0 and self._idle is not None:
            self._idle.set()  # a drain waits: no event is made on the way in

    async def _connection(
        self, stream: anyio.abc.SocketStream, raw: socket.socket, caller: Caller
    ) -> None:
        connection = _Connection(self, stream, raw, caller)
        self._open.add(connection)
        if not self.rule.admits(caller):  # a reload refused it since its accept
            connection.revoke(self.rule.refusal(caller))
        try:
            await connection.serve()
        except Exception:  # a connection must never take the server down
            log.exception("connection from pid %d failed", connection.caller.pid)
        finally:
            self._open.discard(connection)
            self.connections -= 1
            left = self.by_uid.pop(caller.uid, 1) - 1
            if left:
                self.by_uid[caller.uid] = left


def _too_many(what: str, limit: int) -> UnavailableError:
    return UnavailableError(
        f"too many {what} (max {limit})",
        reason="overloaded",
        data={"retry_after_s": 1.0},
    )


async def _read_out(raw: socket.socket) -> None:
    """Read and drop what the peer still sends, until it closes, is quiet for
    ``_REFUSED_IDLE_S``, or ``_REFUSED_LINGER_S`` has passed (a reset ends it
    too: nothing is left to spare it)."""
    with suppress(OSError), anyio.move_on_after(_REFUSED_LINGER_S):
        while True:
            with anyio.move_on_after(_REFUSED_IDLE_S) as idle:
                await anyio.wait_readable(raw)
            if idle.cancelled_caught or not raw.recv(_READ, socket.MSG_DONTWAIT):
                break


def _refuse(raw: socket.socket, error: RemoteError) -> bool:
    """One error line, sent without waiting, and the writing side shut;
    whether the connection may linger (``_linger_refused``: the line went)."""
    try:
        raw.send(encode_error(None, error.to_wire()), socket.MSG_DONTWAIT)
        raw.shutdown(socket.SHUT_WR)
    except OSError:
        return False
    return True


def _close_now(raw: socket.socket) -> None:
    """Close at once (on a Unix stream socket the line sent stays readable by
    the peer: Linux delivers queued data before the reset)."""
    with suppress(OSError):
        raw.shutdown(socket.SHUT_RDWR)
    raw.close()


class _Connection:
    """One client: a reader that admits each line and runs it in its own task
    (or relays it with none: ``Dispatcher.relay``), and replies put whole in
    one outbox (``loop.Outbox``), so they never interleave. The per-request
    path avoids needless trips through the event loop (it is the hot path of
    every call)."""

    def __init__(
        self,
        server: SocketServer,
        stream: anyio.abc.SocketStream,
        raw: socket.socket,
        caller: Caller,
    ) -> None:
        self.server = server
        self.stream = stream
        self.raw = raw
        self.caller = caller
        self.dispatcher = server._dispatcher
        self.max_in_flight = server._max_in_flight
        limits = server.limits
        self.max_frame = MAX_FRAME if limits is None else limits.max_request_bytes
        self.socket_in_flight = None if limits is None else limits.max_in_flight
        self.first_frame_s = None if limits is None else limits.first_frame_timeout_s
        self.write_timeout_s = (
            _WRITE_TIMEOUT_S if limits is None else limits.write_timeout_s
        )
        self.idle_timeout_s = None if limits is None else limits.idle_timeout_s
        self.now = Clock().now
        self.last_activity = self.now()
        self.in_flight = 0
        self.lives: dict[RequestId, CallLife] = {}
        """This connection's requests in flight in tasks, by id."""
        self.settling = 0
        """Requests that set the session up (``LineDispatcher.settles``) still
        running: a task is spawned before its first step runs, so a request
        relayed without one could overtake them."""
        self.relayed: dict[RequestId, Relayed] = {}
        """Its requests in flight without a task (``Dispatcher.relay``); an id
        in either is refused until it is answered."""
        self.inbox: Inbox | None = None
        """The client's bytes, read as they come (once the bridge's offer is over)."""
        self.buffer = bytearray()
        """The line being read, not yet whole."""
        self.first_by: float | None = None
        """When the first whole line must have come (``first_frame_timeout_s``);
        None once it came."""
        self.calls = TaskSet()
        """The tasks of its requests (a task per request, without a task
        group's cost)."""
        self.outbox = Outbox(raw.fileno(), raw.send)
        """Reply lines not yet written (the client reads them at its pace)."""
        self.room = anyio.Event()
        self.broken = False
        self.lingers = False
        """The daemon closes it with a line saying why: read out before the
        close (``SocketServer.read_out``)."""
        self.notifications = 0
        self.notification_log = _Every()
        self.offering = server.handoff
        """Until the first line that is not the bridge's: descriptors are taken."""
        self.offered: list[int] = []
        self.offer_cut = False
        """More descriptors came than a hand-over takes (the kernel closed
        those past two): the offer is refused, whatever the two are."""
        self.pipes: Pipes | None = None
        """The client's stdio, once a bridge handed it over (handoff.py)."""

    async def send(self, line: bytes) -> None:
        """A message the protocol sends unasked (the MCP face's notifications)."""
        await self._send(line)

    def finish(self, request_id: RequestId, line: bytes | None) -> None:
        """A relayed request ended (``Dispatcher.relay``): its reply, if any."""
        if line is not None:
            self._put(line)
        del self.relayed[request_id]
        self.in_flight -= 1
        self.server._track(-1)
        self.room.set()

    def cancel(self, request_id: RequestId) -> None:
        """The client asked to stop one of its requests (unknown ids: nothing)."""
        life = self.lives.get(request_id) or self.relayed.get(request_id)
        if life is not None:
            life.cancel()

    async def serve(self) -> None:
        self.dispatcher.opened(self)
        try:
            await self._serve()
        finally:
            self.dispatcher.closed(self)
            self._unwatch()
            close_all(self.offered)
            if self.pipes is not None:
                self.pipes.close()

    async def _serve(self) -> None:
        async with self.stream:
            try:
                await self._served()
            finally:  # before the socket closes: its descriptor number may be reused
                self._unwatch()
            if self.lingers:
                await self.server.read_out(self.raw)

    async def _served(self) -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._watch)
            calls = self.calls
            try:
                ended = await self._read()
                if ended == "gone":
                    self._client_gone()
                elif ended == "eof" and self.in_flight:
                    tg.start_soon(self._watch_hangup)
            finally:
                try:
                    await calls.join()
                    while self.relayed:  # no task to join: they finish()
                        self.room = anyio.Event()
                        await self.room.wait()
                except BaseException:  # the drain ran out: say why, as tasks do
                    for relayed in list(self.relayed.values()):
                        relayed.shut_down()
                    with (
                        anyio.CancelScope(shield=True),
                        anyio.move_on_after(1),
                        suppress(OSError),
                    ):
                        await self.outbox.drained()
                    raise
            with suppress(OSError):  # the last replies, within the write timeout
                await self.outbox.drained()
            tg.cancel_scope.cancel()

    def _unwatch(self) -> None:
        """The loop stops reading and writing the client's descriptors (what
        is not written by now is dropped)."""
        if self.inbox is not None:
            self.inbox.close()
        self.outbox.close()

    def _client_gone(self) -> None:
        """Nobody will read the replies: abandon what may be abandoned."""
        self.broken = True
        for life in list(self.lives.values()):
            life.client_gone()
        for relayed in list(self.relayed.values()):
            relayed.client_gone()

    async def _watch_hangup(self) -> None:
        """After EOF: a half-closed client still reads its replies; one that
        closed altogether (POLLHUP) does not."""
        poller = select.poll()
        poller.register(self.raw.fileno(), 0)  # POLLHUP/POLLERR are always reported
        while self.in_flight and not self.broken:
            await anyio.sleep(_HANGUP_POLL_S)
            if self.pipes.gone() if self.pipes is not None else poller.poll(0):
                self._client_gone()

    async def _read(self) -> str | None:
        """Read and admit lines until EOF (``"eof"``), a broken connection
        (``"gone"``), or another reason to stop (None)."""
        server, buffer, max_frame = self.server, self.buffer, self.max_frame
        first_by = self.first_by = (
            None
            if self.first_frame_s is None
            else anyio.current_time() + self.first_frame_s
        )
        with anyio.CancelScope() as reader:
            server._readers.add(reader)
            if server._draining:
                reader.cancel()
            try:
                while not self.broken:
                    try:
                        if first_by is None:
                            chunk = await self._receive()
                        else:
                            with anyio.move_on_at(first_by) as waited:
                                chunk = await self._receive()
                            if waited.cancelled_caught:
                                await self._slow_first_frame()
                                return None
                    except anyio.EndOfStream:
                        return "eof"
                    except (anyio.BrokenResourceError, OSError):
                        return "gone"
                    scanned = len(buffer)
                    buffer += chunk
                    while (end := buffer.find(b"\n", scanned)) >= 0:
                        if end > max_frame:
                            break
                        first_by = self.first_by = None
                        line = bytes(buffer[:end])
                        del buffer[: end + 1]
                        scanned = 0
                        self.last_activity = self.now()
                        if self.offering and await self._handoff(line, buffer):
                            continue
                        if line.strip():
                            await self._admit(line)
                    if len(buffer) > max_frame:
                        error = InvalidRequestError(
                            f"frame larger than {max_frame} bytes; closing the connection",
                            reason="frame_too_large",
                        )
                        await self._send(encode_error(None, error.to_wire()))
                        self._shut(lingering=True)  # the rest of the line read out
                        return None
            finally:
                server._readers.discard(reader)
        return None

    async def _receive(self) -> bytes:
        """The client's next bytes. The socket is read directly once it is
        readable: the stream's ``receive`` would first yield to the event loop
        and try a read that cannot succeed yet (this is every call's path)."""
        if self.offering:
            return await self._receive_offer()
        if self.inbox is None:  # the socket's, or the handed-over stdin's
            self.inbox = (
                Inbox(self.raw.fileno(), partial(self.raw.recv, _READ))
                if self.pipes is None
                else Inbox(self.pipes.requests)
            )
            self.inbox.taken = self._take_lines
        if data := await self.inbox.receive():
            return data
        raise anyio.EndOfStream

    async def _receive_offer(self) -> bytes:
        """``_receive``, taking the descriptors a bridge may send along."""
        while True:
            try:
                data, ancdata, flags, _ = self.raw.recvmsg(
                    _READ, ANCILLARY_SPACE, RECV_FLAGS
                )
            except BlockingIOError:
                await anyio.wait_readable(self.raw)
                continue
            fds = received_fds(ancdata)
            if flags & socket.MSG_CTRUNC:  # more than two: "exactly two" is not met
                self.offer_cut = True
            if self.offered or self.offer_cut:  # one hand-over per connection
                close_all(fds)
            else:
                self.offered = fds
            if not data:
                raise anyio.EndOfStream
            return data

    async def _handoff(self, line: bytes, rest: bytearray) -> bool:
        """Whether ``line`` was the bridge's hand-over (taken, or refused with
        an error); a scope line may come first, anything else ends the offer."""
        if line.startswith(SCOPE_PREFIX):
            return False
        self.offering = False
        fds, self.offered = self.offered, []
        if line.strip() != HANDOFF_LINE:
            close_all(fds)
            return False
        refuse = bool(rest) or self.offer_cut
        pipes = None if refuse else Pipes.take(fds)
        if pipes is None:
            if refuse:
                close_all(fds)
            refused = InvalidRequestError(
                "memorizz/handoff takes the client's stdin and stdout (two pipes or"
                " sockets) and nothing after it on this connection"
            )
            await self._send(encode_error("mz-handoff", refused.to_wire()))
            return True
        await self._send(HANDOFF_ACK)  # on the socket; from now on, the pipes
        self.pipes = pipes
        self.outbox.close()
        self.outbox = Outbox(pipes.replies, pipes.send_now)
        return True

    def _take_lines(self, data: bytes) -> bytes:
        """Admit whole request lines in the loop's reader callback, while the
        reader task waits with nothing half read: a relayed call then wakes
        no task at all. Returns what must go to the reader task instead (from
        the first line that would have to wait, or be refused, or is not
        whole), so the order of lines is kept."""
        if self.buffer or self.first_by is not None or self.server._draining:
            return data
        start, max_frame = 0, self.max_frame
        while (end := data.find(b"\n", start)) >= 0:
            if (
                end - start > max_frame
                or self.broken
                or self.in_flight >= self.max_in_flight
                or self.outbox.kept > MAX_UNSENT_BYTES
            ):
                break
            line = data[start:end]
            start = end + 1
            self.last_activity = self.now()
            if not line.strip():
                continue
            try:
                reply = self._admit_now(line)
            except Exception:  # a bug: said in the log and by closing, never a hang
                log.exception("pid %d: admitting a request failed", self.caller.pid)
                self._shut()
                return b""
            if reply is not None:
                self._put(reply)
        return data[start:]

    async def _admit(self, line: bytes) -> None:
        """Admit one request line (``_admit_now``).

        Past the connection's limits (requests pending, reply bytes unsent)
        this waits, and so the connection is not read: that is the push-back."""
        while self.in_flight >= self.max_in_flight:
            self.room = anyio.Event()
            await self.room.wait()
        if self.outbox.kept > MAX_UNSENT_BYTES:
            with suppress(OSError):
                await self.outbox.drained()
        if self.broken:
            return
        reply = self._admit_now(line)
        if reply is not None:
            await self._send(reply)

    def _admit_now(self, line: bytes) -> bytes | None:
        """Run one request line: relayed with no task, in a task of its own,
        or answered here and now (the answer is returned, to be sent)."""
        parsed = self.dispatcher.parse(line)
        if isinstance(parsed, bytes):  # not a request: answered at once
            return parsed
        if parsed.id is None:
            if not self.dispatcher.notified(self, parsed):
                self._drop_notification(parsed)
            return None
        if parsed.id in self.lives or parsed.id in self.relayed:
            duplicate = InvalidRequestError(
                f"request id {parsed.id!r} is already in flight on this connection;"
                " ids must be unique among a connection's pending requests"
            )
            return encode_error(parsed.id, duplicate.to_wire())
        server = self.server
        if (
            self.socket_in_flight is not None
            and server.in_flight >= self.socket_in_flight
        ):
            error = UnavailableError(
                f"too many requests in flight on this socket (max {self.socket_in_flight})",
                reason="overloaded",
                data={"retry_after_s": 0.1},
            )
            return encode_error(parsed.id, error.to_wire())
        self.in_flight += 1
        server._track(+1)
        settles = parsed.method in self.dispatcher.settles
        if not settles and not self.settling:
            relayed = self.dispatcher.relay(self, parsed)
            if relayed is not None:  # no task: it ends with finish()
                self.relayed[parsed.id] = relayed
                return None
        life = self.lives[parsed.id] = CallLife(
            parsed.method, send=self._send, session=self
        )
        if settles:  # until it is done, what follows takes tasks, after it
            self.settling += 1
        self.calls.spawn(
            self._run_one, parsed, parsed.id, life, settles, name=parsed.method
        )
        return None

    def _drop_notification(self, request: Request) -> None:
        self.notifications += 1
        if not self.notification_log.open():
            return
        log.warning(
            "pid %d uid %d sent %s without an id (a notification): not run, since"
            " nobody would learn its outcome (%d dropped on this connection;"
            " logged at most every %.0f s)",
            self.caller.pid,
            self.caller.uid,
            request.method[:64],
            self.notifications,
            _LOG_EVERY_S,
        )

    async def _slow_first_frame(self) -> None:
        error = DeadlineExceededError(
            f"no complete request within {self.first_frame_s:g} s; closing the connection"
        )
        await self._send(encode_error(None, error.to_wire()))
        self._shut(lingering=True)

    async def _run_one(
        self,
        request: Request,
        request_id: RequestId,
        life: CallLife,
        settles: bool = False,
    ) -> None:
        calllife.current.set(life)  # this task's context only
        try:
            with life.scope:
                reply = await self.dispatcher.run(self.caller, request)
            if life.aborted:
                return  # its client left; nobody reads the reply
            await self._send(reply)
        except anyio.get_cancelled_exc_class():
            # The drain timed out: say so instead of going silent.
            error = UnavailableError(
                "memorizzd is shutting down", reason="shutting_down"
            )
            with anyio.CancelScope(shield=True), anyio.move_on_after(1):
                await self._send(encode_error(request_id, error.to_wire()))
            raise
        finally:
            if settles:
                self.settling -= 1
            del self.lives[request_id]
            self.in_flight -= 1
            self.server._track(-1)
            self.room.set()

    async def _send(self, data: bytes) -> None:
        """Write one whole reply, and wait until the client has taken it. A
        client that stops reading is cut off by ``_watch``; a line is never
        split by another, nor left half written for another to follow."""
        if self._put(data) and self.outbox.kept:
            try:
                await self.outbox.drained()
            except OSError:
                self._broke()

    def _put(self, data: bytes) -> bool:
        """Put one whole line in the outbox (False: the client is gone)."""
        if self.broken:
            return False
        try:
            self.outbox.put(data)
        except OSError:
            self._broke()
            return False
        self.last_activity = self.now()
        return True

    def _broke(self) -> None:
        self.broken = True  # the client went away; its replies have nowhere to go
        self.room.set()

    async def _watch(self) -> None:
        """Cut off a client that does not read its replies, and close a
        connection that sits idle (nothing in flight, no request line).

        On the MCP face (``handoff``), only one that holds part of a line: an
        MCP session is its client's for as long as it runs, idle between the
        agent's turns, and MCP clients do not connect again by themselves; a
        line dripped and never finished still cannot hold a slot. Nor is a
        connection idle that holds a resource subscription (it waits for the
        updates; closed, it would lose them), unless it drips a line."""
        period = self.write_timeout_s / 4
        if self.idle_timeout_s is not None:
            period = min(period, self.idle_timeout_s / 4)
        while True:
            await anyio.sleep(period)
            now = anyio.current_time()
            started = self.outbox.since
            if started is not None and now - started > self.write_timeout_s:
                log.warning(
                    "pid %d has not read its replies for %.0f s; closing its connection",
                    self.caller.pid,
                    self.write_timeout_s,
                )
                self._shut()
                return
            if (
                self.idle_timeout_s is not None
                and not self.in_flight
                and started is None
                and now - self.last_activity > self.idle_timeout_s
                and (
                    self.buffer
                    or not (self.server.handoff or self.dispatcher.holds(self))
                )
            ):
                self._close_idle()
                return

    def _close_idle(self) -> None:
        """Say why, without waiting (nothing is queued), then close: the
        client knows no request of it was read, so it may send it again."""
        error = DeadlineExceededError(
            f"connection idle for {self.idle_timeout_s:g} s; closed"
            " (no request was lost: reconnect to go on)",
            reason="idle_timeout",
        )
        with suppress(OSError):
            self.outbox.put(encode_error(None, error.to_wire()))  # nothing is kept
        self._shut(lingering=True)

    def revoke(self, error: RemoteError) -> None:
        """Its peer may use the socket no more (a reload's rule refuses it):
        said without waiting, then closed; nothing more of it is read."""
        log.warning(
            "pid %d: %s; closing its connection", self.caller.pid, error.message
        )
        with suppress(OSError):
            self.outbox.put(encode_error(None, error.to_wire()))
        self._shut(lingering=True)

    def _shut(self, *, lingering: bool = False) -> None:
        """Nothing more is read or written. ``lingering`` (a line said why):
        only the writing side is shut, so the client reads that line and then
        the end of the stream, and what it still sends is read out before the
        close (``SocketServer.read_out``), not left to reset the connection."""
        self.broken = True
        self.lingers = self.lingers or lingering
        self._unwatch()
        with suppress(OSError):
            self.raw.shutdown(socket.SHUT_WR if lingering else socket.SHUT_RDWR)
        if self.pipes is not None:
            self.pipes.close()
