"""Tasks (MCP 2025-11-25) through the socket API (issue 11, item 6).

Behind the daemon, tests/node/task_server.mjs: a server on the official
TypeScript SDK's experimental tasks API, over stdio and over Streamable HTTP,
with a task-required tool (``report``), a task-optional one (``sum``), one
that runs until cancelled (``hold``) and ``states`` (the tasks it holds, by
its own ids). The caller is
``memorizz.Client`` on the profiles' agent sockets and the operator socket.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest

from memorizz import Client
from memorizz.api import methods as m
from memorizz.api.errors import InvalidParamsError, MethodNotFoundError
from memorizzd.config import Profile
from memorizzd.listeners import agent_socket_path
from tests.harness import (
    DaemonHarness,
    daemon_config,
    short_tempdir,
    stdio_spec,
    task_server,
)


@pytest.fixture(scope="module", params=["stdio", "streamable_http"])
def harness(request: pytest.FixtureRequest) -> Iterator[DaemonHarness]:
    """The task server over stdio (our JSON-RPC client), or over Streamable
    HTTP (the SDK's client, whose 2.3 release has no tasks API: the daemon
    sends ``tasks/*`` through its session as raw requests)."""
    with task_server(request.param) as spec, _running(spec) as running:
        yield running


@contextlib.contextmanager
def _running(spec: m.ServerSpec) -> Iterator[DaemonHarness]:
    base = short_tempdir()
    uid = os.getuid()
    config = daemon_config(
        base,
        servers=[spec],
        profiles=[
            Profile(name="bot", servers=["tasks"], uids=[uid]),
            Profile(name="other", servers=["tasks"], uids=[uid]),
        ],
    )
    with DaemonHarness.running(config) as harness:
        harness.wait_ready("tasks")
        yield harness


def agent(harness: DaemonHarness, profile: str) -> Client:
    return Client(agent_socket_path(harness.config, profile))


def states(c: Client) -> list[dict[str, Any]]:
    """The server's own view of its tasks (its ids, not the daemon's)."""
    text = c.call_tool("tasks", "states").content[0]["text"]
    found: list[dict[str, Any]] = msgspec.json.decode(text)
    return found


def test_the_listing_shows_each_tools_task_support(harness: DaemonHarness) -> None:
    with agent(harness, "bot") as c:
        support = {
            t.name: (t.execution or {}).get("taskSupport")
            for t in c.list_tools("tasks")
        }
    assert support["report"] == "required"
    assert support["sum"] == "optional"


def test_a_task_required_tool_runs_as_a_task_and_its_result_comes_later(
    harness: DaemonHarness,
) -> None:
    with agent(harness, "bot") as c:
        task = c.call_tool_task("tasks", "report", {"topic": "otters"}, ttl_ms=60000)
        assert task.task_id.startswith("t_")
        assert task.status == "working"
        assert task.meta == {"memorizz/server": "tasks", "memorizz/tool": "report"}
        seen: list[m.Task] = []
        result = c.task_result(task.task_id, on_status=seen.append)
        assert result.content == [{"type": "text", "text": "report: otters"}]
        assert result.meta is not None
        assert result.meta["io.modelcontextprotocol/related-task"] == {
            "taskId": task.task_id
        }
        done = c.get_task(task.task_id)
        assert (done.task_id, done.status) == (task.task_id, "completed")
        assert task.task_id in {t.task_id for t in c.list_tasks()}
        # the server's status notifications reached this connection, its id
        # ours; over one stdio pipe before the result, over Streamable HTTP
        # on another stream than the result's, in no order with it
        if harness.config.servers[0].transport == "stdio":
            assert seen
        assert all(s.task_id == task.task_id for s in seen)


def test_a_task_optional_tool_runs_either_way(harness: DaemonHarness) -> None:
    with agent(harness, "bot") as c:
        plain = c.call_tool("tasks", "sum", {"a": 2, "b": 3})
        assert plain.content[0]["text"] == "5"
        task = c.call_tool_task("tasks", "sum", {"a": 4, "b": 5})
        assert c.task_result(task.task_id).content[0]["text"] == "9"


def test_a_required_tool_called_without_a_task_gets_the_servers_answer(
    harness: DaemonHarness,
) -> None:
    with agent(harness, "bot") as c:
        result = c.call_tool("tasks", "report", {"topic": "x"})
    assert result.is_error  # the server's own answer, passed through
    assert "-32601" in result.content[0]["text"]


def test_another_profile_or_the_operator_cannot_use_the_task(
    harness: DaemonHarness,
) -> None:
    with agent(harness, "bot") as bot:
        task = bot.call_tool_task("tasks", "hold")
        for other in (agent(harness, "other"), harness.client()):
            with other:
                with pytest.raises(InvalidParamsError):
                    other.get_task(task.task_id)
                with pytest.raises(InvalidParamsError):
                    other.cancel_task(task.task_id)
                with pytest.raises(InvalidParamsError):
                    other.task_result(task.task_id, timeout_s=1)
                assert task.task_id not in {t.task_id for t in other.list_tasks()}
        assert bot.get_task(task.task_id).status == "working"
        bot.cancel_task(task.task_id)


def test_a_cancelled_task_is_cancelled_upstream_and_audited(
    harness: DaemonHarness,
) -> None:
    with agent(harness, "bot") as c:
        before = {s["taskId"] for s in states(c)}
        task = c.call_tool_task("tasks", "hold")
        (made,) = [s for s in states(c) if s["taskId"] not in before]
        assert made["status"] == "working"
        cancelled = c.cancel_task(task.task_id)
        assert (cancelled.task_id, cancelled.status) == (task.task_id, "cancelled")
        # the server's own task, by its own id, is cancelled
        assert {s["taskId"]: s["status"] for s in states(c)}[made["taskId"]] == (
            "cancelled"
        )
        assert made["taskId"] != task.task_id  # the server's id never shows
    with harness.client() as op:  # written before the reply was sent
        records = op.audit(server="tasks", tool="hold", limit=10).records
    outcomes = {(r.action, r.outcome, r.caller_profile) for r in records}
    assert ("tools/call", "task_created", "bot") in outcomes
    assert ("tasks/cancel", "ok", "bot") in outcomes


def test_a_server_that_takes_no_tasks_refuses_a_task_call(
    harness: DaemonHarness,
) -> None:
    harness.add(stdio_spec("plain"))
    with harness.client() as c, pytest.raises(MethodNotFoundError):
        c.call_tool_task("plain", "echo", {"text": "x"})
