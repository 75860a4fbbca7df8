"""Who is on the other end of a Unix socket connection, as the kernel says.

SO_PEERCRED gives pid, uid and gid; SO_PEERGROUPS (Linux 4.13+; Python has no
named constant, the value is 59) the supplementary groups, both captured by
the kernel at ``connect()``. Where SO_PEERGROUPS is missing the groups come
from ``/proc/<pid>/status`` (racy against pid reuse, hence only a fallback).
"""

from __future__ import annotations

import array
import errno
import socket
import struct
from typing import Final

from memorizzd.caller import Caller, Role

_UCRED: Final = struct.Struct("3i")
SO_PEERGROUPS: Final = getattr(socket, "SO_PEERGROUPS", 59)
_MAX_GROUPS: Final = 65536


def peer_of(
    sock: socket.socket,
    socket_path: str,
    *,
    profile: str | None,
    role: Role,
) -> Caller:
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
        pid, uid, gid = _UCRED.unpack(raw)
    except OSError:
        pid, uid, gid = 0, -1, -1
    return Caller(
        pid=pid,
        uid=uid,
        gid=gid,
        socket=socket_path,
        groups=peer_groups(sock, pid),
        profile=profile,
        role=role,
    )


def peer_groups(sock: socket.socket, pid: int) -> tuple[int, ...]:
    size = 64
    while size <= _MAX_GROUPS:
        try:
            raw = sock.getsockopt(socket.SOL_SOCKET, SO_PEERGROUPS, size * 4)
        except OSError as exc:
            if exc.errno == errno.ERANGE:
                size *= 8
                continue
            break
        groups = array.array("I")
        groups.frombytes(raw[: len(raw) - len(raw) % 4])
        return tuple(groups)
    return _proc_groups(pid)


def _proc_groups(pid: int) -> tuple[int, ...]:
    if pid <= 0:
        return ()
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Groups:"):
                    return tuple(int(g) for g in line.split()[1:])
    except (OSError, ValueError):
        pass
    return ()
