"""Tasks (MCP 2025-11-25) through the MCP face (issue 11, item 6), used by the
official TypeScript SDK client (the Python SDK 2.3 client has no tasks API).

tests/node/face_tasks_client.mjs starts the real bridge (``memorizzctl
--socket API_SOCKET mcp serve``) and, with the SDK's experimental tasks API,
runs a task-required and a task-optional tool of tests/node/task_server.mjs
as tasks, then starts one that runs until cancelled and cancels it, with the
task server behind the daemon over stdio and over Streamable HTTP. The daemon
shows its own task ids, and the server's status notifications reach the
session that created the task.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import pytest

from memorizzd.config import Profile
from memorizzd.listeners import agent_socket_path
from tests.harness import (
    NODE_DIR,
    DaemonHarness,
    daemon_config,
    node_client,
    short_tempdir,
    task_server,
)
from tests.process import MEMORIZZCTL

CLIENT = str(NODE_DIR / "face_tasks_client.mjs")
RUN_TIMEOUT_S = 60.0
"""A bound on a hung client only, far above its usual run (about a second)."""


@pytest.fixture(scope="module", params=["stdio", "streamable_http"])
def transport(request: pytest.FixtureRequest) -> str:
    """How the daemon reaches the task server."""
    return str(request.param)


@pytest.fixture(scope="module")
def faced(transport: str) -> Iterator[DaemonHarness]:
    with contextlib.ExitStack() as stack:
        spec = stack.enter_context(task_server(transport))
        config = daemon_config(
            short_tempdir(),
            servers=[spec],
            profiles=[Profile(name="bot", servers=["tasks"], uids=[os.getuid()])],
        )
        harness = stack.enter_context(DaemonHarness.running(config))
        harness.wait_ready("tasks")
        yield harness


def run_client(socket: str) -> dict[str, Any]:
    plan = {"memorizzctl": MEMORIZZCTL, "socket": socket}
    return node_client(CLIENT, plan, timeout=RUN_TIMEOUT_S)


def test_the_typescript_client_runs_tools_as_tasks_through_the_face(
    faced: DaemonHarness, transport: str
) -> None:
    seen = run_client(agent_socket_path(faced.config, "bot"))
    assert seen["tasksCapability"] == {
        "list": {},
        "cancel": {},
        "requests": {"tools": {"call": {}}},
    }
    assert seen["taskSupport"]["report"] == "required"
    assert seen["taskSupport"]["sum"] == "optional"
    report, total = seen["report"], seen["sum"]
    assert report["text"] == ["report: otters"], report
    assert report["created"].startswith("t_")
    assert report["statuses"][-1] == "completed"
    assert total["text"] == ["5"], total
    assert (seen["cancelled"], seen["afterCancel"]) == ("cancelled", "cancelled")
    created = {report["created"], total["created"], seen["hold"]}
    assert created <= set(seen["listed"])
    # the server's notifications/tasks/status reached this session, our ids in
    # them (over HTTP too: heard through the SDK's notification bindings)
    assert {s["taskId"] for s in seen["statuses"]} <= created
    assert any(s["status"] == "completed" for s in seen["statuses"])


def test_the_audit_record_says_the_call_created_a_task(faced: DaemonHarness) -> None:
    run_client(agent_socket_path(faced.config, "bot"))
    with faced.client() as c:
        records = c.audit(server="tasks", tool="report", limit=5).records
    face = [r for r in records if r.caller_socket.endswith("mcp.sock")]
    assert face
    assert face[0].outcome == "task_created"
    assert face[0].caller_profile == "bot"
