"""Reference MCP servers nobody here wrote, on every transport they speak.

The real daemon (in-process, ``DaemonHarness``) and the real client against:

* npm ``@modelcontextprotocol/server-everything`` (tests/node) over stdio,
  legacy HTTP+SSE and Streamable HTTP: tools, progress, resources and their
  templates, prompts, log messages, elicitation, sampling, tasks, errors, and
  a server that restarts;
* npm ``@modelcontextprotocol/server-filesystem`` (tests/node) over stdio,
  rooted at a temporary directory (and given its roots by the daemon);
* PyPI ``mcp-server-time`` (``.venv-refs``, a venv of its own: it brings its
  own pins) over stdio, in both protocol eras.

``scripts/bootstrap`` installs them; a test of a server that is missing skips,
and fails under CI=true (as ``tests.harness.node`` does).

What the memorizz client does not offer is not tested here: completions and
resource subscriptions (the MCP face's, ``test_face_features.py``).

server-everything's HTTP modes listen on ``PORT`` (0: a free one) on every
interface, with no way to name the host: a preload (``LOOPBACK``) binds them
to 127.0.0.1 and writes the port taken to stderr.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import gzip
import os
import re
import shutil
import signal
import subprocess
import threading
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args

import pytest

from memorizz import Client
from memorizz.api import methods as m
from memorizz.api.errors import DeadlineExceededError, UpstreamError
from memorizz.api.methods import ServerSpec
from tests.harness import (
    NODE_DIR,
    DaemonHarness,
    daemon_config,
    http_spec,
    rmtree,
    short_tempdir,
    wait_until,
)

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = NODE_DIR / "node_modules/@modelcontextprotocol"
EVERYTHING = PACKAGES / "server-everything/dist/index.js"
FILESYSTEM = PACKAGES / "server-filesystem/dist/index.js"
REFS_VENV = Path(os.environ.get("REFS_VENV") or ROOT / ".venv-refs")
TIME_SERVER = REFS_VENV / "bin/mcp-server-time"
DOCS = EVERYTHING.parent / "docs"
"""server-everything's static resources: one per file."""

TRANSPORTS = ["stdio", "sse", "streamable_http"]
MODES = {"sse": "sse", "streamable_http": "streamableHttp"}
PATHS = {"sse": "/sse", "streamable_http": "/mcp"}

LOOPBACK = "data:text/javascript," + urllib.parse.quote(
    """
import net from "node:net";
const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (port, ...rest) {
  if (!/^\\d+$/.test(String(port))) return listen.call(this, port, ...rest);
  this.once("listening", () =>
    process.stderr.write(`memorizz-test listening ${this.address().port}\\n`));
  const callback = rest.filter((arg) => typeof arg === "function");
  return listen.call(this, Number(port), "127.0.0.1", ...callback);
};
"""
)
"""A node preload: a listen on a bare port binds 127.0.0.1 and says its port."""

UNDECLARED_TOOLS = {
    "get-roots-list",
    "trigger-elicitation-request-async",
    "trigger-sampling-request-async",
}
"""server-everything's tools for clients that declare what the daemon does
not here: roots (declared only for a server with ``roots`` in its entry), and
task-augmented elicitation and sampling. Every other tool of its package
(``tools()``) is for the daemon: those of any client, and those of one that
declares elicitation (form and URL) and sampling, as the daemon does."""
PROMPTS = {"simple-prompt", "args-prompt", "completable-prompt", "resource-prompt"}
TEMPLATES = {
    "demo://resource/dynamic/text/{resourceId}",
    "demo://resource/dynamic/blob/{resourceId}",
}
LEVELS = get_args(m.LogLevel)
"""MCP's log levels, lowest first (the wire contract's)."""


def known_tools() -> set[str]:
    """The tools server-everything's package registers, read from its source."""
    found: set[str] = set()
    for script in (EVERYTHING.parent / "tools").glob("*.js"):
        source = script.read_text(encoding="utf-8")
        found.update(re.findall(r'^const name = "([^"]+)";$', source, re.MULTILINE))
        found.update(re.findall(r'registerToolTask\("([^"]+)"', source))
    return found


def _missing(why: str, purpose: str) -> None:
    """Skip, or fail under CI=true, where the reference servers must be there."""
    if os.environ.get("CI"):
        pytest.fail(f"{why}: CI must run {purpose}")
    pytest.skip(why)


def _node_problem(package: Path, *, major: int = 18) -> str | None:
    node = shutil.which("node")
    if node is None:
        return "node is not installed"
    if not package.is_file():
        return f"{package.relative_to(NODE_DIR)} is missing (run scripts/bootstrap)"
    version = subprocess.run(
        [node, "--version"], capture_output=True, text=True, check=True
    ).stdout
    if int(version.lstrip("v").split(".")[0]) < major:
        return f"{package.parent.parent.name} needs Node.js {major}+ (not {version.strip()})"
    return None


@dataclass
class HttpServer:
    """server-everything in one of its HTTP modes, on 127.0.0.1."""

    mode: str
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    said: list[str] = field(default_factory=list)
    """What it wrote to stderr (its last lines, for a failure's message)."""

    def start(self) -> HttpServer:
        return self.launch().wait()

    def launch(self) -> HttpServer:
        """Start it (``wait`` for its port): several start at once."""
        self.proc = subprocess.Popen(
            [shutil.which("node") or "node", "--import", LOOPBACK, str(EVERYTHING), self.mode],
            env={**os.environ, "PORT": str(self.port)},
            cwd=NODE_DIR,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,  # it logs every request there
            stderr=subprocess.PIPE,
        )  # fmt: skip
        return self

    def wait(self) -> HttpServer:
        proc = self.proc
        assert proc is not None
        assert proc.stderr is not None
        for raw in proc.stderr:
            line = raw.decode(errors="replace").strip()
            if line.startswith("memorizz-test listening "):
                self.port = int(line.rsplit(" ", 1)[1])
                break
            self.said.append(line)
        else:
            raise RuntimeError(
                f"server-everything {self.mode} did not start: {self.said}"
            )
        threading.Thread(target=self._drain, args=(proc,), daemon=True).start()
        return self

    def _drain(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stderr is not None
        for raw in proc.stderr:
            self.said[:] = [*self.said[-20:], raw.decode(errors="replace").rstrip()]
        proc.stderr.close()

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None

    def url(self, transport: str) -> str:
        return f"http://127.0.0.1:{self.port}{PATHS[transport]}"


@dataclass
class References:
    """The module's daemon and the reference servers it serves (by name)."""

    daemon: DaemonHarness
    http: dict[str, HttpServer]
    """The HTTP servers behind the daemon's entries, by entry name."""
    root: Path
    """server-filesystem's allowed directory."""
    outside: Path
    """A directory beside it, outside it."""
    missing: dict[str, tuple[str, str]]
    """Why a server is not served, and what it was to test, by server kind."""

    def need(self, kind: str) -> None:
        if kind in self.missing:
            _missing(*self.missing[kind])


def _everything_spec(
    name: str, transport: str, server: HttpServer | None
) -> ServerSpec:
    if server is None:
        return ServerSpec(
            name=name,
            transport="stdio",
            command=shutil.which("node") or "node",
            args=[str(EVERYTHING), "stdio"],
        )
    return http_spec(name, server.url(transport), transport)


@pytest.fixture(scope="module")
def refs() -> Iterator[References]:
    """One daemon with every reference server found, all started at once:
    server-everything on each transport (twice: ``ev_*`` for the tests that
    leave it running, ``re_*`` for those that restart it), server-filesystem
    (``fs``; ``fs_roots``, given its root by the daemon's ``roots``), and
    mcp-server-time in each era (``time``: the daemon's choice, 2026-07-28;
    ``time_legacy``: the handshake)."""
    base = short_tempdir("mz-refs-")
    root = Path(base) / "root"
    outside = Path(base) / "outside"
    root.mkdir()
    outside.mkdir()
    missing: dict[str, tuple[str, str]] = {}
    specs: list[ServerSpec] = []
    http: dict[str, HttpServer] = {}
    with contextlib.ExitStack() as stack:
        stack.callback(rmtree, base)
        if problem := _node_problem(EVERYTHING):
            missing["everything"] = (problem, "server-everything")
        else:
            entries = [(f"{p}_{t}", t) for p in ("ev", "re") for t in TRANSPORTS]
            for name, transport in entries:
                if transport != "stdio":
                    server = http[name] = HttpServer(MODES[transport])
                    stack.callback(server.stop)
                    server.launch()
            for name, transport in entries:  # started together, waited for in turn
                server = http.get(name)
                specs.append(
                    _everything_spec(name, transport, server and server.wait())
                )
        if problem := _node_problem(FILESYSTEM, major=20):
            missing["filesystem"] = (problem, "server-filesystem")
        else:
            command = shutil.which("node") or "node"
            # write_file says destructiveHint: its calls would wait for an
            # operator's approval; here an operator classed it ``write``.
            risk: dict[str, m.Risk] = {"write_file": "write"}
            specs.append(
                ServerSpec(
                    name="fs",
                    transport="stdio",
                    command=command,
                    args=[str(FILESYSTEM), str(root)],
                    risk=risk,
                )
            )
            specs.append(
                ServerSpec(
                    name="fs_roots",
                    transport="stdio",
                    command=command,
                    args=[str(FILESYSTEM), str(root)],
                    roots=[outside.as_uri()],
                )
            )
        if not os.access(TIME_SERVER, os.X_OK):
            why = f"{TIME_SERVER} is missing (run scripts/bootstrap)"
            missing["time"] = (why, "mcp-server-time")
        else:
            eras: list[tuple[str, m.ProtocolMode]] = [
                ("time", "auto"),
                ("time_legacy", "legacy"),
            ]
            for name, protocol in eras:
                specs.append(
                    ServerSpec(
                        name=name,
                        transport="stdio",
                        command=str(TIME_SERVER),
                        args=["--local-timezone", "Europe/Paris"],
                        protocol=protocol,
                    )
                )
        config = daemon_config(base, servers=specs)
        daemon = stack.enter_context(DaemonHarness.running(config))
        for spec in specs:
            daemon.wait_ready(spec.name)
        yield References(daemon, http, root, outside, missing)


@pytest.fixture(params=TRANSPORTS)
def everything(refs: References, request: pytest.FixtureRequest) -> str:
    """The name of server-everything's entry on one transport."""
    refs.need("everything")
    return f"ev_{request.param}"


@pytest.fixture
def client(refs: References) -> Iterator[Client]:
    with refs.daemon.client() as c:
        yield c


def _text(result: m.ToolsCallResult) -> str:
    assert result.content, result
    first = result.content[0]
    assert first["type"] == "text", first
    return str(first["text"])


def _echoes(client: Client, server: str, message: str) -> None:
    """``server`` answers an ``echo`` of ``message`` (it is up and serving)."""
    echoed = _text(client.call_tool(server, "echo", {"message": message}))
    assert echoed == f"Echo: {message}"


# --- server-everything -------------------------------------------------------


def test_everything_lists_every_tool(client: Client, everything: str) -> None:
    tools = {tool.name: tool for tool in client.list_tools(everything, refresh=True)}
    assert len(tools) > 10
    assert set(tools) == known_tools() - UNDECLARED_TOOLS
    assert client.server_status(everything)[0].tool_count == len(tools)
    assert tools["echo"].input_schema["required"] == ["message"]
    assert tools["get-sum"].annotations == {
        "readOnlyHint": True,
        "destructiveHint": False,
        "idempotentHint": True,
        "openWorldHint": False,
    }
    assert tools["get-sum"].risk == "read"
    status = client.server_status(everything)[0]
    assert status.server_name == "mcp-servers/everything"
    assert status.protocol_version == "2025-11-25"


def test_everything_echoes_and_adds(client: Client, everything: str) -> None:
    message = f'héllo ✓ {everything} "quoted" \\ back'
    echoed = client.call_tool(everything, "echo", {"message": message})
    assert not echoed.is_error
    assert _text(echoed) == f"Echo: {message}"
    summed = client.call_tool(everything, "get-sum", {"a": 2.5, "b": 40})
    assert _text(summed) == "The sum of 2.5 and 40 is 42.5."


def test_everything_reports_progress_of_a_long_operation(
    client: Client, everything: str
) -> None:
    reports: list[m.ProgressParams] = []
    result = client.call_tool(
        everything,
        "trigger-long-running-operation",
        {"duration": 0.3, "steps": 3},
        on_progress=reports.append,
    )
    assert (
        _text(result)
        == "Long running operation completed. Duration: 0.3 seconds, Steps: 3."
    )
    assert [(r.progress, r.total) for r in reports] == [(1, 3), (2, 3), (3, 3)]


def test_everything_progress_of_calls_in_parallel_reaches_each_its_caller(
    refs: References, everything: str
) -> None:
    """Three callers at once on the one warm session, each with its own
    number of steps: each hears its own progress, all of it, and only it."""
    heard: dict[int, list[tuple[float, float | None]]] = {}
    failures: list[BaseException] = []

    def call(steps: int) -> None:
        try:
            with refs.daemon.client() as c:
                got: list[m.ProgressParams] = []
                c.call_tool(
                    everything,
                    "trigger-long-running-operation",
                    {"duration": 0.1 * steps, "steps": steps},
                    on_progress=got.append,
                )
                heard[steps] = [(r.progress, r.total) for r in got]
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    threads = [threading.Thread(target=call, args=(steps,)) for steps in (2, 3, 4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert failures == []
    assert heard == {
        steps: [(float(i), float(steps)) for i in range(1, steps + 1)]
        for steps in (2, 3, 4)
    }


def test_everything_lists_every_resource_and_reads_text_and_blob(
    client: Client, everything: str
) -> None:
    """Every static resource (one per file of its docs/, on as many pages as
    the server makes: 2026.8.31, on the TypeScript SDK's ``McpServer``, sends
    one page without ``nextCursor``), each once; a text one is the file; a
    blob is base64."""
    listed = client.list_resources(everything)
    uris = [resource.uri for resource in listed]
    static = [uri for uri in uris if uri.startswith("demo://resource/static/document/")]
    files = sorted(path.name for path in DOCS.iterdir() if path.is_file())
    assert len(files) > 1
    assert len(uris) == len(set(uris)), "a resource listed twice"
    assert sorted(uri.rsplit("/", 1)[1] for uri in static) == files
    instructions = "demo://resource/static/document/instructions.md"
    text = client.read_resource(everything, instructions).contents
    assert text == [
        {
            "uri": instructions,
            "mimeType": "text/markdown",
            "text": (DOCS / "instructions.md").read_text(encoding="utf-8"),
        }
    ]
    blob = client.read_resource(everything, "demo://resource/dynamic/blob/7").contents
    assert len(blob) == 1
    assert "text" not in blob[0]
    assert base64.b64decode(blob[0]["blob"]).startswith(
        b"Resource 7: This is a base64 blob created at "
    )


def test_everything_resource_templates_list_and_expand(
    client: Client, everything: str
) -> None:
    templates = client.list_resource_templates(everything)
    assert {t.uri_template for t in templates} == TEMPLATES
    read = client.read_resource(everything, "demo://resource/dynamic/text/42")
    assert read.contents[0]["uri"] == "demo://resource/dynamic/text/42"
    assert read.contents[0]["text"].startswith(
        "Resource 42: This is a plaintext resource created at "
    )
    with pytest.raises(UpstreamError) as refused:
        client.read_resource(everything, "demo://resource/dynamic/text/nope")
    assert refused.value.data["server"] == everything


def test_everything_resource_made_by_a_tool_is_listed_and_read(
    client: Client, everything: str
) -> None:
    """``gzip-file-as-resource`` registers a resource in the session (and says
    the list changed): the daemon's listing has it at once, and it reads
    back as the gzip of what was sent."""
    original = f"reference {everything} ".encode() * 50
    data = "data:text/plain;base64," + base64.b64encode(original).decode()
    name = f"{everything}.txt.gz"
    made = client.call_tool(
        everything, "gzip-file-as-resource", {"name": name, "data": data}
    )
    uri = f"demo://resource/session/{name}"
    assert made.content == [
        {
            "type": "resource_link",
            "uri": uri,
            "name": name,
            "mimeType": "application/gzip",
        }
    ]
    assert uri in {resource.uri for resource in client.list_resources(everything)}
    read = client.read_resource(everything, uri).contents
    assert gzip.decompress(base64.b64decode(read[0]["blob"])) == original


def test_everything_prompts_list_and_get_with_arguments(
    client: Client, everything: str
) -> None:
    prompts = {prompt.name: prompt for prompt in client.list_prompts(everything)}
    assert set(prompts) == PROMPTS
    arguments = prompts["args-prompt"].arguments or []
    assert {a.name: bool(a.required) for a in arguments} == {
        "city": True,
        "state": False,
    }
    got = client.get_prompt(
        everything, "args-prompt", {"city": "Lyon", "state": "Rhône"}
    )
    assert got.messages == [
        {
            "role": "user",
            "content": {"type": "text", "text": "What's weather in Lyon, Rhône?"},
        }
    ]
    team = client.get_prompt(
        everything, "completable-prompt", {"department": "Engineering", "name": "Alice"}
    )
    assert team.messages[0]["content"]["text"] == (
        "Please promote Alice to the head of the Engineering team."
    )
    embedded = client.get_prompt(
        everything, "resource-prompt", {"resourceType": "Blob", "resourceId": "3"}
    )
    resource = embedded.messages[1]["content"]["resource"]
    assert resource["uri"] == "demo://resource/dynamic/blob/3"
    assert base64.b64decode(resource["blob"]).startswith(b"Resource 3: ")
    with pytest.raises(UpstreamError):
        client.get_prompt(
            everything, "resource-prompt", {"resourceType": "Nope", "resourceId": "3"}
        )


def test_everything_log_messages_reach_the_callers_at_their_level(
    refs: References, client: Client, everything: str
) -> None:
    """Two callers with a call in flight, one listening from ``debug``, one
    from ``warning``: each toggle of ``toggle-simulated-logging`` on logs one
    message of a random level at once; the first caller hears every one, the
    second exactly those at ``warning`` or above."""
    heard: dict[str, list[tuple[str, Any]]] = {}
    failures: list[BaseException] = []

    def listen(level: str) -> None:
        try:
            with refs.daemon.client() as c:
                c.hello(capabilities={"logging": {"level": level}})
                got: list[m.LogParams] = []
                c.call_tool(
                    everything,
                    "trigger-long-running-operation",
                    # long enough for the 16 toggles below on a loaded host
                    {"duration": 3.0, "steps": 1},
                    on_log=got.append,
                )
                assert {log.server for log in got} <= {everything}
                heard[level] = [(log.level, log.data) for log in got]
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    threads = [
        threading.Thread(target=listen, args=(lvl,)) for lvl in ("debug", "warning")
    ]
    for thread in threads:
        thread.start()
    wait_until(
        lambda: client.server_status(everything)[0].in_flight == 2, what="two calls"
    )
    toggles = 8
    for _ in range(toggles):  # on (one message at once), then off again
        assert _text(
            client.call_tool(everything, "toggle-simulated-logging", {})
        ).startswith("Started")
        assert _text(
            client.call_tool(everything, "toggle-simulated-logging", {})
        ).startswith("Stopped")
    for thread in threads:
        thread.join(30)
    assert failures == []
    every = heard["debug"]
    assert len(every) == toggles, every
    assert all(str(data).startswith(level.capitalize()) for level, data in every)
    assert heard["warning"] == [
        (level, data)
        for level, data in every
        if LEVELS.index(level) >= LEVELS.index("warning")
    ]


def test_everything_elicits_and_samples_through_the_caller(
    client: Client, everything: str
) -> None:
    asked: list[dict[str, Any]] = []

    def elicit(params: dict[str, Any]) -> dict[str, Any]:
        asked.append(params)
        return {"action": "accept", "content": {"name": "Ada Lovelace", "check": True}}

    elicited = client.call_tool(
        everything, "trigger-elicitation-request", {}, on_elicit=elicit
    )
    assert [p["message"] for p in asked] == [
        "Please provide inputs for the following fields:"
    ]
    assert "- Name: Ada Lovelace" in elicited.content[1]["text"]

    def sample(params: dict[str, Any]) -> dict[str, Any]:
        assert params["messages"][0]["content"]["text"].endswith("context: count sheep")
        return {
            "role": "assistant",
            "content": {"type": "text", "text": "one, two, three"},
            "model": "reference-test",
        }

    sampled = client.call_tool(
        everything, "trigger-sampling-request", {"prompt": "count sheep", "maxTokens": 20},
        on_sample=sample,
    )  # fmt: skip
    assert '"text": "one, two, three"' in _text(sampled)
    assert '"model": "reference-test"' in _text(sampled)


def test_everything_structured_content_and_images_pass_through(
    client: Client, everything: str
) -> None:
    structured = client.call_tool(
        everything, "get-structured-content", {"location": "Chicago"}
    )
    assert structured.structured_content is not None
    assert set(structured.structured_content) == {
        "temperature",
        "conditions",
        "humidity",
    }
    assert _text(structured).startswith("{")
    image = client.call_tool(everything, "get-tiny-image", {})
    [picture] = [c for c in image.content if c["type"] == "image"]
    assert picture["mimeType"] == "image/png"
    assert base64.b64decode(picture["data"])[:8] == b"\x89PNG\r\n\x1a\n"


def test_everything_errors_are_the_servers_not_the_daemons(
    client: Client, everything: str
) -> None:
    """Arguments it refuses and a tool it lacks are tool errors (isError, its
    words); a call past its deadline is ours, and the session goes on."""
    refused = client.call_tool(everything, "get-sum", {"a": "two", "b": 2})
    assert refused.is_error
    assert "Input validation error" in _text(refused)
    unknown = client.call_tool(everything, "no-such-tool", {})
    assert unknown.is_error
    assert "no-such-tool not found" in _text(unknown)
    with pytest.raises(DeadlineExceededError):
        client.call_tool(
            everything,
            "trigger-long-running-operation",
            {"duration": 3, "steps": 3},
            timeout_s=0.3,
        )
    _echoes(client, everything, "still")
    assert client.server_status(everything)[0].restarts == 0


def test_everything_tasks_run_on_every_transport(refs: References) -> None:
    """``simulate-research-query`` takes tasks only (``taskSupport:
    required``): started as one on each transport at once, each ends with its
    report (four stages of a second each, so all are waited for together)."""
    refs.need("everything")
    reports: dict[str, str] = {}
    failures: list[BaseException] = []

    def research(name: str) -> None:
        try:
            with refs.daemon.client() as c:
                task = c.call_tool_task(
                    name, "simulate-research-query", {"topic": name}
                )
                assert task.status == "working"
                result = c.task_result(task.task_id, timeout_s=20)
                reports[name] = _text(result)
                assert c.get_task(task.task_id).status == "completed"
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    names = [f"ev_{transport}" for transport in TRANSPORTS]
    threads = [threading.Thread(target=research, args=(name,)) for name in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert failures == []
    assert set(reports) == set(names)
    for name, report in reports.items():
        assert report.startswith(f"# Research Report: {name}\n")


def test_everything_over_stdio_survives_its_restart(
    refs: References, client: Client
) -> None:
    """Killed, it is started again, and answers."""
    refs.need("everything")
    status = client.server_status("re_stdio")[0]
    _echoes(client, "re_stdio", "before")
    assert status.pid is not None
    os.kill(status.pid, signal.SIGKILL)
    wait_until(
        lambda: (
            (s := client.server_status("re_stdio")[0]).state == "ready"
            and s.pid not in (None, status.pid)
        ),
        what="a new process",
    )
    _echoes(client, "re_stdio", "after")
    assert client.server_status("re_stdio")[0].restarts == status.restarts + 1


def test_everything_over_sse_survives_its_restart(
    refs: References, client: Client
) -> None:
    """Its event stream ends when it stops: the session is over (every answer
    comes on that stream), and the daemon sees so without a call; once it is
    back on its port, the next call is answered."""
    refs.need("everything")
    name, server = "re_sse", refs.http["re_sse"]
    before = client.server_status(name)[0]
    _echoes(client, name, "before")
    server.stop()
    wait_until(
        lambda: client.server_status(name)[0].restarts > before.restarts,
        timeout=5,
        what="the daemon to see the stream end",
    )
    server.start()
    wait_until(lambda: client.server_status(name)[0].state == "ready", what="ready")
    _echoes(client, name, "after")


def test_everything_over_streamable_http_survives_its_restart(
    refs: References, client: Client
) -> None:
    """Restarted, it no longer knows the session: it answers the old session
    id with HTTP 400 "No valid session ID provided" (where the spec says
    404). The request was not run: the daemon starts a new session and sends
    it again, and the first call after the restart is answered."""
    refs.need("everything")
    name, server = "re_streamable_http", refs.http["re_streamable_http"]
    before = client.server_status(name)[0]
    _echoes(client, name, "before")
    server.stop()
    server.start()
    _echoes(client, name, "after")
    assert client.server_status(name)[0].restarts == before.restarts + 1
    summed = client.call_tool(name, "get-sum", {"a": 1, "b": 2})
    assert _text(summed) == "The sum of 1 and 2 is 3."


# --- server-filesystem -------------------------------------------------------


@pytest.fixture
def filesystem(refs: References) -> References:
    refs.need("filesystem")
    return refs


def test_filesystem_writes_and_reads_inside_its_root(
    filesystem: References, client: Client
) -> None:
    root = filesystem.root
    allowed = client.call_tool("fs", "list_allowed_directories", {})
    assert _text(allowed) == f"Allowed directories:\n{root}"
    content = "première ligne\nsecond line ✓\n"
    path = root / "notes" / "a.txt"
    path.parent.mkdir(exist_ok=True)
    written = client.call_tool(
        "fs", "write_file", {"path": str(path), "content": content}
    )
    assert not written.is_error, written
    assert path.read_text(encoding="utf-8") == content
    read = client.call_tool("fs", "read_text_file", {"path": str(path)})
    assert _text(read) == content
    listing = client.call_tool("fs", "list_directory", {"path": str(path.parent)})
    assert _text(listing) == "[FILE] a.txt"
    head = client.call_tool("fs", "read_text_file", {"path": str(path), "head": 1})
    assert _text(head) == "première ligne"


def test_filesystem_refuses_paths_outside_its_root_as_tool_errors(
    filesystem: References, client: Client
) -> None:
    """Outside its root (named outright, by ``..``, or through a symlink in
    it) the server refuses: a tool error in its words, never the daemon's."""
    root, outside = filesystem.root, filesystem.outside
    secret = outside / "secret.txt"
    secret.write_text("not for you", encoding="utf-8")
    link = root / "link-out"
    link.symlink_to(secret)
    for path in (str(secret), f"{root}/../outside/secret.txt", str(link)):
        refused = client.call_tool("fs", "read_text_file", {"path": path})
        assert refused.is_error, path
        assert "Access denied" in _text(refused), _text(refused)
        assert "not for you" not in _text(refused)
    escape = outside / "escape.txt"
    written = client.call_tool(
        "fs", "write_file", {"path": f"{root}/../outside/escape.txt", "content": "x"}
    )
    assert written.is_error
    assert not escape.exists()
    assert client.server_status("fs")[0].restarts == 0


def test_filesystem_takes_its_roots_from_the_daemon(
    filesystem: References, client: Client
) -> None:
    """``roots`` in the server's entry: the daemon declares roots and answers
    ``roots/list`` with them, and server-filesystem works in them instead of
    the directory it was started with."""
    outside = filesystem.outside
    allowed = f"Allowed directories:\n{outside}"
    wait_until(
        lambda: (
            _text(client.call_tool("fs_roots", "list_allowed_directories", {}))
            == allowed
        ),
        timeout=10,
        what="the roots to be taken",
    )
    (outside / "rooted.txt").write_text("in the root", encoding="utf-8")
    read = client.call_tool(
        "fs_roots", "read_text_file", {"path": str(outside / "rooted.txt")}
    )
    assert _text(read) == "in the root"
    started_in = filesystem.root / "started-in.txt"
    started_in.write_text("no longer allowed", encoding="utf-8")
    refused = client.call_tool("fs_roots", "read_text_file", {"path": str(started_in)})
    assert refused.is_error
    assert "Access denied" in _text(refused)


# --- mcp-server-time ---------------------------------------------------------


@pytest.fixture(
    params=[("time", "2026-07-28"), ("time_legacy", "2025-11-25")],
    ids=["modern", "legacy"],
)
def time_server(
    refs: References, client: Client, request: pytest.FixtureRequest
) -> str:
    refs.need("time")
    name, era = request.param
    status = client.server_status(name)[0]
    assert (status.server_name, status.protocol_version) == ("mcp-time", era)
    return str(name)


def test_time_gets_the_current_time(client: Client, time_server: str) -> None:
    assert {tool.name for tool in client.list_tools(time_server)} == {
        "get_current_time",
        "convert_time",
    }
    result = client.call_tool(
        time_server, "get_current_time", {"timezone": "Asia/Tokyo"}
    )
    assert not result.is_error
    structured = result.structured_content
    assert structured is not None
    assert structured["timezone"] == "Asia/Tokyo"
    told = datetime.datetime.fromisoformat(structured["datetime"])
    assert told.utcoffset() == datetime.timedelta(hours=9)
    now = datetime.datetime.now(datetime.UTC)
    assert abs((told - now).total_seconds()) < 120
    assert structured["day_of_week"] == told.strftime("%A")


def test_time_converts_between_timezones(client: Client, time_server: str) -> None:
    result = client.call_tool(
        time_server,
        "convert_time",
        {
            "source_timezone": "UTC",
            "time": "12:00",
            "target_timezone": "Asia/Kathmandu",
        },
    )
    assert not result.is_error
    converted = result.structured_content
    assert converted is not None
    assert converted["source"]["datetime"].endswith("T12:00:00+00:00")
    assert converted["target"]["datetime"].endswith("T17:45:00+05:45")
    assert converted["time_difference"] == "+5.75h"
    refused = client.call_tool(
        time_server,
        "convert_time",
        {"source_timezone": "Mars/Olympus", "time": "12:00", "target_timezone": "UTC"},
    )
    assert refused.is_error
    assert "Invalid timezone" in _text(refused)
    with pytest.raises(UpstreamError) as unknown:
        client.call_tool(time_server, "no_such_tool", {})
    assert unknown.value.data == {"server": time_server, "upstream_code": -32602}
