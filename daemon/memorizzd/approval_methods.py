"""The ``approvals/*`` methods: list, decide, wait for and resume proposals.

The state machine and its storage are ``memorizzd.approvals``; this module is
the thin adapter from Params to it, plus ``resume``: check the stored call
against the server as it is now (the tool's schema; the policy still allows
it), consume the proposal (durably), and only then send the call.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from memorizz.api import methods as m
from memorizz.api.errors import InvalidParamsError, PermissionDeniedError, RemoteError
from memorizzd.approvals import MAX_WAIT_S, ApprovalBook, not_approved, schema_hash
from memorizzd.caller import Caller, Handler
from memorizzd.calls import Calls
from memorizzd.upstream.actor import Upstream
from memorizzd.upstream.pool import Pool

_encoder = msgspec.json.Encoder()


class ApprovalMethods:
    def __init__(self, pool: Pool, *, book: ApprovalBook, calls: Calls) -> None:
        self._pool = pool
        self._book = book
        self._calls = calls

    def handlers(self) -> Mapping[str, Handler]:
        table: dict[str, Any] = {
            "approvals/list": self.approvals_list,
            "approvals/approve": self.approvals_approve,
            "approvals/reject": self.approvals_reject,
            "approvals/cancel": self.approvals_cancel,
            "approvals/resume": self.approvals_resume,
            "approvals/wait": self.approvals_wait,
        }
        return table

    async def approvals_list(
        self, caller: Caller, p: m.ApprovalsListParams
    ) -> m.ApprovalsListResult:
        if not 1 <= p.limit <= 1000:
            raise InvalidParamsError("limit must be in 1..1000")
        if p.show_arguments and caller.role != "operator":
            raise PermissionDeniedError("argument values are shown to operators only")
        proposals = await self._book.list_for(caller, status=p.status, limit=p.limit)
        if p.show_arguments:
            proposals = [
                msgspec.structs.replace(q, arguments=await self._book.arguments(q))
                for q in proposals
            ]
        return m.ApprovalsListResult(proposals=proposals)

    async def approvals_approve(
        self, caller: Caller, p: m.ApprovalsApproveParams
    ) -> m.ApprovalsDecisionResult:
        proposal = await self._book.get(caller, p.id)
        if proposal.status == "pending":
            await self._check_schema(proposal)  # never approve a changed tool
        return m.ApprovalsDecisionResult(
            proposal=await self._book.approve(caller, p.id, label=p.approver)
        )

    async def approvals_reject(
        self, caller: Caller, p: m.ApprovalsRejectParams
    ) -> m.ApprovalsDecisionResult:
        return m.ApprovalsDecisionResult(
            proposal=await self._book.reject(caller, p.id, reason=p.reason)
        )

    async def approvals_cancel(
        self, caller: Caller, p: m.ApprovalsCancelParams
    ) -> m.ApprovalsDecisionResult:
        return m.ApprovalsDecisionResult(proposal=await self._book.cancel(caller, p.id))

    async def approvals_wait(
        self, caller: Caller, p: m.ApprovalsWaitParams
    ) -> m.ApprovalsWaitResult:
        if not 0 <= p.timeout_s <= MAX_WAIT_S:
            raise InvalidParamsError(f"timeout_s must be in 0..{MAX_WAIT_S:g}")
        proposal = await self._book.wait(caller, p.id, p.timeout_s)
        return m.ApprovalsWaitResult(
            proposal=proposal, decided=proposal.status != "pending"
        )

    async def _check_schema(self, proposal: m.Proposal) -> Upstream:
        """The proposal's server and tool as they are now; a changed (or gone)
        tool schema invalidates the proposal (``not_approved``)."""
        try:
            upstream = self._pool.get(proposal.server)
            _, tool = await upstream.tool_verdict(
                proposal.tool, deadline=upstream.deadline_for(None)
            )
        except RemoteError as exc:
            if exc.reason != "unknown_server":
                raise
            await self._book.invalidate(proposal, "the server was removed")
            raise not_approved(
                await self._book.get_any(proposal.id), "approvals/approve"
            ) from None
        current = schema_hash(None if tool is None else tool.input_schema)
        if current != proposal.schema_hash:
            await self._book.invalidate(proposal, "the tool's schema changed")
            raise not_approved(
                await self._book.get_any(proposal.id), "approvals/approve"
            )
        return upstream

    async def approvals_resume(
        self, caller: Caller, p: m.ApprovalsResumeParams
    ) -> msgspec.Raw:
        """Run the stored call once: checked, consumed (durably), then sent
        (the call pipeline, ``calls.py``)."""
        proposal = await self._book.get(caller, p.id)
        return await self._calls.resume(caller, proposal, timeout_s=p.timeout_s)
