"""Who may do what: who may connect to a socket, and which methods each role may call.

Authority comes from the socket a connection arrived on, never from the
payload. The operator socket serves everything to operators: the daemon's own
uid, the configured ``[operators]`` uids and groups, and uid 0 only where
``allow_root`` says so (root in a container is uid 0 on the host too). An agent
socket serves its profile's callers (its ``uids``/``gids`` when set) the
non-escalating surface in ``AGENT_METHODS``; root on an agent socket is an
agent like anyone else. Both checks use the kernel's peer credentials
(``memorizzd.rpc.peer``), taken at accept time.

The dispatcher asks ``method_allowed`` before it decodes a request's params;
what an agent may see inside an allowed method (its profile's servers, its own
proposals) is scoped by the broker, and anything outside is ``not_found``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Final

import msgspec

from memorizz.api.errors import PermissionDeniedError
from memorizz.api.methods import METHODS
from memorizzd.caller import Caller, Role
from memorizzd.config import Operators, Profile, gid_of

ROLES: Final[dict[str, frozenset[Role]]] = {
    name: method.roles for name, method in METHODS.items()
}
"""method -> the roles that may call it, from the one method table
(``memorizz.api.methods``: each method declares its roles)."""

AGENT_METHODS: Final = frozenset(
    name for name, roles in ROLES.items() if "agent" in roles
)
"""The non-escalating surface. Every other method is for operators only."""


def method_allowed(caller: Caller, method: str) -> bool:
    return caller.role in ROLES.get(method, frozenset())


def refuse_method(method: str, caller: Caller) -> PermissionDeniedError:
    """An operator's method asked on an agent socket: say whose it is and
    what this socket serves, so that the caller knows where to go."""
    message = f"{method} is not available on this socket"
    if caller.role == "agent":
        message += (
            ": it is for operators, on the operator socket; this agent socket"
            f" (profile {caller.profile!r}) serves its servers' tools, resources"
            " and prompts, and its own proposals"
        )
    return PermissionDeniedError(message, reason="permission_denied")


class SocketRule(msgspec.Struct, frozen=True, kw_only=True):
    """Who may connect to one socket, and with which role and profile."""

    role: Role
    profile: str | None = None
    uids: frozenset[int] = frozenset()
    gids: frozenset[int] = frozenset()
    allow_root: bool = False
    open_to_all: bool = False
    """Agent socket without uids/gids: whoever can open the file."""

    def admits(self, caller: Caller) -> bool:
        if caller.uid < 0:
            return False  # no credentials: never
        if self.role == "operator":
            if caller.uid == os.getuid():
                return True  # the daemon's own uid
            if caller.uid == 0:
                return self.allow_root  # alone: root need not be in uids too
        elif self.open_to_all:
            return True
        return caller.uid in self.uids or bool(caller.all_gids & self.gids)

    def refusal(self, caller: Caller) -> PermissionDeniedError:
        where = "the operator socket" if self.profile is None else "this agent socket"
        return PermissionDeniedError(
            f"uid {caller.uid} may not use {where}", reason="permission_denied"
        )


def operator_rule(operators: Operators) -> SocketRule:
    return SocketRule(
        role="operator",
        uids=frozenset(operators.uids),
        gids=_gids(operators.groups),
        allow_root=operators.allow_root,
    )


def agent_rule(profile: Profile) -> SocketRule:
    return SocketRule(
        role="agent",
        profile=profile.name,
        uids=frozenset(profile.uids),
        gids=_gids(profile.gids),
        open_to_all=not profile.uids and not profile.gids,
    )


def _gids(groups: Iterable[int | str]) -> frozenset[int]:
    return frozenset(gid_of(g) for g in groups)
