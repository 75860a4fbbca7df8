"""The one edge between the state database's rows and the wire structs.

``store.py`` keeps rows of its own types (``ServerRow``, ``AuditRow``,
``ProposalRow``) and imports nothing from ``memorizz``: a change to the wire
contract cannot change the schema by accident. This module converts, in one
place, for the modules that use the store (the broker's ``servers/add`` and
``audit/list``, the start-up's run-time servers, the approval book).

A server's spec is stored as the JSON document it was given, with the version
of its format (``SPEC_VERSION``); it is decoded into the wire's ``ServerSpec``
here, and a version this daemon does not know is a ``StoreError``, not a
guess. A wire field added or renamed shows up in tests/daemon/test_store_rows.py,
which round-trips every field: storing it is then a decision (a row field, a
migration), never a side effect.

A write the full file system of the state directory refused
(``StorageFullError``) is told to callers here too, in one way
(``storage_full``): the two fronts (``rpc.dispatch``, the MCP face) answer
with it.
"""

from __future__ import annotations

import hashlib
from typing import Final

import msgspec

from memorizz.api import methods as m
from memorizz.api.errors import UnavailableError
from memorizzd.store import AuditRow, ProposalRow, ServerRow, Store, StoreError

SPEC_VERSION: Final = 1
"""The format of a stored spec: the wire's ``ServerSpec`` as JSON."""

_spec_encoder: Final = msgspec.json.Encoder()
_spec_decoder: Final = msgspec.json.Decoder(m.ServerSpec)


# --- a full disk -------------------------------------------------------------


STORAGE_FULL: Final = "storage_full"


def storage_full() -> UnavailableError:
    """What a caller is told of a request whose write the full file system of
    the state directory refused (``StorageFullError``): nothing was changed
    (the store takes a refused write back whole, and each step after one that
    was made is finished later), and it may be sent again once there is room.
    The store's own words go to the daemon's log, not to the caller."""
    return UnavailableError(
        "memorizzd's state directory is full: nothing was changed; free space on"
        " its file system, then try again",
        reason=STORAGE_FULL,
    )


# --- servers ----------------------------------------------------------------


def fingerprint(spec: m.ServerSpec) -> str:
    """Of how the server is reached: a changed command or URL forgets the
    negotiated protocol version (``Store.negotiated``)."""
    identity = msgspec.json.encode([spec.transport, spec.command, spec.args, spec.url])
    return hashlib.sha256(identity).hexdigest()[:32]


def add_server(store: Store, spec: m.ServerSpec) -> bool:
    """Keep ``spec`` (durably); False when the name is taken."""
    return store.add_server(
        spec.name, _spec_encoder.encode(spec), spec_version=SPEC_VERSION
    )


def server_spec(row: ServerRow) -> m.ServerSpec:
    if row.spec_version != SPEC_VERSION:
        raise StoreError(
            f"state database: server {row.name!r} was stored in spec format"
            f" {row.spec_version}, which this memorizzd cannot read"
        )
    try:
        return _spec_decoder.decode(row.spec)
    except msgspec.DecodeError as exc:
        raise StoreError(
            f"state database: the stored spec of server {row.name!r} does not"
            f" decode: {exc}"
        ) from None


def servers(store: Store) -> list[m.ServerSpec]:
    """The servers added at run time, by name."""
    return [server_spec(row) for row in store.servers()]


# --- the audit trail (memorizzd.audit writes AuditRow itself) ----------------


def audit_record(row: AuditRow) -> m.AuditRecord:
    return msgspec.convert(row, m.AuditRecord, from_attributes=True)


def list_audit(
    store: Store,
    *,
    server: str | None,
    tool: str | None,
    outcome: str | None,
    since: float | None,
    before_id: int | None,
    limit: int,
) -> list[m.AuditRecord]:
    """Newest first, filtered (``Store.list_audit``)."""
    rows = store.list_audit(
        server=server,
        tool=tool,
        outcome=outcome,
        since=since,
        before_id=before_id,
        limit=limit,
    )
    return [audit_record(row) for row in rows]


# --- approval proposals -----------------------------------------------------


def proposal_row(p: m.Proposal) -> ProposalRow:
    """What is stored of a proposal (its argument values live in the vault)."""
    return ProposalRow(
        id=p.id,
        status=p.status,
        server=p.server,
        tool=p.tool,
        risk=p.risk,
        argument_keys=p.argument_keys,
        arguments_hmac=p.arguments_hmac,
        schema_hash=p.schema_hash,
        created=p.created,
        expires_at=p.expires_at,
        caller_uid=p.caller_uid,
        caller_user=p.caller_user,
        caller_pid=p.caller_pid,
        caller_profile=p.caller_profile,
        decided_by_uid=p.decided_by_uid,
        decided_by_user=p.decided_by_user,
        approver_label=p.approver_label,
        decided_at=p.decided_at,
        reason=p.reason,
        consumed_at=p.consumed_at,
    )


def proposal(row: ProposalRow) -> m.Proposal:
    """The wire's proposal (the status and risk checked against its literals)."""
    return msgspec.convert(row, m.Proposal, from_attributes=True)


__all__ = [
    "SPEC_VERSION",
    "STORAGE_FULL",
    "add_server",
    "audit_record",
    "fingerprint",
    "list_audit",
    "proposal",
    "proposal_row",
    "server_spec",
    "servers",
    "storage_full",
]
