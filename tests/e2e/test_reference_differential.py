"""A differential battery: what the official Python SDK client (``mcp`` 2.3)
sees of third-party reference servers directly, and what it sees of the same
servers through memorizz, operation by operation.

npm ``@modelcontextprotocol/server-everything`` on each upstream transport
(stdio; its ``sse`` and ``streamableHttp`` modes on 127.0.0.1, run as
``test_reference_servers.py`` runs them), then ``mcp-server-time`` (PyPI, in
``.venv-refs``) and npm ``@modelcontextprotocol/server-filesystem`` in a
temporary directory. Each is seen three ways:

* directly, by the SDK client (the handshake era for server-everything and
  server-filesystem, the only one they speak);
* through the MCP face, by the same client over ``memorizzctl mcp serve
  --server NAME`` (a scope of one server keeps its names: docs/mcp-clients.md,
  "Names"), in the handshake era and in 2026-07-28;
* through the socket API (``memorizz.Client``, results as relayed: ``raw``).

Every tool with valid arguments (elicitation and sampling answered by the
client's callbacks), every resource read (text and blob), the templates and
reads made from them, every prompt with arguments, completions, log level and
log messages, pings, subscriptions, structured content, annotations,
resource links, embedded resources, images, audio, titles and ``_meta``, a
pagination cursor, and the servers' errors. What differs must be what the
docs say differs: each such difference is asserted on its own below, with
the doc that says so; everything else must be equal.

What ``test_reference_servers.py`` and ``test_face_clients_battery.py``
already hold (progress of calls in parallel, tasks, restarts, roots, log
levels per caller, the TypeScript client, the HTTP bridge) is not repeated.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import os
import re
import shutil
import socket
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import msgspec
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.sse import sse_client
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError, UrlElicitationRequiredError

from memorizz.api import methods as m
from memorizz.api.errors import RemoteError
from memorizz.api.methods import ServerSpec
from memorizzd import __version__
from memorizzd.listeners import face_socket_path
from tests.e2e.test_reference_servers import (
    EVERYTHING,
    FILESYSTEM,
    MODES,
    TIME_SERVER,
    TRANSPORTS,
    UNDECLARED_TOOLS,
    HttpServer,
    _missing,
    _node_problem,
    known_tools,
)
from tests.harness import DaemonHarness, daemon_config, http_spec, rmtree, short_tempdir
from tests.process import MEMORIZZCTL

pytestmark = pytest.mark.filterwarnings(
    "ignore::mcp.shared.exceptions.MCPDeprecationWarning"
)  # ping, logging/setLevel and resources/subscribe are the handshake era's

NODE = shutil.which("node") or "node"
_ids = itertools.count()


def _fresh_id() -> str:
    """An elicitation id of its own for each pass: server-everything keeps the
    URL-elicitation error path's state per session (the daemon's one session
    is every pass's through memorizz)."""
    return f"mz-{next(_ids)}"


# --- what is the same whoever answers ---------------------------------------

_CLOCK = re.compile(r"\d{1,2}:\d{2}:\d{2} [AP]M")
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_OURS = re.compile(r"mz-\d+")
_LEVEL_MESSAGE = re.compile(r"^[A-Z][a-z]+[- ]level[- ]message")
"""server-everything's simulated log message, of a random level."""


def steady(value: Any) -> Any:
    """``value`` without what changes from one session or second to the next:
    server-everything's clock times (in texts, and in blobs, decoded), its
    session ids, the elicitation ids it makes and ours."""
    if isinstance(value, dict):
        return {k: _steady_member(k, v) for k, v in value.items()}
    if isinstance(value, list):
        return [steady(v) for v in value]
    if isinstance(value, str):
        return _OURS.sub("ID", _UUID.sub("UUID", _CLOCK.sub("TIME", value)))
    return value


def _steady_member(key: str, value: Any) -> Any:
    if key == "blob" and isinstance(value, str):
        try:
            return "blob:" + steady(base64.b64decode(value).decode())
        except UnicodeDecodeError:
            return value
    return steady(value)


def dump(model: Any, *, sent: bool = False) -> Any:
    """An SDK object as its client reads it (``sent``: only what the server
    sent, without the SDK model's defaults, to set beside a relayed result)."""
    dumped = model.model_dump(
        mode="json", by_alias=True, exclude_none=True, exclude_unset=sent
    )
    return steady(dumped)


# --- the battery -------------------------------------------------------------

CALLS: dict[str, tuple[str, dict[str, Any]]] = {
    "echo": ("echo", {"message": 'héllo ✓ "quoted" \\ back'}),
    "annotated_error": ("get-annotated-message", {"messageType": "error", "includeImage": True}),
    "annotated_success": ("get-annotated-message", {"messageType": "success"}),
    "annotated_debug": ("get-annotated-message", {"messageType": "debug"}),
    "links": ("get-resource-links", {"count": 4}),
    "ref_text": ("get-resource-reference", {"resourceType": "Text", "resourceId": 2}),
    "ref_blob": ("get-resource-reference", {"resourceType": "Blob", "resourceId": 3}),
    "structured": ("get-structured-content", {"location": "Chicago"}),
    "sum": ("get-sum", {"a": 2.5, "b": 40}),
    "image": ("get-tiny-image", {}),
    "gzip_link": ("gzip-file-as-resource", {"name": "diff-a.gz", "data": "data:text/plain;base64,aGVsbG8="}),
    "gzip_embedded": ("gzip-file-as-resource", {"name": "diff-b.gz", "data": "data:text/plain;base64,d29ybGQ=", "outputType": "resource"}),
    "subscriber_on": ("toggle-subscriber-updates", {}),
    "subscriber_off": ("toggle-subscriber-updates", {}),
    "env": ("get-env", {}),
    "research_without_a_task": ("simulate-research-query", {"topic": "differences"}),
    "bad_arguments": ("get-sum", {"a": "two"}),
}  # fmt: skip
"""Tool calls anyone can make (``get-roots-list`` is not listed: neither
client declares roots; ``simulate-research-query`` takes tasks only, which
the Python SDK client cannot make: its refusal is compared)."""
ASKING: dict[str, tuple[str, Callable[[], dict[str, Any]]]] = {
    "elicit": ("trigger-elicitation-request", dict),
    "url_elicit": ("trigger-url-elicitation", lambda: {"url": "https://example.com/a", "elicitationId": _fresh_id()}),
    "url_elicit_error": ("trigger-url-elicitation", lambda: {"url": "https://example.com/b", "elicitationId": _fresh_id(), "errorPath": True}),
    "sample": ("trigger-sampling-request", lambda: {"prompt": "count sheep", "maxTokens": 5}),
}  # fmt: skip
"""Tool calls that ask the client (form and URL elicitation, sampling), and
the URL elicitation's error path (-32042)."""
TEMPLATED = ["demo://resource/dynamic/text/5", "demo://resource/dynamic/blob/6"]
PROMPTS: dict[str, tuple[str, dict[str, str] | None]] = {
    "simple": ("simple-prompt", None),
    "args": ("args-prompt", {"city": "Lyon", "state": "Rhône"}),
    "args_required_only": ("args-prompt", {"city": "Lyon"}),
    "completable": ("completable-prompt", {"department": "Sales", "name": "Eve"}),
    "embedded_text": ("resource-prompt", {"resourceType": "Text", "resourceId": "2"}),
    "embedded_blob": ("resource-prompt", {"resourceType": "Blob", "resourceId": "3"}),
}
TEMPLATE = "demo://resource/dynamic/text/{resourceId}"
COMPLETIONS: dict[str, tuple[Any, dict[str, str], dict[str, str] | None]] = {
    "department": (types.PromptReference(name="completable-prompt"), {"name": "department", "value": "S"}, None),
    "name_in_context": (types.PromptReference(name="completable-prompt"), {"name": "name", "value": ""}, {"department": "Engineering"}),
    "resource_type": (types.PromptReference(name="resource-prompt"), {"name": "resourceType", "value": "B"}, None),
    "template": (types.ResourceTemplateReference(uri=TEMPLATE), {"name": "resourceId", "value": "12"}, None),
    "template_refused": (types.ResourceTemplateReference(uri=TEMPLATE), {"name": "resourceId", "value": "x"}, None),
}  # fmt: skip
FAILING_READ = "demo://resource/dynamic/text/nope"
"""Matches a template; the server refuses it (-32603)."""
UNLISTED = "demo://nowhere/at/all"
"""Matches nothing the server has."""
WATCHED = "demo://resource/dynamic/text/1"


async def _elicit(context: Any, params: Any) -> types.ElicitResult:
    if isinstance(params, types.ElicitRequestURLParams):
        return types.ElicitResult(action="accept")
    return types.ElicitResult(action="accept", content={"name": "Ada", "check": True})


async def _sample(context: Any, params: Any) -> types.CreateMessageResult:
    return types.CreateMessageResult(
        model="py-model",
        role="assistant",
        content=types.TextContent(type="text", text="one, two, three"),
    )


def _elicit_dict(params: dict[str, Any]) -> dict[str, Any]:
    if params.get("mode") == "url":
        return {"action": "accept"}
    return {"action": "accept", "content": {"name": "Ada", "check": True}}


def _sample_dict(params: dict[str, Any]) -> dict[str, Any]:
    text = {"type": "text", "text": "one, two, three"}
    return {"model": "py-model", "role": "assistant", "content": text}


async def sdk_battery(
    client: Client, logs: list[tuple[str | None, Any]], logged: anyio.Event
) -> dict[str, Any]:
    """Every operation of the battery, as ``client`` gets it: SDK objects, or
    the error (see ``view``)."""
    seen: dict[str, Any] = {
        "server_info": client.server_info,
        "capabilities": client.server_capabilities,
        "instructions": client.instructions,
    }
    legacy = client.protocol_version != "2026-07-28"

    async def attempt(key: str, request: Any) -> None:
        try:
            seen[key] = await request
        except MCPError as exc:
            seen[key] = exc

    if legacy:
        await attempt("set_level", client.set_logging_level("debug"))
    tools = await client.list_tools()
    seen["tools"] = {tool.name: tool for tool in tools.tools}
    seen["tools_next_cursor"] = tools.next_cursor
    for key, (name, arguments) in CALLS.items():
        await attempt(key, client.call_tool(name, arguments))
    for key, (name, make) in ASKING.items():
        await attempt(key, client.call_tool(name, make()))
    progress: list[tuple[float, float | None, str | None]] = []

    async def on_progress(p: float, total: float | None, message: str | None) -> None:
        progress.append((p, total, message))

    await attempt(
        "long",
        client.call_tool(
            "trigger-long-running-operation",
            {"duration": 0.2, "steps": 2},
            progress_callback=on_progress,
        ),
    )
    seen["progress"] = progress
    if legacy:  # one message at once, of a random level (then one every 5 s)
        await attempt("logging_on", client.call_tool("toggle-simulated-logging", {}))
        with anyio.fail_after(10):
            await logged.wait()
        await attempt("logging_off", client.call_tool("toggle-simulated-logging", {}))
        seen["logs"] = [
            logger for logger, data in logs[:1] if _LEVEL_MESSAGE.match(str(data))
        ]
    listed = await client.list_resources()
    seen["resources"] = sorted(listed.resources, key=lambda r: str(r.uri))
    seen["resources_next_cursor"] = listed.next_cursor
    for uri in [str(r.uri) for r in listed.resources] + TEMPLATED:
        await attempt(f"read {uri}", client.read_resource(uri))
    for uri in (FAILING_READ, UNLISTED):
        await attempt(f"read {uri}", client.read_resource(uri))
    templates = await client.list_resource_templates()
    seen["templates"] = templates.resource_templates
    seen["templates_next_cursor"] = templates.next_cursor
    prompts = await client.list_prompts()
    seen["prompts"] = prompts.prompts
    seen["prompts_next_cursor"] = prompts.next_cursor
    for key, (name, arguments) in PROMPTS.items():
        await attempt(f"prompt {key}", client.get_prompt(name, arguments))
    refused = {"resourceType": "Nope", "resourceId": "3"}
    await attempt("prompt refused", client.get_prompt("resource-prompt", refused))
    await attempt("prompt unknown", client.get_prompt("no-such-prompt"))
    for key, (ref, argument, context) in COMPLETIONS.items():
        await attempt(f"complete {key}", client.complete(ref, argument, context))
    nobody = types.PromptReference(name="no-such-prompt")
    await attempt(
        "complete unknown", client.complete(nobody, {"name": "a", "value": ""})
    )
    await attempt("unknown tool", client.call_tool("no-such-tool", {}))
    await attempt("tools page 2", client.list_tools(cursor="page-2"))
    await attempt("resources page 2", client.list_resources(cursor="page-2"))
    if legacy:
        await attempt("subscribe", client.subscribe_resource(WATCHED))
        await attempt("unsubscribe", client.unsubscribe_resource(WATCHED))
        await attempt("ping", client.send_ping())
    seen["version"] = client.protocol_version
    return seen


def run_sdk(target: Any, mode: str = "legacy") -> dict[str, Any]:
    """The battery through a fresh SDK client, which answers what the daemon
    declares upstream (elicitation, form and URL; sampling with tools): so
    server-everything lists the same tools to both."""

    async def go() -> dict[str, Any]:
        logs: list[tuple[str | None, Any]] = []
        logged = anyio.Event()

        async def on_log(params: types.LoggingMessageNotificationParams) -> None:
            logs.append((params.logger, params.data))
            logged.set()

        async with Client(
            target,
            mode=mode,  # type: ignore[arg-type]
            elicitation_callback=_elicit,
            sampling_callback=_sample,
            sampling_capabilities=types.SamplingCapability(
                tools=types.SamplingToolsCapability()
            ),
            logging_callback=on_log,
        ) as client:
            return await sdk_battery(client, logs, logged)

    return anyio.run(go)


def view(seen: dict[str, Any], *, sent: bool = False) -> dict[str, Any]:
    """The battery's outcome as data: what the client reads (``sent``: only
    what the server sent, without the SDK model's defaults, to set beside
    what the socket API relays); errors as ``failure``."""

    def one(value: Any) -> Any:
        if isinstance(value, MCPError):
            return failure(value)
        if isinstance(value, dict):
            return {k: one(v) for k, v in value.items()}
        if isinstance(value, list):
            return [one(v) for v in value]
        if hasattr(value, "model_dump"):
            return dump(value, sent=sent)
        return steady(value)

    return {key: one(value) for key, value in seen.items()}


def failure(exc: MCPError | RemoteError) -> dict[str, Any]:
    if isinstance(exc, MCPError):
        error = exc.error
        return steady(
            {"error": error.code, "message": error.message, "data": error.data}
        )
    data = {"reason": exc.reason, **exc.data}
    return steady({"error": exc.code, "message": exc.message, "data": data})


def relayed_error(
    direct: dict[str, Any], server: str, *, face: bool = False
) -> dict[str, Any]:
    """The upstream's JSON-RPC error as memorizz answers it: ``upstream_error``
    (-32006), the server's name before its message, its code in
    ``data.upstream_code`` and its ``data`` in ``data.upstream_data``
    (docs/protocol.md, "Errors"; on the face, "as on the API socket":
    docs/mcp-clients.md, "The policy"), but for the face's -32042 (below)."""
    data: dict[str, Any] = {
        "reason": "upstream_error",
        "server": server,
        "upstream_code": direct["error"],
    }
    if direct["data"] is not None:
        data["upstream_data"] = direct["data"]
    return {"error": -32006, "message": f"{server}: {direct['message']}", "data": data}


def api_battery(harness: DaemonHarness, server: str) -> dict[str, Any]:
    """The battery over the socket API (each result as relayed: ``raw``),
    keyed as ``sdk_battery``'s."""
    seen: dict[str, Any] = {}
    with harness.client() as c:

        def ask(key: str, method: Any, params: Any, **options: Any) -> Any:
            try:
                seen[key] = steady(
                    msgspec.json.decode(c.call(method, params, raw=True, **options))
                )
            except RemoteError as exc:
                seen[key] = failure(exc)
            return seen[key]

        def call(
            key: str, name: str, arguments: dict[str, Any], **options: Any
        ) -> None:
            try:
                raw = c.call_tool(server, name, arguments, raw=True, **options)
                seen[key] = steady(msgspec.json.decode(raw))
            except RemoteError as exc:
                seen[key] = failure(exc)

        tools = ask("tools", m.TOOLS_LIST, m.ToolsListParams(server=server))
        seen["tools"] = {tool["name"]: tool for tool in tools["tools"]}
        for key, (name, arguments) in CALLS.items():
            call(key, name, arguments)
        for key, (name, make) in ASKING.items():
            call(key, name, make(), on_elicit=_elicit_dict, on_sample=_sample_dict)
        progress: list[m.ProgressParams] = []
        long = {"duration": 0.2, "steps": 2}
        call(
            "long", "trigger-long-running-operation", long, on_progress=progress.append
        )
        seen["progress"] = [(p.progress, p.total, p.message) for p in progress]
        listed = ask(
            "resources", m.RESOURCES_LIST, m.ResourcesListParams(server=server)
        )
        seen["resources"] = sorted(listed["resources"], key=lambda r: r["uri"])
        uris = [r["uri"] for r in seen["resources"]]
        for uri in [*uris, *TEMPLATED, FAILING_READ, UNLISTED]:
            params = m.ResourcesReadParams(server=server, uri=uri)
            ask(f"read {uri}", m.RESOURCES_READ, params)
        templates = m.ResourcesTemplatesListParams(server=server)
        seen["templates"] = ask("templates", m.RESOURCES_TEMPLATES_LIST, templates)[
            "resourceTemplates"
        ]
        prompts = ask("prompts", m.PROMPTS_LIST, m.PromptsListParams(server=server))
        seen["prompts"] = prompts["prompts"]
        gets = {
            **PROMPTS,
            "refused": ("resource-prompt", {"resourceType": "Nope", "resourceId": "3"}),
            "unknown": ("no-such-prompt", None),
        }
        for key, (name, arguments) in gets.items():
            params = m.PromptsGetParams(
                server=server, name=name, arguments=arguments or {}
            )
            ask(f"prompt {key}", m.PROMPTS_GET, params)
        nobody = types.PromptReference(name="no-such-prompt")
        every = {**COMPLETIONS, "unknown": (nobody, {"name": "a", "value": ""}, None)}
        for key, (ref, argument, context) in every.items():
            params = m.CompletionCompleteParams(
                server=server,
                ref=msgspec.convert(
                    ref.model_dump(by_alias=True), m.CompletionReference
                ),
                argument=m.CompletionArgument(**argument),
                context=None
                if context is None
                else m.CompletionContext(arguments=context),
            )
            ask(f"complete {key}", m.COMPLETION_COMPLETE, params)
        call("unknown tool", "no-such-tool", {})
        subscribe = m.ResourcesSubscribeParams(server=server, uri=WATCHED)
        ask("subscribe", m.RESOURCES_SUBSCRIBE, subscribe)
        unsubscribe = m.ResourcesUnsubscribeParams(server=server, uri=WATCHED)
        ask("unsubscribe", m.RESOURCES_UNSUBSCRIBE, unsubscribe)
        assert c.ping(server).latency_ms > 0
    return seen


# --- the servers ---------------------------------------------------------------


@dataclass
class World:
    """The module's daemon, the HTTP servers behind its entries, and where
    the direct clients find the same servers."""

    daemon: DaemonHarness
    http: dict[str, HttpServer]
    root: Path
    """server-filesystem's allowed directory."""

    def direct(self, transport: str) -> Any:
        """A direct SDK transport to server-everything (a process of its own
        over stdio; the daemon's HTTP server, a session of its own)."""
        if transport == "stdio":
            params = StdioServerParameters(
                command=NODE, args=[str(EVERYTHING), "stdio"]
            )
            return stdio_client(params)
        url = self.http[transport].url(transport)
        return sse_client(url) if transport == "sse" else streamable_http_client(url)

    def face(self, server: str) -> Any:
        """The SDK client's transport to the face, scoped to ``server``."""
        args = ["--socket", self.daemon.socket, "mcp", "serve", "--server", server]
        return stdio_client(StdioServerParameters(command=MEMORIZZCTL, args=args))


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    """One daemon: server-everything on every transport (``ev_TRANSPORT``),
    and, when they are installed, mcp-server-time (``time``) and
    server-filesystem (``fs``, in a temporary directory)."""
    if problem := _node_problem(EVERYTHING):
        _missing(problem, "server-everything")
    base = short_tempdir("mz-diff-")
    root = Path(base) / "root"
    root.mkdir()
    with contextlib.ExitStack() as stack:
        stack.callback(rmtree, base)
        http: dict[str, HttpServer] = {}
        for transport in TRANSPORTS[1:]:
            server = http[transport] = HttpServer(MODES[transport])
            stack.callback(server.stop)
            server.launch()
        specs = [
            ServerSpec(
                name="ev_stdio",
                transport="stdio",
                command=NODE,
                args=[str(EVERYTHING), "stdio"],
            )
        ]
        for transport, server in http.items():
            specs.append(
                http_spec(f"ev_{transport}", server.wait().url(transport), transport)
            )
        if os.access(TIME_SERVER, os.X_OK):
            specs.append(
                ServerSpec(name="time", transport="stdio", command=str(TIME_SERVER))
            )
        if _node_problem(FILESYSTEM, major=20) is None:
            # read-only here: its write tools say destructiveHint (ask)
            specs.append(
                ServerSpec(
                    name="fs",
                    transport="stdio",
                    command=NODE,
                    args=[str(FILESYSTEM), str(root)],
                )
            )
        harness = stack.enter_context(
            DaemonHarness.running(daemon_config(base, servers=specs))
        )
        for spec in specs:
            harness.wait_ready(spec.name)
        yield World(harness, http, root)


# --- server-everything, on every transport -----------------------------------


def _face_view(
    direct: dict[str, Any], server: str, transport: str, risks: dict[str, str]
) -> dict[str, Any]:
    """What the face must show of ``direct``: the same, but what the docs
    say differs, each said here."""
    want = msgspec.convert(direct, dict[str, Any])  # a copy
    # The face is one MCP server of its own, memorizzd (docs/mcp-clients.md,
    # the introduction: "it serves MCP itself, as one MCP server"); the
    # upstream's own info is the daemon's (servers/status: server_name).
    want["server_info"] = {"name": "memorizzd", "version": __version__}
    # A server added without a preset or `instructions` passes on its own
    # text (docs/presets.md, "Connection instructions").
    # Every listed tool's _meta names its origin and the daemon's verdict
    # (docs/mcp-clients.md, "Names"); the server's own _meta stays.
    for name, tool in want["tools"].items():
        tool["_meta"] = {
            **tool.get("_meta", {}),
            "memorizz/server": server,
            "memorizz/tool": name,
            "memorizz/risk": risks[name],
            "memorizz/decision": "allow",
        }
    _same_env_but_lang(want, transport)
    # Log messages come with the server's name as the logger
    # (docs/mcp-clients.md, "Not there yet": "Messages during a call").
    want["logs"] = [server for _ in want["logs"]]
    # The upstream's errors are the daemon's upstream_error, "as on the API
    # socket" (docs/mcp-clients.md, "The policy": "Other failures").
    for key in (f"read {FAILING_READ}", "prompt refused"):
        want[key] = relayed_error(want[key], server)
    # ... but for -32042, which MCP's clients act on: it keeps its code and
    # its elicitations (docs/mcp-clients.md, "Other failures").
    asked = want["url_elicit_error"]
    assert asked["error"] == -32042, asked
    want["url_elicit_error"] = {
        "error": -32042,
        "message": f"{server}: {asked['message']}",
        "data": {
            **asked["data"],
            "reason": "upstream_error",
            "server": server,
            "upstream_code": -32042,
        },
    }
    # A URI that no server lists and no template matches is not_found
    # (docs/mcp-clients.md, "Names"): it never reaches the server.
    assert want[f"read {UNLISTED}"]["error"] == -32602
    want[f"read {UNLISTED}"] = {
        "error": -32002,
        "message": f"no server in scope lists the resource {UNLISTED!r}",
        "data": {"reason": "not_found"},
    }
    # A prompt that no server in scope lists is the face's -32602, MCP's code
    # for it too (docs/mcp-clients.md, "Completions"); so is a tool
    # ("The policy": "An unknown tool name is a -32602 error"), which the
    # server answers with an isError result instead.
    for key in ("prompt unknown", "complete unknown"):
        assert want[key]["error"] == -32602
        want[key] = {
            "error": -32602,
            "message": "unknown prompt 'no-such-prompt'",
            "data": {"reason": "invalid_params"},
        }
    assert want["unknown tool"]["isError"] is True
    want["unknown tool"] = {
        "error": -32602,
        "message": "unknown tool 'no-such-tool' (tools/list shows the tools)",
        "data": {"reason": "invalid_params", "tool": "no-such-tool"},
    }
    # Listings come whole, and a cursor is invalid_params, "as MCP has it for
    # a cursor the server never gave" (docs/mcp-clients.md, "Pagination");
    # server-everything ignores it and lists again.
    for key in ("tools page 2", "resources page 2"):
        assert "error" not in want[key]
        want[key] = {
            "error": -32602,
            "message": "invalid cursor: this server lists everything in one page (it gives no nextCursor)",
            "data": {"reason": "invalid_params"},
        }
    return want


def _modern_view(face: dict[str, Any]) -> dict[str, Any]:
    """What a 2026-07-28 client of the face must see of it: the handshake
    era's, without what that era does not have (ping, logging/setLevel,
    resources/subscribe: the SDK notes, MCP-SDK-2.3.md section 1), and without
    tasks, which the face offers only in initialize (docs/mcp-clients.md,
    "Tasks": "Not yet: a 2026-07-28 session")."""
    era = (
        "set_level",
        "logging_on",
        "logging_off",
        "logs",
        "subscribe",
        "unsubscribe",
        "ping",
    )
    want = {k: v for k, v in face.items() if k not in era}
    want["capabilities"] = {
        k: v for k, v in face["capabilities"].items() if k != "tasks"
    }
    want["version"] = "2026-07-28"
    return want


def _api_view(
    sent: dict[str, Any], server: str, transport: str, risks: dict[str, str]
) -> dict[str, Any]:
    """What the socket API must relay of what the server sent directly."""
    want = msgspec.convert(sent, dict[str, Any])
    # Tools carry memorizz's risk class and decision (docs/protocol.md, "Tool").
    for name, tool in want["tools"].items():
        tool.update(risk=risks[name], decision="allow")
    _same_env_but_lang(want, transport)
    # The upstream's JSON-RPC errors are upstream_error (docs/protocol.md,
    # "Errors"); the API sends every name and URI on to the server, which
    # refuses what it lacks ("List methods and the tools cache": "sent, so
    # the server answers it as unknown"); its isError results pass as they are.
    for key in (
        f"read {FAILING_READ}",
        f"read {UNLISTED}",
        "prompt refused",
        "prompt unknown",
        "complete unknown",
        "url_elicit_error",
    ):
        want[key] = relayed_error(want[key], server)
    return want


def _same_env_but_lang(want: dict[str, Any], transport: str) -> None:
    """A stdio server started by the daemon gets ``LANG`` (and ``TZ``) of the
    daemon's environment beside the SDK's five (docs/configuration.md,
    "Servers entries"; docs/security.md); the SDK client passes on no LANG."""
    if transport != "stdio":
        return
    [text] = want["env"]["content"]
    env = msgspec.json.decode(text["text"])
    env.update({k: os.environ[k] for k in ("LANG", "TZ") if k in os.environ})
    text["text"] = msgspec.json.encode(env).decode()


def _env_normalized(seen: dict[str, Any]) -> None:
    """``get-env``'s JSON (two-space indented by the server) as compact JSON,
    for ``_same_env_but_lang`` to compare."""
    result = seen.get("env")
    if isinstance(result, dict) and "content" in result:
        [text] = result["content"]
        text["text"] = msgspec.json.encode(msgspec.json.decode(text["text"])).decode()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_everything_through_memorizz_is_what_it_is_directly(
    world: World, transport: str
) -> None:
    server = f"ev_{transport}"
    seen = run_sdk(world.direct(transport))
    direct, sent = view(seen), view(seen, sent=True)
    face = view(run_sdk(world.face(server)))
    modern = view(run_sdk(world.face(server), mode="auto"))
    api = api_battery(world.daemon, server)
    for each in (direct, sent, face, modern, api):
        _env_normalized(each)
    risks = {name: tool["risk"] for name, tool in api["tools"].items()}

    # what the server offers, and what each way of asking got
    assert direct["version"] == "2025-11-25"
    assert set(direct["tools"]) == known_tools() - UNDECLARED_TOOLS
    assert direct["server_info"]["name"] == "mcp-servers/everything"
    assert direct["tools_next_cursor"] is None  # one page: nothing to follow
    refused = {"research_without_a_task", "bad_arguments"}  # isError results
    for key in set(CALLS) | set(ASKING) - {"url_elicit_error"}:
        assert direct[key].get("isError", False) is (key in refused), (key, direct[key])
    assert direct["logs"] == [None]
    assert [p[:2] for p in direct["progress"]] == [(1.0, 2.0), (2.0, 2.0)]

    want = _face_view(direct, server, transport, risks)
    assert face == want
    # the face's -32042 is one an MCP client acts on: it opens the URL
    asked = face["url_elicit_error"]
    error = types.ErrorData(
        code=asked["error"], message=asked["message"], data=asked["data"]
    )
    [prerequisite] = UrlElicitationRequiredError.from_error(error).elicitations
    assert prerequisite.url == "https://modelcontextprotocol.io"
    assert modern == _modern_view(want)
    assert api == {
        key: value
        for key, value in _api_view(sent, server, transport, risks).items()
        if key in api
    }


# --- mcp-server-time and server-filesystem, once each ------------------------


async def _small_battery(
    client: Client, calls: dict[str, tuple[str, dict[str, Any]]]
) -> dict[str, Any]:
    seen: dict[str, Any] = {"capabilities": client.server_capabilities}

    async def attempt(key: str, request: Any) -> None:
        try:
            seen[key] = await request
        except MCPError as exc:
            seen[key] = exc

    tools = await client.list_tools()
    seen["tools"] = {tool.name: tool for tool in tools.tools}
    for key, (name, arguments) in calls.items():
        await attempt(key, client.call_tool(name, arguments))
    await attempt("unknown tool", client.call_tool("no_such_tool", {}))
    await attempt("resources", client.list_resources())
    await attempt("prompts", client.list_prompts())
    return seen


def _run_small(
    target: Any, calls: dict[str, tuple[str, dict[str, Any]]], mode: str
) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        async with Client(target, mode=mode) as client:  # type: ignore[arg-type]
            return await _small_battery(client, calls)

    return anyio.run(go)


def _api_small(
    harness: DaemonHarness, server: str, calls: dict[str, tuple[str, dict[str, Any]]]
) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    with harness.client() as c:
        listed = c.call(m.TOOLS_LIST, m.ToolsListParams(server=server), raw=True)
        tools = msgspec.json.decode(listed)["tools"]
        seen["tools"] = {tool["name"]: steady(tool) for tool in tools}
        for key, (name, arguments) in {
            **calls,
            "unknown tool": ("no_such_tool", {}),
        }.items():
            try:
                raw = c.call_tool(server, name, arguments, raw=True)
                seen[key] = steady(msgspec.json.decode(raw))
            except RemoteError as exc:
                seen[key] = failure(exc)
    return seen


def _wav() -> bytes:
    """A tenth of a second of silence, 8 kHz mono 8-bit PCM."""
    samples = b"\x80" * 800
    header = b"WAVEfmt " + struct.pack("<IHHIIHH", 16, 1, 1, 8000, 8000, 1, 8)
    data = b"data" + struct.pack("<I", len(samples)) + samples
    body = header + data
    return b"RIFF" + struct.pack("<I", len(body)) + body


@pytest.mark.parametrize("kind", ["time", "fs"])
def test_time_and_filesystem_through_memorizz_are_what_they_are_directly(
    world: World, kind: str
) -> None:
    """Tools, text and structured content, audio and image contents, the
    server's refusals, a tool it lacks; through the face in each era, and
    through the socket API."""
    if kind == "time":
        if not os.access(TIME_SERVER, os.X_OK):
            _missing(
                f"{TIME_SERVER} is missing (run scripts/bootstrap)", "mcp-server-time"
            )
        direct_target: Any = StdioServerParameters(command=str(TIME_SERVER))
        calls = {
            "convert": ("convert_time", {"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Kathmandu"}),
            "refused": ("convert_time", {"source_timezone": "Mars/Olympus", "time": "12:00", "target_timezone": "UTC"}),
        }  # fmt: skip
        modes = ("auto", "legacy")  # an SDK 2.3 server: 2026-07-28, and the handshake
    else:
        if problem := _node_problem(FILESYSTEM, major=20):
            _missing(problem, "server-filesystem")
        root = world.root
        (root / "notes").mkdir(exist_ok=True)
        notes = root / "notes" / "a.txt"
        notes.write_text("première ligne\nsecond line ✓\n", encoding="utf-8")
        (root / "tone.wav").write_bytes(_wav())
        tiny = msgspec.json.decode(b'"' + _TINY_PNG + b'"')
        (root / "dot.png").write_bytes(base64.b64decode(tiny))
        direct_target = StdioServerParameters(
            command=NODE, args=[str(FILESYSTEM), str(root)]
        )
        calls = {
            "allowed": ("list_allowed_directories", {}),
            "text": ("read_text_file", {"path": str(notes)}),
            "head": ("read_text_file", {"path": str(notes), "head": 1}),
            "multiple": ("read_multiple_files", {"paths": [str(notes), str(root / "missing.txt")]}),
            "audio": ("read_media_file", {"path": str(root / "tone.wav")}),
            "image": ("read_media_file", {"path": str(root / "dot.png")}),
            "list": ("list_directory", {"path": str(root)}),
            "sizes": ("list_directory_with_sizes", {"path": str(root), "sortBy": "name"}),
            "tree": ("directory_tree", {"path": str(root)}),
            "search": ("search_files", {"path": str(root), "pattern": "*.txt"}),
            "info": ("get_file_info", {"path": str(notes)}),
            "outside": ("read_text_file", {"path": "/etc/hostname"}),
        }  # fmt: skip
        modes = ("legacy", "auto")  # a TypeScript SDK 1.x server: the handshake only
    seen = _run_small(stdio_client(direct_target), calls, modes[0])
    direct, sent = view(seen), view(seen, sent=True)
    api = _api_small(world.daemon, kind, calls)
    verdicts = {name: (t["risk"], t["decision"]) for name, t in api["tools"].items()}
    assert set(verdicts) == set(direct["tools"])
    for name, (risk, decision) in verdicts.items():
        # the socket API's Tool carries memorizz's verdict (docs/protocol.md, "Tool")
        sent["tools"][name].update(risk=risk, decision=decision)
    if kind == "time":  # an upstream error (docs/protocol.md, "Errors")
        sent["unknown tool"] = relayed_error(sent["unknown tool"], kind)
    else:  # server-filesystem answers a name it lacks with isError
        assert sent["unknown tool"]["isError"] is True
    assert not direct["convert" if kind == "time" else "text"].get("isError")
    assert direct["refused" if kind == "time" else "outside"]["isError"] is True
    if kind == "fs":
        audio = direct["audio"]["content"][0]
        assert (audio["type"], audio["mimeType"]) == ("audio", "audio/wav")
        assert base64.b64decode(audio["data"]) == _wav()
        assert direct["image"]["content"][0]["type"] == "image"
    assert api == {key: sent[key] for key in api}

    want = _small_face_view(direct, kind, verdicts)
    for mode in modes:
        assert view(_run_small(world.face(kind), calls, mode)) == want, mode


FACE_CAPABILITIES = {
    "logging": {},
    "prompts": {"listChanged": True},
    "resources": {"listChanged": True},
    "tools": {"listChanged": True},
}
"""What the face offers whatever its scope (docs/mcp-clients.md: "it serves
MCP itself, as one MCP server that carries the tools, resources and prompts
of every server you may use"; it tells its sessions of list changes and log
messages: "Not there yet"); completions, subscriptions and tasks only when a
server in scope has them ("Completions", "Resource subscriptions", "Tasks")."""


def _small_face_view(
    direct: dict[str, Any], server: str, verdicts: dict[str, tuple[str, str]]
) -> dict[str, Any]:
    want = msgspec.convert(direct, dict[str, Any])
    want["capabilities"] = FACE_CAPABILITIES
    for name, tool in want["tools"].items():
        risk, decision = verdicts[name]
        tool["_meta"] = {
            **tool.get("_meta", {}),
            "memorizz/server": server,
            "memorizz/tool": name,
            "memorizz/risk": risk,
            "memorizz/decision": decision,
        }
        if decision == "ask":  # docs/mcp-clients.md, "The policy"
            prefix = "[needs an operator's approval before it runs] "
            tool["description"] = prefix + tool["description"]
    want["unknown tool"] = {  # docs/mcp-clients.md, "The policy"
        "error": -32602,
        "message": "unknown tool 'no_such_tool' (tools/list shows the tools)",
        "data": {"reason": "invalid_params", "tool": "no_such_tool"},
    }
    # The face's listings are its own, put together from its servers' (a
    # scope of one or many): an upstream that has no resources or prompts
    # (server-filesystem: -32601) adds none to them, and a listing result's
    # own _meta (mcp-server-time's serverInfo) is not one server's to keep.
    empty = {
        "resources": types.ListResourcesResult(resources=[]),
        "prompts": types.ListPromptsResult(prompts=[]),
    }
    for key, nothing in empty.items():
        if want[key].get("error") == -32601:
            want[key] = dump(nothing)
        else:
            want[key].pop("_meta", None)
    return want


_TINY_PNG = b"iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="


def test_a_url_elicitation_required_error_passes_on_the_warm_relay_too(
    world: World,
) -> None:
    """A client that declares nothing takes the face's warm relay (no task
    per call): its URL elicitation required error is the same -32042 with
    the server's ``elicitations`` as on the task path (above)."""
    path = face_socket_path(world.daemon.socket)
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(20)
        sock.connect(path)
        replies = sock.makefile("rb")

        def send(message: dict[str, Any]) -> None:
            sock.sendall(msgspec.json.encode({"jsonrpc": "2.0", **message}) + b"\n")

        def answer(request_id: int) -> dict[str, Any]:
            while True:
                found: dict[str, Any] = msgspec.json.decode(replies.readline())
                if found.get("id") == request_id:
                    return found

        send({"method": "memorizz/scope", "params": {"server": "ev_stdio"}})
        init = {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "bare", "version": "0"},
        }
        send({"id": 1, "method": "initialize", "params": init})
        assert "result" in answer(1)
        send({"method": "notifications/initialized"})
        _, arguments = ASKING["url_elicit_error"]
        call = {"name": "trigger-url-elicitation", "arguments": arguments()}
        send({"id": 2, "method": "tools/call", "params": call})
        error = answer(2)["error"]
    assert error["code"] == -32042, error
    assert error["data"]["reason"] == "upstream_error"
    data = types.ErrorData(**error)
    [prerequisite] = UrlElicitationRequiredError.from_error(data).elicitations
    assert prerequisite.url == "https://modelcontextprotocol.io"
