"""One call pipeline: every tool call goes through ``Calls``.

``tools/call`` on a socket (``Calls.call``) and ``approvals/resume``
(``Calls.resume``), and whatever front the daemon grows next, run the same
steps, each once:

1. the arguments are read once (``Auditor.call_arguments``): decoded for
   policy and approvals, keyed and HMAC'd for the audit, and kept as the
   caller's bytes for the relay;
2. one deadline, the caller's (``Upstream.deadline_for``), bounds everything
   after: fetching a listing when the cache is cold, waiting for a session,
   busy retries, and the answer;
3. one policy lookup returns the verdict and the tool from one listing
   (``Upstream.tool_verdict``), so a ``tools/list_changed`` cannot slip
   between them;
4. the call is relayed (``Upstream.call_tool``): the arguments go out as the
   bytes the caller sent, and the result comes back as the bytes the server
   wrote, spliced into our reply unread (``msgspec.Raw``); its size, for the
   audit, is the length of those bytes;
5. one audit record, written the one way (``Auditor.record``), before the
   reply is sent; a call that may change something (not a ``read``) is
   spooled as it begins, before it is sent (``Calls.intent``), and its record
   settles that: a daemon killed meanwhile leaves it ``interrupted``.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from functools import partial
from typing import Any, Final

import anyio
import anyio.abc
import msgspec

from memorizz.api import methods as m
from memorizz.api.errors import (
    MethodNotFoundError,
    PermissionDeniedError,
    RemoteError,
    UpstreamError,
)
from memorizzd.approvals import (
    SERVER_GONE,
    ApprovalBook,
    approval_required,
    not_approved,
    schema_hash,
)
from memorizzd.audit import (
    Auditor,
    CallArguments,
    interruption,
    of_proposal,
    outcome_for,
)
from memorizzd.caller import Caller
from memorizzd.calllife import (
    aborted_reason,
    bound_asks,
    client_aborted,
    client_send,
    mark_abortable,
)
from memorizzd.policy import refusal
from memorizzd.telemetry import tracing
from memorizzd.telemetry.metrics import OTHER, CallMeter
from memorizzd.telemetry.tracing import TraceContext
from memorizzd.upstream.actor import Upstream
from memorizzd.upstream.connection import ProgressHandler
from memorizzd.upstream.pool import Pool
from memorizzd.upstream.tasks import PROFILE_REMOVED, TaskBook, TaskEntry

log = logging.getLogger("memorizzd.calls")

_encode = msgspec.json.encode

_DAEMON: Final = Caller(
    pid=os.getpid(), uid=os.getuid(), gid=os.getgid(), socket="memorizzd"
)
"""Who the daemon's own cancels are, in the audit trail."""
CANCEL_FORGOTTEN_S: Final = 10.0
"""How long the daemon tries to cancel one server's forgotten tasks (a
removed profile's: ``Calls.cancel_forgotten``), all of them together."""


class Calls:
    def __init__(
        self,
        pool: Pool,
        *,
        book: ApprovalBook,
        auditor: Auditor,
        scope: Callable[[Caller, str], Upstream],
        sees: Callable[[Caller, str], bool],
        metered: bool = True,
    ) -> None:
        self._pool = pool
        self._book = book
        self._auditor = auditor
        self._scope = scope
        """The caller's server by name (``unknown_server`` outside its scope)."""
        self._running = 0
        """Calls in flight."""
        self.tasks = TaskBook(sees=sees)
        """The tasks calls created, by caller; those of a server the caller
        no longer sees (``Broker.sees``) are unknown to it (``upstream/tasks.py``)."""
        self._meter = CallMeter(self._labels) if metered else None
        """The calls' metrics (``telemetry/metrics.py``), counted with their audit
        (None: ``[metrics] enabled = false``, nothing counted)."""

    @property
    def in_flight(self) -> int:
        return self._running

    # --- for the warm relay (``relay.py``), which runs the same steps -------

    @property
    def auditor(self) -> Auditor:
        return self._auditor

    def scoped(self, caller: Caller, server: str) -> Upstream:
        """The caller's server by name (``unknown_server`` outside its scope)."""
        return self._scope(caller, server)

    def began(self) -> None:
        self._running += 1

    def ended(self) -> None:
        self._running -= 1

    def _labels(self, server: str, tool: str) -> tuple[str, str]:
        """A call's metric labels: a configured server, a listed tool, else other."""
        if server not in self._pool:
            return OTHER, OTHER
        view = self._pool.get(server).tools_view
        return server, tool if view is not None and view.tool(tool) else OTHER

    async def call(
        self,
        caller: Caller,
        server: str,
        *,
        tool: str,
        arguments: msgspec.Raw,
        timeout_s: float | None,
        reuse_approved: bool = False,
        progress: ProgressHandler | None = None,
        task: bytes | None = None,
        trace: TraceContext | None = None,
    ) -> msgspec.Raw:
        """``tools/call``: policy first (anything but allow is refused, or held
        for approval, before the upstream sees it), then the relay.

        ``reuse_approved`` (the MCP face, whose clients cannot resume): a call
        decided ``ask`` that this caller already proposed and an operator
        approved (same server, tool and arguments) runs that proposal, once,
        instead of proposing again.

        ``task`` (MCP's task metadata, a JSON object's bytes): the call is
        relayed as a task (``_create_task``); its result is the server's
        ``CreateTaskResult``, the task's id the daemon's.

        ``trace``: the caller's W3C trace context (``_meta``), the parent of
        the call's span when tracing is on."""
        if tracing.enabled and not tracing.in_call():  # the call's span, around
            with tracing.call_scope(f"tools/call {server}/{tool}", trace):
                return await self.call(
                    caller,
                    server,
                    tool=tool,
                    arguments=arguments,
                    timeout_s=timeout_s,
                    reuse_approved=reuse_approved,
                    progress=progress,
                    task=task,
                )
        started = time.time()
        verdict: dict[str, Any] = {}  # what the audit records of the policy's answer
        read: CallArguments | None = None
        self._running += 1
        try:
            try:
                read = self._auditor.call_arguments(bytes(arguments))
                upstream = self._scope(caller, server)
                deadline = upstream.deadline_for(timeout_s)
                decided, listed = await upstream.tool_verdict(tool, deadline=deadline)
                if tracing.enabled:
                    tracing.child(
                        "policy", started, {"memorizz.decision": decided.decision}
                    )
                if decided.fixed:  # the server's fixed arguments (a preset's workspace)
                    value = {**read.value, **dict(decided.fixed)}
                    read = self._auditor.call_arguments(_encode(value), value)
                verdict = {"risk": decided.risk, "decision": decided.decision}
                if decided.decision == "ask" and not decided.blocked:
                    approved = (  # its own, of exactly this call
                        await self._book.approved_call(
                            caller, upstream.name, tool, read.hmac
                        )
                        if reuse_approved
                        else None
                    )
                    if approved is not None and task is None:
                        return await self.resume(
                            caller, approved, timeout_s=timeout_s, progress=progress
                        )
                    proposal = await self._book.propose(
                        caller,
                        server=upstream.name,
                        tool=tool,
                        arguments=read,
                        risk=decided.risk,
                        schema=None if listed is None else listed.input_schema,
                    )
                    verdict["proposal_id"] = proposal.id
                    if not self._pool.holds(upstream):
                        # removed while the call was on its way, after
                        # server_removed swept its proposals: this one too
                        # (and if one of the same name was added since, it
                        # is another server, which must not inherit it)
                        await self._book.invalidate(proposal, SERVER_GONE, owe=True)
                        raise not_approved(await self._book.get_any(proposal.id))
                    raise approval_required(proposal)
                if decided.decision != "allow":
                    raise refusal(decided, server=upstream.name, tool=tool)
            except RemoteError as exc:
                # a refusal is recorded as denied, within the caller's budget
                self.audit(
                    caller,
                    "tools/call",
                    started,
                    server,
                    tool,
                    read,
                    outcome=outcome_for(exc.reason),
                    reason=exc.reason,
                    **verdict,
                )
                raise
            audit = partial(
                self.audit,
                caller,
                "tools/call",
                started,
                upstream.name,
                tool,
                read,
                settles=self.intent(
                    caller, started, upstream.name, tool, read, **verdict
                ),
            )
            if task is not None:
                return await self._create_task(
                    caller, upstream, tool, read, task, deadline, audit, verdict
                )
            return await self._relay(
                upstream, tool, read, decided.risk, deadline, audit, verdict, progress
            )
        finally:
            self._running -= 1

    def intent(
        self,
        caller: Caller,
        started: float,
        server: str,
        tool: str,
        read: CallArguments,
        *,
        risk: m.Risk,
        decision: m.Decision,
    ) -> str | None:
        """A call that may change something upstream (not a ``read``) is
        spooled before it is sent (``Auditor.begin``): a daemon killed while
        it runs leaves its record, ``interrupted``. The token its record
        settles; None for a read (it changes nothing: no cost on its way)."""
        if risk == "read":
            return None
        return self._auditor.begin(
            caller,
            action="tools/call",
            started=started,
            server=server,
            tool=tool,
            risk=risk,
            decision=decision,
            arguments=read,
        )

    async def resume(
        self,
        caller: Caller,
        proposal: m.Proposal,
        *,
        timeout_s: float | None,
        progress: ProgressHandler | None = None,
    ) -> msgspec.Raw:
        """``approvals/resume``: the stored call, checked against the server as
        it is now (the tool's schema; the policy still allows it), consumed
        (durably), and only then relayed, once."""
        if tracing.enabled and not tracing.in_call():  # the call's span, around
            with tracing.call_scope(
                f"approvals/resume {proposal.server}/{proposal.tool}"
            ):
                return await self.resume(
                    caller, proposal, timeout_s=timeout_s, progress=progress
                )
        if await self._book.settle():  # an invalidation owed may end this one
            proposal = await self._book.get_any(proposal.id)
        if proposal.status != "approved":
            raise not_approved(proposal)
        try:
            upstream = self._scope(caller, proposal.server)
        except RemoteError as exc:
            if exc.reason != "unknown_server":
                raise
            # Removed, or out of the caller's scope now (a reload narrowed its
            # profile): the same to the caller, which cannot tell them apart.
            await self._book.invalidate(proposal, SERVER_GONE)
            raise not_approved(await self._book.get_any(proposal.id)) from None
        deadline = upstream.deadline_for(timeout_s)
        decided, listed = await upstream.tool_verdict(proposal.tool, deadline=deadline)
        current = schema_hash(None if listed is None else listed.input_schema)
        if current != proposal.schema_hash:
            await self._book.invalidate(proposal, "the tool's schema changed")
            raise not_approved(await self._book.get_any(proposal.id))
        if decided.blocked or decided.decision == "deny":
            raise refusal(decided, server=proposal.server, tool=proposal.tool)
        # Spooled as it begins (``Auditor.begin``): a daemon killed once the
        # proposal is consumed, while its call runs upstream, leaves a record.
        started = time.time()
        token = self._auditor.begin(
            caller,
            action="approvals/resume",
            started=started,
            **of_proposal(proposal),
        )
        try:
            value = await self._book.consume(caller, proposal)  # its HMAC verified
        except RemoteError:  # not consumed: the call does not run
            self._auditor.abandon(token)
            raise
        except BaseException as exc:  # consumed or not, it does not run
            self._auditor.end(token, outcome="interrupted", reason=interruption(exc))
            raise
        read = CallArguments(
            _encode(value), value, sorted(value), proposal.arguments_hmac
        )
        verdict: dict[str, Any] = {
            "risk": proposal.risk,
            "decision": "ask",
            "proposal_id": proposal.id,
        }
        audit = partial(
            self.audit,
            caller,
            "approvals/resume",
            started,
            proposal.server,
            proposal.tool,
            read,
            settles=token,
        )
        self._running += 1
        try:
            return await self._relay(
                upstream,
                proposal.tool,
                read,
                proposal.risk or "write",
                deadline,
                audit,
                verdict,
                progress,
            )
        finally:
            self._running -= 1

    async def _relay(
        self,
        upstream: Upstream,
        tool: str,
        read: CallArguments,
        risk: m.Risk,
        deadline: float,
        audit: partial[Any],
        verdict: dict[str, Any],
        progress: ProgressHandler | None = None,
    ) -> msgspec.Raw:
        # a read may be abandoned with its client; anything else runs to the end
        mark_abortable(risk == "read")
        bound_asks(deadline)  # what the upstream asks the caller, within its deadline
        span = tracing.upstream_span(upstream.name, tool) if tracing.enabled else None
        try:
            result = await upstream.call_tool(
                tool, read.raw, risk=risk, deadline=deadline, progress=progress
            )
        except RemoteError as exc:
            audit(outcome=outcome_for(exc.reason), reason=exc.reason, **verdict)
            raise
        except BaseException as exc:  # a bug, or cancelled (client gone, shutdown)
            if client_aborted():
                outcome, reason = "client_aborted", aborted_reason()
            else:
                outcome = "failed"
                reason = "internal" if isinstance(exc, Exception) else "cancelled"
            audit(outcome=outcome, reason=reason, **verdict)
            raise
        finally:
            if span is not None:
                span.end()
        audit(
            outcome="tool_error" if result.is_error else "ok",
            result_bytes=len(result.raw),
            **verdict,
        )
        return result.raw

    async def _create_task(
        self,
        caller: Caller,
        upstream: Upstream,
        tool: str,
        read: CallArguments,
        task: bytes,
        deadline: float,
        audit: partial[Any],
        verdict: dict[str, Any],
    ) -> msgspec.Raw:
        """A task-augmented call: relayed with the caller's task metadata, the
        task recorded as the caller's (its status notifications go to this
        connection), the audit's outcome ``task_created``."""
        name = upstream.name
        try:
            if not upstream.takes_tool_tasks:
                raise MethodNotFoundError(
                    f"server {name!r} does not take tools/call as a task",
                    data={"server": name},
                )
            raw = await upstream.request(
                lambda client: client.call_tool_task(tool, read.raw, task),
                deadline=deadline,
                safe=False,
            )
            entry, shown = self.tasks.created(caller, name, tool, raw, client_send())
            if self.tasks.gone(caller):
                await self._cancel_orphan(upstream, entry)
        except RemoteError as exc:
            audit(outcome=outcome_for(exc.reason), reason=exc.reason, **verdict)
            raise
        except BaseException as exc:  # a bug, or cancelled
            reason = "internal" if isinstance(exc, Exception) else "cancelled"
            audit(outcome="failed", reason=reason, **verdict)
            raise
        audit(outcome="task_created", result_bytes=len(raw), **verdict)
        return msgspec.Raw(_encode(shown))

    async def task(
        self,
        caller: Caller,
        method: str,
        task_id: str,
        *,
        timeout_s: float | None = None,
    ) -> dict[str, Any]:
        """``tasks/get``, ``tasks/result`` or ``tasks/cancel`` of the caller's
        own task (anyone else's is unknown), sent to its server only; the
        result as the caller sees it (the daemon's id). A cancel is audited."""
        entry = self.tasks.get(caller, task_id)
        upstream = self._scope(caller, entry.server)
        deadline = upstream.deadline_for(timeout_s)
        started = time.time()
        cancel = method == "tasks/cancel"
        params = {"taskId": entry.upstream_id}
        try:
            raw = await upstream.request(
                lambda client: client.task_request(method, params),
                deadline=deadline,
                safe=not cancel,
            )
        except RemoteError as exc:
            if cancel:
                self.audit(
                    caller,
                    method,
                    started,
                    entry.server,
                    entry.tool,
                    None,
                    outcome=outcome_for(exc.reason),
                    reason=exc.reason,
                )
            raise
        if cancel:
            self.audit(
                caller, method, started, entry.server, entry.tool, None, outcome="ok"
            )
        try:
            if method == "tasks/result":
                entry.heard({"status": "completed"})  # answered: it has ended
                return self.tasks.payload(entry, raw)
            task = msgspec.json.decode(raw)
            entry.heard(task)
            shown: dict[str, Any] = self.tasks.shown(entry, task)
        except RecursionError:  # read where it arrived, too deep here
            raise UpstreamError(
                f"{entry.server}: the server's answer is nested too deeply",
                data={"server": entry.server},
            ) from None
        return shown

    def cancel_forgotten(
        self, entries: list[TaskEntry], *, why: str, background: anyio.abc.TaskGroup
    ) -> None:
        """Cancel upstream the tasks the book forgot with their profile (a
        reload removed it: ``TaskBook.profiles_in_force``), best effort, in
        ``background``: each server's on the session it runs on now (taken
        here, before the reload retires or replaces it: a retired server's
        drain waits for them), one after another, all within
        ``CANCEL_FORGOTTEN_S``; a server that is slow, down or gone costs the
        reload nothing. Each is audited as the daemon's ``tasks/cancel``
        (socket ``memorizzd``), with ``why`` as its reason."""
        by_server: dict[str, list[TaskEntry]] = {}
        for entry in entries:
            by_server.setdefault(entry.server, []).append(entry)
        for server, batch in by_server.items():
            if server not in self._pool:
                log.debug("%s: gone, %d tasks not cancelled", server, len(batch))
                continue
            log.debug("%s: cancelling %d tasks (%s)", server, len(batch), why)
            background.start_soon(self._cancel_all, self._pool.get(server), batch, why)

    async def _cancel_orphan(self, upstream: Upstream, entry: TaskEntry) -> None:
        """A task made for a caller whose profile a reload removed while its
        call ran (after the reload forgot that profile's tasks): forgotten and
        cancelled upstream now (shielded: the caller may be gone, the task
        must not run on), and the call refused."""
        self.tasks.forget(entry)
        with anyio.CancelScope(shield=True):
            deadline = anyio.current_time() + CANCEL_FORGOTTEN_S
            outcome = await self._cancel_one(upstream, entry, deadline)
        self._audit_cancel(entry, outcome, PROFILE_REMOVED)
        raise PermissionDeniedError(
            f"profile {entry.caller.profile!r} was removed while the call ran;"
            " the task it made was cancelled",
            data={"server": entry.server},
        )

    def _audit_cancel(self, entry: TaskEntry, outcome: str, why: str) -> None:
        """The daemon's own ``tasks/cancel`` of ``entry``, in the audit trail."""
        self.audit(
            _DAEMON,
            "tasks/cancel",
            time.time(),
            entry.server,
            entry.tool,
            None,
            outcome=outcome,
            reason=why,
            refusal=False,
        )

    async def _cancel_all(
        self, upstream: Upstream, batch: list[TaskEntry], why: str
    ) -> None:
        deadline = anyio.current_time() + CANCEL_FORGOTTEN_S
        cancelled = 0
        for entry in batch:
            if anyio.current_time() >= deadline:  # out of time: the rest are not sent
                outcome = "timeout"
            else:
                outcome = await self._cancel_one(upstream, entry, deadline)
            cancelled += outcome == "ok"
            self._audit_cancel(entry, outcome, why)
        log.info(
            "%s: %d of %d tasks cancelled (%s)",
            upstream.name,
            cancelled,
            len(batch),
            why,
        )

    @staticmethod
    async def _cancel_one(upstream: Upstream, entry: TaskEntry, deadline: float) -> str:
        """One forgotten task's ``tasks/cancel``: its audit outcome; never raises
        (but a cancellation: the daemon stopping)."""
        params = {"taskId": entry.upstream_id}
        try:
            await upstream.request(
                lambda client: client.task_request("tasks/cancel", params),
                deadline=min(deadline, upstream.deadline_for(None)),
                safe=False,
            )
        except RemoteError as exc:
            log.debug("%s: task %s not cancelled: %s", entry.server, entry.id, exc)
            return outcome_for(exc.reason)
        except Exception:  # never into the task group (it is the daemon's)
            log.debug(
                "%s: task %s not cancelled", entry.server, entry.id, exc_info=True
            )
            return "failed"
        return "ok"

    async def task_list(self, caller: Caller) -> list[dict[str, Any]]:
        """The caller's tasks, each as its server says it is now (``tasks/get``);
        one its server no longer knows is forgotten, one whose server cannot
        answer now is left out."""
        found = []
        for entry in self.tasks.mine(caller):
            try:
                found.append(await self.task(caller, "tasks/get", entry.id))
            except RemoteError as exc:
                if exc.data.get("upstream_code") == -32602:
                    self.tasks.forget(entry)
        return found

    def audit(
        self,
        caller: Caller,
        action: str,
        started: float,
        server: str,
        tool: str,
        arguments: CallArguments | None,
        *,
        settles: str | None = None,
        **fields: Any,
    ) -> None:
        """Meter, trace and record one call (``settles``: ``Auditor.record``'s)."""
        if action != "tasks/cancel":
            if self._meter is not None:
                self._meter(
                    server,
                    tool,
                    fields.get("decision"),
                    fields["outcome"],
                    time.time() - started,
                )
            if tracing.enabled:
                _trace(caller, action, server, tool, fields)
        self._auditor.record(
            caller,
            action=action,
            started=started,
            server=server,
            tool=tool,
            arguments=arguments,
            settles=settles,
            **fields,
        )


def _trace(
    caller: Caller, action: str, server: str, tool: str, fields: dict[str, Any]
) -> None:
    """The call's audit on its span (``telemetry/tracing.py``); never argument values."""
    outcome = fields["outcome"]
    attributes = {
        "memorizz.server": server,
        "memorizz.tool": tool,
        "memorizz.profile": caller.profile or "operator",
        "memorizz.decision": fields.get("decision") or "none",
        "memorizz.outcome": outcome,
    }
    if fields.get("proposal_id"):
        attributes["memorizz.proposal"] = fields["proposal_id"]
    tracing.annotate(
        f"{action} {server}/{tool}",
        attributes=attributes,
        failed=outcome not in ("ok", "tool_error", "approval_required", "task_created"),
    )


class ProgressReport(msgspec.Struct, omit_defaults=True):
    """What a front takes of an upstream's ``notifications/progress`` params."""

    progress: float
    total: float | None = None
    message: str | None = None


_decode_report: Final = msgspec.json.Decoder(ProgressReport).decode


def progress_to_client(
    note: Callable[[ProgressReport], bytes],
) -> ProgressHandler | None:
    """A call's progress, each report sent to the running request's client as
    the line ``note`` makes of it (each front speaks its own protocol); None
    where the client's protocol cannot be sent to. A malformed report is
    dropped: it is not worth failing the call over."""
    send = client_send()
    if send is None:
        return None

    async def forward(params: msgspec.Raw) -> None:
        try:
            report = _decode_report(params)
        except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
            return
        await send(note(report))

    return forward
