"""Tasks (MCP 2025-11-25): which caller made which task on which server.

A ``tools/call`` with ``task`` in its params is relayed like any call
(``calls.py``); the server answers at once with a ``CreateTaskResult`` and
runs the tool on its own. The daemon keeps one warm session to each server
for every caller, so the server's task ids are the session's, not any
caller's: ``TaskBook`` remembers, per task, its server, the server's id, the
tool, and its owner (the caller's role, profile and uid), and shows the
caller an id of its own (``t_`` and 24 hex digits) instead. So:

* ids never collide across servers, and an id names its server: nothing a
  caller sends is routed by the server's id; a server's id given again (its
  process started again, a replica set's primary handed over) names the new
  task only: the old one's entry is forgotten;
* ``tasks/get``, ``tasks/result``, ``tasks/cancel`` reach the task's server
  only for its owner: the same uid on the same socket role and profile
  (through the face or the socket API alike); anyone else is told it does
  not exist, as for an id never made;
* ``tasks/list`` lists the owner's tasks only;
* a server's ``notifications/tasks/status`` reaches the connection that
  created the task (a face session or a socket connection), its task id
  rewritten, and no other.

A reload that removes a profile forgets its tasks (``profiles_in_force``),
and the daemon cancels upstream each one not known to have ended
(``Calls.cancel_forgotten``: best effort, in the background, bounded): no
one can reach them any more, and an operator who removes a profile expects
its agents' work to stop. A reload that only narrows a profile's servers
forgets nothing and cancels nothing: the tasks on a server it no longer sees
are hidden from it (``get``, ``mine``, ``noticed``) and run on, and a reload
that gives the server back shows them again. Each entry keeps the last
status the server gave (``TaskEntry.status``) for that.

The book lives in memory: tasks do not survive a daemon restart (their
servers' processes do not either, for stdio servers). It holds at most
``MAX_TASKS_PER_OWNER`` of one owner's (past it, that owner's oldest is
forgotten: one agent's flood never pushes out another's tasks) and
``MAX_TASKS`` in all (past it, the oldest is forgotten).
"""

from __future__ import annotations

import logging
import secrets
import weakref
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final

import anyio
import msgspec

from memorizz.api import mcp_meta
from memorizz.api.errors import InvalidParamsError, UpstreamError
from memorizzd.caller import Caller

log = logging.getLogger("memorizzd.upstream.tasks")

MAX_TASKS: Final = 10_000
MAX_TASKS_PER_OWNER: Final = 1_000
STATUS_SEND_S: Final = 1.0
"""How long one status notification may take to reach its connection."""
STATUS: Final = "notifications/tasks/status"
PROFILE_REMOVED: Final = "profile_removed"
"""The audit reason of the daemon's ``tasks/cancel`` of a removed profile's task."""
TERMINAL: Final = frozenset({"completed", "failed", "cancelled"})
"""MCP's task statuses a task never leaves."""

Owner = tuple[str | None, str | None, int]
"""Who may use a task: the caller's role, profile and uid."""
Send = Callable[[bytes], Awaitable[None]]

_encoder: Final = msgspec.json.Encoder()


@dataclass(slots=True)
class TaskEntry:
    id: str
    """The daemon's id, shown to the caller."""
    server: str
    upstream_id: str
    """The server's own id, sent only to that server."""
    tool: str
    owner: Owner
    sender: Callable[[], Send | None]
    """The creating connection's send (status notifications), while it
    lasts: held weakly (``_weakly``), so that a task outliving its connection
    (a ``--task`` call's connection closes at once) does not keep it."""
    caller: Caller
    """Who created it: a status reaches its connection only while the server
    is in its scope (``TaskBook.sees``)."""
    status: str | None = None
    """The last status the server gave (its ``CreateTaskResult``, a status
    notification, a ``tasks/get`` or ``tasks/cancel`` answer; ``completed``
    once ``tasks/result`` answered); None: it gave none. One in ``TERMINAL``
    is never replaced."""

    @property
    def ended(self) -> bool:
        """Whether the task is known to have ended (nothing to cancel)."""
        return self.status in TERMINAL

    def heard(self, task: Any) -> None:
        """A task object from its server (``Task``): its status, if it says
        one, unless the task has ended already (a late, stale word)."""
        status = task.get("status") if isinstance(task, dict) else None
        if isinstance(status, str) and not self.ended:
            self.status = status


def owner_of(caller: Caller) -> Owner:
    return (caller.role, caller.profile, caller.uid)


def _none() -> Send | None:
    return None


def _weakly(send: Send | None) -> Callable[[], Send | None]:
    """``send`` for as long as its connection lives: a connection's bound
    method is held weakly (the book keeps a task until its owner's cap
    pushes it out, which is long after its connection closed: a strong
    reference kept every such connection, its socket object and buffers,
    alive); any other callable as it is."""
    if send is None:
        return _none
    if hasattr(send, "__self__") and hasattr(send, "__func__"):
        return weakref.WeakMethod(send)
    return lambda: send


class TaskBook:
    def __init__(self, sees: Callable[[Caller, str], bool] | None = None) -> None:
        self._sees = sees
        """Whether a caller may hear of a server now (``Broker.sees``): a reload
        that takes the server out of the creator's scope silences its tasks."""
        self._tasks: OrderedDict[str, TaskEntry] = OrderedDict()
        self._by_upstream: dict[tuple[str, str], str] = {}
        self._owned: dict[Owner, OrderedDict[str, None]] = {}
        """Each owner's task ids, oldest first."""
        self._profiles: frozenset[str] | None = None
        """The profiles in force (the last reload's; None: not told yet)."""

    def created(
        self,
        caller: Caller,
        server: str,
        tool: str,
        raw: bytes,
        send: Send | None,
    ) -> tuple[TaskEntry, dict[str, Any]]:
        """Record the task of a server's ``CreateTaskResult`` (``raw``); the
        result as the caller sees it (its id the daemon's)."""
        try:
            result = msgspec.json.decode(raw)
            upstream_id = result["task"]["taskId"]
        except (msgspec.DecodeError, RecursionError, KeyError, TypeError):
            upstream_id = None
        if not isinstance(upstream_id, str):
            raise UpstreamError(
                f"{server}: the server answered a task-augmented call without a task",
                data={"server": server},
            )
        entry = TaskEntry(
            id=f"t_{secrets.token_hex(12)}",
            server=server,
            upstream_id=upstream_id,
            tool=tool,
            owner=owner_of(caller),
            sender=_weakly(send),
            caller=caller,
        )
        entry.heard(result.get("task"))
        reused = self._by_upstream.get((server, upstream_id))
        if reused is not None and reused in self._tasks:
            # The server gave this id again: the task it named is gone with its
            # process (started again, a replica set's primary handed over);
            # its entry would reach the new task, another caller's perhaps.
            self.forget(self._tasks[reused])
        self._tasks[entry.id] = entry
        self._by_upstream[(server, upstream_id)] = entry.id
        owned = self._owned.setdefault(entry.owner, OrderedDict())
        owned[entry.id] = None
        if len(owned) > MAX_TASKS_PER_OWNER:
            self.forget(self._tasks[next(iter(owned))])
        while len(self._tasks) > MAX_TASKS:
            self.forget(next(iter(self._tasks.values())))
        result["task"] = self.shown(entry, result["task"])
        return entry, result

    def get(self, caller: Caller, task_id: str) -> TaskEntry:
        """The caller's task ``task_id``; any other is unknown (``-32602``, as
        MCP answers an id it does not know), and so is one whose server has
        left the caller's scope since (a reload)."""
        entry = self._tasks.get(task_id)
        if (
            entry is None
            or entry.owner != owner_of(caller)
            or not self._visible(caller, entry.server)
        ):
            raise InvalidParamsError(
                f"unknown task {task_id[:128]!r}", data={"task_id": task_id[:128]}
            )
        return entry

    def mine(self, caller: Caller) -> list[TaskEntry]:
        """The caller's tasks on servers it still sees."""
        owned = self._owned.get(owner_of(caller))
        found = [] if owned is None else [self._tasks[task_id] for task_id in owned]
        return [e for e in found if self._visible(caller, e.server)]

    def _visible(self, caller: Caller, server: str) -> bool:
        return self._sees is None or self._sees(caller, server)

    def profiles_in_force(self, names: Iterable[str]) -> list[TaskEntry]:
        """A reload's profiles: the tasks of a removed one are forgotten, as
        its proposals are (``ApprovalBook.profiles_in_force``). A profile of
        the same name added later is another profile, and never inherits
        them (the owner is role, profile and uid: the same uid would).

        The forgotten tasks not known to have ended are returned: no caller
        can reach them any more, so the reload cancels them upstream
        (``Calls.cancel_forgotten``) rather than let them run for nobody
        until their ``ttl``. A profile that stays keeps all its tasks, those
        on a server it no longer sees too (hidden, not cancelled)."""
        kept = self._profiles = frozenset(names)
        running: list[TaskEntry] = []
        for owner in [o for o in self._owned if o[1] is not None and o[1] not in kept]:
            for task_id in list(self._owned.get(owner, ())):
                entry = self._tasks[task_id]
                self.forget(entry)
                if not entry.ended:
                    running.append(entry)
        return running

    def gone(self, caller: Caller) -> bool:
        """Whether the caller's profile has left the config (a reload removed
        it while its call ran: the task it made is nobody's)."""
        return (
            caller.profile is not None
            and self._profiles is not None
            and caller.profile not in self._profiles
        )

    def forget(self, entry: TaskEntry) -> None:
        """The server no longer knows the task (expired): drop it."""
        if self._tasks.pop(entry.id, None) is not None:
            key = (entry.server, entry.upstream_id)
            if self._by_upstream.get(key) == entry.id:  # not a newer task's
                del self._by_upstream[key]
            owned = self._owned.get(entry.owner)
            if owned is not None:
                owned.pop(entry.id, None)
                if not owned:
                    del self._owned[entry.owner]

    @staticmethod
    def shown(entry: TaskEntry, task: Any) -> Any:
        """A server's task object as its owner sees it: the daemon's id, and
        its server and tool in ``_meta``."""
        if not isinstance(task, dict):
            return task
        meta = task.get("_meta")
        return {
            **task,
            "taskId": entry.id,
            "_meta": {
                **(meta if isinstance(meta, dict) else {}),
                "memorizz/server": entry.server,
                "memorizz/tool": entry.tool,
            },
        }

    @staticmethod
    def payload(entry: TaskEntry, raw: bytes) -> dict[str, Any]:
        """A ``tasks/result`` payload as its owner sees it: the related-task
        ``_meta`` names the daemon's id."""
        result: dict[str, Any] = msgspec.json.decode(raw)
        meta = result.get("_meta")
        if isinstance(meta, dict) and isinstance(meta.get(mcp_meta.RELATED_TASK), dict):
            result["_meta"] = {**meta, mcp_meta.RELATED_TASK: {"taskId": entry.id}}
        return result

    async def noticed(self, server: str, params: msgspec.Raw) -> None:
        """A server's ``notifications/tasks/status``: to the connection that
        created the task, and no other (an unknown task's is dropped)."""
        try:
            task = msgspec.json.decode(params)
            upstream_id = task.get("taskId") if isinstance(task, dict) else None
        except (msgspec.DecodeError, RecursionError):
            return
        found = self._by_upstream.get((server, upstream_id)) if upstream_id else None
        entry = None if found is None else self._tasks.get(found)
        if entry is None:
            return
        entry.heard(task)  # whoever hears it: a reload cancels by it
        send = entry.sender()
        if send is None:
            return
        if not self._visible(entry.caller, server):
            return  # out of its creator's scope since (a reload): not a word
        line = {"jsonrpc": "2.0", "method": STATUS, "params": self.shown(entry, task)}
        with anyio.move_on_after(STATUS_SEND_S):
            try:
                await send(_encoder.encode(line) + b"\n")
            except Exception:  # the connection is gone: it hears no more
                log.debug("%s: a task's status not delivered", server, exc_info=True)
                entry.sender = _none
