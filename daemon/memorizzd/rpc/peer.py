"""Who is on the other end of a Unix socket connection (SO_PEERCRED)."""

from __future__ import annotations

import socket
import struct
from typing import Final

import msgspec

_UCRED: Final = struct.Struct("3i")


class Caller(msgspec.Struct, frozen=True):
    """A connected peer as the kernel reports it, and the socket it came in on."""

    pid: int
    uid: int
    gid: int
    socket: str


def peer_of(sock: socket.socket, socket_path: str) -> Caller:
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
        pid, uid, gid = _UCRED.unpack(raw)
    except OSError:
        pid, uid, gid = 0, -1, -1
    return Caller(pid=pid, uid=uid, gid=gid, socket=socket_path)
