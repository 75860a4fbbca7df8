"""Where the daemon's sockets are by default (``os`` only, not even ``typing``: the
one-shot CLI and the MCP bridge read it without loading msgspec)."""

from __future__ import annotations

import os

SYSTEM_SOCKET = "/run/memorizzd/memorizzd.sock"
"""The system daemon's operator socket (memorizzd.socket; root's default)."""


def default_socket_path() -> str:
    """Where the operator socket lives when nothing says otherwise.

    ``$MEMORIZZ_SOCKET`` wins; root uses /run/memorizzd/memorizzd.sock; any other
    user ``$XDG_RUNTIME_DIR/memorizzd/memorizzd.sock`` (or /tmp/memorizzd-UID/ when
    the runtime dir is unset), unless only the system's daemon is there
    (``SYSTEM_SOCKET`` exists, the user's own socket does not): an operator in
    memorizzd-operators reaches the installed daemon without saying where.
    """
    if env := os.environ.get("MEMORIZZ_SOCKET"):
        return env
    own = os.path.join(default_runtime_dir(), "memorizzd.sock")
    if not os.path.exists(own) and os.path.exists(SYSTEM_SOCKET):
        return SYSTEM_SOCKET
    return own


def default_runtime_dir() -> str:
    if os.geteuid() == 0:
        return "/run/memorizzd"
    if runtime := os.environ.get("XDG_RUNTIME_DIR"):
        return os.path.join(runtime, "memorizzd")
    return f"/tmp/memorizzd-{os.geteuid()}"  # noqa: S108 - per-uid, created 0700
