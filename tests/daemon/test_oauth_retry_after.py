"""A token endpoint that answers 429 or 503 with ``Retry-After`` is left alone
that long (SECURITY.md item 16): the refresher does not ask it again before
the wait is over (at most ``RETRY_MAX_S``), callers cannot cut the wait short
and are told what is left of it (``server_unavailable``,
``data.retry_after_s``); an unreadable ``Retry-After`` changes nothing (the
refresher's own backoff, which a caller may cut short). For a refresh token
and for a machine grant alike.

The real daemon, authorization server and MCP server, behind the edge battery's
``Edge``, which answers the token requests the test refuses; each request is
timed where it arrives.
"""

from __future__ import annotations

import contextlib
import email.utils
import logging
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from memorizz.api.errors import RemoteError
from memorizz.client import Client
from memorizzd.oauth.keeper import CALLER_RETRY_GAP_S, RETRY_MAX_S
from tests.daemon.test_oauth import login, oauth_spec
from tests.daemon.test_oauth_edge_battery import (
    JSON,
    Answer,
    Edge,
    daemon,
    echo,
    expire,
    keeper_of,
    no_secret_in,
    other_served,
    serve_edge,
)
from tests.daemon.test_oauth_machine import (
    SECRET,
    Machines,
    machine_app,
    machine_spec,
)
from tests.harness import DaemonHarness, daemon_config, serve_asgi
from tests.oauth_world import TestAuthorizationServer


class Refuser:
    """A ``token_answer``: the first ``times`` requests of ``grant_type`` are
    answered ``status`` with ``Retry-After: retry_after()`` (read at each
    answer: an HTTP-date is made then); every request of it is timed."""

    def __init__(
        self,
        grant_type: str,
        status: int,
        retry_after: Callable[[], bytes],
        body: bytes = b"down for maintenance",
        headers: tuple[tuple[bytes, bytes], ...] = (),
        times: int = 1_000_000,
    ) -> None:
        self.grant_type = grant_type
        self.status = status
        self.retry_after = retry_after
        self.body = body
        self.headers = headers
        self.left = times
        self.at: list[float] = []
        """``time.monotonic()`` of each request of ``grant_type``."""

    def __call__(self, form: dict[str, str]) -> Answer | None:
        if form.get("grant_type") != self.grant_type:
            return None
        self.at.append(time.monotonic())
        if self.left <= 0:
            return None
        self.left -= 1
        headers = [*self.headers, (b"retry-after", self.retry_after())]
        return self.status, headers, self.body


def http_date(ahead_s: float) -> Callable[[], bytes]:
    """An HTTP-date (IMF-fixdate) ``ahead_s`` from when it is made."""
    return lambda: email.utils.formatdate(time.time() + ahead_s, usegmt=True).encode()


def refused(call: Callable[[], object]) -> RemoteError:
    """The call fails ``server_unavailable`` for the refresh; its error."""
    with pytest.raises(RemoteError) as failed:
        call()
    assert failed.value.reason == "server_unavailable", failed.value
    assert "the token refresh failed" in failed.value.message
    return failed.value


def held_while_called(
    refuser: Refuser, call: Callable[[], object], seconds: float
) -> list[RemoteError]:
    """Callers keep calling (ten a second) for ``seconds``: each is refused
    at once and told what is left of the capped wait, counted from the
    refused request (RETRY_MAX_S less the time since, give or take what a
    request takes), never zero, never growing; nothing more is asked. The
    errors."""
    errors: list[RemoteError] = []
    at: list[float] = []
    deadline = time.monotonic() + seconds
    while not at or at[-1] < deadline:
        errors.append(refused(call))
        at.append(time.monotonic())
        threading.Event().wait(0.1)
    hints = [e.data["retry_after_s"] for e in errors]
    assert hints == sorted(hints, reverse=True), hints
    assert all(h > 0 for h in hints), hints
    for hint, answered in zip(hints, at, strict=True):
        left = RETRY_MAX_S - (answered - refuser.at[0])
        assert left - 0.01 <= hint <= left + 1.0, (hint, left)
    assert len(refuser.at) == 1, refuser.at
    return errors


def recovers_after(
    refuser: Refuser, call: Callable[[], object], least_s: float, most_s: float
) -> None:
    """Callers keep calling until one goes through (bounded), each refused
    one told to wait at most ``most_s``; the refused request was asked again
    only once its ``Retry-After`` (``least_s`` to ``most_s``) was over, then
    soon."""
    errors: list[RemoteError] = []
    deadline = time.monotonic() + most_s + 10.0
    while True:
        try:
            call()
        except RemoteError as exc:
            errors.append(exc)
        else:
            break
        assert time.monotonic() < deadline, refuser.at
        threading.Event().wait(0.1)
    assert errors, "no caller was held"
    assert {e.reason for e in errors} == {"server_unavailable"}, errors
    hints = [e.data["retry_after_s"] for e in errors]
    assert all(0 < h <= most_s for h in hints), hints
    assert len(refuser.at) == 2, refuser.at
    gap = refuser.at[1] - refuser.at[0]
    assert least_s - 0.1 <= gap <= most_s + 3.0, gap


# --- the refresh token --------------------------------------------------------------


@contextlib.contextmanager
def refresh_refused(
    base_dir: str, refuser: Refuser
) -> Iterator[tuple[TestAuthorizationServer, Edge, DaemonHarness, Client]]:
    """``cal`` logged in and ready, then its token expired and its refresh
    refused by ``refuser``."""
    world = TestAuthorizationServer()
    with serve_edge(world) as (url, edge), daemon(base_dir) as (d, c):
        c.add_server(oauth_spec(url))
        login(c, "cal")
        d.wait_ready("cal")
        edge.token_answer = refuser
        expire(world, keeper_of(d))
        yield world, edge, d, c


@pytest.mark.parametrize(
    ("status", "retry_after", "headers", "body"),
    [
        (503, lambda: b"120", (), b"down for maintenance"),
        (429, lambda: b"86400", (JSON,), b'{"error":"slow_down"}'),
        (503, http_date(3600), (), b""),
    ],
    ids=["503-120s", "429-a-day", "503-http-date-in-an-hour"],
)
def test_a_long_retry_after_holds_the_refresh_whoever_calls(
    base_dir: str,
    caplog: pytest.LogCaptureFixture,
    status: int,
    retry_after: Callable[[], bytes],
    headers: tuple[tuple[bytes, bytes], ...],
    body: bytes,
) -> None:
    """``Retry-After`` of two minutes, a day or an hour's date: no second
    request to the token endpoint while callers keep calling for 3 s (no
    cutting it short after CALLER_RETRY_GAP_S); each is told what is left of
    the wait, capped at RETRY_MAX_S; the grant stays; the other server is
    served; no secret anywhere."""
    caplog.set_level(logging.DEBUG)
    refuser = Refuser("refresh_token", status, retry_after, body, headers)
    with refresh_refused(base_dir, refuser) as (world, _edge, d, c):
        errors = held_while_called(refuser, lambda: echo(c), 3.0)
        other_served(c)
        assert keeper_of(d).state == "ok"
        texts = [repr(errors), repr(c.server_status())]
    assert world.count("refresh_token") == 0
    assert f"will retry in {RETRY_MAX_S:g} s" in caplog.text
    no_secret_in(world, *texts, caplog.text)


@pytest.mark.parametrize(
    ("status", "retry_after", "headers", "body", "least_s", "most_s"),
    [
        (429, lambda: b"2", (JSON,), b'{"error":"slow_down"}', 2.0, 2.0),
        (503, http_date(3.0), (), b"", 2.0, 3.0),
    ],
    ids=["429-2s", "503-http-date-3s-ahead"],
)
def test_a_short_retry_after_is_waited_out_then_the_refresh_recovers(
    base_dir: str,
    status: int,
    retry_after: Callable[[], bytes],
    headers: tuple[tuple[bytes, bytes], ...],
    body: bytes,
    least_s: float,
    most_s: float,
) -> None:
    """``Retry-After: 2`` (or a date 2 to 3 s ahead: an HTTP-date has whole
    seconds): callers calling all along do not make the refresher ask before
    it is over; then it asks at once, and the same refresh token works."""
    refuser = Refuser("refresh_token", status, retry_after, body, headers, times=1)
    with refresh_refused(base_dir, refuser) as (world, _edge, _d, c):
        first = refused(lambda: echo(c))
        assert least_s - 0.5 <= first.data["retry_after_s"] <= most_s
        recovers_after(refuser, lambda: echo(c), least_s, most_s)
        auth = c.server_status("cal")[0].auth
        assert auth is not None
        assert (auth.state, auth.last_refresh_error) == ("ok", None)
    assert world.reuse_detected == 0
    assert world.count("refresh_token") == 1


@pytest.mark.parametrize(
    "retry_after",
    [b"soon", b"-5", b"1.5", b"Thu, 01 Jan 1970 00:00:00 GMT"],
    ids=["text", "negative", "fraction", "a-date-past"],
)
def test_an_unreadable_or_past_retry_after_leaves_the_backoff_as_it_was(
    base_dir: str, retry_after: bytes
) -> None:
    """A ``Retry-After`` that says nothing usable: the refresher's own
    backoff, which a caller cuts short after CALLER_RETRY_GAP_S."""
    refuser = Refuser("refresh_token", 503, lambda: retry_after, times=1)
    with refresh_refused(base_dir, refuser) as (world, _edge, _d, c):
        first = refused(lambda: echo(c))
        assert 0 < first.data["retry_after_s"] <= CALLER_RETRY_GAP_S
        threading.Event().wait(CALLER_RETRY_GAP_S)
        echo(c)
    assert len(refuser.at) == 2
    assert world.count("refresh_token") == 1


# --- a machine grant ----------------------------------------------------------------


def whoami(c: Client) -> None:
    assert not c.call_tool("robot", "whoami", {}).is_error


@contextlib.contextmanager
def machine_refused(
    base_dir: str, refuser: Refuser
) -> Iterator[tuple[Machines, DaemonHarness, Client]]:
    """``robot`` (client credentials) with a token, then the token expired and
    the next request for one refused by ``refuser``."""
    world = TestAuthorizationServer()
    machines = Machines(world)
    edge = Edge(world)
    with (
        serve_asgi(lambda origin: edge.wrap(machine_app(origin, machines))) as origin,
        DaemonHarness.running(daemon_config(base_dir)) as d,
        d.client() as c,
    ):
        c.add_server(machine_spec(origin + "/mcp", oauth_client_secret=SECRET))
        d.wait_ready("robot")
        whoami(c)
        keeper = d.daemon.pool.get("robot").keeper
        assert keeper is not None
        edge.token_answer = refuser
        expire(world, keeper)
        yield machines, d, c


def test_a_machine_grant_holds_for_a_long_retry_after(
    base_dir: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The client credentials grant, refused ``503 Retry-After: 120``: asked
    nothing more while callers call, each told the capped wait left."""
    caplog.set_level(logging.DEBUG)
    refuser = Refuser("client_credentials", 503, lambda: b"120")
    with machine_refused(base_dir, refuser) as (machines, _d, c):
        errors = held_while_called(refuser, lambda: whoami(c), 2.0)
        texts = [repr(errors), repr(c.server_status())]
    assert machines.count() == 1  # the first token only
    for text in (*texts, caplog.text):
        assert SECRET not in text


def test_a_machine_grant_waits_out_a_short_retry_after_then_recovers(
    base_dir: str,
) -> None:
    """The client credentials grant, refused ``429 Retry-After: 2``: asked
    again once the 2 s are over, not before, however often callers call."""
    refuser = Refuser("client_credentials", 429, lambda: b"2", times=1)
    with machine_refused(base_dir, refuser) as (machines, _d, c):
        first = refused(lambda: whoami(c))
        assert 1.5 <= first.data["retry_after_s"] <= 2.0
        recovers_after(refuser, lambda: whoami(c), 2.0, 2.0)
    assert machines.count() == 2
