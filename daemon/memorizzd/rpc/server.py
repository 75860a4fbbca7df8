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
from typing import Final

import anyio
import anyio.abc

from memorizz.api.errors import InvalidRequestError, UnavailableError
from memorizz.api.protocol import MAX_FRAME
from memorizzd.rpc.dispatch import Dispatcher, encode_error, request_id_of
from memorizzd.rpc.peer import peer_of

log = logging.getLogger("memorizzd.rpc")

_READ: Final = 1 << 16
_WRITE_TIMEOUT_S: Final = 30.0


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
    def __init__(
        self, path: str, dispatcher: Dispatcher, *, max_in_flight: int
    ) -> None:
        self.path = path
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
        caller = peer_of(raw, self.path)
        self.connections += 1
        send_lock = anyio.Lock()
        limiter = anyio.CapacityLimiter(self._max_in_flight)

        async def send(data: bytes) -> None:
            async with send_lock:
                with anyio.move_on_after(_WRITE_TIMEOUT_S):
                    try:
                        await stream.send(data)
                    except (
                        anyio.BrokenResourceError,
                        anyio.ClosedResourceError,
                        OSError,
                    ):
                        pass  # the client went away; its reply has nowhere to go

        async def run_one(line: bytes, token: object) -> None:
            try:
                reply = await self._dispatcher.handle(caller, line)
                if reply is not None:
                    await send(reply)
            except anyio.get_cancelled_exc_class():
                # The drain timed out: say so instead of going silent (notifications
                # are never answered).
                if (request_id := request_id_of(line)) is not None:
                    error = UnavailableError(
                        "memorizzd is shutting down", reason="shutting_down"
                    )
                    with anyio.CancelScope(shield=True), anyio.move_on_after(1):
                        await send(encode_error(request_id, error.to_wire()))
                raise
            finally:
                limiter.release_on_behalf_of(token)
                self._track(-1)

        try:
            async with stream, anyio.create_task_group() as tg:
                buffer = bytearray()
                with anyio.CancelScope() as reader:
                    self._readers.add(reader)
                    if self._draining:
                        reader.cancel()
                    too_large = False
                    while not too_large:
                        try:
                            chunk = await stream.receive(_READ)
                        except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                            break
                        scanned = len(buffer)
                        buffer += chunk
                        while (end := buffer.find(b"\n", scanned)) >= 0:
                            line = bytes(buffer[:end])
                            del buffer[: end + 1]
                            scanned = 0
                            if len(line) > MAX_FRAME:
                                too_large = True
                                break
                            if line.strip():
                                token = object()
                                await limiter.acquire_on_behalf_of(token)
                                self._track(+1)
                                tg.start_soon(run_one, line, token)
                        if too_large or len(buffer) > MAX_FRAME:
                            too_large = True
                            error = InvalidRequestError(
                                f"frame larger than {MAX_FRAME} bytes; closing the connection",
                                reason="frame_too_large",
                            )
                            await send(encode_error(None, error.to_wire()))
                self._readers.discard(reader)
        except Exception:  # a connection must never take the server down
            log.exception("connection from pid %d failed", caller.pid)
        finally:
            self.connections -= 1
