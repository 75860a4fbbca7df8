"""memorizzctl's entry point: parse, run one command, map its error to an exit status.

``main`` returns a status for every failure it expects: a usage error prints
usage (exit 2), a ``RemoteError`` prints its message and ``reason`` (and, for
``approval_required``, the commands that approve and resume the call), an
unreachable daemon exits 69, Ctrl-C 130, and a closed pipe
(``memorizzctl mcp list | head``) 141, quietly.

Standard library, msgspec and memorizz only: no event loop, and none of the
daemon's dependencies (a test checks).
"""

from __future__ import annotations

import argparse
import os
import sys

from memorizz.api.errors import MemorizzError, RemoteError
from memorizz.api.protocol import default_socket_path
from memorizz.client import Client
from memorizz.ctl.args import split_trailing
from memorizz.ctl.commands import Command
from memorizz.ctl.exits import (
    EXIT_BROKEN_PIPE,
    EXIT_INTERRUPTED,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    PROG,
    UsageError,
    exit_status,
)
from memorizz.ctl.parser import build_parser


def _error(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr)


def _run(argv: list[str]) -> int:
    head, trailing = split_trailing(argv)
    parser = build_parser()
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
    except UsageError as exc:
        sub: argparse.ArgumentParser = args.parser
        sub.print_usage(sys.stderr)
        print(f"{sub.prog}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except RemoteError as exc:
        _error(f"{exc.message} ({exc.reason})")
        if exc.reason == "approval_required" and "proposal_id" in exc.data:
            _error(
                f"an operator approves with `{PROG} mcp approve {exc.data['proposal_id']}`,"
                f" then `{PROG} mcp resume {exc.data['proposal_id']}` runs it"
            )
        return exit_status(exc)
    except MemorizzError as exc:
        _error(str(exc))
        return exit_status(exc)
    except BrokenPipeError:
        raise
    except OSError as exc:  # e.g. a socket path longer than AF_UNIX allows
        _error(f"cannot reach memorizzd at {socket_path}: {exc}")
        return EXIT_UNAVAILABLE


def main(argv: list[str] | None = None) -> int:
    """Run ``memorizzctl`` and return its exit status (see the module docstring)."""
    try:
        return _run(sys.argv[1:] if argv is None else argv)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (``memorizzctl mcp list | head``): stop quietly,
        # and keep the interpreter from complaining while flushing at exit.
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return EXIT_BROKEN_PIPE
