"""The audit trail: one append-only record per tool call and per operator action.

A record holds who (socket, uid, gid, pid), what (server, tool, risk,
decision), how it ended (outcome, reason, duration, result size) and which
argument keys were passed, with an HMAC-SHA-256 of the canonical JSON of the
arguments under a dedicated audit key, never their values: equal arguments
give equal digests (so calls can be correlated) but a low-entropy value cannot
be recovered by hashing guesses without the key.

A record is safe before the reply is sent: appended to the spool
(``memorizzd.spool``, one ``write``), it survives the daemon being killed, and
it reaches the state database in a batch within ``FLUSH_AFTER_S`` (at once
when ``FLUSH_AT`` wait, before the trail is read, and when the daemon stops;
a spool left by a killed daemon is replayed at start). Records are mirrored
to the journal with structured fields when running under systemd.

A full disk: a record that cannot be spooled is logged (the action has
happened); spooled records the database cannot take stay in the spool and
move in once there is room, at start too (the daemon starts, and new records
follow them, with the ids after theirs).
"""

from __future__ import annotations

import contextlib
import hmac
import itertools
import logging
import secrets
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final, NamedTuple, cast

import anyio
import msgspec
from anyio.abc import TaskStatus

from memorizz.api import methods as m
from memorizz.api.errors import InvalidParamsError, RemoteError
from memorizzd.caller import Caller
from memorizzd.loop import call_later
from memorizzd.redact import OURS_ONLY
from memorizzd.spool import Intent, Spool
from memorizzd.state_dir import create_private_file, fsync_dir
from memorizzd.store import AuditRow, StorageFullError, Store, StoreError

log = logging.getLogger("memorizzd.audit")

KEY_FILE: Final = "audit.key"
KEY_BYTES: Final = 32
CHECKPOINT_INTERVAL_S: Final = 30.0
FLUSH_AFTER_S: Final = 1.0
"""A spooled record reaches the database within this long (a reader of the
trail never waits for it: the spool is moved in first). Each move has a cost
of its own, paid cold: at every 0.1 s it was about 8% of the daemon's CPU per
warm call (an A/B of two daemons, both orders)."""
FLUSH_AT: Final = 2048
"""... or at once when this many wait (about 1 MB of spool)."""
RETRY_FLUSH_S: Final = 1.0

_canonical: Final = msgspec.json.Encoder(order="sorted")

_OUTCOME_BY_REASON: Final = {
    "tool_blocked": "denied",
    "approval_required": "approval_required",
    "timeout": "timeout",
    "result_too_large": "result_too_large",
}


class CallArguments(msgspec.Struct, frozen=True):
    """A call's arguments, read once: the bytes relayed upstream, the decoded
    copy policy and approvals keep, and what the audit records of them."""

    raw: bytes
    """A JSON object, as the caller sent it."""
    value: dict[str, Any]
    keys: list[str]
    """Sorted."""
    hmac: str
    """``Auditor.digest`` of ``value``."""


REFUSALS: Final = frozenset(
    {"permission_denied", "method_not_found", "unknown_server", "tool_blocked"}
)
"""Reasons that say "not for you": recorded as ``denied``, within a budget per caller."""
REFUSALS_PER_S: Final = 2.0
REFUSAL_BURST: Final = 60
_REFUSAL_BUCKETS_MAX: Final = 4096
_NAME_MAX: Final = 128


def outcome_for(reason: str) -> str:
    """The audit outcome of a call that raised an error with ``reason``."""
    if reason in REFUSALS:
        return "denied"
    return _OUTCOME_BY_REASON.get(reason, "failed")


class RefusalBudget:
    """How many refusals of one caller (socket, uid) are recorded: a token bucket.

    A caller that floods refused requests gets ``REFUSAL_BURST`` records, then
    ``REFUSALS_PER_S``; the rest are counted, and the count is logged with the
    next one recorded, so a flood cannot fill the disk and is still seen."""

    def __init__(
        self,
        *,
        per_s: float = REFUSALS_PER_S,
        burst: int = REFUSAL_BURST,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._per_s, self._burst, self._clock = per_s, burst, clock
        self._buckets: dict[tuple[str, int], tuple[float, float, int]] = {}

    def take(self, caller: Caller) -> int | None:
        """None when over budget; else how many were left unrecorded before this one."""
        key = (caller.socket, caller.uid)
        now = self._clock()
        tokens, last, missed = self._buckets.get(key, (float(self._burst), now, 0))
        tokens = min(float(self._burst), tokens + (now - last) * self._per_s)
        if tokens < 1.0:
            self._buckets[key] = (tokens, now, missed + 1)
            return None
        if len(self._buckets) >= _REFUSAL_BUCKETS_MAX and key not in self._buckets:
            self._buckets.clear()  # a bound, not a policy: forget old callers
        self._buckets[key] = (tokens - 1.0, now, 0)
        return missed


def load_key(state_dir: str) -> bytes:
    """The audit key: 32 random bytes in ``<state_dir>/audit.key`` (0600), made once."""
    path = Path(state_dir) / KEY_FILE
    if not path.exists():
        _create_key(path)
    key = path.read_bytes()
    if len(key) != KEY_BYTES:
        raise ValueError(f"{path} is damaged ({len(key)} bytes, expected {KEY_BYTES})")
    return key


def _create_key(path: Path) -> None:
    """A new key file, whole or not at all (``create_private_file``): a
    daemon killed while it wrote one in place left it empty, and every later
    start stopped at it."""
    if not create_private_file(str(path), secrets.token_bytes(KEY_BYTES)):
        return  # another start made it first
    fsync_dir(str(path.parent))
    log.warning(
        "created a new audit key at %s; back it up with the state database", path
    )


def of_proposal(proposal: m.Proposal) -> dict[str, Any]:
    """What a record of a step of ``proposal`` names: its server, tool, risk,
    the policy's decision (``ask``) and its id."""
    return {
        "server": proposal.server,
        "tool": proposal.tool,
        "risk": proposal.risk,
        "decision": "ask",
        "proposal_id": proposal.id,
    }


def interruption(exc: BaseException) -> str:
    """The reason of an action ``interrupted`` by ``exc`` (not a ``RemoteError``)."""
    if isinstance(exc, anyio.get_cancelled_exc_class()):
        return "cancelled"
    return "internal_error"


def _row(
    caller: Caller,
    action: str,
    started: float,
    outcome: str,
    *,
    reason: str | None = None,
    server: str | None = None,
    tool: str | None = None,
    risk: m.Risk | None = None,
    decision: m.Decision | None = None,
    duration_ms: float = 0.0,
    arguments: CallArguments | None = None,
    result_bytes: int | None = None,
    proposal_id: str | None = None,
) -> AuditRow:
    """A record of ``caller``'s ``action`` (its id is given when it is written)."""
    return AuditRow(
        id=0,
        time=started,
        action=action,
        caller_socket=caller.socket,
        caller_uid=caller.uid,
        caller_gid=caller.gid,
        caller_pid=caller.pid,
        server=server,
        tool=tool,
        risk=risk,
        decision=decision,
        outcome=outcome,
        reason=reason,
        duration_ms=duration_ms,
        argument_keys=arguments.keys if arguments is not None else [],
        arguments_hmac=arguments.hmac if arguments is not None else None,
        result_bytes=result_bytes,
        proposal_id=proposal_id,
        caller_profile=caller.profile,
    )


class _Begun(NamedTuple):
    caller: Caller
    intent: Intent
    spooled: bool
    """Its intent is in the spool (written, and kept when the spool is emptied)."""


class Auditor:
    """Writes the audit trail: each record safe before the reply is sent.

    With a ``Spool`` (the daemon), a record costs one ``write`` to the spool;
    records move into the database in batches, one transaction each, on the
    loop (a WAL append without an fsync: see store.py). Without one (tests of
    other parts), each record is written to the database at once. Record ids
    are given here, in order, so a spooled record has its final id.
    """

    def __init__(
        self,
        store: Store,
        key: bytes,
        *,
        mirror_to_journal: bool,
        spool: Spool | None = None,
    ) -> None:
        self._store = store
        self._keyed = hmac.new(key, digestmod="sha256")
        """Keyed once: each digest copies it (the one-shot ``hmac.digest`` looks
        the hash up again every time, ~1.5 us more)."""
        self._mirror = mirror_to_journal
        self._spool = spool
        self._pending: list[AuditRow] = []
        """Spooled, not yet in the database."""
        self._open: dict[str, _Begun] = {}
        """Actions begun (``begin``) and not yet recorded, by token."""
        self._tokens_prefix = secrets.token_hex(4) + "-"
        self._tokens = itertools.count()
        """An intent's token: this daemon's prefix and a count (unique in a
        spool, which a start empties; no ``getrandom`` per write call)."""
        self._flush_timer: Callable[[], None] | None = None
        self._next_id = 0
        """The next record's id (0: not read from the store yet)."""
        self._refusals = RefusalBudget()
        self._flush_failing = False
        """The last move into the database failed (said once, not per retry)."""

    def recover(self) -> int:
        """Move what a stopped daemon left in the spool into the database
        (records already there are recognised by their id); how many. On a
        full disk they stay spooled, and move in with the next batch."""
        if self._spool is None:
            return 0
        left, unsettled = self._spool.contents()
        if unsettled:
            # actions a stopped daemon began and never recorded (operator
            # actions, calls that may change something): each gets its record
            # now, "interrupted" (it may or may not have taken effect)
            next_id = 1 + max(
                self._store.last_audit_id(), 0, *(record.id for record in left)
            )
            for number, intent in enumerate(unsettled):
                record = msgspec.structs.replace(intent.record, id=next_id + number)
                # spooled, settling its intent: a start killed before the
                # spool is emptied finds it there with its id, not again
                with contextlib.suppress(OSError):  # a full disk: it is in left
                    self._spool.append(record, settles=intent.token)
                left.append(record)
            log.warning(
                "%d actions were under way when the daemon stopped;"
                " audited as interrupted: %s",
                len(unsettled),
                ", ".join(_summary(intent.record) for intent in unsettled),
            )
        if left:
            try:
                self._store.append_audit(left)
            except StorageFullError as exc:
                self._pending = left
                self._next_id = 1 + max(
                    self._store.last_audit_id(), *(record.id for record in left)
                )
                self._flush_failing = True
                log.warning(
                    "%d audit records left in %s by a daemon that stopped stay"
                    " there until the database has room: %s",
                    len(left),
                    self._spool.path,
                    exc,
                )
                return 0
            log.warning(
                "moved %d audit records from %s into the database (the daemon"
                " stopped before it had)",
                len(left),
                self._spool.path,
            )
        self._spool.clear()
        return len(left)

    def digest(self, arguments: dict[str, Any]) -> str:
        """HMAC-SHA-256 (hex) of the canonical JSON (sorted keys) of the arguments."""
        keyed = self._keyed.copy()
        keyed.update(_canonical.encode(arguments))
        return keyed.hexdigest()

    def call_arguments(
        self, raw: bytes, value: dict[str, Any] | None = None
    ) -> CallArguments:
        """Read a call's arguments once (``value``: already decoded from ``raw``)."""
        if value is None:
            value = _decode_arguments(raw)
        return CallArguments(raw, value, sorted(value), self.digest(value))

    def record(
        self,
        caller: Caller,
        *,
        action: str,
        started: float,
        outcome: str,
        reason: str | None = None,
        server: str | None = None,
        tool: str | None = None,
        risk: m.Risk | None = None,
        decision: m.Decision | None = None,
        arguments: CallArguments | None = None,
        result_bytes: int | None = None,
        proposal_id: str | None = None,
        refusal: bool | None = None,
        settles: str | None = None,
    ) -> None:
        """Write one record; it is safe when this returns (spooled, or in the
        database). ``started`` is the ``time.time()`` the action began;
        ``settles``: the token ``begin`` gave the action this record ends.

        A record that cannot be written (a full disk) is logged as an error and
        the daemon keeps serving: the action it describes has already happened.

        A refusal (``refusal``; by default, ``reason`` in ``REFUSALS``) is also
        logged, and both happen only within the caller's ``RefusalBudget``.
        """
        begun = None if settles is None else self._open.pop(settles, None)
        spooled = None if begun is None or not begun.spooled else begun.intent
        if refusal if refusal is not None else reason in REFUSALS:
            missed = self._refusals.take(caller)
            if missed is None:
                if spooled is not None:  # not recorded: not interrupted either
                    self._settle(spooled)
                return
            # names an agent made up: bounded, as they reach the log and the trail
            server = None if server is None else server[:_NAME_MAX]
            tool = None if tool is None else tool[:_NAME_MAX]
            _log_refusal(caller, action, reason or "-", server, tool, missed)
        record = _row(
            caller,
            action,
            started,
            outcome,
            reason=reason,
            server=server,
            tool=tool,
            risk=risk,
            decision=decision,
            duration_ms=round((time.time() - started) * 1000, 3),
            arguments=arguments,
            result_bytes=result_bytes,
            proposal_id=proposal_id,
        )
        try:
            record.id = self._new_id()
            if self._spool is None:
                self._store.append_audit([record])
            else:
                self._spool.append(
                    record, settles=None if spooled is None else spooled.token
                )
        except (StoreError, OSError) as exc:
            log.error("could not write an audit record (%s): %s", exc, _summary(record))
            return
        if self._mirror:
            self._mirror_record(record)
        if self._spool is None:
            return
        self._pending.append(record)
        if len(self._pending) >= FLUSH_AT:
            self.flush()
        elif self._flush_timer is None:
            self._flush_timer = call_later(FLUSH_AFTER_S, self._flush_due)

    def begin(
        self,
        caller: Caller,
        *,
        action: str,
        started: float,
        server: str | None = None,
        tool: str | None = None,
        risk: m.Risk | None = None,
        decision: m.Decision | None = None,
        arguments: CallArguments | None = None,
        proposal_id: str | None = None,
    ) -> str:
        """An action begins (an operator's, or a call that may change
        something upstream): spooled now, so that a daemon killed after it
        took effect and before its record was written leaves a record all the
        same (the next start writes it, ``interrupted``). The token goes to
        the ``record`` that ends the action (``settles``), or to ``end``. A
        start that cannot be spooled (a full disk) is logged and the action
        goes on."""
        intent = Intent(
            token=f"{self._tokens_prefix}{next(self._tokens)}",
            record=_row(
                caller,
                action,
                started,
                "interrupted",
                server=server,
                tool=tool,
                risk=risk,
                decision=decision,
                arguments=arguments,
                proposal_id=proposal_id,
            ),
        )
        spooled = False
        if self._spool is not None:
            try:
                self._spool.begin(intent)
                spooled = True
            except OSError as exc:
                log.error("could not spool the start of %s: %s", action, exc)
        self._open[intent.token] = _Begun(caller, intent, spooled)
        return intent.token

    def end(self, token: str, *, outcome: str, reason: str | None = None) -> None:
        """Record the action ``begin`` gave ``token``, with the fields it
        began with, unless a ``record`` that settles it was written already."""
        begun = self._open.get(token)
        if begun is None:
            return
        r = begun.intent.record
        self.record(
            begun.caller,
            action=r.action,
            started=r.time,
            outcome=outcome,
            reason=reason,
            server=r.server,
            tool=r.tool,
            risk=cast("m.Risk | None", r.risk),
            decision=cast("m.Decision | None", r.decision),
            proposal_id=r.proposal_id,
            settles=token,
        )

    def abandon(self, token: str) -> None:
        """The action ``begin`` gave ``token`` did not happen (nothing was
        changed, and it leaves no record): its intent is settled."""
        begun = self._open.pop(token, None)
        if begun is not None and begun.spooled:
            self._settle(begun.intent)

    @contextlib.contextmanager
    def action(
        self, caller: Caller, *, action: str, started: float, **fields: Any
    ) -> Iterator[str]:
        """``begin`` ... ``end`` around an operator action: ``ok`` when the
        block ends; ``failed`` with the reason of a ``RemoteError``; else
        ``interrupted`` (reason ``cancelled``, or ``internal_error``: it may
        or may not have taken effect). A record the block writes itself
        (``record(settles=token)``) stands instead."""
        token = self.begin(caller, action=action, started=started, **fields)
        try:
            yield token
        except RemoteError as exc:
            self.end(token, outcome="failed", reason=exc.reason)
            raise
        except BaseException as exc:
            self.end(token, outcome="interrupted", reason=interruption(exc))
            raise
        self.end(token, outcome="ok")

    def _settle(self, intent: Intent) -> None:
        """An intent whose action leaves no record (refused over budget, or
        abandoned: it did not happen)."""
        assert self._spool is not None  # noqa: S101 - begin gave a token
        try:
            self._spool.settle(intent.token)
        except OSError as exc:
            log.warning(
                "could not settle the start of %s: %s", intent.record.action, exc
            )

    def _new_id(self) -> int:
        if not self._next_id:
            self._next_id = self._store.last_audit_id() + 1
        self._next_id += 1
        return self._next_id - 1

    def _flush_due(self) -> None:
        self._flush_timer = None
        self.flush()

    def flush(self) -> None:
        """Move the spooled records into the database now (one transaction).
        If that fails they stay spooled and are tried again."""
        if self._flush_timer is not None:
            self._flush_timer()  # cancels it
            self._flush_timer = None
        batch, self._pending = self._pending, []
        if not batch or self._spool is None:
            return
        try:
            self._store.append_audit(batch)
        except StoreError as exc:
            if not self._flush_failing:  # once, not at every retry
                log.warning(
                    "could not move %d audit records into the database (%s); they"
                    " stay in %s and are tried again",
                    len(batch),
                    exc,
                    self._spool.path,
                )
            self._flush_failing = True
            self._pending = batch + self._pending
            self._flush_timer = call_later(RETRY_FLUSH_S, self._flush_due)
            return
        if self._flush_failing:
            log.info("moved %d waiting audit records into the database", len(batch))
            self._flush_failing = False
        try:
            self._spool.clear(
                keep=[begun.intent for begun in self._open.values() if begun.spooled]
            )
        except OSError as exc:  # harmless: a replay skips what is in the database
            log.warning("could not empty %s: %s", self._spool.path, exc)

    async def run(
        self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Now and then, fold the WAL back into the database from a worker
        thread; when stopped, move whatever is spooled into the database."""
        task_status.started()
        try:
            while True:
                await anyio.sleep(CHECKPOINT_INTERVAL_S)
                self.flush()
                await self._checkpoint()
        finally:
            self.flush()

    async def _checkpoint(self) -> None:
        try:
            await anyio.to_thread.run_sync(self._store.checkpoint)
        except StoreError as exc:
            log.warning("audit checkpoint failed: %s", exc)

    def _mirror_record(self, record: AuditRow) -> None:
        """The record as a journal entry with structured fields."""
        log.info(
            "audit: %s",
            _summary(record),
            extra={
                "MEMORIZZ_AUDIT_ID": record.id,
                "MEMORIZZ_ACTION": record.action,
                "MEMORIZZ_SERVER": record.server or "",
                "MEMORIZZ_TOOL": record.tool or "",
                "MEMORIZZ_OUTCOME": record.outcome,
                "MEMORIZZ_REASON": record.reason or "",
                "MEMORIZZ_CALLER_UID": record.caller_uid,
                "MEMORIZZ_CALLER_PID": record.caller_pid,
                "MEMORIZZ_PROFILE": record.caller_profile or "operator",
                "MEMORIZZ_PROPOSAL": record.proposal_id or "",
                OURS_ONLY: True,  # names, reasons, ids: no server's words
            },
        )


def _summary(record: AuditRow) -> str:
    target = f"{record.server}/{record.tool}" if record.tool else (record.server or "-")
    if record.proposal_id:
        target += f" [{record.proposal_id}]"
    return (
        f"#{record.id} {record.action} {target} {record.outcome}"
        + (f" ({record.reason})" if record.reason else "")
        + f" uid={record.caller_uid} pid={record.caller_pid} {record.duration_ms:g} ms"
    )


def _log_refusal(
    caller: Caller,
    action: str,
    reason: str,
    server: str | None,
    tool: str | None,
    missed: int,
) -> None:
    target = (f" {server}" + (f"/{tool}" if tool else "")) if server else ""
    log.warning(
        "refused %s%s for uid %d pid %d on %s: %s%s",
        action,
        target,
        caller.uid,
        caller.pid,
        caller.socket,
        reason,
        f" ({missed} more refusals of this caller not recorded: rate limit)"
        if missed
        else "",
    )


_decode_object: Final = msgspec.json.Decoder(dict[str, Any]).decode


def _decode_arguments(raw: bytes) -> dict[str, Any]:
    """A call's arguments: a JSON object nested at most ``MAX_ARGUMENT_DEPTH`` deep."""
    try:
        value = _decode_object(raw)
    except msgspec.ValidationError as exc:  # not an object; a number out of range
        said = (
            "arguments must be an object"
            if raw.lstrip()[:1] != b"{"
            else f"arguments: {exc}".replace("`$", "`$.arguments")
        )
        raise InvalidParamsError(f"invalid params: {said}") from None
    except RecursionError:  # msgspec's own nesting limit (about 1000 levels)
        raise InvalidParamsError(
            f"invalid params: arguments nested deeper than {m.MAX_ARGUMENT_DEPTH}"
            " levels"
        ) from None
    except msgspec.DecodeError as exc:  # invalid UTF-8 in a string, and the like
        raise InvalidParamsError(
            f"invalid params: arguments are not valid JSON ({exc})"
        ) from None
    if raw.count(b"{") + raw.count(b"[") <= m.MAX_ARGUMENT_DEPTH:
        return value  # so few brackets (strings' too) cannot nest deeper
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > m.MAX_ARGUMENT_DEPTH:
            raise InvalidParamsError(
                f"invalid params: arguments nested deeper than {m.MAX_ARGUMENT_DEPTH}"
                " levels"
            )
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return value
