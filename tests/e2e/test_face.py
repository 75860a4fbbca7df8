"""The MCP face: an official MCP SDK client uses memorizzd as one MCP server.

The client is the official Python SDK's, over stdio through the real bridge
(``memorizzctl mcp serve --socket API_SOCKET``, which opens the ``mcp.sock``
beside it); behind the face, the daemon's warm sessions to real servers.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import msgspec
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import MCPError

from memorizz.api.methods import ServerSpec
from memorizzd.config import Profile
from memorizzd.face import _completed, exposed_names
from memorizzd.listeners import agent_socket_path, face_socket_path
from tests.harness import (
    DaemonHarness,
    daemon_config,
    http_spec,
    serve_http,
    short_tempdir,
    stdio_spec,
    wait_until,
)
from tests.process import MEMORIZZCTL


@pytest.fixture(scope="module")
def faced() -> Iterator[DaemonHarness]:
    base = short_tempdir()
    calls_log = os.path.join(base, "calls.log")
    config = daemon_config(
        base,
        servers=[
            stdio_spec("alpha", env={"CALL_LOG": calls_log}),
            stdio_spec("beta"),
        ],
        face_approval_wait_s=20.0,
        profiles=[
            Profile(
                name="bot",
                servers=["beta"],
                uids=[os.getuid()],
            )
        ],
    )
    with DaemonHarness.running(config) as harness:
        harness.wait_ready("alpha")
        harness.wait_ready("beta")
        yield harness


def _face(harness: DaemonHarness) -> str:
    path = face_socket_path(harness.socket)
    assert os.path.exists(path)
    return path


async def _session(api_socket: str, work: object, mode: str) -> object:
    params = StdioServerParameters(
        command=MEMORIZZCTL, args=["--socket", api_socket, "mcp", "serve"]
    )
    async with Client(stdio_client(params), mode=mode) as client:
        if mode == "auto":  # the face speaks the newest era the SDK does
            assert client.protocol_version == "2026-07-28"
        return await work(client)  # type: ignore[operator]


def run(api_socket: str, work: object, mode: str = "legacy") -> object:
    """``work(client)`` on an MCP session with the face beside ``api_socket``
    (``legacy``: the handshake era; ``auto``: 2026-07-28)."""
    return anyio.run(_session, api_socket, work, mode)


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_the_face_lists_every_servers_tools_and_calls_them(
    faced: DaemonHarness, mode: str
) -> None:
    async def work(client: Client) -> tuple[list[str], str, bool]:
        tools = await client.list_tools()
        names = [t.name for t in tools.tools]
        result = await client.call_tool("beta__echo", {"text": "through the face"})
        return names, result.content[0].text, result.is_error  # type: ignore[union-attr]

    names, text, is_error = run(faced.socket, work, mode)  # type: ignore[misc]
    assert "alpha__echo" in names
    assert "beta__echo" in names
    assert (text, is_error) == ("through the face", False)
    # the same audit record as a socket tools/call, on the face's socket
    with faced.client() as c:
        record = c.audit(limit=1).records[0]
    assert (record.action, record.server, record.tool) == ("tools/call", "beta", "echo")
    assert record.caller_socket == _face(faced)
    assert record.outcome == "ok"


def test_an_upstream_tool_error_passes_through_and_a_bad_name_is_an_error(
    faced: DaemonHarness,
) -> None:
    async def work(client: Client) -> tuple[bool, str]:
        failed = await client.call_tool("alpha__fail", {"reason": "on purpose"})
        with pytest.raises(MCPError) as raised:
            await client.call_tool("nobody__nothing", {})
        return failed.is_error, raised.value.error.message

    is_error, message = run(faced.socket, work)  # type: ignore[misc]
    assert is_error
    assert "unknown tool" in message


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_prompts_and_resources_come_through(faced: DaemonHarness, mode: str) -> None:
    async def work(client: Client) -> tuple[list[str], list[str], str]:
        prompts = await client.list_prompts()
        got = await client.get_prompt("alpha__greet", {"name": "Ada"})
        resources = await client.list_resources()
        text = got.messages[0].content.text  # type: ignore[union-attr]
        return (
            [p.name for p in prompts.prompts],
            [str(r.uri) for r in resources.resources],
            text,
        )

    prompts, uris, text = run(faced.socket, work, mode)  # type: ignore[misc]
    assert "alpha__greet" in prompts
    assert "beta__greet" in prompts
    assert "Ada" in text
    assert uris  # both servers list the same URIs; each is shown once per server


def test_a_scope_of_one_server_keeps_its_names() -> None:
    names = exposed_names([("only", "echo"), ("only", "add")], single=True)
    assert names == {"echo": ("only", "echo"), "add": ("only", "add")}


def test_names_are_valid_and_deterministic_and_never_hidden() -> None:
    listed = [
        ("a", "x"),
        ("a", "bad name!"),  # invalid characters
        ("a", "y" * 80),  # too long
        ("a__b", "c"),
        ("a", "b__c"),  # the same SERVER__TOOL as the one before
    ]
    names = exposed_names(listed, single=False)
    assert len(names) == len(listed)  # every tool is shown
    assert sorted(names.values()) == sorted(listed)
    for shown in names:
        assert len(shown) <= 64
        assert all(c.isascii() and (c.isalnum() or c in "_-") for c in shown)
    assert exposed_names(listed, single=False) == names  # the same every time
    assert names["a__x"] == ("a", "x")
    assert names["a__b__c"] == ("a__b", "c")  # the first one keeps the plain name


def test_the_face_speaks_json_rpc_line_by_line(faced: DaemonHarness) -> None:
    """A raw client: initialize with an unknown version gets the newest
    handshake version; a notification gets no answer; server/discover answers
    as 2026-07-28 has it; an unknown method is -32601."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(_face(faced))
        sock.sendall(
            b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":'
            b'{"protocolVersion":"1999-01-01","capabilities":{},'
            b'"clientInfo":{"name":"raw","version":"0"}}}\n'
            b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n'
            b'{"jsonrpc":"2.0","id":2,"method":"server/discover","params":{}}\n'
            b'{"jsonrpc":"2.0","id":3,"method":"sampling/nothing","params":{}}\n'
        )
        reader = sock.makefile("rb")
        replies = [msgspec.json.decode(reader.readline()) for _ in range(3)]
    first, second, third = sorted(replies, key=lambda reply: reply["id"])
    assert first["result"]["protocolVersion"] == "2025-11-25"
    assert first["result"]["serverInfo"]["name"] == "memorizzd"
    assert "resultType" not in first["result"]  # the handshake era has none
    assert second["result"]["supportedVersions"] == ["2026-07-28"]
    assert second["result"]["resultType"] == "complete"
    assert second["result"]["cacheScope"] == "private"
    assert third["error"]["code"] == -32601


def test_an_agents_face_shows_its_profiles_servers_under_their_own_names(
    faced: DaemonHarness,
) -> None:
    """The agent's face beside its api.sock: only its profile's server, and a
    scope of one server keeps the tool names unchanged (a transparent proxy)."""
    api = agent_socket_path(faced.config, "bot")

    async def work(client: Client) -> tuple[list[str], str]:
        tools = await client.list_tools()
        result = await client.call_tool("echo", {"text": "agent"})
        with pytest.raises(MCPError):
            await client.call_tool("alpha__echo", {"text": "not mine"})
        return [t.name for t in tools.tools], result.content[0].text  # type: ignore[union-attr]

    names, text = run(api, work)  # type: ignore[misc]
    assert "echo" in names
    assert not any(name.startswith("alpha") for name in names)
    assert text == "agent"
    with faced.client() as c:
        record = c.audit(limit=1).records[0]
    assert (record.server, record.caller_profile) == ("beta", "bot")


def _decide_when_pending(harness: DaemonHarness, approve: bool) -> threading.Thread:
    """The operator, in another thread: wait for the pending proposal, then decide."""

    def operator() -> None:
        with harness.client() as c:
            wait_until(
                lambda: bool(c.list_approvals(status="pending")), what="a proposal"
            )
            (proposal,) = c.list_approvals(status="pending")
            if approve:
                c.approve(proposal.id)
            else:
                c.reject(proposal.id, reason="not today")

    thread = threading.Thread(target=operator)
    thread.start()
    return thread


def _daemons_error(result: Any) -> Any:
    """The facts of a result the daemon made (``_meta["memorizz/error"]``;
    the SDK's tools declare an output schema, so not ``structuredContent``)."""
    if not result.is_error:
        return None
    assert result.structured_content is None
    return (result.meta or {})["memorizz/error"]


@pytest.mark.parametrize("approve", [True, False])
def test_a_call_that_asks_waits_for_the_operator(
    faced: DaemonHarness, approve: bool
) -> None:
    """``record`` is destructive (decided ``ask``): the agent's call waits, the
    operator decides, and the call runs once or answers why it did not."""
    tag = f"face-{approve}"

    async def work(client: Client) -> tuple[bool, str, Any]:
        tools = await client.list_tools()
        (record,) = [t for t in tools.tools if t.name == "alpha__record"]
        assert (record.description or "").startswith("[needs an operator's approval")
        result = await client.call_tool("alpha__record", {"tag": tag})
        said = _daemons_error(result)
        return result.is_error, result.content[0].text, said  # type: ignore[union-attr]

    operator = _decide_when_pending(faced, approve)
    try:
        is_error, text, structured = run(faced.socket, work)  # type: ignore[misc]
    finally:
        operator.join()
    calls_log = Path(faced.config.servers[0].env["CALL_LOG"])
    ran = calls_log.read_text().splitlines() if calls_log.exists() else []
    if approve:
        assert (is_error, text) == (False, f"recorded {tag}")
        assert ran.count(tag) == 1  # exactly once
    else:
        assert is_error
        assert structured["status"] == "rejected"
        assert structured["reason"] == "approval_required"
        assert tag not in ran


@pytest.mark.parametrize(
    ("relayed", "expected"),
    [
        (b'{"content":[]}', {"resultType": "complete", "content": []}),
        (b"{}", {"resultType": "complete"}),
        (b' { "content" : [ ] } ', {"resultType": "complete", "content": []}),
        # a 2026-07-28 upstream's result is relayed as it wrote it
        (b'{"resultType":"complete","content":[]}', None),
    ],
)
def test_a_relayed_result_gains_only_its_result_type(
    relayed: bytes, expected: dict[str, Any] | None
) -> None:
    completed = _completed("tools/call", msgspec.Raw(relayed))
    if expected is None:
        assert bytes(completed) == relayed
    else:
        assert msgspec.json.decode(bytes(completed)) == expected


def test_an_upstreams_list_change_reaches_the_sessions_that_see_it(
    faced: DaemonHarness,
) -> None:
    """``alpha`` announces a new tool: a session on the operator's face hears
    ``notifications/tools/list_changed`` and lists it; the agent's face, which
    cannot see ``alpha``, is told nothing."""
    agent_heard: list[str] = []

    async def listen_as_agent(ready: anyio.Event, done: anyio.Event) -> None:
        async def handler(message: Any) -> None:
            agent_heard.append(type(message).__name__)

        params = StdioServerParameters(
            command=MEMORIZZCTL,
            args=["--socket", agent_socket_path(faced.config, "bot"), "mcp", "serve"],
        )
        async with Client(
            stdio_client(params), mode="legacy", message_handler=handler
        ) as client:
            await client.list_tools()
            ready.set()
            await done.wait()

    async def work() -> list[str]:
        changed = anyio.Event()

        async def handler(message: Any) -> None:
            if isinstance(message, types.ToolListChangedNotification):
                changed.set()

        params = StdioServerParameters(
            command=MEMORIZZCTL, args=["--socket", faced.socket, "mcp", "serve"]
        )
        async with anyio.create_task_group() as tg:
            agent_ready, done = anyio.Event(), anyio.Event()
            tg.start_soon(listen_as_agent, agent_ready, done)
            await agent_ready.wait()
            async with Client(
                stdio_client(params), mode="legacy", message_handler=handler
            ) as client:
                before = {t.name for t in (await client.list_tools()).tools}
                await client.call_tool("alpha__change_tools", {})
                with anyio.fail_after(10):
                    await changed.wait()
                after = {t.name for t in (await client.list_tools()).tools}
            done.set()
        return sorted(after - before)

    added = anyio.run(work)
    assert len(added) == 1
    assert added[0].startswith("alpha__dyn_")
    assert "ToolListChangedNotification" not in agent_heard


def test_the_same_call_again_runs_the_approved_proposal_once(base_dir: str) -> None:
    """With no wait (``face_approval_wait_s = 0``) the first call answers
    "pending"; once the operator approves, the same call runs that proposal,
    once; the next one is a new proposal."""
    calls_log = os.path.join(base_dir, "calls.log")
    config = daemon_config(
        base_dir,
        servers=[stdio_spec("alpha", env={"CALL_LOG": calls_log})],
        face_approval_wait_s=0.0,
    )
    with DaemonHarness.running(config) as harness:
        harness.wait_ready("alpha")

        async def call(client: Client) -> Any:
            result = await client.call_tool("record", {"tag": "again"})
            return result.is_error, _daemons_error(result)

        first, pending = run(harness.socket, call)  # type: ignore[misc]
        assert first
        assert pending["status"] == "pending"
        with harness.client() as c:
            c.approve(pending["proposal_id"])
        second, _ = run(harness.socket, call)  # type: ignore[misc]
        assert not second
        assert Path(calls_log).read_text().splitlines() == ["again"]
        third, again = run(harness.socket, call)  # type: ignore[misc]
        assert third
        assert again["proposal_id"] != pending["proposal_id"]  # consumed: a new one
    assert Path(calls_log).read_text().splitlines() == ["again"]


def test_a_client_that_cancels_a_call_cancels_it_upstream(faced: DaemonHarness) -> None:
    """The client gives up on a call (the SDK sends ``notifications/cancelled``):
    the daemon cancels it upstream at once, sends no reply, and audits it."""
    calls_log = Path(faced.config.servers[0].env["CALL_LOG"])
    tag = "face-cancel"

    async def work(client: Client) -> None:
        with anyio.move_on_after(1.5):
            await client.call_tool("alpha__watched", {"seconds": 30, "tag": tag})
        # the session goes on: the next call is answered
        result = await client.call_tool("alpha__echo", {"text": "after"})
        assert result.content[0].text == "after"  # type: ignore[union-attr]

    run(faced.socket, work)
    wait_until(
        lambda: f"cancelled:{tag}" in calls_log.read_text().splitlines(),
        what="the upstream to hear the cancellation",
    )
    with faced.client() as c:
        records = [r for r in c.audit(limit=10).records if r.tool == "watched"]
    assert records[0].outcome == "client_aborted"
    assert records[0].reason == "cancelled"
    assert records[0].duration_ms < 20_000


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_a_calls_progress_reaches_the_client_under_its_own_token(
    faced: DaemonHarness, mode: str
) -> None:
    seen: list[tuple[float, float | None, str | None]] = []

    async def work(client: Client) -> str:
        async def on_progress(
            progress: float, total: float | None, message: str | None
        ) -> None:
            seen.append((progress, total, message))

        result = await client.call_tool(
            "alpha__progressing", {"steps": 3}, progress_callback=on_progress
        )
        return result.content[0].text  # type: ignore[union-attr]

    text = run(faced.socket, work, mode)
    assert text == "done in 3 steps"
    assert seen == [(1, 3, "step 1"), (2, 3, "step 2"), (3, 3, "step 3")]


def test_an_agents_built_in_tools_list_and_resume_its_own_proposals(
    base_dir: str,
) -> None:
    """``face_tools = ["proposals", "resume"]``: the agent sees its proposal,
    and runs it once the operator approved; the operator's face has neither."""
    config = daemon_config(
        base_dir,
        servers=[stdio_spec("beta")],
        face_approval_wait_s=0.0,
        profiles=[
            Profile(
                name="bot",
                servers=["beta"],
                uids=[os.getuid()],
                face_tools=["proposals", "resume"],
            )
        ],
    )
    with DaemonHarness.running(config) as harness:
        harness.wait_ready("beta")
        agent = agent_socket_path(harness.config, "bot")

        async def propose(client: Client) -> Any:
            names = {t.name for t in (await client.list_tools()).tools}
            assert {"memorizz__proposals", "memorizz__resume"} <= names
            held = await client.call_tool("annotated_destroy", {})
            listed = await client.call_tool("memorizz__proposals", {})
            return _daemons_error(held), listed.structured_content

        held, listed = run(agent, propose)  # type: ignore[misc]
        proposal_id = held["proposal_id"]
        assert [(p["id"], p["status"]) for p in listed["proposals"]] == [
            (proposal_id, "pending")
        ]

        async def resume(client: Client) -> Any:
            result = await client.call_tool("memorizz__resume", {"id": proposal_id})
            return result.is_error, result.content[0].text  # type: ignore[union-attr]

        assert run(agent, resume)[0]  # type: ignore[index]  # not approved yet
        with harness.client() as c:
            c.approve(proposal_id)
        is_error, text = run(agent, resume)  # type: ignore[misc]
        assert not is_error
        assert text == "destroyed nothing"

        async def resume_badly(client: Client) -> Any:
            # an unknown id, another's, none: results the model reads (SEP-1303)
            said = []
            for arguments in ({"id": "p_nope"}, {"id": 7}, {}):
                result = await client.call_tool("memorizz__resume", arguments)
                facts = (result.meta or {})["memorizz/error"]
                said.append((result.is_error, facts["reason"]))
            return said

        assert run(agent, resume_badly) == [
            (True, "not_found"),
            (True, "invalid_params"),
            (True, "invalid_params"),
        ]

        async def operator_tools(client: Client) -> set[str]:
            return {t.name for t in (await client.list_tools()).tools}

        assert "memorizz__resume" not in run(harness.socket, operator_tools)  # type: ignore[operator]


def test_an_upstreams_prompt_list_change_reaches_its_sessions(
    faced: DaemonHarness,
) -> None:
    """``alpha`` adds a prompt and says so: a face session hears
    ``notifications/prompts/list_changed`` and lists the new prompt."""
    added = _prompt_added_and_heard(faced.socket)
    assert len(added) == 1
    assert added[0].startswith("alpha__dyn_prompt_")


def test_a_2026_http_upstreams_prompt_list_change_reaches_its_sessions(
    base_dir: str,
) -> None:
    """The same through a 2026-07-28 Streamable HTTP upstream, which tells
    of list changes only on a ``subscriptions/listen`` stream: the daemon
    holds one for every list change the server declares (the SDK's
    ``Client.listen``), not only the tools'."""
    from tests.mcp_server import mcp  # served in this process: its prompts

    before = {p.name for p in anyio.run(mcp.list_prompts)}
    try:
        with serve_http("streamable_http") as url:
            config = daemon_config(
                base_dir,
                servers=[
                    http_spec("alpha", url, "streamable_http"),
                    stdio_spec("beta"),
                ],
            )
            with DaemonHarness.running(config) as harness:
                harness.wait_ready("alpha")
                harness.wait_ready("beta")  # listed before, not during
                with harness.client() as c:
                    status = c.server_status("alpha")[0]
                    assert status.protocol_version == "2026-07-28"
                added = _prompt_added_and_heard(harness.socket)
    finally:  # the next test that serves it in this process sees it as it was
        for prompt in anyio.run(mcp.list_prompts):
            if prompt.name not in before:
                mcp.remove_prompt(prompt.name)
    assert len(added) == 1
    assert added[0].startswith("alpha__dyn_prompt_")


def _prompt_added_and_heard(api_socket: str) -> list[str]:
    """Through the bridge: call ``alpha__change_prompts``, wait for the
    session to hear ``prompts/list_changed``; the prompts it added."""

    async def work() -> list[str]:
        changed = anyio.Event()

        async def handler(message: Any) -> None:
            if isinstance(message, types.PromptListChangedNotification):
                changed.set()

        params = StdioServerParameters(
            command=MEMORIZZCTL, args=["--socket", api_socket, "mcp", "serve"]
        )
        async with Client(
            stdio_client(params), mode="legacy", message_handler=handler
        ) as client:
            before = {p.name for p in (await client.list_prompts()).prompts}
            await client.call_tool("alpha__change_prompts", {})
            with anyio.fail_after(10):
                await changed.wait()
            after = {p.name for p in (await client.list_prompts()).prompts}
        return sorted(after - before)

    return anyio.run(work)


@pytest.mark.filterwarnings(
    "ignore::mcp.shared.exceptions.MCPDeprecationWarning"
)  # logging/setLevel is the handshake era's way (2026-07-28 asks per request)
@pytest.mark.parametrize("transport", ["stdio", "streamable_http"])
def test_an_upstreams_log_messages_reach_the_sessions_that_asked(
    base_dir: str, transport: str
) -> None:
    """A session that set a level hears the server's log message, with the
    server's name as its logger; one that set none hears nothing. (A
    handshake-era upstream logs unasked; a 2026-07-28 one only to a request
    that opts in: tests/e2e/test_face_logs_modern.py.)"""
    with contextlib.ExitStack() as stack:
        if transport == "stdio":
            spec = stdio_spec("alpha", protocol="legacy")
        else:
            url = stack.enter_context(serve_http("streamable_http"))
            spec = http_spec("alpha", url, "streamable_http", protocol="legacy")
        asked, silent = _log_sessions(base_dir, spec)
    assert ("info", "alpha", "set True") in asked
    assert silent == []


def _log_sessions(base_dir: str, spec: ServerSpec) -> tuple[Any, Any]:
    """Two face sessions open at once on a daemon with ``spec`` as ``alpha``,
    one that set a level and one that did not: the silent one calls first,
    then the other, which waits for its own message. A server's notices are
    passed on in order, so by then the silent one's has been too."""
    config = daemon_config(base_dir, servers=[spec])
    heard: dict[bool, list[tuple[str, str | None, Any]]] = {True: [], False: []}
    mine = anyio.Event()

    def bridge(api_socket: str) -> StdioServerParameters:
        return StdioServerParameters(
            command=MEMORIZZCTL, args=["--socket", api_socket, "mcp", "serve"]
        )

    def listener(asked: bool) -> Any:
        async def handler(message: Any) -> None:
            if isinstance(message, types.LoggingMessageNotification):
                params = message.params
                heard[asked].append((params.level, params.logger, params.data))
                if params.data == "set True":
                    mine.set()

        return handler

    async def both(api_socket: str) -> None:
        async with (
            Client(
                stdio_client(bridge(api_socket)),
                mode="legacy",
                message_handler=listener(False),
            ) as silent,
            Client(
                stdio_client(bridge(api_socket)),
                mode="legacy",
                message_handler=listener(True),
            ) as asked,
        ):
            await asked.session.set_logging_level("info")
            await silent.call_tool("logged", {"text": "set False"})
            await asked.call_tool("logged", {"text": "set True"})
            with anyio.fail_after(10):
                await mine.wait()

    with DaemonHarness.running(config) as harness:
        harness.wait_ready("alpha")
        anyio.run(both, harness.socket)
    return heard[True], heard[False]


def test_the_bridge_can_show_one_server_under_its_own_names(
    faced: DaemonHarness,
) -> None:
    """``memorizzctl mcp serve --server alpha``: a transparent proxy of
    ``alpha`` on the operator's face; on the agent's face, whose scope lacks
    ``alpha``, nothing but ``unknown server 'alpha'`` (a session narrows its
    scope, never widens it; it saw an empty server, as a mistyped name did)."""

    async def session(api_socket: str) -> tuple[set[str], Any]:
        params = StdioServerParameters(
            command=MEMORIZZCTL,
            args=["--socket", api_socket, "mcp", "serve", "--server", "alpha"],
        )
        async with Client(stdio_client(params), mode="legacy") as client:
            names = {t.name for t in (await client.list_tools()).tools}
            if "echo" not in names:
                return names, None
            result = await client.call_tool("echo", {"text": "only alpha"})
            return names, result.content[0].text  # type: ignore[union-attr]

    names, text = anyio.run(session, faced.socket)
    assert "echo" in names
    assert not any("__" in name for name in names)
    assert text == "only alpha"
    with faced.client() as c:
        record = c.audit(limit=1).records[0]
    assert (record.server, record.tool) == ("alpha", "echo")
    with pytest.raises(ExceptionGroup) as raised:
        anyio.run(session, agent_socket_path(faced.config, "bot"))
    matched = raised.value.subgroup(lambda e: isinstance(e, MCPError))
    assert matched is not None, raised.value
    (error,) = _leaves(matched)
    assert str(error) == "unknown server 'alpha'"


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    return [
        leaf
        for e in group.exceptions
        for leaf in (_leaves(e) if isinstance(e, BaseExceptionGroup) else [e])
    ]


def test_a_session_hears_no_list_change_before_its_initialize_is_answered(
    faced: DaemonHarness,
) -> None:
    """A client connected but not initialized yet is told nothing: a list
    change meanwhile does not come before its ``initialize`` reply."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as raw:
        raw.settimeout(10)
        raw.connect(_face(faced))
        with faced.client() as c:
            before = len(c.list_tools("alpha"))
            c.call_tool("alpha", "change_tools", {})
            wait_until(
                lambda: len(c.list_tools("alpha")) > before
            )  # listed again: told
        raw.sendall(
            b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":'
            b'{"protocolVersion":"2025-11-25","capabilities":{},'
            b'"clientInfo":{"name":"raw","version":"0"}}}\n'
        )
        first = msgspec.json.decode(raw.makefile("rb").readline())
    assert first.get("id") == 1
    assert "result" in first
