"""OAuth 2.1 end to end: the real daemon, a real authorization server and a
protected MCP server on 127.0.0.1 (``tests/oauth_world.py``), the real client
and ``memorizzctl``. Requests are counted at the authorization server."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from memorizz.api import methods as m
from memorizz.api.errors import AuthRequiredError, InvalidParamsError, LoginError
from memorizz.client import Client
from tests.harness import (
    DaemonHarness,
    daemon_config,
    daemon_process,
    rmtree,
    short_tempdir,
    wait_until,
)
from tests.oauth_world import (
    ADMIN_SCOPE,
    PRE_CLIENT_ID,
    PRE_CLIENT_SECRET,
    TestAuthorizationServer,
    browser,
    serve_protected,
)


def oauth_spec(url: str, name: str = "cal", **overrides: Any) -> m.ServerSpec:
    fields: dict[str, Any] = {
        "name": name,
        "transport": "streamable_http",
        "url": url,
        "allow_private_network": True,
        "auth": "oauth",
    }
    fields.update(overrides)
    return m.ServerSpec(**fields)


@pytest.fixture
def base() -> Iterator[str]:
    path = short_tempdir()
    yield path
    rmtree(path)


@contextlib.contextmanager
def world_and_daemon(
    world: TestAuthorizationServer, base: str
) -> Iterator[tuple[str, DaemonHarness, Client]]:
    with (
        serve_protected(world) as url,
        DaemonHarness.running(daemon_config(base)) as d,
        d.client() as c,
    ):
        yield url, d, c


def login(client: Client, server: str) -> m.AuthCompleteResult:
    started = client.auth_login(server)
    return client.auth_complete(server, browser(started.authorization_url))


def wait_state(client: Client, name: str, state: str) -> None:
    wait_until(
        lambda: client.server_status(name)[0].state == state,
        what=f"{name} {state}",
    )


def test_login_by_pasted_callback_with_dynamic_registration(base: str) -> None:
    world = TestAuthorizationServer()
    with world_and_daemon(world, base) as (url, d, c):
        c.add_server(oauth_spec(url))
        wait_state(c, "cal", "login_required")
        with pytest.raises(AuthRequiredError) as refused:
            c.call_tool("cal", "whoami", {})
        assert refused.value.reason == "login_required"
        assert c.test_server("cal").outcome == "login_required"

        started = c.auth_login("cal")
        assert started.redirect_uri == "http://127.0.0.1:33418/callback"
        assert "code_challenge_method=S256" in started.authorization_url
        assert "resource=" in started.authorization_url
        assert "scope=mcp" in started.authorization_url
        done = c.auth_complete("cal", browser(started.authorization_url))
        assert done.auth.state == "ok"
        assert done.auth.scope == "mcp"
        d.wait_ready("cal")
        result = c.call_tool("cal", "whoami", {})
        assert result.content[0]["text"] == "authorized"
        assert c.test_server("cal").outcome == "ok"
        status = c.server_status("cal")[0]
        assert status.auth is not None
        assert status.auth.expires_at is not None
    assert world.grants == ["register", "authorization_code"]
    assert world.resources == [url]  # RFC 8707: the resource on the token request


def test_pre_registered_client_uses_basic_auth(base: str) -> None:
    world = TestAuthorizationServer()
    world.preregister("http://127.0.0.1:33418/callback")
    with serve_protected(world) as url, DaemonHarness.running(daemon_config(base)) as d:
        spec = oauth_spec(
            url, oauth_client_id=PRE_CLIENT_ID, oauth_client_secret=PRE_CLIENT_SECRET
        )
        with d.client() as c:
            added = c.add_server(spec)
            assert added.oauth_client_id == PRE_CLIENT_ID
            started = c.auth_login("cal")
            assert f"client_id={PRE_CLIENT_ID}" in started.authorization_url
            c.auth_complete("cal", browser(started.authorization_url))
            d.wait_ready("cal")
            assert c.call_tool("cal", "whoami", {}).is_error is False
    assert world.grants == ["authorization_code"]  # no registration


def test_state_is_single_use_and_must_match(base: str) -> None:
    world = TestAuthorizationServer()
    with world_and_daemon(world, base) as (url, _d, c):
        c.add_server(oauth_spec(url))
        started = c.auth_login("cal")
        callback = browser(started.authorization_url)
        forged = callback.replace("state=", "state=x")
        with pytest.raises(LoginError) as wrong:
            c.auth_complete("cal", forged)
        assert wrong.value.reason == "invalid_state"
        c.auth_complete("cal", callback)
        with pytest.raises(LoginError) as replayed:
            c.auth_complete("cal", callback)
        assert replayed.value.reason == "invalid_state"

        started = c.auth_login("cal")
        mixed_up = (
            browser(started.authorization_url) + "&iss=https%3A%2F%2Fevil.example"
        )
        with pytest.raises(LoginError) as mixup:
            c.auth_complete("cal", mixed_up)
        assert mixup.value.reason == "invalid_state"
        assert "iss" in mixup.value.message
    assert world.count("authorization_code") == 1


def test_login_on_a_server_without_oauth_is_invalid(base: str) -> None:
    with DaemonHarness.running(daemon_config(base)) as d, d.client() as c:
        c.add_server(
            m.ServerSpec(
                name="plain",
                transport="streamable_http",
                url="http://127.0.0.1:9/mcp",
                allow_private_network=True,
            )
        )
        with pytest.raises(InvalidParamsError, match="does not use OAuth") as login:
            c.auth_login("plain")
        with pytest.raises(InvalidParamsError, match="does not use OAuth") as logout:
            c.auth_logout("plain")
    # the CLI's way too, not only the config file's (auth = "oauth")
    for refused in (login, logout):
        assert "`memorizzctl mcp add plain --url URL --oauth` (a server of" in (
            refused.value.message
        )


def test_twenty_callers_on_an_expired_token_cause_one_refresh(base: str) -> None:
    world = TestAuthorizationServer(access_ttl=3600)
    with world_and_daemon(world, base) as (url, d, c):
        c.add_server(oauth_spec(url))
        login(c, "cal")
        d.wait_ready("cal")
        keeper = d.daemon.pool.get("cal").keeper
        assert keeper is not None
        assert keeper.grant is not None
        # The access token expires at the server and in the daemon's view.
        world.expire_access_tokens()
        grant = keeper.grant
        keeper.grant = msgspec.structs.replace(grant, expires_at=grant.obtained_at)
        errors: list[BaseException] = []

        def caller() -> None:
            try:
                with d.client() as c2:
                    result = c2.call_tool("cal", "echo", {"text": "x"})
                    assert result.is_error is False
            except BaseException as exc:  # noqa: BLE001 - collected for the assert
                errors.append(exc)

        threads = [threading.Thread(target=caller) for _ in range(20)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert errors == []
    assert world.count("refresh_token") == 1


def test_refresh_ahead_of_expiry_without_callers(base: str) -> None:
    world = TestAuthorizationServer(access_ttl=3)  # margin 1.5 s: refresh at ~1.5 s
    with world_and_daemon(world, base) as (url, d, c):
        c.add_server(oauth_spec(url))
        login(c, "cal")

        def refreshed_twice() -> bool:
            auth = c.server_status("cal")[0].auth
            assert auth is not None
            return auth.refreshes >= 2

        wait_until(refreshed_twice, what="two refreshes")
        assert world.count("refresh_token") >= 2
        auth = c.server_status("cal")[0].auth
        assert auth is not None
        assert auth.last_refresh is not None
        d.wait_ready("cal")
        assert c.call_tool("cal", "whoami", {}).is_error is False


def test_invalid_grant_means_login_required_without_a_loop(base: str) -> None:
    world = TestAuthorizationServer()
    with world_and_daemon(world, base) as (url, d, c):
        c.add_server(oauth_spec(url))
        login(c, "cal")
        d.wait_ready("cal")
        world.refuse_refresh = True
        world.expire_access_tokens()  # the next call gets a 401
        with pytest.raises(AuthRequiredError):
            c.call_tool("cal", "whoami", {})
        wait_state(c, "cal", "login_required")
        for _ in range(5):
            with pytest.raises(AuthRequiredError) as refused:
                c.call_tool("cal", "whoami", {})
            assert refused.value.reason == "login_required"
        status = c.server_status("cal")[0]
        assert status.auth is not None
        assert status.auth.state == "login_required"
        assert c.test_server("cal").outcome == "login_required"
        refreshes = world.count("refresh_token")
        assert refreshes == 1
        # and a new login brings it back
        world.refuse_refresh = False
        login(c, "cal")
        d.wait_ready("cal")
        assert c.call_tool("cal", "whoami", {}).is_error is False
    assert world.count("refresh_token") == 1


def test_logout_revokes_and_forgets(base: str) -> None:
    world = TestAuthorizationServer()
    with world_and_daemon(world, base) as (url, d, c):
        c.add_server(oauth_spec(url))
        login(c, "cal")
        d.wait_ready("cal")
        result = c.auth_logout("cal")
        assert result.revocation == "revoked", result.message
        assert sorted(world.revoked) == ["AccessToken", "RefreshToken"]
        with pytest.raises(AuthRequiredError) as refused:
            c.call_tool("cal", "whoami", {})
        assert refused.value.reason == "login_required"
        keeper = d.daemon.pool.get("cal").keeper
        assert keeper is not None
        assert keeper.grant is None


def test_rotation_and_expiry_survive_a_restart(base: str) -> None:
    world = TestAuthorizationServer(access_ttl=3600)
    with serve_protected(world) as url:
        with daemon_process(base) as d, d.client() as c:
            c.add_server(oauth_spec(url))
            login(c, "cal")
            d.wait_ready("cal")
            assert c.call_tool("cal", "whoami", {}).is_error is False
        # no needless login or refresh after a restart with a live token
        with daemon_process(base) as d:
            d.wait_ready("cal")
            with d.client() as c:
                assert c.call_tool("cal", "whoami", {}).is_error is False
            assert world.grants == ["register", "authorization_code"]
            # The token expires while the daemon is down...
            d.stop()
        world.expire_access_tokens()
        with daemon_process(base) as d:
            # ...the 401 at connect makes the daemon refresh, without a login
            d.wait_ready("cal")
            with d.client() as c:
                assert c.call_tool("cal", "whoami", {}).is_error is False
            d.stop()
        # the rotated refresh token was stored: the next restart refreshes again
        world.expire_access_tokens()
        with daemon_process(base) as d:
            d.wait_ready("cal")
            with d.client() as c:
                assert c.call_tool("cal", "whoami", {}).is_error is False
                c.remove_server("cal")  # its session ends in order, keeper and all
            log = d.log()
    assert "did not end in order" not in log
    assert world.grants == [
        "register",
        "authorization_code",
        "refresh_token",
        "refresh_token",
    ]
    for token in [*world.access, *world.refresh]:
        assert token not in log


def test_memorizzctl_login_through_the_loopback_listener(base: str) -> None:
    world = TestAuthorizationServer()
    with serve_protected(world) as url, DaemonHarness.running(daemon_config(base)) as d:
        port = _free_port()
        redirect = f"http://127.0.0.1:{port}/callback"
        with d.client() as c:
            c.add_server(oauth_spec(url, oauth_redirect_uri=redirect))
        ctl, authorization_url = start_login(d.socket, "cal")
        callback = browser(authorization_url)
        assert callback.startswith(redirect)
        wait_until(lambda: _listening(port), what="the callback listener")
        import urllib.request

        with urllib.request.urlopen(callback, timeout=10) as page:  # noqa: S310 - loopback
            assert b"close this tab" in page.read()
        out, err = ctl.communicate(timeout=30)
        assert ctl.returncode == 0, err
        assert "logged in to cal" in out
        d.wait_ready("cal")
    assert world.grants == ["register", "authorization_code"]


def test_memorizzctl_login_by_paste(base: str) -> None:
    world = TestAuthorizationServer()
    with world_and_daemon(world, base) as (url, d, c):
        c.add_server(oauth_spec(url))
        ctl, authorization_url = start_login(d.socket, "cal", "--no-listen")
        assert ctl.stdin is not None
        ctl.stdin.write("not a url\n" + browser(authorization_url) + "\n")
        ctl.stdin.flush()
        out, err = ctl.communicate(timeout=30)
        assert ctl.returncode == 0, err
        assert "logged in to cal" in out
        assert "code=" not in out + err.split("paste", 1)[-1]


def test_no_token_in_outputs_or_files(base: str) -> None:
    world = TestAuthorizationServer()
    world.preregister("http://127.0.0.1:33418/callback")
    with serve_protected(world) as url, daemon_process(base) as d:
        with d.client() as c:
            c.add_server(
                oauth_spec(
                    url,
                    oauth_client_id=PRE_CLIENT_ID,
                    oauth_client_secret=PRE_CLIENT_SECRET,
                )
            )
            login(c, "cal")
            d.wait_ready("cal")
            c.call_tool("cal", "whoami", {})
            seen = [
                repr(c.list_servers()),
                repr(c.server_status()),
                repr(c.audit()),
            ]
        for argv in (["mcp", "list"], ["mcp", "status"], ["audit"]):
            run = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "memorizz.cli",
                    "--socket",
                    d.socket,
                    "--json",
                    *argv,
                ],
                capture_output=True,
                text=True,
                check=True,
            )
            seen.append(run.stdout + run.stderr)
        d.stop()
        seen.append(d.log())
        seen.extend(
            path.read_bytes().decode("latin-1")
            for path in Path(base, "state").iterdir()
        )
    secrets = [*world.access, *world.refresh, PRE_CLIENT_SECRET]
    assert len(secrets) == 3
    for text in seen:
        for secret in secrets:
            assert secret not in text


def start_login(
    socket_path: str, server: str, *flags: str
) -> tuple[subprocess.Popen[str], str]:
    """``memorizzctl mcp login`` as an operator runs it; returns the process
    and the authorization URL it printed."""
    ctl = subprocess.Popen(
        [sys.executable, "-m", "memorizz.cli", "--socket", socket_path,
         "mcp", "login", server, *flags],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    assert ctl.stderr is not None
    line = ""
    while not line.strip().startswith("http"):
        line = ctl.stderr.readline()
        assert line, "memorizzctl printed no URL"
    return ctl, line.strip()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _listening(port: int) -> bool:
    import socket

    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_a_token_that_expired_while_the_daemon_was_down_is_refreshed(
    base: str,
) -> None:
    world = TestAuthorizationServer(access_ttl=2)
    with serve_protected(world) as url:
        with daemon_process(base) as d:
            with d.client() as c:
                c.add_server(oauth_spec(url))
                login(c, "cal")
            d.wait_ready("cal")
            d.stop()
        before = world.count("refresh_token")
        threading.Event().wait(2.5)  # the stored expiry (wall clock) passes
        with daemon_process(base) as d:
            d.wait_ready("cal")
            with d.client() as c:
                assert c.call_tool("cal", "whoami", {}).is_error is False
                auth = c.server_status("cal")[0].auth
            assert auth is not None
            assert auth.state == "ok"
    assert world.count("authorization_code") == 1  # no new login
    assert world.count("refresh_token") > before


def test_removing_a_server_revokes_its_grant(base: str) -> None:
    world = TestAuthorizationServer()
    with world_and_daemon(world, base) as (url, d, c):
        c.add_server(oauth_spec(url))
        login(c, "cal")
        d.wait_ready("cal")
        c.remove_server("cal")
        assert sorted(world.revoked) == ["AccessToken", "RefreshToken"]
        assert world.access == {}


def test_a_pending_login_expires_and_is_single_use() -> None:
    from types import SimpleNamespace
    from typing import cast

    from memorizzd.oauth.login import Logins, PendingLogin

    def pending(server: str, state: str, ttl: float) -> PendingLogin:
        fields = {"server": server, "state": state, "expires": time.monotonic() + ttl}
        return cast(PendingLogin, SimpleNamespace(**fields))

    logins = Logins(ttl_s=600)
    logins.add(pending("cal", "s-old", 0.0))  # already expired
    logins.add(pending("mail", "s-mail", 600))
    with pytest.raises(LoginError) as expired:
        logins.take("cal", "s-old")
    assert expired.value.reason == "invalid_state"
    with pytest.raises(LoginError):
        logins.take("cal", "s-mail")  # another server's login
    assert logins.take("mail", "s-mail").state == "s-mail"
    with pytest.raises(LoginError):
        logins.take("mail", "s-mail")  # single use
    logins.add(pending("cal", "s-1", 600))
    logins.add(pending("cal", "s-2", 600))  # replaces the first
    with pytest.raises(LoginError):
        logins.take("cal", "s-1")
    assert logins.take("cal", "s-2").state == "s-2"


def _call_admin_concurrently(d: DaemonHarness, callers: int) -> list[BaseException]:
    """``callers`` connections call ``admin`` at once; what each one got."""
    got: list[BaseException] = []
    start = threading.Barrier(callers)

    def caller() -> None:
        with d.client() as c2:
            start.wait()
            try:
                c2.call_tool("cal", "admin", {})
            except BaseException as exc:  # noqa: BLE001 - collected for the assert
                got.append(exc)

    threads = [threading.Thread(target=caller) for _ in range(callers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return got


def _insufficient_scope(errors: list[BaseException]) -> bool:
    return all(
        isinstance(e, AuthRequiredError)
        and e.reason == "insufficient_scope"
        and e.data == {"server": "cal", "scope": ADMIN_SCOPE}
        for e in errors
    )


def test_step_up_under_load_asks_the_operator_never_widens_silently(
    base: str,
) -> None:
    """SECURITY.md §6.2 #27: a 403 insufficient_scope while 30 calls are in
    flight: every call gets a clear error, nothing is refreshed or widened
    behind the operator's back, and one step-up login grants the scope."""
    world = TestAuthorizationServer()
    with world_and_daemon(world, base) as (url, d, c):
        c.add_server(oauth_spec(url))
        login(c, "cal")
        d.wait_ready("cal")
        grants = list(world.grants)

        errors = _call_admin_concurrently(d, 30)
        assert len(errors) == 30
        assert _insufficient_scope(errors)
        assert world.scope_refusals == 30  # each call sent once, none retried
        assert world.grants == grants  # no refresh, no login: no loop, no widening
        status = c.server_status("cal")[0]
        assert status.state == "ready"
        assert status.auth is not None
        assert status.auth.scope == "mcp"  # unchanged until the operator says so
        assert c.call_tool("cal", "whoami", {}).is_error is False  # the rest works

        started = c.auth_login("cal")  # the step-up: asks for what was refused
        assert started.scope == ADMIN_SCOPE
        done = c.auth_complete("cal", browser(started.authorization_url))
        assert done.auth.scope == ADMIN_SCOPE
        d.wait_ready("cal")
        assert c.call_tool("cal", "admin", {}).content[0]["text"] == "admin done"
    assert world.grants == [*grants, "authorization_code"]


def test_step_up_logins_are_bounded_when_the_server_keeps_refusing(
    base: str,
) -> None:
    """The authorization server never grants ``admin``: two step-up logins
    for that scope set are asked for, never a third; calls under load keep
    getting a clear error in between, and nothing loops."""
    world = TestAuthorizationServer()
    world.grantable = {"mcp"}
    with world_and_daemon(world, base) as (url, d, c):
        c.add_server(oauth_spec(url))
        login(c, "cal")
        d.wait_ready("cal")
        for _ in range(2):
            assert _insufficient_scope(_call_admin_concurrently(d, 10))
            started = c.auth_login("cal")
            assert started.scope == ADMIN_SCOPE
            done = c.auth_complete("cal", browser(started.authorization_url))
            assert done.auth.scope == "mcp"  # the server said no to admin
            d.wait_ready("cal")
        assert _insufficient_scope(_call_admin_concurrently(d, 10))
        with pytest.raises(LoginError, match="still refuses after 2 logins"):
            c.auth_login("cal")
        assert c.call_tool("cal", "whoami", {}).is_error is False
        status = c.server_status("cal")[0]
    assert world.scope_refusals == 30
    assert world.count("authorization_code") == 3  # the first login and two step-ups
    assert world.count("refresh_token") == 0
    assert status.auth is not None
    assert status.auth.scope == "mcp"
