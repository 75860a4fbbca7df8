"""The audit spool: records made durable with one ``write`` before a reply.

A record must be safe before the call it describes is answered. A SQLite
commit is the slow way to get there on every call: in WAL mode one record
takes three frames (the table's page, its index's and the id counter's),
each written as a header and a page, plus six lock calls: ~75 us of CPU.
The spool is a plain append-only file of JSON lines in the state directory:
appending a record is one ``write(2)`` to a file opened with ``O_APPEND``,
after which it survives the daemon being killed (it is in the kernel's page
cache: the same promise as the WAL with ``synchronous=NORMAL``; neither
survives a power cut).

The auditor moves spooled records into the state database in batches (one
transaction for many) and then empties the spool. Records carry their final
id, so one that reached the database before a crash emptied the spool is
recognised when the spool is replayed at the next start (``INSERT OR IGNORE``
on the id) and never written twice. A line cut short by a crash is skipped;
one cut short by a full disk is taken back at once, so that the next record
starts a line of its own.

An operator action is recorded when it ends, but its state change commits
before that (``servers/remove`` stops the server after its row is gone): a
daemon killed in between would leave a change with no record. So the action
is spooled as it begins (an ``Intent``: the record to write should it never
end, outcome ``interrupted``), and its own record is spooled with a line that
settles the intent, in the same ``write``. A replay writes the record of every
intent left unsettled; emptying the spool keeps the intents still open.

Standard library and msgspec only; the store knows nothing of the spool.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Final

import msgspec

from memorizzd.store import AuditRow

log = logging.getLogger("memorizzd.spool")

FILE_NAME: Final = "audit.spool"
FILE_MODE: Final = 0o600


class Intent(msgspec.Struct, kw_only=True, tag="intent", tag_field="mark"):
    """An operator action begun: ``record`` (outcome ``interrupted``, no id
    yet) is what a replay writes if no line settles ``token``."""

    token: str
    record: AuditRow


class Settled(msgspec.Struct, kw_only=True, tag="settled", tag_field="mark"):
    """The action of intent ``token`` has its own record (the line before)."""

    token: str


_encode: Final = msgspec.json.Encoder().encode
_decode: Final = msgspec.json.Decoder(AuditRow).decode
_decode_mark: Final = msgspec.json.Decoder(Intent | Settled).decode
_MARK: Final = b'{"mark":'
"""How a mark's line starts (msgspec writes the tag first); a record's does not."""


class Spool:
    """``<state_dir>/audit.spool``, open for appending."""

    def __init__(self, state_dir: str) -> None:
        self.path = Path(state_dir) / FILE_NAME
        self._fd = os.open(
            self.path,
            os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
            FILE_MODE,
        )
        os.fchmod(self._fd, FILE_MODE)  # whatever the umask

    def append(self, record: AuditRow, *, settles: str | None = None) -> None:
        """One line (and with ``settles``, the line that settles that intent),
        one ``write``: durable against a crash of the daemon when this
        returns. Raises ``OSError`` (a full disk)."""
        data = _encode(record) + b"\n"
        if settles is not None:
            data += _encode(Settled(token=settles)) + b"\n"
        self._write(data)

    def begin(self, intent: Intent) -> None:
        """Spool an operator action as it begins. Raises ``OSError``."""
        self._write(_encode(intent) + b"\n")

    def settle(self, token: str) -> None:
        """Settle an intent whose action leaves no record. Raises ``OSError``."""
        self._write(_encode(Settled(token=token)) + b"\n")

    def _write(self, data: bytes) -> None:
        written = os.write(self._fd, data)
        if written != len(data):  # a regular file: only on a full disk
            # Take the piece back: left there, the next record (written once
            # there is room again, and acknowledged) would be glued to it, one
            # line that is not a record, and a replay would skip both.
            with contextlib.suppress(OSError):  # shrinking needs no room
                os.ftruncate(self._fd, os.fstat(self._fd).st_size - written)
            raise OSError(f"short write to {self.path} ({written} of {len(data)})")

    def read(self) -> list[AuditRow]:
        """Every whole record in the spool (a torn last line is skipped)."""
        return self.contents()[0]

    def contents(self) -> tuple[list[AuditRow], list[Intent]]:
        """Every whole record in the spool, and the intents no line settles."""
        records: list[AuditRow] = []
        intents: dict[str, Intent] = {}
        with open(self.path, "rb") as f:
            for number, line in enumerate(f, 1):
                try:
                    if not line.startswith(_MARK):
                        records.append(_decode(line))
                    elif isinstance(mark := _decode_mark(line), Intent):
                        intents[mark.token] = mark
                    else:
                        intents.pop(mark.token, None)
                except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
                    log.warning(
                        "%s: line %d is not a whole record (cut short by a crash?);"
                        " skipped",
                        self.path,
                        number,
                    )
        return records, list(intents.values())

    def clear(self, keep: Iterable[Intent] = ()) -> None:
        """Empty the spool (every record in it is in the database) but for the
        intents of actions still running, ``keep``. Raises ``OSError``."""
        os.ftruncate(self._fd, 0)  # O_APPEND: the next write goes to offset 0
        if data := b"".join(_encode(intent) + b"\n" for intent in keep):
            self._write(data)

    def close(self) -> None:
        os.close(self._fd)
