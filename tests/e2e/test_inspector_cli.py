"""The MCP face, checked with the official MCP Inspector's command line.

A client nobody here wrote, and the one operators reach for to check an MCP
server: npm ``@modelcontextprotocol/inspector-cli`` (tests/node, installed by
scripts/bootstrap from its lockfile; bin ``mcp-inspector-cli``), run as an
operator types it, with ``--cli``, one ``--method`` per run and its JSON on
stdout:

* over stdio, spawning the installed ``memorizzctl mcp serve --socket ...``;
* over Streamable HTTP, against ``memorizzctl mcp serve --transport
  streamable-http`` with the bearer token as its ``--header``, and without it.

Behind the real daemon: our SDK test servers tests/mcp_server.py (``alpha``)
and tests/features_server.py (``feat``), over stdio, so the face shows
``SERVER__NAME`` tools and prompts and routes resources by URI.

Inspector 1.0.3 finds its own package.json with a check relative to the
working directory (``fs.existsSync("../package.json")``) and, when that fails,
imports ``../../package.json`` relative to its module, which its npm package
does not have: it fails before connecting ("Cannot find module
.../node_modules/@modelcontextprotocol/package.json") unless the working
directory's parent holds a package.json (upstream issues #834 and #1503 of
modelcontextprotocol/inspector). It runs here in tests/node/node_modules,
whose parent holds one; docs/mcp-clients.md gives operators the same
workaround.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from typing import Any, TypeVar

import httpx2
import msgspec
import pytest

from memorizzd.listeners import face_socket_path
from tests.harness import (
    INITIALIZE,
    NODE_DIR,
    DaemonHarness,
    daemon_config,
    features_spec,
    http_bridge,
    rmtree,
    short_tempdir,
    stdio_spec,
)
from tests.harness import node as harness_node
from tests.process import MEMORIZZCTL

INSPECTOR = NODE_DIR / "node_modules/.bin/mcp-inspector-cli"
WORKDIR = NODE_DIR / "node_modules"
"""Where it runs: a directory whose parent has a package.json (see above)."""
PURPOSE = "the MCP Inspector's CLI"
RUN_TIMEOUT_S = 60.0
"""A bound on a hung inspector only, far above its usual run (about 2 s)."""
REFUSED = re.compile(r"Error POSTing to endpoint: (\{.*\})$", re.MULTILINE)
"""The TypeScript SDK's message for a refused POST, with the reply's body."""

T = TypeVar("T")


# --- what the inspector prints: MCP's results, as JSON ------------------------------


class Tool(msgspec.Struct, frozen=True, rename="camel"):
    name: str
    input_schema: dict[str, Any]
    description: str | None = None
    meta: dict[str, Any] = msgspec.field(name="_meta", default_factory=dict)


class Tools(msgspec.Struct, frozen=True):
    tools: list[Tool]


class Content(msgspec.Struct, frozen=True):
    type: str
    text: str | None = None


class Called(msgspec.Struct, frozen=True, rename="camel"):
    content: list[Content]
    is_error: bool = False
    structured_content: dict[str, Any] | None = None

    @property
    def texts(self) -> list[str | None]:
        return [part.text for part in self.content]


class Resource(msgspec.Struct, frozen=True, rename="camel"):
    uri: str
    name: str
    mime_type: str | None = None


class Resources(msgspec.Struct, frozen=True):
    resources: list[Resource]


class Template(msgspec.Struct, frozen=True, rename="camel"):
    uri_template: str
    name: str


class Templates(msgspec.Struct, frozen=True, rename="camel"):
    resource_templates: list[Template]


class Contents(msgspec.Struct, frozen=True, rename="camel"):
    uri: str
    mime_type: str | None = None
    text: str | None = None


class Read(msgspec.Struct, frozen=True):
    contents: list[Contents]


class Argument(msgspec.Struct, frozen=True):
    name: str
    required: bool = False


class Prompt(msgspec.Struct, frozen=True):
    name: str
    arguments: list[Argument] = []


class Prompts(msgspec.Struct, frozen=True):
    prompts: list[Prompt]


class Message(msgspec.Struct, frozen=True):
    role: str
    content: Content


class Got(msgspec.Struct, frozen=True):
    messages: list[Message]


class ErrorObject(msgspec.Struct, frozen=True):
    code: int
    message: str


class ErrorReply(msgspec.Struct, frozen=True):
    jsonrpc: str
    id: str | int | None
    error: ErrorObject


# --- running it ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def node() -> str:
    """node, with the inspector installed; else skip (fail under CI=true), as
    ``tests.harness.node`` does for tests/node's packages."""
    exe = harness_node(PURPOSE)
    if not INSPECTOR.exists():
        why = f"{INSPECTOR.relative_to(NODE_DIR)} is missing (run scripts/bootstrap)"
        if os.environ.get("CI"):
            pytest.fail(f"{why}: CI must run {PURPOSE}")
        pytest.skip(why)
    return exe


@pytest.fixture(scope="module")
def harness(node: str) -> Iterator[DaemonHarness]:
    base = short_tempdir()
    config = daemon_config(base, servers=[stdio_spec("alpha"), features_spec("feat")])
    try:
        with DaemonHarness.running(config) as harness:
            harness.wait_ready("alpha")
            harness.wait_ready("feat")
            yield harness
    finally:
        rmtree(base)


@pytest.fixture(scope="module")
def bridge(harness: DaemonHarness) -> Iterator[tuple[str, str]]:
    """``memorizzctl mcp serve --transport streamable-http`` on a loopback
    port in front of the operator's face; its URL and bearer token."""
    with http_bridge(harness.socket) as served:
        yield served


def run_inspector(node: str, *argv: str) -> subprocess.CompletedProcess[str]:
    """``mcp-inspector-cli --cli ARGV...``, as an operator runs it."""
    env = {k: v for k, v in os.environ.items() if k != "MEMORIZZ_SOCKET"}
    return subprocess.run(
        [node, str(INSPECTOR), "--cli", *argv],
        cwd=WORKDIR,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )


def inspected(shape: type[T], node: str, *argv: str) -> T:
    """The inspector's answer (its JSON on stdout), after a clean exit."""
    done = run_inspector(node, *argv)
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr}"
    return msgspec.json.decode(done.stdout, type=shape)


def over_stdio(shape: type[T], node: str, harness: DaemonHarness, *method: str) -> T:
    """The inspector spawning the stdio bridge to the operator's face."""
    serve = [MEMORIZZCTL, "mcp", "serve", "--socket", harness.socket]
    return inspected(shape, node, *serve, *method)


def over_http(shape: type[T], node: str, url: str, token: str, *method: str) -> T:
    """The inspector against the Streamable HTTP bridge, with its token."""
    auth = ["--header", f"Authorization: Bearer {token}"]
    return inspected(shape, node, url, "--transport", "http", *method, *auth)


# --- over stdio ---------------------------------------------------------------------


def test_the_inspector_lists_the_tools_of_both_servers_over_stdio(
    node: str, harness: DaemonHarness
) -> None:
    listed = over_stdio(Tools, node, harness, "--method", "tools/list")
    tools = {tool.name: tool for tool in listed.tools}
    assert {"alpha__echo", "alpha__add", "feat__touch", "feat__roots"} <= set(tools)
    assert all(name.startswith(("alpha__", "feat__")) for name in tools)
    add = tools["alpha__add"]
    assert add.description == "Add two integers."
    assert add.input_schema["required"] == ["a", "b"]
    assert add.meta["memorizz/server"] == "alpha"
    assert add.meta["memorizz/tool"] == "add"
    assert add.meta["memorizz/decision"] == "allow"
    assert tools["feat__touch"].meta["memorizz/server"] == "feat"


def test_the_inspector_calls_a_tool_with_arguments_over_stdio(
    node: str, harness: DaemonHarness
) -> None:
    call = ["--method", "tools/call", "--tool-name"]
    echoed = over_stdio(
        Called, node, harness, *call, "alpha__echo", "--tool-arg", "text=checked"
    )
    assert echoed.texts == ["checked"]
    assert echoed.is_error is False
    # key=value arguments are JSON values to the inspector: integers here
    summed = over_stdio(
        Called, node, harness, *call, "alpha__add", "--tool-arg", "a=2", "b=40"
    )
    assert summed.texts == ["42"]
    assert summed.structured_content == {"result": 42}
    assert summed.is_error is False
    # the same audit record as a socket tools/call, on the face's socket
    with harness.client() as c:
        record = c.audit(limit=1).records[0]
    assert (record.action, record.server, record.tool) == ("tools/call", "alpha", "add")
    assert record.outcome == "ok"
    assert record.caller_socket == face_socket_path(harness.socket)


def test_the_inspector_lists_and_reads_resources_over_stdio(
    node: str, harness: DaemonHarness
) -> None:
    listed = over_stdio(Resources, node, harness, "--method", "resources/list")
    uris = {resource.uri: resource for resource in listed.resources}
    assert {"test://static", "feat://watched"} <= set(uris)
    assert uris["test://static"].mime_type == "text/plain"
    templates = over_stdio(
        Templates, node, harness, "--method", "resources/templates/list"
    )
    assert {"test://items/{item_id}", "feat://colors/{color}"} <= {
        t.uri_template for t in templates.resource_templates
    }
    # each URI goes to the server that lists it, or whose template matches it
    for uri, text in [
        ("test://static", "static content"),
        ("feat://watched", "watched content"),
        ("feat://colors/green", "the colour green"),
    ]:
        read = over_stdio(
            Read, node, harness, "--method", "resources/read", "--uri", uri
        )
        assert read.contents == [Contents(uri, "text/plain", text)], uri


def test_the_inspector_lists_and_gets_prompts_over_stdio(
    node: str, harness: DaemonHarness
) -> None:
    listed = over_stdio(Prompts, node, harness, "--method", "prompts/list")
    prompts = {prompt.name: prompt for prompt in listed.prompts}
    assert {"alpha__greet", "feat__pick"} <= set(prompts)
    assert prompts["alpha__greet"].arguments == [Argument("name", required=True)]
    assert prompts["feat__pick"].arguments == [Argument("color", required=True)]
    for name, argument, text in [
        ("alpha__greet", "name=Ada", "Say hello to Ada"),
        ("feat__pick", "color=green", "Paint it green"),
    ]:
        get = ["--method", "prompts/get", "--prompt-name", name]
        got = over_stdio(Got, node, harness, *get, "--prompt-args", argument)
        assert got.messages == [Message("user", Content("text", text))], name


def test_the_inspector_sets_the_log_level_over_stdio(
    node: str, harness: DaemonHarness
) -> None:
    set_level = ["--method", "logging/setLevel", "--log-level", "debug"]
    assert over_stdio(dict[str, Any], node, harness, *set_level) == {}


# --- over Streamable HTTP -----------------------------------------------------------


def test_the_inspector_lists_and_calls_tools_over_streamable_http(
    node: str, bridge: tuple[str, str]
) -> None:
    url, token = bridge
    listed = over_http(Tools, node, url, token, "--method", "tools/list")
    tools = {tool.name: tool for tool in listed.tools}
    assert {"alpha__echo", "alpha__add", "feat__touch"} <= set(tools)
    assert tools["alpha__echo"].meta["memorizz/server"] == "alpha"
    call = ["--method", "tools/call", "--tool-name", "alpha__add"]
    summed = over_http(Called, node, url, token, *call, "--tool-arg", "a=20", "b=22")
    assert summed.texts == ["42"]
    assert summed.structured_content == {"result": 42}
    assert summed.is_error is False
    get = ["--method", "prompts/get", "--prompt-name", "feat__pick"]
    got = over_http(Got, node, url, token, *get, "--prompt-args", "color=blue")
    assert got.messages == [Message("user", Content("text", "Paint it blue"))]


@pytest.mark.parametrize("authorization", [None, "Bearer wrong-token"])
def test_the_inspector_without_the_token_is_refused_with_401(
    node: str, bridge: tuple[str, str], authorization: str | None
) -> None:
    url, _ = bridge
    auth = (
        [] if authorization is None else ["--header", f"Authorization: {authorization}"]
    )
    done = run_inspector(
        node, url, "--transport", "http", "--method", "tools/list", *auth
    )
    assert done.returncode == 1, done.stderr
    assert done.stdout == ""
    refused = REFUSED.search(done.stderr)
    assert refused is not None, done.stderr
    reply = msgspec.json.decode(refused.group(1), type=ErrorReply)
    assert reply == ErrorReply(
        "2.0", None, ErrorObject(-32600, "a bearer token is required")
    )
    # the SDK's message leaves the status out: the same first POST is a 401
    headers = {"Accept": "application/json, text/event-stream"}
    if authorization is not None:
        headers["Authorization"] = authorization
    answer = httpx2.post(url, json=INITIALIZE, headers=headers, timeout=RUN_TIMEOUT_S)
    assert answer.status_code == 401
    assert answer.headers["www-authenticate"] == "Bearer"
