"""An upstream that answers 429 or 503: busy, not broken.

The SDK turns any 4xx/5xx answer to a request into a generic "Server returned
an error response" and drops the status and ``Retry-After``. ``busy_error``
keeps them: ``replies.RefusalReplies`` answers the one JSON-RPC request with
this error in the upstream's place, so the caller (and the upstream actor,
which decides whether to wait and send it again) gets ``upstream_busy`` with
``data.retry_after_s``, and the session lives on.
"""

from __future__ import annotations

import email.utils
import time
from typing import Final

import httpx2

from memorizz.api.digits import ascii_int
from memorizz.api.errors import UnavailableError

BUSY_STATUSES: Final = frozenset({429, 503})
DEFAULT_RETRY_AFTER_S: Final = 1.0
"""The hint when a busy answer says nothing (or nothing readable) about when."""
MAX_RETRY_AFTER_S: Final = 3600.0
"""A hint is never more than this, whatever the server says."""


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """``Retry-After`` (RFC 9110 §10.2.3: delta-seconds or an HTTP-date) in
    seconds from now, at most MAX_RETRY_AFTER_S (a date already past: 0);
    None when absent or unreadable (a negative number, a fraction, a date
    without its zone, any other text). Shared by every reader of the header
    (``retry_after_s`` here, the OAuth token endpoint's answers)."""
    if not value:
        return None
    value = value.strip()[:64]
    delta = ascii_int(value, max_digits=64)
    if delta is not None:
        seconds = float(min(delta, 10**8))
    else:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
        if when.tzinfo is None:  # an HTTP-date is GMT; a naive one is not one
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_S)


def retry_after_s(value: str | None, *, now: float | None = None) -> float:
    """``Retry-After`` in seconds from now, within [0, MAX_RETRY_AFTER_S]
    (``parse_retry_after``); the default if absent or unreadable."""
    seconds = parse_retry_after(value, now=now)
    return DEFAULT_RETRY_AFTER_S if seconds is None else seconds


def busy_error(response: httpx2.Response) -> UnavailableError | None:
    """``upstream_busy`` for a 429/503 answer (None for any other status)."""
    status = response.status_code
    if status not in BUSY_STATUSES:
        return None
    wait = retry_after_s(response.headers.get("retry-after"))
    what = "too many requests" if status == 429 else "unavailable for now"
    return UnavailableError(
        f"the server answered {status} ({what}); retry after {wait:g} s",
        reason="upstream_busy",
        data={"status": status, "retry_after_s": round(wait, 3)},
    )
