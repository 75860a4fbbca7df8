"""HTTP upstream faults (SECURITY.md §6.2 B #11, #13, #15) against the real
test MCP server, with the fault injected at the edge (``tests/faults.py``):
a hang after connect, a response cut mid-way, a lost Streamable HTTP session
and an SSE stream dropped mid-response. (stdio faults: test_stdio_faults.py.)"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from mcp.server.streamable_http import EventCallback, EventMessage, EventStore
from mcp_types import JSONRPCMessage

from memorizz.api.errors import DeadlineExceededError, RemoteError, UnavailableError
from memorizz.api.methods import ServerSpec
from tests.faults import (
    Cut,
    DropStream,
    Hang,
    Seen,
    SessionLoss,
    WrongId,
    silent_listener,
)
from tests.harness import (
    DaemonHarness,
    daemon_config,
    http_spec,
    serve_asgi,
    serve_http,
    wait_until,
)

LEGACY = "2025-11-25"


@contextlib.contextmanager
def added(d: DaemonHarness, spec: ServerSpec, *, ready: bool = True) -> Iterator[str]:
    """``spec`` added (and ready); removed (its HTTP session let go) at the end."""
    with d.client() as c:
        c.add_server(spec)
    try:
        if ready:
            d.wait_ready(spec.name)
        yield spec.name
    finally:
        with d.client() as c:
            c.remove_server(spec.name)


@contextlib.contextmanager
def faulty_server(
    d: DaemonHarness,
    wrap: Callable[[Any], Any],
    transport: str = "streamable_http",
    **overrides: Any,
) -> Iterator[str]:
    """The test MCP server behind the fault ``wrap``, added as ``h``."""
    with (
        serve_http(transport, wrap=wrap) as url,
        added(d, http_spec("h", url, transport, **overrides)) as name,
    ):
        yield name


def _state(d: DaemonHarness, name: str) -> str:
    with d.client() as c:
        return c.server_status(name)[0].state


# --- #11 hang after connect ------------------------------------------------------


@pytest.fixture
def slow_backoff(base_dir: str) -> Iterator[DaemonHarness]:
    """A daemon that waits 5-10 s after a first failed connect (so a test
    can look at a server in backoff without racing the next attempt)."""
    config = daemon_config(base_dir, backoff_initial_s=10.0, backoff_max_s=10.0)
    with DaemonHarness.running(config) as d:
        yield d


@pytest.mark.parametrize("transport", ["streamable_http", "sse"])
def test_a_server_that_accepts_and_never_answers_backs_off_and_calls_fail_fast(
    slow_backoff: DaemonHarness, transport: str
) -> None:
    d = slow_backoff
    path = "/mcp" if transport == "streamable_http" else "/sse"
    with silent_listener() as (base, accepted):
        spec = http_spec("mute", base + path, transport, timeout_s=1)
        started = time.monotonic()
        with added(d, spec, ready=False), d.client() as c:
            # The connect is bounded by timeout_s, not by the SDK's 30 s
            # connect timeout or its 10 s server/discover probe.
            wait_until(
                lambda: _state(d, "mute") in ("backoff", "failed"),
                timeout=10,
                what="backoff",
            )
            assert time.monotonic() - started < 5.0
            assert accepted  # it did connect: the hang is after the connect
            status = c.server_status("mute")[0]
            assert "within" in (status.last_error or "")
            assert c.test_server("mute").outcome == "timeout"
            # While it backs off, a call is refused at once.
            started = time.monotonic()
            with pytest.raises(UnavailableError) as err:
                c.call_tool("mute", "echo", {"text": "x"}, timeout_s=30)
            assert time.monotonic() - started < 1.0
    assert err.value.reason == "server_unavailable"
    assert err.value.data["state"] == "backoff"
    assert float(err.value.data["retry_after_s"]) > 0  # type: ignore[arg-type]


def test_a_server_that_never_answers_the_probe_is_reached_in_the_handshake_era(
    daemon: DaemonHarness,
) -> None:
    # server/discover goes unanswered (a server that ignores methods it does
    # not know): the next connect uses initialize.
    hang = Hang().method("server/discover")
    started = time.monotonic()
    with faulty_server(daemon, hang.wrap, timeout_s=1) as name, daemon.client() as c:
        took = time.monotonic() - started
        status = c.server_status(name)[0]
        assert c.call_tool(name, "echo", {"text": "hi"}).content[0]["text"] == "hi"
    assert took < 5.0  # not the SDK's 10 s probe
    assert hang.seen == 1
    assert status.protocol_version == LEGACY
    assert status.restarts == 1


@pytest.fixture
def quick_checks(base_dir: str) -> Iterator[DaemonHarness]:
    """A daemon that gives a session 1 s to answer its health probe."""
    config = daemon_config(base_dir, health_timeout_s=1.0)
    with DaemonHarness.running(config) as d:
        yield d


HANGS = {
    # Streamable HTTP: the POST that carries the request is never answered.
    "streamable_http-auto": ("streamable_http", "auto", False),
    "streamable_http-legacy": ("streamable_http", "legacy", False),
    # Legacy SSE: the POST is accepted (202), the answer never comes on the stream.
    "sse-accepted": ("sse", "legacy", True),
}


@pytest.mark.parametrize("hang_of", list(HANGS))
def test_a_request_never_answered_times_out_is_not_sent_again_and_the_next_works(
    quick_checks: DaemonHarness, hang_of: str
) -> None:
    d = quick_checks
    transport, protocol, accept = HANGS[hang_of]
    hang = Hang(times=1, accept=accept).tool("echo")
    with (
        faulty_server(d, hang.wrap, transport, protocol=protocol) as name,
        d.client() as c,
    ):
        started = time.monotonic()
        with pytest.raises(DeadlineExceededError) as err:
            c.call_tool(name, "echo", {"text": "lost"}, timeout_s=1)
        assert time.monotonic() - started < 3.0  # at the deadline
        assert hang.seen == 1  # never sent again
        assert c.call_tool(name, "echo", {"text": "next"}).content[0]["text"] == "next"
        assert hang.seen == 2
        status = c.server_status(name)[0]
    assert err.value.reason == "timeout"
    assert status.restarts == 0  # the session answered its probe: kept
    assert status.calls_failed == 1
    assert status.in_flight == 0


def test_a_legacy_sse_post_never_answered_holds_the_session_until_it_is_replaced(
    quick_checks: DaemonHarness,
) -> None:
    """mcp 2.3's legacy SSE client sends its POSTs one at a time: a POST the
    server never answers holds every later message. The caller whose request
    hung gets ``timeout`` up to 5 s after its deadline: the SDK holds it while
    it tries to write the courtesy ``notifications/cancelled`` (its
    ``_ABANDON_WRITE_TIMEOUT``, shielded). The probe that follows gets no
    answer within ``health_timeout_s`` (it sends no courtesy cancel of its
    own, which would hold it 5 s more) and the session is replaced. Never sent
    twice; the next call works."""
    d = quick_checks
    hang = Hang(times=1).tool("echo")
    with (
        faulty_server(d, hang.wrap, "sse", protocol="legacy") as name,
        d.client() as c,
    ):
        started = time.monotonic()
        with pytest.raises(DeadlineExceededError) as err:
            c.call_tool(name, "echo", {"text": "lost"}, timeout_s=1)
        assert time.monotonic() - started < 1 + 5 + 2
        d.wait_ready(name)
        assert c.call_tool(name, "echo", {"text": "next"}).content[0]["text"] == "next"
        status = c.server_status(name)[0]
    assert err.value.reason == "timeout"
    assert hang.seen == 2  # the hung one, then the next: never sent again
    assert status.restarts == 1
    assert status.calls_failed == 1


@pytest.fixture
def breaker(base_dir: str) -> Iterator[DaemonHarness]:
    """Quick health checks, a short wait for a reconnect, short backoff."""
    config = daemon_config(
        base_dir, health_timeout_s=1.0, connect_wait_s=0.5, backoff_max_s=0.3
    )
    with DaemonHarness.running(config) as d:
        yield d


def test_a_stuck_server_is_dropped_refused_fast_and_reconnected_when_it_answers(
    breaker: DaemonHarness,
) -> None:
    """The breaker: a request times out, the session fails its probe and is
    dropped (open); reconnects fail one after another with growing backoff,
    calls are refused at once meanwhile; the next reconnect after the server
    answers again closes it."""
    d = breaker
    hang = Hang()
    with faulty_server(d, hang.wrap, timeout_s=1) as name, d.client() as c:
        hang.everything = True  # up, accepting, answering nothing
        with pytest.raises(DeadlineExceededError):
            c.call_tool(name, "echo", {"text": "x"}, timeout_s=1)
        wait_until(
            lambda: c.server_status(name)[0].restarts >= 3,
            timeout=15,
            what="three failed reconnects",
        )
        status = c.server_status(name)[0]
        assert status.state != "ready"
        assert "within" in (status.last_error or "")
        started = time.monotonic()
        with pytest.raises(UnavailableError) as err:
            c.call_tool(name, "echo", {"text": "x"}, timeout_s=30)
        assert time.monotonic() - started < 2.0  # not the 30 s deadline
        assert err.value.reason == "server_unavailable"
        hang.everything = False  # it answers again
        d.wait_ready(name)
        assert c.call_tool(name, "echo", {"text": "back"}).content[0]["text"] == "back"
        status = c.server_status(name)[0]
    assert status.state == "ready"
    assert status.last_error is None


# --- #13 reset mid-response ---------------------------------------------------------

CUT_ANSWERS = {
    # A JSON answer (2026-07-28) with a content-length longer than what is
    # sent; an SSE answer (2025-11-25) cut inside its data: line.
    "json": "auto",
    "sse": "legacy",
}


@pytest.mark.parametrize("answer", list(CUT_ANSWERS))
def test_an_answer_cut_mid_way_fails_the_call_which_is_never_sent_again(
    daemon: DaemonHarness, answer: str
) -> None:
    cut = Cut().tool("echo")
    protocol = CUT_ANSWERS[answer]
    with (
        faulty_server(daemon, cut.wrap, protocol=protocol) as name,
        daemon.client() as c,
    ):
        before = c.server_status(name)[0]
        with pytest.raises(UnavailableError) as err:
            c.call_tool(name, "echo", {"text": "cut"}, timeout_s=10)
        assert cut.cuts == 1
        assert cut.seen == 1  # the server ran it once; never sent again
        # The next call is answered (on a new session).
        daemon.wait_ready(name)
        assert c.call_tool(name, "echo", {"text": "next"}).content[0]["text"] == "next"
        after = c.server_status(name)[0]
    assert err.value.reason == "server_unavailable"
    assert "it may have run" in err.value.message  # the outcome is unknown
    assert before.protocol_version == (
        LEGACY if protocol == "legacy" else after.protocol_version
    )
    assert after.calls_failed == before.calls_failed + 1
    assert after.calls_ok == before.calls_ok + 1


@pytest.mark.parametrize("answer", list(CUT_ANSWERS))
def test_a_read_whose_answer_is_cut_is_sent_again(
    daemon: DaemonHarness, answer: str
) -> None:
    cut = Cut().method("resources/read")
    protocol = CUT_ANSWERS[answer]
    with (
        faulty_server(daemon, cut.wrap, protocol=protocol) as name,
        daemon.client() as c,
    ):
        read = c.read_resource(name, "test://static", timeout_s=10)
        status = c.server_status(name)[0]
    assert read.contents[0]["text"] == "static content"
    assert cut.seen == 2  # cut once, then answered whole
    assert status.calls_failed == 0


# --- #15 Streamable HTTP session loss ----------------------------------------


@pytest.mark.parametrize("answer", ["python_sdk", "typescript_sdk", "bare"])
def test_a_lost_session_is_initialized_again_and_the_call_succeeds(
    daemon: DaemonHarness, answer: str
) -> None:
    loss = SessionLoss(answer=answer).tool("echo")
    listed = Seen().method("tools/list")
    with (
        faulty_server(
            daemon, lambda app: loss.wrap(listed.wrap(app)), protocol="legacy"
        ) as name,
        daemon.client() as c,
    ):
        assert c.list_tools(name)
        assert listed.seen == 1  # at connect
        loss.forget()  # the server restarted, or expired the session
        result = c.call_tool(name, "echo", {"text": "again"}, timeout_s=10)
        status = c.server_status(name)[0]
    assert result.content[0]["text"] == "again"
    assert loss.refused >= 1  # the 404 was seen ...
    assert loss.seen == 1  # ... and the call ran exactly once, on the new session
    assert listed.seen == 2  # initialized and listed again
    assert status.restarts == 1
    assert status.calls_failed == 0


def test_a_read_on_a_lost_session_succeeds(daemon: DaemonHarness) -> None:
    loss = SessionLoss().method("resources/read")
    with (
        faulty_server(daemon, loss.wrap, protocol="legacy") as name,
        daemon.client() as c,
    ):
        loss.forget()
        read = c.read_resource(name, "test://static", timeout_s=10)
    assert read.contents[0]["text"] == "static content"
    assert loss.seen == 1


def test_a_restarted_server_is_initialized_again_and_the_call_succeeds(
    daemon: DaemonHarness,
) -> None:
    # No fault injected: a real SDK server that restarts answers 404 for the
    # session it no longer knows.
    with serve_http("streamable_http") as url:
        port = int(url.split(":")[2].split("/")[0])
        spec = http_spec("h", url, "streamable_http", protocol="legacy")
        daemon.add(spec)
    with serve_http("streamable_http", port=port), daemon.client() as c:
        result = c.call_tool("h", "echo", {"text": "restarted"}, timeout_s=10)
        status = c.server_status("h")[0]
        c.remove_server("h")
    assert result.content[0]["text"] == "restarted"
    assert status.restarts == 1
    assert status.calls_failed == 0


class MemoryEventStore(EventStore):
    """The event store a resumable Streamable HTTP server needs (the SDK
    ships only the interface): every event of every stream, in memory."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, JSONRPCMessage | None]] = []

    async def store_event(self, stream_id: str, message: JSONRPCMessage | None) -> str:
        event_id = str(len(self.events) + 1)
        self.events.append((event_id, stream_id, message))
        return event_id

    async def replay_events_after(
        self, last_event_id: str, send_callback: EventCallback
    ) -> str | None:
        where = [i for i, event in enumerate(self.events) if event[0] == last_event_id]
        if not where:
            return None
        stream_id = self.events[where[0]][1]
        for event_id, stream, message in self.events[where[0] + 1 :]:
            if stream == stream_id and message is not None:
                await send_callback(EventMessage(message, event_id))
        return stream_id


@contextlib.contextmanager
def resumable_server(
    d: DaemonHarness, drop: DropStream, protocol: str
) -> Iterator[str]:
    """The test server with an event store (a retry interval of 0.1 s),
    behind ``drop``."""
    from tests.mcp_server import mcp

    def make_app(base: str) -> Any:
        app = mcp.streamable_http_app(
            event_store=MemoryEventStore(), retry_interval=100
        )
        return drop.wrap(app)

    with (
        serve_asgi(make_app) as base,
        added(
            d, http_spec("h", base + "/mcp", "streamable_http", protocol=protocol)
        ) as name,
    ):
        yield name


@pytest.mark.parametrize("abrupt", [False, True], ids=["closed", "dropped"])
@pytest.mark.parametrize("tool", ["echo", "slow"])
def test_a_dropped_sse_answer_is_resumed_and_delivered_once(
    daemon: DaemonHarness, abrupt: bool, tool: str
) -> None:
    drop = DropStream(abrupt=abrupt).tool(tool)
    arguments: dict[str, Any] = {"text": "once"} if tool == "echo" else {"seconds": 0.5}
    with resumable_server(daemon, drop, "legacy") as name, daemon.client() as c:
        result = c.call_tool(name, tool, arguments, timeout_s=10)
        assert c.call_tool(name, "add", {"a": 1, "b": 2}).structured_content == {
            "result": 3
        }
        status = c.server_status(name)[0]
    assert result.content[0]["text"] == ("once" if tool == "echo" else "slept 0.5")
    assert drop.dropped == 1
    assert drop.seen == 1  # sent once
    assert drop.resumed >= 1  # GET with Last-Event-ID
    assert status.restarts == 0
    assert status.calls_ok == 2
    assert status.calls_failed == 0


def test_a_dropped_sse_answer_without_sessions_fails_cleanly_and_is_not_sent_again(
    daemon: DaemonHarness,
) -> None:
    """2026-07-28 has no sessions and no resumption (a request's stream is
    its POST): a dropped answer fails the call, once, and the next works."""
    drop = DropStream().tool("chatty")
    with resumable_server(daemon, drop, "auto") as name, daemon.client() as c:
        with pytest.raises(UnavailableError) as err:
            c.call_tool(name, "chatty", {"seconds": 0.5}, timeout_s=10)
        daemon.wait_ready(name)
        assert c.call_tool(name, "echo", {"text": "next"}).content[0]["text"] == "next"
        status = c.server_status(name)[0]
    assert status.protocol_version != LEGACY
    assert err.value.reason == "server_unavailable"
    assert drop.dropped == 1
    assert drop.seen == 1
    assert drop.resumed == 0


# --- an answer under another id ---------------------------------------------------


@pytest.mark.parametrize("protocol", ["legacy", "2026-07-28"])
def test_an_answer_under_another_id_never_leaves_the_call_waiting(
    daemon: DaemonHarness, protocol: str
) -> None:
    """A Streamable HTTP server that answers a call under another id. A JSON
    answer (the 2026-07-28 server here) was dropped by the SDK as nobody's,
    and the call waited for its deadline: now it fails at once. An answer on
    the request's own event stream (the handshake-era server here) is the
    SDK's to take as that request's (it does, as for a resumed stream)."""
    wrong = WrongId().tool("echo")
    with (
        faulty_server(daemon, wrong.wrap, protocol=protocol, timeout_s=20) as name,
        daemon.client() as c,
    ):
        started = time.monotonic()
        if protocol == "legacy":
            assert c.call_tool(name, "echo", {"text": "x"}).content[0]["text"] == "x"
        else:
            with pytest.raises(RemoteError) as failed:
                c.call_tool(name, "echo", {"text": "x"})
            assert failed.value.reason == "upstream_error", failed.value
            assert "under another id" in failed.value.message, failed.value.message
        assert time.monotonic() - started < 5, "waited for the deadline"
        assert wrong.wrongs == 1
        assert c.call_tool(name, "echo", {"text": "y"}).content[0]["text"] == "y"
