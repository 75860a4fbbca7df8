"""One owner's tasks never push out another's.

A component test of the real ``TaskBook`` (the daemon's record of which
caller made which task): it holds at most ``MAX_TASKS_PER_OWNER`` of one
owner's, forgetting that owner's oldest past it. Before, only the book's
total was capped (``MAX_TASKS``, oldest first, whoever's): an agent that made
tasks in a loop made every other caller's tasks unknown to them (their
results lost to them), the operator's included.
"""

from __future__ import annotations

import pytest

from memorizz.api.errors import InvalidParamsError
from memorizzd.caller import Caller
from memorizzd.upstream import tasks
from memorizzd.upstream.tasks import TaskBook
from tests.component.wiring import task_made

FLOOD = Caller(pid=2, uid=1000, gid=1000, socket="/a.sock", profile="a", role="agent")
OTHER = Caller(pid=3, uid=1001, gid=1001, socket="/b.sock", profile="b", role="agent")
OPERATOR = Caller(pid=1, uid=0, gid=0, socket="/op.sock", role="operator")


def test_a_flood_of_one_owners_tasks_forgets_only_its_own_oldest() -> None:
    book = TaskBook()
    theirs = task_made(book, OTHER, "other-1")
    operators = task_made(book, OPERATOR, "op-1")
    # more than the whole book holds, all of one agent's
    flood = [task_made(book, FLOOD, f"f-{i}") for i in range(tasks.MAX_TASKS + 5)]
    assert book.get(OTHER, theirs).upstream_id == "other-1"
    assert book.get(OPERATOR, operators).upstream_id == "op-1"
    assert [e.id for e in book.mine(OTHER)] == [theirs]
    kept = tasks.MAX_TASKS_PER_OWNER
    assert [e.id for e in book.mine(FLOOD)] == flood[-kept:]  # its newest


def test_a_removed_profiles_tasks_are_forgotten_at_the_reload() -> None:
    """A reload that removes profile ``a`` forgets its tasks, as it ends its
    proposals: a profile ``a`` added later (same uid) is another profile and
    never reaches them. Other profiles' tasks and the operator's stay."""
    book = TaskBook()
    gone = task_made(book, FLOOD, "a-1")
    theirs = task_made(book, OTHER, "b-1")
    operators = task_made(book, OPERATOR, "op-1")
    book.profiles_in_force(["b"])
    with pytest.raises(InvalidParamsError):
        book.get(FLOOD, gone)  # the new "a", same uid as the old one
    assert book.mine(FLOOD) == []
    assert book.get(OTHER, theirs).upstream_id == "b-1"
    assert book.get(OPERATOR, operators).upstream_id == "op-1"
    again = task_made(book, FLOOD, "a-1")  # the server's id, given again: no clash
    assert book.get(FLOOD, again).upstream_id == "a-1"
