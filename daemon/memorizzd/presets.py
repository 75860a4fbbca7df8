"""Built-in presets: the reviewed tool-risk catalog.

The catalog gives the risk class of well-known memory providers' tools by
name, reviewed by hand against each provider's documentation. It is the first
source of a tool's risk (see ``memorizzd.policy``); MCP annotations can raise
a catalog class, never lower it, so a server that marks a deleting tool
``readOnlyHint: true`` gets no further than its catalog entry.

Which provider a server is: its ``provider hint`` (the upstream's
``serverInfo.name`` and, for HTTP servers, the URL's host, lower-cased) is
matched against each provider's ``markers`` as substrings; ``_`` and spaces
count as ``-``. For example ``serverInfo.name = "neo4j-agent-memory"`` or a URL
on ``mcp.supermemory.ai`` identify those providers.

How a tool name is looked up (``catalog_risk``):

1. The identified providers' exact names and patterns. More than one provider
   identified (an odd name such as ``mem0-supermemory-bridge``): the highest
   class any of them gives.
2. Otherwise (no provider identified, or none of the identified ones lists the
   name), the exact names of every provider: a name that only one provider
   lists, or that all list alike, gets that class; a name two providers class
   differently gets the higher one (``add_memory``: Mem0 and Zep ``write``,
   Supermemory ``destructive``, so an unidentified server's ``add_memory`` is
   ``destructive``). Fail safe.
3. Patterns (``fnmatch`` globs) apply only to an identified provider: they are
   there for a provider's future tools, and would be guesses about anyone
   else's.
4. Not listed: ``None`` (the policy goes on to operator overrides and
   annotations).

Zep's "``_in`` variants" are read as the same tool names with an ``_in``
suffix (``search_graph_in``, ``list_episodes_in`` ...): the variants that take
an explicit graph to act in instead of the user's own.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from types import MappingProxyType
from typing import Final
from urllib.parse import urlsplit

from memorizz.api.methods import Risk

RISK_ORDER: Final[Mapping[Risk, int]] = MappingProxyType(
    {"read": 0, "write": 1, "destructive": 2}
)


def higher(a: Risk, b: Risk) -> Risk:
    """The riskier of two classes."""
    return a if RISK_ORDER[a] >= RISK_ORDER[b] else b


@dataclass(frozen=True)
class ProviderCatalog:
    """One provider's reviewed tools."""

    provider: str
    markers: tuple[str, ...]
    """Substrings of the provider hint that identify this provider."""
    tools: Mapping[str, Risk]
    """Exact tool names."""
    patterns: tuple[tuple[str, Risk], ...] = field(default=())
    """``fnmatch`` globs for the provider's tools not named above; when several
    match, the highest class wins."""
    agnostic: bool = True
    """Its exact names count for servers no provider identifies (step 2 of
    ``catalog_risk``); off for providers whose tool names are generic
    (``search``, ``list_events``): they say nothing about anyone else's."""

    def risk(self, tool: str) -> Risk | None:
        found = self.tools.get(tool)
        if found is not None:
            return found
        for pattern, risk in self.patterns:
            if fnmatchcase(tool, pattern):
                found = risk if found is None else higher(found, risk)
        return found


def _tools(
    *,
    read: Iterable[str] = (),
    write: Iterable[str] = (),
    destructive: Iterable[str] = (),
) -> Mapping[str, Risk]:
    classes: tuple[tuple[Iterable[str], Risk], ...] = (
        (read, "read"),
        (write, "write"),
        (destructive, "destructive"),
    )
    return MappingProxyType({name: risk for names, risk in classes for name in names})


_ZEP_READ: Final = (
    "search_graph",
    "get_user_summary",
    "get_subgraph",
    "get_node_neighbors",
    "list_episodes",
    "list_graphs",
)

CATALOG: Final[tuple[ProviderCatalog, ...]] = (
    ProviderCatalog(
        provider="mem0",
        markers=("mem0", "openmemory"),
        tools=_tools(
            read=("search_memories", "get_memories", "list_events"),
            write=("add_memory", "update_memory"),
            destructive=("delete_memory", "delete_all_memories", "delete_entities"),
        ),
    ),
    ProviderCatalog(
        provider="supermemory",
        markers=("supermemory",),
        # add_memory both saves and forgets (its action argument), so it is
        # as risky as the worse of the two.
        tools=_tools(
            read=("search_memory", "get_profile"),
            destructive=("add_memory",),
        ),
    ),
    ProviderCatalog(
        provider="cognee",
        markers=("cognee",),
        # cognee-mcp's names, also the daemon's Cognee Cloud bridge
        # (memorizzd.upstream.cognee); forget deletes a dataset, an item or all.
        tools=_tools(read=("recall",), write=("remember",), destructive=("forget",)),
    ),
    ProviderCatalog(
        provider="zep",
        markers=("zep",),
        tools=_tools(
            read=(*_ZEP_READ, *(f"{name}_in" for name in _ZEP_READ)),
            write=("add_memory", "add_memory_to_graph"),
        ),
    ),
    ProviderCatalog(
        provider="neo4j-agent-memory",
        markers=("neo4j-agent-memory",),
        # The memory_* tools of neo4j-labs/agent-memory (core, extended and
        # NAMS Platinum profiles, Python and TypeScript servers), split as the
        # server itself annotates them.
        tools=_tools(
            read=(
                "memory_search",
                "memory_search_messages",
                "memory_search_entities",
                "memory_get_context",
                "memory_get_conversation",
                "memory_get_entity",
                "memory_get_entity_history",
                "memory_get_entity_provenance",
                "memory_get_observations",
                "memory_get_reflections",
                "memory_get_trace",
                "memory_list_sessions",
                "memory_export_graph",
                "memory_explain_decision",
                "memory_health",
            ),
            write=(
                "memory_store_message",
                "memory_add_messages",
                "memory_add_entity",
                "memory_add_preference",
                "memory_add_fact",
                "memory_create_conversation",
                "memory_create_relationship",
                "memory_start_trace",
                "memory_record_step",
                "memory_record_tool_call",
                "memory_complete_trace",
                "memory_set_entity_feedback",
            ),
        ),
        patterns=(
            ("memory_search*", "read"),
            ("memory_get_*", "read"),
            ("memory_list_*", "read"),
            ("memory_export_*", "read"),
            ("memory_add_*", "write"),
            ("memory_store_*", "write"),
            ("memory_create_*", "write"),
            ("memory_update_*", "write"),
            ("memory_record_*", "write"),
            ("memory_set_*", "write"),
            ("memory_*delete*", "destructive"),
            ("memory_*forget*", "destructive"),
            ("memory_*clear*", "destructive"),
            ("memory_*remove*", "destructive"),
            ("memory_*purge*", "destructive"),
            ("memory_*reset*", "destructive"),
        ),
    ),
    ProviderCatalog(
        provider="honcho",
        markers=("honcho",),
        # The hosted server's documented tools (mcp.honcho.dev); chat asks
        # Honcho's reasoning about a peer and stores nothing.
        tools=_tools(
            read=("inspect_workspace", "list_workspaces", "search", "chat"),
            write=(
                "create_session",
                "create_peer",
                "add_peers_to_session",
                "add_messages_to_session",
            ),
        ),
        patterns=(
            ("get_*", "read"),
            ("list_*", "read"),
            ("search*", "read"),
            ("inspect_*", "read"),
            ("create_*", "write"),
            ("add_*", "write"),
            ("update_*", "write"),
            ("set_*", "write"),
            ("*delete*", "destructive"),
            ("*remove*", "destructive"),
        ),
        agnostic=False,
    ),
    ProviderCatalog(
        provider="notion",
        markers=("notion",),
        # The hosted server's tools (mcp.notion.com); nothing it documents
        # deletes (pages are moved, never removed).
        tools=_tools(
            read=(
                "notion-search",
                "notion-fetch",
                "notion-get-comments",
                "notion-get-teams",
                "notion-get-users",
                "notion-get-user",
                "notion-get-self",
                "notion-list-agents",
            ),
            write=(
                "notion-create-pages",
                "notion-update-page",
                "notion-move-pages",
                "notion-duplicate-page",
                "notion-create-database",
                "notion-update-database",
                "notion-create-comment",
            ),
        ),
        patterns=(
            ("notion-get-*", "read"),
            ("notion-list-*", "read"),
            ("notion-query-*", "read"),
            ("notion-*delete*", "destructive"),
        ),
    ),
    ProviderCatalog(
        provider="google-calendar",
        markers=("calendarmcp", "google-calendar"),
        tools=_tools(
            read=(
                "list_calendars",
                "list_events",
                "search_events",
                "get_event",
                "suggest_time",
            ),
            write=("create_event", "update_event", "respond_to_event"),
            destructive=("delete_event",),
        ),
        agnostic=False,
    ),
)


def _agnostic(catalog: Iterable[ProviderCatalog]) -> Mapping[str, Risk]:
    """Every exact name, at the highest class any provider gives it."""
    table: dict[str, Risk] = {}
    for entry in catalog:
        if not entry.agnostic:
            continue
        for name, risk in entry.tools.items():
            known = table.get(name)
            table[name] = risk if known is None else higher(known, risk)
    return MappingProxyType(table)


ANY_PROVIDER: Final[Mapping[str, Risk]] = _agnostic(CATALOG)


def catalog_named(
    provider: str, catalog: Iterable[ProviderCatalog] = CATALOG
) -> ProviderCatalog | None:
    """The catalog entry of ``provider`` (a preset's ``provider``)."""
    return next((p for p in catalog if p.provider == provider), None)


def preset_tools(provider: str) -> dict[str, Risk]:
    """A provider's documented tools by name, with their classes."""
    entry = catalog_named(provider)
    return {} if entry is None else dict(entry.tools)


def provider_hint(server_name: str | None, url: str | None = None) -> str:
    """What identifies a server's provider: its serverInfo name and URL host."""
    parts = [server_name or ""]
    if url:
        try:
            parts.append(urlsplit(url).hostname or "")
        except ValueError:
            pass
    return " ".join(parts).lower().replace("_", "-").replace(" ", "-")


def providers_for(
    hint: str, catalog: Iterable[ProviderCatalog] = CATALOG
) -> tuple[ProviderCatalog, ...]:
    """The catalog entries whose markers occur in the hint."""
    if not hint:
        return ()
    return tuple(p for p in catalog if any(mark in hint for mark in p.markers))


def catalog_risk(
    tool: str,
    providers: Iterable[ProviderCatalog],
    *,
    any_provider: Mapping[str, Risk] = ANY_PROVIDER,
) -> Risk | None:
    """The catalog's class for ``tool`` on a server identified as ``providers``
    (see the module docstring for the order); ``None`` when it is not listed."""
    found: Risk | None = None
    for entry in providers:
        risk = entry.risk(tool)
        if risk is not None:
            found = risk if found is None else higher(found, risk)
    if found is not None:
        return found
    return any_provider.get(tool)
