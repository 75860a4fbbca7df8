"""A task's status notifications stop when its server leaves its creator's scope.

A component test of the real ``TaskBook``: a server's
``notifications/tasks/status`` reaches the connection that created the task,
and only while that caller still sees the server (``Broker.sees``, asked per
notification, as resource updates and list changes ask it). Before, a reload
that took a server out of a profile's scope left that profile's open
connections hearing its tasks' statuses (docs/security.md: a dropped server
is gone for its open connections at once).
"""

from __future__ import annotations

import anyio
import msgspec
import pytest

from memorizz.api.errors import InvalidParamsError
from memorizzd.caller import Caller
from memorizzd.upstream.tasks import TaskBook

AGENT = Caller(pid=2, uid=1000, gid=1000, socket="/a.sock", profile="a", role="agent")


@pytest.mark.parametrize("in_scope", [True, False])
def test_a_status_reaches_its_creator_only_while_it_sees_the_server(
    in_scope: bool,
) -> None:
    scope = {"s"}
    heard: list[bytes] = []

    async def send(line: bytes) -> None:
        heard.append(line)

    book = TaskBook(sees=lambda caller, server: server in scope)
    raw = msgspec.json.encode({"task": {"taskId": "up-1", "status": "working"}})
    entry, _ = book.created(AGENT, "s", "tool", raw, send)
    if not in_scope:
        scope.clear()  # a reload took "s" out of profile a's servers
    status = msgspec.json.encode({"taskId": "up-1", "status": "completed"})
    anyio.run(book.noticed, "s", msgspec.Raw(status))
    if in_scope:
        (line,) = heard
        sent = msgspec.json.decode(line)
        assert sent["method"] == "notifications/tasks/status"
        assert sent["params"]["taskId"] == entry.id  # the daemon's id, not the server's
    else:
        assert heard == []


def test_a_task_whose_server_left_its_creators_scope_is_unknown_to_it() -> None:
    """``tasks/get``, ``tasks/result``, ``tasks/cancel`` and ``tasks/list``
    answer as for a task that never was (``-32602`` "unknown task"; not
    listed), not ``unknown_server`` naming the server it ran on."""
    scope = {"s"}
    book = TaskBook(sees=lambda caller, server: server in scope)
    raw = msgspec.json.encode({"task": {"taskId": "up-1", "status": "working"}})
    entry, _ = book.created(AGENT, "s", "tool", raw, None)
    assert book.get(AGENT, entry.id) is entry
    assert book.mine(AGENT) == [entry]
    scope.clear()
    with pytest.raises(InvalidParamsError) as unknown:
        book.get(AGENT, entry.id)
    with pytest.raises(InvalidParamsError) as never:
        book.get(AGENT, "t_" + "0" * 24)
    assert unknown.value.message == never.value.message.replace(
        "t_" + "0" * 24, entry.id
    )
    assert book.mine(AGENT) == []
