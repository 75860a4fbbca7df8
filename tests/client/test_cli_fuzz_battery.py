"""memorizzctl against random command lines, from the outside: every leaf of
the real parser (built from ``memorizz.ctl.parser``, each lazy parser
forced), given missing and extra positionals, unknown options, options
without values, values of the wrong type, malformed ``--arguments``, odd
``--timeout`` values, names with newlines, NULs and undecodable bytes, and
``--socket`` at a missing path, a directory, a regular file and a path too
long for a Unix socket. No daemon runs.

Each line must end in a documented exit status (``memorizz.ctl.exits``),
with no traceback, and a failure must be said once: one ``memorizzctl:
error:`` line on stderr (after the usage line for a usage error), or with
``--json`` one JSON error line on stdout. The plain ``mcp call`` has a parser
of its own (``memorizz.ctl.oneshot``); a line it accepts must be one argparse
accepts too, with the same meaning.

Seeded (``random.Random``): a failure names its seed and its line.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import pytest

from memorizz import cli
from memorizz.ctl import oneshot
from memorizz.ctl.exits import (
    ERROR_PREFIX,
    EXIT_ERROR,
    EXIT_NOPERM,
    EXIT_OK,
    EXIT_TEMPFAIL,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
)
from memorizz.ctl.parser import _Lazy, build_parser
from tests.unix_server import UnixServer

CTL_EXE = Path(sys.executable).with_name("memorizzctl")
DOCUMENTED = {
    EXIT_OK,
    EXIT_ERROR,
    EXIT_USAGE,
    EXIT_UNAVAILABLE,
    EXIT_TEMPFAIL,
    EXIT_NOPERM,
}
"""What a line can end in with no daemon and nobody interrupting (130 and 141
need a signal or a reader that leaves)."""
CASES_IN_PROCESS = 600
CASES_EXECUTABLE = 24


# --- the parser's leaves ---------------------------------------------------------


@dataclass
class Leaf:
    path: tuple[str, ...]
    positionals: list[argparse.Action] = field(default_factory=list)
    options: list[argparse.Action] = field(default_factory=list)


def _leaves(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> Iterator[Leaf]:
    groups = [a for a in parser._actions if isinstance(a, _Lazy)]
    if not groups:
        leaf = Leaf(path)
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            if action.option_strings:
                leaf.options.append(action)
            else:
                leaf.positionals.append(action)
        yield leaf
        return
    for group in groups:
        for name, (fill, kwargs) in list(group._pending.items()):
            if name not in group._name_parser_map:
                fill(group.add_parser(name, **kwargs))
            yield from _leaves(group._name_parser_map[name], (*path, name))


LEAVES = list(_leaves(build_parser(), ()))


def test_the_parser_has_the_commands_the_battery_expects() -> None:
    paths = {" ".join(leaf.path) for leaf in LEAVES}
    assert {"mcp call", "mcp add", "mcp task result", "daemon status", "ping"} <= paths
    assert len(paths) >= 30


# --- random words -------------------------------------------------------------------


@dataclass
class Places:
    """The temporary paths a line may name."""

    root: Path
    missing: str
    directory: str
    regular: str
    too_long: str
    json_file: str
    bad_json_file: str
    latin1_file: str


@pytest.fixture(scope="module")
def places() -> Iterator[Places]:
    with tempfile.TemporaryDirectory(prefix="mz-fz-") as d:
        root = Path(d)
        (root / "dir").mkdir()
        (root / "file").write_text("not a socket\n")
        (root / "args.json").write_text('{"a": 1}')
        (root / "bad.json").write_text('{"a": ')
        (root / "latin1.json").write_bytes(b'{"caf\xe9": 1}')
        yield Places(
            root=root,
            missing=str(root / "nothing.sock"),
            directory=str(root / "dir"),
            regular=str(root / "file"),
            too_long=str(root / ("x" * 200)),
            json_file=str(root / "args.json"),
            bad_json_file=str(root / "bad.json"),
            latin1_file=str(root / "latin1.json"),
        )


NAMES = [
    "fs",
    "a.b-c_d",
    "",
    " ",
    "-",
    "--",
    "x" * 300,
    "na\nme",
    "na\tme",
    "n\x1bme",
    "caf\udce9",  # an undecodable byte, as Python hands it over (surrogateescape)
    "\udcff\udcfe",
    "日本",
    "..",
    "../etc",
    "file:///x",
    "K=V",
    "=v",
    "Name: value",
    "0",
    "-1",
    "nan",
]
NUL_NAMES = ["a\0b", "\0"]
"""In-process only: a real command line cannot hold a NUL."""
NUMBERS = [
    "0",
    "-0",
    "-1",
    "1",
    "0.5",
    "3600",
    "3601",
    "300",
    "301",
    "1000",
    "1001",
    "nan",
    "NaN",
    "-nan",
    "inf",
    "-inf",
    "Infinity",
    "1e400",
    "1e-400",
    "9" * 30,
    "9" * 5000,  # past int()'s digit limit
    "0x10",
    "1_0",
    " 2 ",
    "\uff11",
    "",
    "abc",
    "2\udcff",
]
JSONS = [
    "{",
    "}",
    "{}",
    '{"a": 1}',
    "[1, 2]",
    "null",
    "1",
    '"s"',
    "",
    "   ",
    "\ufeff{}",
    '{"a": NaN}',
    '{"a": Infinity}',
    '{"a": 1e999}',
    '{"a": "\\ud800"}',
    '{"a": "\udcff"}',
    '{"a": "\x01"}',
    '{"a": 1} x',
    '{"a": 1}{"b": 2}',
    "[" * 5000 + "]" * 5000,
    '{"a":' * 3000 + "1" + "}" * 3000,
    '{"k": "' + "v" * 200_000 + '"}',
    "-",
]


def _jsons(places: Places) -> list[str]:
    return [
        *JSONS,
        f"@{places.missing}",
        f"@{places.directory}",
        f"@{places.json_file}",
        f"@{places.bad_json_file}",
        f"@{places.latin1_file}",
        "@",
        "@\udcff",
    ]


def _sockets(places: Places) -> list[str]:
    return [
        places.missing,
        places.directory,
        places.regular,
        places.too_long,
        "",
        "relative.sock",
        f"{places.missing}\udcff",
    ]


UNKNOWN = ["--frobnicate", "-x", "--soc", "--json=yes", "--help=x", "---", "-"]


def _value_for(rng: random.Random, action: argparse.Action, places: Places) -> str:
    if action.dest == "arguments":
        return rng.choice(_jsons(places))
    if action.dest in ("socket", "mcp_socket", "metrics_socket"):
        return rng.choice(_sockets(places))
    if action.choices is not None and rng.random() < 0.5:
        choices = [str(c) for c in action.choices]
        if "streamable-http" in choices:  # serving HTTP would not end
            choices.remove("streamable-http")
        return rng.choice([*choices, "nope", ""])
    if action.type is not None and rng.random() < 0.7:
        return rng.choice([*NUMBERS, "K=V", "=v", "K", "Name: v", ":"])
    return rng.choice(NAMES)


def _line(
    rng: random.Random, places: Places, *, nul: bool, at: str | None = None
) -> list[str]:
    leaf = rng.choice(LEAVES)
    names = NAMES + NUL_NAMES if nul else NAMES
    argv: list[str] = list(leaf.path)
    if rng.random() < 0.05:  # a command cut short, or a typo in it
        argv = argv[: rng.randrange(len(argv) + 1)]
        if rng.random() < 0.5:
            argv.append(rng.choice(["mpc", "MCP", "", "list\n"]))
    want = sum(
        1 if a.nargs in (None, "?") else 2 if a.nargs in ("+", "*") else 1
        for a in leaf.positionals
    )
    count = max(0, want + rng.choice([-2, -1, 0, 0, 0, 0, 1, 2]))
    argv += [rng.choice(names) for _ in range(count)]
    options = [o for o in leaf.options if not isinstance(o, argparse._VersionAction)]
    for _ in range(rng.choice([0, 1, 1, 2, 3])):
        if not options:
            break
        action = rng.choice(options)
        flag = rng.choice(action.option_strings)
        if action.nargs == 0:
            argv.insert(rng.randrange(len(argv) + 1), flag)
            continue
        roll = rng.random()
        if roll < 0.1:
            argv.append(flag)  # no value
        elif roll < 0.3:
            argv.append(f"{flag}={_value_for(rng, action, places)}")
        else:
            argv += [flag, _value_for(rng, action, places)]
    if rng.random() < 0.15:
        argv.insert(rng.randrange(len(argv) + 1), rng.choice(UNKNOWN))
    if rng.random() < 0.1:
        argv += ["--", *(rng.choice(names) for _ in range(rng.randrange(3)))]
    if rng.random() < 0.2:
        argv.insert(rng.randrange(len(argv) + 1), "--json")
    if "--socket" not in argv and not any(w.startswith("--socket=") for w in argv):
        argv[:0] = ["--socket", at or rng.choice(_sockets(places)[:4])]
    return argv


# --- a socket that is not memorizzd ----------------------------------------------


LIES = [
    b"",
    b"garbage\n",
    b"\xff\xfe\n",
    b"[" * 5000 + b"\n",
    b'{"jsonrpc":"2.0","id":%(id)s,"result":null}\n',
    b'{"jsonrpc":"2.0","id":%(id)s,"result":{}}\n',
    b'{"jsonrpc":"2.0","id":%(id)s,"result":[1,"x",{"a":NaN}]}\n',
    b'{"jsonrpc":"2.0","id":999,"result":{}}\n',
    (
        b'{"jsonrpc":"2.0","id":%(id)s,"error":{"code":-32001,"message":"no",'
        b'"data":{"reason":"permission_denied"}}}\n'
    ),
    (
        b'{"jsonrpc":"2.0","id":%(id)s,"error":{"code":-32003,"message":"",'
        b'"data":{"reason":""}}}\n'
    ),
    b'{"jsonrpc":"2.0","id":%(id)s,"error":{"code":"x","message":7}}\n',
    (
        b'{"jsonrpc":"2.0","id":%(id)s,"error":{"code":-32005,"message":"late\\n\\u0000",'
        b'"data":{"reason":"deadline_exceeded"}}}\n'
    ),
    b'{"jsonrpc":"2.0","method":"notifications/progress","params":{}}\n',
    b"a" * (1 << 20),
]
"""What the liar answers a request with (``%(id)s``: the request's id), then
it closes the connection."""


class Liar(UnixServer):
    """A Unix socket that answers each request line with a seeded lie."""

    def __init__(self, path: str, seed: int) -> None:
        super().__init__(path)
        self._rng = random.Random(seed)  # noqa: S311 - seeded on purpose
        self.start()

    def serve(self, conn: socket.socket) -> None:
        conn.settimeout(2)
        try:
            request = conn.makefile("rb").readline(1 << 22)
            try:
                ident = msgspec.json.decode(request).get("id", 1)
            except (msgspec.DecodeError, AttributeError):
                ident = 1
            lie = self._rng.choice(LIES)
            if b"%(id)s" in lie:
                lie = lie % {b"id": str(ident).encode()}
            conn.sendall(lie)
        except OSError:
            return


@pytest.fixture
def liar(places: Places) -> Iterator[Liar]:
    path = str(places.root / "liar.sock")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    lying = Liar(path, seed=42)
    try:
        yield lying
    finally:
        lying.close()


@pytest.mark.parametrize("seed", range(2))
def test_random_lines_against_a_socket_that_lies(
    seed: int, places: Places, liar: Liar
) -> None:
    """Replies that are not memorizzd's: each is a malformed reply, an
    unreachable daemon or the error it claims to be, said once."""
    rng = random.Random(500 + seed)  # noqa: S311 - seeded on purpose
    for _ in range(100):
        argv = _line(rng, places, nul=False, at=liar.path)
        check(argv, _in_process(argv))


# --- running a line ---------------------------------------------------------------


@dataclass
class Outcome:
    status: int
    out: str
    err: str


def _in_process(argv: list[str]) -> Outcome:
    """``memorizzctl`` in this process: stdin empty, stdout and stderr caught.
    Anything that escapes ``main`` fails the case; so does a line that takes
    more than 20 s (nothing here waits on a daemon)."""
    out, err = io.StringIO(), io.StringIO()
    done: list[int] = []
    escaped: list[BaseException] = []

    def run() -> None:
        try:
            done.append(cli.main(list(argv)))
        except BaseException as exc:  # noqa: BLE001 - what escapes is the finding
            escaped.append(exc)

    saved = sys.stdin
    sys.stdin = io.StringIO("")
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            worker = threading.Thread(target=run, daemon=True)
            worker.start()
            worker.join(20)
    finally:
        sys.stdin = saved
    assert not worker.is_alive(), f"{argv!r} did not end"
    if escaped:
        raise AssertionError(f"{argv!r} raised {escaped[0]!r}") from escaped[0]
    return Outcome(done[0], out.getvalue(), err.getvalue())


def _json_error(line: str) -> bool:
    try:
        doc = msgspec.json.decode(line)
    except msgspec.DecodeError:
        return False
    return isinstance(doc, dict) and isinstance(doc.get("error"), dict)


def check(argv: list[str], got: Outcome) -> None:
    where = f"argv={argv!r} status={got.status} stderr={got.err[-600:]!r}"
    assert got.status in DOCUMENTED, where
    assert "Traceback" not in got.err, where
    said = [line for line in got.err.splitlines() if line.startswith(ERROR_PREFIX)]
    as_json = [line for line in got.out.splitlines() if _json_error(line)]
    if got.status == EXIT_OK:
        assert not said, where
        assert not as_json, where
        return
    if not argv:  # bare: the help on stdout, exit 2
        return
    assert len(said) + len(as_json) == 1, where
    if said:
        assert said[0][len(ERROR_PREFIX) :].strip(), where
    else:
        message = msgspec.json.decode(as_json[0])["error"]["message"]
        assert isinstance(message, str), where
        assert message.strip(), where
    if got.status == EXIT_USAGE and said:
        assert "usage:" in got.err, where


# --- the batteries ----------------------------------------------------------------


@pytest.mark.parametrize("seed", range(6))
def test_random_lines_in_process(seed: int, places: Places) -> None:
    rng = random.Random(seed)  # noqa: S311 - seeded on purpose
    for _ in range(CASES_IN_PROCESS // 6):
        argv = _line(rng, places, nul=True)
        check(argv, _in_process(argv))


def _reference(argv: list[str]) -> argparse.Namespace | None:
    """What argparse makes of the line (None: a usage error)."""
    head = argv
    with (
        contextlib.redirect_stderr(io.StringIO()),
        contextlib.redirect_stdout(io.StringIO()),
    ):
        try:
            return build_parser().parse_args(head)
        except SystemExit:
            return None


def _call_line(rng: random.Random, places: Places) -> list[str]:
    argv = ["mcp", "call", rng.choice(NAMES), rng.choice(NAMES)]
    for _ in range(rng.randrange(4)):
        flag = rng.choice(["--arguments", "--timeout", "--socket", "--json"])
        if flag == "--json":
            value: str | None = None
        elif flag == "--arguments":
            value = rng.choice(JSONS[:-3])
        elif flag == "--timeout":
            value = rng.choice(NUMBERS)
        else:
            value = rng.choice(_sockets(places))
        at = rng.randrange(len(argv) + 1)
        if value is None:
            argv.insert(at, flag)
        elif rng.random() < 0.5:
            argv.insert(at, f"{flag}={value}")
        else:
            argv[at:at] = [flag, value]
    return argv


@pytest.mark.parametrize("seed", range(3))
def test_what_the_one_shot_accepts_argparse_accepts_alike(
    seed: int, places: Places, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "isatty", lambda fd: False)
    rng = random.Random(1000 + seed)  # noqa: S311 - seeded on purpose
    for _ in range(150):
        argv = _call_line(rng, places)
        call = oneshot.parse(argv)
        if call is None:
            continue
        args = _reference(argv)
        assert args is not None, f"one-shot took {argv!r}; argparse refuses it"
        sent = msgspec.json.decode(call.line)["params"]
        assert call.socket_path == getattr(args, "socket", call.socket_path), argv
        assert call.as_json == bool(getattr(args, "json", False)), argv
        assert (sent["server"], sent["name"]) == (args.server, args.tool), argv
        assert sent["arguments"] == args.arguments, argv
        assert sent["timeout_s"] == args.timeout, argv


def test_random_lines_through_the_executable(places: Places) -> None:
    """A smaller sample through the installed ``memorizzctl``: the bytes on
    the line are the surrogate-escaped words, as a shell would pass them."""
    rng = random.Random(7)  # noqa: S311 - seeded on purpose
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMORIZZ_")}
    env["LC_ALL"] = "C.UTF-8"
    for _ in range(CASES_EXECUTABLE):
        argv = _line(rng, places, nul=False)
        done = subprocess.run(
            [str(CTL_EXE), *(os.fsencode(w) for w in argv)],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            env=env,
            timeout=30,
            check=False,
        )
        got = Outcome(
            done.returncode,
            done.stdout.decode("utf-8", "backslashreplace"),
            done.stderr.decode("utf-8", "backslashreplace"),
        )
        check(argv, got)


# --- regression cases found by the battery -----------------------------------------


def _expect(argv: list[str], status: int, fragment: str) -> Outcome:
    got = _in_process(argv)
    check(argv, got)
    assert got.status == status, got
    assert fragment in got.err + got.out, got
    return got


def test_socket_kinds_are_each_said_in_one_line(places: Places) -> None:
    for path, fragment in (
        (places.missing, "No such file"),
        (places.directory, "is a directory, not a socket"),
        (places.regular, "is a regular file, not a socket"),
        (places.too_long, "too long"),
    ):
        _expect(["--socket", path, "daemon", "status"], EXIT_UNAVAILABLE, fragment)
        _expect(["--socket", path, "mcp", "call", "s", "t"], EXIT_UNAVAILABLE, fragment)


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        # argparse's "unrecognized arguments" quoting the word: was a
        # UnicodeEncodeError traceback out of msgspec (exit 1)
        (["--json", "mcp", "list", b"caf\xe9"], "unrecognized arguments: caf\\xe9"),
        # the socket's path in the message and in data.socket: the same
        (["--json", "--socket", b"/tmp/mz-\xff", "mcp", "list"], "/tmp/mz-\\xff"),
    ],
)
def test_json_errors_carry_words_that_are_not_utf8(
    argv: list[str | bytes], said: str
) -> None:
    words = [w if isinstance(w, str) else os.fsdecode(w) for w in argv]
    got = _in_process(words)
    check(words, got)
    assert got.status in (EXIT_USAGE, EXIT_UNAVAILABLE), got
    (line,) = got.out.splitlines()
    assert said in msgspec.json.decode(line)["error"]["message"], got
    done = subprocess.run(
        [str(CTL_EXE), *(os.fsencode(w) if isinstance(w, str) else w for w in argv)],
        capture_output=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == got.status, done.stderr
    assert b"Traceback" not in done.stderr
    assert said in msgspec.json.decode(done.stdout)["error"]["message"]
