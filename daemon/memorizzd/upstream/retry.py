"""When to send a request again: after a lost connection, and after the
upstream said it is busy (429/503).

After a lost connection (the outcome is unknown), only a request that is safe
to repeat (a listing, a read, a prompt) is sent again, on a new session, at
most ``LOST_SENDS`` times in all, after a jittered, doubling pause
(``lost_wait``) and within the caller's deadline. A request that the server
says it did not run (its session had expired: HTTP 404) is sent once more,
whatever it is. A request that timed out is never sent again: its deadline
is spent.

Bounded honouring of ``Retry-After``:

* only a request that is safe to repeat is sent again (a listing, a read, a
  prompt, a tool classified ``read``); a ``tools/call`` that may change
  anything never is: the agent gets ``upstream_busy`` and decides;
* the wait is the server's ``Retry-After``, at most ``MAX_WAIT_S``, and only
  when it ends inside the caller's deadline (else the caller gets the error at
  once, with the hint, instead of a timeout later);
* at most ``MAX_ATTEMPTS`` sends per request;
* a per-server retry budget (gRPC's retry throttling, A6): every busy answer
  costs a token, every success earns back ``TOKEN_RATIO``; retries stop
  while half the tokens or fewer are left. A server that is busy for
  everyone is not sent twice the load.
"""

from __future__ import annotations

import random
from typing import Final

LOST_SENDS: Final = 3
LOST_PAUSE_S: Final = 0.05
MAX_WAIT_S: Final = 60.0
MAX_ATTEMPTS: Final = 3
MAX_TOKENS: Final = 10.0
TOKEN_RATIO: Final = 0.1


class RetryBudget:
    """One server's retry tokens (no clock: it moves with answers)."""

    def __init__(self) -> None:
        self.tokens = MAX_TOKENS

    def succeeded(self) -> None:
        self.tokens = min(MAX_TOKENS, self.tokens + TOKEN_RATIO)

    def busy(self) -> bool:
        """Count a busy answer; whether a retry is still within the budget."""
        self.tokens = max(0.0, self.tokens - 1.0)
        return self.tokens > MAX_TOKENS / 2


def busy_wait(
    retry_after_s: float, *, remaining_s: float, attempt: int, repeatable: bool
) -> float | None:
    """How long to wait before sending again, or None: do not send again.

    ``attempt`` counts the sends so far (1 after the first); ``remaining_s`` is
    what is left of the caller's deadline.
    """
    if not repeatable or attempt >= MAX_ATTEMPTS:
        return None
    wait = max(0.0, retry_after_s)
    if wait > MAX_WAIT_S or wait >= remaining_s:
        return None
    return wait


def lost_wait(attempt: int) -> float:
    """The pause before sending a safe request again after its connection was
    lost ``attempt`` times: ``LOST_PAUSE_S`` doubling, times a random factor in
    [0.5, 1] (many callers must not hit a restarted server at once)."""
    jitter: float = random.uniform(0.5, 1.0)  # noqa: S311 - not cryptographic
    return LOST_PAUSE_S * 2.0**attempt * jitter
