"""A 2026-07-28 client of the face is asked the way of its era (issue 11,
item 6; SEP-2322): when an upstream of either era asks during its call, its
``tools/call`` is answered with an input-required result carrying the
request(s) and a ``requestState`` of the daemon's; its retry's answers go to
the upstream and the retry gets the call's result (or the next round). A
retry whose state names nothing held for its session is refused
(``input_state_unknown``). The official Python SDK client (``mode="auto"``,
so 2026-07-28) through the real bridge, answering with its callbacks; behind
the face, real SDK servers that ask: the handshake era's
(``tests/asking_server.py``, over stdio and Streamable HTTP) and 2026-07-28's
(``tests/modern_asking_server.py``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import MCPError

from memorizzd import rounds
from tests import asking_server, modern_asking_server
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


@pytest.fixture(scope="module")
def harness() -> Iterator[DaemonHarness]:
    """Three servers that ask: ``ask`` (handshake era, stdio), ``web``
    (handshake era, Streamable HTTP), ``new`` (2026-07-28, stdio)."""
    base = short_tempdir()
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(
            serve_asgi(lambda _: asking_server.mcp.streamable_http_app())
        )
        specs = [
            stdio_spec(
                "ask",
                args=[str(Path(asking_server.__file__)), "stdio"],
                protocol="legacy",
            ),
            http_spec("web", url + "/mcp", "streamable_http", protocol="legacy"),
            stdio_spec(
                "new",
                args=[str(Path(modern_asking_server.__file__)), "stdio"],
                protocol="2026-07-28",
            ),
        ]
        running = stack.enter_context(
            DaemonHarness.running(daemon_config(base, servers=specs))
        )
        for name in ("ask", "web", "new"):
            running.wait_ready(name)
        yield running
    rmtree(base)


def _bridge(harness: DaemonHarness) -> StdioServerParameters:
    return StdioServerParameters(
        command=MEMORIZZCTL, args=["--socket", harness.socket, "mcp", "serve"]
    )


async def _elicit(context: Any, params: Any) -> types.ElicitResult:
    if isinstance(params, types.ElicitRequestURLParams):
        return types.ElicitResult(action="accept")
    field = next(iter(params.requested_schema["properties"]))
    return types.ElicitResult(
        action="accept", content={field: {"name": "Ada"}.get(field, "green")}
    )


async def _sample(context: Any, params: types.CreateMessageRequestParams) -> Any:
    asked = params.messages[0].content
    text = asked.text if isinstance(asked, types.TextContent) else "?"
    return types.CreateMessageResult(
        role="assistant", content=types.TextContent(text=f"answer to {text}"), model="m"
    )


def _client(harness: DaemonHarness, **callbacks: Any) -> Client:
    return Client(stdio_client(_bridge(harness)), mode="auto", **callbacks)


def _text(result: types.CallToolResult) -> str:
    item = result.content[0]
    return item.text if isinstance(item, types.TextContent) else repr(item)


def test_a_modern_client_answers_each_upstreams_requests_in_rounds(
    harness: DaemonHarness,
) -> None:
    seen: list[Any] = []

    async def elicit(context: Any, params: Any) -> types.ElicitResult:
        seen.append(params)
        return await _elicit(context, params)

    async def run() -> list[str]:
        async with _client(
            harness, elicitation_callback=elicit, sampling_callback=_sample
        ) as client:
            assert client.protocol_version == "2026-07-28"
            results = [
                await client.call_tool("ask__ask_name", {}),
                await client.call_tool("ask__ask_url", {}),
                await client.call_tool("ask__sample", {"prompt": "2+2"}),
                await client.call_tool("web__ask_name", {}),
                await client.call_tool("new__ask_name", {}),
                await client.call_tool("new__sample", {"prompt": "3+3"}),
                await client.call_tool("new__ask_twice", {}),
            ]
        assert not any(r.is_error for r in results), results
        return [_text(r) for r in results]

    assert anyio.run(run) == [
        "hello Ada",
        "accept",
        "m: answer to 2+2",
        "hello Ada",
        "hello Ada",
        "m: answer to 3+3",
        "Ada likes green",
    ]
    assert seen[0].message == "What is your name?"
    assert isinstance(seen[1], types.ElicitRequestURLParams)


def test_the_face_answers_with_an_input_required_result_and_a_state(
    harness: DaemonHarness,
) -> None:
    """Driven by hand (``allow_input_required``): the first answer carries
    the upstream's request and an opaque state; the retry with the answer
    gets the result; the same state again is refused, used once."""

    async def run() -> tuple[Any, str, str]:
        async with _client(harness, elicitation_callback=_elicit) as client:
            session = client.session
            first = await session.call_tool(
                "ask__ask_name", {}, allow_input_required=True
            )
            assert isinstance(first, types.InputRequiredResult)
            assert first.input_requests is not None
            ((key, request),) = first.input_requests.items()
            assert isinstance(request, types.ElicitRequest)
            answer = types.ElicitResult(action="accept", content={"name": "Eve"})
            final = await session.call_tool(
                "ask__ask_name",
                {},
                input_responses={key: answer},
                request_state=first.request_state,
                allow_input_required=True,
            )
            assert isinstance(final, types.CallToolResult)
            with pytest.raises(MCPError) as again:
                await session.call_tool(
                    "ask__ask_name",
                    {},
                    input_responses={key: answer},
                    request_state=first.request_state,
                    allow_input_required=True,
                )
            return (
                first,
                _text(final),
                str((again.value.error.data or {}).get("reason")),
            )

    first, text, reason = anyio.run(run)
    assert len(first.request_state or "") >= 32
    assert text == "hello Eve"
    assert reason == "input_state_unknown"


def test_a_retry_from_another_session_or_with_an_unknown_state_is_refused(
    harness: DaemonHarness,
) -> None:
    """Another session holding the state learns nothing and answers nothing:
    the state is good on its own session only, which then still answers."""

    async def run() -> tuple[list[str], str]:
        reasons: list[str] = []
        async with (
            _client(harness, elicitation_callback=_elicit) as owner,
            _client(harness, elicitation_callback=_elicit) as other,
        ):
            first = await owner.session.call_tool(
                "new__ask_name", {}, allow_input_required=True
            )
            assert isinstance(first, types.InputRequiredResult)
            assert first.input_requests is not None
            key = next(iter(first.input_requests))
            answer = types.ElicitResult(action="accept", content={"name": "Mallory"})
            for state in (first.request_state, "not-a-state"):
                with pytest.raises(MCPError) as refused:
                    await other.session.call_tool(
                        "new__ask_name",
                        {},
                        input_responses={key: answer},
                        request_state=state,
                        allow_input_required=True,
                    )
                reasons.append(str((refused.value.error.data or {}).get("reason")))
            mine = types.ElicitResult(action="accept", content={"name": "Ada"})
            final = await owner.session.call_tool(
                "new__ask_name",
                {},
                input_responses={key: mine},
                request_state=first.request_state,
                allow_input_required=True,
            )
            assert isinstance(final, types.CallToolResult)
            return reasons, _text(final)

    reasons, text = anyio.run(run)
    assert reasons == ["input_state_unknown", "input_state_unknown"]
    assert text == "hello Ada"


def test_a_held_call_whose_client_never_retries_is_given_up_in_time() -> None:
    """Bounded by ``upstream_request_wait_s``: the upstream's request is
    refused once it has waited that long for the retry, the call ends, its
    result waits as long for a retry, and then its state is refused."""
    base = short_tempdir()
    spec = stdio_spec(
        "ask", args=[str(Path(asking_server.__file__)), "stdio"], protocol="legacy"
    )
    config = daemon_config(base, servers=[spec], upstream_request_wait_s=0.3)
    try:
        with DaemonHarness.running(config) as harness:
            harness.wait_ready("ask")

            async def run() -> str:
                async with _client(harness, elicitation_callback=_elicit) as client:
                    first = await client.session.call_tool(
                        "ask_name", {}, allow_input_required=True
                    )
                    assert isinstance(first, types.InputRequiredResult)
                    held = rounds._held.get(str(first.request_state))
                    if held is not None:  # else given up already
                        with anyio.fail_after(10):
                            await anyio.to_thread.run_sync(
                                harness.portal.call, held.ended.wait
                            )
                    with pytest.raises(MCPError) as refused:
                        await client.session.call_tool(
                            "ask_name",
                            {},
                            input_responses={},
                            request_state=first.request_state,
                            allow_input_required=True,
                        )
                    return str((refused.value.error.data or {}).get("reason"))

            assert anyio.run(run) == "input_state_unknown"
    finally:
        rmtree(base)
