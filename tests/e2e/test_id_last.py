"""Oversize results from servers that write a reply's id last (issue 9, item 3).

The TypeScript SDK, which most public servers use, writes ``{"result":{...},
"jsonrpc":"2.0","id":3}``. An oversize reply must fail its call with
``result_too_large`` as soon as the reply has streamed past, not at the
call's deadline, on stdio, legacy SSE and Streamable HTTP event streams, for
``tools/call`` and ``resources/read``. Servers: our own test server in its
id-last modes, and servers built on the official TypeScript SDK (tests/node/,
installed by scripts/bootstrap).

Every call here has a deadline of CALL_TIMEOUT_S; an answer must come well
before it (the bound is generous: it tells "at once" from "at the deadline").
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from memorizz import Client
from memorizz.api.errors import TooLargeError
from memorizz.api.methods import ServerSpec
from tests.harness import (
    MCP_SERVER,
    NODE_DIR,
    DaemonHarness,
    serve_http,
    stdio_spec,
)
from tests.harness import (
    node as harness_node,
)
from tests.mcp_server import id_last

NODE_SERVER = str(NODE_DIR / "big_server.mjs")
EVERYTHING = str(
    NODE_DIR / "node_modules/@modelcontextprotocol/server-everything/dist/index.js"
)
CAP = 100_000
BIG = 3_000_000
CALL_TIMEOUT_S = 10.0
AT_ONCE_S = 4.0


def node() -> str:
    return harness_node("the TypeScript SDK servers")


@contextlib.contextmanager
def serve_node(mode: str) -> Iterator[str]:
    """tests/node/big_server.mjs over HTTP on 127.0.0.1; yields its URL."""
    proc = subprocess.Popen(
        [node(), NODE_SERVER, mode],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        cwd=NODE_DIR,
    )
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        yield f"http://127.0.0.1:{port}" + ("/sse" if mode == "sse" else "/mcp")
    finally:
        proc.terminate()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


def id_last_events(app: Any) -> Any:
    """ASGI middleware: every ``data:`` line of an event stream goes out id last."""

    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        events = False
        pending = b""

        async def sending(message: Any) -> None:
            nonlocal events, pending
            if message["type"] == "http.response.start":
                headers = dict(message.get("headers", []))
                events = headers.get(b"content-type", b"").startswith(
                    b"text/event-stream"
                )
            elif message["type"] == "http.response.body" and events:
                *lines, pending = (pending + message.get("body", b"")).split(b"\n")
                out = b"".join(
                    (b"data: " + id_last(line[6:]) if line[:7] == b"data: {" else line)
                    + b"\n"
                    for line in lines
                )
                if not message.get("more_body", False):
                    out, pending = out + pending, b""
                message = {**message, "body": out}
            await send(message)

        await app(scope, receive, sending)

    return wrapped


def http_spec(name: str, transport: str, url: str) -> ServerSpec:
    return ServerSpec(
        name=name,
        transport=transport,  # type: ignore[arg-type]
        url=url,
        allow_private_network=True,  # a loopback test server
        max_result_bytes=CAP,
    )


@contextlib.contextmanager
def id_last_server(daemon: DaemonHarness, kind: str) -> Iterator[str]:
    """A server that writes the id last, added to the daemon; yields its name
    (``big_call`` knows its tool and resource of n bytes)."""
    name = kind.replace("-", "_")
    if kind == "python-stdio":
        daemon.add(
            stdio_spec(name, args=[MCP_SERVER, "stdio-id-last"], max_result_bytes=CAP)
        )
        yield name
    elif kind.startswith("python-"):
        transport = kind.removeprefix("python-")
        with serve_http(transport, wrap=id_last_events) as url:
            daemon.add(http_spec(name, transport, url))
            yield name
            with daemon.client() as c:
                c.remove_server(name)
    elif kind == "node-stdio":
        spec = ServerSpec(
            name=name,
            transport="stdio",
            command=node(),
            args=[NODE_SERVER, "stdio"],
            max_result_bytes=CAP,
        )
        daemon.add(spec)
        yield name
    else:
        mode = kind.removeprefix("node-")
        transport = {"sse": "sse", "http": "streamable_http"}[mode]
        with serve_node(mode) as url:
            daemon.add(http_spec(name, transport, url))
            yield name
            with daemon.client() as c:
                c.remove_server(name)


def big_call(c: Client, server: str, what: str, n_bytes: int) -> Callable[[], Any]:
    python = server.startswith("python")
    if what == "tool":
        tool = "huge" if python else "big"
        return lambda: c.call_tool(
            server, tool, {"n_bytes": n_bytes}, timeout_s=CALL_TIMEOUT_S
        )
    uri = f"test://huge/{n_bytes}" if python else f"big://{n_bytes}"
    return lambda: c.read_resource(server, uri, timeout_s=CALL_TIMEOUT_S)


KINDS = [
    "python-stdio",
    "python-sse",
    "python-streamable_http",
    "node-stdio",
    "node-sse",
    "node-http",
]


@pytest.mark.parametrize("what", ["tool", "resource"])
@pytest.mark.parametrize("kind", KINDS)
def test_an_oversize_reply_written_id_last_fails_its_call_at_once(
    daemon: DaemonHarness, kind: str, what: str
) -> None:
    with id_last_server(daemon, kind) as server, daemon.client() as c:
        assert big_call(c, server, what, 20_000)()  # under the cap: answered
        started = time.monotonic()
        with pytest.raises(TooLargeError) as err:
            big_call(c, server, what, BIG)()
        elapsed = time.monotonic() - started
        assert err.value.reason == "result_too_large"
        assert err.value.data["server"] == server  # as every upstream error has it
        assert elapsed < AT_ONCE_S, f"{elapsed:.1f} s: at the deadline, not at once"
        assert c.call_tool(server, "echo", {"text": "ok"}).content[0]["text"] == "ok"
        assert c.server_status(server)[0].restarts == 0


def test_the_reference_everything_server_is_refused_at_once(
    daemon: DaemonHarness,
) -> None:
    """npm @modelcontextprotocol/server-everything: its echo answers what it is sent."""
    spec = ServerSpec(
        name="everything",
        transport="stdio",
        command=node(),
        args=[EVERYTHING, "stdio"],
        max_result_bytes=CAP,
    )
    daemon.add(spec)
    with daemon.client() as c:
        message = "z" * 200_000  # its reply is larger than CAP, the request is not
        started = time.monotonic()
        with pytest.raises(TooLargeError):
            c.call_tool("everything", "echo", {"message": message}, timeout_s=10)
        assert time.monotonic() - started < AT_ONCE_S
        echoed = c.call_tool("everything", "echo", {"message": "hi"})
        assert echoed.content[0]["text"] == "Echo: hi"


def test_an_oversize_request_from_the_server_is_dropped_not_answered(
    daemon: DaemonHarness, caplog: pytest.LogCaptureFixture
) -> None:
    """A server-to-client request over the cap carries the server's id, even
    when it equals the id of our call in flight: it must not fail that call."""
    daemon.add(
        stdio_spec("back", args=[MCP_SERVER, "stdio-id-last"], max_result_bytes=CAP)
    )
    with caplog.at_level("WARNING", logger="memorizzd.upstream"), daemon.client() as c:
        result = c.call_tool("back", "request_back", {"n_bytes": 300_000}, timeout_s=10)
    assert result.content[0]["text"] == "answered"
    assert any("request or notification" in m for m in caplog.messages)
