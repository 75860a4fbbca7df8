"""An MCP client's stdio, handed over by the bridge.

``memorizzctl mcp serve`` sits between an MCP client that only starts
programs and the face's ``mcp.sock``. Pumping bytes both ways costs that
process a wake-up, a read and a write per message in each direction, and the
call a trip through one more process. So, when its stdin and stdout are pipes
or sockets, the bridge hands them over instead: on its face connection, as
its first request, it sends ``HANDOFF_LINE`` with both descriptors attached
(``SCM_RIGHTS``). The face answers ``HANDOFF_ACK`` on the socket and from then
on reads the client's requests from the one and writes its replies to the
other itself; the bridge only waits, and exits when the daemon closes the
socket at the end of the session. The session's identity is the socket's:
the descriptors came from the process whose credentials the kernel gave at
accept. A daemon that does not know the request answers it with an error,
and the bridge pumps as before.

Only descriptors that are pipes or sockets are taken, exactly two, received
close-on-exec; anything else is closed at once and the connection goes on
as a plain one.
"""

from __future__ import annotations

import array
import os
import select
import socket
import stat
from typing import Final

import anyio

HANDOFF_LINE: Final = b'{"jsonrpc":"2.0","id":"mz-handoff","method":"memorizz/handoff"}'
"""The bridge's request (whole line, without its newline); the descriptors
(stdin, then stdout) travel with it."""
HANDOFF_ACK: Final = b'{"jsonrpc":"2.0","id":"mz-handoff","result":{}}\n'
SCOPE_PREFIX: Final = b'{"jsonrpc":"2.0","method":"memorizz/scope"'
"""The one line a bridge may send before its hand-over."""

_INT: Final = array.array("i").itemsize
ANCILLARY_SPACE: Final = socket.CMSG_SPACE(2 * _INT)
RECV_FLAGS: Final = socket.MSG_CMSG_CLOEXEC


def received_fds(ancdata: list[tuple[int, int, bytes]]) -> list[int]:
    """The descriptors a ``recvmsg`` brought (it installs them: the caller owns them)."""
    fds: list[int] = []
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            whole = len(data) - len(data) % _INT
            fds.extend(array.array("i", data[:whole]))
    return fds


def close_all(fds: list[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def _pipe_or_socket(fd: int) -> bool:
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


class Pipes:
    """The client's stdin (requests come from it) and stdout (replies go to it)."""

    def __init__(self, requests: int, replies: int) -> None:
        os.set_blocking(requests, False)
        os.set_blocking(replies, False)
        self._in: int | None = requests
        self._out: int | None = replies

    @classmethod
    def take(cls, fds: list[int]) -> Pipes | None:
        """Two pipes or sockets become the session's; anything else is closed."""
        if len(fds) == 2 and all(_pipe_or_socket(fd) for fd in fds):
            return cls(fds[0], fds[1])
        close_all(fds)
        return None

    @property
    def requests(self) -> int:
        """The descriptor requests are read from (-1 once closed)."""
        return -1 if self._in is None else self._in

    @property
    def replies(self) -> int:
        """The descriptor replies are written to (-1 once closed)."""
        return -1 if self._out is None else self._out

    def send_now(self, data: bytes | bytearray) -> int:
        """Write what fits now (the connection's outbox keeps the rest)."""
        if self._out is None:
            raise BrokenPipeError("the client's stdout is closed")
        return os.write(self._out, data)

    def gone(self) -> bool:
        """The client closed the end it reads replies from."""
        if self._out is None:
            return True
        poller = select.poll()
        poller.register(self._out, 0)  # POLLERR/POLLHUP are always reported
        return bool(poller.poll(0))

    def close(self) -> None:
        for fd in (self._in, self._out):
            if fd is not None:
                anyio.notify_closing(fd)
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._in = self._out = None
