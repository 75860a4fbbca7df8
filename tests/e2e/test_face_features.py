"""Resource subscriptions, completions and roots through the face.

Subscriptions are counted across the sessions of one warm upstream session,
and updates routed to the sessions that hold the URI; a completion goes to
the server that owns the prompt or template.

The client is the official Python SDK's (the handshake era: 2026-07-28 has no
``resources/subscribe``) over the real bridge; behind the face, a real SDK
server that takes subscriptions and completes (``tests/features_server.py``), over stdio and
over Streamable HTTP, and a second server (``legacy_server.py``) so that URIs
are routed.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

from tests import features_server
from tests.harness import (
    DaemonHarness,
    daemon_config,
    http_spec,
    light_spec,
    rmtree,
    serve_asgi,
    short_tempdir,
    stdio_spec,
    wait_until,
)
from tests.process import MEMORIZZCTL

FEATURES = str(Path(features_server.__file__))
WATCHED = "feat://watched"
RED = "feat://colors/red"
ROOTS = ["file:///srv/project", "file:///home/shared/docs"]


@pytest.fixture(scope="module", params=["stdio", "streamable_http"])
def featured(request: pytest.FixtureRequest) -> Iterator[tuple[DaemonHarness, str]]:
    """A daemon with ``feat`` (the features server, handshake era) and
    ``plain``, ``feat`` over stdio or Streamable HTTP; yields it and the
    server's subscription log."""
    base = short_tempdir()
    log = os.path.join(base, "subs.log")
    Path(log).touch()
    with contextlib.ExitStack() as stack:
        if request.param == "stdio":
            feat = stdio_spec(
                "feat",
                args=[FEATURES, "stdio"],
                env={"SUB_LOG": log},
                protocol="legacy",
                roots=ROOTS,
            )
        else:
            patch = stack.enter_context(pytest.MonkeyPatch.context())
            patch.setattr(features_server, "SUB_LOG", log)
            base_url = stack.enter_context(
                serve_asgi(lambda _: features_server.mcp.streamable_http_app())
            )
            feat = http_spec(
                "feat",
                base_url + "/mcp",
                "streamable_http",
                protocol="legacy",
                roots=ROOTS,
            )
        config = daemon_config(base, servers=[feat, light_spec("plain")])
        harness = stack.enter_context(DaemonHarness.running(config))
        harness.wait_ready("feat")
        harness.wait_ready("plain")
        yield harness, log
    rmtree(base)


def _bridge(api_socket: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=MEMORIZZCTL, args=["--socket", api_socket, "mcp", "serve"]
    )


def _lines(log: str) -> list[str]:
    return Path(log).read_text(encoding="utf-8").splitlines()


@pytest.mark.filterwarnings(
    "ignore::mcp.shared.exceptions.MCPDeprecationWarning"
)  # resources/subscribe is the handshake era's way
def test_a_uri_is_subscribed_upstream_once_and_its_updates_reach_only_its_holders(
    featured: tuple[DaemonHarness, str],
) -> None:
    """Sessions A and B subscribe to ``feat://watched``, C to another URI:
    the server hears one subscribe for the URI both hold; an update of it
    reaches A and B and not C (C hears only its own, sent after); the server
    hears the unsubscribe only when the last holder lets go, and a session
    that closes lets go of what it held."""
    heard: dict[str, list[str]] = {"a": [], "b": [], "c": []}
    got = {name: anyio.Event() for name in ("a-watched", "b-watched", "c-red")}

    def handler(name: str) -> Any:
        async def on_message(message: Any) -> None:
            if isinstance(message, types.ResourceUpdatedNotification):
                uri = str(message.params.uri)
                heard[name].append(uri)
                key = f"{name}-{uri.rsplit('/', 1)[-1]}"
                if key in got:
                    got[key].set()

        return on_message

    bridge = _bridge

    async def sessions(api_socket: str, log: str) -> tuple[Any, list[str]]:
        async with (
            Client(
                stdio_client(bridge(api_socket)),
                mode="legacy",
                message_handler=handler("a"),
            ) as a,
            Client(
                stdio_client(bridge(api_socket)),
                mode="legacy",
                message_handler=handler("b"),
            ) as b,
        ):
            capability = a.server_capabilities.resources
            async with Client(
                stdio_client(bridge(api_socket)),
                mode="legacy",
                message_handler=handler("c"),
            ) as c:
                await a.subscribe_resource(WATCHED)
                await b.subscribe_resource(WATCHED)
                await c.subscribe_resource(RED)
                await a.call_tool("feat__touch", {"uri": WATCHED})
                await a.call_tool("feat__touch", {"uri": RED})
                with anyio.fail_after(10):
                    for event in got.values():
                        await event.wait()
                await a.unsubscribe_resource(WATCHED)
                after_one = _lines(log)
                await b.unsubscribe_resource(WATCHED)
            return capability, after_one

    harness, log = featured
    capability, after_one = anyio.run(sessions, harness.socket, log)
    # C closed holding RED: its unsubscribe follows the session's end
    wait_until(lambda: f"unsubscribe {RED}" in _lines(log), what="unsubscribe")
    assert capability is not None
    assert capability.subscribe is True
    assert heard == {"a": [WATCHED], "b": [WATCHED], "c": [RED]}
    assert after_one == [f"subscribe {WATCHED}", f"subscribe {RED}"]
    assert _lines(log) == [
        f"subscribe {WATCHED}",
        f"subscribe {RED}",
        f"unsubscribe {WATCHED}",
        f"unsubscribe {RED}",
    ]


def test_the_face_offers_no_subscriptions_when_no_server_in_scope_takes_them(
    base_dir: str,
) -> None:
    """The test server of the rest of the suite declares no
    ``resources.subscribe``: the face does not offer it, and a subscribe is
    refused with ``-32601``."""
    from mcp.shared.exceptions import MCPError

    config = daemon_config(base_dir, servers=[stdio_spec("solo", protocol="legacy")])

    async def work(api_socket: str) -> tuple[Any, int]:
        params = StdioServerParameters(
            command=MEMORIZZCTL, args=["--socket", api_socket, "mcp", "serve"]
        )
        async with Client(stdio_client(params), mode="legacy") as client:
            capability = client.server_capabilities.resources
            with pytest.raises(MCPError) as raised:
                await client.session.send_request(
                    types.SubscribeRequest(
                        params=types.SubscribeRequestParams(uri="test://static")
                    ),
                    types.EmptyResult,
                )
            return capability, raised.value.error.code

    with DaemonHarness.running(config) as harness:
        harness.wait_ready("solo")
        capability, code = anyio.run(work, harness.socket)
    assert capability is not None
    assert not capability.subscribe
    assert code == types.METHOD_NOT_FOUND


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_a_completion_goes_to_the_server_that_owns_the_prompt_or_template(
    featured: tuple[DaemonHarness, str], mode: str
) -> None:
    """The face offers completions (``feat`` does); a prompt's is asked by
    its shown name and reaches ``feat`` under its own, a template's by its
    URI template; the values are the server's."""

    async def work(client: Client) -> tuple[Any, list[str], list[str]]:
        prompt = await client.complete(
            types.PromptReference(name="feat__pick"), {"name": "color", "value": "gr"}
        )
        template = await client.complete(
            types.ResourceTemplateReference(uri="feat://colors/{color}"),
            {"name": "color", "value": "b"},
        )
        return (
            client.server_capabilities.completions,
            prompt.completion.values,
            template.completion.values,
        )

    async def session(api_socket: str) -> Any:
        async with Client(stdio_client(_bridge(api_socket)), mode=mode) as client:
            return await work(client)

    harness, _ = featured
    capability, prompt, template = anyio.run(session, harness.socket)
    assert capability is not None
    assert prompt == ["green@prompt", "grey@prompt"]
    assert template == ["blue@template"]


def test_a_completion_of_an_unknown_prompt_is_refused_and_none_offered_without_a_server_that_completes(
    base_dir: str,
) -> None:
    """Without a server that completes, the face offers no completions; a
    completion of a prompt nobody lists is ``-32602``."""
    from mcp.shared.exceptions import MCPError

    config = daemon_config(base_dir, servers=[light_spec("plain")])

    async def work(api_socket: str) -> tuple[Any, int]:
        async with Client(stdio_client(_bridge(api_socket)), mode="legacy") as client:
            with pytest.raises(MCPError) as raised:
                await client.complete(
                    types.PromptReference(name="nobody"), {"name": "x", "value": ""}
                )
            return client.server_capabilities.completions, raised.value.error.code

    with DaemonHarness.running(config) as harness:
        harness.wait_ready("plain")
        capability, code = anyio.run(work, harness.socket)
    assert capability is None
    assert code == types.INVALID_PARAMS


def test_a_server_is_told_the_roots_of_its_configuration(
    featured: tuple[DaemonHarness, str],
) -> None:
    """``feat``'s tool asks the daemon ``roots/list`` while serving the call:
    the answer is ``roots`` from its entry (not the face client's, which
    declares none)."""

    async def session(api_socket: str) -> Any:
        async with Client(stdio_client(_bridge(api_socket)), mode="legacy") as client:
            result = await client.call_tool("feat__roots", {})
            return result.content[0].text  # type: ignore[union-attr]

    harness, _ = featured
    assert anyio.run(session, harness.socket).splitlines() == ROOTS
