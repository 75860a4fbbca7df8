"""Upstream servers that break the protocol, against the real daemon and the
real client: every caller gets a precise error at once or by its deadline,
the other callers and the session are unharmed, and nothing loops.

The stdio servers are tests/probe_server.py (hand-written, no SDK: each
fault a tool or a ``$PROBE`` flag); the HTTP one is the test server behind
a fault of the edge (``Refuse``)."""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import msgspec
import pytest

from memorizz.api.errors import (
    AuthRequiredError,
    DeadlineExceededError,
    InvalidParamsError,
    PermissionDeniedError,
    UpstreamError,
)
from memorizz.api.methods import ServerSpec
from memorizzd.upstream.jsonrpc import JUNK_LINES_LOGGED
from tests.faults import App, Receive, Scope, Send, _PostFault
from tests.harness import (
    TESTS,
    DaemonHarness,
    daemon_config,
    http_spec,
    serve_http,
    stdio_spec,
    wait_until,
)

PROBE_SERVER = str(TESTS / "probe_server.py")


def probe(name: str, *, timeout_s: float = 10.0, **env: str) -> ServerSpec:
    return ServerSpec(
        name=name,
        transport="stdio",
        command=sys.executable,
        args=[PROBE_SERVER],
        env=env,
        timeout_s=timeout_s,
        protocol="legacy",  # it answers server/discover with an error anyway
    )


def _pause(seconds: float) -> None:
    threading.Event().wait(seconds)


def _methods(path: str) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return f.read().split()


# --- answers that are not answers ------------------------------------------------


def test_an_answer_with_neither_result_nor_error_fails_the_call_at_once(
    daemon: DaemonHarness,
) -> None:
    """It was dropped (a decode error in the reader), and the caller waited
    for its deadline to hear ``timeout``."""
    daemon.add(probe("p"))
    with daemon.client() as c:
        for _ in range(2):  # the warm relay's way, then again on the same session
            started = time.monotonic()
            with pytest.raises(UpstreamError) as err:
                c.call_tool("p", "neither", timeout_s=5)
            assert time.monotonic() - started < 2.0
            assert err.value.reason == "upstream_error"
            assert err.value.data["server"] == "p"
            assert "neither a result nor an error" in err.value.message
        assert c.call_tool("p", "hello").content[0]["text"] == "hello from hello"
        assert c.server_status("p")[0].restarts == 0


def test_a_listing_answered_with_neither_result_nor_error_is_an_upstream_error(
    daemon: DaemonHarness,
) -> None:
    """The decode error escaped the connect: the server was restarted again
    and again and never became ready."""
    with daemon.client() as c:
        c.add_server(probe("p", PROBE="neither_list"))
        wait_until(
            lambda: c.server_status("p")[0].state == "ready",
            timeout=5,
            what="a session without a listing",
        )
        with pytest.raises(UpstreamError) as err:
            c.list_tools("p", refresh=True)
        assert err.value.data["server"] == "p"
        assert c.server_status("p")[0].restarts == 0


def test_a_malformed_listing_says_which_server_what_and_where(
    daemon: DaemonHarness,
) -> None:
    """It said only "the server sent a malformed result", with no
    ``data.server``: not which request, nor what in it."""
    daemon.add(probe("p", PROBE="bad_tool"))
    with daemon.client() as c, pytest.raises(UpstreamError) as err:
        c.list_tools("p", refresh=True)
    assert err.value.data == {"server": "p"}
    assert "tools/list" in err.value.message
    assert "$.tools[7].inputSchema" in err.value.message


# --- loops ---------------------------------------------------------------------------


def test_a_server_that_says_its_tools_changed_whenever_listed_is_not_relisted_in_a_loop(
    daemon: DaemonHarness, base_dir: str
) -> None:
    """Each ``tools/list_changed`` made the daemon list again at once, which
    made the server say it again: thousands of listings a second, a CPU
    spinning for as long as the session lived."""
    log = os.path.join(base_dir, "methods.log")
    daemon.add(probe("p", PROBE="relist_storm", METHOD_LOG=log))
    before = _methods(log).count("tools/list")
    _pause(1.5)
    listed = _methods(log).count("tools/list") - before
    assert listed <= 3, f"{listed} listings in 1.5 s"
    with daemon.client() as c:
        assert c.call_tool("p", "hello").content[0]["text"] == "hello from hello"
        assert {t.name for t in c.list_tools("p")} >= {"hello", "neither"}


def test_a_pagination_loop_fails_at_once_and_names_the_server(
    daemon: DaemonHarness, base_dir: str
) -> None:
    """A cursor that comes back was followed to ``list_page_limit`` pages
    (the same page a hundred times), and the error named no server."""
    log = os.path.join(base_dir, "methods.log")
    with daemon.client() as c:
        c.add_server(probe("p", PROBE="cursor_loop", METHOD_LOG=log))
        daemon.wait_ready("p")
        before = _methods(log).count("tools/list")
        with pytest.raises(UpstreamError) as err:
            c.list_tools("p", refresh=True)
    assert err.value.reason == "upstream_error"
    assert err.value.data == {"server": "p"}
    assert err.value.message.startswith("p: ")
    assert "loop" in err.value.message
    assert _methods(log).count("tools/list") - before == 2


def test_an_empty_next_cursor_ends_the_listing(daemon: DaemonHarness) -> None:
    """``nextCursor: ""`` was sent back as no cursor at all, that is, as a
    request for the first page: a hundred of them, then ``upstream_error``."""
    daemon.add(probe("p", PROBE="cursor_empty"))
    with daemon.client() as c:
        names = [t.name for t in c.list_tools("p", refresh=True)]
        assert names[:2] == ["hello", "neither"]
        assert c.server_status("p")[0].tool_count == len(names)


# --- servers that stop talking -----------------------------------------------------


def test_a_server_that_never_answers_initialize_is_started_again(
    daemon: DaemonHarness,
) -> None:
    """A stdio handshake had no bound: the server stayed ``connecting``
    for ever, never restarted, with no ``last_error``."""
    with daemon.client() as c:
        c.add_server(probe("p", timeout_s=1.0, PROBE="silent_init"))
        wait_until(
            lambda: c.server_status("p")[0].restarts >= 1,
            timeout=9,
            what="a restart after an unanswered handshake",
        )
        status = c.server_status("p")[0]
    assert "no answer to the handshake" in (status.last_error or "")


def test_a_server_slower_to_start_than_its_handshake_budget_comes_up_later(
    daemon: DaemonHarness,
) -> None:
    """Every start had the same budget (5 s at least): a server that took
    longer to start (an interpreter importing a large SDK on a loaded host)
    was killed at the same point on every try and never came up. Each start
    that runs out of its budget doubles the next one's."""
    with daemon.client() as c:
        c.add_server(probe("p", timeout_s=1.0, PROBE="slow_start", START_S="6"))
        wait_until(
            lambda: c.server_status("p")[0].last_error is not None,
            timeout=20,
            what="the first start cut off",
        )
        said = c.server_status("p")[0].last_error
        assert said == (
            "no answer to the handshake within 5 s (timed out; the next start has 10 s)"
        )
        wait_until(
            lambda: c.server_status("p")[0].state == "ready",
            timeout=40,
            what="the slow server ready on a later start",
        )
        status = c.server_status("p")[0]
        assert status.restarts >= 1
        assert c.call_tool("p", "hello").content[0]["text"] == "hello from hello"


def test_a_2026_07_28_server_slow_to_start_has_its_whole_budget(
    daemon: DaemonHarness,
) -> None:
    """A server the daemon speaks 2026-07-28 to (configured so, or a replica
    started again) has no fallback from ``server/discover``, yet the probe's
    own 10 s bound cut it off: one that took longer to start failed every
    try, whatever its ``timeout_s``. Its start has its whole budget now."""
    with daemon.client() as c:
        c.add_server(
            stdio_spec(
                "m", protocol="2026-07-28", timeout_s=30, env={"START_DELAY_S": "11"}
            )
        )
        wait_until(
            lambda: c.server_status("m")[0].state == "ready",
            timeout=40,
            what="the slow 2026-07-28 server ready",
        )
        (status,) = c.server_status("m")
    assert status.restarts == 0
    assert status.protocol_version == "2026-07-28"


def test_a_server_that_closes_its_stdout_is_replaced_at_once(
    daemon: DaemonHarness,
) -> None:
    """Its session stayed ``ready`` (in ``servers/status`` too) until a
    request found it closed, or the health probe did, 30 s later."""
    daemon.add(probe("p"))
    with daemon.client() as c:
        pid = c.server_status("p")[0].pid
        assert c.call_tool("p", "close_stdout").content[0]["text"] == "closing stdout"
        wait_until(
            lambda: c.server_status("p")[0].restarts == 1,
            timeout=4,
            what="the session replaced",
        )
        daemon.wait_ready("p")
        assert c.call_tool("p", "hello").content[0]["text"] == "hello from hello"
        assert c.server_status("p")[0].pid != pid


def test_a_call_that_finds_the_session_closed_is_sent_on_the_next(
    daemon: DaemonHarness, base_dir: str
) -> None:
    """A call that found the server's stdout closed was never sent, yet it
    failed with "connection lost during the request (it may have run; not
    sent again)"."""
    log = os.path.join(base_dir, "methods.log")
    daemon.add(probe("p", METHOD_LOG=log))
    with daemon.client() as c:
        c.call_tool("p", "close_stdout")
        _pause(0.1)  # the end of its stdout is read; the session is not yet ended
        result = c.call_tool("p", "hello", timeout_s=10)
        assert result.content[0]["text"] == "hello from hello"
    assert _methods(log).count("tools/call") == 2  # close_stdout, then hello once


@pytest.fixture
def patient(base_dir: str) -> Iterator[DaemonHarness]:
    """A daemon whose callers may wait 15 s for a reconnect."""
    with DaemonHarness.running(daemon_config(base_dir, connect_wait_s=15.0)) as d:
        yield d


def test_a_call_while_a_lost_session_is_stopped_waits_for_the_next(
    patient: DaemonHarness,
) -> None:
    """While a lost session's process was being stopped (up to 4 s for one
    that ignores SIGTERM), calls failed at once with ``server_unavailable``,
    "not connected (ready)" and ``retry_after_s`` 0."""
    d = patient
    d.add(probe("p"))
    with d.client() as c:
        c.call_tool("p", "close_stdout", {"linger": True})
        _pause(1.0)  # the session is lost, its process is being stopped
        started = time.monotonic()
        result = c.call_tool("p", "hello", timeout_s=12)
        assert result.content[0]["text"] == "hello from hello"
        assert time.monotonic() - started < 10
        assert c.server_status("p")[0].restarts == 1


def test_a_call_to_a_server_that_stopped_reading_ends_at_its_deadline(
    daemon: DaemonHarness,
) -> None:
    """The courtesy ``notifications/cancelled`` waited (shielded, up to 1 s)
    for a pipe the server no longer read: every such call ended 1 s late."""
    daemon.add(probe("p"))
    with daemon.client() as c:
        c.call_tool("p", "stop_reading")
        big = {"text": "x" * 200_000}  # fills the pipe the server does not read
        for _ in range(3):
            started = time.monotonic()
            with pytest.raises(DeadlineExceededError) as err:
                c.call_tool("p", "hello", big, timeout_s=1)
            took = time.monotonic() - started
            assert err.value.reason == "timeout"
            assert took < 1.5, f"answered {took:.2f} s after a 1 s deadline"


# --- what a server writes that is not the protocol ------------------------------------


@pytest.mark.parametrize("fault", ["bom", "bom_split"])
def test_a_byte_order_mark_before_the_first_line_is_skipped(
    daemon: DaemonHarness, caplog: pytest.LogCaptureFixture, fault: str
) -> None:
    """A UTF-8 byte order mark before a server's first line on stdout (some
    runtimes write one) made that line unreadable: the handshake's answer
    was ignored as junk, the handshake timed out and the server was
    started again, for ever. Even a mark read in two parts is skipped."""
    with daemon.client() as c:
        c.add_server(probe("p", timeout_s=2.0, PROBE=fault))
        wait_until(
            lambda: c.server_status("p")[0].state == "ready",
            timeout=5,
            what="the handshake's answer read",
        )
        assert c.call_tool("p", "hello").content[0]["text"] == "hello from hello"
        status = c.server_status("p")[0]
    assert status.server_name == "probe-server"
    assert status.restarts == 0
    assert not _junk_logged(caplog, "p")


def test_junk_on_stdout_is_logged_within_a_bound_and_counted(
    daemon: DaemonHarness, caplog: pytest.LogCaptureFixture
) -> None:
    """Every line on stdout that was not JSON-RPC was logged, one warning
    each with no limit: a server printing junk in a loop flooded the
    journal. Now the first few of a window are logged and the rest counted,
    the count said once when the window ends (or the session does)."""
    lines = 3000
    daemon.add(probe("p"))
    with daemon.client() as c:
        result = c.call_tool("p", "junk", {"n": lines}, timeout_s=10)
        assert result.content[0]["text"] == "junked"
        assert c.call_tool("p", "hello").content[0]["text"] == "hello from hello"
        assert c.server_status("p")[0].restarts == 0
        logged = len(_junk_logged(caplog, "p"))
        assert 1 <= logged <= JUNK_LINES_LOGGED
        c.remove_server("p")  # the session ends: the count of the rest is said

    wait_until(
        lambda: logged + sum(_junk_dropped(caplog, "p")) >= lines,
        timeout=5,
        what="the count of the junk not logged",
    )
    assert len(_junk_logged(caplog, "p")) == logged
    assert logged + sum(_junk_dropped(caplog, "p")) == lines
    assert len(_junk_dropped(caplog, "p")) == 1


def _junk_logged(caplog: pytest.LogCaptureFixture, name: str) -> list[str]:
    prefix = f"{name}: ignored a non-JSON-RPC line on stdout"
    return [m for m in caplog.messages if m.startswith(prefix)]


def _junk_dropped(caplog: pytest.LogCaptureFixture, name: str) -> list[int]:
    return [
        int(m.split()[1])
        for m in caplog.messages
        if m.startswith(f"{name}: ") and "non-JSON-RPC lines on stdout not logged" in m
    ]


# --- a server that cannot start -------------------------------------------------------


@pytest.mark.parametrize(
    ("cwd", "problem"), [("missing", "not found"), ("file", "is not a directory")]
)
def test_a_working_directory_that_cannot_be_entered_is_named_as_such(
    daemon: DaemonHarness, base_dir: str, cwd: str, problem: str
) -> None:
    """A stdio server whose ``cwd`` did not exist was reported as
    "executable not found: <the cwd's path>", in ``servers/status`` and
    ``servers/test``: the path was right, the thing it named was not."""
    path = os.path.join(base_dir, "no-such-dir")
    if cwd == "file":
        with open(path, "w", encoding="utf-8"):
            pass
    with daemon.client() as c:
        c.add_server(msgspec.structs.replace(probe("p"), cwd=path))
        wait_until(
            lambda: c.server_status("p")[0].last_error is not None,
            timeout=5,
            what="the failed start",
        )
        status = c.server_status("p")[0]
        tested = c.test_server("p", timeout_s=2)
    assert status.last_error == f"working directory (cwd) {problem}: {path}"
    assert status.state in ("backoff", "failed")
    assert tested.outcome == "unreachable"
    assert tested.message == status.last_error


def test_a_script_whose_interpreter_is_missing_says_so(
    daemon: DaemonHarness, base_dir: str
) -> None:
    """A script whose ``#!`` line names an interpreter that is not installed:
    the kernel says ENOENT, and it was reported as "executable not found:
    <the script>", which is there."""
    script = os.path.join(base_dir, "needs-python9.sh")
    with open(script, "w", encoding="utf-8") as f:
        f.write("#!/no/such/python9 -u\nprint('hi')\n")
    os.chmod(script, 0o700)
    with daemon.client() as c:
        c.add_server(ServerSpec(name="i", transport="stdio", command=script))
        wait_until(
            lambda: c.server_status("i")[0].last_error is not None,
            timeout=5,
            what="the failed start",
        )
        status = c.server_status("i")[0]
    assert status.last_error == (
        f"interpreter not found: /no/such/python9 (the #! line of {script})"
    )


def test_a_relative_command_under_a_missing_cwd_names_the_cwd(
    daemon: DaemonHarness, base_dir: str
) -> None:
    """``command = "./run"`` with a ``cwd`` that does not exist was refused
    as "not found on PATH": a path is not looked up on PATH."""
    cwd = os.path.join(base_dir, "gone")
    with daemon.client() as c, pytest.raises(InvalidParamsError) as refused:
        c.add_server(ServerSpec(name="r", transport="stdio", command="./run", cwd=cwd))
    assert refused.value.message == (
        f"server 'r': executable './run' not found (its working directory,"
        f" cwd {cwd!r}, does not exist)"
    )


def test_a_relative_command_missing_from_its_cwd_names_the_cwd(
    daemon: DaemonHarness, base_dir: str
) -> None:
    """``command = "./run"`` that is not in an existing ``cwd`` was refused as
    "not found on PATH", though a path is looked up relative to ``cwd`` only."""
    with daemon.client() as c, pytest.raises(InvalidParamsError) as refused:
        c.add_server(
            ServerSpec(name="r", transport="stdio", command="./run", cwd=base_dir)
        )
    assert refused.value.message == (
        f"server 'r': executable './run' not found (relative to {base_dir!r})"
    )


# --- one caller's slowness, or a flood, is nobody else's ------------------------------


def test_a_caller_that_does_not_read_its_progress_holds_up_no_other_caller(
    daemon: DaemonHarness,
) -> None:
    """The session's reader waited (up to 1 s each) to pass every progress
    report to a caller that did not read them: the server's answers to
    everyone else waited behind, calls timed out, the probe failed and the
    session was killed."""
    daemon.add(probe("p", timeout_s=30))
    flood = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {
            "server": "p",
            "name": "progress_flood",
            "arguments": {"n": 3000},
            "progress_token": "mine",
        },
    }
    with socket.socket(socket.AF_UNIX) as slow, daemon.client() as c:
        slow.connect(daemon.socket)
        slow.sendall(msgspec.json.encode(flood) + b"\n")  # and never read
        _pause(0.5)
        for _ in range(3):
            started = time.monotonic()
            assert c.call_tool("p", "hello", timeout_s=5).content
            assert time.monotonic() - started < 1.0
        assert c.server_status("p")[0].restarts == 0


def test_a_server_that_floods_requests_without_reading_is_not_deadlocked(
    daemon: DaemonHarness,
) -> None:
    """The reader waited for each reply to be written; the server wrote its
    requests before reading any reply: both waited for ever, the call timed
    out and the session was killed."""
    daemon.add(probe("p"))
    with daemon.client() as c:
        result = c.call_tool("p", "ping_flood", {"n": 20_000}, timeout_s=8)
        assert result.content[0]["text"] == "flooded"
        assert c.call_tool("p", "hello").content
        assert c.server_status("p")[0].restarts == 0


# --- HTTP: refusals at the edge say which server ------------------------------------


@dataclass
class Refuse(_PostFault):
    """ASGI: a POST whose request matches is answered ``status`` with
    ``headers`` and no body (a redirect, a challenge)."""

    status: int = 307
    headers: tuple[tuple[bytes, bytes], ...] = ()

    def wrap(self, app: App) -> App:
        async def refuse(scope: Scope, receive: Receive, send: Send) -> None:
            start = {"type": "http.response.start", "status": self.status}
            await send(start | {"headers": list(self.headers)})
            await send({"type": "http.response.body", "body": b""})

        return self._on_posts(app, self._arrived, refuse)


@contextlib.contextmanager
def refusing(d: DaemonHarness, refuse: Refuse) -> Iterator[str]:
    with serve_http("streamable_http", wrap=refuse.wrap) as url:
        d.add(http_spec("h", url, "streamable_http", protocol="legacy"))
        try:
            yield "h"
        finally:
            with d.client() as c:
                c.remove_server("h")


@pytest.mark.parametrize("status", [307, 401])
def test_a_request_refused_at_the_edge_names_its_server(
    daemon: DaemonHarness, status: int
) -> None:
    """The refusal (a redirect, a challenge) reached the caller with only
    ``data.status``: the one error of a call that did not say which server."""
    headers = (
        ((b"location", b"/elsewhere"),)
        if status == 307
        else ((b"www-authenticate", b'Bearer realm="x, error=,,=resource'),)
    )
    refuse = Refuse(status=status, headers=headers).tool("echo")
    with refusing(daemon, refuse) as name, daemon.client() as c:
        with pytest.raises((PermissionDeniedError, AuthRequiredError)) as err:
            c.call_tool(name, "echo", {"text": "x"})
        assert c.call_tool(name, "add", {"a": 1, "b": 2}).structured_content == {
            "result": 3
        }
    assert err.value.data == {"server": "h", "status": status}
    assert err.value.reason == (
        "redirect_blocked" if status == 307 else "authorization_required"
    )
