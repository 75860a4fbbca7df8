"""systemd integration: sd_notify, the watchdog and journald logging; no-ops off systemd.

Speaks the (tiny) notify protocol over ``$NOTIFY_SOCKET`` itself, without
blocking the event loop (systemd-python only for addresses other than a
path). Logs to journald with systemd-python, else to stderr.
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
import socket
import sys
from collections.abc import Mapping
from typing import Any, Final

import anyio
from anyio.abc import TaskStatus

from memorizzd.redact import LogScrubber


@functools.cache
def _optional(module: str) -> Any:
    """systemd-python's ``module``, imported at first need (the journal's
    bindings cost about 4 MB: a daemon not under systemd never loads them),
    or None without systemd-python."""
    # Probe a submodule: without systemd-python, `systemd` is our unit folder.
    try:
        return importlib.import_module(module)
    except ImportError:  # pragma: no cover - depends on the install
        return None


log = logging.getLogger("memorizzd")


def notify(state: str) -> None:
    """Send e.g. ``READY=1``, ``STATUS=...``, ``STOPPING=1``; silent when not under systemd.

    Never blocks the event loop for long: the datagram queue of a busy (or
    hung) systemd fills after a few messages (``net.unix.max_dgram_qlen``, 10
    by default), and ``sd_notify(3)`` then blocks. ``WATCHDOG=1`` and
    ``STATUS=`` are dropped when the queue is full (the next one follows
    shortly; a ping that never arrives is what the watchdog is for); the
    others wait at most a second.
    """
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if not address.startswith(("/", "@")):  # e.g. vsock: (systemd 253+)
        if (sd_daemon := _optional("systemd.daemon")) is not None:
            sd_daemon.notify(state)
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
        droppable = state.startswith(_DROPPABLE)
        sock.settimeout(0.0 if droppable else 1.0)
        try:
            sock.sendto(state.encode(), address)
        except OSError as exc:
            (log.debug if droppable else log.warning)(
                "sd_notify %s not sent: %s", state.partition("=")[0], exc
            )


_DROPPABLE: Final = ("WATCHDOG=", "STATUS=")


def watchdog_interval(environ: Mapping[str, str] | None = None) -> float | None:
    """Seconds between ``WATCHDOG=1`` pings, or None when systemd asks for none.

    systemd sets ``WATCHDOG_USEC`` (the unit's ``WatchdogSec=``) and
    ``WATCHDOG_PID`` (the main process; a variable inherited by another
    process is not for it). The daemon pings three times per period, so one
    late ping is not a restart (``sd_watchdog_enabled(3)`` asks for at least two).
    """
    env = os.environ if environ is None else environ
    pid = env.get("WATCHDOG_PID")
    if pid and pid != str(os.getpid()):
        return None
    try:
        usec = int(env.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    if usec <= 0:
        return None
    return usec / 1_000_000 / 3


async def run_watchdog(
    *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
) -> None:
    """Ping the systemd watchdog from the event loop for as long as it runs.

    A task, never a thread: a loop that is blocked (or busy forever) stops
    pinging, and systemd kills and restarts the daemon after ``WatchdogSec=``.
    Returns at once when systemd asks for no watchdog.
    """
    interval = watchdog_interval()
    task_status.started()
    if interval is None:
        return
    log.info("systemd watchdog: pinging every %.3g s", interval)
    while True:
        notify("WATCHDOG=1")
        await anyio.sleep(interval)


def journal_available() -> bool:
    """Whether logs go to journald (run by systemd with systemd-python installed)."""
    return (
        bool(os.environ.get("JOURNAL_STREAM"))
        and _optional("systemd.journal") is not None
    )


def journal_handler() -> logging.Handler:
    """systemd-python's journal handler, which sends each record's extras
    (``extra={"MEMORIZZ_SERVER": ...}``) as journal fields. It offers every
    attribute of the record; only journal field names (upper case) are sent,
    through ``systemd.journal.send``, looked up at each record."""
    journal = _optional("systemd.journal")

    def send(message: str, /, **fields: Any) -> None:
        journal.send(message, **{k: v for k, v in fields.items() if k.isupper()})

    handler: logging.Handler = journal.JournalHandler(
        sender_function=send, SYSLOG_IDENTIFIER="memorizzd"
    )
    return handler


def setup_logging(level: str, formatter: logging.Formatter | None = None) -> None:
    """journald with structured fields under systemd (a record's
    ``MEMORIZZ_*`` extras become journal fields), else stderr through
    ``formatter`` (``--log-format``; text by default)."""
    root = logging.getLogger()
    root.setLevel(level.upper())
    handler: logging.Handler
    if journal_available():
        handler = journal_handler()
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(
            formatter
            or logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
        )
    handler.addFilter(LogScrubber())  # a server's secrets, quoted back by it
    root.handlers[:] = [handler]
    for noisy in ("httpx2", "httpcore2", "mcp", "uvicorn"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
    sse = logging.getLogger("mcp.client.sse")
    if not any(isinstance(f, _OneLine) for f in sse.filters):
        sse.addFilter(_OneLine())


class _OneLine(logging.Filter):
    """The MCP SDK's legacy SSE client logs the end of its event stream (its
    server went away) as an error with the whole traceback, some 65 lines,
    each time; the daemon says it in one line of its own (``session lost``).
    Its record is kept as one line at info: the message, the exception's
    type and text."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info is not None and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            record.msg = f"{record.getMessage()}: {type(exc).__name__}: {exc}"[:500]
            record.args = None
            record.exc_info = record.exc_text = None
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True
