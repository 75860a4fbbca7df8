"""Graceful drain on SIGTERM (SECURITY.md §6.2 #28), all at once, with the real
executable: idle connections, a short read and a long write in flight, a stdio
child, a Streamable HTTP upstream and a legacy SSE one (its event stream open). The drain is bounded
(``drain_timeout_s``) and the daemon exits 0 well before systemd's
``TimeoutStopSec=`` would SIGKILL it."""

from __future__ import annotations

import contextlib
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from memorizz.api.errors import MemorizzError
from memorizz.api.methods import ServerSpec
from tests.harness import (
    MCP_SERVER,
    DaemonHarness,
    daemon_config,
    daemon_process,
    launch_args,
    serve_http,
    wait_until,
)

IDLE = 100
DRAIN_S = 2.0


class _Requests:
    """ASGI middleware: the HTTP methods the upstream server received."""

    def __init__(self) -> None:
        self.methods: list[str] = []

    def wrap(self, app: Any) -> Any:
        async def counted(scope: dict[str, Any], receive: Any, send: Any) -> None:
            if scope["type"] == "http":
                self.methods.append(scope["method"])
            await app(scope, receive, send)

        return counted


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@contextlib.contextmanager
def _idle_connections(path: str, count: int) -> Iterator[list[socket.socket]]:
    with contextlib.ExitStack() as stack:
        sockets: list[socket.socket] = []
        for _ in range(count):
            s = stack.enter_context(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
            s.connect(path)
            sockets.append(s)
        yield sockets


def _eof(s: socket.socket) -> bool:
    """Whether the daemon closed ``s``: EOF after whatever it sent last."""
    s.settimeout(10)
    try:
        while s.recv(4096):
            pass
    except ConnectionResetError:
        return False
    return True


def test_sigterm_drains_everything_in_flight_and_exits_zero_in_time(
    base_dir: str,
) -> None:
    calls = Path(base_dir, "calls.log")
    upstream = _Requests()
    with (
        serve_http("streamable_http", wrap=upstream.wrap) as url,
        serve_http("sse") as sse_url,
    ):
        config = Path(base_dir, "memorizzd.toml")
        config.write_text(
            f"""
drain_timeout_s = {DRAIN_S}

[[servers]]
name = "t"
transport = "stdio"
command = {sys.executable!r}
args = {launch_args(MCP_SERVER, "stdio")!r}
env = {{ CALL_LOG = {str(calls)!r} }}
risk = {{ slow_record = "write" }}

[[servers]]
name = "web"
transport = "streamable_http"
url = {url!r}
allow_private_network = true

[[servers]]
name = "stream"
transport = "sse"
url = {sse_url!r}
allow_private_network = true
"""
        )
        with daemon_process(base_dir, "--config", str(config)) as d:
            d.wait_ready("t")
            d.wait_ready("web")
            d.wait_ready("stream")  # a legacy SSE stream, open until the end
            with d.client() as c:
                child = c.server_status("t")[0].pid
                assert child is not None
                assert c.call_tool("web", "echo", {"text": "hi"}).is_error is False
            outcomes: dict[str, object] = {}

            def call(key: str, tool: str, arguments: dict[str, Any]) -> None:
                with d.client() as c:
                    try:
                        outcomes[key] = c.call_tool("t", tool, arguments).content[0][
                            "text"
                        ]
                    except MemorizzError as exc:
                        outcomes[key] = getattr(exc, "reason", exc)

            callers = [
                threading.Thread(
                    target=call,
                    args=("read", "watched", {"seconds": 1.0, "tag": "r"}),
                ),
                threading.Thread(
                    target=call,
                    args=("write", "slow_record", {"seconds": 30.0, "tag": "w"}),
                ),
            ]
            with _idle_connections(d.socket, IDLE) as idle:
                for t in callers:
                    t.start()
                with d.client() as c:
                    wait_until(
                        lambda: (
                            c.server_status("t")[0].in_flight == 2
                            and c.daemon_status().connections >= IDLE + 3
                        ),
                        what="two calls in flight, the idle connections accepted",
                    )
                started = time.monotonic()
                assert d.proc is not None
                d.proc.send_signal(signal.SIGTERM)
                assert d.proc.wait(30) == 0
                took = time.monotonic() - started
                for t in callers:
                    t.join(10)
                assert outcomes == {"read": "r", "write": "shutting_down"}
                assert all(_eof(s) for s in idle)
            wait_until(lambda: _gone(child), what="the stdio child gone")
    # drain_timeout_s, then the replies and the upstreams stopped: seconds,
    # far below TimeoutStopSec=30s (what a busy test machine adds included).
    assert took < DRAIN_S + 5, took
    assert "w" not in calls.read_text().split()  # the write never finished
    # Protocol 2026-07-28 has no HTTP session: nothing to DELETE on stop.
    assert "DELETE" not in upstream.methods
    assert not Path(d.socket).exists()


@pytest.mark.parametrize("how", ["the daemon stops", "the server is removed"])
def test_a_legacy_http_session_is_deleted_when_it_ends(base_dir: str, how: str) -> None:
    """Only the 2025-11-25 era has Streamable HTTP sessions (Mcp-Session-Id);
    2026-07-28 has none, so there is nothing to DELETE (the test above). A
    stop leaves a served session in order: the SDK sends its ``DELETE`` only
    when its client is left, never when it is cancelled."""
    upstream = _Requests()
    with serve_http("streamable_http", wrap=upstream.wrap) as url:
        spec = ServerSpec(
            name="web",
            transport="streamable_http",
            url=url,
            allow_private_network=True,
            protocol="legacy",
        )
        with DaemonHarness.running(daemon_config(base_dir)) as d, d.client() as c:
            c.add_server(spec)
            d.wait_ready("web")
            assert "DELETE" not in upstream.methods
            if how == "the server is removed":
                c.remove_server("web")
                assert upstream.methods.count("DELETE") == 1
    assert upstream.methods.count("DELETE") == 1
