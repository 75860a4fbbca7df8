"""The state database has row types of its own, not the wire structs.

``memorizzd.store`` imports nothing from ``memorizz`` (so a change to the wire
contract cannot change the schema), and ``memorizzd.stored`` converts between
its rows and the wire structs in one place. Every wire field round-trips
through a real database here: a wire field added without a decision about
storing it (a row field, a migration) fails these tests instead of slipping
into, or out of, the schema.
"""

from __future__ import annotations

import ast
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from memorizz.api.methods import AuditRecord, Proposal
from memorizzd import stored
from memorizzd.store import (
    _MIGRATIONS,
    SCHEMA_VERSION,
    AuditRow,
    ProposalRow,
    Store,
    StoreError,
)
from tests.harness import http_spec, stdio_spec

STORE = Path(__file__).resolve().parents[2] / "daemon" / "memorizzd" / "store.py"

_LOADED_AFTER_IMPORTING_THE_STORE = (
    "import sys, memorizzd.store;"
    " print(sorted(m for m in sys.modules if m.partition('.')[0] == 'memorizz'))"
)
NOT_STORED: dict[type[msgspec.Struct], frozenset[str]] = {
    Proposal: frozenset({"arguments"}),  # the values live in the vault
    AuditRecord: frozenset(),
}


def _names(kind: type[msgspec.Struct]) -> set[str]:
    return {field.name for field in msgspec.structs.fields(kind)}


def _defaults_left(value: msgspec.Struct) -> set[str]:
    """The fields of ``value`` that hold their default: not exercised."""
    return {
        field.name
        for field in msgspec.structs.fields(value)
        if field.default is not msgspec.NODEFAULT
        and getattr(value, field.name) == field.default
    }


def _full_proposal() -> Proposal:
    return Proposal(
        id="p_full",
        status="approved",
        server="srv",
        tool="record",
        risk="destructive",
        argument_keys=["a", "b"],
        arguments_hmac="ab" * 32,
        schema_hash="cd" * 32,
        created=1000.5,
        expires_at=9e9,
        caller_uid=1001,
        caller_user="agent",
        caller_pid=4242,
        caller_profile="alpha",
        decided_by_uid=0,
        decided_by_user="root",
        approver_label="on call",
        decided_at=1001.25,
        reason="looks fine",
        consumed_at=1002.75,
    )


def _full_audit_row() -> AuditRow:
    return AuditRow(
        id=0,
        time=1000.5,
        action="tools/call",
        caller_socket="/run/memorizzd/agents/alpha/api.sock",
        caller_uid=1001,
        caller_gid=1002,
        caller_pid=4242,
        server="srv",
        tool="record",
        risk="write",
        decision="ask",
        outcome="ok",
        reason="approval_required",
        duration_ms=1.5,
        argument_keys=["a", "b"],
        arguments_hmac="ef" * 32,
        result_bytes=123,
        proposal_id="p_full",
        caller_profile="alpha",
    )


def test_the_store_imports_nothing_from_the_wire_contract() -> None:
    """Neither directly (the AST) nor through what it imports (a fresh
    interpreter's modules after ``import memorizzd.store``)."""
    imported: set[str] = set()
    for node in ast.walk(ast.parse(STORE.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
    assert not {name for name in imported if name.partition(".")[0] == "memorizz"}
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            _LOADED_AFTER_IMPORTING_THE_STORE,
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert loaded.stdout.strip() == "[]"


@pytest.mark.parametrize("wire", [Proposal, AuditRecord])
def test_every_wire_field_has_a_row_field_of_the_same_name(
    wire: type[msgspec.Struct],
) -> None:
    """A field added to (or renamed in) the wire struct fails here: whether it
    is stored is a decision, with a row field and a migration."""
    row = {Proposal: ProposalRow, AuditRecord: AuditRow}[wire]
    assert _names(wire) - NOT_STORED[wire] == _names(row)


def test_a_proposal_round_trips_through_the_database(base_dir: str) -> None:
    full = _full_proposal()
    assert _defaults_left(full) <= NOT_STORED[Proposal]
    store = Store(os.path.join(base_dir, "state"))
    try:
        store.insert_proposal(stored.proposal_row(full))
        row = store.proposal(full.id, now=0.0)
        assert row is not None
        assert stored.proposal(row) == full
        [listed] = store.proposals(now=0.0, status="approved")
        assert stored.proposal(listed) == full
    finally:
        store.close()


def test_an_audit_record_round_trips_through_the_database(base_dir: str) -> None:
    row = _full_audit_row()
    store = Store(os.path.join(base_dir, "state"))
    try:
        row.id = store.last_audit_id() + 1  # the auditor gives the ids
        store.append_audit([row])
        store.append_audit([row])  # a spool replayed: recognised by its id
        assert store.last_audit_id() == 1
        [read] = store.list_audit(
            server="srv", tool=None, outcome=None, since=None, before_id=None, limit=5
        )
    finally:
        store.close()
    record = stored.audit_record(read)
    assert _defaults_left(record) == set()
    assert msgspec.structs.asdict(record) == msgspec.structs.asdict(row)


def test_a_server_spec_is_kept_as_its_json_document_with_its_version(
    base_dir: str,
) -> None:
    """Whatever fields the wire's ServerSpec has, the store keeps the document
    it was given (a new ServerSpec field is no migration) and its version."""
    specs = [
        stdio_spec("a", env={"K": "v"}, timeout_s=7.0),
        http_spec("b", "http://127.0.0.1:1/mcp", "streamable_http"),
    ]
    store = Store(os.path.join(base_dir, "state"))
    try:
        for spec in specs:
            assert stored.add_server(store, spec)
        rows = store.servers()
        assert [row.spec_version for row in rows] == [stored.SPEC_VERSION] * 2
        assert [msgspec.json.decode(row.spec) for row in rows] == [
            msgspec.to_builtins(spec) for spec in specs
        ]
        assert stored.servers(store) == specs
    finally:
        store.close()


def test_a_spec_this_daemon_cannot_read_is_a_store_error(base_dir: str) -> None:
    store = Store(os.path.join(base_dir, "state"))
    try:
        assert store.add_server("future", b'{"name": "future"}', spec_version=2)
        with pytest.raises(StoreError, match="spec format 2, which this memorizzd"):
            stored.servers(store)
        store.remove_server("future")
        assert store.add_server("broken", b'{"name": 1}', spec_version=1)
        with pytest.raises(StoreError, match="'broken' does not decode"):
            stored.servers(store)
    finally:
        store.close()


def test_a_database_of_schema_5_is_upgraded_and_reads_the_same(
    base_dir: str,
) -> None:
    """A database as the previous memorizzd wrote it (schema 5: servers with
    their ServerSpec JSON and no version, an audit record, a proposal)."""
    state = os.path.join(base_dir, "state")
    os.makedirs(state, mode=0o700)
    path = os.path.join(state, "state.db")
    spec = stdio_spec("kept", env={"GREETING": "hi"})
    full = _full_proposal()
    db = sqlite3.connect(path, isolation_level=None)
    for i, migration in enumerate(_MIGRATIONS[:5]):
        db.executescript(f"BEGIN; {migration} PRAGMA user_version={i + 1}; COMMIT;")
    db.execute(
        "INSERT INTO servers (name, spec, created) VALUES (?, ?, ?)",
        ("kept", msgspec.json.encode(spec), 1.0),
    )
    db.execute(
        "INSERT INTO audit (time, action, caller_socket, caller_uid, caller_gid,"
        " caller_pid, outcome, duration_ms, argument_keys)"
        " VALUES (5.0, 'servers/add', '/s', 1, 2, 3, 'ok', 0.5, '[]')"
    )
    columns = [name for name in _names(Proposal) if name != "arguments"]
    values = msgspec.structs.asdict(full)
    values["argument_keys"] = msgspec.json.encode(full.argument_keys).decode()
    db.execute(
        f"INSERT INTO proposals ({', '.join(columns)})"  # noqa: S608 - test columns
        f" VALUES ({', '.join('?' for _ in columns)})",
        [values[name] for name in columns],
    )
    db.close()
    assert SCHEMA_VERSION == 6

    store = Store(state)
    try:
        assert stored.servers(store) == [spec]
        assert [row.spec_version for row in store.servers()] == [1]
        [record] = stored.list_audit(
            store,
            server=None,
            tool=None,
            outcome=None,
            since=None,
            before_id=None,
            limit=5,
        )
        assert (record.id, record.action, record.server) == (1, "servers/add", None)
        row = store.proposal(full.id, now=0.0)
        assert row is not None
        assert stored.proposal(row) == full
    finally:
        store.close()
    check = sqlite3.connect(path)
    assert check.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
    check.close()
