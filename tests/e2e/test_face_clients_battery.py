"""MCP clients nobody here wrote, driving the face as a user configures them,
compared with the same client connected to the same server directly.

The official TypeScript SDK client (tests/node/battery_client.mjs) and the
official Python SDK client (``mcp`` 2.3, in each era it speaks), over the
stdio bridge (``memorizzctl mcp serve``) and the Streamable HTTP bridge,
in front of npm ``@modelcontextprotocol/server-everything`` as the daemon's
only server (a scope of one keeps the names: the face is then a transparent
proxy), and of our SDK test servers. What the client sees through the face
must be what it sees directly, but what docs/mcp-clients.md says differs.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
import msgspec
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from memorizz.api.methods import ServerSpec
from tests.harness import (
    NODE_DIR,
    DaemonHarness,
    daemon_config,
    http_bridge,
    node_client,
    short_tempdir,
    stdio_spec,
    wait_until,
)
from tests.harness import node as harness_node
from tests.process import MEMORIZZCTL

EVERYTHING = (
    NODE_DIR / "node_modules/@modelcontextprotocol/server-everything/dist/index.js"
)
CLIENT = str(NODE_DIR / "battery_client.mjs")
RUN_TIMEOUT_S = 90.0
"""A bound on a hung client only, far above its usual run."""


def _everything() -> ServerSpec:
    return ServerSpec(
        name="ev",
        transport="stdio",
        command=harness_node("server-everything"),
        args=[str(EVERYTHING), "stdio"],
    )


@pytest.fixture(scope="module")
def harness() -> Iterator[DaemonHarness]:
    if not EVERYTHING.is_file():
        harness_node("server-everything")
        pytest.skip("server-everything is not installed")
    config = daemon_config(short_tempdir(), servers=[_everything()])
    with DaemonHarness.running(config) as harness:
        harness.wait_ready("ev")
        yield harness


@pytest.fixture(scope="module")
def bridge(harness: DaemonHarness) -> Iterator[tuple[str, str]]:
    with http_bridge(harness.socket) as url_and_token:
        yield url_and_token


def _ts(target: dict[str, Any], *steps: str, **plan: Any) -> dict[str, Any]:
    plan = {**target, **plan, "steps": list(steps)}
    return node_client(CLIENT, plan, timeout=RUN_TIMEOUT_S)


def _direct() -> dict[str, Any]:
    return {
        "command": harness_node("server-everything"),
        "args": [str(EVERYTHING), "stdio"],
    }


def _through(
    harness: DaemonHarness, bridge: tuple[str, str], via: str
) -> dict[str, Any]:
    if via == "stdio":
        return {
            "command": MEMORIZZCTL,
            "args": ["--socket", harness.socket, "mcp", "serve"],
        }
    url, token = bridge
    return {"url": url, "token": token}


def _steady(value: Any) -> Any:
    """``value`` without the clock times server-everything writes."""
    text = msgspec.json.encode(value).decode()
    return re.sub(r"\d{1,2}:\d{2}:\d{2} [AP]M", "TIME", text)


SAME = [
    "echo",
    "sum",
    "image",
    "annotated",
    "links",
    "reference",
    "badArgs",
    "elicit",
    "sample",
    "ping",
]
"""Steps whose outcome is the same whoever answers."""


@pytest.mark.parametrize("via", ["stdio", "http"])
def test_the_typescript_client_sees_what_it_sees_directly(
    harness: DaemonHarness, bridge: tuple[str, str], via: str
) -> None:
    direct = _ts(_direct(), *SAME)
    faced = _ts(_through(harness, bridge, via), *SAME)
    for step in SAME:
        assert _steady(faced[step]) == _steady(direct[step]), step
    assert faced["asked"] == direct["asked"]
    assert faced["sampled"] == direct["sampled"]


# --- the official Python SDK client ------------------------------------------


async def _py_elicit(context: Any, params: Any) -> types.ElicitResult:
    return types.ElicitResult(action="accept", content={"name": "Ada", "check": True})


async def _py_sample(context: Any, params: Any) -> types.CreateMessageResult:
    return types.CreateMessageResult(
        model="py-model",
        role="assistant",
        content=types.TextContent(type="text", text="sampled"),
    )


def _dump(value: Any) -> Any:
    """What a user reads of an SDK result: its fields, without ``_meta``."""
    dumped = value.model_dump(mode="json", by_alias=True, exclude_none=True)
    return _unmeta(dumped)


def _unmeta(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _unmeta(v) for k, v in value.items() if k != "_meta"}
    if isinstance(value, list):
        return [_unmeta(v) for v in value]
    return value


async def _py_steps(client: Client) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    tools = await client.list_tools()
    seen["tools"] = sorted(t.name for t in tools.tools)
    seen["echo"] = _dump(await client.call_tool("echo", {"message": "héllo ✓"}))
    seen["structured"] = _dump(
        await client.call_tool("get-structured-content", {"location": "New York"})
    )
    seen["badArgs"] = _dump(await client.call_tool("get-sum", {"a": "two"}))
    progress: list[tuple[float, float | None]] = []

    async def on_progress(p: float, total: float | None, message: str | None) -> None:
        progress.append((p, total))

    seen["progress"] = _dump(
        await client.call_tool(
            "trigger-long-running-operation",
            {"duration": 1, "steps": 3},
            progress_callback=on_progress,
        )
    )
    seen["progressed"] = progress
    seen["elicit"] = _dump(await client.call_tool("trigger-elicitation-request", {}))
    seen["sample"] = _dump(
        await client.call_tool(
            "trigger-sampling-request", {"prompt": "hi", "maxTokens": 5}
        )
    )
    listed = await client.list_resources()
    seen["resources"] = len(listed.resources)
    seen["read"] = _dump(await client.read_resource(listed.resources[0].uri))
    seen["fromTemplate"] = _dump(
        await client.read_resource("demo://resource/dynamic/text/7")
    )
    templates = await client.list_resource_templates()
    seen["templates"] = sorted(t.uri_template for t in templates.resource_templates)
    prompts = await client.list_prompts()
    seen["prompts"] = sorted(p.name for p in prompts.prompts)
    seen["args"] = _dump(
        await client.get_prompt("args-prompt", {"city": "Paris", "state": "IDF"})
    )
    seen["complete"] = _dump(
        await client.complete(
            types.PromptReference(type="ref/prompt", name="completable-prompt"),
            {"name": "name", "value": ""},
            {"department": "Sales"},
        )
    )
    seen["ping"] = _dump(await client.send_ping())
    return seen


def _py(target: Any, **options: Any) -> dict[str, Any]:
    async def run() -> dict[str, Any]:
        async with Client(
            target,
            elicitation_callback=_py_elicit,
            sampling_callback=_py_sample,
            **options,
        ) as client:
            seen = await _py_steps(client)
            seen["version"] = client.protocol_version
            return seen

    return anyio.run(run)


def _py_direct() -> StdioServerParameters:
    return StdioServerParameters(
        command=harness_node("server-everything"), args=[str(EVERYTHING), "stdio"]
    )


@pytest.fixture(scope="module")
def py_direct() -> dict[str, Any]:
    return _py(_py_direct())


@pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning")
@pytest.mark.parametrize("mode", ["auto", "legacy"])
@pytest.mark.parametrize("via", ["stdio", "http"])
def test_the_python_client_sees_what_it_sees_directly(
    harness: DaemonHarness,
    bridge: tuple[str, str],
    py_direct: dict[str, Any],
    via: str,
    mode: str,
) -> None:
    """In each era (``auto``: 2026-07-28 with the face, whose elicitation
    and sampling come as input-required rounds; ``legacy``: 2025-11-25)."""
    if via == "stdio":
        faced = _py(
            StdioServerParameters(
                command=MEMORIZZCTL, args=["--socket", harness.socket, "mcp", "serve"]
            ),
            mode=mode,
        )
    else:
        url, token = bridge

        async def over_http() -> dict[str, Any]:
            headers = {"Authorization": f"Bearer {token}"}
            async with (
                httpx2.AsyncClient(headers=headers, timeout=60) as http,
                Client(
                    streamable_http_client(url, http_client=http),
                    elicitation_callback=_py_elicit,
                    sampling_callback=_py_sample,
                    mode=mode,
                ) as client,
            ):
                seen = await _py_steps(client)
                seen["version"] = client.protocol_version
                return seen

        faced = anyio.run(over_http)
    assert faced.pop("version") == ("2026-07-28" if mode == "auto" else "2025-11-25")
    direct = dict(py_direct, version=None)
    direct.pop("version")
    if mode == "auto":  # ping is the handshake era's; the face answers it all the same
        direct["ping"] = {"resultType": "complete"}
    assert {k: _steady(v) for k, v in faced.items()} == {
        k: _steady(v) for k, v in direct.items()
    }


# --- our SDK test servers: what server-everything cannot show ----------------


@pytest.fixture(scope="module")
def ours() -> Iterator[DaemonHarness]:
    base = short_tempdir()
    config = daemon_config(
        base,
        servers=[
            stdio_spec("alpha", env={"CALL_LOG": os.path.join(base, "calls.log")})
        ],
    )
    with DaemonHarness.running(config) as harness:
        harness.wait_ready("alpha")
        yield harness


@pytest.fixture(scope="module")
def ours_bridge(ours: DaemonHarness) -> Iterator[tuple[str, str]]:
    with http_bridge(ours.socket) as url_and_token:
        yield url_and_token


def _calls(harness: DaemonHarness) -> list[str]:
    path = harness.config.servers[0].env["CALL_LOG"]
    return Path(path).read_text().splitlines() if os.path.exists(path) else []


def _over_http(url: str, token: str, mode: str) -> Any:
    """An SDK client over the HTTP bridge, as docs/mcp-clients.md shows it."""

    @contextlib.asynccontextmanager
    async def connected() -> AsyncIterator[Client]:
        headers = {"Authorization": f"Bearer {token}"}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=60) as http,
            Client(streamable_http_client(url, http_client=http), mode=mode) as client,
        ):
            yield client

    return connected()


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_a_python_clients_progress_comes_over_http_in_each_era(
    ours_bridge: tuple[str, str], mode: str
) -> None:
    """2026-07-28 requests have no session, but a call's progress still
    comes on its POST's event stream (it was dropped: plain JSON)."""
    url, token = ours_bridge
    progress: list[float] = []

    async def on_progress(p: float, total: float | None, message: str | None) -> None:
        progress.append(p)

    async def run() -> str:
        async with _over_http(url, token, mode) as client:
            result = await client.call_tool(
                "progressing", {"steps": 3}, progress_callback=on_progress
            )
        return str(result.content[0].text)  # type: ignore[union-attr]

    assert anyio.run(run) == "done in 3 steps"
    assert progress == [1.0, 2.0, 3.0]


@pytest.mark.parametrize("mode", ["auto", "legacy"])
@pytest.mark.parametrize("via", ["stdio", "http"])
def test_a_python_client_that_gives_up_a_call_stops_it_upstream(
    ours: DaemonHarness, ours_bridge: tuple[str, str], via: str, mode: str
) -> None:
    tag = f"py-give-up-{via}-{mode}"

    async def run() -> str:
        if via == "stdio":
            params = StdioServerParameters(
                command=MEMORIZZCTL, args=["--socket", ours.socket, "mcp", "serve"]
            )
            connected: Any = Client(params, mode=mode)
        else:
            connected = _over_http(*ours_bridge, mode)
        async with connected as client:
            async with anyio.create_task_group() as tasks:

                async def call() -> None:
                    await client.call_tool("watched", {"seconds": 60, "tag": tag})

                tasks.start_soon(call)
                await anyio.to_thread.run_sync(
                    lambda: wait_until(
                        lambda: f"start:{tag}" in _calls(ours),
                        what=f"the upstream to start {tag}",
                    )
                )
                tasks.cancel_scope.cancel()  # the client gives up
            # heard upstream while the client is open (the SDK client chokes
            # on an answer to an abandoned POST that comes as it closes)
            await anyio.to_thread.run_sync(
                lambda: wait_until(
                    lambda: f"cancelled:{tag}" in _calls(ours),
                    what=f"the upstream to hear {tag} cancelled",
                )
            )
            echoed = await client.call_tool("echo", {"text": "after"})
        return str(echoed.content[0].text)  # type: ignore[union-attr]

    assert anyio.run(run) == "after"
