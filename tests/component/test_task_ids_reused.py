"""A server's task id used again (its process started again, or a replica
set's primary handed over) names the new task only.

A component test of the real ``TaskBook``. A server that numbers its tasks
(``1``, ``2``, ...) starts again from ``1`` in its new process; the book kept
the old task of that id (one caller's) beside the new one (another's). The
old one's owner reached the new task through it (``tasks/get``,
``tasks/result``, ``tasks/cancel`` go to the server under its id), and
forgetting the old one unmapped the new one's status notifications.
"""

from __future__ import annotations

import msgspec
import pytest

from memorizz.api.errors import InvalidParamsError
from memorizzd.caller import Caller
from memorizzd.upstream.tasks import TaskBook
from tests.component.wiring import task_made

ALICE = Caller(pid=2, uid=1000, gid=1000, socket="/a.sock", profile="a", role="agent")
BOB = Caller(pid=3, uid=1001, gid=1001, socket="/b.sock", profile="b", role="agent")


def test_an_old_task_whose_id_the_server_gave_again_is_unknown() -> None:
    book = TaskBook()
    old = task_made(book, ALICE, "1")
    new = task_made(book, BOB, "1")  # the server's new process, its first task
    with pytest.raises(InvalidParamsError):
        book.get(ALICE, old)  # else Alice's tasks/get would ask for Bob's task
    assert book.mine(ALICE) == []
    assert book.get(BOB, new).upstream_id == "1"


@pytest.mark.anyio
async def test_forgetting_an_old_task_leaves_the_new_one_of_its_id_heard() -> None:
    heard: list[bytes] = []

    async def send(line: bytes) -> None:
        heard.append(line)

    book = TaskBook()
    raw = msgspec.json.encode({"task": {"taskId": "1", "status": "working"}})
    old, _ = book.created(ALICE, "s", "tool", raw, None)
    new, _ = book.created(BOB, "s", "tool", raw, send)
    book.forget(old)  # tasks/list found it unknown, say
    status = msgspec.json.encode({"taskId": "1", "status": "completed"})
    await book.noticed("s", msgspec.Raw(status))
    (line,) = heard
    assert msgspec.json.decode(line)["params"]["taskId"] == new.id
