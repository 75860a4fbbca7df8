"""Connection presets: the hosted (and a few local) MCP servers, as reviewed data.

A preset is what it takes to connect to one provider's MCP server: the
endpoint and transport, the auth kind (and the one alternative it takes, if
any), the OAuth scopes and the authorization server its documentation names,
the tool allow-list, the tool arguments a configured workspace is projected
into, setup hints and the connection instructions agents are given. The
tools' risk classes are the daemon's reviewed catalog (``memorizzd.presets``,
the entry named by ``provider``), which ``presets/list`` joins in.

This module is the one copy: the daemon expands ``preset`` on ``servers/add``
and on every ``[[servers]]`` entry with it (``expand_preset``), and answers
``presets/list`` from it; ``memorizzctl`` asks the daemon for the list, so it
shows what this daemon will do.

How a spec and its preset combine (``apply_preset``): what the spec sets (any
field not at its default) wins; the preset fills the rest. Choosing an auth
other than the preset's (``notion`` with ``auth = "bearer"``) drops the
preset's OAuth settings. ``instructions`` unset (or ``true``) takes the
preset's text, a string replaces it, ``false`` turns it off.

Standard library, msgspec and the wire contract only; no secret, ever (a test
scans this data for anything that looks like a credential).
"""

from __future__ import annotations

from typing import Final, Literal

import msgspec

from memorizz.api.errors import InvalidParamsError
from memorizz.api.methods import AuthMode, Preset, ServerSpec

OAuthRegistration = Literal["dynamic", "pre_registered"]

_MEMORY_INSTRUCTIONS: Final = (
    "Long-term memory. Recall (search) before answering when the user refers to"
    " earlier work, their preferences or facts about people and projects; save"
    " only durable facts, decisions and preferences the user states or"
    " confirms, never secrets or one-off chatter. Forgetting needs the user's"
    " explicit request."
)

PRESETS: Final[tuple[Preset, ...]] = (
    Preset(
        name="notion",
        title="Notion (hosted MCP)",
        provider="notion",
        transport="streamable_http",
        url="https://mcp.notion.com/mcp",
        auth="oauth",
        auth_alternatives=["bearer"],
        oauth_registration="dynamic",
        setup=(
            "OAuth: `memorizzctl mcp login NAME` and approve the workspace pages"
            " in the browser (dynamic client registration, nothing to register"
            " first). Or --auth bearer --token - with an internal integration's"
            " token (notion.so/profile/integrations), shared with the pages it"
            " may see."
        ),
        instructions=(
            "Notion workspace. Search or fetch pages before answering questions"
            " about the user's notes, docs or projects; create or update pages"
            " only when the user asks to write something down there."
        ),
    ),
    Preset(
        name="google-calendar",
        title="Google Calendar (hosted MCP, Workspace)",
        provider="google-calendar",
        transport="streamable_http",
        url="https://calendarmcp.googleapis.com/mcp/v1",
        auth="oauth",
        oauth_registration="pre_registered",
        oauth_authorization_server="https://accounts.google.com",
        setup=(
            "Create an OAuth client (type: web application) in a Google Cloud"
            " project enrolled for the Workspace MCP servers, add the redirect"
            " URI `mcp add` prints to it, then --client-id ID --client-secret -"
            " (the secret goes to the vault) and `memorizzctl mcp login NAME`."
        ),
        instructions=(
            "The user's calendar. Look up events and free time before proposing"
            " or scheduling; create, change or answer events only when the user"
            " asks, and say what will change first."
        ),
    ),
    Preset(
        name="mem0",
        title="Mem0 (hosted MCP)",
        provider="mem0",
        transport="streamable_http",
        url="https://mcp.mem0.ai/mcp/",
        auth="bearer",
        setup=(
            "Create an API key at app.mem0.ai (API keys), then --token -"
            " (read from stdin, moved into the vault)."
        ),
        instructions=_MEMORY_INSTRUCTIONS,
    ),
    Preset(
        name="zep",
        title="Zep (hosted MCP)",
        provider="zep",
        transport="streamable_http",
        url="https://api.getzep.com/mcp",
        auth="oauth",
        oauth_registration="dynamic",
        oauth_authorization_server="https://api.getzep.com/v1/oauth",
        oauth_scopes=["graph:read", "graph:write"],
        setup=(
            "`memorizzctl mcp login NAME` (PKCE, dynamic registration). Access"
            " tokens live about five minutes; the daemon refreshes them itself."
        ),
        instructions=_MEMORY_INSTRUCTIONS,
    ),
    Preset(
        name="supermemory",
        title="Supermemory (hosted MCP)",
        provider="supermemory",
        transport="streamable_http",
        url="https://mcp.supermemory.ai/mcp",
        auth="oauth",
        oauth_registration="dynamic",
        oauth_authorization_server="https://api.supermemory.ai/api/auth",
        oauth_scopes=["openid", "profile", "email", "offline_access"],
        setup=(
            "`memorizzctl mcp login NAME`. Its add_memory can also forget, so"
            " it is classed destructive (asks by default)."
        ),
        instructions=_MEMORY_INSTRUCTIONS,
    ),
    Preset(
        name="honcho",
        title="Honcho (hosted MCP)",
        provider="honcho",
        transport="streamable_http",
        url="https://mcp.honcho.dev",
        auth="bearer",
        workspace_arguments=["workspace_id", "workspace"],
        setup=(
            "Create an API key at app.honcho.dev, then --token - and --workspace"
            " WORKSPACE: the workspace is set on every call of a tool that takes"
            " one (callers never choose it, and do not see the argument)."
        ),
        instructions=(
            "Honcho memory of the user and their sessions. Ask it (chat, search)"
            " about the user before personalising; add the turn's messages to"
            " the session after answering when the user wants them remembered."
        ),
    ),
    Preset(
        name="cognee",
        title="Cognee Cloud (the daemon's built-in bridge)",
        provider="cognee",
        transport="builtin",
        builtin="cognee",
        auth="bearer",
        setup=(
            "Cognee has no hosted MCP endpoint: the daemon speaks the Cognee"
            " Cloud API itself (remember, recall, forget). Create an API key on"
            " the API Keys page of platform.cognee.ai, then --url"
            " https://TENANT.aws.cognee.ai (the tenant URL from its Connection"
            " Details) and --token - (the key; both go to the vault)."
        ),
        instructions=(
            "Cognee memory (a knowledge graph). Recall before answering when the"
            " user refers to earlier work, their preferences or facts about"
            " people and projects; remember only durable facts, decisions and"
            " preferences the user states or confirms, never secrets. What was"
            " just remembered may take a while to be recallable (a retryable"
            " error says so). Forgetting needs the user's explicit request."
        ),
    ),
    Preset(
        name="neo4j-memory",
        title="Neo4j Agent Memory (hosted NAMS)",
        provider="neo4j-agent-memory",
        transport="streamable_http",
        url="https://memory.neo4jlabs.com/mcp",
        auth="oauth",
        oauth_registration="dynamic",
        setup="`memorizzctl mcp login NAME` with a memory.neo4jlabs.com account.",
        instructions=_MEMORY_INSTRUCTIONS,
    ),
    Preset(
        name="neo4j-memory-local",
        title="Neo4j Agent Memory (self-hosted stdio)",
        provider="neo4j-agent-memory",
        transport="stdio",
        only=[
            "memory_create_conversation",
            "memory_add_messages",
            "memory_get_context",
            "memory_search_messages",
            "memory_search_entities",
            "memory_get_entity",
            "memory_add_entity",
            "memory_get_entity_history",
            "memory_record_step",
            "memory_record_tool_call",
            "memory_get_trace",
            "memory_explain_decision",
        ],
        setup=(
            "@neo4j-labs/agent-memory/mcp ships the 12 tool definitions and a"
            " dispatcher, not a program: run your own stdio server built on it"
            " and give its command (--command node --arg server.mjs; the"
            " stdio allowlist applies), MEMORY_API_KEY via --secret-env."
            " The allow-list keeps it to the 12 tools (--allow-tool to change)."
        ),
        instructions=_MEMORY_INSTRUCTIONS,
    ),
)

BY_NAME: Final[dict[str, Preset]] = {p.name: p for p in PRESETS}


def find_preset(name: str) -> Preset:
    """The built-in preset called ``name``; ``InvalidParamsError``
    (``unknown_preset``) for any other."""
    found = BY_NAME.get(name)
    if found is None:
        raise InvalidParamsError(
            f"unknown preset {name!r} (known: {', '.join(BY_NAME)})",
            reason="unknown_preset",
        )
    return found


def expand_preset(spec: ServerSpec) -> ServerSpec:
    """``spec`` with its built-in preset applied (unchanged without one)."""
    if spec.preset is None:
        return spec
    return apply_preset(spec, find_preset(spec.preset))


def apply_preset(spec: ServerSpec, preset: Preset) -> ServerSpec:
    """``spec`` filled in from ``preset`` (the module docstring's rules)."""
    where = f"server {spec.name!r} (preset {preset.name})"
    given = msgspec.to_builtins(spec)  # omit_defaults: only what was set
    auth: AuthMode = spec.auth if "auth" in given else preset.auth
    if auth not in (preset.auth, *preset.auth_alternatives):
        raise InvalidParamsError(
            f"{where}: auth {auth} is not one this preset takes"
            f" ({', '.join([preset.auth, *preset.auth_alternatives])})"
        )
    base: dict[str, object] = {"transport": preset.transport, "auth": auth}
    if preset.url is not None:
        base["url"] = preset.url
    if preset.builtin is not None:
        base["builtin"] = preset.builtin
    if preset.command is not None:
        base["command"] = preset.command
        base["args"] = list(preset.args)
    if auth == "oauth" and preset.auth == "oauth" and preset.oauth_scopes:
        base["oauth_scopes"] = list(preset.oauth_scopes)
    if preset.only:
        base["allow_tools"] = list(preset.only)
    merged = {**base, **given}
    if spec.instructions is None or spec.instructions is True:
        merged.pop("instructions", None)
        if preset.instructions:
            merged["instructions"] = preset.instructions
    if preset.workspace_arguments:
        if not spec.workspace:
            raise InvalidParamsError(
                f"{where}: needs a workspace (--workspace, or workspace = ...)"
            )
        merged["fixed_arguments"] = {
            **dict.fromkeys(preset.workspace_arguments, spec.workspace),
            **spec.fixed_arguments,
        }
    elif spec.workspace is not None:
        raise InvalidParamsError(f"{where}: this preset takes no workspace")
    if (
        auth == "oauth"
        and preset.oauth_registration == "pre_registered"
        and not spec.oauth_client_id
    ):
        raise InvalidParamsError(
            f"{where}: needs a pre-registered OAuth client"
            " (--client-id and --client-secret)"
        )
    if preset.transport == "stdio" and not merged.get("command"):
        raise InvalidParamsError(f"{where}: needs the command to run (--command)")
    return msgspec.convert(merged, ServerSpec)


def instructions_of(spec: ServerSpec) -> str | None:
    """The connection instructions agents are given for a (expanded) spec."""
    return spec.instructions if isinstance(spec.instructions, str) else None
