"""SECURITY.md §6.2 #23-#26, the OAuth lifecycle under faults: the real daemon,
the real authorization server of ``tests/oauth_world.py`` (rotation, reuse
detection, fault switches) and the real client and ``memorizzctl``.
Requests are counted at the authorization server, at the HTTP level."""

from __future__ import annotations

import contextlib
import logging
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from memorizz.api.errors import AuthRequiredError, LoginError, RemoteError
from memorizz.client import Client
from memorizzd.oauth.grant import load_grant
from memorizzd.oauth.keeper import TokenKeeper
from tests.harness import DaemonHarness, daemon_config, stdio_spec, wait_until
from tests.oauth_world import TestAuthorizationServer, browser, serve_protected
from tests.test_oauth import login, oauth_spec, start_login, wait_state


@contextlib.contextmanager
def logged_in(
    world: TestAuthorizationServer, base: str, **config: Any
) -> Iterator[tuple[DaemonHarness, Client, TokenKeeper]]:
    """The daemon with ``cal`` (OAuth, logged in, ready) and whatever else
    ``config`` names."""
    with (
        serve_protected(world) as url,
        DaemonHarness.running(daemon_config(base, **config)) as d,
        d.client() as c,
    ):
        c.add_server(oauth_spec(url))
        login(c, "cal")
        d.wait_ready("cal")
        keeper = d.daemon.pool.get("cal").keeper
        assert keeper is not None
        yield d, c, keeper


def expire(world: TestAuthorizationServer, keeper: TokenKeeper) -> None:
    """The access token expires, at the server and in the daemon's view."""
    world.expire_access_tokens()
    grant = keeper.grant
    assert grant is not None
    keeper.grant = msgspec.structs.replace(grant, expires_at=grant.obtained_at)


def concurrently(
    d: DaemonHarness, callers: int, call: Callable[[Client], object]
) -> list[BaseException]:
    """``callers`` connections make ``call`` at once; the errors they got."""
    errors: list[BaseException] = []
    start = threading.Barrier(callers)

    def caller() -> None:
        try:
            with d.client() as c:
                c.hello()
                start.wait(10)
                call(c)
        except BaseException as exc:  # noqa: BLE001 - collected for the assert
            errors.append(exc)

    threads = [threading.Thread(target=caller) for _ in range(callers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads)
    return errors


def echo(c: Client) -> None:
    assert c.call_tool("cal", "echo", {"text": "x"}).is_error is False


def secrets_of(world: TestAuthorizationServer) -> list[str]:
    """Every token the authorization server ever issued, codes and verifiers."""
    found = [*world.family]
    for form in world.token_forms:
        found += [form[k] for k in ("code", "code_verifier") if k in form]
    return found


# --- #23 refresh stampede --------------------------------------------------------


def test_fifty_callers_on_an_expired_token_cause_one_refresh_stored_before_use(
    base_dir: str,
) -> None:
    """Exactly one refresh POST; all 50 calls succeed; when the new access
    token first reaches the server, the vault already holds the rotated
    refresh token (the one the authorization server now honours)."""
    world = TestAuthorizationServer()
    with logged_in(world, base_dir) as (d, _c, keeper):
        at_first_use: dict[str, tuple[str | None, set[str]]] = {}

        def first_use(token: str) -> None:
            if token not in at_first_use:
                stored = load_grant(keeper._vault, "cal")
                stored_rt = stored.refresh_token if stored else None
                at_first_use[token] = (stored_rt, set(world.refresh))

        world.on_bearer = first_use
        before = world.token_posts.count("refresh_token")
        old = keeper.grant
        assert old is not None
        expire(world, keeper)

        assert concurrently(d, 50, echo) == []
        assert world.token_posts.count("refresh_token") == before + 1
        new = keeper.grant
        assert new is not None
        assert new.access_token != old.access_token
        assert new.refresh_token != old.refresh_token  # rotated
        stored_rt, live = at_first_use[new.access_token]
        assert stored_rt == new.refresh_token
        assert live == {new.refresh_token}  # the one the server honours now


def test_a_slow_refresh_holds_no_lock_over_other_servers(base_dir: str) -> None:
    """While the authorization server sits on a refresh, a stdio server's
    calls (and the daemon's own status) are answered; the waiting calls of the
    OAuth server succeed once the refresh returns."""
    world = TestAuthorizationServer()
    world.refresh_gate = gate = threading.Event()
    config = {"servers": [stdio_spec("t")]}
    with logged_in(world, base_dir, **config) as (d, c, keeper):
        d.wait_ready("t")
        expire(world, keeper)
        waiting: list[BaseException] = []
        callers = [
            threading.Thread(target=lambda: waiting.extend(concurrently(d, 5, echo)))
            for _ in range(2)
        ]
        try:
            for t in callers:
                t.start()
            assert world.refresh_arrived.wait(10)
            for n in range(20):
                got = c.call_tool("t", "echo", {"text": f"meanwhile {n}"})
                assert got.content[0]["text"] == f"meanwhile {n}"
            assert c.server_status("t")[0].state == "ready"
            assert not gate.is_set()  # all of it while the refresh was held
            assert all(t.is_alive() for t in callers)
        finally:
            gate.set()
        for t in callers:
            t.join(30)
        assert waiting == []
    assert world.token_posts.count("refresh_token") == 1


# --- #24 a lost refresh response -------------------------------------------------


def test_a_lost_refresh_response_ends_in_login_required_without_a_loop(
    base_dir: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The authorization server rotates, the response is lost (502); the one
    retry presents the old refresh token, reuse detection revokes the family:
    login_required, two refresh requests in all, a clear error for callers,
    nothing more on further calls, no token in the log (DEBUG)."""
    caplog.set_level(logging.DEBUG)
    world = TestAuthorizationServer()
    with logged_in(world, base_dir) as (_d, c, keeper):
        world.lose_refresh_responses = 1
        expire(world, keeper)
        errors: list[RemoteError] = []
        deadline = time.monotonic() + 15
        while keeper.state == "ok" and time.monotonic() < deadline:
            with pytest.raises(RemoteError) as failed:
                c.call_tool("cal", "echo", {"text": "x"})
            errors.append(failed.value)
        assert keeper.state == "login_required"
        assert world.reuse_detected == 1
        assert world.access == {}  # the whole family is revoked
        assert world.refresh == {}
        for _ in range(5):
            with pytest.raises(AuthRequiredError) as refused:
                c.call_tool("cal", "echo", {"text": "x"})
            assert refused.value.reason == "login_required"
            assert "memorizzctl mcp login cal" in refused.value.message
        wait_state(c, "cal", "login_required")
        status = c.server_status("cal")[0]
        assert status.auth is not None
        assert status.auth.state == "login_required"
        assert "invalid_grant" in (status.auth.last_refresh_error or "")
        threading.Event().wait(2.5)  # the refresher's backoff would have fired by now
    assert world.token_posts.count("refresh_token") == 2
    # The call that met the lost response is told the refresh failed (retry
    # later); the next one, whose retry met reuse detection, to log in.
    assert [e.reason for e in errors] == ["server_unavailable", "login_required"]
    assert "the token endpoint answered 502" in errors[0].message
    logged = caplog.text
    assert "login required" in logged
    for secret in secrets_of(world):
        assert secret not in logged
