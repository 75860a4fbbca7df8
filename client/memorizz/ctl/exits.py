"""memorizzctl's exit statuses, and which error earns which.

    0    success
    1    the daemon returned an error, a tool result has isError, or a test failed
    2    usage error (``UsageError``, or argparse's own)
    69   memorizzd is unreachable (os.EX_UNAVAILABLE)
    75   temporary failure, worth retrying: unavailable or deadline exceeded
         (os.EX_TEMPFAIL)
    77   permission denied (os.EX_NOPERM)
    130  interrupted
    141  the reader of standard output went away (128 + SIGPIPE)

``EPILOG`` is the same table as ``memorizzctl --help`` prints it.

Standard library and the wire contract's errors only; the one-shot call
imports this module, so the errors (and msgspec with them) are imported only
when an error needs its status, and ``typing`` only by the type checker.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Final

    from memorizz.api.errors import MemorizzError

PROG: Final = "memorizzctl"

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
"""


class UsageError(Exception):
    """A command line the daemon need not see: reported with usage, exit 2."""


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
