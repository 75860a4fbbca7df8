"""The MCP face serves 2026-07-28 ``subscriptions/listen`` (issue 11, item 4).

A 2026-07-28 client has no session to be told of changes on: it opens a listen
stream, and the face acknowledges what it honors, then sends on it, each frame
stamped with the stream's id, the list changes it asked for and the updates of
the resources it named (asked of their server once for all holders). The
client here is the official Python SDK (``Client.listen``), through
``memorizzctl mcp serve`` (stdio); behind the real daemon, our SDK test
servers: ``alpha`` (tests/mcp_server.py, 2026-07-28) adds a tool,
``feat`` (tests/features_server.py, the handshake era) says a resource changed.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import ResourceUpdated, ToolsListChanged

from memorizzd.config import Config, load
from tests import features_server
from tests.e2e.test_reload import _doc, _server, _write  # the config file's
from tests.harness import (
    MCP_SERVER,
    DaemonHarness,
    daemon_config,
    features_spec,
    http_bridge,
    http_spec,
    serve_asgi,
    short_tempdir,
    stdio_spec,
    wait_until,
)
from tests.process import MEMORIZZCTL

WATCHED = "feat://watched"
ELSEWHERE = "feat://colors/elsewhere"
"""Built from the server's template (so it goes to that server), which its
listen stream does not honor."""
"""A URI the features server takes no 2026-07-28 subscription to."""


@pytest.fixture(scope="module")
def harness() -> Iterator[DaemonHarness]:
    base = short_tempdir()
    config = daemon_config(
        base,
        servers=[
            stdio_spec("alpha"),
            features_spec(
                env={"SUB_LOG": os.path.join(base, "subs.log")},
            ),
        ],
    )
    with DaemonHarness.running(config) as harness:
        harness.wait_ready("alpha")
        harness.wait_ready("feat")
        yield harness


def _subscriptions(harness: DaemonHarness) -> list[str]:
    path = harness.config.servers[1].env["SUB_LOG"]
    return Path(path).read_text().splitlines() if os.path.exists(path) else []


def _modern(harness: DaemonHarness) -> Client:
    params = StdioServerParameters(
        command=MEMORIZZCTL, args=["--socket", harness.socket, "mcp", "serve"]
    )
    return Client(stdio_client(params), mode="auto", cache=None)


@contextlib.asynccontextmanager
async def _client(
    harness: DaemonHarness, transport: str, bridge: tuple[str, str] | None
) -> AsyncIterator[Client]:
    """A 2026-07-28 client through the stdio bridge, or the HTTP one."""
    if transport == "stdio":
        async with _modern(harness) as client:
            yield client
        return
    assert bridge is not None
    url, token = bridge
    headers = {"Authorization": f"Bearer {token}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=30) as http,
        Client(
            streamable_http_client(url, http_client=http), mode="auto", cache=None
        ) as client,
    ):
        yield client


@pytest.mark.parametrize("transport", ["stdio", "streamable_http"])
def test_a_listen_stream_carries_the_list_changes_and_updates_asked_for(
    harness: DaemonHarness, transport: str
) -> None:
    async def work() -> tuple[Any, list[object]]:
        events: list[object] = []
        async with _client(harness, transport, bridge) as client:
            assert client.protocol_version == "2026-07-28"
            async with client.listen(
                tools_list_changed=True,
                resource_subscriptions=[WATCHED],
            ) as stream:
                honored = stream.honored
                await client.call_tool("alpha__change_tools", {})
                with anyio.fail_after(15):
                    async for event in stream:
                        events.append(event)
                        if isinstance(event, ToolsListChanged):
                            break
                await client.call_tool("feat__touch", {"uri": WATCHED})
                with anyio.fail_after(15):
                    async for event in stream:
                        events.append(event)
                        if isinstance(event, ResourceUpdated):
                            break
        return honored, events

    with (
        http_bridge(harness.socket)
        if transport == "streamable_http"
        else contextlib.nullcontext()
    ) as bridge:
        honored, events = anyio.run(work)
    assert honored.tools_list_changed is True
    assert not honored.prompts_list_changed  # not asked for: not honored
    assert honored.resource_subscriptions == [WATCHED]
    assert ToolsListChanged() in events
    assert ResourceUpdated(uri=WATCHED) in events
    assert "subscribe feat://watched" in _subscriptions(harness)


def test_a_stream_that_did_not_ask_hears_nothing_and_ends_with_its_client(
    harness: DaemonHarness,
) -> None:
    """Only what a stream asked for is sent on it; a second client's stream
    closing takes its resource holds with it, not the first's. (It waited for
    an unsubscribe that only an earlier test of the module had caused: alone,
    it timed out.)"""

    def nobody_holds() -> bool:  # what earlier tests held is let go by now
        log = _subscriptions(harness)
        return log.count(f"subscribe {WATCHED}") == log.count(f"unsubscribe {WATCHED}")

    wait_until(nobody_holds)
    seen = len(_subscriptions(harness))

    def since() -> list[str]:
        return _subscriptions(harness)[seen:]

    def connections() -> int:
        with harness.client() as c:
            return c.daemon_status().connections

    async def work() -> list[object]:
        heard: list[object] = []
        async with (
            _modern(harness) as holder,
            holder.listen(resource_subscriptions=[WATCHED]) as held,
        ):
            assert held.honored.resource_subscriptions == [WATCHED]
            alone = connections()
            async with (
                _modern(harness) as client,
                client.listen(prompts_list_changed=True) as stream,
            ):
                await client.call_tool("alpha__change_tools", {})
                await client.call_tool("feat__touch", {"uri": WATCHED})
                # each as it comes: the wait ends by timing out
                with anyio.move_on_after(1.5):
                    async for event in stream:
                        heard.append(event)  # noqa: PERF401
            wait_until(lambda: connections() == alone)  # its session closed
            assert "unsubscribe feat://watched" not in since()
        return heard

    assert anyio.run(work) == []
    assert "subscribe feat://watched" in since()
    wait_until(lambda: "unsubscribe feat://watched" in since())


def test_the_daemon_stopping_ends_a_listen_stream_gracefully(base_dir: str) -> None:
    """A stream held open does not hold the daemon's stop to its drain
    timeout: it ends with its result (a graceful end: the loop just ends)."""
    config = daemon_config(base_dir, servers=[stdio_spec("alpha")], drain_timeout_s=30)
    ended: list[str] = []

    async def listen(
        harness: DaemonHarness, ready: anyio.Event, done: anyio.Event
    ) -> None:
        async with (
            _modern(harness) as client,
            client.listen(tools_list_changed=True) as stream,
        ):
            ready.set()
            async for _ in stream:
                pass
            ended.append("gracefully")
            done.set()

    with contextlib.ExitStack() as running:
        harness = running.enter_context(DaemonHarness.running(config))
        harness.wait_ready("alpha")

        async def work() -> float:
            ready, done = anyio.Event(), anyio.Event()
            async with anyio.create_task_group() as tg:
                tg.start_soon(listen, harness, ready, done)
                with anyio.fail_after(15):
                    await ready.wait()
                started = anyio.current_time()
                await anyio.to_thread.run_sync(running.close)  # the daemon stops
                with anyio.fail_after(15):
                    await done.wait()  # the client's loop ends on its own
                return anyio.current_time() - started

        took = anyio.run(work)
    assert ended == ["gracefully"]
    assert took < 10  # far below the 30 s drain timeout


@pytest.mark.filterwarnings(
    "ignore::mcp.shared.exceptions.MCPDeprecationWarning"
)  # resources/subscribe is the handshake era's way
@pytest.mark.parametrize("upstream", ["stdio", "streamable_http"])
@pytest.mark.parametrize("client_era", ["legacy", "auto"])
def test_a_2026_upstreams_resource_updates_reach_face_clients_of_both_eras(
    base_dir: str, client_era: str, upstream: str
) -> None:
    """The upstream speaks 2026-07-28 too: the daemon holds the URIs its
    face sessions subscribe to on a listen stream of its own with the server
    (``resourceSubscriptions``; our JSON-RPC client over stdio, the SDK's
    ``Client.listen`` over HTTP), and the server's updates on it reach a
    handshake-era session (``resources/subscribe``) and a 2026-07-28 one
    (its own listen stream) alike. A URI the server does not honor is not
    acknowledged to the face's client either (a subscribe to it fails)."""
    with contextlib.ExitStack() as stack:
        if upstream == "stdio":
            spec = stdio_spec(
                "modern", args=[str(Path(features_server.__file__)), "stdio"]
            )
        else:
            base_url = stack.enter_context(
                serve_asgi(lambda _: features_server.mcp.streamable_http_app())
            )
            spec = http_spec("modern", base_url + "/mcp", "streamable_http")
        config = daemon_config(base_dir, servers=[spec])
        _updates_reach_face_clients(config, client_era)


def _updates_reach_face_clients(config: Config, client_era: str) -> None:

    async def work(harness: DaemonHarness) -> list[object]:
        heard: list[object] = []
        params = StdioServerParameters(
            command=MEMORIZZCTL, args=["--socket", harness.socket, "mcp", "serve"]
        )
        if client_era == "legacy":
            updated = anyio.Event()

            async def on_message(message: Any) -> None:
                if isinstance(message, types.ResourceUpdatedNotification):
                    heard.append(ResourceUpdated(uri=str(message.params.uri)))
                    updated.set()

            async with Client(
                stdio_client(params), mode="legacy", message_handler=on_message
            ) as client:
                with pytest.raises(MCPError, match="takes no subscription"):
                    await client.subscribe_resource(ELSEWHERE)  # not honored upstream
                await client.subscribe_resource(WATCHED)
                await client.call_tool("touch", {"uri": WATCHED})
                with anyio.fail_after(15):
                    await updated.wait()
            return heard
        async with (
            Client(stdio_client(params), mode="auto", cache=None) as client,
            client.listen(resource_subscriptions=[ELSEWHERE, WATCHED]) as stream,
        ):
            # the face acknowledges what the upstream honored, and no more
            assert stream.honored.resource_subscriptions == [WATCHED]
            await client.call_tool("touch", {"uri": WATCHED})
            with anyio.fail_after(15):
                async for event in stream:
                    heard.append(event)
                    break
        return heard

    with DaemonHarness.running(config) as harness:
        harness.wait_ready("modern")
        with harness.client() as c:
            assert c.server_status("modern")[0].protocol_version == "2026-07-28"
        assert anyio.run(work, harness) == [ResourceUpdated(uri=WATCHED)]


def _reload(harness: DaemonHarness) -> None:
    with harness.client() as c:
        c.daemon_reload()


def test_a_reload_that_removes_a_profile_ends_only_its_listen_streams(
    base_dir: str,
) -> None:
    """The profile's sockets drain: its session's stream ends with its
    result; the operator's stream goes on hearing changes."""
    config_file = Path(base_dir, "memorizzd.toml")
    doc = _doc(
        base_dir,
        servers=[_server("alpha", MCP_SERVER)],
        profiles=[{"name": "bot", "servers": ["alpha"], "uids": [os.getuid()]}],
    )
    _write(config_file, doc)
    ended: list[str] = []
    said = {"bot": anyio.Event(), "operator": anyio.Event()}

    async def listen(socket_path: str, who: str, heard: anyio.Event) -> None:
        params = StdioServerParameters(
            command=MEMORIZZCTL, args=["--socket", socket_path, "mcp", "serve"]
        )
        async with (
            Client(stdio_client(params), mode="auto", cache=None) as client,
            client.listen(tools_list_changed=True) as stream,
        ):
            heard.set()  # acknowledged
            async for _ in stream:
                if who == "operator":
                    ended.append("operator heard a change")
                    said[who].set()
                    return
            ended.append(f"{who} ended")
            said[who].set()

    with DaemonHarness.running(load(str(config_file))) as h:
        h.wait_ready("alpha")
        with h.client() as c:
            bot_socket = c.daemon_status().agent_sockets["bot"]

        async def work() -> None:
            bot, operator = anyio.Event(), anyio.Event()
            async with anyio.create_task_group() as tg:
                tg.start_soon(listen, bot_socket, "bot", bot)
                tg.start_soon(listen, h.socket, "operator", operator)
                with anyio.fail_after(15):
                    await bot.wait()
                    await operator.wait()
                _write(config_file, {**doc, "profiles": []})
                await anyio.to_thread.run_sync(_reload, h)
                with anyio.fail_after(15):
                    await said["bot"].wait()  # its stream ends
                with h.client() as c:
                    c.call_tool("alpha", "change_tools", {})
                with anyio.fail_after(15):
                    await said["operator"].wait()  # the change comes

        anyio.run(work)
    assert ended == ["bot ended", "operator heard a change"]


def test_a_stream_lets_go_of_a_server_a_reload_took_out_of_its_scope(
    base_dir: str,
) -> None:
    """bot's stream holds ``feat://watched`` (feat subscribes upstream); a
    reload takes feat out of bot's profile, the connection staying open;
    when the stream ends, feat hears the unsubscribe all the same (a stream
    let go only of the servers still in its scope: feat stayed subscribed
    for good)."""
    config_file = Path(base_dir, "memorizzd.toml")
    subs = os.path.join(base_dir, "subs.log")
    feat = _server("feat", str(Path(features_server.__file__)), protocol="legacy")
    feat["args"] = [*feat["args"], "stdio"]
    feat["env"] = {"SUB_LOG": subs}
    profile = {"name": "bot", "servers": ["alpha", "feat"], "uids": [os.getuid()]}
    doc = _doc(
        base_dir,
        servers=[_server("alpha", MCP_SERVER), feat],
        profiles=[profile],
    )
    _write(config_file, doc)

    def logged() -> list[str]:
        return Path(subs).read_text().splitlines() if os.path.exists(subs) else []

    with DaemonHarness.running(load(str(config_file))) as h:
        h.wait_ready("alpha")
        h.wait_ready("feat")
        with h.client() as c:
            bot_socket = c.daemon_status().agent_sockets["bot"]

        async def work() -> None:
            params = StdioServerParameters(
                command=MEMORIZZCTL, args=["--socket", bot_socket, "mcp", "serve"]
            )
            async with Client(stdio_client(params), mode="auto", cache=None) as client:
                async with client.listen(resource_subscriptions=[WATCHED]) as stream:
                    assert stream.honored.resource_subscriptions == [WATCHED]
                    assert logged() == [f"subscribe {WATCHED}"]
                    _write(
                        config_file,
                        {**doc, "profiles": [{**profile, "servers": ["alpha"]}]},
                    )
                    await anyio.to_thread.run_sync(_reload, h)
                tools = await client.list_tools()  # the session goes on
                assert "change_tools" in [t.name for t in tools.tools]  # alpha's alone

        anyio.run(work)
        wait_until(
            lambda: logged() == [f"subscribe {WATCHED}", f"unsubscribe {WATCHED}"],
            timeout=10,
            what=f"feat unsubscribed: {logged()}",
        )
