"""memorizzctl's entry point: parse, run one command, map its error to an exit status.

``main`` returns a status for every failure it expects: a usage error prints
usage (exit 2), a ``RemoteError`` prints its message and ``reason`` (and, for
``approval_required``, the commands that approve and resume the call), an
unreachable daemon exits 69, Ctrl-C 130, and a closed pipe
(``memorizzctl mcp list | head``) 141, quietly. Every error is said one way,
``memorizzctl: error: MSG`` on stderr, or with ``--json`` the JSON error line on
stdout (``memorizz.ctl.exits.report``).

A plain ``mcp call`` goes the one-shot way first (``memorizz.ctl.oneshot``:
built-in modules only, no argparse, no msgspec), and so does a plain ``mcp
serve`` (``memorizz.ctl.serve``, the stdio bridge to the MCP face); whatever
they decline, and every other command, goes the general way: argparse, the
``Client``, a renderer. This module imports the general way's modules only
when it takes it, so that the one-shot ways stay small
(tests/e2e/test_cli_startup.py, tests/e2e/test_mcp_bridge.py).

Standard library, msgspec and memorizz only: no event loop, and none of the
daemon's dependencies (a test checks).
"""

from __future__ import annotations

import os
import sys

from memorizz.ctl import oneshot
from memorizz.ctl.exits import (
    ERROR_PREFIX,
    EXIT_BROKEN_PIPE,
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    PROG,
    USAGE,
    OutputError,
    report,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from memorizz.api.errors import MemorizzError


def _failed(exc: MemorizzError | OSError, socket_path: str, *, as_json: bool) -> int:
    """Report a command's failure and return its exit status (a closed pipe
    is re-raised: ``main`` ends quietly)."""
    from memorizz.api.errors import MemorizzError, RemoteError
    from memorizz.ctl.exits import UNREACHABLE, error_reason, exit_status, not_a_socket
    from memorizz.ctl.text import with_reason

    if isinstance(exc, BrokenPipeError):
        raise exc  # main() stops quietly
    reason = error_reason(exc)
    if isinstance(exc, RemoteError):
        message = with_reason(exc.message, exc.reason)
        if exc.reason == "approval_required" and "proposal_id" in exc.data:
            message += (
                f"\nan operator approves with `{PROG} mcp approve {exc.data['proposal_id']}`,"
                f" then `{PROG} mcp resume {exc.data['proposal_id']}` runs it"
            )
        report(
            exc.message if as_json else message,
            reason=reason,
            data=exc.data,
            as_json=as_json,
        )
        return exit_status(exc)
    data = {"socket": socket_path}
    if reason == UNREACHABLE and (why := not_a_socket(socket_path)) is not None:
        message = f"cannot reach memorizzd: {why}; point --socket/MEMORIZZ_SOCKET at its socket"
        report(message, reason=reason, data=data, as_json=as_json)
        return EXIT_UNAVAILABLE
    if isinstance(exc, MemorizzError):
        report(str(exc), reason=reason, data=data, as_json=as_json)
        return exit_status(exc)
    # e.g. a path too long
    report(
        f"cannot reach memorizzd at {socket_path}: {exc}",
        reason=reason,
        data=data,
        as_json=as_json,
    )
    return EXIT_UNAVAILABLE


def _one_shot(call: oneshot.Call) -> int | None:
    """The one-shot call; ``None`` if it could not connect (nothing was sent)."""
    try:
        raw = oneshot.exchange(call)
        if raw is None:
            return None
        status = oneshot.show(call, raw)
    except OSError as exc:  # DaemonUnreachableError is one
        return _failed(exc, call.socket_path, as_json=call.as_json)
    if status is None:  # not a text-only result: read it as the Client does
        return _finish(call, raw)
    return status


def _finish(call: oneshot.Call, raw: bytes) -> int:
    from memorizz.api import methods as m
    from memorizz.api.errors import MemorizzError
    from memorizz.client import raw_result
    from memorizz.ctl.commands import show_relayed_call

    try:
        relayed = raw_result(raw, oneshot.REQUEST_ID, m.ToolsCallResult)
        return show_relayed_call(relayed, as_json=call.as_json)
    except (MemorizzError, OSError) as exc:
        return _failed(exc, call.socket_path, as_json=call.as_json)


def _general(argv: list[str]) -> int:
    import argparse

    from memorizz.api.errors import MemorizzError
    from memorizz.api.paths import default_socket_path
    from memorizz.client import Client
    from memorizz.ctl.args import split_trailing
    from memorizz.ctl.commands import Command
    from memorizz.ctl.exits import UsageError
    from memorizz.ctl.parser import build_parser

    head, trailing = split_trailing(argv)
    as_json = "--json" in head  # before parsing: a usage error is said as JSON too
    parser = build_parser(as_json=as_json)
    if not argv:  # bare: the help, on stdout; a usage error all the same (2)
        parser.print_help()
        return EXIT_USAGE
    try:
        args = parser.parse_args(head)
    except SystemExit as exc:  # --help (0) or a usage error (2)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    if trailing:
        args.trailing = trailing
    args.json = bool(getattr(args, "json", False))
    socket_path: str = getattr(args, "socket", None) or default_socket_path()
    func: Command = args.func
    try:
        with Client(socket_path) as client:
            status: int = func(client, args)
            return status
    except (UsageError, UnicodeEncodeError) as exc:
        message = str(exc)
        if isinstance(exc, UnicodeEncodeError):
            # Bytes of the command line that are not UTF-8 (they reach Python
            # as lone surrogates) cannot go into a UTF-8 JSON request.
            word = next((w for w in argv if not _utf8(w)), None)
            if word is None:
                raise
            message = f"{word!r} is not UTF-8 text: the daemon takes UTF-8 only"
        sub: argparse.ArgumentParser = args.parser
        if not args.json:
            sub.print_usage(sys.stderr)
        report(message, reason=USAGE, as_json=args.json)
        return EXIT_USAGE
    except (MemorizzError, OSError) as exc:
        return _failed(exc, socket_path, as_json=args.json)


def _utf8(word: str) -> bool:
    try:
        word.encode()
    except UnicodeEncodeError:
        return False
    return True


def _empty_socket(argv: list[str]) -> bool:
    """Whether ``--socket`` or ``--mcp-socket`` is given an empty path: a
    usage error that only the general path reports (``serve.parse`` would
    take the default socket)."""
    for i, word in enumerate(argv):
        name, eq, value = word.partition("=")
        if name in ("--socket", "--mcp-socket") and (
            (eq and not value) or (not eq and argv[i + 1 : i + 2] == [""])
        ):
            return True
    return False


def _run(argv: list[str]) -> int:
    call = oneshot.parse(argv)
    if call is not None:
        status = _one_shot(call)
        if status is not None:
            return status
    elif "serve" in argv and not _empty_socket(argv):
        # `mcp serve`: the bridge, from built-in modules only
        from memorizz.ctl import serve

        target = serve.parse(argv)
        if target is not None:
            return serve.bridge(target)
    return _general(argv)


def main(argv: list[str] | None = None) -> int:
    """Run ``memorizzctl`` and return its exit status (see the module docstring)."""
    try:
        return _run(sys.argv[1:] if argv is None else argv)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except OutputError as exc:
        # A full disk, a closed stdout: said on stderr, even with --json
        # (stdout is what failed).
        if sys.stderr is not None:
            try:
                sys.stderr.write(f"{ERROR_PREFIX}{exc}\n")
                sys.stderr.flush()
            except (OSError, ValueError):
                pass
        return EXIT_ERROR
    except BrokenPipeError:
        # The reader went away (``memorizzctl mcp list | head``): stop quietly,
        # and keep the interpreter from complaining while flushing at exit.
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return EXIT_BROKEN_PIPE
