"""The client's side of resource subscriptions, without a daemon: what it does
with ``notifications/resources/updated`` lines (kept when they come while it
waits for a reply, handed out in order by ``resource_updates``), how waiting
for them ends, and how ``memorizzctl`` prints completions and updates.

The daemon is a thread on a Unix socket that answers each request line with
the lines a test scripts for its method (updates before the reply, say)."""

from __future__ import annotations

import itertools
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgspec
import pytest

from memorizz.api import methods as m
from memorizz.api.errors import DaemonUnreachableError, DeadlineExceededError
from memorizz.client import Client
from memorizz.ctl import render as _render

Script = dict[str, list[bytes]]
"""Per method (each asked once, and answered ``{}``), the lines sent for it
(``REPLY``: its reply)."""
REPLY = b"REPLY"


def updated(uri: str, server: str = "feat") -> bytes:
    params = {"server": server, "uri": uri}
    message = {
        "jsonrpc": "2.0",
        "method": "notifications/resources/updated",
        "params": params,
    }
    return msgspec.json.encode(message)


@contextmanager
def fake_daemon(script: Script, *, after: list[bytes] | None = None) -> Iterator[str]:
    """One connection served by ``script``; once the client asked every
    scripted method, ``after``'s lines, then (``b""`` in it) a close."""
    with tempfile.TemporaryDirectory(prefix="mz-") as d:
        path = str(Path(d) / "fake.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        listener.listen()
        done = threading.Event()

        def serve() -> None:
            conn, _ = listener.accept()
            with conn, conn.makefile("rb") as lines:
                left = len(script)
                for line in lines:
                    request: dict[str, Any] = msgspec.json.decode(line)
                    reply = {"jsonrpc": "2.0", "id": request["id"], "result": {}}
                    for out in script[request["method"]]:
                        out = msgspec.json.encode(reply) if out == REPLY else out
                        conn.sendall(out + b"\n")
                    left -= 1
                    if left == 0 and after is not None:
                        for out in after:
                            if not out:
                                return
                            conn.sendall(out + b"\n")
                done.wait(10)

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        try:
            yield path
        finally:
            done.set()
            listener.close()
            thread.join(timeout=5)


def test_an_update_read_while_waiting_for_a_reply_is_kept_in_order() -> None:
    script: Script = {
        "resources/subscribe": [REPLY],
        "resources/unsubscribe": [updated("a://1"), updated("a://2"), REPLY],
    }
    with fake_daemon(script, after=[updated("a://3")]) as path, Client(path) as c:
        c.subscribe_resource("feat", "a://1")
        c.unsubscribe_resource("feat", "b://0")  # two updates come before its reply
        got = [u.uri for u in itertools.islice(c.resource_updates(5.0), 3)]
    assert got == ["a://1", "a://2", "a://3"]


def test_the_client_is_free_between_two_updates() -> None:
    script: Script = {
        "resources/subscribe": [REPLY, updated("a://1")],
        "resources/unsubscribe": [REPLY],
    }
    with fake_daemon(script, after=[updated("a://2")]) as path, Client(path) as c:
        c.subscribe_resource("feat", "a://1")
        got = []
        for update in c.resource_updates(5.0):
            got.append(update)
            if len(got) == 1:
                c.unsubscribe_resource("feat", "b://0")  # the last: a://2 follows
            else:
                break
    assert got == [
        m.ResourceUpdatedParams(server="feat", uri="a://1"),
        m.ResourceUpdatedParams(server="feat", uri="a://2"),
    ]


def test_waiting_ends_at_the_deadline_and_at_once_without_a_connection() -> None:
    with Client("/nonexistent/never.sock") as c:
        assert list(c.resource_updates()) == []  # nothing to wait on
    script: Script = {"resources/subscribe": [REPLY]}
    with fake_daemon(script) as path, Client(path) as c:
        c.subscribe_resource("feat", "a://1")
        started = time.monotonic()
        assert list(c.resource_updates(0.3)) == []
        assert 0.25 < time.monotonic() - started < 3
        assert list(c.resource_updates(0)) == []


def test_the_daemon_going_away_or_closing_an_idle_connection_is_said() -> None:
    script: Script = {"resources/subscribe": [REPLY]}
    with (
        fake_daemon(script, after=[updated("a://1"), b""]) as path,
        Client(path) as c,
    ):
        c.subscribe_resource("feat", "a://1")
        updates = c.resource_updates(5.0)
        assert next(updates).uri == "a://1"
        with pytest.raises(DaemonUnreachableError):
            next(updates)
    idle = {
        "jsonrpc": "2.0",
        "id": None,
        "error": {
            "code": -32005,
            "message": "connection idle for 600 s; closed",
            "data": {"reason": "idle_timeout"},
        },
    }
    with (
        fake_daemon(script, after=[msgspec.json.encode(idle)]) as path,
        Client(path) as c,
    ):
        c.subscribe_resource("feat", "a://1")
        with pytest.raises(DeadlineExceededError) as closed:
            list(c.resource_updates(5.0))
    assert closed.value.reason == "idle_timeout"


def test_complete_sends_the_ref_and_argument_as_mcp_spells_them() -> None:
    seen: list[dict[str, Any]] = []

    class Recording(Client):
        def request(self, method: str, params: Any, result_type: Any, **kw: Any) -> Any:
            seen.append({"method": method, **msgspec.to_builtins(params)})
            return result_type(completion=m.Completion(values=["x"]))

    c = Recording("/nonexistent/never.sock")
    c.complete(
        "feat", {"type": "ref/prompt", "name": "pick"}, {"name": "color", "value": "r"}
    )
    c.complete(
        "feat",
        m.ResourceTemplateReference(uri="feat://colors/{color}"),
        m.CompletionArgument(name="color", value=""),
        {"arguments": {"shade": "dark"}},
    )
    with pytest.raises(ValueError, match="ref"):
        c.complete(
            "feat", {"type": "ref/tool", "name": "x"}, {"name": "a", "value": ""}
        )
    assert seen == [
        {
            "method": "completion/complete",
            "server": "feat",
            "ref": {"type": "ref/prompt", "name": "pick"},
            "argument": {"name": "color", "value": "r"},
            "context": None,
            "timeout_s": None,
        },
        {
            "method": "completion/complete",
            "server": "feat",
            "ref": {"type": "ref/resource", "uri": "feat://colors/{color}"},
            "argument": {"name": "color", "value": ""},
            "context": {"arguments": {"shade": "dark"}},
            "timeout_s": None,
        },
    ]


def test_completions_and_updates_are_printed_one_safe_line_each() -> None:
    result = m.CompletionCompleteResult(
        completion=m.Completion(values=["green", "two\nlines\x1b[2J"])
    )
    assert _render.render_completion(result) == "green\ntwo?lines?[2J\n"
    empty = m.CompletionCompleteResult(completion=m.Completion(values=[]))
    assert _render.render_completion(empty) == "no completions\n"
    update = m.ResourceUpdatedParams(server="feat", uri="feat://a\nb")
    assert _render.render_update(update) == "feat feat://a?b\n"
