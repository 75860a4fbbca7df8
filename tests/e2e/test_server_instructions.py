"""A server's own ``instructions`` reach the agents, through the face and the socket API.

An MCP server tells its clients how to use it in its handshake's answer
(``initialize`` or ``server/discover``: ``instructions``). Behind memorizzd,
that text was dropped: an agent saw only a preset's or a configured text,
or memorizzd's own, which, in a scope of one server, said the tools were
named ``SERVER__TOOL`` while they keep their names. Now: the configured
text, else a preset's, else the server's own; none with ``instructions =
false``; a session that sees one server gets its text as it is, one that
sees several gets each server's, named, after memorizzd's own, which names
the separator in force.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from memorizz.api import methods as m
from memorizzd.listeners import face_socket_path
from tests.harness import (
    INITIALIZE,
    DaemonHarness,
    daemon_config,
    stdio_spec,
    tempdir_fixture,
)
from tests.wire import wire

OWN = "Search before you write: every note is kept for a year."
base = tempdir_fixture()


@pytest.fixture(scope="module", params=["legacy", "auto"])
def daemon(request: pytest.FixtureRequest, base: str) -> Iterator[DaemonHarness]:
    """``own`` tells its own text (in the era ``request.param`` negotiates),
    ``plain`` tells none, ``mute`` tells one that ``instructions = false`` drops,
    ``told`` tells one the configured text replaces."""
    era = request.param
    env = {"SERVER_INSTRUCTIONS": OWN}
    servers = [
        stdio_spec("own", env=env, protocol=era),
        stdio_spec("plain", protocol=era),
        stdio_spec("mute", env=env, protocol=era, instructions=False),
        stdio_spec("told", env=env, protocol=era, instructions="Ours, not its."),
    ]
    with DaemonHarness.running(daemon_config(f"{base}/{era}", servers=servers)) as d:
        for spec in servers:
            d.wait_ready(spec.name)
        yield d


def _face_instructions(d: DaemonHarness, server: str | None = None) -> str:
    """The face's ``initialize`` answer's ``instructions`` (narrowed to
    ``server`` first, as ``mcp serve --server`` does)."""
    with wire(face_socket_path(d.socket)) as w:
        if server is not None:
            w.note("memorizz/scope", {"server": server})
        reply = w.ask("initialize", INITIALIZE["params"])
    text: str = reply["result"]["instructions"]
    return text


def test_the_servers_own_text_reaches_the_socket_api(daemon: DaemonHarness) -> None:
    with daemon.client() as c:
        told = {s.name: s.instructions for s in c.server_status()}
        listed = c.request(
            "tools/list", m.ToolsListParams(server="own"), m.ToolsListResult
        )
    assert told == {"own": OWN, "plain": None, "mute": None, "told": "Ours, not its."}
    assert listed.instructions == OWN


def test_a_face_that_sees_one_server_tells_its_text_as_it_is(
    daemon: DaemonHarness,
) -> None:
    assert _face_instructions(daemon, "own") == OWN
    assert _face_instructions(daemon, "told") == "Ours, not its."
    # one without a text: ours, saying the names are unchanged (not SERVER__TOOL)
    alone = _face_instructions(daemon, "plain")
    assert alone.startswith("memorizzd: the tools of the MCP server plain, under")
    assert "__" not in alone


def test_a_face_that_sees_several_tells_each_servers_named(
    daemon: DaemonHarness,
) -> None:
    text = _face_instructions(daemon)
    ours, *theirs = text.split("\n\n")
    assert "named SERVER__TOOL" in ours
    assert sorted(theirs) == sorted([f"own: {OWN}", "told: Ours, not its."])
