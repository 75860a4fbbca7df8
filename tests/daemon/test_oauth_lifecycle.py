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
from functools import partial
from pathlib import Path
from typing import Any

import msgspec
import pytest

from memorizz.api.errors import (
    ApprovalRequiredError,
    AuthRequiredError,
    ConflictError,
    LoginError,
    RemoteError,
)
from memorizz.client import Client
from memorizzd.approvals import CLOCK_REF
from memorizzd.oauth.grant import load_grant
from memorizzd.oauth.keeper import TokenKeeper
from memorizzd.store import Store
from memorizzd.vault import FernetCredentialStore, keys_for
from tests.daemon.test_oauth import login, oauth_spec, start_login, wait_state
from tests.harness import DaemonHarness, daemon_config, stdio_spec, wait_until
from tests.oauth_world import TestAuthorizationServer, browser, serve_protected


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
    # The calls until the retry are told the refresh failed (retry later: the
    # first met the lost response, the others came within a second of it and
    # were not let drive another attempt); the one whose retry met reuse
    # detection, to log in.
    reasons = [e.reason for e in errors]
    assert reasons[-1] == "login_required", reasons
    assert set(reasons[:-1]) == {"server_unavailable"}, reasons
    assert "the token endpoint answered 502" in errors[0].message
    logged = caplog.text
    assert "login required" in logged
    for secret in secrets_of(world):
        assert secret not in logged


def test_calls_on_a_failing_refresh_do_not_drive_a_refresh_storm(
    base_dir: str,
) -> None:
    """The token expired and the authorization server answers every refresh
    503: each call cut the refresher's backoff short, so refresh requests
    followed the calls' rate (hundreds a second). Calls still fail at once,
    but the server sees at most about one refresh a second."""
    world = TestAuthorizationServer()
    with logged_in(world, base_dir) as (_d, c, keeper):
        world.token_reply = lambda form: (
            (503, b"try later") if form.get("grant_type") == "refresh_token" else None
        )
        expire(world, keeper)
        started = time.monotonic()
        calls = 0
        while time.monotonic() - started < 3.0:
            with pytest.raises(RemoteError) as failed:
                c.call_tool("cal", "echo", {"text": "x"})
            assert failed.value.reason == "server_unavailable", failed.value
            calls += 1
        refreshes = world.token_posts.count("refresh_token")
    assert calls > 10, calls
    assert 1 <= refreshes <= 5, (refreshes, calls)


# --- #25 clock skew and jumps ------------------------------------------------------


def test_a_clock_jump_forward_causes_one_refresh_not_a_storm(base_dir: str) -> None:
    """``expires_in`` 60 s, the wall clock jumps 10 minutes ahead while 20
    callers are busy: one refresh, every call served, and the new token's
    schedule follows the new clock (no refresh after refresh)."""
    world = TestAuthorizationServer(access_ttl=60)
    with logged_in(world, base_dir) as (d, c, keeper):
        before = world.token_posts.count("refresh_token")
        keeper._clock = lambda: time.time() + 600
        assert concurrently(d, 20, echo) == []
        assert world.token_posts.count("refresh_token") == before + 1
        for _ in range(10):
            echo(c)
        threading.Event().wait(1.0)  # the refresher had every chance to storm
        assert world.token_posts.count("refresh_token") == before + 1
        auth = c.server_status("cal")[0].auth
        assert auth is not None
        assert auth.state == "ok"
        assert auth.expires_at is not None
        assert auth.expires_at > time.time() + 600  # on the new clock


def test_a_clock_jump_back_is_caught_by_one_forced_refresh(base_dir: str) -> None:
    """The wall clock goes back 10 minutes, so the daemon thinks its token has
    10 more minutes; the server expires it: one 401 makes one refresh, and
    the calls after it are served."""
    world = TestAuthorizationServer(access_ttl=60)
    with logged_in(world, base_dir) as (_d, c, keeper):
        before = world.token_posts.count("refresh_token")
        keeper._clock = lambda: time.time() - 600
        world.expire_access_tokens()
        with contextlib.suppress(AuthRequiredError):  # the call that met the 401
            echo(c)
        for _ in range(5):
            echo(c)
    assert world.token_posts.count("refresh_token") == before + 1


def test_a_server_that_refuses_fresh_tokens_gets_one_forced_refresh_not_a_loop(
    base_dir: str,
) -> None:
    """Every access token gets a 401, even a fresh one: one forced refresh in
    all, then a clear error for every call (no refresh per call, no loop)."""
    world = TestAuthorizationServer()
    with logged_in(world, base_dir) as (d, c, keeper):
        before = world.token_posts.count("refresh_token")
        world.reject_access = True
        for _ in range(5):
            with pytest.raises(AuthRequiredError) as refused:
                echo(c)
            assert refused.value.reason == "authorization_required"
            assert "401" in refused.value.message
        errors = concurrently(d, 10, echo)
        assert len(errors) == 10
        assert all(isinstance(e, AuthRequiredError) for e in errors)
        assert world.token_posts.count("refresh_token") == before + 1
        assert keeper.state == "ok"  # the grant itself is fine: a login won't help
        # A token the server takes again is used at once.
        world.reject_access = False
        echo(c)
    assert world.token_posts.count("refresh_token") == before + 1


def _record_config(base: str, **overrides: Any) -> Any:
    """Server ``t`` whose ``record`` tool (destructive: ``ask``) logs its tag."""
    log = str(Path(base, "calls.log"))
    return daemon_config(
        base, servers=[stdio_spec("t", env={"CALL_LOG": log})], **overrides
    )


def _propose(c: Client, tag: str) -> str:
    with pytest.raises(ApprovalRequiredError) as asked:
        c.call_tool("t", "record", {"tag": tag})
    proposal_id = asked.value.data["proposal_id"]
    assert isinstance(proposal_id, str)
    return proposal_id


def _moved_back(seconds: float) -> float:
    return time.time() - seconds


def _ran(base: str) -> str:
    path = Path(base, "calls.log")
    return path.read_text() if path.exists() else ""


def test_moving_the_clock_back_does_not_extend_an_approval(base_dir: str) -> None:
    """Proposals of 1 s; the wall clock goes back (30 s: within the skew
    budget; then 10 minutes) and 1.5 s pass: they have expired all the same,
    audited; none can be approved or run. New proposals still work."""
    with DaemonHarness.running(_record_config(base_dir, approval_ttl_s=1.0)) as d:
        d.wait_ready("t")
        book = d.daemon.book
        with d.client() as c:
            for back_s in (30.0, 600.0):
                pending = _propose(c, f"late-pending-{back_s:g}")
                approved = _propose(c, f"late-approved-{back_s:g}")
                c.approve(approved)
                book._clock = partial(_moved_back, back_s)
                threading.Event().wait(1.5)
                with pytest.raises(ConflictError) as refused:
                    c.approve(pending)
                assert refused.value.data["status"] == "expired"
                with pytest.raises(ConflictError) as not_run:
                    c.resume(approved)
                assert not_run.value.data["status"] == "expired"
                expired = {
                    r.proposal_id
                    for r in c.audit(limit=50).records
                    if r.action == "approvals/expire"
                }
                assert {pending, approved} <= expired
            fresh = _propose(c, "new")  # a full life on the moved clock
            assert c.approve(fresh).status == "approved"
    assert "late" not in _ran(base_dir)


def test_a_clock_found_back_at_start_expires_open_proposals(base_dir: str) -> None:
    """The daemon last saw a time 10 minutes later than the wall clock says
    at the next start (``date -s`` while it was down): open proposals, whose
    age can no longer be told, expire at start, audited with the reason."""
    config = _record_config(base_dir, approval_ttl_s=300.0)
    with DaemonHarness.running(config) as d:
        d.wait_ready("t")
        with d.client() as c:
            pending = _propose(c, "across-pending")
            approved = _propose(c, "across-approved")
            c.approve(approved)
    store = Store(config.state_dir)
    try:
        vault = FernetCredentialStore.open(store, keys_for(store, config.state_dir))
        vault.put(CLOCK_REF, repr(time.time() + 600))
    finally:
        store.close()
    with DaemonHarness.running(config) as d, d.client() as c:
        d.wait_ready("t")
        for proposal_id in (pending, approved):
            [found] = [p for p in c.list_approvals() if p.id == proposal_id]
            assert found.status == "expired"
        with pytest.raises(ConflictError):
            c.resume(approved)
        reasons = [
            r.reason or ""
            for r in c.audit(limit=50).records
            if r.action == "approvals/expire"
        ]
        assert len(reasons) == 2
        assert all("wall clock is 600 s behind" in r for r in reasons)
        fresh = _propose(c, "after")  # and the book goes on with the new clock
        assert c.approve(fresh).status == "approved"
    assert "across" not in _ran(base_dir)


# --- #26 auth-code flow integrity ------------------------------------------------


@contextlib.contextmanager
def daemon_with_cal(
    world: TestAuthorizationServer, base: str, **spec: Any
) -> Iterator[tuple[DaemonHarness, Client]]:
    with (
        serve_protected(world) as url,
        DaemonHarness.running(daemon_config(base)) as d,
        d.client() as c,
    ):
        c.add_server(oauth_spec(url, **spec))
        yield d, c


def without(callback: str, name: str) -> str:
    base, _, query = callback.partition("?")
    kept = [p for p in query.split("&") if not p.startswith(name + "=")]
    return base + "?" + "&".join(kept)


def test_a_callback_without_state_is_refused_before_any_token_request(
    base_dir: str,
) -> None:
    world = TestAuthorizationServer()
    with daemon_with_cal(world, base_dir) as (_d, c):
        callback = browser(c.auth_login("cal").authorization_url)
        missing = without(callback, "state")
        for forged in (missing, missing + "&state="):
            with pytest.raises(LoginError) as refused:
                c.auth_complete("cal", forged)
            assert refused.value.reason == "invalid_state"
        assert world.token_posts == []
        # the login is still pending for its own callback
        assert c.auth_complete("cal", callback).auth.state == "ok"
    assert world.token_posts == ["authorization_code"]


def test_a_callback_without_iss_is_refused_where_the_server_promises_it(
    base_dir: str,
) -> None:
    """RFC 9207: metadata says ``authorization_response_iss_parameter_supported``;
    a callback without ``iss`` (a mix-up) is refused, no token requested."""
    world = TestAuthorizationServer()
    world.advertise_iss = True
    with daemon_with_cal(world, base_dir) as (_d, c):
        callback = browser(c.auth_login("cal").authorization_url)
        assert "iss=" not in callback
        with pytest.raises(LoginError) as refused:
            c.auth_complete("cal", callback)
        assert refused.value.reason == "invalid_state"
        assert "iss" in refused.value.message
        assert world.token_posts == []
        world.send_iss = True  # the same server, keeping its promise
        callback = browser(c.auth_login("cal").authorization_url)
        assert "iss=" in callback
        assert c.auth_complete("cal", callback).auth.state == "ok"
    assert world.token_posts == ["authorization_code"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str, host: str | None = None) -> int:
    request = urllib.request.Request(url)  # noqa: S310 - loopback only
    if host is not None:
        request.add_header("Host", host)
    try:
        with urllib.request.urlopen(request, timeout=10) as page:  # noqa: S310
            return int(page.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_the_loopback_listener_answers_only_its_callback_once_then_closes(
    base_dir: str,
) -> None:
    """A wrong path or ``Host`` gets 404 and the login goes on; the right
    callback finishes it; afterwards the port is closed (connection refused)."""
    world = TestAuthorizationServer()
    port = _free_port()
    redirect = f"http://127.0.0.1:{port}/callback"
    with daemon_with_cal(world, base_dir, oauth_redirect_uri=redirect) as (d, _c):
        ctl, authorization_url = start_login(d.socket, "cal")
        try:
            callback = browser(authorization_url)
            wait_until(lambda: _listening(port), what="the callback listener")
            query = callback.partition("?")[2]
            assert _get(f"http://127.0.0.1:{port}/other?{query}") == 404
            assert _get(f"http://127.0.0.1:{port}/?{query}") == 404
            assert _get(callback, host=f"evil.example:{port}") == 404
            assert world.token_posts == []
            assert _get(callback) == 200
            out, err = ctl.communicate(timeout=30)
        finally:
            if ctl.poll() is None:
                ctl.kill()
                ctl.communicate()
        assert ctl.returncode == 0, err
        assert "logged in to cal" in out
        with pytest.raises(urllib.error.URLError) as closed:
            _get(callback)
        assert isinstance(closed.value.reason, ConnectionRefusedError)
    assert world.token_posts == ["authorization_code"]


def test_a_redirect_port_held_by_another_program_is_a_clear_failure(
    base_dir: str,
) -> None:
    world = TestAuthorizationServer()
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        redirect = f"http://127.0.0.1:{port}/callback"
        with daemon_with_cal(world, base_dir, oauth_redirect_uri=redirect) as (d, _c):
            argv = ["--socket", d.socket, "mcp", "login", "cal", "--timeout", "20"]
            ctl = subprocess.run(
                [sys.executable, "-m", "memorizz.cli", *argv],
                check=False,
                capture_output=True,
                text=True,
                timeout=60,
                stdin=subprocess.DEVNULL,
            )
    assert ctl.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in ctl.stderr
    assert "another program holds that port" in ctl.stderr
    assert "--no-listen" in ctl.stderr
    assert world.token_posts == []


def test_the_pkce_verifier_and_the_code_never_reach_the_log(
    base_dir: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    world = TestAuthorizationServer()
    with daemon_with_cal(world, base_dir) as (d, c):
        login(c, "cal")
        d.wait_ready("cal")
        echo(c)
    [form] = world.token_forms
    verifier, code = form["code_verifier"], form["code"]
    assert len(verifier) >= 43
    assert "memorizzd.oauth" in caplog.text  # the daemon's log was captured
    for secret in (verifier, code, *secrets_of(world)):
        assert secret not in caplog.text
