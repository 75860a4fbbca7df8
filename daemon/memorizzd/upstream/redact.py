"""A server's own secrets, quoted back by it, cut out of what is shown.

A server may quote its credentials back: an error that says ``invalid token
Bearer sk-...``, a ``WWW-Authenticate`` or ``Location`` that carries them, a
stdio server that prints its environment to stderr. The supervisor keeps the
values it sent (``ServerSecrets.hidden``) and cuts them out of ``last_error``,
the errors callers get and the log lines, as the OAuth client does with the
secrets of its requests (``oauth/endpoints.py``).
"""

from __future__ import annotations

from typing import Any, Final

from memorizz.api.errors import RemoteError

REDACTED: Final = "[redacted]"
"""What a server's own secret, quoted back by it, is shown as."""


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
