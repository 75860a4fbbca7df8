"""The socket listener and the per-connection loop (NDJSON framing).

A connection is a failure boundary: nothing one client sends can disturb
another. Requests on one connection are pipelined: each line is dispatched in
its own task (at most ``max_in_flight_per_connection`` at a time; past that the
loop stops reading, which pushes back on the client) and answered when it
finishes, matched by id. A client that half-closes still gets its replies. An
oversize frame gets an error and closes that connection only.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import stat
from contextlib import suppress
from typing import Final

import anyio
import anyio.abc

from memorizz.api.errors import (
    DeadlineExceededError,
    InvalidRequestError,
    RemoteError,
    UnavailableError,
)
from memorizz.api.protocol import MAX_FRAME
from memorizzd.config import Limits
from memorizzd.rpc.authority import SocketRule
from memorizzd.rpc.dispatch import Dispatcher, encode_error, request_id_of
from memorizzd.rpc.peer import Caller, peer_of

log = logging.getLogger("memorizzd.rpc")

_READ: Final = 1 << 16
_WRITE_TIMEOUT_S: Final = 30.0
_REFUSE_LINGER_S: Final = 1.0
_OPERATOR_RULE: Final = SocketRule(role="operator")


class SocketInUseError(Exception):
    """Another live daemon answers on the socket path."""


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


async def open_listener(path: str) -> anyio.abc.SocketListener:
    """Bind the socket (0600; 0660 as root, for the operators' group)."""
    prepare_socket_path(path)
    mode = 0o660 if os.geteuid() == 0 else 0o600
    return await anyio.create_unix_listener(path, mode=mode)


class SocketServer:
    """One listening socket: its rule (who may connect, as which role) and limits."""

    def __init__(
        self,
        path: str,
        dispatcher: Dispatcher,
        *,
        max_in_flight: int,
        rule: SocketRule = _OPERATOR_RULE,
        limits: Limits | None = None,
    ) -> None:
        self.path = path
        self.rule = rule
        self.limits = limits
        self._dispatcher = dispatcher
        self._max_in_flight = max_in_flight
        self.connections = 0
        self.in_flight = 0
        self._idle = anyio.Event()
        self._idle.set()
        self._readers: set[anyio.CancelScope] = set()
        self._draining = False

    async def serve(
        self,
        listener: anyio.abc.SocketListener,
        connections: anyio.abc.TaskGroup,
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Accept until cancelled; connections live in ``connections`` so that a
        drain can stop accepting while in-flight calls finish."""
        async with listener:
            task_status.started()
            while True:
                try:
                    stream = await listener.accept()
                except OSError as exc:  # EMFILE and friends: back off, keep serving
                    log.warning("accept failed: %s", exc)
                    await anyio.sleep(0.1)
                    continue
                connections.start_soon(self._connection, stream)

    async def drain(self) -> None:
        """Stop reading new requests on every connection; wait until none is in flight."""
        self._draining = True
        for scope in list(self._readers):
            scope.cancel()
        await self._idle.wait()

    def _track(self, delta: int) -> None:
        self.in_flight += delta
        if self.in_flight == 0:
            self._idle.set()
        elif self._idle.is_set():
            self._idle = anyio.Event()

    async def _connection(self, stream: anyio.abc.SocketStream) -> None:
        raw = stream.extra(anyio.abc.SocketAttribute.raw_socket)
        caller = peer_of(raw, self.path, profile=self.rule.profile, role=self.rule.role)
        if not self.rule.admits(caller):
            log.warning(
                "refused pid %d uid %d on %s", caller.pid, caller.uid, self.path
            )
            await _refuse(stream, self.rule.refusal(caller))
            return
        if self.limits is not None and self.connections >= self.limits.max_connections:
            error = UnavailableError(
                f"too many connections on this socket (max {self.limits.max_connections})",
                reason="overloaded",
                data={"retry_after_s": 1.0},
            )
            await _refuse(stream, error)
            return
        connection = _Connection(self, stream, raw, caller)
        self.connections += 1
        try:
            await connection.serve()
        except Exception:  # a connection must never take the server down
            log.exception("connection from pid %d failed", connection.caller.pid)
        finally:
            self.connections -= 1


async def _refuse(stream: anyio.abc.SocketStream, error: RemoteError) -> None:
    """One error line, then close: after reading what the peer sent meanwhile
    (closing a Unix socket with unread data resets the peer, which would lose
    the line)."""
    async with stream:
        with anyio.move_on_after(_REFUSE_LINGER_S):
            try:
                await stream.send(encode_error(None, error.to_wire()))
                await stream.send_eof()
                while await stream.receive(_READ):
                    pass
            except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                pass


class _Connection:
    """One client: a reader that dispatches each line in its own task, and replies
    written whole, one at a time. The per-request path avoids needless trips
    through the event loop (it is the hot path of every call)."""

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
        self.in_flight = 0
        self.room = anyio.Event()
        self.send_lock = anyio.Lock()
        self.writing_since: float | None = None
        self.broken = False

    async def serve(self) -> None:
        async with self.stream, anyio.create_task_group() as tg:
            tg.start_soon(self._watch_writes)
            async with anyio.create_task_group() as calls:
                await self._read(calls)
            tg.cancel_scope.cancel()

    async def _read(self, calls: anyio.abc.TaskGroup) -> None:
        server, buffer, max_frame = self.server, bytearray(), self.max_frame
        first_by = (
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
                            chunk = await self.stream.receive(_READ)
                        else:
                            with anyio.move_on_at(first_by) as waited:
                                chunk = await self.stream.receive(_READ)
                            if waited.cancelled_caught:
                                await self._slow_first_frame()
                                return
                    except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                        return
                    scanned = len(buffer)
                    buffer += chunk
                    while (end := buffer.find(b"\n", scanned)) >= 0:
                        if end > max_frame:
                            break
                        first_by = None
                        line = bytes(buffer[:end])
                        del buffer[: end + 1]
                        scanned = 0
                        if not line.strip():
                            continue
                        if (
                            self.socket_in_flight is not None
                            and server.in_flight >= self.socket_in_flight
                        ):
                            calls.start_soon(self._overloaded, line)
                            continue
                        if (
                            self.in_flight >= self.max_in_flight
                        ):  # push back: stop reading
                            self.room = anyio.Event()
                            await self.room.wait()
                        self.in_flight += 1
                        server._track(+1)
                        calls.start_soon(self._run_one, line)
                    if len(buffer) > max_frame:
                        error = InvalidRequestError(
                            f"frame larger than {max_frame} bytes; closing the connection",
                            reason="frame_too_large",
                        )
                        await self._send(encode_error(None, error.to_wire()))
                        return
            finally:
                server._readers.discard(reader)

    async def _slow_first_frame(self) -> None:
        error = DeadlineExceededError(
            f"no complete request within {self.first_frame_s:g} s; closing the connection"
        )
        await self._send(encode_error(None, error.to_wire()))

    async def _overloaded(self, line: bytes) -> None:
        if (request_id := request_id_of(line)) is None:
            return
        error = UnavailableError(
            f"too many requests in flight on this socket (max {self.socket_in_flight})",
            reason="overloaded",
            data={"retry_after_s": 0.1},
        )
        await self._send(encode_error(request_id, error.to_wire()))

    async def _run_one(self, line: bytes) -> None:
        try:
            reply = await self.dispatcher.handle(self.caller, line)
            if reply is not None:
                await self._send(reply)
        except anyio.get_cancelled_exc_class():
            # The drain timed out: say so instead of going silent (notifications
            # are never answered).
            if (request_id := request_id_of(line)) is not None:
                error = UnavailableError(
                    "memorizzd is shutting down", reason="shutting_down"
                )
                with anyio.CancelScope(shield=True), anyio.move_on_after(1):
                    await self._send(encode_error(request_id, error.to_wire()))
            raise
        finally:
            self.in_flight -= 1
            self.server._track(-1)
            self.room.set()

    async def _send(self, data: bytes) -> None:
        """Write one whole reply. A client that stops reading is cut off by
        ``_watch_writes``, never left with half a line followed by another."""
        try:
            self.send_lock.acquire_nowait()
        except anyio.WouldBlock:
            await self.send_lock.acquire()
        try:
            if self.broken:
                return
            self.writing_since = anyio.current_time()
            await self.stream.send(data)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            self.broken = True  # the client went away; its replies have nowhere to go
        finally:
            self.writing_since = None
            self.send_lock.release()

    async def _watch_writes(self) -> None:
        while True:
            await anyio.sleep(_WRITE_TIMEOUT_S / 4)
            started = self.writing_since
            if (
                started is not None
                and anyio.current_time() - started > _WRITE_TIMEOUT_S
            ):
                log.warning(
                    "pid %d has not read its replies for %.0f s; closing its connection",
                    self.caller.pid,
                    _WRITE_TIMEOUT_S,
                )
                self.broken = True
                with suppress(OSError):
                    self.raw.shutdown(socket.SHUT_RDWR)
                return
