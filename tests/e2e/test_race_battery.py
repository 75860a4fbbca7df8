"""Races: operations each correct alone, run against one real daemon from
several threads at once, and the invariants checked afterwards: every request
gets exactly one answer (a result, or an error whose ``reason`` is one of
``REASONS`` and never ``internal``); no call runs twice, nor after its
approval was withdrawn; a server added again under a removed one's name
inherits none of its proposals; what was refused changed nothing; the state
(servers, proposals, audit) agrees with the answers given, after a restart
on the same state directory too; no traceback in the daemon's log.

The light test server (tests/legacy_server.py: no SDK, starts and stops in
milliseconds) stands in for a real one; ``risk = {"hello": "destructive"}``
makes its one tool ``ask``, and with $CALL_LOG each run of it appends its
``tag`` (``tests.peers.calls``): the log counts real executions.

Races this file found (each test says how often it failed before the fix):

* concurrent calls of one profile each counted its open proposals before any
  stored its own, so all were stored past ``limits.max_open_proposals``
  (``ApprovalBook.propose`` counts and stores under a lock per profile);
* a call that chose its server, then proposed after that server was removed
  and one of the same name added, left its proposal to the new server
  (``Calls.call`` asks ``Pool.holds`` for the very server it used);
* a reload changed the servers beside ``servers/add``: an add refused
  ``server_exists`` (a reload started the file's server of that name between
  its check and its start) stayed stored and came back later, and an add
  landing between a reload's retiring a server and invalidating its
  proposals let the new server run the old one's approved call (a reload now
  holds the broker's ``changing`` lock, as servers/add and remove do);
* a call made while a server connected, which was then removed, waited for
  a session that could never come: all of ``connect_wait_s`` (5 s), in every
  round of the add/remove battery (the stopped supervisor now wakes it, and
  it is answered ``server_unavailable`` at once).

The second and third need the other operation to land in a window of a few
milliseconds (40 rounds of free-running remove+add during proposals never
hit it); their tests put it there by running it (for real, over the
socket) from inside the first one, as
tests/daemon/test_server_removal_proposals.py does.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest

from memorizz import Client
from memorizz.api import methods as m
from memorizz.api.errors import REASONS, MemorizzError, RemoteError
from memorizzd.config import Limits, Profile, load
from memorizzd.listeners import face_socket_path
from tests import proposals_world as pw
from tests.harness import (
    DaemonHarness,
    DaemonProcess,
    config_doc,
    config_toml,
    daemon_config,
    daemon_process,
    light_spec,
    stdio_entry,
    tempdir_fixture,
    wait_until,
)
from tests.peers import ME, agent_socket, calls, profiles_config
from tests.trials import all_records, face_call

CAP = 3
"""The ``alpha`` profile's ``limits.max_open_proposals``."""
DECISIONS = ("approvals/approve", "approvals/reject", "approvals/cancel")


def _ask_spec(base: str, name: str = "t", **overrides: Any) -> m.ServerSpec:
    """The light server ``name``: ``hello`` is destructive (``ask``) and logs its tag."""
    fields: dict[str, Any] = {
        "env": {"CALL_LOG": os.path.join(base, "calls.log")},
        "risk": {"hello": "destructive"},
        **overrides,
    }
    return light_spec(name, **fields)


def _answer(work: Callable[[], Any]) -> str:
    """``ok``, or the daemon's reason for refusing: one of ``REASONS``, never
    ``internal`` (a bug)."""
    refused: RemoteError | None = None
    try:
        work()
    except RemoteError as exc:
        refused = exc
    if refused is None:
        return "ok"
    assert refused.reason in REASONS, refused
    assert refused.reason != "internal", refused
    return refused.reason


def _together(*work: Callable[[], None], timeout: float = 60.0) -> None:
    """Run each of ``work`` in a thread of its own, released together; what
    one raised is raised here."""
    barrier = threading.Barrier(len(work))
    failures: list[BaseException] = []

    def run(item: Callable[[], None]) -> None:
        try:
            barrier.wait(timeout)
            item()
        except BaseException as exc:  # noqa: BLE001 - raised in the test's thread
            failures.append(exc)

    threads = [threading.Thread(target=run, args=(item,)) for item in work]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
        assert not thread.is_alive(), "a racer never came back"
    if failures:
        raise failures[0]


def _no_tracebacks(caplog: pytest.LogCaptureFixture) -> None:
    """Nothing the daemon logged came with a traceback, or says ``internal``."""
    bad = [
        r.getMessage()
        for r in caplog.records
        if r.exc_info is not None or "internal error" in r.getMessage()
    ]
    assert bad == []


# --- approvals: one profile, many of its calls and many deciders at once -----


shared = tempdir_fixture()


@pytest.fixture(scope="module")
def approvals(shared: str) -> Iterator[DaemonHarness]:
    """Server ``t`` (``_ask_spec``); profile ``alpha`` reaches it, holds at
    most ``CAP`` open proposals and has ``memorizz__resume`` on its face."""
    config = profiles_config(
        shared,
        servers=[_ask_spec(shared)],
        profiles=[
            Profile(
                name="alpha",
                servers=["t"],
                uids=[ME],
                limits=Limits(max_open_proposals=CAP),
                face_tools=["proposals", "resume"],
            )
        ],
    )
    with DaemonHarness.running(config) as harness:
        harness.wait_ready("t")
        yield harness


def _agent(base: str) -> Client:
    return Client(agent_socket(base, "alpha"))


def _open(operator: Client) -> list[m.Proposal]:
    return [
        p
        for p in operator.list_approvals(limit=1000)
        if p.status in ("pending", "approved")
    ]


def _trail(operator: Client, proposal_id: str) -> Counter[tuple[str, str]]:
    return Counter(
        (r.action, r.outcome)
        for r in operator.audit(limit=200).records
        if r.proposal_id == proposal_id
    )


def _proposing_round(shared: str, round_: int, racers: int) -> list[str]:
    """``racers`` calls of the agent's at once, each proposing: the answers."""
    answers: list[str] = []

    def propose(i: int) -> None:
        with _agent(shared) as agent:
            agent.hello()
            tag = f"cap{round_}-{i}"
            answers.append(_answer(lambda: agent.call_tool("t", "hello", {"tag": tag})))

    _together(*[partial(propose, i) for i in range(racers)])
    return answers


def test_concurrent_calls_of_one_profile_never_open_more_than_its_cap(
    approvals: DaemonHarness, shared: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Ten calls of a profile capped at 3 open proposals, at once: 3 are
    proposed, 7 refused ``overloaded``. Before the fix every round (20 of 20)
    stored all ten: the count of open proposals and the new one's row were
    two steps, and the ten calls counted the same zero."""
    racers = 10
    for round_ in range(8):
        answers = _proposing_round(shared, round_, racers)
        assert sorted(answers) == sorted(
            ["approval_required"] * CAP + ["overloaded"] * (racers - CAP)
        ), round_
        with approvals.client() as operator:
            held = _open(operator)
            assert len(held) == CAP, round_
            for proposal in held:
                operator.reject(proposal.id)
    assert not [tag for tag in calls(shared) if tag.startswith("cap")]
    _no_tracebacks(caplog)


def _decided(h: DaemonHarness, proposal_id: str, actions: list[str]) -> dict[str, str]:
    """Each of ``actions`` on the proposal, from operators of their own, at
    once: the answers, by ``index:action``."""
    decided: dict[str, str] = {}

    def decide(i: int, action: str) -> None:
        with h.client() as operator:
            operator.hello()
            work = {
                "approvals/approve": partial(operator.approve, proposal_id),
                "approvals/reject": partial(operator.reject, proposal_id),
                "approvals/cancel": partial(operator.cancel_approval, proposal_id),
            }[action]
            decided[f"{i}:{action}"] = _answer(work)

    _together(*[partial(decide, i, a) for i, a in enumerate(actions)])
    return decided


def _resumed(
    h: DaemonHarness, shared: str, proposal_id: str, *, cancel: bool
) -> dict[str, str]:
    """The agent (twice, on its socket), an operator and the agent's face
    resume the proposal (while an operator cancels it, if ``cancel``): the
    answers, by who."""
    resumed: dict[str, str] = {}
    face = face_socket_path(agent_socket(shared, "alpha"))

    def by_agent(i: int) -> None:
        with _agent(shared) as agent:
            agent.hello()
            resumed[f"agent{i}"] = _answer(partial(agent.resume, proposal_id))

    def by_operator(action: str) -> None:
        with h.client() as operator:
            operator.hello()
            work = operator.resume if action == "resume" else operator.cancel_approval
            resumed[action] = _answer(partial(work, proposal_id))

    def by_face() -> None:
        reply = face_call(face, "memorizz__resume", {"id": proposal_id})
        if "error" in reply:  # lost the consume to another resume
            reason = reply["error"]["data"]["reason"]
            assert reason in REASONS, reply
            assert reason != "internal", reply
            resumed["face"] = reason
        else:  # not approved (any more) when it looked: a result that says so
            resumed["face"] = "not_run" if reply["result"].get("isError") else "ok"

    racers = [
        partial(by_agent, 1),
        partial(by_agent, 2),
        partial(by_operator, "resume"),
        by_face,
    ]
    _together(*racers, *([partial(by_operator, "cancel")] if cancel else []))
    return resumed


def test_deciders_and_resumers_at_once_one_decision_and_at_most_one_run(
    approvals: DaemonHarness, shared: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Three operators decide one proposal at once (approve, reject, cancel):
    what succeeded is one path of the state machine (one of them, or an
    approve then a cancel, which withdraws an approved proposal too), the
    status says where it ended, and the audit has exactly those decisions.
    Then the agent (twice, on its socket), an operator and the agent's face
    (``memorizz__resume``) resume it, in every other round while an operator
    cancels it: an approved call runs exactly once (at most once beside the
    cancel, never after a cancel that won), and the audit says so."""
    rng = random.Random(7)  # noqa: S311 - the mix of decisions, not crypto
    total = 0
    for round_ in range(20):
        tag = f"decide{round_}"
        with _agent(shared) as agent:
            proposal_id = pw.propose(agent, "t", tag, tool="hello")
        actions = [rng.choice(DECISIONS) for _ in range(2)] + ["approvals/approve"]
        decided = _decided(approvals, proposal_id, actions)
        assert set(decided.values()) <= {"ok", "not_approved"}, decided
        won = sorted(k.split(":")[1] for k, answer in decided.items() if answer == "ok")
        assert won in (
            ["approvals/approve"],
            ["approvals/reject"],
            ["approvals/cancel"],
            ["approvals/approve", "approvals/cancel"],
        ), decided
        expected = {
            "approvals/approve": "approved",
            "approvals/reject": "rejected",
            "approvals/cancel": "cancelled",
        }[won[-1]]
        with approvals.client() as operator:
            trail = _trail(operator, proposal_id)
            assert sorted(a for a in DECISIONS for _ in range(trail[(a, "ok")])) == (
                won
            ), trail
            assert pw.shown(operator)[proposal_id].status == expected

        cancel = round_ % 2 == 1  # odd rounds: a cancel races the resumes
        resumed = _resumed(approvals, shared, proposal_id, cancel=cancel)
        assert len(resumed) == 4 + cancel, resumed
        ran = [w for w, answer in resumed.items() if w != "cancel" and answer == "ok"]
        runs = calls(shared).count(tag)
        assert runs == len(ran), (resumed, runs)
        assert runs <= 1, resumed
        if expected != "approved":
            assert ran == [], resumed
            assert resumed.get("cancel", "not_approved") == "not_approved", resumed
        elif cancel:  # the cancel and the resumes raced for one approval
            assert (resumed["cancel"] == "ok") == (ran == []), resumed
        else:  # nothing withdrew it: one of the four ran it
            assert runs == 1, resumed
        with approvals.client() as operator:
            trail = _trail(operator, proposal_id)
            assert trail[("approvals/resume", "ok")] == runs, trail
            assert trail[("approvals/cancel", "ok")] <= 1, trail
        total += runs
    assert total > 0, "no round got as far as a run"
    _no_tracebacks(caplog)


# --- servers/add and servers/remove of one name ------------------------------


class _Tally:
    """What the racers of one name were told, over every round."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.added = 0
        self.removed = 0
        self.answers = Counter[str]()
        self.slowest = 0.0
        """The longest a call or a listing took (seconds)."""


def _add_remove_round(h: DaemonHarness, spec: m.ServerSpec, tally: _Tally) -> None:
    """Two operators add and remove ``spec``'s name, in opposite orders, at
    once, while a third connection calls its tool and lists its tools."""
    stop = threading.Event()

    def operator(order: tuple[str, ...]) -> None:
        with h.client() as c:
            c.hello()
            for step in order:
                if step == "add":
                    got = _answer(partial(c.add_server, spec))
                    assert got in ("ok", "server_exists"), got
                else:
                    got = _answer(partial(c.remove_server, spec.name))
                    assert got in ("ok", "unknown_server"), got
                with tally.lock:
                    tally.added += step == "add" and got == "ok"
                    tally.removed += step == "remove" and got == "ok"

    def operators() -> None:
        try:
            _together(
                partial(operator, ("add", "remove", "add")),
                partial(operator, ("remove", "add", "remove")),
            )
        finally:
            stop.set()

    def caller() -> None:
        with h.client() as c:
            c.hello()
            while not stop.is_set():
                for work in (
                    partial(c.call_tool, spec.name, "hello", {"tag": "x"}),
                    partial(c.list_tools, spec.name),
                ):
                    began = time.monotonic()
                    got = _answer(work)
                    with tally.lock:
                        tally.answers[got] += 1
                        tally.slowest = max(tally.slowest, time.monotonic() - began)

    _together(operators, caller)


def test_add_and_remove_of_one_name_from_two_operators_agree_with_the_state(
    base_dir: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Two operators add and remove the same name at once while a third
    connection calls it and lists its tools: every answer is one the protocol
    names, and the adds that succeeded less the removes that did say whether
    the server is there: now, in the audit, and after a restart."""
    config = daemon_config(base_dir)
    spec = _ask_spec(base_dir, "s", risk={})
    tally = _Tally()
    with DaemonHarness.running(config) as h:
        for round_ in range(25):
            _add_remove_round(h, spec, tally)
            with h.client() as c:
                there = [s.name for s in c.list_servers()] == ["s"]
            assert tally.added - tally.removed == int(there), round_
        assert set(tally.answers) <= {"ok", "unknown_server", "server_unavailable"}
        # a call made while ``s`` connected, then removed, waited for a
        # session that never came: all of connect_wait_s (5 s), every round
        assert tally.slowest < 2.5, tally.slowest
        with h.client() as c:
            trail = Counter(
                (r.action, r.outcome)
                for r in all_records(c)
                if r.server == "s" and r.action.startswith("servers/")
            )
            assert trail[("servers/add", "ok")] == tally.added
            assert trail[("servers/remove", "ok")] == tally.removed
            present = [s.name for s in c.list_servers()]
    with DaemonHarness.running(config) as again, again.client() as c:
        assert [s.name for s in c.list_servers()] == present
    _no_tracebacks(caplog)


def test_a_call_proposing_while_its_server_is_removed_and_added_again_leaves_the_new_one_nothing(
    base_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call that chose server ``t``, then stores its proposal after ``t``
    was removed and another ``t`` added (for real, over the socket): its
    proposal is invalidated and the caller told so. Before the fix it stayed
    pending, for the new ``t``, in every run: approved and resumed, the new
    server ran a call made for the old one."""
    spec = _ask_spec(base_dir)
    with DaemonHarness.running(daemon_config(base_dir)) as h:
        h.add(spec)
        book = h.daemon.book
        propose = book.propose

        def remove_and_add() -> None:
            with Client(h.socket) as c:
                c.remove_server("t")
                c.add_server(spec)

        async def late(*args: Any, **kwargs: Any) -> m.Proposal:
            await anyio.to_thread.run_sync(remove_and_add)
            return await propose(*args, **kwargs)

        monkeypatch.setattr(book, "propose", late)
        with h.client() as operator:
            got = _answer(lambda: operator.call_tool("t", "hello", {"tag": "old"}))
            monkeypatch.undo()
            assert got == "not_approved"
            assert _open(operator) == []
            h.wait_ready("t")
            assert _answer(
                lambda: operator.call_tool("t", "hello", {"tag": "new"})
            ) == ("approval_required")
            [fresh] = _open(operator)
            operator.approve(fresh.id)
            operator.resume(fresh.id)
    assert calls(base_dir) == ["new"]


# --- reloads beside servers/add and servers/remove ---------------------------


def _bounded(
    work: Callable[[], Any], wait_s: float
) -> tuple[threading.Thread, list[str]]:
    """``work`` in a thread, waited for at most ``wait_s`` (it may be waiting
    for what called this): the thread and, once it ended, its answer."""
    out: list[str] = []
    thread = threading.Thread(target=lambda: out.append(_answer(work)))
    thread.start()
    thread.join(wait_s)
    return thread, out


def test_a_server_added_while_a_reload_drops_one_of_its_name_inherits_no_approval(
    base_dir: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The file gives up server ``x``, which has an approved proposal; an
    operator adds a server ``x`` as the reload runs (for real, over the
    socket, once the reload has retired the file's ``x``). The new ``x``
    must not run the old one's approval. Before the fix the add landed
    between the reload's retiring ``x`` and its invalidating ``x``'s
    proposals, which then found ``x`` in the pool and kept them: the resume
    ran, in every run."""
    config_file = pw.write_config(base_dir, ["x"], {})
    with DaemonHarness.running(load(config_file)) as h:
        h.wait_ready("x")
        with h.client() as operator:
            proposal_id = pw.propose(operator, "x", "old")
            operator.approve(proposal_id)
        pw.write_config(base_dir, [], {})
        reloader = h.daemon.reloader
        restore = reloader._restore_api_servers
        adds: list[tuple[threading.Thread, list[str]]] = []

        def add() -> None:
            with Client(h.socket) as c:
                c.add_server(pw.record_spec(base_dir, "x"))

        async def adding_meanwhile(*args: Any, **kwargs: Any) -> None:
            adds.append(await anyio.to_thread.run_sync(_bounded, add, 0.5))
            await restore(*args, **kwargs)

        monkeypatch.setattr(reloader, "_restore_api_servers", adding_meanwhile)
        with h.client() as operator:
            operator.daemon_reload()
            monkeypatch.undo()
            [(thread, answer)] = adds
            thread.join(20)
            assert answer == ["ok"]
            assert [(s.name, s.source) for s in operator.list_servers()] == [
                ("x", "api")
            ]
            assert _answer(lambda: operator.resume(proposal_id)) == "not_approved"
            shown = pw.shown(operator)[proposal_id]
            assert shown.status == "invalidated"
    assert calls(base_dir) == []
    _no_tracebacks(caplog)


def test_a_servers_add_refused_because_a_reload_took_the_name_stores_nothing(
    base_dir: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``servers/add x`` while a reload starts the file's new ``x`` (for
    real, over the socket, once the add has passed its check). Either the
    add wins (and, as at start, the file's ``x`` takes its place) or it is
    refused and nothing of it is stored: once the file gives ``x`` up, ``x``
    is back from the state database exactly when the add said ok. Before
    the fix the add was refused ``server_exists`` yet stayed stored, and
    came back, in every run."""
    config_file = pw.write_config(base_dir, [], {})
    with DaemonHarness.running(load(config_file)) as h:
        pw.write_config(base_dir, ["x"], {})
        from memorizzd import broker

        add_server = broker.stored.add_server
        reloads: list[tuple[threading.Thread, list[str]]] = []

        def reload() -> None:
            with Client(h.socket) as c:
                c.daemon_reload()

        def reloading_meanwhile(*args: Any, **kwargs: Any) -> bool:
            reloads.append(_bounded(reload, 0.5))
            return add_server(*args, **kwargs)

        monkeypatch.setattr(broker.stored, "add_server", reloading_meanwhile)
        with h.client() as operator:
            got = _answer(lambda: operator.add_server(pw.record_spec(base_dir, "x")))
            monkeypatch.undo()
            assert got in ("ok", "server_exists")
            [(thread, answer)] = reloads
            thread.join(20)
            assert answer == ["ok"]
            assert [(s.name, s.source) for s in operator.list_servers()] == [
                ("x", "config")
            ]
            pw.write_config(base_dir, [], {})
            operator.daemon_reload()
            back = [(s.name, s.source) for s in operator.list_servers()]
            assert back == ([("x", "api")] if got == "ok" else []), (got, back)
    _no_tracebacks(caplog)


def _toml_config(base: str, *, generation: int) -> str:
    """The file: ``stable`` always; ``flip`` in even generations (its risk
    changing with the generation's half); written atomically."""
    servers = [("stable", "destructive")]
    if generation % 2 == 0:
        servers.append(("flip", "destructive" if generation % 4 == 0 else "write"))
    entries = [
        stdio_entry(_ask_spec(base, name)) | {"risk": {"hello": risk}}
        for name, risk in servers
    ]
    path = Path(base, "memorizzd.toml")
    staged = Path(base, "memorizzd.toml.new")
    staged.write_text(config_toml(config_doc(base, servers=entries)), encoding="utf-8")
    os.replace(staged, path)
    return str(path)


def test_reloads_racing_calls_approvals_and_servers_add_keep_every_invariant(
    base_dir: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Two reloaders (the file changing under them), a caller of the server
    the file toggles, a proposer that approves and resumes on the stable
    one, and an operator adding and removing API servers, all at once for
    a while: every reload succeeds, every answer is one the protocol names,
    each approved call runs exactly once, the audit has a record of every
    reload, and the state survives a restart."""
    config_file = _toml_config(base_dir, generation=0)
    stop = threading.Event()
    reloaded = Counter[str]()
    answers = Counter[str]()
    generation = [0]
    lock = threading.Lock()
    ran: list[str] = []
    with DaemonHarness.running(load(config_file)) as h:
        h.wait_ready("stable")

        def reloader() -> None:
            with h.client() as c:
                while not stop.is_set():
                    with lock:
                        generation[0] += 1
                        _toml_config(base_dir, generation=generation[0])
                    reloaded[_answer(c.daemon_reload)] += 1

        def caller() -> None:
            with h.client() as c:
                while not stop.is_set():
                    answers[
                        _answer(lambda: c.call_tool("flip", "hello", {"tag": "f"}))
                    ] += 1
                    answers[_answer(lambda: c.list_tools("flip"))] += 1

        def proposer() -> None:
            with h.client() as c:
                k = 0
                while not stop.is_set():
                    k += 1
                    tag = f"p{k}"
                    proposal_id = pw.propose(c, "stable", tag, tool="hello")
                    c.approve(proposal_id)
                    c.resume(proposal_id)
                    ran.append(tag)

        def adder() -> None:
            with h.client() as c:
                k = 0
                while not stop.is_set():
                    k += 1
                    name = f"api{k % 3}"
                    answers[_answer(partial(c.add_server, light_spec(name)))] += 1
                    answers[_answer(partial(c.remove_server, name))] += 1

        def clock() -> None:
            stop.wait(4.0)
            stop.set()

        _together(reloader, reloader, caller, proposer, adder, clock)
        assert set(reloaded) == {"ok"}, reloaded
        assert set(answers) <= {
            "ok",
            "unknown_server",
            "server_unavailable",
            "server_exists",
            "approval_required",
            "not_approved",
        }, answers
        assert ran, "no proposal was resumed"
        runs = Counter(t for t in calls(base_dir) if t.startswith("p"))
        assert runs == Counter(ran)
        with h.client() as c:
            reloads = [r for r in all_records(c) if r.action == "daemon/reload"]
            assert len(reloads) == sum(reloaded.values())
            assert {r.outcome for r in reloads} == {"ok"}
            servers = sorted((s.name, s.source) for s in c.list_servers())
            left = _open(c)
    assert left == [] or {p.server for p in left} <= {"flip"}
    with DaemonHarness.running(load(config_file)) as again, again.client() as c:
        assert sorted((s.name, s.source) for s in c.list_servers()) == servers
    _no_tracebacks(caplog)


def _reloads_until_sigterm(d: DaemonProcess, pause_s: float) -> Counter[str]:
    """Two connections reload ``d`` over and over; ``pause_s`` after the first
    answer, SIGTERM (exit 0 asserted). What the reloads were told."""
    got = Counter[str]()
    answered = threading.Event()

    def reloads() -> None:
        try:
            with d.client() as c:
                while True:
                    got[_answer(c.daemon_reload)] += 1
                    answered.set()
        except RemoteError:
            raise
        except (MemorizzError, OSError):  # the daemon is gone
            got["gone"] += 1

    def terminate() -> None:
        assert answered.wait(20)
        threading.Event().wait(pause_s)
        assert d.stop(signal.SIGTERM) == 0

    _together(reloads, reloads, terminate)
    return got


def test_reloads_racing_a_sigterm_drain_end_cleanly(base_dir: str) -> None:
    """A real ``memorizzd``: reloads keep coming from two connections while
    SIGTERM drains it. It exits 0, each reload is answered ok or
    ``shutting_down`` (or finds the daemon gone), the log has no traceback,
    and it starts again on the same state directory with every reload it
    answered ok in the audit."""
    config_file = _toml_config(base_dir, generation=1)
    oks = 0
    for round_ in range(3):
        with daemon_process(base_dir, config=config_file) as d:
            d.wait_ready("stable")
            got = _reloads_until_sigterm(d, 0.02 * round_)
            assert set(got) <= {"ok", "shutting_down", "gone"}, got
            oks += got["ok"]
            assert "Traceback" not in d.log()
    with daemon_process(base_dir, config=config_file) as d, d.client() as c:
        wait_until(lambda: c.daemon_status().servers_total == 1)
        reloads_seen = [
            r
            for r in all_records(c)
            if r.action == "daemon/reload" and r.outcome == "ok"
        ]
        assert len(reloads_seen) >= oks
