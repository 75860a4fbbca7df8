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
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from tests.faults import cutting_proxy
from tests.harness import (
    NODE_DIR,
    DaemonHarness,
    asking_spec,
    daemon_config,
    features_spec,
    short_tempdir,
    stdio_spec,
    wait_until,
)
from tests.harness import (
    http_bridge as bridge_over,
)
from tests.harness import node as harness_node

MEMORIZZCTL = str(Path(sys.executable).with_name("memorizzctl"))
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
    done = subprocess.run(
        [
            harness_node("the TypeScript SDK client"),
            CLIENT,
            msgspec.json.encode(plan).decode(),
        ],
        cwd=NODE_DIR,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    lines = done.stdout.splitlines()
    assert lines, f"no output (exit {done.returncode}): {done.stderr}"
    seen: dict[str, Any] = msgspec.json.decode(lines[-1])
    assert done.returncode == 0, f"{seen.get('error')}: {done.stderr}"
    return seen


def _subscriptions(harness: DaemonHarness) -> list[str]:
    path = harness.config.servers[2].env["SUB_LOG"]
    return Path(path).read_text().splitlines() if os.path.exists(path) else []


ALL = ["elicit", "sample", "cancel", "listChanged", "subscribe", "complete"]


def test_the_typescript_client_through_the_stdio_bridge(harness: DaemonHarness) -> None:
    seen = _run(harness, memorizzctl=MEMORIZZCTL, socket=harness.socket, steps=ALL)
    # the upstream's elicitation and sampling, answered by the TS handlers
    assert seen["elicit"] == {"text": ["hello Ada"], "isError": False}
    assert seen["asked"] == ["What is your name?"]
    assert seen["sample"] == {
        "text": ["ts-model: hello from TypeScript"],
        "isError": False,
    }
    assert seen["sampled"] == ["say hi"]
    # the abort reached the upstream (the client waited for its cancelled:TAG),
    # and the session goes on
    assert seen["cancel"]["aborted"] is not None
    assert seen["cancel"]["after"] == {"text": ["after"], "isError": False}
    # alpha's new tool, announced and listed
    (added,) = seen["listChanged"]
    assert added.startswith("alpha__dyn_")
    assert seen["subscribe"] == {
        "touched": {"text": ["touched"], "isError": False},
        "updated": "feat://watched",
    }
    assert seen["complete"] == ["green@prompt", "grey@prompt"]
    assert "subscribe feat://watched" in _subscriptions(harness)


@pytest.fixture
def http_bridge(harness: DaemonHarness) -> Iterator[tuple[str, str]]:
    """``memorizzctl mcp serve --transport streamable-http`` on a loopback
    port, in front of the operator's face; yields its URL and token."""
    with bridge_over(harness.socket) as bridge:
        yield bridge


def test_the_typescript_client_through_the_http_bridge(
    harness: DaemonHarness, http_bridge: tuple[str, str]
) -> None:
    url, token = http_bridge
    subscribed = _subscriptions(harness).count("subscribe feat://watched")
    seen = _run(harness, url=url, token=token, steps=ALL)
    assert seen["cancel"]["aborted"] is not None
    assert seen["cancel"]["after"] == {"text": ["after"], "isError": False}
    # list_changed and resources/updated, on the session's GET stream
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
    # the upstream's requests, on the call's event stream, answered by the
    # TS handlers (their answers POSTed back)
    assert seen["elicit"] == {"text": ["hello Ada"], "isError": False}
    assert seen["asked"] == ["What is your name?"]
    assert seen["sample"] == {
        "text": ["ts-model: hello from TypeScript"],
        "isError": False,
    }
    assert seen["sampled"] == ["say hi"]


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
