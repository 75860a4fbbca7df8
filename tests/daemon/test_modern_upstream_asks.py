"""A 2026-07-28 upstream asks the caller its era's way (issue 11, item 6;
SEP-2322): its ``tools/call`` answers with an input-required result; the
daemon asks the caller each request (the socket API's ``on_elicit`` /
``on_sample``, or the face's handshake-era client through its callbacks),
and calls again with the answers and the server's state, until a result
(at most 8 rounds). A caller that cannot answer ends the call with an
``isError`` result that says why. A real SDK server whose tools ask that way
(``tests/modern_asking_server.py``), over stdio and Streamable HTTP.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import msgspec
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

from tests import modern_asking_server
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

MODERN_ASKING = str(Path(modern_asking_server.__file__))


@pytest.fixture(scope="module", params=["stdio", "streamable_http"])
def harness(request: pytest.FixtureRequest) -> Iterator[DaemonHarness]:
    base = short_tempdir()
    with contextlib.ExitStack() as stack:
        if request.param == "stdio":
            spec = stdio_spec(
                "ask", args=[MODERN_ASKING, "stdio"], protocol="2026-07-28"
            )
        else:
            url = stack.enter_context(
                serve_asgi(lambda _: modern_asking_server.mcp.streamable_http_app())
            )
            # auto: the SDK client pinned to 2026-07-28 skips server/discover
            # and so learns no capabilities (no tools listed); auto finds it
            spec = http_spec("ask", url + "/mcp", "streamable_http", protocol="auto")
        running = stack.enter_context(
            DaemonHarness.running(daemon_config(base, servers=[spec]))
        )
        running.wait_ready("ask")
        assert running.daemon.pool.get("ask").protocol_version == "2026-07-28"
        yield running
    rmtree(base)


def _text(result: Any) -> str:
    return str(result.content[0]["text"])


def _elicit(params: dict[str, Any]) -> dict[str, Any]:
    field = next(iter(params["requestedSchema"]["properties"]))
    return {"action": "accept", "content": {field: {"name": "Ada"}.get(field, "teal")}}


def _sample(params: dict[str, Any]) -> dict[str, Any]:
    text = params["messages"][0]["content"]["text"]
    content = {"type": "text", "text": f"answer to {text}"}
    return {"role": "assistant", "content": content, "model": "m"}


def test_the_socket_callers_callbacks_answer_an_input_required_result(
    harness: DaemonHarness,
) -> None:
    asked: list[dict[str, Any]] = []

    def elicit(params: dict[str, Any]) -> dict[str, Any]:
        asked.append(params)
        return _elicit(params)

    with harness.client() as c:
        named = c.call_tool("ask", "ask_name", on_elicit=elicit)
        sampled = c.call_tool("ask", "sample", {"prompt": "2+2"}, on_sample=_sample)
        twice = c.call_tool("ask", "ask_twice", on_elicit=elicit)
    assert not any(r.is_error for r in (named, sampled, twice))
    assert (_text(named), _text(sampled), _text(twice)) == (
        "hello Ada",
        "m: answer to 2+2",
        "Ada likes teal",
    )
    assert [a["message"] for a in asked] == [
        "What is your name?",
        "What is your name?",
        "Ada, your colour?",
    ]


def test_a_caller_that_cannot_answer_gets_an_error_result_saying_why(
    harness: DaemonHarness,
) -> None:
    with harness.client() as c:
        result = c.call_tool("ask", "ask_name")
    assert result.is_error
    assert "the caller's client does not support elicitation" in _text(result)
    assert result.structured_content["reason"] == "input_unanswered"


def test_a_calls_client_capabilities_are_what_its_caller_can_answer(
    harness: DaemonHarness,
) -> None:
    """A 2026-07-28 server reads the client's capabilities per request: over
    stdio each ``tools/call`` declares what its caller can answer (nothing
    for a relayed call), so a server that could do without asking does.
    Over Streamable HTTP the SDK's client declares its own, the same on every
    request, whoever the caller (a question it cannot answer then ends as in
    the test above)."""

    def declared(**callbacks: Any) -> Any:
        with harness.client() as c:
            return msgspec.json.decode(
                _text(c.call_tool("ask", "capabilities", **callbacks))
            )

    if harness.daemon.pool.get("ask").spec.transport != "stdio":
        fixed = declared()
        assert {"elicitation", "sampling"} <= set(fixed), fixed
        assert declared(on_elicit=_elicit, on_sample=_sample) == fixed
        return
    assert declared() == {}
    assert set(declared(on_elicit=_elicit)) == {"elicitation"}
    assert set(declared(on_elicit=_elicit, on_sample=_sample)) == {
        "elicitation",
        "sampling",
    }


def test_a_server_that_asks_forever_is_stopped_after_eight_rounds(
    harness: DaemonHarness,
) -> None:
    asked: list[dict[str, Any]] = []

    def elicit(params: dict[str, Any]) -> dict[str, Any]:
        asked.append(params)
        return _elicit(params)

    with harness.client() as c:
        result = c.call_tool("ask", "ask_forever", on_elicit=elicit)
    assert result.is_error
    assert "asked again after 8 rounds" in _text(result)
    assert len(asked) == 8


def test_a_face_client_of_the_handshake_era_answers_with_its_callbacks(
    harness: DaemonHarness,
) -> None:
    """The official SDK client (2025-11-25) through ``memorizzctl mcp serve``:
    the 2026-07-28 upstream's requests reach it as requests of the face's
    own, and their answers go back on the daemon's retry."""

    async def elicit(context: Any, params: Any) -> types.ElicitResult:
        field = next(iter(params.requested_schema["properties"]))
        answer = {"name": "Bob"}.get(field, "red")
        return types.ElicitResult(action="accept", content={field: answer})

    async def sample(context: Any, params: types.CreateMessageRequestParams) -> Any:
        return types.CreateMessageResult(
            role="assistant", content=types.TextContent(text="four"), model="x"
        )

    async def run() -> list[str]:
        bridge = StdioServerParameters(
            command=MEMORIZZCTL, args=["--socket", harness.socket, "mcp", "serve"]
        )
        async with Client(
            stdio_client(bridge),
            mode="legacy",
            elicitation_callback=elicit,
            sampling_callback=sample,
        ) as client:
            results = [
                await client.call_tool("ask_name", {}),
                await client.call_tool("sample", {"prompt": "2+2"}),
                await client.call_tool("ask_twice", {}),
            ]
        assert not any(r.is_error for r in results), results
        return [
            r.content[0].text
            for r in results
            if isinstance(r.content[0], types.TextContent)
        ]

    assert anyio.run(run) == ["hello Bob", "x: four", "Bob likes red"]
