"""Tool policy: visibility, risk classes, decisions, and the reviewed catalog.

Pure unit tests of memorizzd.policy and memorizzd.presets, then end to end over
the real test server (tests/mcp_server.py) through the in-process daemon.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from memorizz.api import methods as m
from memorizz.api.errors import (
    ApprovalRequiredError,
    ErrorCode,
    PermissionDeniedError,
    UpstreamError,
)
from memorizzd.config import Decisions
from memorizzd.policy import (
    ToolPolicy,
    ToolVerdict,
    annotation_risk,
    decision_for,
    refusal,
    risk_of,
    tool_visible,
)
from memorizzd.presets import (
    ANY_PROVIDER,
    CATALOG,
    catalog_risk,
    provider_hint,
    providers_for,
)
from tests.harness import (
    LEGACY_SERVER,
    DaemonHarness,
    daemon_config,
    rmtree,
    short_tempdir,
    stdio_spec,
)

# --- visibility ----------------------------------------------------------------


def test_no_lists_show_every_tool() -> None:
    assert tool_visible("anything", [], [])


def test_allow_tools_keeps_only_matching_names() -> None:
    allow = ["search_*", "get_profile"]
    assert tool_visible("search_memory", allow, [])
    assert tool_visible("get_profile", allow, [])
    assert not tool_visible("get_profiles", allow, [])
    assert not tool_visible("delete_memory", allow, [])


def test_block_tools_wins_over_allow_tools() -> None:
    assert not tool_visible("delete_memory", ["*"], ["delete_*"])
    assert not tool_visible("delete_memory", [], ["delete_*"])
    assert tool_visible("add_memory", ["*"], ["delete_*"])


def test_globs_are_case_sensitive_and_whole_name() -> None:
    assert tool_visible("Delete_memory", [], ["delete_*"])
    assert tool_visible("undelete_memory", [], ["delete_*"])
    assert not tool_visible("undelete_memory", [], ["*delete*"])
    assert not tool_visible("x1", [], ["x?"])


# --- risk ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("annotations", "expected"),
    [
        (None, None),
        ({}, None),
        ({"title": "Search"}, None),
        ({"readOnlyHint": True}, "read"),
        ({"readOnlyHint": True, "destructiveHint": False}, "read"),
        ({"destructiveHint": True}, "destructive"),
        # contradictory hints get the riskier reading
        ({"readOnlyHint": True, "destructiveHint": True}, "destructive"),
        # MCP's default destructiveHint (true) is not applied: only explicit values count
        ({"readOnlyHint": False}, "write"),
        ({"destructiveHint": False}, "write"),
        ({"readOnlyHint": False, "destructiveHint": False}, "write"),
        ({"idempotentHint": True, "openWorldHint": False}, None),
        # not a boolean: no information
        ({"readOnlyHint": "true"}, None),
        ({"destructiveHint": 1}, None),
    ],
)
def test_annotation_risk(
    annotations: dict[str, Any] | None, expected: m.Risk | None
) -> None:
    assert annotation_risk(annotations) == expected


def test_no_information_is_write() -> None:
    assert risk_of(None, catalog_risk=None, operator_risk=None) == "write"
    assert risk_of({}, catalog_risk=None, operator_risk=None) == "write"


def test_annotations_alone_classify_an_uncatalogued_tool() -> None:
    read_only = {"readOnlyHint": True}
    destructive = {"destructiveHint": True}
    assert risk_of(read_only, catalog_risk=None, operator_risk=None) == "read"
    assert risk_of(destructive, catalog_risk=None, operator_risk=None) == "destructive"


def test_annotations_never_downgrade_the_catalog() -> None:
    lying = {"readOnlyHint": True}
    assert risk_of(lying, catalog_risk="destructive", operator_risk=None) == (
        "destructive"
    )
    assert risk_of(lying, catalog_risk="write", operator_risk=None) == "write"
    assert risk_of(lying, catalog_risk="read", operator_risk=None) == "read"


def test_annotations_may_raise_the_catalog() -> None:
    assert (
        risk_of({"destructiveHint": True}, catalog_risk="write", operator_risk=None)
        == "destructive"
    )
    assert (
        risk_of({"readOnlyHint": False}, catalog_risk="read", operator_risk=None)
        == "write"
    )


def test_the_operator_override_is_final() -> None:
    destructive = {"destructiveHint": True}
    assert risk_of(None, catalog_risk="destructive", operator_risk="read") == "read"
    assert risk_of(destructive, catalog_risk=None, operator_risk="write") == "write"
    assert (
        risk_of(
            {"readOnlyHint": True}, catalog_risk="read", operator_risk="destructive"
        )
        == "destructive"
    )


# --- decisions -----------------------------------------------------------------------


def test_default_decisions() -> None:
    defaults = Decisions()
    assert decision_for("read", decisions=defaults, require_approval=False) == "allow"
    assert decision_for("write", decisions=defaults, require_approval=False) == "allow"
    assert (
        decision_for("destructive", decisions=defaults, require_approval=False) == "ask"
    )


def test_require_approval_makes_write_and_destructive_ask() -> None:
    defaults = Decisions()
    assert decision_for("read", decisions=defaults, require_approval=True) == "allow"
    assert decision_for("write", decisions=defaults, require_approval=True) == "ask"
    assert (
        decision_for("destructive", decisions=defaults, require_approval=True) == "ask"
    )


def test_require_approval_never_loosens_a_deny() -> None:
    strict = Decisions(read="deny", write="deny", destructive="deny")
    for risk in ("read", "write", "destructive"):
        assert decision_for(risk, decisions=strict, require_approval=True) == "deny"


def test_configured_decisions_apply_per_class() -> None:
    table = Decisions(read="ask", write="deny", destructive="allow")
    assert decision_for("read", decisions=table, require_approval=False) == "ask"
    assert decision_for("write", decisions=table, require_approval=False) == "deny"
    assert (
        decision_for("destructive", decisions=table, require_approval=False) == "allow"
    )
    assert decision_for("destructive", decisions=table, require_approval=True) == "ask"


# --- the catalog ------------------------------------------------------------------


def _risk(tool: str, server_name: str | None, url: str | None = None) -> m.Risk | None:
    return catalog_risk(tool, providers_for(provider_hint(server_name, url)))


@pytest.mark.parametrize(
    ("server_name", "tool", "expected"),
    [
        ("mem0-mcp", "search_memories", "read"),
        ("mem0-mcp", "get_memories", "read"),
        ("mem0-mcp", "list_events", "read"),
        ("mem0-mcp", "add_memory", "write"),
        ("mem0-mcp", "update_memory", "write"),
        ("mem0-mcp", "delete_memory", "destructive"),
        ("mem0-mcp", "delete_all_memories", "destructive"),
        ("mem0-mcp", "delete_entities", "destructive"),
        ("supermemory", "search_memory", "read"),
        ("supermemory", "get_profile", "read"),
        ("supermemory", "add_memory", "destructive"),
        ("cognee", "recall", "read"),
        ("cognee", "remember", "write"),
        ("cognee", "forget", "destructive"),
        ("Zep Memory", "search_graph", "read"),
        ("Zep Memory", "get_user_summary", "read"),
        ("Zep Memory", "get_subgraph", "read"),
        ("Zep Memory", "get_node_neighbors", "read"),
        ("Zep Memory", "list_episodes", "read"),
        ("Zep Memory", "list_graphs", "read"),
        ("Zep Memory", "search_graph_in", "read"),
        ("Zep Memory", "get_user_summary_in", "read"),
        ("Zep Memory", "get_subgraph_in", "read"),
        ("Zep Memory", "get_node_neighbors_in", "read"),
        ("Zep Memory", "list_episodes_in", "read"),
        ("Zep Memory", "list_graphs_in", "read"),
        ("Zep Memory", "add_memory", "write"),
        ("Zep Memory", "add_memory_to_graph", "write"),
        ("neo4j-agent-memory", "memory_search", "read"),
        ("neo4j-agent-memory", "memory_get_context", "read"),
        ("neo4j-agent-memory", "memory_list_sessions", "read"),
        ("neo4j-agent-memory", "memory_export_graph", "read"),
        ("neo4j-agent-memory", "memory_store_message", "write"),
        ("neo4j-agent-memory", "memory_add_entity", "write"),
        ("neo4j-agent-memory", "memory_create_relationship", "write"),
        ("neo4j-agent-memory", "memory_record_step", "write"),
    ],
)
def test_the_catalog_as_the_issue_lists_it(
    server_name: str, tool: str, expected: m.Risk
) -> None:
    assert _risk(tool, server_name) == expected


def test_the_add_memory_clash_is_resolved_by_provider_else_fails_safe() -> None:
    assert _risk("add_memory", "mem0") == "write"
    assert _risk("add_memory", "zep") == "write"
    assert _risk("add_memory", "supermemory-mcp") == "destructive"
    # an unknown provider gets the higher class of the two readings
    assert _risk("add_memory", "some-memory-server") == "destructive"
    assert _risk("add_memory", None) == "destructive"
    assert ANY_PROVIDER["add_memory"] == "destructive"
    # two providers identified at once: the higher class too
    assert _risk("add_memory", "mem0-supermemory-bridge") == "destructive"


def test_unambiguous_names_apply_to_an_unknown_provider() -> None:
    assert _risk("delete_all_memories", "memorizz-test-server") == "destructive"
    assert _risk("search_memories", None) == "read"
    assert _risk("forget", "anything") == "destructive"
    assert _risk("echo", "anything") is None


def test_the_provider_is_found_by_server_info_name_or_url_host() -> None:
    assert [p.provider for p in providers_for(provider_hint("Neo4j_Agent_Memory"))] == [
        "neo4j-agent-memory"
    ]
    hint = provider_hint("remote", "https://mcp.supermemory.ai/mcp")
    assert [p.provider for p in providers_for(hint)] == ["supermemory"]
    assert providers_for(provider_hint(None, "https://example.com/mcp")) == ()
    assert providers_for(provider_hint(None, "not a url [")) == ()


def test_patterns_cover_a_providers_unlisted_tools_only_when_identified() -> None:
    assert _risk("memory_get_something_new", "neo4j-agent-memory") == "read"
    assert _risk("memory_delete_entity", "neo4j-agent-memory") == "destructive"
    assert _risk("memory_get_and_delete", "neo4j-agent-memory") == "destructive"
    assert _risk("memory_update_entity", "neo4j-agent-memory") == "write"
    assert _risk("memory_frobnicate", "neo4j-agent-memory") is None
    # someone else's memory_* tools are not guessed at
    assert _risk("memory_get_something_new", "other-server") is None
    assert _risk("memory_delete_entity", "other-server") is None


def test_the_catalog_is_consistent() -> None:
    names = [p.provider for p in CATALOG]
    assert len(names) == len(set(names))
    for provider in CATALOG:
        assert provider.markers
        assert all(m == m.lower() for m in provider.markers)
        assert set(provider.tools.values()) <= {"read", "write", "destructive"}


# --- one server's policy -------------------------------------------------------------


def _tool(name: str, **annotations: Any) -> m.Tool:
    return m.Tool(
        name=name, input_schema={"type": "object"}, annotations=annotations or None
    )


def test_a_view_annotates_visible_tools_and_decides_hidden_ones() -> None:
    spec = stdio_spec("t", block_tools=["hidden*"], risk={"echo": "read"})
    policy = ToolPolicy.for_server(spec, Decisions(), server_name="mem0")
    upstream_says = m.Tool(
        name="smuggled", input_schema={}, risk="read", decision="allow"
    )
    view = policy.view(
        [
            _tool("echo"),
            _tool("add_memory", readOnlyHint=True),
            _tool("hidden_one"),
            _tool("wipe", destructiveHint=True),
            upstream_says,
        ]
    )
    shown = {t.name: (t.risk, t.decision) for t in view.tools}
    assert shown == {
        "echo": ("read", "allow"),
        "add_memory": ("write", "allow"),
        "wipe": ("destructive", "ask"),
        "smuggled": ("write", "allow"),  # what the upstream put there is replaced
    }
    assert view.verdict("hidden_one") == ToolVerdict("write", "deny", blocked=True)
    # not in the listing: decided by name alone
    assert view.verdict("nope") == ToolVerdict("write", "allow")
    assert view.verdict("hidden_too").blocked
    assert view.verdict("delete_memory") == ToolVerdict("destructive", "ask")


def test_a_name_listed_twice_gets_the_stricter_verdict() -> None:
    policy = ToolPolicy.for_server(stdio_spec("t"), Decisions(), server_name=None)
    view = policy.view(
        [_tool("x", readOnlyHint=True), _tool("x", destructiveHint=True)]
    )
    assert view.verdict("x") == ToolVerdict("destructive", "ask")
    assert [(t.risk, t.decision) for t in view.tools] == [("destructive", "ask")] * 2


def test_refusals_carry_stable_reasons() -> None:
    blocked = refusal(ToolVerdict("read", "deny", blocked=True), server="s", tool="t")
    assert isinstance(blocked, PermissionDeniedError)
    assert blocked.reason == "tool_blocked"
    assert "blocked" in blocked.message
    denied = refusal(ToolVerdict("write", "deny"), server="s", tool="t")
    assert isinstance(denied, PermissionDeniedError)
    assert denied.reason == "tool_blocked"
    assert denied.data == {
        "server": "s",
        "tool": "t",
        "risk": "write",
        "decision": "deny",
    }
    ask = refusal(ToolVerdict("destructive", "ask"), server="s", tool="t")
    assert isinstance(ask, ApprovalRequiredError)
    assert ask.code == ErrorCode.APPROVAL_REQUIRED
    assert int(ask.code) == -32009
    assert ask.reason == "approval_required"
    assert ask.message.startswith("t on s is destructive; it needs an operator's")
    with pytest.raises(ValueError, match="nothing to refuse"):
        refusal(ToolVerdict("read", "allow"), server="s", tool="t")


# --- end to end, over a real upstream ------------------------------------------------

SERVERS = [
    stdio_spec("plain"),
    stdio_spec("blocking", block_tools=["crash", "spawn_*", "delete_*"]),
    stdio_spec(
        "allowing", allow_tools=["echo", "add*", "crash"], block_tools=["crash"]
    ),
    stdio_spec("approving", require_approval=True),
    stdio_spec(
        "overriding",
        risk={
            "echo": "read",
            "annotated_destroy": "write",
            "annotated_read": "destructive",
            "delete_all_memories": "read",
        },
        require_approval=True,
    ),
]


@pytest.fixture(scope="module")
def policy_daemon() -> Iterator[DaemonHarness]:
    """One daemon, one warm test server per policy flavour."""
    base = short_tempdir()
    try:
        with DaemonHarness.running(daemon_config(base, servers=SERVERS)) as harness:
            for spec in SERVERS:
                harness.wait_ready(spec.name)
            yield harness
    finally:
        rmtree(base)


def _listing(harness: DaemonHarness, server: str) -> dict[str, tuple[Any, Any]]:
    with harness.client() as c:
        return {t.name: (t.risk, t.decision) for t in c.list_tools(server)}


def test_tools_list_shows_risk_and_decision(policy_daemon: DaemonHarness) -> None:
    tools = _listing(policy_daemon, "plain")
    assert tools["echo"] == ("write", "allow")  # no information: write
    assert tools["search_memories"] == ("read", "allow")  # the catalog
    assert tools["annotated_read"] == ("read", "allow")  # readOnlyHint
    assert tools["annotated_destroy"] == ("destructive", "ask")  # destructiveHint
    # the catalog wins over a lying readOnlyHint
    assert tools["delete_all_memories"] == ("destructive", "ask")
    # an ambiguous catalog name on an unidentified provider: the higher class
    assert tools["add_memory"] == ("destructive", "ask")
    assert all(risk and decision for risk, decision in tools.values())
    with policy_daemon.client() as c:
        refreshed = {
            t.name: (t.risk, t.decision) for t in c.list_tools("plain", refresh=True)
        }
    assert refreshed == tools


def test_decisions_are_applied_to_calls(policy_daemon: DaemonHarness) -> None:
    with policy_daemon.client() as c:
        assert c.call_tool("plain", "annotated_read", {}).content[0]["text"] == "read"
        assert c.call_tool("plain", "echo", {"text": "hi"}).content[0]["text"] == "hi"
        before = c.server_status("plain")[0]
        for tool in ("delete_all_memories", "annotated_destroy", "add_memory"):
            with pytest.raises(ApprovalRequiredError) as err:
                c.call_tool("plain", tool, {"text": "x"})
            assert err.value.code == -32009
            assert err.value.reason == "approval_required"
            assert err.value.data["risk"] == "destructive"
            assert f"{tool} on plain is destructive" in err.value.message
            assert "approval" in err.value.message
        after = c.server_status("plain")[0]
    # refused calls never reached the server
    assert (after.calls_ok, after.calls_failed) == (
        before.calls_ok,
        before.calls_failed,
    )


def test_an_unknown_tool_is_write_and_goes_to_the_upstream(
    policy_daemon: DaemonHarness,
) -> None:
    upstream = policy_daemon.daemon.pool.get("plain")
    with policy_daemon.client() as c:
        result = c.call_tool("plain", "no_such_tool", {})
    assert result.is_error  # the upstream answered it as an unknown tool
    assert upstream.cached_verdict("no_such_tool") == ToolVerdict("write", "allow")
    # on a server where write asks, an unknown tool asks too
    with policy_daemon.client() as c, pytest.raises(ApprovalRequiredError):
        c.call_tool("approving", "no_such_tool", {})


def test_blocked_tools_are_hidden_and_refused_without_calling_the_upstream(
    policy_daemon: DaemonHarness,
) -> None:
    tools = _listing(policy_daemon, "blocking")
    assert "echo" in tools
    assert not {"crash", "spawn_child", "delete_all_memories"} & tools.keys()
    with policy_daemon.client() as c:
        before = c.server_status("blocking")[0]
        for tool in ("crash", "spawn_child", "delete_all_memories", "delete_x"):
            with pytest.raises(PermissionDeniedError) as err:
                c.call_tool("blocking", tool, {})
            assert err.value.reason == "tool_blocked"
            assert err.value.data["decision"] == "deny"
        after = c.server_status("blocking")[0]
        # crash would have killed the server: it is still the same process
        assert after.state == "ready"
        assert after.pid == before.pid
        assert after.restarts == before.restarts
        assert (after.calls_ok, after.calls_failed) == (
            before.calls_ok,
            before.calls_failed,
        )
        assert c.call_tool("blocking", "echo", {"text": "ok"}).is_error is False


def test_allow_tools_filters_the_listing(policy_daemon: DaemonHarness) -> None:
    tools = _listing(policy_daemon, "allowing")
    assert set(tools) == {"echo", "add", "add_memory"}  # crash: block wins
    with policy_daemon.client() as c:
        assert c.server_status("allowing")[0].tool_count == 3
        assert c.test_server("allowing").tool_count == 3
        assert c.call_tool("allowing", "add", {"a": 1, "b": 2}).is_error is False
        for tool in ("pid", "crash", "no_such_tool"):
            with pytest.raises(PermissionDeniedError) as err:
                c.call_tool("allowing", tool, {})
            assert err.value.reason == "tool_blocked"


def test_require_approval_makes_write_ask(policy_daemon: DaemonHarness) -> None:
    tools = _listing(policy_daemon, "approving")
    assert tools["echo"] == ("write", "ask")
    assert tools["annotated_read"] == ("read", "allow")
    assert tools["annotated_destroy"] == ("destructive", "ask")
    with policy_daemon.client() as c:
        with pytest.raises(ApprovalRequiredError) as err:
            c.call_tool("approving", "echo", {"text": "x"})
        assert "echo on approving is write" in err.value.message
        assert c.call_tool("approving", "annotated_read", {}).is_error is False


def test_the_operator_risk_override_is_respected(policy_daemon: DaemonHarness) -> None:
    tools = _listing(policy_daemon, "overriding")
    assert tools["echo"] == ("read", "allow")
    assert tools["annotated_destroy"] == ("write", "ask")  # over destructiveHint
    assert tools["annotated_read"] == ("destructive", "ask")  # over readOnlyHint
    assert tools["delete_all_memories"] == ("read", "allow")  # over the catalog
    assert tools["add"] == ("write", "ask")
    with policy_daemon.client() as c:
        assert c.call_tool("overriding", "echo", {"text": "x"}).is_error is False
        assert c.call_tool("overriding", "delete_all_memories", {}).is_error is False
        with pytest.raises(ApprovalRequiredError):
            c.call_tool("overriding", "annotated_read", {})


def test_a_call_after_the_cache_is_dropped_fetches_the_listing_first(
    policy_daemon: DaemonHarness,
) -> None:
    upstream = policy_daemon.daemon.pool.get("plain")

    async def drop() -> None:
        # What a tools/list_changed notification does first (the relist that
        # follows it is not waited for here: the call must not need it).
        upstream._tools.invalidate()

    policy_daemon.portal.call(drop)
    assert upstream.cached_verdict("annotated_destroy") is None
    with policy_daemon.client() as c, pytest.raises(ApprovalRequiredError):
        c.call_tool("plain", "annotated_destroy", {})
    assert upstream.cached_verdict("annotated_destroy") == ToolVerdict(
        "destructive", "ask"
    )


def test_mcp_tools_table_has_risk_and_decision_columns(
    policy_daemon: DaemonHarness, capsys: pytest.CaptureFixture[str]
) -> None:
    assert policy_daemon.ctl("mcp", "tools", "plain") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["NAME", "RISK", "DECISION", "DESCRIPTION"]
    rows = {line.split()[0]: line.split()[1:3] for line in lines[1:]}
    assert rows["delete_all_memories"] == ["destructive", "ask"]
    assert rows["annotated_read"] == ["read", "allow"]
    assert rows["echo"] == ["write", "allow"]


def test_a_deny_decision_refuses_with_tool_blocked(base_dir: str) -> None:
    config = daemon_config(
        base_dir,
        servers=[stdio_spec("t")],
        decisions=Decisions(write="deny", destructive="deny"),
    )
    with DaemonHarness.running(config) as harness:
        harness.wait_ready("t")
        tools = _listing(harness, "t")
        assert tools["echo"] == ("write", "deny")  # listed: deny is not hidden
        assert tools["annotated_read"] == ("read", "allow")
        with harness.client() as c:
            for tool in ("echo", "annotated_destroy"):
                with pytest.raises(PermissionDeniedError) as err:
                    c.call_tool("t", tool, {"text": "x"})
                assert err.value.reason == "tool_blocked"
                assert "[decisions] denies" in err.value.message
            assert c.call_tool("t", "annotated_read", {}).is_error is False


def test_no_listing_to_decide_on_fails_the_call_closed(base_dir: str) -> None:
    """A server whose tools/list fails gets no call through: no annotations,
    no decision."""
    log = os.path.join(base_dir, "methods.log")
    spec = stdio_spec(
        "pages", args=[LEGACY_SERVER], env={"PAGES": "50", "METHOD_LOG": log}
    )
    config = daemon_config(base_dir, servers=[spec], list_page_limit=10)
    with DaemonHarness.running(config) as harness:
        harness.wait_ready("pages")
        with harness.client() as c:
            with pytest.raises(UpstreamError) as err:
                c.call_tool("pages", "hello", {})
            assert "more than 10 pages" in err.value.message
    with open(log, encoding="utf-8") as f:
        methods = f.read().split()
    assert "tools/list" in methods
    assert "tools/call" not in methods
