"""The MCP face's features beyond calls, used by the official TypeScript SDK
client (issue 11, "How it is shown").

tests/node/face_features_client.mjs (npm ``@modelcontextprotocol/sdk``) answers
an elicitation and a sampling request with its request handlers, cancels a
call (its ``AbortSignal``: ``notifications/cancelled``), hears a
``tools/list_changed``, subscribes to a resource and hears it updated, and
completes a prompt argument. Behind the real daemon: our SDK test servers
(tests/asking_server.py as ``ask``, tests/features_server.py as ``feat``,
tests/mcp_server.py as ``alpha``), over stdio.

Through ``memorizzctl mcp serve`` (stdio), and through ``mcp serve
--transport streamable-http`` (the TS client's ``StreamableHTTPClientTransport``,
with the bearer token), everything works: over HTTP an upstream's elicitation
and sampling requests come on the call's own event stream and the handlers'
answers go back as POSTs, and ``list_changed`` and ``resources/updated`` come
on the session's GET stream (memorizz.ctl.serve_http).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.faults import cutting_proxy
from tests.harness import (
    NODE_DIR,
    DaemonHarness,
    asking_spec,
    daemon_config,
    features_spec,
    node_client,
    short_tempdir,
    stdio_spec,
    wait_until,
)
from tests.harness import http_bridge as bridge_over
from tests.process import MEMORIZZCTL

CLIENT = str(NODE_DIR / "face_features_client.mjs")
RUN_TIMEOUT_S = 60.0
"""A bound on a hung client only, far above its usual run (about a second)."""


@pytest.fixture(scope="module")
def harness() -> Iterator[DaemonHarness]:
    base = short_tempdir()
    config = daemon_config(
        base,
        servers=[
            stdio_spec("alpha", env={"CALL_LOG": os.path.join(base, "calls.log")}),
            asking_spec(),
            features_spec(
                env={"SUB_LOG": os.path.join(base, "subs.log")},
            ),
        ],
    )
    with DaemonHarness.running(config) as harness:
        for name in ("alpha", "ask", "feat"):
            harness.wait_ready(name)
        yield harness


def _run(harness: DaemonHarness, **plan: Any) -> dict[str, Any]:
    plan = {"callLog": harness.config.servers[0].env["CALL_LOG"], **plan}
    return node_client(CLIENT, plan, timeout=RUN_TIMEOUT_S)


def _subscriptions(harness: DaemonHarness) -> list[str]:
    path = harness.config.servers[2].env["SUB_LOG"]
    return Path(path).read_text().splitlines() if os.path.exists(path) else []


ALL = ["elicit", "sample", "cancel", "listChanged", "subscribe", "complete"]


@pytest.fixture
def http_bridge(harness: DaemonHarness) -> Iterator[tuple[str, str]]:
    """``memorizzctl mcp serve --transport streamable-http`` on a loopback
    port, in front of the operator's face; yields its URL and token."""
    with bridge_over(harness.socket) as bridge:
        yield bridge


@pytest.fixture(params=["stdio", "http"])
def bridged(
    request: pytest.FixtureRequest, harness: DaemonHarness
) -> Iterator[dict[str, str]]:
    """How the TS client reaches the operator's face, as its plan says: the
    stdio bridge (``memorizzctl mcp serve``, which the client starts), or
    the HTTP bridge (``http_bridge``, its URL and token)."""
    if request.param == "stdio":
        yield {"memorizzctl": MEMORIZZCTL, "socket": harness.socket}
        return
    with bridge_over(harness.socket) as (url, token):
        yield {"url": url, "token": token}


def test_the_typescript_client_through_a_bridge(
    harness: DaemonHarness, bridged: dict[str, str]
) -> None:
    subscribed = _subscriptions(harness).count("subscribe feat://watched")
    seen = _run(harness, **bridged, steps=ALL)
    # the upstream's elicitation and sampling, answered by the TS handlers
    # (over HTTP: on the call's event stream, their answers POSTed back)
    assert seen["elicit"] == {"text": ["hello Ada"], "isError": False}
    assert seen["asked"] == ["What is your name?"]
    assert seen["sample"] == {
        "text": ["ts-model: hello from TypeScript"],
        "isError": False,
    }
    assert seen["sampled"] == ["say hi"]
    # the abort reached the upstream (the client waited for its cancelled:TAG),
    # and the session goes on
    assert seen["cancel"].get("aborted") is not None, seen["cancel"]
    assert seen["cancel"]["after"] == {"text": ["after"], "isError": False}
    # alpha's new tool, announced and listed, and resources/updated (over
    # HTTP: on the session's GET stream)
    (added,) = seen["listChanged"]
    assert added.startswith("alpha__dyn_")
    assert seen["subscribe"] == {
        "touched": {"text": ["touched"], "isError": False},
        "updated": "feat://watched",
    }
    wait_until(
        lambda: _subscriptions(harness).count("subscribe feat://watched") > subscribed,
        what="the upstream to hear the subscription",
    )
    assert seen["complete"] == ["green@prompt", "grey@prompt"]


def test_the_typescript_client_resumes_a_call_whose_connection_breaks(
    harness: DaemonHarness, http_bridge: tuple[str, str]
) -> None:
    """A relay in front of the HTTP bridge cuts the connection after the
    third progress step: the TS client comes back with a GET and
    ``Last-Event-ID`` and gets every step once, in order, then the answer."""
    url, token = http_bridge
    with cutting_proxy(url, b'"progress":3') as (proxied, cuts):
        seen = _run(harness, url=proxied, token=token, steps=["resume"])
    assert cuts.cut.is_set()
    assert seen["resume"] == {
        "progress": list(range(1, 21)),
        "text": ["done in 20 steps"],
        "isError": False,
    }
    came_back = [h for h in cuts.heads("GET") if b"\r\nlast-event-id:" in h]
    assert len(came_back) == 1, cuts.heads("GET")
