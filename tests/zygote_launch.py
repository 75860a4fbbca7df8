"""The process the daemon spawns for a zygote-forked SDK test server
(tests/zygote.py says why and how):

    python tests/zygote_launch.py ZYGOTE_SOCKET SCRIPT [ARGS...]

It hands its argv, environment, working directory and stdio to the zygote,
forwards the signals it gets to the forked server, and exits with its status.

The standard library only, and little of it: the daemon starts one of these
for every test server, and ``import msgspec`` alone cost this process four
times the CPU of the rest of its life. The zygote's protocol is as plain:
``pack`` below, and ``pid N`` then ``status N`` lines back.
"""

from __future__ import annotations

import array
import os
import signal
import socket
import sys


def pack(argv: list[str], env: dict[str, str], cwd: str) -> bytes:
    """The launch as the zygote reads it (``unpack``): NUL-separated fields
    (none can hold a NUL), the working directory, the argv's length, the
    argv, then the environment as ``NAME=VALUE``; bytes as the OS gave them."""
    fields = [cwd, str(len(argv)), *argv, *(f"{k}={v}" for k, v in env.items())]
    return b"\0".join(os.fsencode(f) for f in fields)


def unpack(data: bytes) -> tuple[list[str], dict[str, str], str]:
    """``pack``'s fields back: (argv, env, cwd); ValueError if it is not one."""
    cwd, count, *rest = (os.fsdecode(f) for f in data.split(b"\0"))
    n = int(count)
    if n < 1 or n > len(rest):
        raise ValueError("not a launch")
    env = dict(item.split("=", 1) for item in rest[n:])
    return rest[:n], env, cwd


def _number(line: bytes, name: str) -> int | None:
    """``N`` of a ``NAME N`` line, else None."""
    word, _, value = line.decode("ascii", "replace").strip().partition(" ")
    try:
        return int(value) if word == name else None
    except ValueError:
        return None


def main() -> int:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(sys.argv[1])
    launch = pack(sys.argv[2:], dict(os.environ), os.getcwd())
    fds = array.array("i", [0, 1, 2])
    sock.sendmsg([launch], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds.tobytes())])
    for fd in (0, 1):  # the server holds them now; ours would keep its pipes open
        os.close(fd)
    lines = sock.makefile("rb")
    child = _number(lines.readline(), "pid")

    def forward(signum: int, _frame: object) -> None:
        if child is not None:
            try:
                os.kill(child, signum)
            except ProcessLookupError:
                pass

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, forward)
    line = lines.readline()
    if not line:
        return 1
    status = _number(line, "status")
    if status is None:
        return 1
    if status < 0:  # killed by a signal: die of it too, as the server did
        signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
    return status


if __name__ == "__main__":
    sys.exit(main())
