"""A server's own secrets, quoted back by it, cut out of what is shown.

A server may quote its credentials back: an error that says ``invalid token
Bearer sk-...``, a ``WWW-Authenticate`` or ``Location`` that carries them, a
stdio server that prints its environment to stderr. Two places cut them out:

* what callers see: the supervisor keeps the values it sent
  (``ServerSecrets.hidden``) and cleans ``last_error`` and the errors of
  calls with ``scrub`` and ``scrub_error`` (``upstream/actor.py``,
  ``relay.py``), as the OAuth client does with the secrets of its requests
  (``oauth/endpoints.py``);
* the log: every supervisor is a ``Holder`` (``hold``), and ``LogScrubber``,
  on the daemon's log handler (``sdnotify.setup_logging``), cleans each
  record's message and traceback of every holder's values, whichever module
  logged it.
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from collections.abc import Iterable
from typing import Any, Final, Protocol

from memorizz.api.errors import RemoteError

REDACTED: Final = "[redacted]"
"""What a server's own secret, quoted back by it, is shown as."""
OURS_ONLY: Final = "memorizz_ours_only"
"""A log record's attribute (``extra={OURS_ONLY: True}``): its words are the
daemon's own, built from names, reasons and ids, never a server's (the audit
trail's mirror, once per call): ``LogScrubber`` leaves it unscanned."""
HIDDEN_MIN: Final = 4
"""The shortest secret value cut out of text: cutting out shorter ones would
garble the text and hide next to nothing."""


class Holder(Protocol):
    @property
    def hidden(self) -> tuple[str, ...]:
        """The secret values it holds now, longest first."""
        ...


_holders: weakref.WeakSet[Any] = weakref.WeakSet()
_generation = 0
"""Counts the changes of what the holders hold (``changed``)."""


def hold(holder: Holder) -> None:
    """Keep ``holder``'s secrets out of the log for as long as it lives."""
    _holders.add(holder)
    changed()


def changed() -> None:
    """A holder's secrets changed (a connect, a grant refreshed): the log's
    filter reads them all again at its next record."""
    global _generation
    _generation += 1


def ordered(values: Iterable[str]) -> tuple[str, ...]:
    """Secret values as ``scrub`` takes them: each once, longest first (a
    value inside another is cut out after it), none shorter than
    ``HIDDEN_MIN``."""
    return tuple(
        sorted({v for v in values if v and len(v) >= HIDDEN_MIN}, key=len, reverse=True)
    )


def scrub(text: str, hidden: tuple[str, ...]) -> str:
    """``text`` with every value of ``hidden`` (longest first) cut out."""
    for value in hidden:
        text = text.replace(value, REDACTED)
    return text


def _scrubbed(value: Any, hidden: tuple[str, ...]) -> Any:
    if isinstance(value, str):
        return scrub(value, hidden)
    if isinstance(value, dict):
        return {
            scrub(k, hidden) if isinstance(k, str) else k: _scrubbed(v, hidden)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [_scrubbed(v, hidden) for v in value]
    return value


def scrub_error(exc: RemoteError, hidden: tuple[str, ...]) -> RemoteError:
    """``exc``, changed in place, without the values of ``hidden`` in its
    message or data (a JSON-RPC error's message and ``data``, a redirect's
    ``Location``, a 401's text)."""
    if hidden:
        exc.message = scrub(exc.message, hidden)
        exc.args = (exc.message,)
        exc.data = _scrubbed(exc.data, hidden)
    return exc


class LogScrubber(logging.Filter):
    """A handler's filter: each record's message (and traceback) without the
    secrets of any live ``Holder``. Nothing is dropped, and a log call never
    fails for it. The holders' values are gathered again only when they
    changed (``changed``, a holder gone); a record costs a substring test per
    value (about 0.15 µs each: an alternation regex costs far more, 64 µs
    for 60 values over a 300-character line), and a replace only on a hit."""

    _format = logging.Formatter()

    def __init__(self) -> None:
        super().__init__()
        self._seen: tuple[int, int] | None = None
        self._hidden: tuple[str, ...] = ()

    def filter(self, record: logging.LogRecord) -> bool:
        with contextlib.suppress(Exception):  # a bad record: the handler's to say
            self._scrub(record)
        return True

    def _current(self) -> tuple[str, ...]:
        seen = (_generation, len(_holders))
        if seen != self._seen:
            try:
                values = ordered(v for holder in tuple(_holders) for v in holder.hidden)
            except RuntimeError:  # the set changed as another thread read it
                return self._hidden  # the last ones, until the next record
            self._hidden, self._seen = values, seen
        return self._hidden

    def _scrub(self, record: logging.LogRecord) -> None:
        hidden = self._current()
        if not hidden or getattr(record, OURS_ONLY, False):
            return
        message = record.getMessage()
        if any(value in message for value in hidden):
            record.msg, record.args = scrub(message, hidden), None
        if record.exc_info and not record.exc_text:
            record.exc_text = self._format.formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = scrub(record.exc_text, hidden)
            record.exc_info = None  # each formatter shows exc_text instead
