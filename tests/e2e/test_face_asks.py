"""Elicitation and sampling through the face (issue 11, item 6).

An upstream that asks its client while serving a call (``elicitation/create``,
``sampling/createMessage``) is answered by the client that made the call, if
it declared the capability, and by no one else: the official Python SDK
client through the real bridge (``memorizzctl mcp serve``) answers with its
callbacks; behind the face, a real SDK server whose tools ask
(``tests/asking_server.py``), over stdio and over Streamable HTTP.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Iterator
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import MCPError

from tests import asking_server
from tests.harness import (
    DaemonHarness,
    daemon_config,
    http_spec,
    rmtree,
    serve_asgi,
    short_tempdir,
    stdio_spec,
)
from tests.process import MEMORIZZCTL

ASKING = str(Path(asking_server.__file__))


@pytest.fixture(scope="module", params=["stdio", "streamable_http"])
def asking(request: pytest.FixtureRequest) -> Iterator[tuple[DaemonHarness, str]]:
    """A daemon whose one server, ``ask``, asks its client (the handshake era),
    over stdio or Streamable HTTP; yields it and the transport."""
    base = short_tempdir()
    with contextlib.ExitStack() as stack:
        if request.param == "stdio":
            spec = stdio_spec("ask", args=[ASKING, "stdio"], protocol="legacy")
        else:
            url = stack.enter_context(
                serve_asgi(lambda _: asking_server.mcp.streamable_http_app())
            )
            spec = http_spec("ask", url + "/mcp", "streamable_http", protocol="legacy")
        config = daemon_config(base, servers=[spec])
        harness = stack.enter_context(DaemonHarness.running(config))
        harness.wait_ready("ask")
        yield harness, request.param
    rmtree(base)


def _bridge(api_socket: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=MEMORIZZCTL, args=["--socket", api_socket, "mcp", "serve"]
    )


def _elicit_as(name: str, seen: list[Any] | None = None) -> Any:
    async def elicit(context: Any, params: Any) -> types.ElicitResult:
        if seen is not None:
            seen.append(params)
        if isinstance(params, types.ElicitRequestURLParams):
            return types.ElicitResult(action="accept")
        return types.ElicitResult(action="accept", content={"name": name})

    return elicit


async def _sample(context: Any, params: types.CreateMessageRequestParams) -> Any:
    if params.tools:
        return types.CreateMessageResultWithTools(
            role="assistant",
            content=[
                types.ToolUseContent(id="u1", name=params.tools[0].name, input={})
            ],
            model="model-x",
            stop_reason="toolUse",
        )
    asked = params.messages[0].content
    text = asked.text if isinstance(asked, types.TextContent) else "?"
    return types.CreateMessageResult(
        role="assistant",
        content=types.TextContent(text=f"answer to {text}"),
        model="model-x",
    )


def _text(result: types.CallToolResult) -> str:
    item = result.content[0]
    return item.text if isinstance(item, types.TextContent) else repr(item)


def test_an_elicitation_and_a_sampling_are_answered_by_the_calling_client(
    asking: tuple[DaemonHarness, str],
) -> None:
    """Form and URL elicitation, sampling with and without tools: each
    request reaches the caller's callbacks and their answer the server."""
    harness, _ = asking
    seen: list[Any] = []

    async def run() -> list[str]:
        async with Client(
            stdio_client(_bridge(harness.socket)),
            mode="legacy",
            elicitation_callback=_elicit_as("Ada", seen),
            sampling_callback=_sample,
            sampling_capabilities=types.SamplingCapability(
                tools=types.SamplingToolsCapability()
            ),
        ) as client:
            results = [
                await client.call_tool("ask_name", {}),
                await client.call_tool("ask_url", {}),
                await client.call_tool("sample", {"prompt": "2+2"}),
                await client.call_tool("sample_tools", {"prompt": "look"}),
            ]
        assert not any(r.is_error for r in results), results
        return [_text(r) for r in results]

    assert anyio.run(run) == [
        "hello Ada",
        "accept",
        "model-x: answer to 2+2",
        "model-x: tool_use",
    ]
    assert seen[0].message == "What is your name?"
    assert isinstance(seen[1], types.ElicitRequestURLParams)
    assert seen[1].url == "https://example.invalid/login"


def test_a_client_without_the_capability_leaves_the_server_refused_at_once(
    asking: tuple[DaemonHarness, str],
) -> None:
    """A client that declared neither: the server gets an error at once and
    its tool says so (isError); so does a 2026-07-28 client that declared
    neither in its requests' ``_meta`` (test_face_rounds.py: one that did)."""
    harness, _ = asking

    async def run(mode: str) -> tuple[str, str]:
        async with Client(stdio_client(_bridge(harness.socket)), mode=mode) as c:
            return (
                await _failure(c.call_tool("ask_name", {})),
                await _failure(c.call_tool("sample", {"prompt": "x"})),
            )

    for mode in ("legacy", "auto"):
        elicited, sampled = anyio.run(run, mode)
        assert "the caller's client does not support elicitation" in elicited
        assert "the caller's client does not support sampling" in sampled


async def _failure(call: Awaitable[types.CallToolResult]) -> str:
    """How a call failed: an isError result's text, or the JSON-RPC error's
    message (the SDK server passes the error its request got as its own)."""
    try:
        result = await call
    except MCPError as exc:
        return exc.message
    assert result.is_error, result
    return _text(result)


def test_two_calls_in_flight_on_one_session_leave_an_elicitation_unrouted(
    asking: tuple[DaemonHarness, str],
) -> None:
    """Two calls share the warm session; the server's request names neither:
    it goes to no one (the server is told why), though both clients could
    answer."""
    harness, _ = asking
    seen: list[Any] = []

    async def run() -> list[str]:
        results: list[str] = []
        async with (
            Client(
                stdio_client(_bridge(harness.socket)),
                mode="legacy",
                elicitation_callback=_elicit_as("Ada", seen),
            ) as a,
            Client(
                stdio_client(_bridge(harness.socket)),
                mode="legacy",
                elicitation_callback=_elicit_as("Bob", seen),
            ) as b,
        ):

            async def one(client: Client) -> None:
                call = client.call_tool("gather_then_ask", {"n": 2})
                results.append(await _failure(call))

            async with anyio.create_task_group() as tg:
                tg.start_soon(one, a)
                tg.start_soon(one, b)
        return results

    results = anyio.run(run)
    assert len(results) == 2
    assert all("no caller can answer: 2 calls in flight" in r for r in results)
    assert seen == []


def test_requests_that_name_their_call_reach_only_its_caller(
    asking: tuple[DaemonHarness, str],
) -> None:
    """Two calls in flight, each elicitation naming its call by the progress
    token the daemon gave it: each reaches its own caller (stdio: the
    daemon's token is on the wire; over HTTP the SDK's token is its own, so
    the requests cannot be tied and are refused as above)."""
    harness, transport = asking

    async def run() -> dict[str, str]:
        results: dict[str, str] = {}

        async def progressed(progress: float, total: Any, message: Any) -> None:
            pass

        async def one(name: str) -> None:
            async with Client(
                stdio_client(_bridge(harness.socket)),
                mode="legacy",
                elicitation_callback=_elicit_as(name),
            ) as client:
                call = client.call_tool(
                    "ask_tied", {"n": 2}, progress_callback=progressed
                )
                if transport == "stdio":
                    results[name] = _text(await call)
                else:
                    results[name] = await _failure(call)

        async with anyio.create_task_group() as tg:
            tg.start_soon(one, "Ada")
            tg.start_soon(one, "Bob")
        return results

    results = anyio.run(run)
    if transport == "stdio":
        assert results == {"Ada": "hello Ada", "Bob": "hello Bob"}
    else:
        assert all("no caller can answer" in r for r in results.values()), results
