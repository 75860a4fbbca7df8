"""Every MCP pass-through method over every transport, against real servers."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from memorizz import Client
from memorizz.api.errors import NotFoundError, UpstreamError
from memorizz.api.methods import ServerSpec
from tests.harness import (
    DaemonHarness,
    light_spec,
    serve_http,
    stdio_spec,
    wait_until,
)


@pytest.fixture(scope="module", params=["stdio", "streamable_http", "sse"])
def server(
    request: pytest.FixtureRequest, shared_daemon: DaemonHarness
) -> Iterator[str]:
    """A warm server named after its transport, in the module's daemon (each
    transport's server starts once for all the tests that read through it)."""
    daemon = shared_daemon
    kind: str = request.param
    if kind == "stdio":
        daemon.add(stdio_spec(kind))
        yield kind
        return
    with serve_http(kind) as url:
        spec = ServerSpec(
            name=kind,
            transport=kind,  # type: ignore[arg-type]
            url=url,
            allow_private_network=True,  # a loopback test server
        )
        daemon.add(spec)
        yield kind
        with daemon.client() as c:  # let go before the HTTP server stops
            c.remove_server(kind)


def test_tools_list_and_call(shared_daemon: DaemonHarness, server: str) -> None:
    with shared_daemon.client() as c:
        tools = {t.name: t for t in c.list_tools(server)}
        assert {"echo", "add", "fail", "slow", "huge"} <= tools.keys()
        assert tools["add"].input_schema["type"] == "object"
        assert c.list_tools(server, refresh=True)  # straight from the upstream too

        result = c.call_tool(server, "add", {"a": 2, "b": 40})
        assert result.is_error is False
        assert result.structured_content == {"result": 42}
        assert result.content == [{"type": "text", "text": "42"}]


def test_is_error_is_a_result_and_counts_as_a_failure(
    shared_daemon: DaemonHarness, server: str
) -> None:
    with shared_daemon.client() as c:
        before = c.server_status(server)[0]
        result = c.call_tool(server, "fail", {"reason": "bad input"})
        assert result.is_error is True
        assert "bad input" in result.content[0]["text"]
        after = c.server_status(server)[0]
    assert after.calls_failed == before.calls_failed + 1


def test_resources_templates_and_read(
    shared_daemon: DaemonHarness, server: str
) -> None:
    with shared_daemon.client() as c:
        assert {r.uri for r in c.list_resources(server)} == {
            "test://static",
            "test://crash",
        }
        templates = c.list_resource_templates(server)
        assert [t.uri_template for t in templates] == [
            "test://items/{item_id}",
            "test://huge/{n_bytes}",
        ]
        read = c.read_resource(server, "test://static")
        assert read.contents == [
            {"uri": "test://static", "mimeType": "text/plain", "text": "static content"}
        ]
        item = c.read_resource(server, "test://items/7")
        assert item.contents[0]["text"] == '{"id": "7"}'
        with pytest.raises(UpstreamError) as err:
            c.read_resource(server, "test://nope")
        assert err.value.reason == "upstream_error"


def test_prompts_list_and_get(shared_daemon: DaemonHarness, server: str) -> None:
    with shared_daemon.client() as c:
        prompts = c.list_prompts(server)
        assert [p.name for p in prompts] == ["greet"]
        assert prompts[0].arguments[0].name == "name"
        got = c.get_prompt(server, "greet", {"name": "Ada"})
        assert got.messages[0]["content"]["text"] == "Say hello to Ada"


def test_ping_status_and_test(shared_daemon: DaemonHarness, server: str) -> None:
    with shared_daemon.client() as c:
        assert c.ping(server).latency_ms > 0
        status = c.server_status(server)[0]
        assert status.state == "ready"
        assert status.transport == server
        assert status.protocol_version in ("2026-07-28", "2025-11-25")
        assert status.server_name == "memorizz-test-server"
        assert status.server_version == "1.2.3"
        assert status.tool_count is not None
        assert status.tool_count >= 10
        assert (status.pid is not None) == (server == "stdio")
        tested = c.test_server(server)
        assert tested.outcome == "ok"
        assert tested.tool_count == status.tool_count


def test_legacy_mode_negotiates_the_handshake_era(daemon: DaemonHarness) -> None:
    daemon.add(stdio_spec("old", protocol="legacy"))
    with daemon.client() as c:
        assert c.server_status("old")[0].protocol_version == "2025-11-25"
        assert c.call_tool("old", "echo", {"text": "x"}).content[0]["text"] == "x"
        assert c.ping("old").latency_ms > 0


def test_unknown_server_is_not_found(daemon: DaemonHarness) -> None:
    with Client(daemon.socket) as c:
        with pytest.raises(NotFoundError) as err:
            c.call_tool("nope", "echo", {})
        assert err.value.reason == "unknown_server"
        with pytest.raises(NotFoundError):
            c.list_tools("nope")


@pytest.mark.parametrize("protocol", ["auto", "legacy"])
def test_a_tool_list_change_reaches_the_warm_cache(
    daemon: DaemonHarness, protocol: str
) -> None:
    daemon.add(stdio_spec("changing", protocol=protocol))
    with daemon.client() as c:
        before = {t.name for t in c.list_tools("changing")}
        assert c.call_tool("changing", "change_tools").content[0]["text"] == "ok"
        wait_until(
            lambda: len(c.list_tools("changing")) == len(before) + 1,
            what="the new tool in tools/list",
        )


def test_a_stdio_server_gets_only_its_own_environment(
    daemon: DaemonHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEMORIZZ_MCP_ENCRYPTION_KEY", "daemon-secret")
    daemon.add(stdio_spec("envy", env={"MINE": "yes"}))
    with daemon.client() as c:

        def env(name: str) -> str:
            return str(c.call_tool("envy", "env", {"name": name}).content[0]["text"])

        assert env("MINE") == "yes"
        assert env("MEMORIZZ_MCP_ENCRYPTION_KEY") == "<unset>"
        assert env("PATH") != "<unset>"


def test_server_stderr_is_logged_line_by_line_under_its_name(
    stdio_daemon: DaemonHarness, caplog: pytest.LogCaptureFixture
) -> None:
    with (
        caplog.at_level("INFO", logger="memorizzd.upstream.stderr"),
        stdio_daemon.client() as c,
    ):
        assert c.call_tool("t", "shout", {"text": "hey"}).content[0]["text"] == "HEY"
        wait_until(
            lambda: "t: shouting: hey" in caplog.messages, what="the stderr line"
        )


def test_listings_follow_cursors_to_the_end_within_a_bound(base_dir: str) -> None:
    from tests.harness import LEGACY_SERVER, daemon_config

    def paged(name: str, pages: int) -> ServerSpec:
        return stdio_spec(name, args=[LEGACY_SERVER], env={"PAGES": str(pages)})

    config = daemon_config(
        base_dir, servers=[paged("five", 5), paged("many", 50)], list_page_limit=10
    )
    with DaemonHarness.running(config) as harness:
        harness.wait_ready("five")
        with harness.client() as c:
            names = [t.name for t in c.list_tools("five", refresh=True)]
            assert names == ["hello", "p2", "p3", "p4", "p5"]
            assert c.server_status("five")[0].tool_count == 5
            with pytest.raises(UpstreamError) as err:
                c.list_tools("many", refresh=True)
            assert "more than 10 pages" in err.value.message


def test_servers_list_shows_the_policy_settings(daemon: DaemonHarness) -> None:
    spec = light_spec(
        "p", block_tools=["crash"], require_approval=True, risk={"echo": "read"}
    )
    with daemon.client() as c:
        c.add_server(spec)
        (info,) = c.list_servers()
    assert (info.block_tools, info.require_approval, info.risk) == (
        ["crash"],
        True,
        {"echo": "read"},
    )
    assert info.command is not None
    assert os.path.isabs(info.command)
