"""An upstream message over the size cap, dropped as it streams.

The part of the caps that needs no HTTP client (``limits.py`` is the HTTP
part): the marker and the error reply that stand for a dropped message, and
:class:`OversizeMessage`, which the stdio transport feeds an oversize line to.
"""

from __future__ import annotations

from typing import Final

import msgspec

from memorizzd.egress.envelope import EnvelopeScanner

TOO_LARGE_MARKER: Final = "memorizz.result_too_large"
"""``error.data`` of a synthesized reply to an oversize message."""

_encoder: Final = msgspec.json.Encoder()


def too_large_error(request_id: int | str | None, limit: int) -> bytes:
    """A JSON-RPC error reply (one line of JSON) for the oversize message."""
    return _encoder.encode(
        {
            "jsonrpc": "2.0",
            "id": request_id,
            "error": {
                "code": -32603,
                "message": f"result larger than max_result_bytes ({limit})",
                "data": TOO_LARGE_MARKER,
            },
        }
    )


class OversizeMessage:
    """One message over the cap, fed to :meth:`feed` as it streams past and dropped.

    ``reply`` is the error for the request it answers, set once, as soon as its
    id is known and it is known to be a response; ``known_id`` (a transport
    that knows which request the message answers) needs only the latter.
    """

    def __init__(self, limit: int, known_id: int | str | None = None) -> None:
        self._scanner = EnvelopeScanner()
        self._limit, self._known_id = limit, known_id
        self.answered = False
        self.reply: bytes | None = None

    def feed(self, data: bytes) -> None:
        if self.answered:
            return  # nothing more to learn from the rest
        scanner = self._scanner
        scanner.feed(data)
        if scanner.has_method or not scanner.is_response:
            return
        request_id = self._known_id if self._known_id is not None else scanner.id
        if request_id is not None:
            self.answered = True
            self.reply = too_large_error(request_id, self._limit)

    def take_reply(self) -> bytes | None:
        reply, self.reply = self.reply, None
        return reply

    def outcome(self) -> str:
        """What was dropped and what follows, for the log line."""
        scanner, limit = self._scanner, self._limit
        if self.answered:
            return (
                f"dropped a reply larger than max_result_bytes ({limit}); "
                "its request fails with result_too_large"
            )
        if scanner.has_method:
            return (
                "dropped a request or notification from the server larger than "
                f"max_result_bytes ({limit}), unanswered (its id is the server's)"
            )
        return (
            f"dropped a message larger than max_result_bytes ({limit}) with no "
            "usable id (not JSON-RPC, or no id): a request it answers times out"
        )
