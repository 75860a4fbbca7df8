"""The face's names: a separator per profile (and the operator's face), and the
renames it makes reported in ``servers/status`` as well as the log.

The client is the official Python SDK's over the real bridge; the servers are
``tests/legacy_server.py`` (a tool ``hello``), which starts in milliseconds.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

from memorizz.api import methods as m
from memorizzd.config import ConfigError, Profile, load
from memorizzd.listeners import agent_socket_path
from memorizzd.names import exposed_names
from tests.harness import DaemonHarness, daemon_config, light_spec
from tests.process import MEMORIZZCTL

LONG = "l" * 60
"""A server name that makes ``LONG__hello`` longer than 64 characters."""


def _names_and_call(api_socket: str, name_of: Any) -> tuple[set[str], str]:
    """The face's tool names, and the text of a call to ``name_of(names)``."""

    async def work() -> tuple[set[str], str]:
        params = StdioServerParameters(
            command=MEMORIZZCTL, args=["--socket", api_socket, "mcp", "serve"]
        )
        async with Client(stdio_client(params), mode="legacy") as client:
            names = {t.name for t in (await client.list_tools()).tools}
            result = await client.call_tool(name_of(names), {})
            return names, result.content[0].text  # type: ignore[union-attr]

    return anyio.run(work)


def test_a_profile_and_the_operator_each_have_their_separator(base_dir: str) -> None:
    config = daemon_config(
        base_dir,
        servers=[light_spec("one"), light_spec("two")],
        face_separator="-",
        profiles=[
            Profile(
                name="bot",
                servers=["one", "two"],
                uids=[os.getuid()],
                separator="_x_",
            )
        ],
    )
    with DaemonHarness.running(config) as harness:
        harness.wait_ready("one")
        harness.wait_ready("two")
        operator = _names_and_call(harness.socket, lambda _: "two-hello")
        agent = _names_and_call(
            agent_socket_path(harness.config, "bot"), lambda _: "one_x_hello"
        )
    assert operator == ({"one-hello", "two-hello"}, "hello from legacy")
    assert agent == ({"one_x_hello", "two_x_hello"}, "hello from legacy")


def test_renames_are_reported_in_servers_status_and_the_log(
    base_dir: str, caplog: pytest.LogCaptureFixture
) -> None:
    """``LONG__hello`` is over 64 characters: the face shows it renamed, the
    log says so, and ``servers/status`` lists the rename for each face that
    shows it (a scope of one server keeps ``hello`` as it is)."""
    config = daemon_config(
        base_dir,
        servers=[light_spec(LONG), light_spec("short")],
        profiles=[Profile(name="solo", servers=[LONG], uids=[os.getuid()])],
    )
    (shown,) = (
        name
        for name, pair in exposed_names(
            [(LONG, "hello"), ("short", "hello")], single=False, quiet=True
        ).items()
        if pair == (LONG, "hello")
    )
    caplog.set_level(logging.INFO, logger="memorizzd.face")
    with DaemonHarness.running(config) as harness:
        harness.wait_ready(LONG)
        harness.wait_ready("short")
        names, text = _names_and_call(harness.socket, lambda _: shown)
        with harness.client() as c:
            status = c.call(m.SERVERS_STATUS, m.ServersStatusParams())
            one = c.call(m.SERVERS_STATUS, m.ServersStatusParams(name="short"))
    assert shown in names
    assert len(shown) <= 64
    assert text == "hello from legacy"
    assert f"{LONG}__hello" in caplog.text
    assert shown in caplog.text
    assert status.face_renames == [
        m.FaceRename(face="operator", shown=shown, server=LONG, tool="hello")
    ]
    assert one.face_renames == []


@pytest.mark.parametrize("separator", ["", "....", "a b", "____", "é"])
@pytest.mark.parametrize("where", ["face_separator", "profile"])
def test_a_separator_is_one_to_three_name_characters(
    base_dir: str, separator: str, where: str
) -> None:
    text = (
        f'face_separator = "{separator}"\n'
        if where == "face_separator"
        else f'[[profiles]]\nname = "p"\nseparator = "{separator}"\n'
    )
    path = os.path.join(base_dir, "c.toml")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    with pytest.raises(ConfigError, match=r"1 to 3 characters of \[A-Za-z0-9_-\]"):
        load(path, socket=os.path.join(base_dir, "s.sock"))
