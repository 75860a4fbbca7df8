"""``memorizzctl mcp serve``: the stdio bridge to the MCP face's socket.

The installed entry point runs against a line server this test starts on a
temporary ``mcp.sock`` (the bridge is a byte pump: what the daemon says there
is not its business, so these tests need no daemon). What is held: bytes go
through unchanged and in order both ways, a closed stdin half-closes the
socket and the replies still arrive, the server closing ends the bridge with
status 0, the socket is found as every command finds it, errors go to stderr
with memorizzctl's exit statuses and nothing to stdout, and the path imports
built-in modules only.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator

import pytest

from memorizz import cli
from memorizz.api.paths import default_socket_path
from memorizz.ctl import run, serve
from memorizz.ctl.parser import build_parser
from tests.process import MEMORIZZCTL

"""The installed console script: what an MCP client starts."""

NOBODY = 65534
WAIT_S = 30  # a guard against a hang, never a measurement

Handler = Callable[[socket.socket, list[bytes]], None]


def _echo(conn: socket.socket, received: list[bytes]) -> None:
    """Each line back at once; after the bridge's EOF, one more line."""
    with conn.makefile("rb") as lines:
        for line in lines:
            received.append(line)
            conn.sendall(line)
    conn.sendall(b'{"after":"eof"}\n')


def _after_eof(conn: socket.socket, received: list[bytes]) -> None:
    """Nothing until the bridge's EOF; then every line back, last first."""
    with conn.makefile("rb") as lines:
        received.extend(lines)
    for line in reversed(received):
        conn.sendall(line)


def _one_reply(conn: socket.socket, received: list[bytes]) -> None:
    """One line back, then the server hangs up while the bridge's stdin is open."""
    with conn.makefile("rb") as lines:
        line = lines.readline()
    received.append(line)
    conn.sendall(line)


REFUSAL = (
    b'{"jsonrpc":"2.0","id":null,"error":{"code":-32001,'
    b'"message":"uid 1500 may not use this agent socket",'
    b'"data":{"reason":"permission_denied"}}}\n'
)


def _refuses(conn: socket.socket, received: list[bytes]) -> None:
    """As memorizzd refuses a peer at accept (an agent socket open to all in
    its mode, gated on uids in-process): one error line, then close, before
    reading anything."""
    conn.sendall(REFUSAL)
    conn.shutdown(socket.SHUT_RDWR)


def _invalid_first(conn: socket.socket, received: list[bytes]) -> None:
    """An id-less error of the session's own (a line it could not read)."""
    with conn.makefile("rb") as lines:
        received.append(lines.readline())
    conn.sendall(REFUSAL.replace(b"permission_denied", b"invalid_request"))


class LineServer:
    """A Unix socket server in a thread, at ``<tempdir>/mcp.sock``: one
    connection, served by ``handler``, then closed."""

    def __init__(self, base: str, handler: Handler) -> None:
        self.path = os.path.join(base, serve.MCP_SOCKET_NAME)
        self.received: list[bytes] = []
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self.path)
        self._listener.listen()
        self._handler = handler
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        try:
            conn, _ = self._listener.accept()
        except OSError:  # closed before anyone connected
            return
        with conn:
            self._handler(conn, self.received)

    def close(self) -> None:
        self._listener.close()
        self._thread.join(timeout=WAIT_S)


@pytest.fixture
def base() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="mzb-", dir="/tmp")  # AF_UNIX: < 108 bytes
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def server(base: str, request: pytest.FixtureRequest) -> Iterator[LineServer]:
    handler: Handler = getattr(request, "param", _echo)
    running = LineServer(base, handler)
    try:
        yield running
    finally:
        running.close()


def _bridge(
    *args: str, stdin: bytes = b"", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [MEMORIZZCTL, "mcp", "serve", *args],
        input=stdin,
        capture_output=True,
        # the pump, byte for byte (these servers are not memorizzd: they would
        # read the hand-over's request as one more line)
        env={**os.environ, "MEMORIZZ_BRIDGE": "pump", **(env or {})},
        timeout=WAIT_S,
        check=False,
    )


# --- the pump ---------------------------------------------------------------------

BIG = (
    b'{"jsonrpc":"2.0","id":3,"method":"x","params":{"d":"'
    + b"x" * (1 << 20)
    + b'"}}\n'
)
LINES = [
    b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}\n',
    '{"jsonrpc":"2.0","method":"n","params":{"t":"é ☃ 𝄞 日本"}}\n'.encode(),
    BIG,
    b'{"jsonrpc":"2.0","id":4,"result":{}}\n',
    b"\n",  # an empty line is bytes like any other
    b'{"jsonrpc":"2.0","id":5,"method":"last"}\n',
]


def test_lines_go_through_both_ways_unchanged_and_in_order(
    server: LineServer,
) -> None:
    done = _bridge("--mcp-socket", server.path, stdin=b"".join(LINES))
    assert done.returncode == 0, done.stderr
    assert done.stderr == b""
    assert b"".join(server.received) == b"".join(LINES)
    assert done.stdout == b"".join(LINES) + b'{"after":"eof"}\n'


@pytest.mark.parametrize("server", [_after_eof], indirect=True)
def test_stdin_eof_half_closes_and_the_replies_still_arrive(
    server: LineServer,
) -> None:
    """The server answers only once it has read the bridge's EOF: a bridge
    that stopped at its own stdin's end would print nothing."""
    done = _bridge("--mcp-socket", server.path, stdin=b"".join(LINES))
    assert done.returncode == 0, done.stderr
    assert done.stdout == b"".join(reversed(LINES))


@pytest.mark.parametrize("server", [_one_reply], indirect=True)
def test_the_server_closing_ends_the_bridge_with_status_0(
    server: LineServer,
) -> None:
    with subprocess.Popen(
        [MEMORIZZCTL, "mcp", "serve", "--mcp-socket", server.path],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "MEMORIZZ_BRIDGE": "pump"},
    ) as proc:
        assert proc.stdin is not None
        assert proc.stdout is not None
        assert proc.stderr is not None
        proc.stdin.write(LINES[0])
        proc.stdin.flush()  # and stdin stays open
        assert proc.stdout.readline() == LINES[0]
        assert proc.wait(timeout=WAIT_S) == 0
        assert proc.stdout.read() == b""
        assert proc.stderr.read() == b""
        proc.stdin.close()


@pytest.mark.parametrize("server", [_refuses], indirect=True)
@pytest.mark.parametrize("mode", ["pump", "hand-over"])
def test_a_daemon_that_refuses_this_user_is_said_on_stderr_with_status_77(
    server: LineServer, mode: str
) -> None:
    """The daemon's refusal was passed to the client as a reply (pump: exit
    0), or lost with the hand-over (exit 69, "connection reset by peer")."""
    env = {k: v for k, v in os.environ.items() if k != "MEMORIZZ_BRIDGE"}
    if mode == "pump":
        env["MEMORIZZ_BRIDGE"] = "pump"
    done = subprocess.run(
        [MEMORIZZCTL, "mcp", "serve", "--mcp-socket", server.path],
        input=LINES[0],
        capture_output=True,  # pipes: what a client gives, so the hand-over
        env=env,
        timeout=WAIT_S,
        check=False,
    )
    assert (done.returncode, done.stdout) == (77, b"")
    assert done.stderr.decode() == (
        f"memorizzctl: error: memorizzd refused the connection on {server.path}:"
        " uid 1500 may not use this agent socket (permission_denied)\n"
    )


@pytest.mark.parametrize("server", [_invalid_first], indirect=True)
def test_an_error_of_the_session_itself_goes_to_the_client(
    server: LineServer,
) -> None:
    done = _bridge("--mcp-socket", server.path, stdin=b"{}\n")
    assert (done.returncode, done.stderr) == (0, b"")
    assert done.stdout == REFUSAL.replace(b"permission_denied", b"invalid_request")


@pytest.mark.parametrize(
    ("args", "env"),
    [
        (["--socket", "{base}/api.sock"], {}),
        (["--socket={base}/api.sock"], {"MEMORIZZ_SOCKET": "/nowhere/d.sock"}),
        ([], {"MEMORIZZ_SOCKET": "{base}/memorizzd.sock"}),
        (["--mcp-socket", "{base}/mcp.sock"], {"MEMORIZZ_SOCKET": "/nowhere/d.sock"}),
    ],
)
def test_the_mcp_socket_is_the_sibling_of_the_api_socket(
    args: list[str], env: dict[str, str], base: str, server: LineServer
) -> None:
    """Stale API sockets here (nobody answers: the bridge only checks that one
    is there), and mcp.sock beside them; --mcp-socket looks at nothing else."""
    for name in ("api.sock", "memorizzd.sock"):
        _refusing(os.path.join(base, name))
    done = _bridge(
        *(a.format(base=base) for a in args),
        stdin=LINES[0],
        env={k: v.format(base=base) for k, v in env.items()},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(LINES[0])


# --- errors: stderr, the exit statuses, nothing on stdout ---------------------------


def _refusing(path: str) -> str:
    """A socket file nobody listens on: connect() is refused."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind(path)
    return path


@pytest.mark.parametrize("refused", [False, True], ids=["missing", "refused"])
def test_a_daemon_not_running_is_said_on_stderr_with_status_69(
    refused: bool, base: str
) -> None:
    """Missing: no socket at all, the API socket named is what is said.
    Refused: both sockets left behind by a daemon that stopped."""
    path = os.path.join(base, "mcp.sock")
    api = os.path.join(base, "api.sock")
    if refused:
        _refusing(path)
        _refusing(api)
    done = _bridge("--socket", api, stdin=LINES[0])
    assert (done.returncode, done.stdout) == (69, b"")
    err = done.stderr.decode()
    assert err.startswith(
        f"memorizzctl: error: cannot reach memorizzd's MCP socket at {path}: "
        if refused
        else f"memorizzctl: error: cannot reach memorizzd at {api}: "
    )
    assert "is memorizzd running? start it with" in err
    assert err.count("\n") == 1


def test_an_api_socket_without_its_mcp_socket_says_the_daemon_may_be_older(
    base: str,
) -> None:
    api = os.path.join(base, "api.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as older:
        older.bind(api)
        older.listen()  # a daemon answers there, with no face beside it
        done = _bridge("--socket", api)
    assert (done.returncode, done.stdout) == (69, b"")
    assert f"its API socket {api} answers" in done.stderr.decode()
    # a stale API socket (nobody answers) is no sign of an older daemon
    done = _bridge("--socket", api)
    assert (done.returncode, done.stdout) == (69, b"")
    assert "predate" not in done.stderr.decode()
    assert "is memorizzd running?" in done.stderr.decode()


def test_the_general_path_reports_as_the_fast_one(
    base: str, capfd: pytest.CaptureFixture[str]
) -> None:
    """A line only argparse takes runs the same bridge (``cmd_mcp_serve``)."""
    argv = ["--socket", os.path.join(base, "api.sock"), "mcp", "serve"]
    assert serve.parse(argv) is not None
    assert cli.main(argv) == 69
    fast = capfd.readouterr()
    assert run._general(argv) == 69
    assert capfd.readouterr() == fast
    assert fast.out == ""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to connect as another uid")
def test_a_socket_this_user_may_not_open_is_said_with_status_77(base: str) -> None:
    """The kernel refuses nobody on a root-owned 0600 socket. The client runs
    in a forked child (the interpreter lives under /root, which nobody cannot
    enter), through the same ``cli.main`` the console script calls."""
    os.chmod(base, 0o755)  # noqa: S103 - nobody must reach the socket to be refused
    path = os.path.join(base, serve.MCP_SOCKET_NAME)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    os.chmod(path, 0o600)
    listener.listen()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        status = 1
        try:
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115 - until _exit
            sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115 - until _exit
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            status = cli.main(["mcp", "serve", "--mcp-socket", path])
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(status)
    os.close(out_w)
    os.close(err_w)
    with os.fdopen(out_r, "rb") as out, os.fdopen(err_r, "rb") as err:
        stdout, stderr = out.read(), err.read().decode()
    _, wait_status = os.waitpid(pid, 0)
    listener.close()
    assert (os.waitstatus_to_exitcode(wait_status), stdout) == (77, b"")
    assert stderr == (
        f"memorizzctl: error: permission denied on {path}: this user needs"
        " access to that socket (ask for the memorizzd operators group, or use"
        " your agent socket)\n"
    )


# --- the command line -------------------------------------------------------------


def test_help_lists_serve(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["mcp", "--help"]) == 0
    assert "serve" in capsys.readouterr().out
    assert cli.main(["mcp", "serve", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--mcp-socket PATH" in out
    assert (
        '{"command": "memorizzctl", "args": ["mcp", "serve", "--socket", "PATH"]}'
        in out
    )


ACCEPTED = [
    ["mcp", "serve"],
    ["--socket", "/a/d.sock", "mcp", "serve"],
    ["mcp", "--socket=/a/d.sock", "serve", "--socket", "/b/api.sock"],
    ["mcp", "serve", "--mcp-socket", "/c/m.sock"],
    ["mcp", "serve", "--mcp-socket=/c/m.sock", "--socket", "/a/d.sock"],
    ["mcp", "serve", "--mcp-socket", "/c/m.sock", "--mcp-socket=/d/m.sock"],
    ["--json", "mcp", "serve", "--json"],
    ["--socket=/a/d.sock", "mcp", "serve"],
    ["--socket", "relative.sock", "mcp", "serve"],
]

DECLINED = [
    ["mcp", "serve", "--help"],
    ["mcp", "serve", "-h"],
    ["mcp", "serve", "extra"],
    ["mcp", "--mcp-socket", "/c/m.sock", "serve"],
    ["mcp", "serve", "--mcp-socket"],
    ["mcp", "serve", "--socket", "--json"],
    ["mcp", "serve", "--transport", "stdio"],
    ["serve"],
    ["mcp", "call", "serve", "t"],
]


@pytest.mark.parametrize("argv", ACCEPTED)
def test_the_hand_parser_reads_serve_as_argparse_does(
    argv: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEMORIZZ_SOCKET", "/env/memorizzd.sock")
    target = serve.parse(argv)
    args = build_parser().parse_args(argv)
    assert args.func.__name__ == "cmd_mcp_serve"
    assert target is not None
    api = getattr(args, "socket", None) or default_socket_path()
    expected = args.mcp_socket or os.path.join(os.path.dirname(api), "mcp.sock")
    assert target.mcp_socket == expected


@pytest.mark.parametrize("argv", DECLINED)
def test_the_hand_parser_leaves_everything_else_to_argparse(argv: list[str]) -> None:
    assert serve.parse(argv) is None


# --- what the path imports ----------------------------------------------------------

HEAVY = frozenset(
    {
        "msgspec", "argparse", "anyio", "asyncio", "mcp", "mcp_types", "uvloop",
        "typing", "json", "socket", "selectors", "threading", "memorizzd",
    }
)  # fmt: skip
SERVE_MODULES = frozenset(
    {
        "memorizz",
        "memorizz.api",
        "memorizz.api.paths",
        "memorizz.cli",
        "memorizz.ctl",
        "memorizz.ctl.run",
        "memorizz.ctl.oneshot",
        "memorizz.ctl.exits",
        "memorizz.ctl.serve",
    }
)


def test_the_bridge_imports_no_heavy_module(server: LineServer) -> None:
    done = _bridge(
        "--mcp-socket",
        server.path,
        stdin=LINES[0],
        env={"PYTHONPROFILEIMPORTTIME": "1"},
    )
    assert (done.returncode, done.stdout) == (0, LINES[0] + b'{"after":"eof"}\n')
    imported = set()
    for line in done.stderr.decode().splitlines():
        if line.startswith("import time:") and "|" in line:
            imported.add(line.rsplit("|", 1)[1].strip())
    assert "memorizz.ctl.serve" in imported  # the probe sees this path's modules
    heavy = {n for n in imported if n.partition(".")[0] in HEAVY}
    assert not heavy, sorted(heavy)
    assert {n for n in imported if n.partition(".")[0] == "memorizz"} == SERVE_MODULES
