"""Raw JSON-RPC lines on the daemon's sockets, for the batteries that probe
the wire itself rather than what the client would send (the authority
batteries: tests/daemon/test_authority_*.py).

* ``Wire``: one connection to an API socket or a face (``mcp.sock``), or the
  pair of pipes of a handed-over face session: raw lines out, decoded lines
  in, the lines that answer no request kept in ``notes``.
* ``session``: a face session, initialized, on the socket itself or handed
  over as ``memorizzctl mcp serve`` does it (``handed_over``), narrowed by a
  ``memorizz/scope`` line if asked.
* ``reason``: an answer's stable reason.
* ``exchange``: bytes written and everything read back until the daemon
  closes the connection, for the frame batteries (tests/e2e/test_frame_*.py).
"""

from __future__ import annotations

import array
import contextlib
import os
import select
import socket
import threading
from collections.abc import Iterator
from typing import Any

import msgspec

from memorizzd.listeners import face_socket_path
from memorizzd.rpc.handoff import HANDOFF_ACK, HANDOFF_LINE
from tests.harness import INITIALIZE

READ_S = 10.0
"""Every answer here comes at once; a probe that waits this long is a hang."""


def request(method: str, params: Any, request_id: object = 1) -> bytes:
    """A JSON-RPC request, as one line without its newline."""
    message = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
    return msgspec.json.encode(message)


def notification(method: str, params: Any) -> bytes:
    """A JSON-RPC notification, as one line without its newline."""
    message = {"jsonrpc": "2.0", "method": method, "params": params}
    return msgspec.json.encode(message)


class Wire:
    """One connection (or a handed-over pair of pipes): raw lines out,
    decoded lines in; lines that answer no request are kept in ``notes``."""

    def __init__(
        self, sock: socket.socket | None, out: int = -1, inp: int = -1
    ) -> None:
        self.sock = sock
        if sock is not None:
            sock.settimeout(READ_S)
        self.out, self.inp = out, inp
        """Pipes after a hand-over: requests written to ``out``, replies read
        from ``inp`` (-1: the socket)."""
        self.buffer = b""
        self.notes: list[dict[str, Any]] = []

    @classmethod
    def to(cls, path: str) -> Wire:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(path)
        return cls(sock)

    def write(self, data: bytes) -> None:
        if self.out >= 0:
            os.write(self.out, data)
        else:
            assert self.sock is not None
            self.sock.sendall(data)

    def send(self, *lines: bytes) -> None:
        """``lines``, each with its newline, in one write."""
        self.write(b"".join(line + b"\n" for line in lines))

    def _read(self) -> bytes:
        if self.inp < 0:
            assert self.sock is not None
            return self.sock.recv(1 << 16)  # a timeout (a hang) fails the probe
        ready, _, _ = select.select([self.inp], [], [], READ_S)
        if not ready:
            raise TimeoutError("no answer on the handed-over pipe")
        return os.read(self.inp, 1 << 16)

    def line(self) -> bytes:
        while b"\n" not in self.buffer:
            chunk = self._read()
            if not chunk:
                raise EOFError("the daemon closed the connection")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line

    def reply(self) -> dict[str, Any]:
        """The next line that answers a request."""
        while True:
            found: dict[str, Any] = msgspec.json.decode(self.line())
            if "method" not in found:
                return found
            self.notes.append(found)

    def ask(self, method: str, params: Any, request_id: object = 1) -> dict[str, Any]:
        self.send(request(method, params, request_id))
        answer = self.reply()
        assert answer.get("id") == request_id, answer
        return answer

    def note(self, method: str, params: Any) -> None:
        self.send(notification(method, params))

    def closed(self, within: float = READ_S) -> bool:
        """Whether the daemon closes the connection (EOF or a reset) within
        ``within`` seconds; what it still had to say first is read and dropped."""
        assert self.sock is not None
        self.sock.settimeout(within)
        try:
            while self.sock.recv(1 << 16):
                pass
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False
        finally:
            self.sock.settimeout(READ_S)
        return True

    def close(self) -> None:
        for fd in (self.out, self.inp):
            if fd >= 0:
                os.close(fd)
        self.out = self.inp = -1
        if self.sock is not None:
            self.sock.close()


@contextlib.contextmanager
def wire(path: str) -> Iterator[Wire]:
    """A ``Wire`` to ``path`` (nothing sent yet), closed at the end."""
    connection = Wire.to(path)
    try:
        yield connection
    finally:
        connection.close()


def face_of(api_socket: str) -> str:
    return face_socket_path(api_socket)


def rights(fds: list[int]) -> list[tuple[int, int, bytes]]:
    """The ancillary data that passes ``fds`` (``SCM_RIGHTS``)."""
    return [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())]


def handed_over(path: str, *, scope: str | None = None) -> Wire:
    """What ``memorizzctl mcp serve [--server SCOPE]`` does, by hand: on a
    connection to the face ``path``, the scope line (if any), then the
    hand-over with two pipes; the session's traffic then runs on the pipes,
    whose other ends this process (the MCP client) keeps."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(READ_S)
    sock.connect(path)
    if scope is not None:
        sock.sendall(notification("memorizz/scope", {"server": scope}) + b"\n")
    requests_r, requests_w = os.pipe()
    replies_r, replies_w = os.pipe()
    sock.sendmsg([HANDOFF_LINE + b"\n"], rights([requests_r, replies_w]))
    os.close(requests_r)
    os.close(replies_w)
    got = b""
    while not got.endswith(b"\n"):
        chunk = sock.recv(1 << 10)
        assert chunk, "the daemon closed the connection at the hand-over"
        got += chunk
    assert got == HANDOFF_ACK, got
    return Wire(sock, out=requests_w, inp=replies_r)


def session(path: str, *, via: str = "socket", scope: str | None = None) -> Wire:
    """A face session, initialized: on the socket itself or handed over
    (``via="handoff"``), narrowed to ``scope`` first if given."""
    if via == "handoff":
        w = handed_over(path, scope=scope)
    else:
        w = Wire.to(path)
        if scope is not None:
            w.note("memorizz/scope", {"server": scope})
    w.ask("initialize", INITIALIZE["params"], "init")
    return w


def is_face(path: str) -> bool:
    return path.endswith("mcp.sock")


def connected(path: str) -> Wire:
    """A face's session, initialized (``session``), or a connection to an
    API socket, as it is."""
    return session(path) if is_face(path) else Wire.to(path)


def reason(answer: dict[str, Any]) -> str | None:
    """An answer's stable reason (None: a result), or that of an ``isError``
    result the daemon made (``_meta["memorizz/error"]``: a built-in tool's
    input it could not take)."""
    if "result" in answer:
        result = answer["result"]
        said = (result.get("_meta") or {}).get("memorizz/error")
        return said["reason"] if result.get("isError") and said else None
    found: str = answer["error"]["data"]["reason"]
    return found


_pause = threading.Event()  # never set: an interruptible wait


def exchange(
    sock: socket.socket,
    *pieces: bytes,
    gap: float = 0.0,
    shut: bool = True,
    reset_is_close: bool = False,
) -> bytes:
    """Write ``pieces`` on the connected ``sock`` (``gap`` seconds apart),
    half-close if ``shut``, and read everything until the daemon closes the
    connection: in stages, never with a reset (a reset after what was read
    counts as closed only if ``reset_is_close``: a close unanswered). Read while writing: the daemon may answer, or close,
    before the last piece, and stops reading a client that does not read
    (its push-back)."""

    def write() -> None:
        with contextlib.suppress(OSError):  # closed by the daemon: allowed
            for piece in pieces:
                sock.sendall(piece)
                if gap:
                    _pause.wait(gap)
            if shut:
                sock.shutdown(socket.SHUT_WR)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    received = b""
    while True:
        try:
            chunk = sock.recv(1 << 16)
        except ConnectionResetError:
            if not reset_is_close:
                raise
            break
        if not chunk:
            break
        received += chunk
    writer.join(READ_S)
    assert not writer.is_alive()
    return received
