"""memorizzctl's exit statuses, and which error earns which.

    0    success
    1    the daemon returned an error, a tool result has isError, or a test
         failed; or standard output could not be written (``OutputError``)
    2    usage error (``UsageError``, or argparse's own)
    69   memorizzd is unreachable (os.EX_UNAVAILABLE)
    75   temporary failure, worth retrying: unavailable or deadline exceeded
         (os.EX_TEMPFAIL)
    77   permission denied (os.EX_NOPERM)
    130  interrupted
    141  the reader of standard output went away (128 + SIGPIPE)

``EPILOG`` is the same table as ``memorizzctl --help`` prints it.

Every error is reported one way (``report``): ``memorizzctl: error: MSG`` on
stderr (a usage error after the usage line), or, with ``--json``, one line on
stdout, ``{"error": {"message": MSG, "reason": REASON, "data": {...}}}``; the
exit status is the same either way. ``reason`` is the daemon's stable reason
for a daemon's error, else one of ``CLIENT_REASONS``. Results go to stdout
through ``emit``, which writes all of them or raises.

Standard library and the wire contract's errors only; the one-shot call
imports this module, so the errors (and msgspec with them) are imported only
when an error needs its status, and ``typing`` only by the type checker.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Final

    from memorizz.api.errors import MemorizzError

PROG: Final = "memorizzctl"
ERROR_PREFIX: Final = f"{PROG}: error: "
"""How every error memorizzctl reports on stderr starts."""

USAGE: Final = "usage"
UNREACHABLE: Final = "daemon_unreachable"
SOCKET_PERMISSION: Final = "socket_permission_denied"
MALFORMED_REPLY: Final = "malformed_reply"
CALLBACK_PORT: Final = "callback_port_in_use"
LOGIN_TIMED_OUT: Final = "login_timed_out"
CLIENT_REASONS: Final = frozenset(
    {
        USAGE,
        UNREACHABLE,
        SOCKET_PERMISSION,
        MALFORMED_REPLY,
        CALLBACK_PORT,
        LOGIN_TIMED_OUT,
    }
)
"""``--json`` errors' reasons that are memorizzctl's own, never the daemon's:
a usage error, the daemon's socket unreachable or refusing this user, a reply
that could not be read, ``mcp login``'s redirect port taken by another
program, and its browser never coming back."""

EXIT_OK: Final = 0
EXIT_ERROR: Final = 1
EXIT_USAGE: Final = 2
EXIT_UNAVAILABLE: Final = os.EX_UNAVAILABLE  # 69
EXIT_TEMPFAIL: Final = os.EX_TEMPFAIL  # 75
EXIT_NOPERM: Final = os.EX_NOPERM  # 77
EXIT_INTERRUPTED: Final = 130
EXIT_BROKEN_PIPE: Final = 141  # 128 + SIGPIPE, as a shell pipeline reports it

EPILOG: Final = """\
exit status:
  0    success
  1    the daemon returned an error, a tool result has isError, or a test failed
  2    usage error
  69   memorizzd is unreachable (EX_UNAVAILABLE)
  75   temporary failure, worth retrying: unavailable or deadline exceeded (EX_TEMPFAIL)
  77   permission denied (EX_NOPERM)
  130  interrupted
  141  the reader of the output went away (memorizzctl mcp list | head)
"""


def not_a_socket(path: str) -> str | None:
    """Why ``path`` cannot be memorizzd's socket when something else is there
    (``connect`` says "connection refused" for a file or a directory, as for
    a socket nobody listens on, and the daemon is not the one to start then);
    None when it is a socket, or nothing is there."""
    import stat

    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    if stat.S_ISSOCK(mode):
        return None
    kind = (
        "a directory"
        if stat.S_ISDIR(mode)
        else "a regular file"
        if stat.S_ISREG(mode)
        else "a FIFO"
        if stat.S_ISFIFO(mode)
        else "a device"
        if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
        else "something else"
    )
    return f"{path} is {kind}, not a socket"


class UsageError(Exception):
    """A command line the daemon need not see: reported with usage, exit 2."""


class OutputError(Exception):
    """Standard output could not be written (closed, a full disk, an I/O
    error): said on stderr, exit 1. Not an ``OSError``, so that it is never
    taken for the daemon's socket failing; the reader going away is still a
    ``BrokenPipeError`` (exit 141)."""


def emit(text: str) -> None:
    """Write ``text`` to standard output, all of it, now.

    Straight to the file descriptor, in a loop: a large write into a pipe
    whose reader leaves halfway returns short, and the text layer would drop
    the rest without a word (exit 0 for a truncated output); here the next
    write raises ``BrokenPipeError``. Characters the output's encoding lacks
    are written as backslash escapes, as stderr writes them. A stream without
    a descriptor (a test's) is written as it is."""
    stream = sys.stdout
    if stream is None:  # started with fd 1 closed (``>&-``)
        raise OutputError("cannot write the output: standard output is closed")
    try:
        try:
            fd = stream.fileno()
        except (OSError, ValueError):  # io.UnsupportedOperation is both
            stream.write(text)
            stream.flush()
            return
        stream.flush()  # anything written the ordinary way goes first
        data = memoryview(text.encode(stream.encoding or "utf-8", "backslashreplace"))
        while data:
            try:
                data = data[os.write(fd, data) :]
            except BlockingIOError:  # a non-blocking descriptor, shared with a parent
                import select

                select.select([], [fd], [])
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise OutputError(f"cannot write the output: {exc.strerror or exc}") from None


def report(
    message: str,
    *,
    reason: str,
    data: dict[str, Any] | None = None,
    as_json: bool = False,
) -> None:
    """Say one error: ``memorizzctl: error: MSG`` on stderr (a message of
    several lines keeps its own lines, indented), or with ``as_json`` the
    JSON line on stdout."""
    if as_json:
        import msgspec  # only for an error, only with --json

        body = {"error": {"message": message, "reason": reason, "data": data or {}}}
        emit(msgspec.json.encode(_json_safe(body)).decode() + "\n")
        return
    text = message.rstrip("\n").replace("\n", "\n  ")
    sys.stderr.write(f"{ERROR_PREFIX}{text}\n")
    sys.stderr.flush()


def _json_safe(value: Any) -> Any:
    """``value`` with every string JSON can carry: a word of the command line
    that is not UTF-8 (its bytes arrive as lone surrogates) written as the
    bytes' escapes, as stderr writes them (``caf\\xe9``); msgspec refuses a
    lone surrogate, and the error line was a traceback."""
    if isinstance(value, str):
        try:
            value.encode()
        except UnicodeEncodeError:
            try:
                raw = value.encode("utf-8", "surrogateescape")
            except UnicodeEncodeError:  # a surrogate no byte stands for
                return value.encode("utf-8", "backslashreplace").decode()
            return raw.decode("utf-8", "backslashreplace")
        return value
    if isinstance(value, dict):
        return {_json_safe(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(item) for item in value]
    return value


def error_reason(exc: MemorizzError | OSError) -> str:
    """``--json``'s ``reason`` for an error a command raised."""
    from memorizz.api.errors import (
        DaemonUnreachableError,
        ProtocolError,
        RemoteError,
        SocketPermissionError,
    )

    if isinstance(exc, RemoteError):
        return exc.reason
    if isinstance(exc, SocketPermissionError | PermissionError):
        return SOCKET_PERMISSION
    if isinstance(exc, DaemonUnreachableError | OSError):
        return UNREACHABLE
    if isinstance(exc, ProtocolError):
        return MALFORMED_REPLY
    own = getattr(exc, "reason", None)  # memorizz.ctl.login.CallbackPortError
    return own if isinstance(own, str) else MALFORMED_REPLY


def exit_status(exc: MemorizzError) -> int:
    from memorizz.api.errors import (
        DaemonUnreachableError,
        ErrorCode,
        RemoteError,
        SocketPermissionError,
    )

    if isinstance(exc, SocketPermissionError):
        return EXIT_NOPERM
    if isinstance(exc, DaemonUnreachableError):
        return EXIT_UNAVAILABLE
    if isinstance(exc, RemoteError):
        if exc.code == ErrorCode.PERMISSION_DENIED:
            return EXIT_NOPERM
        if exc.code in (ErrorCode.UNAVAILABLE, ErrorCode.DEADLINE_EXCEEDED):
            return EXIT_TEMPFAIL  # UnavailableError, DeadlineExceededError
    return EXIT_ERROR
