"""Approvals: a call whose decision is ``ask`` becomes a durable, single-use proposal.

States::

    pending --approve--> approved --resume (consume)--> consumed
       |                    |
       +--reject--> rejected|
       +--cancel--> cancelled <--cancel--+
       +--(expires_at)--> expired <------+
       +--(schema changed)--> invalidated <--+

Every step is one atomic ``UPDATE ... WHERE status IN (...) AND expires_at > now``
on the state database (synchronous=FULL, so durable when it returns), checked
by its rowcount. ``resume`` consumes the proposal *before* the upstream call is
sent: a crash after the consume burns the approval, it never runs twice.

Reads (``get``, ``get_any``, ``list_for``, ``wait``) write nothing: they go
through the store's read-only connection, so they answer while anyone holds
the database's write lock. Expiry is computed on read (an open proposal past
its deadline reads as ``expired``); the book's background task (``run``)
persists it on time, audits it and wakes its waiters, and a read that finds
one it has not yet written wakes that task.

Time (SECURITY.md §6.2 #25): expiries are wall-clock times (they must survive
a restart), but moving the wall clock back never extends a proposal. In the
process, the book's time never runs slower than the monotonic clock; across
a restart, the last time the book saw (persisted while proposals are open)
is where it starts again, and a wall clock found further back than
``SKEW_BUDGET_S`` expires every open proposal (fail closed) before the book
follows the new clock.

A proposal holds the exact call: server, tool, the arguments (encrypted in
the vault under ``proposal/<id>/arguments``, the ciphertext bound to that ref;
an HMAC under the audit key guards them again at resume), the tool's schema
hash and the caller's kernel-verified identity and profile. An agent sees only
its own profile's proposals; any other id is ``not_found``, exactly as one that
does not exist. A proposal never outlives its profile: a profile the config no
longer gives (a reload removed it, or the file was edited while the daemon was
stopped) has its open proposals invalidated (``profiles_in_force``), so one of
the same name added later never inherits them; nor its server: a server removed
(``servers/remove``, or a reload whose config and state database no longer give
it) has its open proposals invalidated at once (``server_removed``). The
approver is the operator connection's uid and user name (``--approver`` is only
a label). Each step leaves an audit record naming the proposal; argument values
never reach the audit.

A full disk (``StorageFullError``): a step whose write is refused changes
nothing and says so (``storage_full``); a proposal is stored whole or not at
all (its arguments and the book's time in one write, then its row). What
follows a step that was made is finished later: arguments left in the vault
are dropped by ``run`` (and at the next start); invalidations the disk
refused (a profile or server gone, a tool's schema changed) are owed, retried
by ``run``, and settled before any approve, reject, cancel or resume, which
waits for them (or is refused, ``storage_full``, while they cannot be
written). The book's own writes (expiry, its time) are retried by ``run``;
reads compute expiry themselves, so nothing runs late meanwhile.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import pwd
import secrets
import time
from collections.abc import Callable, Collection, Mapping
from contextlib import nullcontext
from functools import partial
from typing import Any, Final, NamedTuple

import anyio
import msgspec
from anyio.abc import TaskStatus

from memorizz.api import methods as m
from memorizz.api.errors import (
    ApprovalRequiredError,
    ConflictError,
    NotFoundError,
    UnavailableError,
)
from memorizzd import stored
from memorizzd.audit import Auditor, CallArguments, of_proposal
from memorizzd.caller import Caller
from memorizzd.calllife import abandonable
from memorizzd.store import ProposalRow, StorageFullError, Store, StoreError
from memorizzd.telemetry.metrics import approval_decided, approval_proposed
from memorizzd.vault import CredentialStore, VaultError

log = logging.getLogger("memorizzd.approvals")

REF_PREFIX: Final = "proposal/"
MAX_WAIT_S: Final = 300.0
_SWEEP_MAX_S: Final = 30.0
_RETRY_S: Final = 5.0
"""How soon ``run`` tries again what a full disk refused."""
RETENTION_S: Final = 7 * 86400.0
"""Ended proposals are forgotten this long after they were made (the audit stays)."""
_canonical: Final = msgspec.json.Encoder(order="sorted")
SKEW_BUDGET_S: Final = 60.0
"""How far back the wall clock may be found at start before open proposals,
whose time can no longer be told, are expired."""
CLOCK_REF: Final = "approvals/last_seen"
"""The vault entry holding the book's last-seen time (while proposals are open)."""
SAID_MAX: Final = 200
"""The most of an id the caller made up that ``not_found`` says back."""
PROFILE_GONE: Final = "the caller's profile was removed"
"""Why a proposal whose caller's profile left the config is invalidated."""
SERVER_GONE: Final = "the server was removed or is out of the caller's scope"
"""Why a proposal whose server its caller cannot reach any more is invalidated:
removed (``server_removed``, at once), or found out of the caller's scope when
resumed (a reload narrowed its profile; the caller cannot tell them apart)."""


def arguments_ref(proposal_id: str) -> str:
    return f"{REF_PREFIX}{proposal_id}/arguments"


def schema_hash(schema: dict[str, Any] | None) -> str:
    """SHA-256 (hex) of the canonical JSON of a tool's inputSchema ('' when unlisted)."""
    if schema is None:
        return ""
    return hashlib.sha256(_canonical.encode(schema)).hexdigest()


def user_name(uid: int) -> str | None:
    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError):
        return None


def not_found(proposal_id: str) -> NotFoundError:
    """The one answer for a proposal that does not exist, or not for this
    caller; it says back at most ``SAID_MAX`` characters of the id given."""
    said = proposal_id[:SAID_MAX]
    return NotFoundError(
        f"unknown proposal {said!r}", reason="not_found", data={"id": said}
    )


_NEEDS: Final = {
    "approvals/approve": "only a pending proposal can be approved",
    "approvals/reject": "only a pending proposal can be rejected",
    "approvals/cancel": "only a pending or approved proposal can be cancelled",
}
"""What each decision needs, as its refusal says it (anything else: resume's)."""


def not_approved(proposal: m.Proposal, action: str | None = None) -> ConflictError:
    """The refusal of a step its proposal's state does not allow: ``action``
    (``approvals/approve``, ``.../reject``, ``.../cancel``) says what that
    step needs; without it, resume's rule (a tools/call's too)."""
    needs = _NEEDS.get(action or "", "only an approved proposal runs")
    return ConflictError(
        f"proposal {proposal.id} is {proposal.status}; {needs}",
        reason="not_approved",
        data={"id": proposal.id, "status": proposal.status},
    )


def approval_required(proposal: m.Proposal) -> ApprovalRequiredError:
    expires = time.strftime("%H:%M:%S UTC", time.gmtime(proposal.expires_at))
    return ApprovalRequiredError(
        f"{proposal.tool} on {proposal.server} is {proposal.risk}; it needs an operator's"
        f" approval: proposal {proposal.id} (expires {expires}); then approvals/resume",
        data={
            "server": proposal.server,
            "tool": proposal.tool,
            "risk": proposal.risk,
            "decision": "ask",
            "proposal_id": proposal.id,
            "expires_at": proposal.expires_at,
        },
    )


class _Owed(NamedTuple):
    """Invalidations a full disk refused: every open proposal made by
    ``since`` (of ``server``, if given) that ``ends`` picks, for ``why``."""

    ends: Callable[[ProposalRow], bool]
    why: str
    since: float
    server: str | None = None


class ApprovalBook:
    """The proposals: their state machine, their arguments, their waiters."""

    def __init__(
        self,
        store: Store,
        vault: CredentialStore,
        auditor: Auditor,
        *,
        ttl_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._vault = vault
        self._auditor = auditor
        self._ttl_s = ttl_s
        self._clock = clock
        """The wall clock (tests move it); the book reads time through ``_now``."""
        self._seen: float | None = None
        self._seen_mono = 0.0
        self._behind = False
        self._changed: dict[str, anyio.Event] = {}
        self._waiters: dict[str, int] = {}
        """How many ``wait`` on each proposal (its event goes with the last)."""
        self._new = anyio.Event()
        """Wakes ``run``: a new proposal, or a read found one due."""
        self._swept_until = -math.inf
        """The time of the last sweep: what expired before it is written."""
        self._self = Caller(
            pid=os.getpid(), uid=os.getuid(), gid=os.getgid(), socket="memorizzd"
        )
        self._profiles: frozenset[str] | None = None
        """The profiles of the config in force (None: not told, none checked)."""
        self._caps: Mapping[str, int] = {}
        """Each profile's ``limits.max_open_proposals`` (``propose``)."""
        self._owed: list[_Owed] = []
        """Invalidations not written yet (a full disk): ``settle``."""
        self._settling = anyio.Lock()
        self._to_drop: set[str] = set()
        """Proposals whose arguments a full disk kept from being deleted
        (over, or never stored): ``run`` deletes them."""
        self._capping: dict[str, anyio.Lock] = {}
        """One lock per capped profile, held from its count of open proposals
        to the new one's row (``propose``): concurrent calls each counting
        before any of them stored its proposal all fitted under the cap."""

    # --- time -------------------------------------------------------------------

    def reconfigure(self, *, ttl_s: float) -> None:
        """A reload's ``approval_ttl_s``, for proposals stored from now on."""
        self._ttl_s = ttl_s

    def _now(self) -> float:
        """Wall-clock time that never runs slower than the monotonic clock: a
        wall clock moved back (by hand, by NTP) cannot extend a proposal."""
        wall, mono = self._clock(), time.monotonic()
        now = wall
        if self._seen is not None:
            floor = self._seen + (mono - self._seen_mono)
            behind = floor - wall > SKEW_BUDGET_S
            if behind and not self._behind:
                log.warning(
                    "the wall clock went back %.0f s; proposals keep their own time",
                    floor - wall,
                )
            self._behind = behind
            now = max(wall, floor)
        self._seen, self._seen_mono = now, mono
        return now

    def _persist_time(self, now: float) -> None:
        self._vault.put(CLOCK_REF, repr(now))

    def _last_seen(self) -> float | None:
        try:
            return float(self._vault.get(CLOCK_REF))
        except (VaultError, ValueError):
            return None

    async def _resume_time(self) -> None:
        """At start: carry on from the last time seen; a wall clock further
        back than ``SKEW_BUDGET_S`` expires every open proposal first."""
        last = await anyio.to_thread.run_sync(self._last_seen)
        wall = self._clock()
        if last is None or last <= wall:
            return
        if last - wall <= SKEW_BUDGET_S:
            self._seen, self._seen_mono = last, time.monotonic()
            return
        why = (
            f"the wall clock is {last - wall:.0f} s behind the time memorizzd last "
            "saw: this proposal's age cannot be told"
        )
        log.warning("%s; every open proposal expires", why.split(":", 1)[0])
        try:
            expired = await anyio.to_thread.run_sync(
                self._store.expire_proposals, math.inf
            )
        except StorageFullError as exc:
            # Fail closed all the same: every proposal open now is owed its
            # end (invalidated, ``settle``), and no decision runs before it.
            rows = await anyio.to_thread.run_sync(
                partial(self._store.open_proposals, now=-math.inf)
            )
            ended = frozenset(row.id for row in rows)
            self._owed.append(_Owed(lambda row: row.id in ended, why, math.inf))
            log.warning(
                "the open proposals cannot be expired now (%s): none may be"
                " decided until they are",
                exc,
            )
            return
        for row in expired:  # every record first, then the arguments go
            await self._audit(
                self._self, "approvals/expire", stored.proposal(row), reason=why
            )
        for row in expired:
            await self._finished(row.id)
        try:
            await anyio.to_thread.run_sync(self._persist_time, wall)
        except StoreError as exc:  # the next start finds the clock behind again
            log.warning("the time seen is not remembered: %s", exc)

    # --- scope ------------------------------------------------------------------

    @staticmethod
    def visible(caller: Caller, proposal: m.Proposal) -> bool:
        """Operators see every proposal; an agent its own profile's."""
        if caller.role == "operator":
            return True
        return caller.profile is not None and proposal.caller_profile == caller.profile

    async def get(self, caller: Caller, proposal_id: str) -> m.Proposal:
        found = await self._read(proposal_id)
        if found is None or not self.visible(caller, found):
            raise not_found(proposal_id)
        return found

    async def get_any(self, proposal_id: str) -> m.Proposal:
        """Unscoped: for the daemon's own checks, never for a caller's id."""
        found = await self._read(proposal_id)
        if found is None:
            raise not_found(proposal_id)
        return found

    async def list_for(
        self, caller: Caller, *, status: str | None, limit: int
    ) -> list[m.Proposal]:
        """The proposals the caller may see (an operator: every profile's),
        newest first."""
        rows = await anyio.to_thread.run_sync(
            partial(
                self._store.proposals,
                now=self._now(),
                status=status,
                profile=caller.profile,
                any_profile=caller.role == "operator",
                limit=limit,
            )
        )
        return [self._as_read(row) for row in rows]

    async def approved_call(
        self, caller: Caller, server: str, tool: str, arguments_hmac: str
    ) -> m.Proposal | None:
        """The caller's newest approved, unused proposal of exactly this call:
        made by its uid on its kind of socket (the operator's own, or the same
        profile's), whatever the number of others' (read-only)."""
        rows = await anyio.to_thread.run_sync(
            partial(
                self._store.proposals,
                now=self._now(),
                status="approved",
                profile=caller.profile,
                any_profile=False,
                server=server,
                call=(caller.uid, tool, arguments_hmac),
                limit=1,
            )
        )
        return self._as_read(rows[0]) if rows else None

    async def _read(self, proposal_id: str) -> m.Proposal | None:
        """The proposal as it stands now, read-only (no write transaction)."""
        row = await anyio.to_thread.run_sync(
            partial(self._store.proposal, proposal_id, now=self._now())
        )
        return None if row is None else self._as_read(row)

    def _as_read(self, row: ProposalRow) -> m.Proposal:
        if row.status == "expired" and row.expires_at > self._swept_until:
            self._new.set()  # expired since the last sweep: let it be written
        return stored.proposal(row)

    async def arguments(self, proposal: m.Proposal) -> dict[str, Any] | None:
        """The stored values (None once the proposal is over and they are gone)."""
        try:
            text = await anyio.to_thread.run_sync(
                self._vault.get, arguments_ref(proposal.id)
            )
        except VaultError:
            return None
        value = msgspec.json.decode(text)
        return value if isinstance(value, dict) else None

    # --- the steps ----------------------------------------------------------

    async def propose(
        self,
        caller: Caller,
        *,
        server: str,
        tool: str,
        arguments: CallArguments,
        risk: m.Risk,
        schema: dict[str, Any] | None,
    ) -> m.Proposal:
        """Store the exact call (durably) and return the pending proposal;
        ``not_approved`` (invalidated) when the caller's profile has left the
        config since its call began; ``overloaded`` (nothing stored) when its
        profile has ``limits.max_open_proposals`` open already."""
        profile = caller.profile
        cap = None if profile is None else self._caps.get(profile)
        # The count and the row in one step per profile: else concurrent calls
        # each counted the same open proposals, and every one was stored.
        capping = (
            nullcontext()
            if profile is None or cap is None
            else self._capping.setdefault(profile, anyio.Lock())
        )
        async with capping:
            now = self._now()
            if cap is not None:
                held = await anyio.to_thread.run_sync(
                    partial(
                        self._store.count_open_proposals,
                        profile=caller.profile,
                        now=now,
                    )
                )
                if held >= cap:
                    raise UnavailableError(
                        f"profile {caller.profile!r} has {held} proposals open"
                        f" (limits.max_open_proposals = {cap}): an operator decides"
                        " some, or they expire, before it may propose more",
                        reason="overloaded",
                        data={"server": server, "retry_after_s": 60.0},
                    )
            proposal = m.Proposal(
                id="p_" + secrets.token_hex(12),
                status="pending",
                server=server,
                tool=tool,
                risk=risk,
                argument_keys=arguments.keys,
                arguments_hmac=arguments.hmac,
                schema_hash=schema_hash(schema),
                created=now,
                expires_at=now + self._ttl_s,
                caller_uid=caller.uid,
                caller_user=user_name(caller.uid),
                caller_pid=caller.pid,
                caller_profile=caller.profile,
            )
            # The arguments first, with the book's time (one write): a proposal row
            # never points at nothing. The vault's put writes its canary with the
            # first secret it ever holds.
            await anyio.to_thread.run_sync(
                self._vault.put_many,
                {
                    arguments_ref(proposal.id): msgspec.json.encode(
                        arguments.value
                    ).decode(),
                    CLOCK_REF: repr(now),
                },
            )
            try:
                await anyio.to_thread.run_sync(
                    self._store.insert_proposal, stored.proposal_row(proposal)
                )
            except StoreError:  # a full disk: no proposal, and its arguments go
                await self._drop_arguments(proposal.id)
                raise
            self._new.set()
            approval_proposed(server)
            log.info(
                "proposal %s: %s/%s by uid %d (%s)",
                proposal.id,
                server,
                tool,
                caller.uid,
                caller.profile or "operator socket",
            )
            if self._gone(caller.profile):  # a reload removed it while the call ran
                await self.invalidate(proposal, PROFILE_GONE, owe=True)
                raise not_approved(await self._reread(proposal))
            return proposal

    async def approve(
        self, caller: Caller, proposal_id: str, *, label: str | None
    ) -> m.Proposal:
        return await self._decide(
            caller,
            proposal_id,
            action="approvals/approve",
            from_status=("pending",),
            to_status="approved",
            decided_by_uid=caller.uid,
            decided_by_user=user_name(caller.uid),
            approver_label=label,
            decided_at=self._now(),
        )

    async def reject(
        self, caller: Caller, proposal_id: str, *, reason: str | None
    ) -> m.Proposal:
        return await self._decide(
            caller,
            proposal_id,
            action="approvals/reject",
            from_status=("pending",),
            to_status="rejected",
            decided_by_uid=caller.uid,
            decided_by_user=user_name(caller.uid),
            decided_at=self._now(),
            reason=reason,
        )

    async def cancel(self, caller: Caller, proposal_id: str) -> m.Proposal:
        return await self._decide(
            caller,
            proposal_id,
            action="approvals/cancel",
            from_status=("pending", "approved"),
            to_status="cancelled",
            reason=f"cancelled by uid {caller.uid}",
        )

    async def invalidate(
        self, proposal: m.Proposal, why: str, *, owe: bool = False
    ) -> None:
        """pending/approved -> invalidated (the tool changed or is gone).

        ``owe``: if a full disk refuses it, it is owed (``settle``) rather
        than raised: for a proposal whose caller was told it is proposed."""
        if owe:
            await self._invalidate_open(lambda row: row.id == proposal.id, why)
            return
        # spooled as it begins, as an operator's decision is (``_transition``)
        token = self._auditor.begin(
            self._self,
            action="approvals/invalidate",
            started=self._now(),
            **of_proposal(proposal),
        )
        try:
            done = await anyio.to_thread.run_sync(
                partial(
                    self._store.transition_proposal,
                    proposal.id,
                    from_status=("pending", "approved"),
                    to_status="invalidated",
                    now=self._now(),
                    reason=why,
                )
            )
        except BaseException:  # refused whole (a full disk): nothing changed
            self._auditor.abandon(token)
            raise
        if not done:  # it had ended already
            self._auditor.abandon(token)
            return
        approval_decided("invalidated")
        log.warning("proposal %s invalidated: %s", proposal.id, why)
        await self._audit(
            self._self, "approvals/invalidate", proposal, reason=why, settles=token
        )
        await self._finished(proposal.id)

    async def consume(self, caller: Caller, proposal: m.Proposal) -> dict[str, Any]:
        """approved -> consumed, durably, and the exact arguments to send.

        Raises ``not_approved`` unless this call made the step (so of any
        number of concurrent resumes exactly one gets the arguments).
        """
        arguments = await self.arguments(proposal)
        if (
            arguments is None
            or self._auditor.digest(arguments) != proposal.arguments_hmac
        ):
            await self.invalidate(proposal, "the stored arguments do not verify")
            raise not_approved(await self._reread(proposal))
        if not await anyio.to_thread.run_sync(
            self._store.consume_proposal, proposal.id, self._now()
        ):
            raise not_approved(await self._reread(proposal))
        approval_decided("consumed")
        await self._finished(proposal.id)
        return arguments

    async def _decide(
        self,
        caller: Caller,
        proposal_id: str,
        *,
        action: str,
        from_status: tuple[str, ...],
        to_status: str,
        **fields: object,
    ) -> m.Proposal:
        await self.settle()  # an invalidation owed first: it may end this one
        proposal = await self.get(caller, proposal_id)
        # spooled as it begins: a daemon killed after the commit below and
        # before the record leaves one all the same (``Auditor.action``)
        with self._auditor.action(
            caller,
            action=action,
            started=self._now(),
            **of_proposal(proposal),
        ) as token:
            done = await anyio.to_thread.run_sync(
                partial(
                    self._store.transition_proposal,
                    proposal_id,
                    from_status=from_status,
                    to_status=to_status,
                    now=self._now(),
                    **fields,
                )
            )
            current = await self._reread(proposal)
            if not done:
                await self._audit(
                    caller,
                    action,
                    proposal,
                    outcome="failed",
                    reason="not_approved",
                    settles=token,
                )
                raise not_approved(current, action)
            approval_decided(to_status)
            if to_status in ("rejected", "cancelled"):
                await self._finished(proposal_id)
            else:
                self._wake(proposal_id)
            await self._audit(caller, action, current, settles=token)
            return current

    async def wait(
        self, caller: Caller, proposal_id: str, timeout_s: float
    ) -> m.Proposal:
        """Return once the proposal is no longer pending, or after ``timeout_s``.
        A waiter whose client leaves stops waiting (``abandonable``): it has
        done nothing yet, and the proposal stays for the operator (the face's
        call held for approval would otherwise run, once approved, for a
        client that is gone, and use up the approval its retry needs).

        The waiter is counted in before the proposal is read: a decision that
        lands while it reads wakes it (counted in after, it slept to its
        timeout). The last waiter out takes the event away (spent or not), so
        waits on ids that never change (decided, unknown) keep nothing."""
        changed = self._changed.setdefault(proposal_id, anyio.Event())
        self._waiters[proposal_id] = self._waiters.get(proposal_id, 0) + 1
        try:
            proposal = await self.get(caller, proposal_id)
            if proposal.status != "pending":
                return proposal
            until_expiry = max(0.0, proposal.expires_at - self._now()) + 0.05
            with abandonable(), anyio.move_on_after(min(timeout_s, until_expiry)):
                await changed.wait()
            return await self.get(caller, proposal_id)
        finally:
            if left := self._waiters.pop(proposal_id) - 1:
                self._waiters[proposal_id] = left
            else:  # nobody waits on it now: no event is needed
                self._changed.pop(proposal_id, None)

    # --- expiry, schema changes, profiles and servers gone, leftovers -----------

    async def sweep(self) -> None:
        """Write down what has expired: each gets an audit record, then its
        waiters wake (so a waiter finds the record) and its arguments go."""
        now = self._now()
        expired = await anyio.to_thread.run_sync(self._store.expire_proposals, now)
        self._swept_until = max(self._swept_until, now)
        for row in expired:  # every record first, then the arguments go
            approval_decided("expired")
            await self._audit(self._self, "approvals/expire", stored.proposal(row))
        for row in expired:
            await self._finished(row.id)

    async def run(
        self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Expire proposals on time (so waiters and the audit hear of it); the
        only writer of expiries, besides the start (``_resume_time``). What a
        full disk refuses (expiries, the book's time, invalidations owed,
        arguments to drop) is tried again within ``_RETRY_S``: this task
        never ends for it."""
        try:
            await anyio.to_thread.run_sync(self._forget_leftovers, self._now())
        except StoreError as exc:  # a full disk: the next start tries again
            log.warning(
                "arguments of proposals that are over stay in the"
                " vault until there is room: %s",
                exc,
            )
        await self._resume_time()
        task_status.started()
        next_prune = 0.0
        failing = False
        while True:
            due: float | None = None
            retry = False
            try:
                await self._tidy()
                if self._now() >= next_prune:
                    await anyio.to_thread.run_sync(
                        self._store.prune_proposals, self._now() - RETENTION_S
                    )
                    next_prune = self._now() + 3600
                await self.sweep()
                await self.settle()
                due = await anyio.to_thread.run_sync(self._store.next_expiry)
                if due is not None:  # open proposals: remember how late it is
                    await anyio.to_thread.run_sync(self._persist_time, self._now())
            except StoreError as exc:  # a full disk, most likely; never fatal here
                if not failing:
                    log.warning(
                        "cannot write to the state database (%s); trying"
                        " again every %g s",
                        exc,
                        _RETRY_S,
                    )
                failing = retry = True
            else:
                if failing:
                    log.info("the state database takes writes again")
                failing = False
            pause = _SWEEP_MAX_S if due is None else due - self._now() + 0.01
            if retry or self._to_drop:
                pause = min(pause, _RETRY_S)
            self._new = anyio.Event()
            with anyio.move_on_after(min(max(pause, 0.01), _SWEEP_MAX_S)):
                await self._new.wait()

    async def profiles_in_force(
        self, names: Collection[str], *, caps: Mapping[str, int] | None = None
    ) -> None:
        """The config's profiles (at start, at each reload): every open proposal
        of a profile not among them is invalidated (``PROFILE_GONE``), and so is
        one its calls still on their way propose from now on. The operator
        socket's (no profile) are never touched. ``caps``: each profile's
        ``limits.max_open_proposals``."""
        self._profiles = frozenset(names)
        self._caps = dict(caps or {})
        await self._invalidate_open(
            lambda row: self._gone(row.caller_profile), PROFILE_GONE
        )

    async def server_removed(self, name: str) -> None:
        """A server that is no more (``servers/remove``; a reload whose config,
        and state database, no longer give it): its open proposals are
        invalidated now (``SERVER_GONE``), whoever proposed them, so none is
        left to approve, reject or count, and a server of the same name added
        later never runs them. One out of a profile's scope only is not
        removed: its proposals are checked when resumed."""
        await self._invalidate_open(lambda row: row.server == name, SERVER_GONE)

    async def servers_in_force(self, names: Collection[str]) -> None:
        """The servers the daemon starts with (config file and state database):
        every open proposal of a server not among them (removed while the
        daemon was stopped) is invalidated (``SERVER_GONE``), as
        ``server_removed`` would have done."""
        present = frozenset(names)
        await self._invalidate_open(lambda row: row.server not in present, SERVER_GONE)

    async def _invalidate_open(
        self,
        ends: Callable[[ProposalRow], bool],
        why: str,
        *,
        server: str | None = None,
    ) -> None:
        """Every open proposal (pending, approved; however many; ``server``'s
        only, if given) that ``ends`` picks, invalidated for ``why``; owed
        (``settle``) if a full disk refuses it now."""
        self._owed.append(_Owed(ends, why, self._now(), server))
        try:
            await self.settle()
        except StorageFullError as exc:
            log.warning(
                "open proposals to invalidate (%s) wait for room in"
                " the state directory: %s",
                why,
                exc,
            )

    async def settle(self) -> bool:
        """Write the invalidations owed, in order (True: some were); raises
        ``StorageFullError`` while the disk still refuses them (each is kept
        until it is done). Every decision settles first (approve, reject,
        cancel: ``_decide``; resume: ``Calls.resume``)."""
        if not self._owed:
            return False
        async with self._settling:
            while self._owed:
                owed = self._owed[0]
                rows = await anyio.to_thread.run_sync(
                    partial(
                        self._store.open_proposals, now=self._now(), server=owed.server
                    )
                )
                for row in rows:
                    if row.created <= owed.since and owed.ends(row):
                        await self.invalidate(stored.proposal(row), owed.why)
                self._owed.pop(0)
        return True

    def _gone(self, profile: str | None) -> bool:
        """A profile the config in force no longer gives."""
        return (
            profile is not None
            and self._profiles is not None
            and profile not in self._profiles
        )

    async def tools_listed(self, server: str, tools: list[m.Tool]) -> None:
        """A fresh listing (connect, tools/list_changed): a proposal whose tool
        changed its schema, or vanished, is invalidated."""
        schemas = {tool.name: schema_hash(tool.input_schema) for tool in tools}
        await self._invalidate_open(
            lambda row: schemas.get(row.tool, "") != row.schema_hash,
            "the tool's schema changed",
            server=server,
        )

    def _forget_leftovers(self, now: float) -> None:
        """Arguments of proposals that are over (or whose row never got written)."""
        for ref in self._vault.refs():
            if not ref.startswith(REF_PREFIX):
                continue
            proposal_id = ref[len(REF_PREFIX) :].split("/", 1)[0]
            found = self._store.proposal(proposal_id, now=now)
            if found is None or found.status not in ("pending", "approved"):
                self._vault.delete(ref)

    async def _tidy(self) -> None:
        """Delete the arguments a full disk kept from being deleted."""
        for proposal_id in list(self._to_drop):
            await anyio.to_thread.run_sync(
                self._vault.delete, arguments_ref(proposal_id)
            )
            self._to_drop.discard(proposal_id)

    async def _finished(self, proposal_id: str) -> None:
        """The proposal can never run: wake its waiters, drop its arguments."""
        self._wake(proposal_id)
        await self._drop_arguments(proposal_id)

    async def _drop_arguments(self, proposal_id: str) -> None:
        """Best effort: what cannot be deleted now (a full disk) is by ``run``."""
        try:
            await anyio.to_thread.run_sync(
                self._vault.delete, arguments_ref(proposal_id)
            )
        except (VaultError, StoreError) as exc:
            log.warning(
                "proposal %s: could not delete its arguments (deleted later): %s",
                proposal_id,
                exc,
            )
            self._to_drop.add(proposal_id)
            self._new.set()  # run deletes them

    def _wake(self, proposal_id: str) -> None:
        event = self._changed.pop(proposal_id, None)
        if event is not None:
            event.set()

    async def _reread(self, proposal: m.Proposal) -> m.Proposal:
        found = await self._read(proposal.id)
        return found if found is not None else proposal

    async def _audit(
        self,
        caller: Caller,
        action: str,
        proposal: m.Proposal,
        *,
        outcome: str = "ok",
        reason: str | None = None,
        settles: str | None = None,
    ) -> None:
        self._auditor.record(
            caller,
            action=action,
            started=self._now(),
            outcome=outcome,
            reason=reason,
            **of_proposal(proposal),
            settles=settles,
        )


__all__ = [
    "MAX_WAIT_S",
    "PROFILE_GONE",
    "SERVER_GONE",
    "ApprovalBook",
    "approval_required",
    "arguments_ref",
    "not_approved",
    "not_found",
    "schema_hash",
    "user_name",
]
