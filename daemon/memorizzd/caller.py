"""Who is calling, and the shape of a handler: the bottom of the daemon.

Every layer speaks of the caller (the broker scopes by it, approvals own
proposals by it, the audit trail records it), so its type lives here, below
all of them, and not in ``rpc`` where it is read from the kernel
(``memorizzd.rpc.peer``). A caller's role comes from the socket it connected
to; a caller built without one has no role, and no role is refused everywhere
(``memorizzd.rpc.authority``), never taken for an operator.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from memorizz.api.methods import Result, Role  # Role: declared with the method table

__all__ = ["Caller", "Handler", "Role"]


class Caller(msgspec.Struct, frozen=True, kw_only=True):
    """A connected peer as the kernel reports it, and the socket it came in on."""

    pid: int
    uid: int
    gid: int
    socket: str
    groups: tuple[int, ...] = ()
    """Supplementary groups at connect time."""
    profile: str | None = None
    """The agent profile of the socket; None on the operator socket."""
    role: Role | None = None
    """What the socket's rule made this caller; None (no role) is refused."""

    @property
    def all_gids(self) -> frozenset[int]:
        return frozenset((self.gid, *self.groups))


Handler = Callable[[Caller, Any], Awaitable[Result | msgspec.Raw]]
"""One method's implementation: the caller and its decoded Params -> Result,
or the result's JSON as it is to be sent (``msgspec.Raw``: a relayed tool
result, spliced into the reply unread)."""
