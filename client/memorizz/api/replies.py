"""A reply line, read: the result it carries, or the error it says, as an exception.

The one place a client of the socket turns a reply into a result: the
``Client`` reads every reply here, and ``memorizzctl``'s one-shot call each
reply it does not print itself. A line the daemon sends unasked before a reply
(``notifications/progress`` for a call that asked for it) is told apart by
``notification``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, TypeVar

import msgspec

from memorizz.api import methods as m
from memorizz.api.errors import ProtocolError, from_wire
from memorizz.api.protocol import Reply

R = TypeVar("R", bound=m.Result)
P = TypeVar("P")

_decoders: dict[type[Any], msgspec.json.Decoder[Any]] = {}

_REPLY_START: Final = b'{"jsonrpc":"2.0","id":'
"""How the daemon's every reply line starts (``Reply``'s first fields)."""


class Notification(msgspec.Struct):
    """A message sent unasked, never a reply: a notification (no ``id``), or a
    request the client is to answer under ``id`` (an upstream's
    ``elicitation/create`` or ``sampling/createMessage``)."""

    method: str
    params: msgspec.Raw = msgspec.Raw(b"{}")
    id: int | str | None = None


class _Message(msgspec.Struct):
    method: str | None = None
    params: msgspec.Raw = msgspec.Raw(b"{}")
    id: int | str | None = None


_decode_message = msgspec.json.Decoder(_Message).decode
_decode_progress = msgspec.json.Decoder(m.ProgressParams).decode
_decode_log = msgspec.json.Decoder(m.LogParams).decode
_decode_update = msgspec.json.Decoder(m.ResourceUpdatedParams).decode


def notification(raw: bytes) -> Notification | None:
    """The notification this line is; ``None`` for a reply (or anything that
    ``decode_reply`` should judge). A reply line is known by its first bytes,
    so a reply costs no second decode."""
    if raw.startswith(_REPLY_START):
        return None
    try:
        message = _decode_message(raw)
    except msgspec.DecodeError:
        return None
    if message.method is None:
        return None
    return Notification(message.method, message.params, message.id)


def decode_progress(note: Notification) -> m.ProgressParams | None:
    """A ``notifications/progress`` report's params; ``None`` for any other
    notification or a malformed one (a report is never worth failing a call)."""
    return _params_of(note, "notifications/progress", _decode_progress)


def decode_log(note: Notification) -> m.LogParams | None:
    """A ``notifications/message`` (a server's log message)'s params;
    ``None`` for any other notification or a malformed one."""
    return _params_of(note, "notifications/message", _decode_log)


def decode_update(note: Notification) -> m.ResourceUpdatedParams | None:
    """A ``notifications/resources/updated`` (a subscribed resource changed)'s
    params; ``None`` for any other notification or a malformed one."""
    return _params_of(note, "notifications/resources/updated", _decode_update)


def _params_of(
    note: Notification, method: str, decode: Callable[[msgspec.Raw], P]
) -> P | None:
    """``note``'s params, decoded, if it is a ``method``; else, or if they do
    not decode, ``None``."""
    if note.method != method:
        return None
    try:
        return decode(note.params)
    except msgspec.DecodeError:
        return None


def _decoder(result_type: type[R]) -> msgspec.json.Decoder[Reply[R]]:
    decoder = _decoders.get(result_type)
    if decoder is None:
        # A type variable's value as a type argument: right at run time, and
        # beyond what mypy checks.
        decoder = _decoders[result_type] = msgspec.json.Decoder(Reply[result_type])  # type: ignore[valid-type]
    return decoder


def decode_reply(raw: bytes, request_id: int, result_type: type[R]) -> R:
    """The result of the reply to ``request_id``; its error raised as a ``RemoteError``.

    A line that is not such a reply raises ``ProtocolError``."""
    try:
        reply = _decoder(result_type).decode(raw)
    except msgspec.DecodeError as exc:
        raise ProtocolError(f"malformed reply from memorizzd: {exc}") from None
    if reply.error is not None:
        raise from_wire(reply.error)
    if reply.result is None or reply.id != request_id:
        raise ProtocolError("malformed reply from memorizzd: no result for this id")
    return reply.result
