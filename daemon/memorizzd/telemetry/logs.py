"""Structured logs: the fields a record carries, and ``--log-format json``.

Records about a call or a server carry structured fields in ``extra``, named
as journald wants them (upper case, ``MEMORIZZ_`` first):

* every audited call (``audit.py``, when logs keep fields): ``MEMORIZZ_SERVER``,
  ``MEMORIZZ_TOOL``, ``MEMORIZZ_PROFILE``, ``MEMORIZZ_OUTCOME``,
  ``MEMORIZZ_PROPOSAL``, with ``MEMORIZZ_AUDIT_ID``, ``MEMORIZZ_ACTION``,
  ``MEMORIZZ_REASON``, ``MEMORIZZ_CALLER_UID`` and ``MEMORIZZ_CALLER_PID``;
* every state change of an upstream (``upstream/supervisor.py``):
  ``MEMORIZZ_SERVER`` and ``MEMORIZZ_STATE`` (``servers/status``'s states);
* a server's stderr lines: ``MEMORIZZ_SERVER``.

Under systemd the journal handler sends them as journal fields
(``journalctl MEMORIZZ_SERVER=notion``). Elsewhere ``JsonFormatter`` writes
one JSON object per line: ``time`` (RFC 3339, UTC), ``level``, ``logger``,
``message``, each field in lower case without its prefix (``server``), and
``exc`` for an exception's traceback. Fields hold names, states and ids,
never argument values or secrets.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any, Final

import msgspec

PREFIX: Final = "MEMORIZZ_"
TEXT_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"
FORMATS: Final = ("text", "json")

_encode = msgspec.json.Encoder(enc_hook=str).encode


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC)
            .isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key.startswith(PREFIX):
                line[key[len(PREFIX) :].lower()] = value
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exc"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return _encode(line).decode()


def formatter(kind: str) -> logging.Formatter:
    """``--log-format``'s formatter: ``text`` (the default) or ``json``."""
    if kind == "json":
        return JsonFormatter()
    return logging.Formatter(TEXT_FORMAT)


def fields_kept() -> bool:
    """Whether the root logger's handlers keep records' fields: the journal's
    (set up under systemd), or one writing JSON lines. Then each audited call
    is logged too (``audit.py``)."""
    return any(
        type(handler).__name__ == "JournalHandler"
        or isinstance(handler.formatter, JsonFormatter)
        for handler in logging.getLogger().handlers
    )
