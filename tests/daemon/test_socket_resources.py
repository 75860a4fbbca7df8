"""Completions and resource subscriptions on the socket API (issue 11, item 6).

``completion/complete`` and ``resources/subscribe``/``resources/unsubscribe``
name the server, as every pass-through method does; the face's refusals are
shared (a server that offers none gets the same error on both fronts). A
subscription is held by the connection, counted with every other holder (of
either front) so that the server is subscribed once, and released when the
connection closes; while held, the connection gets
``notifications/resources/updated`` lines with the server's name, for as
long as the server is in its scope. Subscribing is the opt-in: a connection
that never subscribed never gets one.

Through a real daemon and its sockets, the real ``Client``, and real SDK
servers: ``feat`` (tests/features_server.py: subscriptions and completions;
its ``touch`` tool says a resource changed; ``$SUB_LOG`` records what it was
asked) and ``plain`` (tests/mcp_server.py in the handshake era: neither).
"""

from __future__ import annotations

import itertools
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Self

import msgspec
import pytest

from memorizz import Client
from memorizz.api import methods as m
from memorizz.api.errors import MethodNotFoundError, NotFoundError
from memorizz.api.protocol import PROTOCOL_VERSION
from memorizzd.config import Limits, Profile, load
from memorizzd.listeners import face_socket_path
from tests.e2e.test_reload import _doc, _write  # the config file's
from tests.harness import (
    INITIALIZE,
    DaemonHarness,
    features_spec,
    stdio_spec,
    tempdir_fixture,
    wait_until,
)
from tests.peers import ME, NOBODY, agent_socket, as_user, needs_root, profiles_config

PROMPT = m.PromptReference(name="pick")
TEMPLATE = m.ResourceTemplateReference(uri="feat://colors/{color}")
_uris = itertools.count()
WAIT_S = 15.0
"""How long an update that must come may take."""
QUIET_S = 0.5
"""How long a connection that must hear nothing is listened to, after an
update sent at the same time reached a connection that holds it."""


def _uri() -> str:
    """A URI no other test holds (the server takes any: it logs and says yes)."""
    return f"feat://colors/c{next(_uris)}-{os.getpid()}"


base = tempdir_fixture()


@pytest.fixture(scope="module")
def harness(base: str) -> Iterator[DaemonHarness]:
    """``feat`` and ``plain``; profile ``watcher`` reaches ``feat``,
    ``other`` only ``plain``, ``idler`` ``feat`` with a short idle timeout."""
    log = os.path.join(base, "subs.log")
    Path(log).touch()
    config = profiles_config(
        base,
        servers=[
            features_spec("feat", env={"SUB_LOG": log}),
            stdio_spec("plain", protocol="legacy"),
        ],
        profiles=[
            Profile(name="watcher", servers=["feat"], uids=[ME, NOBODY]),
            Profile(name="other", servers=["plain"], uids=[ME, NOBODY]),
            Profile(
                name="idler",
                servers=["feat"],
                uids=[ME],
                limits=Limits(idle_timeout_s=0.6),
            ),
        ],
    )
    with DaemonHarness.running(config) as running:
        running.wait_ready("feat")
        running.wait_ready("plain")
        yield running


def _asked(base: str, uri: str) -> list[str]:
    """What ``feat`` was asked of ``uri``: ``subscribe``, ``unsubscribe``."""
    lines = Path(base, "subs.log").read_text(encoding="utf-8").splitlines()
    return [line.split(" ", 1)[0] for line in lines if line.endswith(" " + uri)]


def _touch(harness: DaemonHarness, uri: str) -> None:
    """``feat`` says ``uri`` changed (its tool, called by the operator)."""
    with harness.client() as c:
        assert c.call_tool("feat", "touch", {"uri": uri}).is_error is False


def _next(c: Client, timeout_s: float = WAIT_S) -> m.ResourceUpdatedParams | None:
    return next(iter(c.resource_updates(timeout_s)), None)


# --- completions -------------------------------------------------------------


def test_a_completion_of_a_prompt_and_of_a_template_is_the_servers(
    harness: DaemonHarness,
) -> None:
    """The ref reaches the server as given (its values say which kind of ref
    it got), with the argument typed so far; the result is MCP's."""
    with harness.client() as c:
        prompt = c.complete(
            "feat", PROMPT, m.CompletionArgument(name="color", value="gr")
        )
        template = c.complete(
            "feat",
            {"type": "ref/resource", "uri": "feat://colors/{color}"},
            {"name": "color", "value": "b"},
            {"arguments": {"shade": "dark"}},
        )
        everything = c.complete("feat", TEMPLATE, {"name": "color", "value": ""})
    assert prompt.completion.values == ["green@prompt", "grey@prompt"]
    assert (prompt.completion.total, prompt.completion.has_more) == (2, False)
    assert template.completion.values == ["blue@template"]
    assert len(everything.completion.values) == 4


def test_a_completion_on_the_wire_is_mcps_complete_result(
    harness: DaemonHarness,
) -> None:
    with _Wire(harness.socket) as w:
        answer = w.ask(
            "completion/complete",
            {
                "server": "feat",
                "ref": {"type": "ref/prompt", "name": "pick"},
                "argument": {"name": "color", "value": "r"},
            },
        )
        bad = w.ask(
            "completion/complete",
            {
                "server": "feat",
                "ref": {"type": "ref/tool", "name": "pick"},
                "argument": {"name": "color", "value": "r"},
            },
        )
    assert answer["result"] == {
        "completion": {"values": ["red@prompt"], "total": 1, "hasMore": False}
    }
    assert bad["error"]["data"]["reason"] == "invalid_params"


def test_a_server_that_offers_neither_is_refused_as_the_face_refuses_it(
    harness: DaemonHarness,
) -> None:
    """``plain`` declares no ``completions`` and no ``resources.subscribe``:
    ``method_not_found`` naming it, word for word what its face says."""
    with harness.client() as c:
        with pytest.raises(MethodNotFoundError) as completing:
            c.complete(
                "plain", m.PromptReference(name="greet"), {"name": "name", "value": ""}
            )
        with pytest.raises(MethodNotFoundError) as subscribing:
            c.subscribe_resource("plain", "test://static")
    with _Wire(face_socket_path(harness.socket)) as face:
        face.ask("initialize", INITIALIZE["params"])
        face_completing = face.ask(
            "completion/complete",
            {
                "ref": {"type": "ref/prompt", "name": "plain__greet"},
                "argument": {"name": "name", "value": ""},
            },
        )
        face_subscribing = face.ask("resources/subscribe", {"uri": "test://static"})
    for socket_api, face_answer in (
        (completing.value, face_completing),
        (subscribing.value, face_subscribing),
    ):
        assert socket_api.reason == "method_not_found"
        assert socket_api.data == {"server": "plain"}
        assert face_answer["error"] == {
            "code": socket_api.code,
            "message": socket_api.message,
            "data": {"reason": "method_not_found", "server": "plain"},
        }
    assert completing.value.message == "server 'plain' offers no completions"
    assert subscribing.value.message == "server 'plain' takes no resource subscriptions"


# --- subscriptions -----------------------------------------------------------


def test_an_update_comes_with_its_servers_name_until_the_connection_unsubscribes(
    harness: DaemonHarness, base: str
) -> None:
    uri = _uri()
    with harness.client() as c, harness.client() as witness:
        c.subscribe_resource("feat", uri)
        c.subscribe_resource("feat", uri)  # again: nothing more
        witness.subscribe_resource("feat", uri)
        _touch(harness, uri)
        assert _next(c) == m.ResourceUpdatedParams(server="feat", uri=uri)
        assert _next(witness) == m.ResourceUpdatedParams(server="feat", uri=uri)
        c.unsubscribe_resource("feat", uri)
        c.unsubscribe_resource("feat", uri)  # not held: no error
        _touch(harness, uri)
        assert _next(witness) is not None  # the update went out
        assert list(c.resource_updates(QUIET_S)) == []
        c.ping()  # the connection goes on
    assert _asked(base, uri).count("subscribe") == 1


def test_the_update_line_is_as_documented(harness: DaemonHarness) -> None:
    """Exactly this line, unasked, on the connection that subscribed; a
    connection that did not gets only its replies."""
    uri = _uri()
    with _Wire(harness.socket) as w, _Wire(harness.socket) as bystander:
        assert w.ask("resources/subscribe", {"server": "feat", "uri": uri}) == {
            "jsonrpc": "2.0",
            "id": 1,
            "result": {},
        }
        assert "result" in bystander.ask("ping", {})
        _touch(harness, uri)
        line = w.raw_line()
        assert "result" in bystander.ask("ping", {})
    assert line == (
        b'{"jsonrpc":"2.0","method":"notifications/resources/updated","params":'
        b'{"server":"feat","uri":"' + uri.encode() + b'"}}'
    )
    assert bystander.notes == []


def test_updates_come_while_the_client_waits_for_replies_and_are_kept(
    harness: DaemonHarness,
) -> None:
    """An update read while the client waited for another reply is kept for
    ``resource_updates``, in order; other methods work between updates."""
    first, second = _uri(), _uri()
    with harness.client() as c:
        c.subscribe_resource("feat", first)
        c.subscribe_resource("feat", second)
        c.call_tool("feat", "touch", {"uri": first})  # its update: before the reply?
        c.call_tool("feat", "touch", {"uri": second})
        c.list_tools("feat")
        got = []
        for update in c.resource_updates(WAIT_S):
            got.append(update.uri)
            c.ping()  # the client is free inside the loop
            if len(got) == 2:
                break
    assert got == [first, second]


def test_two_connections_share_one_upstream_subscription(
    harness: DaemonHarness, base: str
) -> None:
    """The server hears one subscribe for the URI both hold, and one
    unsubscribe, when the last holder lets go: by unsubscribing, or by
    closing its connection."""
    uri = _uri()
    a, b = harness.client(), harness.client()
    try:
        a.subscribe_resource("feat", uri)
        b.subscribe_resource("feat", uri)
        assert _asked(base, uri) == ["subscribe"]
        a.unsubscribe_resource("feat", uri)  # b still holds it
        assert _asked(base, uri) == ["subscribe"]
        b.close()  # the last holder leaves
        wait_until(lambda: _asked(base, uri) == ["subscribe", "unsubscribe"])
    finally:
        a.close()
        b.close()
    again = _uri()
    with harness.client() as a, harness.client() as b:
        a.subscribe_resource("feat", again)
        b.subscribe_resource("feat", again)
        connections = harness.daemon.connections
        a.close()  # b still holds it
        wait_until(lambda: harness.daemon.connections == connections - 1)
        _touch(harness, again)
        assert _next(b) is not None
        assert _asked(base, again) == ["subscribe"]
        b.unsubscribe_resource("feat", again)  # sent before the reply
        assert _asked(base, again) == ["subscribe", "unsubscribe"]


def test_a_closing_connection_releases_what_it_held(
    harness: DaemonHarness, base: str
) -> None:
    uris = [_uri(), _uri()]
    with harness.client() as c:
        for uri in uris:
            c.subscribe_resource("feat", uri)
    for uri in uris:
        wait_until(lambda uri=uri: _asked(base, uri) == ["subscribe", "unsubscribe"])


def test_a_connection_holding_a_subscription_is_not_idle(
    harness: DaemonHarness, base: str
) -> None:
    """``idler``'s idle timeout closes a connection with nothing to do, not
    one that waits for its subscription's updates."""
    uri = _uri()
    path = agent_socket(base, "idler")
    with _Wire(path) as holding, _Wire(path) as idle:
        assert "result" in holding.ask(
            "resources/subscribe", {"server": "feat", "uri": uri}
        )
        assert "result" in idle.ask("ping", {})
        closed = idle.raw_line()  # after 0.6 s of nothing
        threading.Event().wait(1.0)  # the holder is as idle (some periods more)
        _touch(harness, uri)
        update = msgspec.json.decode(holding.raw_line())
        assert "result" in holding.ask("ping", {})
    assert msgspec.json.decode(closed)["error"]["data"]["reason"] == "idle_timeout"
    assert update["params"] == {"server": "feat", "uri": uri}


# --- scope -------------------------------------------------------------------


def _outside(path: str, uri: str) -> dict[str, Any]:
    """What a connection of ``other`` (``plain`` only) gets when it names
    ``feat``, and a server nobody has; and the updates it hears meanwhile."""
    found: dict[str, Any] = {}
    with Client(path) as c:
        c.hello()
        for name in ("feat", "zz-nobody"):
            for method, call in (
                ("subscribe", lambda n: c.subscribe_resource(n, uri)),
                ("unsubscribe", lambda n: c.unsubscribe_resource(n, uri)),
                (
                    "complete",
                    lambda n: c.complete(n, PROMPT, {"name": "color", "value": ""}),
                ),
            ):
                try:
                    call(name)
                except NotFoundError as exc:
                    found[f"{method} {name}"] = [exc.reason, exc.message, exc.data]
        found["heard"] = [u.uri for u in c.resource_updates(3.0)]
    return found


@needs_root
def test_an_agent_cannot_reach_or_hear_a_server_outside_its_scope(
    harness: DaemonHarness, base: str
) -> None:
    """A client of ``other`` under its own uid: ``feat`` is unknown to it,
    word for word as a server nobody has, whatever it asks; and while
    ``feat``'s resource is touched again and again (a ``watcher`` connection
    hears it), it hears nothing."""
    uri = _uri()
    stop = threading.Event()
    with Client(agent_socket(base, "watcher")) as watcher:
        watcher.subscribe_resource("feat", uri)

        def touching() -> None:
            while not stop.is_set():
                _touch(harness, uri)
                stop.wait(0.2)

        toucher = threading.Thread(target=touching)
        toucher.start()
        try:
            outcome = as_user(
                lambda: _outside(agent_socket(base, "other"), uri), uid=NOBODY
            )
        finally:
            stop.set()
            toucher.join()
        assert _next(watcher) == m.ResourceUpdatedParams(server="feat", uri=uri)
    assert outcome[0] == "ok", outcome
    found = outcome[1]
    assert found.pop("heard") == []
    for method in ("subscribe", "unsubscribe", "complete"):
        hidden, missing = found[f"{method} feat"], found[f"{method} zz-nobody"]
        assert hidden[0] == missing[0] == "unknown_server", method
        assert hidden[1] == missing[1].replace("zz-nobody", "feat")
        assert hidden[2] == {"server": "feat"}
    assert _asked(base, uri).count("subscribe") == 1  # the watcher's only


def test_a_reload_that_takes_the_server_out_of_scope_stops_the_updates(
    base_dir: str,
) -> None:
    """``watcher``'s connection (and its face session) hears ``feat``'s
    resource until a reload takes ``feat`` out of the profile; then the
    operator's still does, they do not. What they still hold is let go when
    they close: the server hears the unsubscribe once both are gone."""
    log = Path(base_dir, "subs.log")
    log.touch()
    feat = msgspec.to_builtins(features_spec("feat", env={"SUB_LOG": str(log)}))
    doc = _doc(
        base_dir,
        servers=[feat],
        profiles=[{"name": "watcher", "servers": ["feat"], "uids": [ME]}],
        agents_dir=os.path.join(base_dir, "agents"),
    )
    config_file = Path(base_dir, "memorizzd.toml")
    _write(config_file, doc)
    uri = "feat://watched"
    updated = m.ResourceUpdatedParams(server="feat", uri=uri)
    with DaemonHarness.running(load(str(config_file))) as h:
        h.wait_ready("feat")
        path = agent_socket(base_dir, "watcher")
        agent = Client(path)
        face = _Wire(face_socket_path(path))
        try:
            agent.subscribe_resource("feat", uri)
            face.ask("initialize", INITIALIZE["params"])
            assert "result" in face.ask("resources/subscribe", {"uri": uri})
            with h.client() as operator:
                operator.subscribe_resource("feat", uri)
                _touch(h, uri)
                assert _next(agent) == updated
                assert _next(operator) == updated
                assert msgspec.json.decode(face.raw_line())["params"] == {"uri": uri}
                _write(
                    config_file,
                    {**doc, "profiles": [{"name": "watcher", "uids": [ME]}]},
                )
                assert operator.daemon_reload().profiles_changed == ["watcher"]
                _touch(h, uri)
                assert _next(operator) == updated
                assert list(agent.resource_updates(QUIET_S)) == []
                assert "result" in face.ask("ping", {})
                assert face.notes == []
                with pytest.raises(NotFoundError):
                    agent.unsubscribe_resource("feat", uri)  # unknown to it now
            # the operator let go; the agent and its face session still hold it
            assert _asked_of(log, uri) == ["subscribe"]
            agent.close()
            threading.Event().wait(QUIET_S)
            assert _asked_of(log, uri) == ["subscribe"]  # the face session holds it
        finally:
            agent.close()
            face.close()
        wait_until(lambda: _asked_of(log, uri) == ["subscribe", "unsubscribe"])


def _asked_of(log: Path, uri: str) -> list[str]:
    lines = log.read_text(encoding="utf-8").splitlines()
    return [line.split(" ", 1)[0] for line in lines if line.endswith(" " + uri)]


# --- a raw JSON-RPC connection -------------------------------------------------


class _Wire:
    """One connection: raw lines out, decoded replies in; the lines that
    answer no request are kept in ``notes``."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(WAIT_S)
        self.sock.connect(path)
        self.buffer = b""
        self.ids = itertools.count(1)
        self.notes: list[dict[str, Any]] = []

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    def raw_line(self) -> bytes:
        while b"\n" not in self.buffer:
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise EOFError
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line

    def ask(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        request_id = next(self.ids)
        request = {
            "jsonrpc": "2.0",
            "id": request_id,
            "method": method,
            "params": params,
        }
        self.sock.sendall(msgspec.json.encode(request) + b"\n")
        while True:
            message: dict[str, Any] = msgspec.json.decode(self.raw_line())
            if message.get("id") == request_id and "method" not in message:
                return message
            self.notes.append(message)


def test_the_hello_does_not_opt_in_and_an_old_client_hears_nothing(
    harness: DaemonHarness,
) -> None:
    """A connection that declared everything it could but subscribed to
    nothing gets no update of a URI others hold."""
    uri = _uri()
    hello = {
        "protocol_version": PROTOCOL_VERSION,
        "capabilities": {"logging": {}, "elicitation": {}, "sampling": {}},
    }
    with harness.client() as holder, _Wire(harness.socket) as w:
        holder.subscribe_resource("feat", uri)
        assert "result" in w.ask("daemon/hello", hello)
        _touch(harness, uri)
        assert _next(holder) is not None
        assert "result" in w.ask("ping", {})
        w.sock.settimeout(QUIET_S)
        with pytest.raises(TimeoutError):
            w.raw_line()
    assert w.notes == []
