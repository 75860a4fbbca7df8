"""The OAuth client against the client checklist of SECURITY.md §1 (MCP
authorization: discovery, registration, the authorization and token requests,
token use) and §3 (RFC 9700: refresh, storage): the items no other test held,
each through the real daemon against the real local authorization server of
``tests/oauth_world.py`` and its misbehaviour switches. Only the clock is ever
replaced (the keeper's, at the edge of the world); every request is counted
where it arrives, at the authorization server.

The item each test holds is named in its docstring (D1..D8, R1..R5, A1..A8,
T1..T7 of §1; §3.2, §3.3).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

import msgspec
import pytest

from memorizz.api.errors import (
    AuthRequiredError,
    InvalidParamsError,
    LoginError,
    RemoteError,
)
from memorizz.client import Client
from memorizzd.oauth.keeper import CALLER_RETRY_GAP_S, TokenKeeper
from memorizzd.oauth.login import DEFAULT_REDIRECT_URI
from tests.daemon.test_oauth import login, oauth_spec, wait_state
from tests.daemon.test_oauth_lifecycle import echo, expire, logged_in
from tests.harness import DaemonHarness, daemon_config, daemon_process
from tests.oauth_world import (
    ADMIN_SCOPE,
    AS_PATH,
    OIDC_PATH,
    PRE_CLIENT_ID,
    PRE_CLIENT_SECRET,
    PRM_PATH,
    PRM_ROOT,
    TestAuthorizationServer,
    browser,
    serve_protected,
)

UNRESERVED = frozenset(
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~"
)
"""RFC 7636 §4.1: the characters of a code verifier."""
SECRET_FIELDS = frozenset(
    {"code", "code_verifier", "refresh_token", "client_secret", "token"}
)


@contextlib.contextmanager
def with_cal(
    world: TestAuthorizationServer, base: str, **spec: Any
) -> Iterator[tuple[str, DaemonHarness, Client]]:
    """The world, the daemon and ``cal`` added (not logged in)."""
    with (
        serve_protected(world) as url,
        DaemonHarness.running(daemon_config(base)) as d,
        d.client() as c,
    ):
        c.add_server(oauth_spec(url, **spec))
        yield url, d, c


def keeper_of(d: DaemonHarness, name: str = "cal") -> TokenKeeper:
    keeper = d.daemon.pool.get(name).keeper
    assert keeper is not None
    return keeper


def s256(verifier: str) -> str:
    digest = hashlib.sha256(verifier.encode("ascii")).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def query_of(url: str) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(urlsplit(url).query).items()}


def error_callback(c: Client, error: str, iss: str) -> LoginError:
    """A login to ``cal`` started, then completed by an error response:
    ``error`` (the query's error parameters), its state and ``iss``; how the
    completion failed."""
    started = c.auth_login("cal")
    state = query_of(started.authorization_url)["state"]
    callback = f"{started.redirect_uri}?{error}&state={state}&iss={quote(iss, safe='')}"
    with pytest.raises(LoginError) as failed:
        c.auth_complete("cal", callback)
    return failed.value


def discovery_gets(world: TestAuthorizationServer) -> list[str]:
    """The metadata documents asked for, in order."""
    return [
        r.removeprefix("GET ")
        for r in world.seen
        if r.startswith("GET ") and ("/.well-known/" in r or "/meta/" in r)
    ]


def secrets_of(world: TestAuthorizationServer) -> list[str]:
    """Every token the authorization server issued, every code, verifier and
    client secret that reached its token endpoint."""
    found = [*world.family, PRE_CLIENT_SECRET]
    for form in world.token_forms:
        found += [v for k, v in form.items() if k in SECRET_FIELDS]
    return found


# --- 1.3 A1 A3 A4 / 1.2 R4: PKCE, resource, the redirect URI, end to end ---------


def test_pkce_resource_and_the_exact_redirect_uri_through_the_whole_flow(
    base_dir: str,
) -> None:
    """A1: S256 always, the challenge is the verifier's SHA-256 (checked here,
    not by our code), the verifier never goes through the browser. A3: the
    ``resource`` is the canonical server URI on the authorization request,
    the code exchange and the refresh. A4 / R4: the loopback redirect URI is
    registered (``application_type`` native) and sent with its exact port;
    a login on another port registers that one, exactly."""
    world = TestAuthorizationServer()
    first = f"http://127.0.0.1:{free_port()}/callback"
    second = f"http://127.0.0.1:{free_port()}/callback"
    with with_cal(world, base_dir, oauth_redirect_uri=first) as (url, d, c):
        started = c.auth_login("cal")
        assert started.redirect_uri == first
        callback = browser(started.authorization_url)
        assert callback.startswith(first + "?")
        c.auth_complete("cal", callback)
        d.wait_ready("cal")
        expire(world, keeper_of(d))
        echo(c)  # after one refresh
        other = c.auth_login("cal", redirect_uri=second)
        callback = browser(other.authorization_url)
        assert callback.startswith(second + "?")
        assert c.auth_complete("cal", callback).auth.state == "ok"
    assert [body["redirect_uris"] for body in world.register_bodies] == [
        [first],
        [second],
    ]
    assert {body.get("application_type") for body in world.register_bodies} == {
        "native"
    }
    assert [f["grant_type"] for f in world.token_forms] == [
        "authorization_code",
        "refresh_token",
        "authorization_code",
    ]
    code_one, refresh, code_two = world.token_forms
    logins = zip(
        world.authorize_queries, (code_one, code_two), (first, second), strict=True
    )
    for query, form, redirect in logins:
        verifier = form["code_verifier"]
        assert 43 <= len(verifier) <= 128
        assert set(verifier) <= UNRESERVED
        assert query["code_challenge_method"] == "S256"
        assert query["code_challenge"] == s256(verifier)
        assert verifier not in msgspec.json.encode(query).decode()
        assert query["resource"] == form["resource"] == url
        assert query["redirect_uri"] == form["redirect_uri"] == redirect
        assert len(query["state"]) >= 43  # 256 bits
    assert refresh["resource"] == url
    assert "redirect_uri" not in refresh
    states = {q["state"] for q in world.authorize_queries}
    assert len(states) == 2


# --- 1.1 D2 D3 / 1.3 A7: the challenge, the metadata's places, the scope ----------


def test_the_challenges_resource_metadata_and_scope_are_honoured(
    base_dir: str,
) -> None:
    """D2 D3: ``resource_metadata`` of the 401 is the first place asked (the
    well-known URL, hidden here, is not needed). A7: the challenge's ``scope``
    wins over the metadata's ``scopes_supported``."""
    world = TestAuthorizationServer()
    with with_cal(world, base_dir) as (url, d, c):
        base = url.removesuffix("/mcp")
        world.challenge = (
            f'Bearer error="invalid_token", resource_metadata="{base}/meta/prm", '
            f'scope="{ADMIN_SCOPE}"'
        )
        world.documents["/meta/prm"] = {
            "resource": url,
            "authorization_servers": [world.issuer],
            "scopes_supported": ["mcp"],
        }
        world.hidden.add(PRM_PATH)
        started = c.auth_login("cal")
        assert started.scope == ADMIN_SCOPE
        done = c.auth_complete("cal", browser(started.authorization_url))
        assert done.auth.scope == ADMIN_SCOPE
        d.wait_ready("cal")
        assert c.call_tool("cal", "admin", {}).content[0]["text"] == "admin done"
    assert discovery_gets(world) == ["/meta/prm", AS_PATH]
    assert world.authorize_queries[0]["scope"] == ADMIN_SCOPE


@pytest.mark.parametrize("where", ["root", "wrong-resource-first"])
def test_resource_metadata_is_looked_for_in_order(base_dir: str, where: str) -> None:
    """D3: without ``resource_metadata`` in the challenge, the path-based
    well-known URL, then the root. D4: a document whose ``resource`` is not
    this server's is not used; the next place is asked."""
    world = TestAuthorizationServer()
    with with_cal(world, base_dir) as (url, d, c):
        base = url.removesuffix("/mcp")
        if where == "root":
            world.challenge = 'Bearer error="invalid_token"'
            world.hidden.add(PRM_PATH)
            world.aliases[PRM_ROOT] = PRM_PATH
            expected = [PRM_PATH, PRM_ROOT, AS_PATH]
        else:
            world.challenge = (
                f'Bearer error="invalid_token", resource_metadata="{base}/meta/prm"'
            )
            world.documents["/meta/prm"] = {
                "resource": f"{base}/elsewhere",
                "authorization_servers": ["https://as.elsewhere.test/"],
            }
            expected = ["/meta/prm", PRM_PATH, AS_PATH]
        started = c.auth_login("cal")
        c.auth_complete("cal", browser(started.authorization_url))
        d.wait_ready("cal")
        echo(c)
    assert discovery_gets(world) == expected
    assert world.authorize_queries[0]["resource"] == url


def test_openid_configuration_is_the_fallback_and_checked_the_same(
    base_dir: str,
) -> None:
    """D5: no RFC 8414 document: OpenID Connect discovery, after it. D6 and
    A2 hold there too: an ``issuer`` that is not the one asked for, or no
    ``S256``, and no login starts (no registration)."""
    world = TestAuthorizationServer()
    world.hidden.add(AS_PATH)
    world.aliases[OIDC_PATH] = AS_PATH
    with with_cal(world, base_dir) as (_url, d, c):
        world.metadata_edit = lambda doc: {**doc, "issuer": world.issuer + "other"}
        with pytest.raises(LoginError, match="names issuer"):
            c.auth_login("cal")
        world.metadata_edit = lambda doc: {
            k: v for k, v in doc.items() if k != "code_challenge_methods_supported"
        }
        with pytest.raises(LoginError, match="PKCE S256"):
            c.auth_login("cal")
        assert world.register_bodies == []
        world.metadata_edit = None
        login(c, "cal")
        d.wait_ready("cal")
        echo(c)
    assert discovery_gets(world)[-3:] == [PRM_PATH, AS_PATH, OIDC_PATH]


def test_an_issuer_with_a_path_is_looked_up_in_the_specified_order(
    base_dir: str,
) -> None:
    """D5 (MCP 2025-11-25): an issuer with a path: RFC 8414's
    ``/.well-known/oauth-authorization-server/<path>``, then OpenID Connect's
    ``/.well-known/openid-configuration/<path>`` and ``<path>/.well-known/
    openid-configuration``, the last one answering here; its ``issuer`` is the
    one with the path, and the login goes through."""
    world = TestAuthorizationServer()
    with with_cal(world, base_dir) as (_url, d, c):
        issuer = world.issuer + "tenant"
        world.prm_edit = lambda doc: {**doc, "authorization_servers": [issuer]}
        world.aliases["/tenant" + OIDC_PATH] = AS_PATH
        world.metadata_edit = lambda doc: {**doc, "issuer": issuer}
        started = c.auth_login("cal")
        assert started.issuer == issuer
        c.auth_complete("cal", browser(started.authorization_url))
        d.wait_ready("cal")
        echo(c)
    assert discovery_gets(world) == [
        PRM_PATH,
        AS_PATH + "/tenant",
        OIDC_PATH + "/tenant",
        "/tenant" + OIDC_PATH,
    ]


def test_no_scope_is_asked_when_neither_challenge_nor_resource_names_one(
    base_dir: str,
) -> None:
    """A7 (and §1.5 scope minimisation): no ``scope`` in the challenge, no
    ``scopes_supported`` in the protected resource metadata: the scope
    parameter is omitted, not filled with everything the authorization server
    lists (``mcp admin`` here)."""
    world = TestAuthorizationServer()
    world.prm_edit = lambda doc: {
        k: v for k, v in doc.items() if k != "scopes_supported"
    }
    with with_cal(world, base_dir) as (_url, _d, c):
        started = c.auth_login("cal")
        assert started.scope is None
        assert "scope" not in query_of(started.authorization_url)


# --- 1.3 A5 A6: state and iss ------------------------------------------------------


def test_an_error_response_naming_another_issuer_is_a_mix_up(base_dir: str) -> None:
    """A6 (RFC 9207 §2.4): an error response is checked for ``iss`` too; one
    from another issuer is refused as a mix-up, not reported as the
    authorization server's refusal. The same error with the right ``iss`` is
    the server's word, and says so."""
    world = TestAuthorizationServer()
    with with_cal(world, base_dir) as (_url, _d, c):
        refused = error_callback(
            c, "error=access_denied&error_description=go+away", "https://evil.example"
        )
        assert refused.reason == "invalid_state"
        assert "iss" in refused.message
        assert "access_denied" not in refused.message
        denied = error_callback(c, "error=access_denied", world.issuer)
        assert denied.reason == "login_failed"
        assert "refused the login: access_denied" in denied.message
    assert world.token_posts == []


def test_state_is_bound_to_its_own_servers_login(base_dir: str) -> None:
    """A5: two logins pending at once: each callback completes only its own
    server's login (the other's is refused and stays pending), once."""
    world = TestAuthorizationServer()
    with with_cal(world, base_dir) as (url, _d, c):
        c.add_server(oauth_spec(url, name="mail"))
        cal_callback = browser(c.auth_login("cal").authorization_url)
        mail_callback = browser(c.auth_login("mail").authorization_url)
        for server, callback in (("cal", mail_callback), ("mail", cal_callback)):
            with pytest.raises(LoginError) as refused:
                c.auth_complete(server, callback)
            assert refused.value.reason == "invalid_state"
        assert world.token_posts == []
        assert c.auth_complete("mail", mail_callback).auth.state == "ok"
        assert c.auth_complete("cal", cal_callback).auth.state == "ok"
        with pytest.raises(LoginError) as replayed:
            c.auth_complete("cal", cal_callback)
        assert replayed.value.reason == "invalid_state"
    assert world.token_posts == ["authorization_code", "authorization_code"]


# --- 1.1 D8 / 1.3 A4 / 1.2 R2: what a redirect URI and a client document may be ---


@pytest.mark.parametrize(
    "redirect",
    [
        "http://example.com/callback",
        "http://192.168.1.5:8080/callback",
        "http://127.0.0.1.evil.test/callback",
        "http://localhost@evil.test/callback",
        "http://127.0.0.1:8080/callback#x",
        "ftp://127.0.0.1/callback",
        "javascript:alert(1)",
    ],
)
def test_a_redirect_uri_is_loopback_http_or_https_only(
    daemon: DaemonHarness, redirect: str
) -> None:
    """D8 A4: neither a spec nor one login may take a redirect URI that is
    plain http off loopback, has a fragment, or another scheme; nothing is
    asked of the network."""
    url = "http://127.0.0.1:9/mcp"  # never reached
    with daemon.client() as c:
        with pytest.raises(InvalidParamsError, match="oauth_redirect_uri"):
            c.add_server(oauth_spec(url, oauth_redirect_uri=redirect))
        c.add_server(oauth_spec(url))
        with pytest.raises(InvalidParamsError, match="oauth_redirect_uri"):
            c.auth_login("cal", redirect_uri=redirect)
        c.add_server(oauth_spec(url, name="v6", oauth_redirect_uri="http://[::1]:9/cb"))


@pytest.mark.parametrize(
    "document",
    [
        "http://client.example.test/memorizzd.json",
        "https://client.example.test/",
        "https://client.example.test",
        "https://client.example.test/doc#x",
    ],
)
def test_a_client_metadata_document_url_is_https_with_a_path(
    daemon: DaemonHarness, document: str
) -> None:
    """R2: a client ID metadata document's URL (the client_id itself) must be
    https with a path, no fragment."""
    with daemon.client() as c, pytest.raises(InvalidParamsError, match="https"):
        c.add_server(
            oauth_spec("http://127.0.0.1:9/mcp", oauth_client_metadata_url=document)
        )


# --- 1.2 R1 R2: client identity ----------------------------------------------------


def test_client_identity_pre_registered_then_metadata_document_then_registration(
    base_dir: str,
) -> None:
    """R1: a pre-registered client wins; else a client ID metadata document
    where the authorization server takes them (R2: its URL is the client_id,
    nothing is registered); else dynamic registration."""
    world = TestAuthorizationServer()
    document = "https://client.example.test/memorizzd.json"
    world.metadata_edit = lambda doc: {
        **doc,
        "client_id_metadata_document_supported": True,
    }
    with with_cal(
        world,
        base_dir,
        oauth_client_id=PRE_CLIENT_ID,
        oauth_client_metadata_url=document,
    ) as (url, _d, c):
        c.add_server(oauth_spec(url, name="doc", oauth_client_metadata_url=document))
        c.add_server(oauth_spec(url, name="dyn"))
        ids = {
            name: query_of(c.auth_login(name).authorization_url)["client_id"]
            for name in ("cal", "doc", "dyn")
        }
        assert world.count("register") == 1  # dyn's
        world.metadata_edit = None  # the server no longer takes documents
        ids["doc-later"] = query_of(c.auth_login("doc").authorization_url)["client_id"]
    assert ids["cal"] == PRE_CLIENT_ID
    assert ids["doc"] == document
    registered = [cid for cid in world.clients if cid != PRE_CLIENT_ID]
    assert sorted(registered) == sorted([ids["dyn"], ids["doc-later"]])
    assert world.count("register") == 2


# --- 1.4 T1 T2 T3 T4 / 1.2 R5 / 1.1 D7: whose token goes where -------------------


def test_each_servers_token_goes_in_the_header_to_that_server_only(
    base_dir: str,
) -> None:
    """T1: every MCP request after the login carries ``Authorization: Bearer``,
    never a token in the query. T4: two servers, two authorization servers:
    neither ever sees the other's token, refreshed ones included. T7: every
    request after ``initialize`` carries ``MCP-Protocol-Version``."""
    worlds = {"cal": TestAuthorizationServer(), "mail": TestAuthorizationServer()}
    with (
        serve_protected(worlds["cal"]) as cal_url,
        serve_protected(worlds["mail"]) as mail_url,
        DaemonHarness.running(daemon_config(base_dir)) as d,
        d.client() as c,
    ):
        c.add_server(oauth_spec(cal_url))
        c.add_server(oauth_spec(mail_url, name="mail"))
        for name in worlds:
            login(c, name)
            d.wait_ready(name)
        for _ in range(3):  # the login's token, then two refreshed ones
            for name, world in worlds.items():
                assert not c.call_tool(name, "echo", {"text": "x"}).is_error
                expire(world, keeper_of(d, name))
    for name, world in worlds.items():
        other = worlds["mail" if name == "cal" else "cal"]
        authorized = [i for i, r in enumerate(world.mcp_requests) if r[2]]
        assert authorized
        # only the challenge probe (before the login) went without a token
        assert all(r[2] for r in world.mcp_requests[authorized[0] :])
        sent = set()
        for _method, query, authorization, _v in world.mcp_requests[authorized[0] :]:
            assert authorization.startswith("Bearer ")
            sent.add(authorization.removeprefix("Bearer "))
            assert "token" not in query
        after_initialize = world.mcp_requests[authorized[0] + 1 :]
        assert after_initialize
        versions = {version for *_, version in after_initialize}
        assert len(versions) == 1  # the one negotiated, on every request
        assert versions != {""}
        assert sent <= set(world.family)  # issued by its own server
        assert not sent & set(other.family)
        assert len(sent) == 3
        assert world.token_posts.count("refresh_token") == 2


def test_a_grant_is_never_sent_to_a_server_url_it_was_not_issued_for(
    base_dir: str,
) -> None:
    """T2 T3: the operator points ``cal`` at another server (its config file
    changed, same name): the grant for the old one is not sent there, nor
    refreshed for it; the server needs a login. R5 D7: that login registers a
    client of its own at the new authorization server; the old client's id
    never reaches it."""
    old, new = TestAuthorizationServer(), TestAuthorizationServer()
    with serve_protected(old) as old_url, serve_protected(new) as new_url:
        config = daemon_config(base_dir, servers=[oauth_spec(old_url)])
        with DaemonHarness.running(config) as d, d.client() as c:
            login(c, "cal")
            d.wait_ready("cal")
            echo(c)
            grant = keeper_of(d).grant
            assert grant is not None
            old_client = grant.client_id
        moved = daemon_config(base_dir, servers=[oauth_spec(new_url)])
        with DaemonHarness.running(moved) as d, d.client() as c:
            wait_state(c, "cal", "login_required")
            with pytest.raises(AuthRequiredError) as refused:
                echo(c)
            assert refused.value.reason == "login_required"
            assert "memorizzctl mcp login cal" in refused.value.message
            started = c.auth_login("cal")
            assert started.issuer == new.issuer
            assert c.auth_complete("cal", browser(started.authorization_url))
            d.wait_ready("cal")
            echo(c)
    sent_to_new = {r[2].removeprefix("Bearer ") for r in new.mcp_requests if r[2]}
    assert sent_to_new
    assert not sent_to_new & set(old.family)
    assert sent_to_new <= set(new.family)
    assert old.token_posts == ["authorization_code"]  # not refreshed for it either
    assert new.count("register") == 1
    assert all(q["client_id"] != old_client for q in new.authorize_queries)
    assert all(f["client_id"] != old_client for f in new.token_forms)


# --- 1.3 / 3.2: what a token endpoint may answer -----------------------------------


def refresh_answered(
    status: int, body: bytes
) -> Callable[[dict[str, str]], tuple[int, bytes] | None]:
    def reply(form: dict[str, str]) -> tuple[int, bytes] | None:
        if form.get("grant_type") != "refresh_token":
            return None
        return status, body

    return reply


def test_a_refresh_answered_200_with_invalid_grant_ends_in_login_required(
    base_dir: str,
) -> None:
    """§3.2: a token endpoint that answers a refresh with 200 and an error
    body (as some do) has said ``invalid_grant``: login required at once,
    one request, no loop."""
    world = TestAuthorizationServer()
    with logged_in(world, base_dir) as (_d, c, keeper):
        world.token_reply = refresh_answered(
            200, b'{"error":"invalid_grant","error_description":"grant revoked"}'
        )
        expire(world, keeper)
        with pytest.raises(AuthRequiredError) as refused:
            echo(c)
        assert refused.value.reason == "login_required"
        wait_state(c, "cal", "login_required")
        for _ in range(3):
            with pytest.raises(AuthRequiredError):
                echo(c)
        threading.Event().wait(2.5)  # a retry would have come by now
        auth = c.server_status("cal")[0].auth
        assert auth is not None
        assert "invalid_grant: grant revoked" in (auth.last_refresh_error or "")
    assert world.token_posts.count("refresh_token") == 1


def test_a_refresh_answered_with_a_page_fails_softly_then_recovers(
    base_dir: str,
) -> None:
    """§3.2: a 200 that is not JSON (a proxy's page) is a passing failure:
    the call is told so without the page's text, the grant stays, and the
    next call's refresh works with the same (unspent) refresh token."""
    world = TestAuthorizationServer()
    with logged_in(world, base_dir) as (_d, c, keeper):
        world.token_reply = refresh_answered(200, b"<html>proxy page marker</html>")
        expire(world, keeper)
        with pytest.raises(RemoteError) as failed:
            echo(c)
        assert failed.value.reason == "server_unavailable"
        assert "not a token response" in failed.value.message
        assert "marker" not in failed.value.message
        assert keeper.state == "ok"
        world.token_reply = None
        # Calls within CALLER_RETRY_GAP_S of the failure do not drive a refresh.
        threading.Event().wait(CALLER_RETRY_GAP_S)
        echo(c)
    assert world.token_posts.count("refresh_token") == 2
    assert world.reuse_detected == 0


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (b'{"error":"invalid_grant","error_description":"code used"}', "invalid_grant"),
        (b"<html>marker</html>", "not a token response"),
        (b'{"access_token":"","token_type":"Bearer"}', "access token"),
        (b'{"access_token":"two words","token_type":"Bearer"}', "access token"),
    ],
    ids=["200-error", "200-page", "empty-token", "spaced-token"],
)
def test_a_code_exchange_answered_badly_installs_nothing(
    base_dir: str, body: bytes, said: str
) -> None:
    """1.3: a 200 with an error body, a page, an empty or malformed access
    token: the login fails with a clear reason (no code, no verifier in it)
    and no grant is installed."""
    world = TestAuthorizationServer()
    world.token_reply = lambda form: (200, body)
    with with_cal(world, base_dir) as (_url, _d, c):
        started = c.auth_login("cal")
        with pytest.raises(LoginError) as refused:
            c.auth_complete("cal", browser(started.authorization_url))
        assert said in refused.value.message
        assert "marker" not in refused.value.message
        for secret in secrets_of(world):
            assert secret not in refused.value.message
        auth = c.server_status("cal")[0].auth
        assert auth is not None
        assert auth.state == "logged_out"


HOUR, NONE, CAPPED = "hour", "none", "capped"


@pytest.mark.parametrize(
    ("expires_in", "expected"),
    [
        ("3600", HOUR),
        (None, NONE),
        ("0", NONE),
        ("-5", NONE),
        ("null", NONE),
        ('"3600"', HOUR),
        ("3600.5", HOUR),
        ('"an hour"', NONE),
        ('"-1"', NONE),
        ("true", NONE),
        ("1e30", CAPPED),
        ("1" + "0" * 400, CAPPED),
        ('"' + "9" * 40 + '"', CAPPED),
    ],
    ids=lambda v: str(v)[:12],
)
def test_any_expires_in_keeps_the_grant_and_its_rotated_refresh_token(
    base_dir: str, expires_in: str | None, expected: str
) -> None:
    """§3.2: ``expires_in`` missing, zero, negative, a string, fractional or
    too large for a float, on the code exchange and on refreshes that rotate:
    the token response is taken, the rotated refresh token kept and spent
    next (the server sees no reuse), the expiry sane (unknown, or capped)."""
    world = TestAuthorizationServer()

    def edit(_grant_type: str, answer: dict[str, Any]) -> bytes:
        answer.pop("expires_in", None)
        body = msgspec.json.encode(answer)
        if expires_in is None:
            return body
        return body[:-1] + b',"expires_in":' + expires_in.encode() + b"}"

    world.token_edit = edit

    def sane(at: float | None) -> bool:
        now = time.time()
        if expected == NONE:
            return at is None
        assert at is not None
        if expected == HOUR:
            return now + 3500 < at < now + 3700
        return now + 300 * 86400 < at < now + 367 * 86400

    with with_cal(world, base_dir) as (_url, d, c):
        done = login(c, "cal")
        assert done.auth.state == "ok"
        assert sane(done.auth.expires_at)
        d.wait_ready("cal")
        keeper = keeper_of(d)
        for _ in range(2):
            expire(world, keeper)
            echo(c)
        auth = c.server_status("cal")[0].auth
        assert auth is not None
        assert auth.state == "ok"
        assert sane(auth.expires_at)
    assert world.token_posts == ["authorization_code", "refresh_token", "refresh_token"]
    assert world.reuse_detected == 0


# --- 3.2: the clock-skew margin ------------------------------------------------------


@pytest.mark.parametrize(("ahead_s", "refreshes"), [(3000.0, 0), (3350.0, 1)])
def test_the_refresh_comes_within_the_margin_ahead_of_expiry_not_before(
    base_dir: str, ahead_s: float, refreshes: int
) -> None:
    """§3.2 #3: a token of an hour is refreshed when less than 5 minutes (the
    margin) are left on the keeper's clock, at once and once; with 10 minutes
    left, not yet (the margin plus its jitter is at most 8 minutes). The
    clock is the only thing replaced."""
    world = TestAuthorizationServer(access_ttl=3600)
    with with_cal(world, base_dir) as (_url, d, c):
        keeper_of(d)._clock = lambda: time.time() + ahead_s
        login(c, "cal")
        d.wait_ready("cal")
        threading.Event().wait(1.5)
        echo(c)
    assert world.token_posts.count("refresh_token") == refreshes


# --- 3.3: secrets never in an error, a reply, the log, the audit or a file -----------


def echoing(status: int) -> Callable[[dict[str, str]], tuple[int, bytes] | None]:
    """An endpoint that quotes the request's secrets back in its error."""

    def reply(form: dict[str, str]) -> tuple[int, bytes] | None:
        said = " ".join(v for k, v in form.items() if k in SECRET_FIELDS)
        first = next((v for k, v in form.items() if k in SECRET_FIELDS), "")
        error = first if status == 401 else "invalid_grant"
        body = {"error": error, "error_description": f"rejected: {said}"}
        return status, msgspec.json.encode(body)

    return reply


def test_secrets_quoted_back_by_the_authorization_server_go_no_further(
    base_dir: str,
) -> None:
    """§3.3 / §1.5: a refresh, a code exchange and a revocation refused with
    the request's refresh token, code, verifier, token and client secret
    quoted in the error: none of them reaches an error, a reply, the daemon's
    log (DEBUG), the audit trail or a state file."""
    world = TestAuthorizationServer()
    world.preregister(DEFAULT_REDIRECT_URI, method="client_secret_post")
    seen: list[str] = []
    with serve_protected(world) as url, daemon_process(base_dir) as d:
        with d.client() as c:
            c.add_server(
                oauth_spec(
                    url,
                    oauth_client_id=PRE_CLIENT_ID,
                    oauth_client_secret=PRE_CLIENT_SECRET,
                    oauth_token_endpoint_auth_method="client_secret_post",  # noqa: S106
                )
            )
            login(c, "cal")
            d.wait_ready("cal")
            echo(c)
            world.token_reply = echoing(400)
            world.expire_access_tokens()  # a 401, then the refresh
            with pytest.raises(AuthRequiredError) as refused:
                echo(c)
            seen.append(refused.value.message)
            wait_state(c, "cal", "login_required")
            seen.append(repr(c.server_status("cal")))
            started = c.auth_login("cal")
            with pytest.raises(LoginError) as failed:
                c.auth_complete("cal", browser(started.authorization_url))
            seen.append(failed.value.message)
            world.token_reply = None
            login(c, "cal")
            d.wait_ready("cal")
            world.revoke_reply = echoing(401)
            logout = c.auth_logout("cal")
            assert logout.revocation == "failed"
            seen += [logout.message, repr(c.server_status()), repr(c.audit())]
        for argv in (["mcp", "status"], ["audit"]):
            run = subprocess.run(
                [sys.executable, "-m", "memorizz.cli", "--socket", d.socket,
                 "--json", *argv],
                capture_output=True,
                text=True,
                check=True,
            )  # fmt: skip
            seen.append(run.stdout + run.stderr)
        d.stop()
        log = d.log()
        seen.append(log)
        seen.extend(
            path.read_bytes().decode("latin-1")
            for path in Path(base_dir, "state").iterdir()
            if path.is_file()
        )
    assert "rejected: " in seen[0] + seen[2]  # the server's words, cleaned
    assert "login required" in log
    forms = [f for f in world.token_forms if f["grant_type"] == "authorization_code"]
    assert len(forms) == 3  # the echoed one (recorded too) and two logins
    secrets = secrets_of(world)
    assert len(secrets) > 10
    for text in seen:
        for secret in secrets:
            assert secret not in text
