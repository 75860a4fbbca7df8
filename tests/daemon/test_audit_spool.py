"""The audit spool: a record is safe once written there, reaches the state
database in batches, and a spool left by a killed daemon is moved in at the
next start, each record once."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

from memorizz.api.errors import (
    DaemonUnreachableError,
    InvalidParamsError,
    RemoteError,
)
from memorizz.api.methods import ServerSpec
from memorizzd.audit import FLUSH_AT, Auditor
from memorizzd.caller import Caller
from memorizzd.spool import Spool
from memorizzd.store import Store
from tests.harness import LEGACY_SERVER, daemon_process, stdio_spec
from tests.process import DaemonProcess, wait_until

CALLER = Caller(pid=1, uid=2, gid=3, socket="/s", role="operator")


@pytest.fixture
def kept(base_dir: str) -> Iterator[tuple[Store, Spool]]:
    """A state database and its audit spool, closed at the end."""
    state = os.path.join(base_dir, "state")
    store = Store(state)
    spool = Spool(state)
    try:
        yield store, spool
    finally:
        spool.close()
        store.close()


def _auditor(store: Store, spool: Spool) -> Auditor:
    return Auditor(store, b"k" * 32, mirror_to_journal=False, spool=spool)


def _trail(store: Store) -> list[tuple[int, str]]:
    rows = store.list_audit(
        server=None, tool=None, outcome=None, since=None, before_id=None, limit=100
    )
    return [(row.id, row.action) for row in reversed(rows)]


async def _record(auditor: Auditor, *actions: str) -> None:
    for action in actions:
        auditor.record(CALLER, action=action, started=time.time(), outcome="ok")


def test_records_are_spooled_then_moved_in_one_batch(kept: tuple[Store, Spool]) -> None:
    store, spool = kept
    auditor = _auditor(store, spool)

    async def main() -> None:
        await _record(auditor, "a", "b")
        assert _trail(store) == []  # safe in the spool, not yet moved
        assert len(spool.read()) == 2
        auditor.flush()

    anyio.run(main)
    assert _trail(store) == [(1, "a"), (2, "b")]
    assert spool.read() == []


def test_a_spool_left_behind_is_moved_in_once_at_start(
    kept: tuple[Store, Spool],
) -> None:
    """A daemon killed before the batch (records only in the spool), or after
    the batch but before the spool was emptied (records in both): the next
    start moves each record in exactly once, and new ids follow on."""
    store, spool = kept
    first = _auditor(store, spool)

    async def killed_after_a_batch() -> None:
        await _record(first, "a", "b")
        store.append_audit(spool.read())  # the batch, not the emptying
        await _record(first, "c")  # and one more, only spooled

    anyio.run(killed_after_a_batch)
    assert _trail(store) == [(1, "a"), (2, "b")]
    with open(spool.path, "ab") as f:
        f.write(b'{"id": 4, "time": 1.0, "act')  # cut short by the crash

    second = _auditor(store, spool)
    assert second.recover() == 3
    assert _trail(store) == [(1, "a"), (2, "b"), (3, "c")]
    assert spool.read() == []
    anyio.run(_record, second, "d")
    second.flush()
    assert _trail(store)[-1] == (4, "d")


def test_a_record_survives_sigkill_right_after_the_reply(base_dir: str) -> None:
    """The call is answered only once its record is in the spool: SIGKILL at
    once, and the restarted daemon's trail has it."""
    with daemon_process(base_dir) as d:
        with d.client() as c:
            c.add_server(stdio_spec("t"))
        assert d.proc is not None
        os.kill(d.proc.pid, signal.SIGKILL)
        d.proc.wait(10)
    spooled = Path(base_dir, "state", "audit.spool").read_bytes()
    with daemon_process(base_dir) as d, d.client() as c:
        actions = [(r.action, r.server) for r in c.audit().records]
    assert actions.count(("servers/add", "t")) == 1
    if spooled:  # killed before the batch: the start moved it in
        assert "audit records from" in d.log()


@pytest.mark.parametrize("records", [1, FLUSH_AT + 88])
def test_many_records_are_moved_without_waiting_for_the_timer(
    kept: tuple[Store, Spool], records: int
) -> None:
    store, spool = kept
    auditor = _auditor(store, spool)
    anyio.run(_record, auditor, *(["x"] * records))
    # the FLUSH_AT-th record moved all that waited; the timer, the rest
    assert store.last_audit_id() == (0 if records == 1 else FLUSH_AT)


# --- operator actions: spooled as they begin ---------------------------------------


def _outcomes(store: Store) -> list[tuple[int, str, str | None, str]]:
    rows = store.list_audit(
        server=None, tool=None, outcome=None, since=None, before_id=None, limit=100
    )
    return [(r.id, r.action, r.server, r.outcome) for r in reversed(rows)]


def test_an_action_begun_and_never_recorded_is_recorded_interrupted_at_start(
    kept: tuple[Store, Spool],
) -> None:
    """A daemon killed while an operator action ran (its change committed,
    its record not yet written): the intent spooled as it began outlives the
    batches moved meanwhile, and the next start records it ``interrupted``,
    once, after the records it found; an action recorded settles its intent."""
    store, spool = kept
    first = _auditor(store, spool)

    async def killed_during_a_removal() -> None:
        done = first.begin(CALLER, action="servers/add", started=1.0, server="a")
        first.record(
            CALLER,
            action="servers/add",
            started=1.0,
            server="a",
            outcome="ok",
            settles=done,
        )
        first.begin(CALLER, action="servers/remove", started=2.0, server="b")
        await _record(first, "x")
        first.flush()  # a batch moved while the removal runs
        await _record(first, "y")

    anyio.run(killed_during_a_removal)
    assert _outcomes(store) == [(1, "servers/add", "a", "ok"), (2, "x", None, "ok")]
    assert [i.record.action for i in spool.contents()[1]] == ["servers/remove"]

    second = _auditor(store, spool)
    assert second.recover() == 2
    assert _outcomes(store) == [
        (1, "servers/add", "a", "ok"),
        (2, "x", None, "ok"),
        (3, "y", None, "ok"),
        (4, "servers/remove", "b", "interrupted"),
    ]
    assert spool.contents() == ([], [])
    third = _auditor(store, spool)
    assert third.recover() == 0
    assert len(_outcomes(store)) == 4


def test_a_removal_killed_after_its_commit_leaves_an_interrupted_record(
    base_dir: str,
) -> None:
    """``servers/remove`` of a server that ignores SIGTERM: its row is gone at
    once, then the daemon waits for the server (about 4 s) before it writes
    the record. SIGKILL in that wait: the restarted daemon has no such server,
    and its trail says the removal was interrupted."""
    with daemon_process(base_dir) as d:
        with d.client() as c:
            c.add_server(
                ServerSpec(
                    name="stubborn",
                    transport="stdio",
                    command=sys.executable,
                    args=[LEGACY_SERVER],
                    env={"IGNORE_TERM": "1"},
                )
            )
            d.wait_ready("stubborn")
        removing = threading.Thread(target=_remove_quietly, args=(d, "stubborn"))
        removing.start()
        wait_until(  # its row is gone: the daemon is stopping it
            lambda: "stubborn: stdin closed; staying up" in d.log(),
            timeout=10,
            what="the removal's wait for the server",
        )
        assert d.proc is not None
        os.kill(d.proc.pid, signal.SIGKILL)
        d.proc.wait(10)
        removing.join(10)
    with daemon_process(base_dir) as d, d.client() as c:
        assert [s.name for s in c.server_status()] == []
        trail = [(r.action, r.server, r.outcome) for r in reversed(c.audit().records)]
    assert trail == [
        ("servers/add", "stubborn", "ok"),
        ("servers/remove", "stubborn", "interrupted"),
    ]
    assert "actions were under way when the daemon stopped" in d.log()


def _remove_quietly(d: DaemonProcess, name: str) -> None:
    with contextlib.suppress(RemoteError, DaemonUnreachableError), d.client() as c:
        c.remove_server(name)


def test_an_operator_action_is_recorded_once_however_it_ends(
    kept: tuple[Store, Spool],
) -> None:
    """``Auditor.action``: ok, failed with the error's reason, interrupted
    (cancelled, or an internal error), or the record the action wrote itself;
    one record each; an action abandoned has none; nothing is left open in
    the spool, so a start records nothing more."""
    store, spool = kept
    auditor = _auditor(store, spool)

    async def main() -> None:
        with auditor.action(CALLER, action="a", started=1.0, server="s"):
            await anyio.lowlevel.checkpoint()
        with (
            pytest.raises(InvalidParamsError),
            auditor.action(CALLER, action="b", started=1.0),
        ):
            raise InvalidParamsError("no")
        with (
            pytest.raises(ZeroDivisionError),
            auditor.action(CALLER, action="c", started=1.0),
        ):
            raise ZeroDivisionError
        with (
            anyio.move_on_after(0.01),
            auditor.action(CALLER, action="d", started=1.0),
        ):
            await anyio.sleep(10)
        with auditor.action(CALLER, action="e", started=1.0) as token:
            auditor.record(
                CALLER, action="e", started=1.0, outcome="failed", settles=token
            )
        # an action that did not happen (nothing changed): no record
        auditor.abandon(auditor.begin(CALLER, action="f", started=1.0))
        auditor.flush()

    anyio.run(main)
    rows = store.list_audit(
        server=None, tool=None, outcome=None, since=None, before_id=None, limit=9
    )
    assert [(r.action, r.server, r.outcome, r.reason) for r in reversed(rows)] == [
        ("a", "s", "ok", None),
        ("b", None, "failed", "invalid_params"),
        ("c", None, "interrupted", "internal_error"),
        ("d", None, "interrupted", "cancelled"),
        ("e", None, "failed", None),
    ]
    assert spool.contents() == ([], [])
    assert _auditor(store, spool).recover() == 0


def test_a_start_killed_before_it_emptied_the_spool_records_an_interruption_once(
    kept: tuple[Store, Spool], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The start that records an interrupted action spools that record (with
    its id, settling the intent) before it moves it in: killed before it
    empties the spool (here: the emptying never happens), the next start
    finds the record and no open intent, and writes nothing twice."""
    store, spool = kept
    first = _auditor(store, spool)
    first.begin(CALLER, action="servers/remove", started=2.0, server="b")
    with monkeypatch.context() as patched:
        patched.setattr(spool, "clear", lambda keep=(): None)  # killed first
        _auditor(store, spool).recover()
    _auditor(store, spool).recover()
    assert _outcomes(store) == [(1, "servers/remove", "b", "interrupted")]
    assert spool.contents() == ([], [])
