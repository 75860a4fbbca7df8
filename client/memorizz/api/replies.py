"""A reply line, read: the result it carries, or the error it says, as an exception.

The one place a client of the socket turns a reply into a result: the
``Client`` reads every reply here, and ``memorizzctl``'s one-shot call each
reply it does not print itself.
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

from memorizz.api import methods as m
from memorizz.api.errors import ProtocolError, from_wire
from memorizz.api.protocol import Reply

R = TypeVar("R", bound=m.Result)

_decoders: dict[type[Any], msgspec.json.Decoder[Any]] = {}


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
