"""memorizzctl's task commands (issue 11): ``mcp call --task [--ttl MS]`` prints
the task at once, and ``mcp task get|result|cancel|list`` follow it up, each
its own connection, as a script would run them.

Behind a real daemon, tests/node/task_server.mjs (the official TypeScript SDK's
tasks API): ``report`` (task-required), ``sum`` (task-optional), ``hold``
(runs until cancelled). The commands run on an agent profile's socket.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest

from memorizz import cli
from memorizzd.config import Profile
from memorizzd.listeners import agent_socket_path
from tests.harness import DaemonHarness, daemon_config, short_tempdir, task_spec


@pytest.fixture(scope="module")
def harness() -> Iterator[DaemonHarness]:
    config = daemon_config(
        short_tempdir(),
        servers=[task_spec()],
        profiles=[Profile(name="bot", servers=["tasks"], uids=[os.getuid()])],
    )
    with DaemonHarness.running(config) as harness:
        harness.wait_ready("tasks")
        yield harness


Ctl = Any


@pytest.fixture
def ctl(harness: DaemonHarness, capsys: pytest.CaptureFixture[str]) -> Ctl:
    """Run memorizzctl on the agent socket: (status, stdout, stderr)."""
    path = agent_socket_path(harness.config, "bot")

    def run(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        status = cli.main(["--socket", path, *argv])
        out, err = capsys.readouterr()
        return status, out, err

    return run


def _created(out: str) -> str:
    task_id, status = out.split()
    assert task_id.startswith("t_")
    assert status == "working"
    return task_id


def test_a_task_call_prints_the_task_and_its_result_comes_later(ctl: Ctl) -> None:
    status, out, err = ctl(
        "mcp", "call", "tasks", "report", "--arguments", '{"topic": "otters"}',
        "--task", "--ttl", "60000",
    )  # fmt: skip
    assert (status, err) == (0, "")
    task_id = _created(out)

    assert ctl("mcp", "task", "result", task_id)[:2] == (0, "report: otters\n")
    assert ctl("mcp", "task", "get", task_id) == (0, f"{task_id} completed\n", "")

    status, out, _ = ctl("mcp", "task", "list")
    assert status == 0
    assert out.splitlines()[0].split() == ["ID", "STATUS", "TOOL", "CREATED", "TTL_MS"]
    (row,) = [line.split() for line in out.splitlines() if line.startswith(task_id)]
    assert row[1:3] == ["completed", "tasks/report"]
    assert row[4] == "60000"


def test_json_shows_the_task_structs(ctl: Ctl) -> None:
    status, out, _ = ctl(
        "--json", "mcp", "call", "tasks", "sum", "--arguments", '{"a": 4, "b": 5}',
        "--task",
    )  # fmt: skip
    assert status == 0
    task = msgspec.json.decode(out)
    assert task["status"] == "working"
    assert task["_meta"] == {"memorizz/server": "tasks", "memorizz/tool": "sum"}

    status, out, _ = ctl("mcp", "task", "result", task["taskId"], "--json")
    assert status == 0
    result = msgspec.json.decode(out)
    assert result["content"] == [{"type": "text", "text": "9"}]
    assert result["_meta"]["io.modelcontextprotocol/related-task"] == {
        "taskId": task["taskId"]
    }

    status, out, _ = ctl("mcp", "task", "get", task["taskId"], "--json")
    assert (status, msgspec.json.decode(out)["status"]) == (0, "completed")
    status, out, _ = ctl("mcp", "task", "list", "--json")
    assert status == 0
    assert task["taskId"] in {t["taskId"] for t in msgspec.json.decode(out)["tasks"]}


def test_a_task_is_cancelled_and_a_wait_for_it_can_run_out(ctl: Ctl) -> None:
    status, out, _ = ctl("mcp", "call", "tasks", "hold", "--task")
    assert status == 0
    task_id = _created(out)
    # a wait that runs out: exit 75 (worth retrying), the task runs on
    status, out, err = ctl("mcp", "task", "result", task_id, "--timeout", "0.2")
    assert (status, out) == (75, "")
    assert err.startswith("memorizzctl: error: ")
    assert ctl("mcp", "task", "get", task_id)[:2] == (0, f"{task_id} working\n")

    # the server's status message follows the status
    status, out, _ = ctl("mcp", "task", "cancel", task_id)
    assert status == 0
    assert out.startswith(f"{task_id} cancelled: ")
    assert ctl("mcp", "task", "get", task_id)[1].startswith(f"{task_id} cancelled")


def test_unknown_tasks_and_bad_lines_are_errors(ctl: Ctl) -> None:
    status, out, err = ctl("mcp", "task", "get", "t_nosuch")
    assert (status, out) == (1, "")
    assert err.startswith("memorizzctl: error: ")
    assert err.endswith("(invalid_params)\n")

    status, out, err = ctl("mcp", "call", "tasks", "sum", "--ttl", "5")
    assert (status, out) == (2, "")
    assert err.splitlines()[-1] == "memorizzctl: error: --ttl goes with --task"
    status, _, err = ctl("mcp", "task", "result")
    assert status == 2
    assert "the following arguments are required: ID" in err
