"""``memorizzctl mcp add --allow-tool / --block-tool`` against a real daemon.

The options map to the spec's ``allow_tools`` and ``block_tools`` (globs;
each option repeatable, its values accumulating): on a plain stdio test
server (tests/mcp_server.py) they decide what ``mcp tools`` lists; on the
``neo4j-memory-local`` preset (its command a local stand-in,
tests/neo4j_memory_server.py) an explicit ``--allow-tool`` replaces the
preset's allow-list (``only``) and ``--block-tool`` hides tools within it,
as docs/presets.md says. A name the spec check refuses is refused by the CLI
with the message ``servers/add`` gives for it. One daemon serves the module;
each test adds servers of its own names."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import msgspec
import pytest

from memorizz import cli
from memorizz.api import methods as m
from memorizz.api.errors import InvalidParamsError, PermissionDeniedError
from tests.harness import (
    MCP_SERVER,
    NEO4J_SERVER,
    DaemonHarness,
    command_options,
    daemon_config,
    rmtree,
    short_tempdir,
)
from tests.neo4j_memory_server import DOCUMENTED, EXTRA


@pytest.fixture(scope="module")
def daemon() -> Iterator[DaemonHarness]:
    base = short_tempdir()
    try:
        with DaemonHarness.running(daemon_config(base)) as d:
            yield d
    finally:
        rmtree(base)


def add_test_server(d: DaemonHarness, name: str, *options: str) -> int:
    """``mcp add NAME --command python --arg tests/mcp_server.py --arg stdio
    OPTIONS`` (forked by the zygote: ``command_options``); ready when it
    answers 0."""
    argv = command_options(MCP_SERVER, "stdio")
    code = d.ctl("mcp", "add", name, *argv, *options)
    if code == 0:
        d.wait_ready(name)
    return code


def listed(
    d: DaemonHarness, name: str, capsys: pytest.CaptureFixture[str]
) -> list[str]:
    """The tools ``memorizzctl --json mcp tools NAME`` lists, sorted."""
    capsys.readouterr()
    assert d.ctl("--json", "mcp", "tools", name) == 0
    result = msgspec.json.decode(capsys.readouterr().out, type=m.ToolsListResult)
    return sorted(t.name for t in result.tools)


def server_info(d: DaemonHarness, name: str) -> m.ServerInfo:
    with d.client() as c:
        (info,) = [s for s in c.list_servers() if s.name == name]
    return info


def test_allow_tool_leaves_only_the_named_tools(
    daemon: DaemonHarness, capsys: pytest.CaptureFixture[str]
) -> None:
    options = ("--allow-tool", "echo", "--allow-tool", "ad?")  # a glob too
    assert add_test_server(daemon, "allowing", *options) == 0
    assert server_info(daemon, "allowing").allow_tools == ["echo", "ad?"]
    assert listed(daemon, "allowing", capsys) == ["add", "echo"]
    with daemon.client() as c, pytest.raises(PermissionDeniedError) as blocked:
        c.call_tool("allowing", "pid", {})
    assert blocked.value.reason == "tool_blocked"


def test_block_tool_hides_the_named_tools(
    daemon: DaemonHarness, capsys: pytest.CaptureFixture[str]
) -> None:
    assert add_test_server(daemon, "plain") == 0
    everything = listed(daemon, "plain", capsys)
    assert {"crash", "slow", "echo"} <= set(everything)

    options = ("--block-tool", "crash", "--block-tool", "slo*")
    assert add_test_server(daemon, "blocking", *options) == 0
    assert server_info(daemon, "blocking").block_tools == ["crash", "slo*"]
    shown = listed(daemon, "blocking", capsys)
    assert shown == [t for t in everything if t != "crash" and t[:3] != "slo"]
    assert "slow" not in shown
    with daemon.client() as c, pytest.raises(PermissionDeniedError) as blocked:
        c.call_tool("blocking", "crash", {})
    assert blocked.value.reason == "tool_blocked"


def test_block_tool_wins_over_allow_tool(
    daemon: DaemonHarness, capsys: pytest.CaptureFixture[str]
) -> None:
    options = ("--allow-tool", "ech?", "--allow-tool", "add", "--block-tool", "echo")
    assert add_test_server(daemon, "both", *options) == 0
    assert listed(daemon, "both", capsys) == ["add"]


def test_allow_tool_replaces_a_presets_allow_list(
    daemon: DaemonHarness, capsys: pytest.CaptureFixture[str]
) -> None:
    preset = ("--preset", "neo4j-memory-local")
    command = command_options(NEO4J_SERVER)
    # The preset alone: its twelve tools, EXTRA hidden.
    assert daemon.ctl("mcp", "add", "nl0", *preset, *command) == 0
    daemon.wait_ready("nl0")
    assert listed(daemon, "nl0", capsys) == sorted(DOCUMENTED)

    # --allow-tool replaces the preset's list: EXTRA may be allowed back.
    allow = ("--allow-tool", "memory_search_*", "--allow-tool", EXTRA)
    assert daemon.ctl("mcp", "add", "nl1", *preset, *command, *allow) == 0
    daemon.wait_ready("nl1")
    assert listed(daemon, "nl1", capsys) == sorted(
        [EXTRA, "memory_search_entities", "memory_search_messages"]
    )
    assert server_info(daemon, "nl1").preset == "neo4j-memory-local"

    # --allow-tool '*' lifts it.
    assert daemon.ctl("mcp", "add", "nl2", *preset, *command, "--allow-tool", "*") == 0
    daemon.wait_ready("nl2")
    assert listed(daemon, "nl2", capsys) == sorted([*DOCUMENTED, EXTRA])

    # --block-tool alone keeps the preset's list and hides within it.
    block = ("--block-tool", "memory_add_entity")
    assert daemon.ctl("mcp", "add", "nl3", *preset, *command, *block) == 0
    daemon.wait_ready("nl3")
    assert listed(daemon, "nl3", capsys) == sorted(
        t for t in DOCUMENTED if t != "memory_add_entity"
    )


@pytest.mark.parametrize(
    ("option", "field"),
    [("--allow-tool", "allow_tools"), ("--block-tool", "block_tools")],
)
@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ("ec\0ho", "[1]: a NUL character is not allowed"),
        ("", ": an empty name matches no tool"),  # it hid every tool, silently
    ],
)
def test_a_name_the_spec_check_refuses_is_refused_alike(
    daemon: DaemonHarness,
    capsys: pytest.CaptureFixture[str],
    option: str,
    field: str,
    bad: str,
    says: str,
) -> None:
    name = f"bad-{field}"
    capsys.readouterr()
    code = add_test_server(daemon, name, option, "echo", option, bad)
    assert code == 2
    err = capsys.readouterr().err
    message = f"server {name!r}: {field}{says}"
    assert f"{message} (invalid_params)" in err
    names = ["echo", bad]
    spec = m.ServerSpec(
        name=name,
        transport="stdio",
        command=sys.executable,
        args=[MCP_SERVER, "stdio"],
        allow_tools=names if field == "allow_tools" else [],
        block_tools=names if field == "block_tools" else [],
    )
    with daemon.client() as c:
        with pytest.raises(InvalidParamsError) as refused:
            c.add_server(spec)
        assert refused.value.message == message
        assert name not in {s.name for s in c.list_servers()}


def test_mcp_add_help_lists_both(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["mcp", "add", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--allow-tool NAME" in out
    assert "--block-tool NAME" in out
