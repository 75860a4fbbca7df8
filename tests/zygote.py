"""Test-server zygote: SDK test servers forked from a process that has already
imported the MCP SDK.

Starting ``python tests/mcp_server.py`` costs over a second of CPU, nearly all
of it ``import mcp`` (pydantic building the protocol's models), and the suite
starts the SDK test servers over a hundred times. So each test worker starts
one zygote, which imports the SDK once; the daemon under test still spawns a
real process for every server, but that process is ``tests/zygote_launch.py``
(the standard library only: milliseconds), which hands its argv,
environment, working directory and stdio descriptors to the zygote over a Unix
socket. The zygote forks a child that takes them and runs the server script as
``__main__``, with the SDK already loaded. The launcher forwards the signals
it gets to the child and exits with the child's status; when the launcher
dies (SIGKILL included), the zygote sees its connection close and kills the
child. The daemon sees a stdio server that behaves as one: its pipes, its
exit, its signals.

What differs from a real spawn: the child is not in the launcher's process
group, and its pid is not the one the daemon knows. Tests that look at
process groups or pids spawn the server for real (``stdio_spec`` with
``args`` of their own: ``tests.harness.spawned_spec``).

    python tests/zygote.py SOCKET     (tests.harness starts it, once per worker)
"""

from __future__ import annotations

import array
import os
import runpy
import select
import signal
import socket
import sys
import traceback

# What the test servers import, loaded once here (mcp: the reason this exists).
import mcp.server.mcpserver  # noqa: F401
import mcp_types  # noqa: F401
import msgspec
import pydantic  # noqa: F401

from zygote_launch import unpack  # run as a script: tests/ is on the path


class Launch(msgspec.Struct):
    argv: list[str]
    env: dict[str, str]
    cwd: str


_MAX_FDS = 3
_MAX_MESSAGE = 1 << 20


def _receive(conn: socket.socket) -> tuple[Launch, list[int]]:
    fds = array.array("i")
    data, ancdata, _, _ = conn.recvmsg(
        _MAX_MESSAGE, socket.CMSG_SPACE(_MAX_FDS * fds.itemsize)
    )
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    try:
        argv, env, cwd = unpack(data)
    except ValueError:
        for fd in fds:
            os.close(fd)
        raise
    return Launch(argv=argv, env=env, cwd=cwd), list(fds)


def _child(
    listener: socket.socket, conns: list[socket.socket], launch: Launch, fds: list[int]
) -> None:
    """In the forked child: become the server the launcher was asked to run."""
    status = 0
    try:
        listener.close()
        for conn in conns:
            conn.close()
        for number, fd in enumerate(fds):
            os.dup2(fd, number)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.environ.clear()
        os.environ.update(launch.env)
        os.chdir(launch.cwd)
        sys.argv = list(launch.argv)
        sys.path[0] = os.path.dirname(os.path.abspath(launch.argv[0]))
        runpy.run_path(launch.argv[0], run_name="__main__")
    except SystemExit as exc:
        code = exc.code
        status = code if isinstance(code, int) else (0 if code is None else 1)
    except BaseException:  # noqa: BLE001 - said on the server's stderr, as Python would
        traceback.print_exc()
        status = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(status)


def main() -> None:
    path = sys.argv[1]
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    print("ready", flush=True)
    children: dict[int, socket.socket] = {}  # child pid -> its launcher
    launchers: dict[socket.socket, int] = {}
    while True:
        readable, _, _ = select.select([listener, *launchers], [], [], 0.05)
        for ready in readable:
            if ready is listener:
                conn, _ = listener.accept()
                try:
                    launch, fds = _receive(conn)
                except (OSError, ValueError):
                    conn.close()  # a launcher that died before it asked: none to run
                    continue
                pid = os.fork()
                if pid == 0:
                    _child(listener, [conn, *launchers], launch, fds)
                for fd in fds:
                    os.close(fd)
                children[pid] = conn
                launchers[conn] = pid
                try:
                    conn.sendall(f"pid {pid}\n".encode())
                except OSError:  # the launcher is gone: its closed socket says so next
                    pass
            else:  # a launcher went away (it sends nothing more): kill its child
                try:
                    if ready.recv(1):
                        continue
                except OSError:
                    pass
                pid = launchers.pop(ready)
                ready.close()
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            conn = children.pop(pid, None)
            if conn is None:
                continue
            if launchers.pop(conn, None) is not None:
                try:
                    exited = os.waitstatus_to_exitcode(status)
                    conn.sendall(f"status {exited}\n".encode())
                except OSError:
                    pass
                conn.close()


if __name__ == "__main__":
    main()
