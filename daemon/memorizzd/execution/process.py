"""What the daemon process exposes to its children and to same-uid processes.

Called once from ``memorizzd.__main__`` (not from the in-process test
harness), through ``harden_process``:

* ``scrub_environment`` removes the daemon's own ``MEMORIZZ_*`` variables
  (the encryption key among them) from ``os.environ`` once the configuration
  has been read. Children get an explicit environment anyway
  (``stdio.child_environment``: a few base keys plus the server's own env;
  never ``MEMORIZZ_*``, ``NOTIFY_SOCKET``, ``LISTEN_*`` or
  ``CREDENTIALS_DIRECTORY``); this makes any accidental inheritance empty too.
* ``set_not_dumpable`` calls ``prctl(PR_SET_DUMPABLE, 0)``: removing a variable
  from ``os.environ`` does not remove it from ``/proc/<pid>/environ``, which
  any process of the same uid could read. Not dumpable, the daemon's
  ``/proc/<pid>/*`` is owned by root and other same-uid processes can neither
  read it nor ptrace the daemon (so no core dumps, and no py-spy/gdb attach
  except as root). Children are unaffected: ``execve`` resets the flag.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
from typing import Final

log = logging.getLogger("memorizzd.execution")

SCRUBBED_PREFIX: Final = "MEMORIZZ_"
PR_SET_DUMPABLE: Final = 4


def scrub_environment() -> dict[str, str]:
    """Remove every ``MEMORIZZ_*`` variable from ``os.environ``; return them.

    Call it after the configuration (and any key) has been read from them.
    """
    return {
        key: os.environ.pop(key)
        for key in list(os.environ)
        if key.startswith(SCRUBBED_PREFIX)
    }


def set_not_dumpable() -> bool:
    """``prctl(PR_SET_DUMPABLE, 0)`` (Linux): ``/proc/<pid>/environ`` and ptrace
    become root-only. False where it is not available."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    zero = ctypes.c_ulong(0)
    if libc.prctl(ctypes.c_int(PR_SET_DUMPABLE), zero, zero, zero, zero) != 0:
        log.warning(
            "prctl(PR_SET_DUMPABLE, 0) failed: %s", os.strerror(ctypes.get_errno())
        )
        return False
    return True


def harden_process() -> None:
    """The daemon entry point's first act after reading its configuration."""
    removed = scrub_environment()
    dumpable = not set_not_dumpable()
    log.debug(
        "removed %d MEMORIZZ_* variables from the environment; dumpable=%s",
        len(removed),
        dumpable,
    )
