"""``memorizzctl mcp serve``: an MCP client's stdio, bridged to memorizzd's MCP face.

Beside each API socket (the operator's ``memorizzd.sock``, each profile's
``api.sock``) the daemon serves MCP on a sibling socket, ``mcp.sock`` in the
same directory, framed as MCP's stdio transport: one JSON-RPC message per
line. An MCP client that only starts programs (``{"command": "memorizzctl",
"args": ["mcp", "serve"]}``) gets that socket through this bridge: a byte
pump, stdin to the socket and the socket to stdout, nothing parsed, nothing
buffered beyond one read, so every line arrives whole and in order.

    stdin closes     the socket's write side is shut down; replies still in
                     flight keep coming until the daemon closes
    daemon closes    the bridge exits, status 0 (whatever stdin still holds
                     has no one to go to)
    stdout closes    the client went away: exit 141, quietly

Errors go to stderr as ``memorizzctl: error: MSG``, one line each, never to
stdout (stdout is the protocol, so ``--json`` changes nothing here), with the exit
statuses of every other command (``memorizz.ctl.exits``): 69 when the socket
is missing or refuses the connection (which path, and how to start the
daemon), 77 when this user may not open it or the daemon refuses this user
(an agent socket that admits other uids: its error line, said on stderr
rather than passed to the client), 75 when it has too many connections.

``--socket PATH`` / ``$MEMORIZZ_SOCKET`` choose the API socket exactly as for
every other command, and the bridge opens its sibling ``mcp.sock``, once it
has seen (one stat) that the API socket is there and is a socket: a path that
is not is refused as every command refuses it, even with a live face beside
it. ``--mcp-socket PATH`` names the MCP socket itself, and nothing else is
looked at. ``parse`` reads the line by hand, as ``memorizz.ctl.oneshot`` does
for a plain call, and returns ``None`` for anything else (``--help``, a usage
error): the general path's argparse then says what is wrong, or, for a line
only it accepts, runs ``bridge`` too.

The hand-over: when stdin and stdout are pipes or sockets (an MCP client's
always are), the bridge does not pump at all. It sends them to the daemon on
its face connection (``memorizz/handoff``, the descriptors attached: see
memorizzd/rpc/handoff.py), the daemon reads and writes the client's pipes
itself, and the bridge only waits for the daemon to close the connection at
the end of the session (exit 0). Each message then skips one process and two
copies. A daemon that does not take them answers with an error and the bridge
pumps; ``MEMORIZZ_BRIDGE=pump`` asks for the pump.

Built-in modules only (``_socket``, ``_thread``): no argparse, no msgspec, no
event loop. The pump is two threads, each blocking on one side; the main
thread carries the replies, so Ctrl-C interrupts it and a daemon that closes
ends the process at once. tests/e2e/test_mcp_bridge.py holds the import set.
"""

from __future__ import annotations

import _socket
import _thread
import os
import sys

from memorizz.api.paths import default_socket_path
from memorizz.ctl.exits import (
    EXIT_BROKEN_PIPE,
    EXIT_NOPERM,
    EXIT_OK,
    EXIT_TEMPFAIL,
    EXIT_UNAVAILABLE,
    UNREACHABLE,
    not_a_socket,
    report,
)

MCP_SOCKET_NAME = "mcp.sock"
"""The MCP face's socket: this name, in the directory of its API socket."""


def start_hint() -> str:
    """``memorizz.client.start_hint``, for the MCP socket (that module imports msgspec)."""
    units = ("/etc/systemd/system", "/usr/lib/systemd/system", "/lib/systemd/system")
    checkout = os.path.dirname(
        os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
    )
    if any(os.path.exists(os.path.join(d, "memorizzd.service")) for d in units):
        how = "`systemctl start memorizzd`"
    elif os.path.exists(run := os.path.join(checkout, "scripts", "run")):
        how = f"`{run}` (foreground)"
    else:
        how = "`memorizzd` (foreground), or install the unit (scripts/install)"
    return (
        f"is memorizzd running? start it with {how}, or point "
        "--socket/MEMORIZZ_SOCKET at its API socket (or --mcp-socket at its mcp.sock)"
    )


_CHUNK = 1 << 16
_STDIN = 0
_STDOUT = 1
HANDOFF_LINE = b'{"jsonrpc":"2.0","id":"mz-handoff","method":"memorizz/handoff"}\n'
"""memorizzd.rpc.handoff's request (tests/e2e/test_bridge_handoff.py: the same)."""
HANDOFF_ACK = b'{"jsonrpc":"2.0","id":"mz-handoff","result":{}}\n'
_REFUSAL_HEAD = b'{"jsonrpc":"2.0","id":null,"error":'
_REFUSALS = {"permission_denied": EXIT_NOPERM, "overloaded": EXIT_TEMPFAIL}
"""The reasons the daemon refuses a connection with, at accept, before it
reads anything (memorizzd.rpc.server): the peer's uid or groups are not the
socket's, or it has too many connections."""
_S_IFMT = 0o170000
_S_IFIFO = 0o010000
_S_IFSOCK = 0o140000


class Bridge:
    """A parsed ``mcp serve`` line: the MCP socket, and the API socket it came from."""

    __slots__ = ("api_socket", "mcp_socket", "server")

    def __init__(
        self, mcp_socket: str, api_socket: str | None, server: str | None = None
    ) -> None:
        self.mcp_socket = mcp_socket
        self.api_socket = api_socket  # None when --mcp-socket named it
        self.server = server
        """``--server NAME``: the session shows that server only, its names
        unchanged (the face's ``memorizz/scope``, sent before anything else)."""


def mcp_socket_path(api_socket: str) -> str:
    """The MCP face's socket beside ``api_socket``."""
    return os.path.join(os.path.dirname(api_socket), MCP_SOCKET_NAME)


def bridge_for(
    api_socket: str, mcp_socket: str | None, server: str | None = None
) -> Bridge:
    """``--mcp-socket`` if given (and not empty), else the sibling of ``api_socket``."""
    if mcp_socket:
        return Bridge(mcp_socket, None, server)
    return Bridge(mcp_socket_path(api_socket), api_socket, server)


def scope_line(server: str) -> bytes:
    """The face's ``memorizz/scope`` notification for ``server`` (a name of
    letters, digits, ``-``, ``_`` and ``.``: nothing to escape)."""
    if not server or not all(
        c.isascii() and (c.isalnum() or c in "-_.") for c in server
    ):
        raise ValueError(f"not a server name: {server!r}")
    return (
        b'{"jsonrpc":"2.0","method":"memorizz/scope","params":{"server":"'
        + server.encode()
        + b'"}}\n'
    )


# --- the line -------------------------------------------------------------------


def parse(argv: list[str]) -> Bridge | None:
    """``mcp serve [--socket PATH] [--mcp-socket PATH] [--json]``, or ``None``.

    What argparse accepts, spelled ``--opt VALUE`` or ``--opt=VALUE``, the later
    one winning: ``--socket`` and ``--json`` anywhere (``--json`` changes
    nothing here), ``--mcp-socket`` after ``serve``."""
    words: list[str] = []
    api_socket = ""
    mcp_socket = ""
    i = 0
    while i < len(argv):
        word = argv[i]
        i += 1
        if not word.startswith("-"):
            words.append(word)
            continue
        if word == "--json":
            continue
        name, eq, value = word.partition("=")
        if name not in ("--socket", "--mcp-socket") or (
            name == "--mcp-socket" and words != ["mcp", "serve"]
        ):
            return None
        if not eq:
            if i == len(argv) or argv[i].startswith("-"):
                return None  # argparse reads a leading '-' as an option, or fails
            value = argv[i]
            i += 1
        if name == "--socket":
            api_socket = value
        else:
            mcp_socket = value
    if words != ["mcp", "serve"]:
        return None
    return bridge_for(api_socket or default_socket_path(), mcp_socket)


# --- the pump -------------------------------------------------------------------


def _error(message: str) -> None:
    """``memorizzctl: error: MSG`` on stderr: always there, even with
    ``--json`` (stdout is the protocol)."""
    report(message, reason=UNREACHABLE)


class Refused(Exception):
    """The daemon refused the connection itself: its one error line, then
    its close. Said on stderr with its exit status."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def check_refusal(data: bytes, path: str) -> None:
    """Raise ``Refused`` if ``data``, the first bytes the daemon sent, is its
    refusal of the connection (an error line without an id, for one of
    ``_REFUSALS``' reasons); anything else is the session's own."""
    if not data.startswith(_REFUSAL_HEAD):
        return
    import msgspec  # only for a refusal: the bridge's path stays small

    try:
        line = msgspec.json.decode(data.split(b"\n", 1)[0], type=dict[str, object])
    except msgspec.DecodeError:  # a ValidationError too
        return
    error = line.get("error")
    if not isinstance(error, dict) or not isinstance(error.get("data"), dict):
        return
    message, reason = error.get("message"), error["data"].get("reason")
    if isinstance(message, str) and isinstance(reason, str) and reason in _REFUSALS:
        raise Refused(
            f"memorizzd refused the connection on {path}: {message} ({reason})",
            _REFUSALS[reason],
        )


def _queued(sock: _socket.socket) -> bytes:
    """What the daemon sent before it closed, without waiting for more."""
    data = b""
    while True:
        try:
            chunk = sock.recv(_CHUNK, _socket.MSG_DONTWAIT)
        except OSError:
            return data
        if not chunk:
            return data
        data += chunk


def _answers(path: str) -> bool:
    """Whether a daemon listens on the socket at ``path``."""
    probe = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError:
        return False
    finally:
        probe.close()
    return True


def api_socket_missing(api: str) -> str | None:
    """Why the API socket the line named cannot be a daemon's, or ``None``.

    The bridge opens the face beside it and never connects to it, so a path
    that is not there (mistyped, a stopped daemon's, another profile's) would
    go unnoticed whenever a live ``mcp.sock`` sits in that directory (the
    operator's, or a profile's as a container mounts it). One stat; what it
    cannot tell (a directory this user may not search) is left to connect."""
    try:
        mode = os.stat(api).st_mode
    except (FileNotFoundError, NotADirectoryError) as exc:
        return f"cannot reach memorizzd at {api}: {exc.strerror}; {start_hint()}"
    except (OSError, ValueError):
        return None
    if mode & _S_IFMT == _S_IFSOCK:
        return None
    why = not_a_socket(api) or f"{api} is not a socket"
    return f"cannot reach memorizzd: {why}; point --socket/MEMORIZZ_SOCKET at its API socket"


def connect(bridge: Bridge) -> _socket.socket | int:
    """The connected socket, or the exit status after saying why not."""
    path = bridge.mcp_socket
    api = bridge.api_socket
    if api is not None and (missing := api_socket_missing(api)) is not None:
        _error(missing)
        return EXIT_UNAVAILABLE
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except (FileNotFoundError, ConnectionRefusedError) as exc:
        sock.close()
        where = f"cannot reach memorizzd's MCP socket at {path}: {exc.strerror}"
        if (why := not_a_socket(path)) is not None:
            _error(
                f"cannot reach memorizzd's MCP socket: {why}; point --mcp-socket at its mcp.sock"
            )
        elif isinstance(exc, FileNotFoundError) and api is not None and _answers(api):
            _error(
                f"{where}; its API socket {api} answers: its MCP face may be turned off"
                " (`mcp_face = false` in its config) or this memorizzd may predate it"
                " (upgrade and restart it)"
            )
        else:
            _error(f"{where}; {start_hint()}")
        return EXIT_UNAVAILABLE
    except PermissionError:
        sock.close()
        _error(
            f"permission denied on {path}: this user needs access to that socket "
            "(ask for the memorizzd operators group, or use your agent socket)"
        )
        return EXIT_NOPERM
    except OSError as exc:  # e.g. a path too long for AF_UNIX
        sock.close()
        _error(f"cannot reach memorizzd's MCP socket at {path}: {exc}")
        return EXIT_UNAVAILABLE
    if bridge.server is not None:  # before anything of the client's
        try:
            sock.sendall(scope_line(bridge.server))
        except OSError as exc:
            sock.close()
            _error(f"cannot reach memorizzd's MCP socket at {path}: {exc}")
            return EXIT_UNAVAILABLE
    return sock


def _wait(fd: int, *, writable: bool) -> None:
    """Until ``fd`` is ready: only for a client that made its pipe non-blocking."""
    import select

    select.select([] if writable else [fd], [fd] if writable else [], [])


def _read(fd: int) -> bytes:
    while True:
        try:
            return os.read(fd, _CHUNK)
        except BlockingIOError:
            _wait(fd, writable=False)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            written = os.write(fd, view)
        except BlockingIOError:
            _wait(fd, writable=True)
            continue
        view = view[written:]


def _requests(sock: _socket.socket) -> None:
    """stdin -> socket, then half-close: runs in its own thread."""
    try:
        while data := _read(_STDIN):
            sock.sendall(data)
    except OSError:
        # stdin unreadable: as its end. The socket broke: the replies' side
        # sees it too, and reports it.
        pass
    try:
        sock.shutdown(_socket.SHUT_WR)
    except OSError:
        pass


_kept: list[_socket.socket] = []


def _handable(fd: int) -> bool:
    try:
        kind = os.fstat(fd).st_mode & _S_IFMT
    except OSError:
        return False
    return kind in (_S_IFIFO, _S_IFSOCK)


def hand_over(sock: _socket.socket, path: str) -> bool:
    """Give stdin and stdout to the daemon; whether it took them (False: pump).

    Only pipes and sockets are offered (a terminal or a file is pumped). The
    daemon's answer is one line on the socket: its ack, or an error. Raises
    ``Refused`` when the daemon refused the connection before it read the
    request (it may have closed before the request was sent, too)."""
    if os.environ.get("MEMORIZZ_BRIDGE") == "pump":
        return False
    if not (_handable(_STDIN) and _handable(_STDOUT)):
        return False
    fds = _STDIN.to_bytes(4, sys.byteorder) + _STDOUT.to_bytes(4, sys.byteorder)
    try:
        sock.sendmsg([HANDOFF_LINE], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, fds)])
    except OSError:
        check_refusal(_queued(sock), path)
        raise
    answer = b""
    while not answer.endswith(b"\n"):
        data = sock.recv(1)  # one line, and not a byte of what may follow it
        if not data:
            break
        answer += data
    if answer != HANDOFF_ACK:
        check_refusal(answer, path)
        return False
    # The daemon has them: let go of ours, so the client sees our end close
    # when the daemon's does.
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, _STDIN)
    os.dup2(devnull, _STDOUT)
    os.close(devnull)
    return True


def bridge(target: Bridge) -> int:
    """Connect, then pump until the daemon closes; return the exit status."""
    connected = connect(target)
    if isinstance(connected, int):
        return connected
    sock = connected
    try:
        handed = hand_over(sock, target.mcp_socket)
    except Refused as exc:
        _error(str(exc))
        return exc.status
    except OSError as exc:
        _error(
            f"connection to memorizzd's MCP socket at {target.mcp_socket} broke: {exc}"
        )
        return EXIT_UNAVAILABLE
    if handed:
        try:
            while sock.recv(_CHUNK):  # nothing comes: the daemon closes at the end
                pass
        except OSError:
            pass
        return EXIT_OK
    # Never closed before the process ends: the requests' thread may still be
    # sending on it, and a closed descriptor's number could be reused.
    _kept.append(sock)
    _thread.start_new_thread(_requests, (sock,))
    first = True
    while True:
        try:
            data = sock.recv(_CHUNK)
        except OSError as exc:
            _error(
                f"connection to memorizzd's MCP socket at {target.mcp_socket}"
                f" broke: {exc}"
            )
            return EXIT_UNAVAILABLE
        if not data:
            return EXIT_OK
        if first:  # a refusal comes before anything else, and only then
            first = False
            try:
                check_refusal(data, target.mcp_socket)
            except Refused as exc:
                _error(str(exc))
                return exc.status
        try:
            _write_all(_STDOUT, data)
        except BrokenPipeError:  # the client closed its end: nothing to say
            return EXIT_BROKEN_PIPE
        except OSError as exc:
            _error(f"cannot write to standard output: {exc}")
            return EXIT_BROKEN_PIPE
