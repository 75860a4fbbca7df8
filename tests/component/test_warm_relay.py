"""The warm relay (``memorizzd.relay``) built in-process, without a socket.

A plain ``tools/call`` (nothing declared, nothing asked for but the result,
a warm stdio session, a tool the policy allows) is relayed with no task: the
relay takes the request line's ``Request`` and answers through its session's
``finish`` (the connection's side, here a recorder of what it is given, as the
relay's ``Session`` protocol says). Anything else is refused by the relay
(None), so the connection runs it the async way. The upstream is the real
test server (tests/mcp_server.py over stdio).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import anyio
import msgspec
import pytest

from memorizz.api.errors import RemoteError
from memorizz.api.protocol import Request, RequestId
from memorizzd.caller import Caller
from memorizzd.calllife import CallLife, current, declare
from memorizzd.face import MODERN, FaceDispatcher
from memorizzd.relay import WarmRelay
from memorizzd.rpc.dispatch import Relayed
from tests.component.wiring import AGENT, OPERATOR, Components
from tests.process import wait_until

pytestmark = pytest.mark.anyio


class Recorder:
    """A connection as the relay sees it: who calls, and where replies go."""

    def __init__(self, caller: Caller) -> None:
        self.caller = caller
        self.finished: dict[RequestId, bytes | None] = {}
        self.done = anyio.Event()

    def finish(self, request_id: RequestId, line: bytes | None) -> None:
        self.finished[request_id] = line
        self.done.set()


def _request(request_id: int, params: dict[str, Any]) -> Request:
    line = msgspec.json.encode(
        {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}
    )
    return msgspec.json.decode(line, type=Request)


async def _warm(c: Components) -> None:
    """The listing is fetched once (the relay takes only a warm one)."""
    await c.call("tools/list", OPERATOR, {"server": "t"})


async def _reply(session: Recorder, request_id: int) -> dict[str, Any]:
    with anyio.fail_after(20):
        await session.done.wait()
    line = session.finished[request_id]
    assert line is not None
    assert line.endswith(b"\n")
    reply: dict[str, Any] = msgspec.json.decode(line)
    assert reply["id"] == request_id
    return reply


async def _once_checked(start: Callable[[], Relayed | None]) -> Relayed:
    """``start()``, relayed once the session is not being checked: a deadline
    that passed (an earlier test's) has the health loop probe the session,
    and meanwhile calls take the task's way (None: nothing was started)."""
    with anyio.fail_after(20):
        while (relayed := start()) is None:  # noqa: ASYNC110 - polled: no event says so
            await anyio.sleep(0.05)
    return relayed


async def _last_record(c: Components, tool: str) -> dict[str, Any]:
    records = (await c.call("audit/list", OPERATOR, {"limit": 20}))["records"]
    mine = [r for r in records if r["tool"] == tool]
    assert mine, records
    return mine[0]


async def test_a_plain_call_is_relayed_and_answered_through_finish(
    c: Components,
) -> None:
    await _warm(c)
    relay = WarmRelay(c.broker.tool_calls)
    session = Recorder(AGENT)
    params = {"server": "t", "name": "echo", "arguments": {"text": "no task"}}
    relayed = relay(session, _request(7, params))
    assert relayed is not None
    reply = await _reply(session, 7)
    assert reply["result"]["content"] == [{"type": "text", "text": "no task"}]
    record = await _last_record(c, "echo")
    assert (record["outcome"], record["decision"], record["argument_keys"]) == (
        "ok",
        "allow",
        ["text"],
    )
    assert record["result_bytes"] > 0


async def test_an_upstream_error_and_a_tool_error_come_back_as_they_do_the_task_way(
    c: Components,
) -> None:
    await _warm(c)
    relay = WarmRelay(c.broker.tool_calls)
    session = Recorder(AGENT)
    params = {"server": "t", "name": "fail", "arguments": {"reason": "nope"}}
    assert relay(session, _request(1, params)) is not None
    reply = await _reply(session, 1)
    assert reply["result"]["isError"] is True
    assert (await _last_record(c, "fail"))["outcome"] == "tool_error"

    # an unknown tool: the same reply, and the same record, as the task way's
    session = Recorder(AGENT)
    params = {"server": "t", "name": "no_such_tool", "arguments": {}}
    assert relay(session, _request(2, params)) is not None
    reply = await _reply(session, 2)
    relayed = await _last_record(c, "no_such_tool")
    try:
        expected = {"result": await c.call("tools/call", AGENT, params)}
    except RemoteError as exc:
        expected = {"error": msgspec.to_builtins(exc.to_wire())}
    assert {k: v for k, v in reply.items() if k in ("result", "error")} == expected
    awaited = await _last_record(c, "no_such_tool")
    assert (relayed["outcome"], relayed["reason"]) == (
        awaited["outcome"],
        awaited["reason"],
    )


async def test_the_callers_deadline_is_a_timer_and_the_server_is_told(
    c: Components, base: str
) -> None:
    await _warm(c)
    relay = WarmRelay(c.broker.tool_calls)
    session = Recorder(AGENT)
    params = {
        "server": "t",
        "name": "watched",
        "arguments": {"seconds": 30, "tag": "late"},
        "timeout_s": 0.3,
    }
    assert relay(session, _request(3, params)) is not None
    reply = await _reply(session, 3)
    assert reply["error"]["data"]["reason"] == "timeout"
    assert (await _last_record(c, "watched"))["reason"] == "timeout"
    await _logged(base, "cancelled:late")  # notifications/cancelled reached it
    assert c.pool.get("t").in_flight == 0


async def test_a_read_whose_client_left_is_cancelled_upstream_and_audited(
    c: Components, base: str
) -> None:
    await _warm(c)
    relay = WarmRelay(c.broker.tool_calls)
    session = Recorder(AGENT)
    params = {
        "server": "t",
        "name": "watched",
        "arguments": {"seconds": 30, "tag": "relayed"},
    }
    relayed = await _once_checked(lambda: relay(session, _request(4, params)))
    await _logged(base, "start:relayed")
    relayed.client_gone()
    assert session.finished == {4: None}  # no reply: nobody reads it
    await _logged(base, "cancelled:relayed")
    record = await _last_record(c, "watched")
    assert (record["outcome"], record["reason"]) == ("client_aborted", "client_gone")


async def test_what_the_relay_leaves_to_the_task_way(c: Components) -> None:
    await _warm(c)
    relay = WarmRelay(c.broker.tool_calls)
    plain = {"server": "t", "name": "echo", "arguments": {"text": "x"}}
    session = Recorder(AGENT)
    # held for approval (record is destructive: ask)
    asked = {"server": "t", "name": "record", "arguments": {"tag": "no"}}
    assert relay(session, _request(1, asked)) is None
    # progress asked for, or a task
    assert relay(session, _request(2, {**plain, "progress_token": "p"})) is None
    assert relay(session, _request(3, {**plain, "task": {"ttl": 1000}})) is None
    # a server outside the caller's scope, and malformed params: the task's
    # way says what is wrong (and audits the refusal)
    assert relay(session, _request(4, {**plain, "server": "u"})) is None
    assert relay(session, _request(5, {"server": "t"})) is None
    # a connection that declared what it answers hears the server's requests
    declaring = Recorder(AGENT)
    hello = current.set(CallLife("daemon/hello", session=declaring))
    declare({"elicitation": {}})
    current.reset(hello)
    assert relay(declaring, _request(6, plain)) is None
    assert session.finished == {}
    assert declaring.finished == {}
    # and a notification (no id) is never run
    note = msgspec.json.decode(
        msgspec.json.encode(
            {"jsonrpc": "2.0", "method": "tools/call", "params": plain}
        ),
        type=Request,
    )
    assert relay(session, note) is None


async def _logged(base: str, line: str) -> None:
    """Wait until the test server has logged ``line`` to its calls.log."""
    log = os.path.join(base, "calls.log")
    await anyio.to_thread.run_sync(
        lambda: wait_until(lambda: line in _read(log), timeout=20)
    )


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        return ""


async def test_the_mcp_faces_plain_calls_are_relayed_in_their_eras_shape(
    c: Components,
) -> None:
    await _warm(c)
    face = FaceDispatcher(c.broker, WarmRelay(c.broker.tool_calls))
    plain = {"name": "echo", "arguments": {"text": "face"}}  # one server: its names
    session = Recorder(AGENT)
    await _once_checked(lambda: face.relay(session, _request(1, plain)))
    reply = await _reply(session, 1)
    assert reply["result"]["content"] == [{"type": "text", "text": "face"}]
    # a 2026-07-28 request: the result says it is complete, as the task way's does
    modern = {**plain, "_meta": {"io.modelcontextprotocol/protocolVersion": MODERN}}
    session = Recorder(AGENT)
    assert face.relay(session, _request(2, modern)) is not None
    assert (await _reply(session, 2))["result"]["resultType"] == "complete"
    # what needs a task: progress, a client that answers the server's
    # questions (2026-07-28: per request), an unknown name
    progress = {**plain, "_meta": {"progressToken": "p"}}
    answers = {
        **plain,
        "_meta": {
            "io.modelcontextprotocol/protocolVersion": MODERN,
            "io.modelcontextprotocol/clientCapabilities": {"elicitation": {}},
        },
    }
    unknown = {**plain, "name": "t__nope"}
    for params in (progress, answers, unknown):
        assert face.relay(Recorder(AGENT), _request(3, params)) is None
