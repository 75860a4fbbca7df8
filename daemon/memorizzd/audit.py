"""The audit trail: one append-only record per tool call and per operator action.

A record holds who (socket, uid, gid, pid), what (server, tool, risk,
decision), how it ended (outcome, reason, duration, result size) and which
argument keys were passed, with an HMAC-SHA-256 of the canonical JSON of the
arguments under a dedicated audit key, never their values: equal arguments
give equal digests (so calls can be correlated) but a low-entropy value cannot
be recovered by hashing guesses without the key.

Records are written to the state database before the reply is sent (an
append is a short synchronous write; see store.py), and mirrored to the journal
with structured fields when running under systemd.
"""

from __future__ import annotations

import hmac
import logging
import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import anyio
import msgspec
from anyio.abc import TaskStatus

from memorizz.api import methods as m
from memorizz.api.errors import InvalidParamsError
from memorizzd.caller import Caller
from memorizzd.loop import Signal, call_soon
from memorizzd.store import AuditRow, Store, StoreError

log = logging.getLogger("memorizzd.audit")

KEY_FILE: Final = "audit.key"
KEY_BYTES: Final = 32
CHECKPOINT_INTERVAL_S: Final = 30.0

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
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        key = path.read_bytes()
        if len(key) != KEY_BYTES:
            raise ValueError(
                f"{path} is damaged ({len(key)} bytes, expected {KEY_BYTES})"
            ) from None
        return key
    key = secrets.token_bytes(KEY_BYTES)
    with os.fdopen(fd, "wb") as f:
        f.write(key)
        f.flush()
        os.fsync(f.fileno())
    log.warning(
        "created a new audit key at %s; back it up with the state database", path
    )
    return key


class Auditor:
    """Commits records before the reply is sent, cheaply in both regimes.

    A lone call (``busy=False``, nothing else queued) writes its record right
    here. Under load records are queued, and once the tasks that are ready
    have run, one transaction commits them all (group commit), on the loop:
    an append is a WAL write without an fsync (see store.py), ~10-20 us a
    record in a batch, cheaper than a trip to a worker thread and back. The
    checkpoint that folds the WAL back (it does fsync) runs in a thread.
    Either way ``record`` returns only once its record is committed.
    """

    def __init__(self, store: Store, key: bytes, *, mirror_to_journal: bool) -> None:
        self._store = store
        self._key = key
        self._mirror = mirror_to_journal
        self._pending: list[AuditRow] = []
        self._waiting: list[Signal] = []
        self._running = False
        self._refusals = RefusalBudget()

    def digest(self, arguments: dict[str, Any]) -> str:
        """HMAC-SHA-256 (hex) of the canonical JSON (sorted keys) of the arguments."""
        return hmac.digest(self._key, _canonical.encode(arguments), "sha256").hex()

    def call_arguments(
        self, raw: bytes, value: dict[str, Any] | None = None
    ) -> CallArguments:
        """Read a call's arguments once (``value``: already decoded from ``raw``)."""
        if value is None:
            value = _decode_arguments(raw)
        return CallArguments(raw, value, sorted(value), self.digest(value))

    async def record(
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
        busy: bool = False,
        proposal_id: str | None = None,
        refusal: bool | None = None,
    ) -> None:
        """Write one record and return once it is committed. ``started`` is the
        ``time.time()`` the action began; ``busy`` says other calls are running.

        A record that cannot be written (a full disk) is logged as an error and
        the daemon keeps serving: the action it describes has already happened.

        A refusal (``refusal``; by default, ``reason`` in ``REFUSALS``) is also
        logged, and both happen only within the caller's ``RefusalBudget``.
        """
        if refusal if refusal is not None else reason in REFUSALS:
            missed = self._refusals.take(caller)
            if missed is None:
                return
            # names an agent made up: bounded, as they reach the log and the trail
            server = None if server is None else server[:_NAME_MAX]
            tool = None if tool is None else tool[:_NAME_MAX]
            _log_refusal(caller, action, reason or "-", server, tool, missed)
        now = time.time()
        record = AuditRow(
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
            duration_ms=round((now - started) * 1000, 3),
            argument_keys=arguments.keys if arguments is not None else [],
            arguments_hmac=arguments.hmac if arguments is not None else None,
            result_bytes=result_bytes,
            proposal_id=proposal_id,
            caller_profile=caller.profile,
        )
        if not self._running or not (busy or self._pending):
            self._write([record])  # a lone call, or shutting down
            return
        if not self._pending:
            call_soon(self._commit_pending)
        self._pending.append(record)
        committed = Signal()
        self._waiting.append(committed)
        # cancelled while waiting: the record is committed all the same
        await committed.wait()

    async def run(
        self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """While it runs, records are batched; now and then it folds the WAL
        back into the database, from a worker thread."""
        self._running = True
        task_status.started()
        try:
            while True:
                await anyio.sleep(CHECKPOINT_INTERVAL_S)
                await self._checkpoint()
        finally:
            self._running = False
            self._commit_pending()  # anyone still queued: nothing is left behind

    def _commit_pending(self) -> None:
        batch, self._pending = self._pending, []
        waiting, self._waiting = self._waiting, []
        if batch:
            self._write(batch)
        for committed in waiting:
            committed.set()

    def _write(self, batch: list[AuditRow]) -> None:
        try:
            self._store.append_audit(batch)
        except StoreError as exc:
            for lost in batch:
                log.error(
                    "could not write an audit record (%s): %s", exc, _summary(lost)
                )
            return
        if self._mirror:
            for written in batch:
                self._mirror_record(written)

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
                "MEMORIZZ_CALLER_PROFILE": record.caller_profile or "",
                "MEMORIZZ_PROPOSAL_ID": record.proposal_id or "",
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
    except msgspec.ValidationError:
        raise InvalidParamsError(
            "invalid params: arguments must be an object"
        ) from None
    except msgspec.DecodeError:  # msgspec's own nesting limit, among others
        raise InvalidParamsError(
            f"invalid params: arguments nested deeper than {m.MAX_ARGUMENT_DEPTH}"
            " levels"
        ) from None
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
