"""A reload that removes a profile cancels its tasks upstream (MCP 2025-11-25).

The removed profile's agents can never reach their tasks again (the daemon
forgets them: ``TaskBook.profiles_in_force``), so the daemon sends each one not
known to have ended a ``tasks/cancel`` on its server's warm session, in the
background (``Calls.cancel_forgotten``), and audits it as its own (socket
``memorizzd``, reason ``profile_removed``). A profile that stays keeps its
tasks running, and so does one that only loses the server (hidden from it,
not cancelled: tests/daemon/test_authority_escalation.py gives the server
back and finds its task still working). A server that does not answer never
holds the reload up.

A real daemon started from a config file, tests/node/task_server.mjs (the
TypeScript SDK's tasks API) over stdio, the real client; the server itself
says what became of each task (its ``states`` tool, asked by the operator).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from memorizz import Client
from memorizz.api.errors import RemoteError
from memorizzd.config import load
from memorizzd.listeners import agent_socket_path
from tests.harness import (
    DaemonHarness,
    config_doc,
    config_toml,
    light_spec,
    stdio_entry,
    task_spec,
    wait_until,
)

ME = os.getuid()
PROMPT_S = 5.0
"""A reload with nothing to start answers in well under this; the daemon gives
a server's cancels twice as long (``CANCEL_FORGOTTEN_S``): a reload that waited
for them would take that long."""


def _write(path: Path, doc: dict[str, Any]) -> None:
    path.write_text(config_toml(doc), encoding="utf-8")


def _doc(base_dir: str, profiles: list[dict[str, Any]]) -> dict[str, Any]:
    return config_doc(
        base_dir,
        agents_dir=os.path.join(base_dir, "agents"),
        servers=[
            stdio_entry(task_spec("tk")),
            stdio_entry(light_spec("s1")),
        ],
        profiles=profiles,
    )


def _profile(name: str, servers: list[str]) -> dict[str, Any]:
    return {"name": name, "servers": servers, "uids": [ME]}


@pytest.fixture
def world(base_dir: str) -> Iterator[tuple[DaemonHarness, Path, dict[str, Any]]]:
    """Profiles ``gone`` (removed by the test's reload), ``stays`` and
    ``narrowed`` (which the reload takes ``tk`` from), each on ``tk``."""
    os.chmod(base_dir, 0o755)  # noqa: S103 - the agents directory lives below
    config_file = Path(base_dir, "memorizzd.toml")
    doc = _doc(
        base_dir,
        [
            _profile("gone", ["tk"]),
            _profile("stays", ["tk"]),
            _profile("narrowed", ["tk", "s1"]),
        ],
    )
    _write(config_file, doc)
    with DaemonHarness.running(load(str(config_file))) as h:
        h.wait_ready("tk")
        h.wait_ready("s1")
        yield h, config_file, doc


def _agent(h: DaemonHarness, profile: str) -> Client:
    return Client(agent_socket_path(h.config, profile))


def _states(h: DaemonHarness) -> dict[str, str]:
    """Every task the server holds, by its own id: its status, as it says."""
    with h.client() as operator:
        text = operator.call_tool("tk", "states").content[0]["text"]
    found: list[dict[str, str]] = msgspec.json.decode(text)
    return {t["taskId"]: t["status"] for t in found}


def _hold(h: DaemonHarness, profile: str) -> tuple[str, str]:
    """A task that runs until cancelled, made by ``profile``'s agent: the
    daemon's id and the server's."""
    before = set(_states(h))
    with _agent(h, profile) as agent:
        task = agent.call_tool_task("tk", "hold", {}, ttl_ms=60000)
    (upstream,) = set(_states(h)) - before
    return task.task_id, upstream


def _removing(config_file: Path, doc: dict[str, Any], profile: str) -> None:
    doc["profiles"] = [p for p in doc["profiles"] if p["name"] != profile]
    _write(config_file, doc)


def _daemon_cancels(h: DaemonHarness) -> list[tuple[str | None, str | None, str]]:
    with h.client() as operator:
        records = operator.audit(limit=1000).records
    return [
        (r.server, r.tool, r.outcome)
        for r in records
        if r.action == "tasks/cancel"
        and r.caller_socket == "memorizzd"
        and r.reason == "profile_removed"
    ]


def test_a_reload_that_removes_a_profile_cancels_its_running_tasks_upstream(
    world: tuple[DaemonHarness, Path, dict[str, Any]],
) -> None:
    h, config_file, doc = world
    _, gone = _hold(h, "gone")
    with _agent(h, "gone") as agent:  # one that ended: nothing to cancel
        report = agent.call_tool_task("tk", "report", {"topic": "x"}, ttl_ms=60000)
        agent.task_result(report.task_id)
    kept_id, kept = _hold(h, "stays")
    _, narrowed = _hold(h, "narrowed")
    doc["profiles"][2]["servers"] = ["s1"]
    _removing(config_file, doc, "gone")
    with h.client() as operator:
        result = operator.daemon_reload()
    assert result.profiles_removed == ["gone"]
    assert result.profiles_changed == ["narrowed"]

    wait_until(
        lambda: _states(h)[gone] == "cancelled",
        what="the removed profile's task cancelled upstream",
    )
    wait_until(
        lambda: _daemon_cancels(h) == [("tk", "hold", "ok")],
        what="the daemon's cancel in the audit trail",
    )
    states = _states(h)
    assert states[kept] == "working"  # a profile that stays keeps its task
    assert states[narrowed] == "working"  # hidden from its profile, not cancelled
    with _agent(h, "stays") as agent:
        assert agent.get_task(kept_id).status == "working"
    assert _daemon_cancels(h) == [("tk", "hold", "ok")]  # the ended one: none sent


def test_a_reload_does_not_wait_for_a_server_that_does_not_answer(
    world: tuple[DaemonHarness, Path, dict[str, Any]],
) -> None:
    """The server is stopped (SIGSTOP) when the reload comes: the reload
    answers at once, the cancel waits in the background; once the server runs
    again it gets the cancel."""
    h, config_file, doc = world
    _, gone = _hold(h, "gone")
    kept_id, kept = _hold(h, "stays")
    with h.client() as operator:
        (status,) = operator.server_status("tk")
    assert status.pid is not None
    _removing(config_file, doc, "gone")
    os.kill(status.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        with h.client() as operator:
            result = operator.daemon_reload()
        took = time.monotonic() - started
    finally:
        os.kill(status.pid, signal.SIGCONT)
    assert result.profiles_removed == ["gone"]
    assert took < PROMPT_S, took
    wait_until(
        lambda: _states(h)[gone] == "cancelled",
        what="the cancel delivered once the server answers again",
    )
    assert _states(h)[kept] == "working"
    with _agent(h, "stays") as agent:
        assert agent.get_task(kept_id).status == "working"


def test_a_task_made_as_its_profile_is_removed_is_cancelled_and_refused(
    world: tuple[DaemonHarness, Path, dict[str, Any]],
) -> None:
    """The reload comes while the removed profile's task-augmented call is
    still in flight (the server makes the task 1.5 s after it is asked): the
    task is made after the reload forgot that profile's tasks. It is
    cancelled upstream at once and the call refused (``permission_denied``),
    not left running for nobody."""
    h, config_file, doc = world
    before = set(_states(h))
    said: list[RemoteError] = []

    def call() -> None:
        with _agent(h, "gone") as agent:
            try:
                agent.call_tool_task("tk", "late_hold", {"ms": 1500}, ttl_ms=60000)
            except RemoteError as exc:
                said.append(exc)

    caller = threading.Thread(target=call)
    caller.start()

    def in_flight() -> bool:
        with h.client() as operator:
            return operator.server_status("tk")[0].in_flight > 0

    wait_until(in_flight, what="the call in flight")
    _removing(config_file, doc, "gone")
    with h.client() as operator:
        assert operator.daemon_reload().profiles_removed == ["gone"]
    caller.join(30)
    assert not caller.is_alive()
    assert [e.reason for e in said] == ["permission_denied"], said
    (made,) = set(_states(h)) - before
    wait_until(lambda: _states(h)[made] == "cancelled", what="the late task cancelled")
    assert _daemon_cancels(h) == [("tk", "late_hold", "ok")]
