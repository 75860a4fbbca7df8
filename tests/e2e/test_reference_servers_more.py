"""Three more reference servers nobody here wrote, over stdio (their only
transport), each seen directly by the official Python SDK client and through
memorizz, call by call:

* npm ``@modelcontextprotocol/server-memory`` (tests/node): a knowledge graph
  kept in a JSONL file (``MEMORY_FILE_PATH``, here a temporary one);
* npm ``@modelcontextprotocol/server-sequential-thinking`` (tests/node): a
  history of thoughts, with revisions and branches, kept in the process;
* PyPI ``mcp-server-git`` (``.venv-refs``) confined to a temporary git
  repository made here (no remote, no network).

Through memorizz means the socket API (``memorizz.Client``, results as
relayed: ``raw``), the MCP face (the same SDK client over ``memorizzctl mcp
serve``, unscoped: every tool is ``SERVER__TOOL``, docs/mcp-clients.md,
"Names") and ``memorizzctl`` itself (a subprocess: ``mcp tools``, ``mcp
call``). Each tool listed must be the server's own (names, titles,
descriptions, schemas, annotations) but for what the docs say memorizz adds;
a realistic session of calls must give the same results; the server's
refusals (bad arguments, an unknown entity, a path outside the repository, a
tool it lacks) must arrive as the same ``isError`` results or errors.

The servers keep state (a file, a process's memory, a repository), so the
daemon's copy of each must have lived the same history as the direct one:
one direct session makes both passes of calls (``World.steps``, runs 1 and
2), then the daemon's server makes the first through the socket API and the
second through the face. The file and the repository are one path, put back
as they were (``World.reset``) before each side's passes, so no path differs
either; git's commits are made at one pinned moment by one pinned author
(``GIT_ENV``), so their hashes and dates are the same too. Nothing is
normalised away.

``scripts/bootstrap`` installs the servers (pinned in tests/node/package.json
and scripts/bootstrap); a test of one that is missing skips, and fails under
CI=true (``tests.e2e.test_reference_servers._missing``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import MCPError

from memorizz import Client as ApiClient
from memorizz.api import methods as m
from memorizz.api.errors import RemoteError
from memorizz.api.methods import ServerSpec
from tests.e2e.test_reference_differential import relayed_error
from tests.e2e.test_reference_servers import REFS_VENV, _missing, _node_problem
from tests.harness import NODE_DIR, DaemonHarness, daemon_config, rmtree, short_tempdir
from tests.process import MEMORIZZCTL

pytestmark = pytest.mark.filterwarnings(
    "ignore::mcp.shared.exceptions.MCPDeprecationWarning"
)

PACKAGES = NODE_DIR / "node_modules/@modelcontextprotocol"
MEMORY = PACKAGES / "server-memory/dist/index.js"
THINKING = PACKAGES / "server-sequential-thinking/dist/index.js"
GIT_SERVER = REFS_VENV / "bin/mcp-server-git"
NODE = shutil.which("node") or "node"
GIT = shutil.which("git")
"""git itself: the test makes its repositories with it, and GitPython runs it."""

SERVERS = ["memory", "thinking", "git"]
"""The daemon's entries, one per server (and the tests' parameters)."""
MODES = {"memory": "legacy", "thinking": "legacy", "git": "auto"}
"""The era each server is spoken to in, directly and on the face: the two
TypeScript SDK 1.x servers speak only the handshake; mcp-server-git (Python
SDK 2.3) also 2026-07-28, which the daemon takes with it too (``auto``)."""
SEPARATOR = "__"
"""The operator face's ``face_separator`` (its default)."""

MOMENT = "1772600767 +0000"
"""2026-03-04 05:06:07 UTC in git's internal format (GitPython refuses ISO 8601 with an offset)."""
GIT_ENV = {
    # Commits made at one moment by one person: the same tree on the same
    # parent is then the same commit, with the same hash, whoever makes it;
    # so no hash, date or author in git_log or git_show is normalised away.
    "GIT_AUTHOR_NAME": "Ada Lovelace",
    "GIT_AUTHOR_EMAIL": "ada@example.org",
    "GIT_AUTHOR_DATE": MOMENT,
    "GIT_COMMITTER_NAME": "Ada Lovelace",
    "GIT_COMMITTER_EMAIL": "ada@example.org",
    "GIT_COMMITTER_DATE": MOMENT,
    # The host's git configuration and language stay out of git's words. The
    # daemon passes its LANG on to a stdio server (docs/configuration.md,
    # "Servers entries"), the SDK client does not: both get this one instead.
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "LC_ALL": "C",
}


# --- the calls ---------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    key: str
    tool: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Write:
    """Not a call: the test changes a file in the repository, as a user would
    between two calls (the same bytes before each side's call)."""

    path: Path
    text: str

    def write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(self.text, encoding="utf-8")


@dataclass(frozen=True)
class Read:
    """A resource read (URIs are not renamed on the face)."""

    key: str
    uri: str


Step = Call | Write | Read
GRAPH = "memory://knowledge-graph"
"""server-memory's one resource: the whole graph, as JSON."""


def memory_pass(run: int) -> list[Step]:
    """A small graph made, related, observed, read, searched and pruned. Run
    again on what the first left, the server answers with only what is new."""
    people = [
        {"name": "Ada Lovelace", "entityType": "person", "observations": ["wrote the first program"]},
        {"name": "Analytical Engine", "entityType": "machine", "observations": ["never finished"]},
        {"name": "Charles Babbage", "entityType": "person", "observations": []},
    ]  # fmt: skip
    relations = [
        {"from": "Ada Lovelace", "to": "Analytical Engine", "relationType": "programmed"},
        {"from": "Charles Babbage", "to": "Analytical Engine", "relationType": "designed"},
    ]  # fmt: skip
    observations = [
        {"entityName": "Ada Lovelace", "contents": ["née Byron ✓", "wrote the first program"]},
        {"entityName": "Charles Babbage", "contents": [f"seen in pass {run}"]},
    ]  # fmt: skip
    return [
        Call("create", "create_entities", {"entities": people}),
        Call("relate", "create_relations", {"relations": relations}),
        Call("observe", "add_observations", {"observations": observations}),
        Call("graph", "read_graph", {}),
        Call("search", "search_nodes", {"query": "ENGINE"}),
        Call("open", "open_nodes", {"names": ["Charles Babbage"]}),
        Call("delete", "delete_entities", {"entityNames": ["Charles Babbage"]}),
        Call("after", "read_graph", {}),
        Read("resource", GRAPH),
    ]


def thinking_pass(run: int) -> list[Step]:
    """Thoughts in order, one revising an earlier one, a branch from one, and
    a last one with its numbers and booleans as strings (the server coerces
    them; memorizz sends arguments as they are)."""
    thoughts = [
        {"thought": "Split the problem in two", "thoughtNumber": 1, "totalThoughts": 3, "nextThoughtNeeded": True},
        {"thought": "The first half is easy", "thoughtNumber": 2, "totalThoughts": 3, "nextThoughtNeeded": True},
        {"thought": "It is not: it needs the second half", "thoughtNumber": 3, "totalThoughts": 4,
         "nextThoughtNeeded": True, "isRevision": True, "revisesThought": 2},
        {"thought": "Try the halves the other way round ✓", "thoughtNumber": 4, "totalThoughts": 5,
         "nextThoughtNeeded": True, "branchFromThought": 2, "branchId": f"reversed-{run}"},
        {"thought": "Done", "thoughtNumber": "6", "totalThoughts": "5",
         "nextThoughtNeeded": "false", "needsMoreThoughts": "FALSE"},
    ]  # fmt: skip
    return [
        Call(f"thought {n}", "sequentialthinking", thought)
        for n, thought in enumerate(thoughts, 1)
    ]


def git_pass(repo: Path, run: int) -> list[Step]:
    """A change looked at, staged, committed and looked at again; staging
    nothing new and committing nothing are answered (not errors of ours)."""
    at = {"repo_path": str(repo)}
    notes = f"notes/pass-{run}.md"
    return [
        Write(repo / "a.txt", "one\n" + "".join(f"line {n} ✓\n" for n in range(2, run + 3))),
        Write(repo / notes, f"# Pass {run}\n\nnothing to see\n"),
        Call("status", "git_status", at),
        Call("unstaged", "git_diff_unstaged", at),
        Call("add", "git_add", {**at, "files": ["a.txt", notes]}),
        Call("add again", "git_add", {**at, "files": ["a.txt"]}),
        Call("staged", "git_diff_staged", {**at, "context_lines": 1}),
        Call("commit", "git_commit", {**at, "message": f"Pass {run}: more lines ✓"}),
        Call("commit nothing", "git_commit", {**at, "message": "nothing"}),
        Call("log", "git_log", {**at, "max_count": 5}),
        Call("diff", "git_diff", {**at, "target": "HEAD~1"}),
        Call("show", "git_show", {**at, "revision": "HEAD"}),
        Call("show file", "git_show", {**at, "revision": f"HEAD:{notes}"}),
        Call("clean", "git_status", at),
    ]  # fmt: skip


def error_calls(server: str, world: World) -> list[Call]:
    """What each server refuses; none of it changes its state."""
    if server == "memory":
        return [
            Call("unknown entity", "add_observations", {"observations": [{"entityName": "Nobody", "contents": ["x"]}]}),
            Call("bad arguments", "create_entities", {"entities": [{"name": "half"}]}),
            Call("unknown tool", "forget_everything", {}),
        ]  # fmt: skip
    if server == "thinking":
        return [
            Call("bad arguments", "sequentialthinking", {"thought": "?", "thoughtNumber": 0, "totalThoughts": 1, "nextThoughtNeeded": "maybe"}),
            Call("missing arguments", "sequentialthinking", {}),
            Call("unknown tool", "think_harder", {}),
        ]  # fmt: skip
    at = {"repo_path": str(world.repo)}
    return [
        Call("repository outside", "git_status", {"repo_path": str(world.outside)}),
        Call("path outside", "git_add", {**at, "files": ["../outside/secret.txt"]}),
        Call("unknown revision", "git_show", {**at, "revision": "no-such-branch"}),
        Call("bad arguments", "git_log", {**at, "max_count": "many"}),
        Call("missing arguments", "git_status", {}),
        Call("unknown tool", "git_push", at),
    ]  # fmt: skip


# --- what each side saw, as data ---------------------------------------------


def sdk_data(value: Any, *, sent: bool = False) -> Any:
    """What the SDK client got, as data: a result as its client reads it
    (``sent``: only what the server sent, without the SDK model's defaults,
    to set beside what the socket API relays); an error as
    ``{"error", "message", "data"}``."""
    if isinstance(value, MCPError):
        error = value.error
        return {"error": error.code, "message": error.message, "data": error.data}
    if isinstance(value, dict):
        return {k: sdk_data(v, sent=sent) for k, v in value.items()}
    return value.model_dump(
        mode="json", by_alias=True, exclude_none=True, exclude_unset=sent
    )


def api_failure(exc: RemoteError) -> dict[str, Any]:
    data = {"reason": exc.reason, **exc.data}
    return {"error": exc.code, "message": exc.message, "data": data}


async def sdk_calls(
    client: Client, steps: Sequence[Step], prefix: str = ""
) -> dict[str, Any]:
    """``steps`` made by an SDK client (each tool's name after ``prefix``)."""
    seen: dict[str, Any] = {}
    for step in steps:
        if isinstance(step, Write):
            step.write()
            continue
        try:
            if isinstance(step, Read):
                seen[step.key] = await client.read_resource(step.uri)
            else:
                tool = prefix + step.tool
                seen[step.key] = await client.call_tool(tool, step.arguments)
        except MCPError as exc:
            seen[step.key] = exc
    return seen


def api_calls(c: ApiClient, server: str, steps: Sequence[Step]) -> dict[str, Any]:
    """``steps`` made over the socket API, each result as relayed."""
    seen: dict[str, Any] = {}
    for step in steps:
        if isinstance(step, Write):
            step.write()
            continue
        try:
            if isinstance(step, Read):
                params = m.ResourcesReadParams(server=server, uri=step.uri)
                raw = c.call(m.RESOURCES_READ, params, raw=True)
            else:
                raw = c.call_tool(server, step.tool, step.arguments, raw=True)
            seen[step.key] = msgspec.json.decode(raw)
        except RemoteError as exc:
            seen[step.key] = api_failure(exc)
    return seen


# --- the servers ---------------------------------------------------------------


@dataclass
class Direct:
    """What one direct session of the SDK client saw of one server."""

    tools: dict[str, Any]
    passes: list[dict[str, Any]]
    errors: dict[str, Any]


@dataclass
class World:
    """The module's daemon, and where its servers keep their state."""

    base: Path
    memory_file: Path
    repo: Path
    """mcp-server-git's repository (``--repository``)."""
    pristine: Path
    """The repository as made, before any pass."""
    outside: Path
    """A git repository beside it, outside it."""
    missing: dict[str, tuple[str, str]]
    """Why a server is not served, and what it was to test, by name."""
    direct: dict[str, Direct] = field(default_factory=dict)
    """What a direct session saw of each server (``_direct``)."""
    daemon: DaemonHarness = field(init=False)
    """Serving every server found, started once the repositories are made."""

    def need(self, server: str) -> None:
        if server in self.missing:
            _missing(*self.missing[server])

    def reset(self, server: str) -> None:
        """The server's file or repository as before any pass (the daemon's
        servers read both afresh at each call: nothing of them is cached)."""
        if server == "memory":
            self.memory_file.unlink(missing_ok=True)
        elif server == "git":
            rmtree(str(self.repo))
            shutil.copytree(self.pristine, self.repo, symlinks=True)

    def steps(self, server: str, run: int) -> list[Step]:
        if server == "memory":
            return memory_pass(run)
        if server == "thinking":
            return thinking_pass(run)
        return git_pass(self.repo, run)

    def direct_params(self, server: str) -> StdioServerParameters:
        """The server as the daemon's entry starts it (``spec``)."""
        spec = self.spec(server)
        assert spec.command is not None
        return StdioServerParameters(
            command=spec.command, args=spec.args, env=spec.env, cwd=spec.cwd
        )

    def spec(self, server: str) -> ServerSpec:
        if server == "memory":
            return ServerSpec(
                name=server,
                transport="stdio",
                command=NODE,
                args=[str(MEMORY)],
                env={"MEMORY_FILE_PATH": str(self.memory_file)},
                # delete_entities says destructiveHint (ask: its call would
                # wait for an operator's approval); here an operator classed
                # it ``write``.
                risk={"delete_entities": "write"},
            )
        if server == "thinking":
            return ServerSpec(
                name=server, transport="stdio", command=NODE, args=[str(THINKING)]
            )
        return ServerSpec(
            name=server,
            transport="stdio",
            command=str(GIT_SERVER),
            args=["--repository", str(self.repo)],
            env=GIT_ENV,
        )

    def face(self, mode: str) -> Client:
        """The SDK client on the operator's face, unscoped (every server)."""
        args = ["--socket", self.daemon.socket, "mcp", "serve"]
        params = StdioServerParameters(command=MEMORIZZCTL, args=args)
        return Client(stdio_client(params), mode=mode)  # type: ignore[arg-type]

    def ctl(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [MEMORIZZCTL, "--socket", self.daemon.socket, *argv],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )


def _git(repo: Path, *argv: str) -> None:
    subprocess.run(
        [GIT or "git", "-C", str(repo), *argv],
        env={**os.environ, **GIT_ENV},
        check=True,
        capture_output=True,
    )


def _make_repository(repo: Path) -> None:
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    (repo / "a.txt").write_text("one\n", encoding="utf-8")
    (repo / "README.md").write_text("# A repository for the test ✓\n", encoding="utf-8")
    _git(repo, "add", "a.txt", "README.md")
    _git(repo, "commit", "-q", "-m", "First commit")


async def _direct(world: World, server: str) -> Direct:
    """One session of the SDK client with the server run as the daemon runs
    it: its tools, both passes of calls, its refusals."""
    target = stdio_client(world.direct_params(server))
    async with Client(target, mode=MODES[server]) as client:  # type: ignore[arg-type]
        tools = await client.list_tools()
        assert tools.next_cursor is None  # one page: nothing to follow
        errors = await sdk_calls(client, error_calls(server, world))
        passes = [await sdk_calls(client, world.steps(server, run)) for run in (1, 2)]
    return Direct({tool.name: tool for tool in tools.tools}, passes, errors)


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    """One daemon serving every server found (``SERVERS``), and what each
    looked like to a direct session, all sessions at once."""
    base = Path(short_tempdir("mz-refs-more-"))
    world = World(
        base=base,
        memory_file=base / "memory.jsonl",
        repo=base / "repo",
        pristine=base / "pristine",
        outside=base / "outside",
        missing={},
    )
    with contextlib.ExitStack() as stack:
        stack.callback(rmtree, str(base))
        for server, package in (("memory", MEMORY), ("thinking", THINKING)):
            if problem := _node_problem(package):
                world.missing[server] = (problem, package.parents[1].name)
        if not os.access(GIT_SERVER, os.X_OK):
            why = f"{GIT_SERVER} is missing (run scripts/bootstrap)"
            world.missing["git"] = (why, "mcp-server-git")
        elif GIT is None:
            world.missing["git"] = ("git is not installed", "mcp-server-git")
        else:
            _make_repository(world.pristine)
            shutil.copytree(world.pristine, world.repo, symlinks=True)
            _make_repository(world.outside)
            secret = world.outside / "secret.txt"
            secret.write_text("not for you\n", encoding="utf-8")
        served = [s for s in SERVERS if s not in world.missing]
        specs = [world.spec(server) for server in served]
        world.daemon = stack.enter_context(
            DaemonHarness.running(daemon_config(str(base), servers=specs))
        )

        async def sessions() -> None:
            async def one(server: str) -> None:
                if server == "git":  # the repository stays still while it starts
                    await anyio.to_thread.run_sync(world.daemon.wait_ready, server)
                world.direct[server] = await _direct(world, server)

            async with anyio.create_task_group() as group:
                for server in served:
                    group.start_soon(one, server)

        anyio.run(sessions)
        for server in served:
            world.daemon.wait_ready(server)
            world.reset(server)
        yield world


@pytest.fixture(params=SERVERS)
def server(world: World, request: pytest.FixtureRequest) -> str:
    name = str(request.param)
    world.need(name)
    return name


@pytest.fixture(scope="module")
def face_listings(world: World) -> dict[str, dict[str, Any]]:
    """The face's tools, by name, as its client reads them, in each era."""

    async def listing(mode: str) -> dict[str, Any]:
        async with world.face(mode) as client:
            tools = await client.list_tools()
            assert tools.next_cursor is None
            return {tool.name: sdk_data(tool) for tool in tools.tools}

    return {mode: anyio.run(listing, mode) for mode in ("legacy", "auto")}


# --- tools ---------------------------------------------------------------------


def _face_tool(
    server: str, name: str, tool: dict[str, Any], verdict: tuple[str, str]
) -> dict[str, Any]:
    """What the face lists of the server's ``tool`` (as its client reads it):
    the same, but its name (``SERVER__TOOL``) and ``_meta``, which names its
    origin and the daemon's verdict (docs/mcp-clients.md, "Names"), and, for
    a tool decided ``ask``, its description ("The policy")."""
    risk, decision = verdict
    want = {**tool, "name": f"{server}{SEPARATOR}{name}"}
    want["_meta"] = {
        **tool.get("_meta", {}),
        "memorizz/server": server,
        "memorizz/tool": name,
        "memorizz/risk": risk,
        "memorizz/decision": decision,
    }
    if decision == "ask":
        prefix = "[needs an operator's approval before it runs] "
        want["description"] = prefix + tool["description"]
    return want


def test_every_tool_through_memorizz_is_the_servers_own(
    world: World, server: str, face_listings: dict[str, dict[str, Any]]
) -> None:
    """Names, titles, descriptions, input and output schemas, annotations:
    over the socket API as the server sent them, with memorizz's risk class
    and decision beside (docs/protocol.md, "Tool"); on the face, in each era,
    as ``_face_tool`` says; and ``memorizzctl mcp tools`` shows each."""
    direct = world.direct[server].tools
    sent = {name: sdk_data(tool, sent=True) for name, tool in direct.items()}
    assert len(sent) >= 1
    with world.daemon.client() as c:
        raw = c.call(m.TOOLS_LIST, m.ToolsListParams(server=server), raw=True)
    api = {tool["name"]: tool for tool in msgspec.json.decode(raw)["tools"]}
    verdicts = {name: (t.pop("risk"), t.pop("decision")) for name, t in api.items()}
    assert api == sent
    if server == "memory":  # the operator's override (``World.spec``)
        assert verdicts["delete_entities"] == ("write", "allow")
        assert verdicts["delete_relations"] == ("destructive", "ask")
    want = {
        f"{server}{SEPARATOR}{name}": _face_tool(server, name, sdk_data(tool), verdicts[name])
        for name, tool in direct.items()
    }  # fmt: skip
    for mode, listing in face_listings.items():
        mine = {
            k: v for k, v in listing.items() if v["_meta"]["memorizz/server"] == server
        }
        assert mine == want, mode
    served = [s for s in SERVERS if s not in world.missing]
    assert all(
        v["_meta"]["memorizz/server"] in served for v in face_listings["auto"].values()
    )

    shown = world.ctl("mcp", "tools", server)
    assert shown.returncode == 0, shown.stderr
    header, *rows = shown.stdout.splitlines()
    assert header.split() == ["NAME", "RISK", "DECISION", "DESCRIPTION"]
    assert [row.split()[:3] for row in rows] == [
        [name, *verdicts[name]] for name in direct
    ]
    for row, tool in zip(rows, direct.values(), strict=True):
        description = (tool.description or "").splitlines()[0]
        assert description.startswith(row.split(None, 3)[3].removesuffix("..."))


# --- a session of calls ------------------------------------------------------


def test_a_session_of_calls_through_memorizz_is_what_it_is_directly(
    world: World, server: str
) -> None:
    """The first pass over the socket API, the second through the face, the
    daemon's server starting as the direct one did: each result the same,
    ``isError`` ones too (git's empty commit); then one call more with
    ``memorizzctl mcp call``, whose output is the result's text."""
    direct = world.direct[server]
    first, second = direct.passes
    world.reset(server)
    with world.daemon.client() as c:
        api = api_calls(c, server, world.steps(server, 1))

    async def face_pass() -> dict[str, Any]:
        async with world.face(MODES[server]) as client:
            prefix = f"{server}{SEPARATOR}"
            return await sdk_calls(client, world.steps(server, 2), prefix)

    face = anyio.run(face_pass)
    assert api == sdk_data(first, sent=True)
    assert sdk_data(face) == sdk_data(second)

    # what the passes did: the server's own answers, not empty ones
    if server == "memory":
        assert [e["name"] for e in first["create"].structured_content["entities"]] == [
            "Ada Lovelace", "Analytical Engine", "Charles Babbage",
        ]  # fmt: skip
        assert [e["name"] for e in second["create"].structured_content["entities"]] == [
            "Charles Babbage"
        ]
        assert [e["name"] for e in second["after"].structured_content["entities"]] == [
            "Ada Lovelace", "Analytical Engine",
        ]  # fmt: skip
        after = second["after"]
        [graph] = second["resource"].contents
        assert msgspec.json.decode(graph.text) == after.structured_content
        more = ("read_graph", "{}")
        shown = after.content[0].text  # the graph is where the face left it
    elif server == "thinking":
        last = second["thought 5"].structured_content
        assert last == {
            "thoughtNumber": 6,
            "totalThoughts": 6,
            "nextThoughtNeeded": False,
            "branches": ["reversed-1", "reversed-2"],
            "thoughtHistoryLength": 10,
        }
        more = (
            "sequentialthinking",
            '{"thought": "One more", "thoughtNumber": 7, "totalThoughts": 7, "nextThoughtNeeded": false}',
        )
        shown = '"thoughtHistoryLength": 11'
    else:
        for run, seen in enumerate(direct.passes, 1):
            assert not any(
                r.is_error for k, r in seen.items() if k != "commit nothing"
            ), {k: r for k, r in seen.items() if r.is_error}
            assert seen["commit nothing"].is_error
            assert f"Pass {run}: more lines ✓" in seen["log"].content[0].text
        assert (world.repo / "notes/pass-2.md").is_file()
        more = ("git_log", msgspec.json.encode({"repo_path": str(world.repo)}).decode())
        shown = second["log"].content[0].text  # the same three commits
    tool, arguments = more
    called = world.ctl("mcp", "call", server, tool, "--arguments", arguments)
    assert called.returncode == 0, called.stderr
    if server == "thinking":
        assert shown in called.stdout
    else:  # its text, ended by a newline if it has none (``blocks`` in ctl/text.py)
        assert called.stdout == (shown if shown.endswith("\n") else f"{shown}\n")


# --- refusals ------------------------------------------------------------------


def test_the_servers_refusals_arrive_as_the_server_made_them(
    world: World, server: str
) -> None:
    """Bad arguments, an unknown entity or revision, a repository or a path
    outside the one allowed: the server's ``isError`` results, the same
    through memorizz. A tool the server lacks: its own answer over the socket
    API (an ``isError`` result from the TypeScript SDK, -32602 from
    mcp-server-git, relayed as ``upstream_error``: docs/protocol.md,
    "Errors"); on the face, the face's -32602, as for any name it does not
    list (docs/mcp-clients.md, "The policy"). ``memorizzctl mcp call`` says
    each in the server's words, and fails."""
    direct = world.direct[server].errors
    calls = error_calls(server, world)
    sent = sdk_data(direct, sent=True)
    assert all(r.get("isError") for k, r in sent.items() if k != "unknown tool"), sent
    with world.daemon.client() as c:
        api = api_calls(c, server, calls)
    if server == "git":
        assert sent["unknown tool"]["error"] == -32602
        sent["unknown tool"] = relayed_error(sent["unknown tool"], server)
    else:
        assert sent["unknown tool"]["isError"] is True
    assert api == sent

    async def face_errors(mode: str) -> dict[str, Any]:
        async with world.face(mode) as client:
            return await sdk_calls(client, calls, f"{server}{SEPARATOR}")

    want = sdk_data(direct)
    [unknown] = [call.tool for call in calls if call.key == "unknown tool"]
    name = f"{server}{SEPARATOR}{unknown}"
    want["unknown tool"] = {
        "error": -32602,
        "message": f"unknown tool {name!r} (tools/list shows the tools)",
        "data": {"reason": "invalid_params", "tool": name},
    }
    for mode in ("legacy", "auto"):  # the face's eras, whatever the server's
        assert sdk_data(anyio.run(face_errors, mode)) == want, mode

    for call in calls:
        arguments = msgspec.json.encode(call.arguments).decode()
        shown = world.ctl("mcp", "call", server, call.tool, "--arguments", arguments)
        assert shown.returncode == 1, (call.key, shown.stdout)
        assert shown.stdout == ""
        result = sent[call.key]
        words = (
            result["content"][0]["text"]
            if "content" in result
            else f"{result['message']} ({result['data']['reason']})"
        )
        assert shown.stderr == f"memorizzctl: error: {words}\n", call.key
