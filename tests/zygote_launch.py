"""The process the daemon spawns for a zygote-forked SDK test server
(tests/zygote.py says why and how):

    python tests/zygote_launch.py ZYGOTE_SOCKET SCRIPT [ARGS...]

It hands its argv, environment, working directory and stdio to the zygote,
forwards the signals it gets to the forked server, and exits with its status.
"""

from __future__ import annotations

import array
import os
import signal
import socket
import sys

import msgspec


class Launch(msgspec.Struct):
    argv: list[str]
    env: dict[str, str]
    cwd: str


class Reply(msgspec.Struct):
    pid: int | None = None
    status: int | None = None


def main() -> int:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(sys.argv[1])
    launch = Launch(argv=sys.argv[2:], env=dict(os.environ), cwd=os.getcwd())
    fds = array.array("i", [0, 1, 2])
    sock.sendmsg(
        [msgspec.json.encode(launch)],
        [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds.tobytes())],
    )
    for fd in (0, 1):  # the server holds them now; ours would keep its pipes open
        os.close(fd)
    lines = sock.makefile("rb")
    started = msgspec.json.decode(lines.readline(), type=Reply)
    child = started.pid

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
    status = msgspec.json.decode(line, type=Reply).status
    if status is None:
        return 1
    if status < 0:  # killed by a signal: die of it too, as the server did
        signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
    return status


if __name__ == "__main__":
    sys.exit(main())
