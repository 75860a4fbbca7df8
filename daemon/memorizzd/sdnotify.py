"""systemd integration: sd_notify and journald logging; no-ops off systemd.

Uses systemd-python when it is installed; otherwise speaks the (tiny) notify
protocol over ``$NOTIFY_SOCKET`` itself and logs to stderr.
"""

from __future__ import annotations

import importlib
import logging
import os
import socket
import sys
from typing import Any


def _optional(module: str) -> Any:
    # Probe a submodule: without systemd-python, `systemd` is our unit folder.
    try:
        return importlib.import_module(module)
    except ImportError:  # pragma: no cover - depends on the install
        return None


_sd_daemon = _optional("systemd.daemon")
_sd_journal = _optional("systemd.journal")


def notify(state: str) -> None:
    """Send e.g. ``READY=1``, ``STATUS=...``, ``STOPPING=1``; silent when not under systemd."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if _sd_daemon is not None:
        _sd_daemon.notify(state)
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        try:
            sock.sendto(state.encode(), address)
        except OSError:
            pass


def journal_available() -> bool:
    """Whether logs go to journald (run by systemd with systemd-python installed)."""
    return bool(os.environ.get("JOURNAL_STREAM")) and _sd_journal is not None


def setup_logging(level: str) -> None:
    """journald with structured fields under systemd, stderr otherwise."""
    root = logging.getLogger()
    root.setLevel(level.upper())
    handler: logging.Handler
    if journal_available():
        handler = _sd_journal.JournalHandler(SYSLOG_IDENTIFIER="memorizzd")
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
        )
    root.handlers[:] = [handler]
    for noisy in ("httpx2", "httpcore2", "mcp", "uvicorn"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
