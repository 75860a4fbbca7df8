"""Framing and envelopes of the memorizz socket protocol.

JSON-RPC 2.0, one UTF-8 JSON message per line (NDJSON), over an AF_UNIX stream
socket. msgspec never emits a raw newline inside a message, so ``\\n`` is the
delimiter and ``socat - UNIX-CONNECT:PATH`` works by hand.

Protocol version log (bump only for an incompatible change; new fields with
defaults never bump it):

    1: 2026-11-30: initial protocol
"""

from __future__ import annotations

from typing import Any, Final, Generic, Literal, TypeVar

import msgspec

PROTOCOL_VERSION: Final = 1
MAX_FRAME: Final = 1 << 20
"""Largest request line the daemon reads, not counting its newline (1 MiB)."""

JSONRPC: Final = "2.0"

RequestId = int | str
T = TypeVar("T")


class ErrorObject(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The JSON-RPC ``error`` member. ``data.reason`` is the stable word to branch on."""

    code: int
    message: str
    data: dict[str, Any] | None = None


class Request(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A request envelope; ``params`` stays raw until the method is known."""

    jsonrpc: Literal["2.0"]
    method: str
    id: RequestId | None = None
    """``None`` (absent) makes a notification, which is never answered."""
    params: msgspec.Raw = msgspec.Raw(b"{}")


class Reply(msgspec.Struct, Generic[T], kw_only=True, omit_defaults=True):
    """A reply envelope: exactly one of ``result`` and ``error`` is present."""

    jsonrpc: Literal["2.0"]
    id: RequestId | None
    result: T | None = None
    error: ErrorObject | None = None


_encode_reply: Final = msgspec.json.Encoder().encode


def result_line(request_id: RequestId | None, result: object) -> bytes:
    """The reply line carrying ``result`` (a ``msgspec.Raw`` is spliced in as it is)."""
    return _encode_reply(Reply(jsonrpc="2.0", id=request_id, result=result)) + b"\n"


def error_line(request_id: RequestId | None, error: ErrorObject) -> bytes:
    """The reply line carrying ``error``."""
    return _encode_reply(Reply[None](jsonrpc="2.0", id=request_id, error=error)) + b"\n"
