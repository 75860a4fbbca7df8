"""What stdio servers may run, and what the daemon process exposes to them.

``commands`` (``resolve_command``: the execution policy for one stdio server
spec: resolution to an absolute path, the allowlist), ``paths`` (finding an
executable the way the child would), ``inline`` (interpreter one-liners,
looking through launchers), ``grammars`` (each recognised program's
command-line grammar), ``env_command`` (the ``env`` command line),
``environment`` (variables in a server's env that bring code), ``admission``
(checking the configured servers at daemon start), ``process`` (hardening the
daemon process: ``MEMORIZZ_*`` scrubbed, not dumpable).
"""

from memorizzd.execution.admission import Admission, admit, check_config_servers
from memorizzd.execution.commands import (
    CommandNotAllowedError,
    CommandNotFoundError,
    resolve_command,
)
from memorizzd.execution.inline import MAX_DEPTH
from memorizzd.execution.process import (
    PR_SET_DUMPABLE,
    SCRUBBED_PREFIX,
    harden_process,
    scrub_environment,
    set_not_dumpable,
)

__all__ = [
    "MAX_DEPTH",
    "PR_SET_DUMPABLE",
    "SCRUBBED_PREFIX",
    "Admission",
    "CommandNotAllowedError",
    "CommandNotFoundError",
    "admit",
    "check_config_servers",
    "harden_process",
    "resolve_command",
    "scrub_environment",
    "set_not_dumpable",
]
