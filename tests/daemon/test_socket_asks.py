"""A socket ``tools/call`` whose upstream asks its caller (issue 11, item 6):
a connection that declared ``elicitation`` / ``sampling`` in ``daemon/hello``
gets the upstream's request as a request line before its reply, and its
answer goes back upstream; one that did not leaves the upstream refused at
once. Through a real daemon, the real ``Client`` and a real SDK server whose
tools ask (``tests/asking_server.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from memorizz.api.errors import UpstreamError
from tests import asking_server
from tests.harness import (
    DaemonHarness,
    daemon_config,
    rmtree,
    short_tempdir,
    stdio_spec,
)

ASKING = str(Path(asking_server.__file__))


@pytest.fixture(scope="module")
def harness() -> Iterator[DaemonHarness]:
    base = short_tempdir()
    try:
        spec = stdio_spec("ask", args=[ASKING, "stdio"], protocol="legacy")
        with DaemonHarness.running(daemon_config(base, servers=[spec])) as running:
            running.wait_ready("ask")
            yield running
    finally:
        rmtree(base)


def _text(result: Any) -> str:
    return str(result.content[0]["text"])


def test_the_callbacks_of_a_call_answer_its_upstreams_requests(
    harness: DaemonHarness,
) -> None:
    asked: list[dict[str, Any]] = []

    def elicit(params: dict[str, Any]) -> dict[str, Any]:
        asked.append(params)
        return {"action": "accept", "content": {"name": "Ada"}}

    def sample(params: dict[str, Any]) -> dict[str, Any]:
        asked.append(params)
        if params.get("tools"):
            use = {"type": "tool_use", "id": "u1", "name": "lookup", "input": {}}
            return {"role": "assistant", "content": [use], "model": "m"}
        text = params["messages"][0]["content"]["text"]
        content = {"type": "text", "text": f"answer to {text}"}
        return {"role": "assistant", "content": content, "model": "m"}

    with harness.client() as c:
        named = c.call_tool("ask", "ask_name", on_elicit=elicit)
        sampled = c.call_tool("ask", "sample", {"prompt": "2+2"}, on_sample=sample)
        tooled = c.call_tool("ask", "sample_tools", {"prompt": "x"}, on_sample=sample)
    assert (_text(named), _text(sampled), _text(tooled)) == (
        "hello Ada",
        "m: answer to 2+2",
        "m: tool_use",
    )
    assert asked[0]["message"] == "What is your name?"
    assert asked[0]["requestedSchema"]["properties"]["name"]["type"] == "string"
    assert asked[2]["tools"][0]["name"] == "lookup"


def test_a_connection_that_declared_nothing_leaves_the_upstream_refused(
    harness: DaemonHarness,
) -> None:
    with harness.client() as c, pytest.raises(UpstreamError) as failed:
        c.call_tool("ask", "ask_name")
    assert "the caller's client does not support elicitation" in failed.value.message


def test_a_connection_that_answers_elicitation_only_refuses_sampling(
    harness: DaemonHarness,
) -> None:
    """Declared on the connection by the first call's ``on_elicit``: a later
    call that samples still finds no one to answer it."""

    def elicit(params: dict[str, Any]) -> dict[str, Any]:
        return {"action": "decline"}

    with harness.client() as c:
        assert _text(c.call_tool("ask", "ask_name", on_elicit=elicit)) == "decline"
        with pytest.raises(UpstreamError) as failed:
            c.call_tool("ask", "sample", {"prompt": "x"})
    assert "does not support sampling" in failed.value.message


def test_a_later_call_without_the_callback_refuses_the_request_at_once(
    harness: DaemonHarness,
) -> None:
    """The connection declared sampling with the first call's ``on_sample``;
    a later call gives none: the daemon still sends it the server's
    ``sampling/createMessage`` (the connection declared it), and the client
    refuses it at once. It used to drop it unanswered, and the call waited
    out its deadline (``DeadlineExceededError``)."""

    def sample(params: dict[str, Any]) -> dict[str, Any]:
        text = {"type": "text", "text": "sheep"}
        return {"role": "assistant", "content": text, "model": "m"}

    with harness.client() as c:
        first = c.call_tool("ask", "sample", {"prompt": "a"}, on_sample=sample)
        assert _text(first) == "m: sheep"
        with pytest.raises(UpstreamError) as failed:
            c.call_tool("ask", "sample", {"prompt": "b"}, timeout_s=30)
    assert "sampling/createMessage is not answered here" in failed.value.message
