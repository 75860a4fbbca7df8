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

import logging
import weakref
from typing import Any, Final, Protocol

from memorizz.api.errors import RemoteError

REDACTED: Final = "[redacted]"
"""What a server's own secret, quoted back by it, is shown as."""


class Holder(Protocol):
    @property
    def hidden(self) -> tuple[str, ...]:
        """The secret values it holds now, longest first."""
        ...


_holders: weakref.WeakSet[Any] = weakref.WeakSet()


def hold(holder: Holder) -> None:
    """Keep ``holder``'s secrets out of the log for as long as it lives."""
    _holders.add(holder)


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
    secrets of any live ``Holder``. Nothing is dropped."""

    _format = logging.Formatter()

    def filter(self, record: logging.LogRecord) -> bool:
        found = {value for holder in list(_holders) for value in holder.hidden}
        if not found:
            return True
        hidden = tuple(sorted(found, key=len, reverse=True))
        message = record.getMessage()
        if (cleaned := scrub(message, hidden)) != message:
            record.msg, record.args = cleaned, None
        if record.exc_info and not record.exc_text:
            record.exc_text = self._format.formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = scrub(record.exc_text, hidden)
            record.exc_info = None  # each formatter shows exc_text instead
        return True
