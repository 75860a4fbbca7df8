"""Numbers written as plain ASCII digits: ports, ``Content-Length``,
``Retry-After`` seconds, event ids.

``str.isdigit`` is no guard for ``int``: it accepts ``'²'``, which ``int``
refuses (a ``ValueError`` where a clear refusal was meant), and ``int`` takes
``'٣'`` and runs of more than 4,300 digits are refused by it too. Text from a
peer (a header, an id) is read here, and only ``0-9`` counts.
"""

from __future__ import annotations

from typing import Final

MAX_DIGITS: Final = 18
"""Enough for any count or size here, and within a signed 64-bit integer."""


def ascii_int(text: str, *, max_digits: int = MAX_DIGITS) -> int | None:
    """``text`` as a non-negative integer when it is 1 to ``max_digits``
    ASCII digits (nothing around them); else None."""
    if not 0 < len(text) <= max_digits or not (text.isascii() and text.isdigit()):
        return None
    return int(text)
