"""Upstream faults (SECURITY.md §6.2 B) against real MCP servers, with the fault
injected at the edge (``tests/faults.py``): lists on servers without the
capability, a slow drip and progress floods (#12), 429/503 with Retry-After
(#16). Hangs, cut answers and lost sessions over HTTP (#11, #13, #15):
test_http_faults.py."""

from __future__ import annotations

import contextlib
import email.utils
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from memorizz.api.errors import DeadlineExceededError, UnavailableError
from memorizz.api.methods import ServerSpec
from memorizzd.egress.busy import DEFAULT_RETRY_AFTER_S, retry_after_s
from memorizzd.upstream.retry import LOST_PAUSE_S, LOST_SENDS, lost_wait
from tests.bare_server import server as bare_server
from tests.faults import Busy, dripping
from tests.harness import (
    MCP_SERVER,
    TESTS,
    DaemonHarness,
    daemon_config,
    http_spec,
    serve_asgi,
    serve_http,
    stdio_spec,
    wait_until,
)

BARE_SERVER = str(TESTS / "bare_server.py")
FAULTS = str(TESTS / "faults.py")
HTTP = ["streamable_http", "sse"]


@contextlib.contextmanager
def added(d: DaemonHarness, spec: ServerSpec) -> Iterator[str]:
    """``spec`` added and ready; removed (its HTTP session let go) at the end."""
    d.add(spec)
    try:
        yield spec.name
    finally:
        with d.client() as c:
            c.remove_server(spec.name)


# --- lists on a server without the capability (issue 9, item 7) ------------------


@pytest.fixture(params=["stdio", "streamable_http"])
def bare(
    request: pytest.FixtureRequest, daemon: DaemonHarness
) -> Iterator[dict[str, str]]:
    """Two servers that declare only some capabilities: ``tools`` (tools only)
    and ``prompts`` (prompts only), over one transport."""
    kind: str = request.param
    with contextlib.ExitStack() as stack:
        for declared in ("tools", "prompts"):
            if kind == "stdio":
                spec = stdio_spec(declared, args=[BARE_SERVER, "stdio", declared])
            else:
                url = stack.enter_context(
                    serve_asgi(
                        lambda base, d=declared: bare_server(d).streamable_http_app()
                    )
                )
                spec = http_spec(declared, url + "/mcp", kind)
            stack.enter_context(added(daemon, spec))
        yield {"tools": "tools", "prompts": "prompts"}


def test_lists_of_what_a_server_does_not_declare_are_empty(
    daemon: DaemonHarness, bare: dict[str, str]
) -> None:
    with daemon.client() as c:
        assert [t.name for t in c.list_tools("tools")] == ["echo"]
        assert c.list_prompts("tools") == []
        assert c.list_resources("tools") == []
        assert c.list_resource_templates("tools") == []
        assert c.call_tool("tools", "echo", {"text": "hi"}).content[0]["text"] == "hi"

        assert c.list_tools("prompts") == []
        assert c.list_tools("prompts", refresh=True) == []
        assert [p.name for p in c.list_prompts("prompts")] == ["hello"]
        assert c.list_resources("prompts") == []
        assert c.list_resource_templates("prompts") == []
        assert c.test_server("prompts").outcome == "ok"
        statuses = {s.name: s for s in c.server_status()}
    assert statuses["tools"].calls_failed == 0
    assert statuses["prompts"].calls_failed == 0


# --- #12 slow drip: the total deadline holds -----------------------------------------


@contextlib.contextmanager
def dripping_server(d: DaemonHarness, transport: str) -> Iterator[str]:
    """The test server behind a 1 KiB/s link for its large messages."""
    if transport == "stdio":
        argv = [FAULTS, "drip", "1024", "--", sys.executable, MCP_SERVER, "stdio"]
        with added(d, stdio_spec("drip", args=argv)) as name:
            yield name
        return
    with (
        serve_http(transport, wrap=dripping) as url,
        added(d, http_spec("drip", url, transport)) as name,
    ):
        yield name


@pytest.fixture
def quick_checks(base_dir: str) -> Iterator[DaemonHarness]:
    """A daemon that gives a session 1 s to answer its health probe, and a
    caller up to 15 s to wait for a reconnect (a stuck stdio server takes a
    few seconds to stop: stdin closed, 2 s, SIGTERM)."""
    config = daemon_config(base_dir, health_timeout_s=1.0, connect_wait_s=15.0)
    with DaemonHarness.running(config) as d:
        yield d


@pytest.mark.parametrize("transport", ["stdio", *HTTP])
def test_a_slow_drip_fails_at_the_total_deadline_and_the_next_call_works(
    quick_checks: DaemonHarness, transport: str
) -> None:
    d = quick_checks
    fds = _open_fds()
    with dripping_server(d, transport) as name, d.client() as c:
        started = time.monotonic()
        with pytest.raises(DeadlineExceededError) as err:
            # 200 KB at 1 KiB/s: every read makes progress, the whole takes 200 s.
            c.call_tool(name, "huge", {"n_bytes": 200_000}, timeout_s=1.0)
        assert err.value.reason == "timeout"
        assert time.monotonic() - started < 5.0
        with d.client() as control:  # another connection is served meanwhile
            assert control.daemon_status().calls_in_flight == 1
        # The next call is answered (a session stuck behind the drip is
        # found out by a probe and replaced; the others just go on).
        result = c.call_tool(name, "echo", {"text": "next"}, timeout_s=20)
        assert result.content[0]["text"] == "next"
        assert c.call_tool(name, "add", {"a": 1, "b": 2}).structured_content == {
            "result": 3
        }
        assert c.daemon_status().calls_in_flight == 1  # this request only
        status = c.server_status(name)[0]
    assert status.state == "ready"
    assert status.in_flight == 0
    # Nothing of the stuck session is left: pipes, sockets (a little slack for
    # what the event loop and the test server's thread keep).
    wait_until(lambda: _open_fds() <= fds + 2, timeout=10, what="fds released")


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("transport", ["stdio", *HTTP])
def test_progress_notifications_do_not_extend_the_deadline(
    quick_checks: DaemonHarness, transport: str
) -> None:
    d = quick_checks
    if transport == "stdio":
        spec = stdio_spec("chat")
        server_url: contextlib.AbstractContextManager[str] = contextlib.nullcontext("")
    else:
        server_url = serve_http(transport)
    with server_url as url:
        if transport != "stdio":
            spec = http_spec("chat", url, transport)
        with added(d, spec) as name, d.client() as c:
            started = time.monotonic()
            with pytest.raises(DeadlineExceededError) as err:
                c.call_tool(name, "chatty", {"seconds": 30}, timeout_s=1.0)
            assert err.value.reason == "timeout"
            assert time.monotonic() - started < 5.0
            assert c.call_tool(name, "echo", {"text": "next"}).content[0]["text"] == (
                "next"
            )
            status = c.server_status(name)[0]
    assert status.restarts == 0  # the session answered its probe: kept
    assert status.in_flight == 0


# --- #16 429/503 with Retry-After ------------------------------------------------------


@contextlib.contextmanager
def busy_server(d: DaemonHarness, busy: Busy, **overrides: Any) -> Iterator[str]:
    with (
        serve_http("streamable_http", wrap=busy.wrap) as url,
        added(d, http_spec("h", url, "streamable_http", **overrides)) as name,
    ):
        yield name


def test_a_busy_answer_to_a_read_is_honoured_then_sent_again(
    daemon: DaemonHarness,
) -> None:
    busy = Busy(status=429, retry_after="1").method("resources/read")
    with busy_server(daemon, busy) as name, daemon.client() as c:
        started = time.monotonic()
        read = c.read_resource(name, "test://static", timeout_s=10)
        waited = time.monotonic() - started
        assert read.contents[0]["text"] == "static content"
        assert busy.seen == 2  # refused once, then answered
        assert waited >= 0.9  # Retry-After was honoured, not ignored
        assert c.server_status(name)[0].restarts == 0


def test_a_busy_answer_to_a_read_only_tool_is_sent_again(
    daemon: DaemonHarness,
) -> None:
    busy = Busy(status=503, retry_after="0").tool("annotated_read")
    with busy_server(daemon, busy) as name, daemon.client() as c:
        tools = {t.name: t for t in c.list_tools(name)}
        assert tools["annotated_read"].risk == "read"
        assert c.call_tool(name, "annotated_read").content[0]["text"] == "read"
        assert busy.seen == 2


@pytest.mark.parametrize("status", [429, 503])
def test_a_call_that_may_change_something_is_never_sent_again(
    daemon: DaemonHarness, status: int
) -> None:
    busy = Busy(status=status, retry_after="7").tool("echo")
    with busy_server(daemon, busy) as name, daemon.client() as c:
        assert {t.name: t for t in c.list_tools(name)}["echo"].risk == "write"
        started = time.monotonic()
        with pytest.raises(UnavailableError) as err:
            c.call_tool(name, "echo", {"text": "once"}, timeout_s=30)
        assert time.monotonic() - started < 5.0  # told at once, not after 7 s
        assert busy.seen == 1
        # The session is fine: the next call goes through.
        assert c.call_tool(name, "echo", {"text": "x"}).content[0]["text"] == "x"
        assert c.server_status(name)[0].restarts == 0
    assert err.value.reason == "upstream_busy"
    assert err.value.data == {"server": "h", "status": status, "retry_after_s": 7}


def _in(seconds: float) -> str:
    return email.utils.formatdate(time.time() + seconds, usegmt=True)


@pytest.mark.parametrize("form", ["seconds", "http_date"])
def test_a_wait_beyond_the_deadline_or_the_cap_is_not_waited(
    daemon: DaemonHarness, form: str
) -> None:
    retry_after = "120" if form == "seconds" else _in(120)
    busy = Busy(status=503, retry_after=retry_after).method("resources/read")
    with busy_server(daemon, busy) as name, daemon.client() as c:
        started = time.monotonic()
        with pytest.raises(UnavailableError) as err:
            c.read_resource(name, "test://static", timeout_s=300)  # 120 s > the cap
        assert time.monotonic() - started < 5.0
        assert busy.seen == 1
        assert c.read_resource(name, "test://static").contents  # served now
    assert err.value.reason == "upstream_busy"
    assert 110 <= float(err.value.data["retry_after_s"]) <= 120  # type: ignore[arg-type]


def test_the_retry_budget_bounds_the_load_on_a_busy_server(
    daemon: DaemonHarness,
) -> None:
    busy = Busy(status=429, retry_after="0", times=10**6).method("resources/read")
    with busy_server(daemon, busy) as name, daemon.client() as c:
        for _ in range(10):
            with pytest.raises(UnavailableError) as err:
                c.read_resource(name, "test://static")
            assert err.value.reason == "upstream_busy"
        # Without a budget: 3 sends each (30). With it: 3 + 2, then 1 each.
        assert busy.seen == 13
        busy.times = 0  # the server recovers
        assert c.read_resource(name, "test://static").contents
        assert c.server_status(name)[0].restarts == 0


def test_a_busy_answer_without_retry_after_gets_the_default_hint(
    daemon: DaemonHarness,
) -> None:
    busy = Busy(status=429, retry_after=None).tool("echo")
    with (
        busy_server(daemon, busy) as name,
        daemon.client() as c,
        pytest.raises(UnavailableError) as err,
    ):
        c.call_tool(name, "echo", {"text": "x"})
    assert err.value.reason == "upstream_busy"
    assert err.value.data["retry_after_s"] == DEFAULT_RETRY_AFTER_S


def test_retry_after_values() -> None:
    now = time.time()
    assert retry_after_s("5") == 5.0
    assert retry_after_s(" 0 ") == 0.0
    assert retry_after_s("99999999999") == 3600.0  # bounded
    assert retry_after_s(None) == DEFAULT_RETRY_AFTER_S
    assert retry_after_s("soon") == DEFAULT_RETRY_AFTER_S
    assert retry_after_s("-3") == DEFAULT_RETRY_AFTER_S
    # digits to str.isdigit, not to RFC 9110: "²" made int() raise
    assert retry_after_s("\u00b2") == DEFAULT_RETRY_AFTER_S
    assert retry_after_s("\u0663") == DEFAULT_RETRY_AFTER_S
    assert retry_after_s("9" * 5000) == 3600.0  # past int()'s 4,300 digits
    assert retry_after_s(email.utils.formatdate(now + 30, usegmt=True), now=now) == (
        pytest.approx(30, abs=1)
    )
    assert retry_after_s(email.utils.formatdate(now - 30, usegmt=True), now=now) == 0


def test_lost_connection_pauses_double_with_jitter() -> None:
    # A safe request is sent again after a lost connection at most
    # LOST_SENDS times in all (test_reliability: three sessions for a read),
    # after a pause that doubles and is jittered so that many callers do not
    # hit a restarted server at the same moment.
    assert LOST_SENDS == 3
    for attempt in (1, 2):
        pauses = {lost_wait(attempt) for _ in range(50)}
        top = LOST_PAUSE_S * 2**attempt
        assert all(top / 2 <= pause <= top for pause in pauses)
        assert len(pauses) > 1  # jittered
