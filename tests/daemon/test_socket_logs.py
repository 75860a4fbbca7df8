"""A socket ``tools/call``'s server's log messages (issue 11, items 6 and 7):
a connection that asked for them (``daemon/hello`` capabilities ``logging``)
hears the ``notifications/message`` its server sends while the call runs, with
the server's name, before its reply; a 2026-07-28 server, which logs only to
requests that ask, is asked (``_meta`` log level). ``memorizzctl mcp call
--verbose`` prints them on stderr. Through a real daemon, the real ``Client``
and real SDK servers (``tests/mcp_server.py``, one per era)."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import msgspec
import pytest

from memorizz.api import methods as m
from memorizz.api.protocol import PROTOCOL_VERSION
from memorizzd.listeners import face_socket_path
from tests.harness import (
    INITIALIZE,
    DaemonHarness,
    daemon_config,
    rmtree,
    short_tempdir,
    stdio_spec,
)


@pytest.fixture(scope="module")
def harness() -> Iterator[DaemonHarness]:
    base = short_tempdir()
    try:
        servers = [stdio_spec("old", protocol="legacy"), stdio_spec("new")]
        with DaemonHarness.running(daemon_config(base, servers=servers)) as running:
            running.wait_ready("old")
            running.wait_ready("new")
            yield running
    finally:
        rmtree(base)


def test_a_call_that_asks_hears_its_servers_log_messages_in_both_eras(
    harness: DaemonHarness,
) -> None:
    heard: list[m.LogParams] = []
    with harness.client() as c:
        old = c.call_tool("old", "logged", {"text": "from old"}, on_log=heard.append)
        new = c.call_tool("new", "logged", {"text": "from new"}, on_log=heard.append)
    assert (old.content[0]["text"], new.content[0]["text"]) == ("logged", "logged")
    assert [(n.server, n.level, n.data) for n in heard] == [
        ("old", "info", "from old"),
        ("new", "info", "from new"),  # asked for: 2026-07-28 logs only then
    ]
    assert harness.daemon.pool.get("new").protocol_version == "2026-07-28"


def test_a_level_asked_for_drops_what_is_below_it(harness: DaemonHarness) -> None:
    heard: list[m.LogParams] = []
    with harness.client() as c:
        c.hello(capabilities={"logging": {"level": "warning"}})
        c.call_tool("old", "logged", {"text": "quiet"}, on_log=heard.append)
        c.call_tool("new", "logged", {"text": "quiet"}, on_log=heard.append)
    assert heard == []


def test_a_connection_that_did_not_ask_gets_only_its_reply(
    harness: DaemonHarness,
) -> None:
    request = {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "tools/call",
        "params": {"server": "old", "name": "logged", "arguments": {"text": "x"}},
    }
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(harness.socket)
        sock.sendall(msgspec.json.encode(request) + b"\n")
        first = sock.makefile("rb").readline()
    assert msgspec.json.decode(first)["id"] == 7


def test_a_call_sent_right_behind_its_hello_runs_with_what_the_hello_asked(
    harness: DaemonHarness,
) -> None:
    """A client that does not wait for ``daemon/hello``'s reply: the call
    written with it is not relayed past it (it would run before the hello set
    the connection up), so it hears the log messages the hello asked for."""
    hello = m.DaemonHelloParams(
        protocol_version=PROTOCOL_VERSION,
        client="raw",
        capabilities={"logging": {"level": "info"}},
    )
    lines = [
        {"jsonrpc": "2.0", "id": 1, "method": "daemon/hello", "params": hello},
        {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tools/call",
            "params": {"server": "old", "name": "logged", "arguments": {"text": "x"}},
        },
    ]
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(
            30
        )  # a guard against a hang (the old way: no log, no third line)
        sock.connect(harness.socket)
        sock.sendall(b"".join(msgspec.json.encode(line) + b"\n" for line in lines))
        replies = sock.makefile("rb")
        heard = [msgspec.json.decode(replies.readline()) for _ in range(3)]
    assert [h.get("id", h.get("method")) for h in heard] == [
        1,
        "notifications/message",
        2,
    ]


def test_a_face_call_sent_right_behind_its_set_level_is_asked_for_logs(
    harness: DaemonHarness,
) -> None:
    """The same on the MCP face: a call written right behind
    ``logging/setLevel`` runs after it, so the 2026-07-28 server (which logs
    only to a request that asks) is asked, and the message comes first."""
    messages: list[dict[str, object]] = [
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "logging/setLevel",
            "params": {"level": "info"},
        },
        {
            "jsonrpc": "2.0",
            "id": 3,
            "method": "tools/call",
            "params": {"name": "new__logged", "arguments": {"text": "x"}},
        },
    ]
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(30)  # a guard against a hang (the old way: no log)
        sock.connect(face_socket_path(harness.socket))
        replies = sock.makefile("rb")
        sock.sendall(msgspec.json.encode(INITIALIZE) + b"\n")
        assert msgspec.json.decode(replies.readline())["id"] == 1
        sock.sendall(b"".join(msgspec.json.encode(x) + b"\n" for x in messages))
        heard = [msgspec.json.decode(replies.readline()) for _ in range(3)]
    assert [h.get("id", h.get("method")) for h in heard] == [
        2,
        "notifications/message",
        3,
    ]


def test_mcp_call_verbose_prints_the_servers_log_messages_on_stderr(
    harness: DaemonHarness, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["mcp", "call", "new", "logged", "--arguments", '{"text": "hi there"}']
    assert harness.ctl(*argv, "--verbose") == 0
    shown = capsys.readouterr()
    assert "[new] info: hi there" in shown.err
    assert "logged" in shown.out
    assert harness.ctl(*argv) == 0
    assert "hi there" not in capsys.readouterr().err
