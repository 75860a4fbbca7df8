"""How long a request lives when its client goes away.

A client that closes its connection (not one that only half-closes: it still
reads its replies) will never read the answer. A request without effects is
then cancelled at once, which also cancels its upstream request
(``notifications/cancelled``) and frees its task. A request with effects runs
to the end and is audited, since cutting it off would leave its outcome
unknown. The connection opens one :class:`CallLife` per request; the request's
handler says whether it may be abandoned (the broker knows a tool's risk only
once the policy has decided), and may ask whether it was. It lives at the
bottom of the daemon, beside ``memorizzd.caller``, so that the broker can ask
without importing ``rpc``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Final

import anyio

ABORTABLE_METHODS: Final = frozenset(
    {
        "daemon/hello",
        "daemon/status",
        "ping",
        "servers/list",
        "servers/status",
        "servers/test",
        "tools/list",
        "resources/list",
        "resources/templates/list",
        "resources/read",
        "prompts/list",
        "prompts/get",
        "audit/list",
        "approvals/list",
        "approvals/wait",
    }
)
"""Methods without effects: abandoned when their client goes away.
``tools/call`` is decided per call (see ``mark_abortable``)."""


class CallLife:
    """One request's scope: cancelled if its client leaves while it may be."""

    __slots__ = ("abortable", "aborted", "gone", "reason", "scope", "send", "session")

    def __init__(
        self,
        method: str,
        send: Callable[[bytes], Awaitable[None]] | None = None,
        session: object | None = None,
    ) -> None:
        self.session = session
        """The connection the request came on (a key for per-session state,
        e.g. the MCP face's log level); None outside a socket."""
        self.send = send
        """Sends a line to the request's client, unasked (the MCP face's
        progress notifications); None where the protocol sends nothing."""
        self.abortable = method in ABORTABLE_METHODS
        self.gone = False
        self.aborted = False
        self.reason = "client_gone"
        """Why it was aborted: ``client_gone`` or ``cancelled`` (asked to stop)."""
        self.scope = anyio.CancelScope()

    def cancel(self) -> None:
        """The client asked to stop (MCP's ``notifications/cancelled``): the
        request is cancelled whatever its effects (its upstream request is
        cancelled too, and decides what that means), and no reply is sent."""
        self.aborted = True
        self.reason = "cancelled"
        self.scope.cancel()

    def client_gone(self) -> None:
        """The client went away: cancel the request if nothing is lost by it."""
        self.gone = True
        if self.abortable:
            self.aborted = True
            self.scope.cancel()

    def set_abortable(self, abortable: bool) -> None:
        self.abortable = abortable
        if abortable and self.gone:
            self.client_gone()


current: ContextVar[CallLife | None] = ContextVar("memorizz_call_life", default=None)


def mark_abortable(abortable: bool) -> None:
    """Say whether the running request may be abandoned with its client."""
    life = current.get()
    if life is not None:
        life.set_abortable(abortable)


def client_aborted() -> bool:
    """Whether the running request is being cancelled because its client left
    or asked to stop (``aborted_reason`` says which)."""
    life = current.get()
    return life is not None and life.aborted


def client_send() -> Callable[[bytes], Awaitable[None]] | None:
    """How to send the running request's client a line unasked, if its protocol can."""
    life = current.get()
    return None if life is None else life.send


def client_session() -> object | None:
    """The running request's connection (see ``CallLife.session``)."""
    life = current.get()
    return None if life is None else life.session


def aborted_reason() -> str:
    """``client_gone`` or ``cancelled`` (for the audit record of an aborted call)."""
    life = current.get()
    return "client_gone" if life is None else life.reason
