"""OAuth discovery refusals through the real daemon: a hostile or broken
protected resource / authorization server never gets a login started.

The server is ``https://mcp.example.test`` (an allowlisted public name, fake
DNS, verified TLS, dialled on loopback: ``egress_world``); its metadata
documents are whatever each test serves. The network tripwire and the
loopback-only dial make a refused address impossible to reach even if the
guard were broken.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from memorizz.api.errors import LoginError, PermissionDeniedError, RemoteError
from memorizz.api.methods import ServerSpec
from memorizzd.egress import client as egress_client
from tests.daemon.test_egress import ADDRESS_NOT_ALLOWED
from tests.egress_world import (
    PUBLIC_NAME,
    PUBLIC_V4,
    TLS,
    FakeDNS,
    LoopbackDial,
    World,
    serve,
    tls_material,
)
from tests.harness import (
    DaemonHarness,
    daemon_config,
    rmtree,
    short_tempdir,
    wait_until,
)

BASE = f"https://{PUBLIC_NAME}"
MCP_URL = f"{BASE}/mcp"
PRM_PATH = "/.well-known/oauth-protected-resource/mcp"
AS_PATH = "/.well-known/oauth-authorization-server"
OTHER_NAME = "other.example.test"
"""Another allowlisted name: a redirect target that must never be looked up."""


class Documents:
    """The fake server's answers, by path (tests set them), and every request
    it got: ``"<method> <path>"``, so a test can show what never arrived."""

    def __init__(self) -> None:
        self.docs: dict[str, Any] = {}
        self.redirects: dict[str, tuple[int, str]] = {}
        """``path -> (status, Location)``: answered instead of anything else."""
        self.posts: dict[str, Any] = {}
        """``path -> JSON``: the answer to a POST there (a token endpoint)."""
        self.challenge: str | None = None
        """The ``WWW-Authenticate`` value of the MCP endpoint's 401 (None: the
        usual one, naming ``PRM_PATH``); sent as UTF-8 bytes."""
        self.requests: list[str] = []

    def reset(self) -> None:
        self.docs.clear()
        self.posts.clear()
        self.redirects.clear()
        self.challenge = None
        self.requests.clear()

    def app(self) -> Starlette:
        async def mcp(request: Request) -> Response:
            self.requests.append(f"{request.method} {request.url.path}")
            header = self.challenge or (
                f'Bearer error="invalid_token", resource_metadata="{BASE}{PRM_PATH}"'
            )
            response = Response(status_code=401)
            response.raw_headers.append((b"www-authenticate", header.encode()))
            return response

        async def document(request: Request) -> Response:
            path = request.url.path
            self.requests.append(f"{request.method} {path}")
            if path in self.redirects:
                status, location = self.redirects[path]
                return Response(status_code=status, headers={"Location": location})
            answers = self.docs if request.method == "GET" else self.posts
            doc = answers.get(path)
            if doc is None:
                return Response(status_code=404)
            return JSONResponse(doc)

        return Starlette(
            routes=[
                Route("/mcp", mcp, methods=["POST", "GET"]),
                Route("/{path:path}", document, methods=["GET", "POST"]),
            ]
        )


@pytest.fixture(scope="module")
def tls() -> Iterator[TLS]:
    with tls_material() as material:
        yield material


@pytest.fixture(scope="module")
def documents(tls: TLS) -> Iterator[tuple[Documents, int]]:
    docs = Documents()
    with serve(docs.app(), tls, lifespan="off") as port:
        yield docs, port


def fake_world(tls: TLS, port: int) -> World:
    dns = FakeDNS(
        {
            PUBLIC_NAME: [PUBLIC_V4],
            OTHER_NAME: [PUBLIC_V4],  # would reach the same server if ever asked
            "metadata.example.test": ["169.254.169.254"],
            "private.example.test": ["10.0.0.1"],
        }
    )
    world = World(tls, dns, LoopbackDial())
    world.route(PUBLIC_V4, 443, port)
    return world


def oauth_daemon(base_dir: str) -> AbstractContextManager[DaemonHarness]:
    return DaemonHarness.running(
        daemon_config(base_dir, host_allowlist=["*.example.test"])
    )


def add_cal(daemon: DaemonHarness, **fields: Any) -> None:
    with daemon.client() as c:
        c.add_server(
            ServerSpec(
                name="cal",
                transport="streamable_http",
                url=MCP_URL,
                auth="oauth",
                **fields,
            )
        )


@pytest.fixture
def world(
    tls: TLS, documents: tuple[Documents, int], monkeypatch: pytest.MonkeyPatch
) -> World:
    world = fake_world(tls, documents[1])
    monkeypatch.setattr(egress_client, "DEFAULT_NETWORK", world.network())
    documents[0].reset()
    return world


@pytest.fixture
def daemon(base_dir: str, world: World) -> Iterator[DaemonHarness]:
    with oauth_daemon(base_dir) as harness:
        add_cal(harness)
        yield harness


def prm(**fields: Any) -> dict[str, Any]:
    return {"resource": MCP_URL, "authorization_servers": [BASE], **fields}


def as_metadata(**fields: Any) -> dict[str, Any]:
    doc = {
        "issuer": BASE,
        "authorization_endpoint": f"{BASE}/authorize",
        "token_endpoint": f"{BASE}/token",
        "registration_endpoint": f"{BASE}/register",
        "response_types_supported": ["code"],
        "code_challenge_methods_supported": ["S256"],
    }
    doc.update(fields)
    return {k: v for k, v in doc.items() if v is not None}


def login_error(daemon: DaemonHarness, documents: tuple[Documents, int]) -> LoginError:
    """The refusal of ``auth/login``; it came before anything was sent onwards
    (no registration: the only POST is the challenge probe)."""
    with daemon.client() as c, pytest.raises(LoginError) as refused:
        c.auth_login("cal")
    posts = {r for r in documents[0].requests if r.startswith("POST")}
    assert posts == {"POST /mcp"}
    return refused.value


def serve_docs(documents: tuple[Documents, int], docs: dict[str, Any]) -> None:
    documents[0].docs.update(docs)


def test_an_issuer_that_does_not_match_is_refused(
    daemon: DaemonHarness, documents: tuple[Documents, int]
) -> None:
    serve_docs(
        documents,
        {PRM_PATH: prm(), AS_PATH: as_metadata(issuer=f"{BASE}/someone-else")},
    )
    error = login_error(daemon, documents)
    assert "names issuer" in error.message
    assert "RFC 8414" in error.message


def test_an_authorization_server_without_pkce_s256_is_refused(
    daemon: DaemonHarness, documents: tuple[Documents, int]
) -> None:
    serve_docs(
        documents,
        {
            PRM_PATH: prm(),
            AS_PATH: as_metadata(code_challenge_methods_supported=["plain"]),
        },
    )
    assert "PKCE S256" in login_error(daemon, documents).message
    documents[0].docs[AS_PATH] = as_metadata(code_challenge_methods_supported=None)
    assert "PKCE S256" in login_error(daemon, documents).message


def test_resource_metadata_for_another_resource_is_refused(
    daemon: DaemonHarness, documents: tuple[Documents, int]
) -> None:
    serve_docs(
        documents,
        {
            PRM_PATH: prm(resource=f"{BASE}/elsewhere"),
            AS_PATH: as_metadata(),
        },
    )
    assert "not this server" in login_error(daemon, documents).message


def test_an_authorization_endpoint_that_is_not_https_is_refused(
    daemon: DaemonHarness, documents: tuple[Documents, int]
) -> None:
    serve_docs(
        documents,
        {
            PRM_PATH: prm(),
            AS_PATH: as_metadata(authorization_endpoint="http://login.example.test/a"),
        },
    )
    assert "not an https URL" in login_error(daemon, documents).message


def test_no_registration_and_no_client_id_says_what_to_do(
    daemon: DaemonHarness, documents: tuple[Documents, int]
) -> None:
    serve_docs(
        documents, {PRM_PATH: prm(), AS_PATH: as_metadata(registration_endpoint=None)}
    )
    assert "oauth_client_id" in login_error(daemon, documents).message


@pytest.mark.parametrize(
    ("issuer", "reason"),
    [
        ("https://metadata.example.test", "address_not_allowed"),
        ("https://private.example.test", "address_not_allowed"),
        ("https://as.elsewhere.test", "host_not_allowed"),
        ("http://as.example.test", "scheme_not_allowed"),
        ("http://10.0.0.1", "scheme_not_allowed"),
        ("https://10.0.0.1", "address_not_allowed"),
    ],
)
def test_the_egress_guard_covers_the_authorization_server(
    daemon: DaemonHarness,
    world: World,
    documents: tuple[Documents, int],
    issuer: str,
    reason: str,
) -> None:
    serve_docs(documents, {PRM_PATH: prm(authorization_servers=[issuer])})
    with daemon.client() as c, pytest.raises(PermissionDeniedError) as refused:
        c.auth_login("cal")
    assert refused.value.reason == reason
    assert documents[0].requests == ["POST /mcp", f"GET {PRM_PATH}"]
    assert set(world.dial.dialled) == {(PUBLIC_V4, 443)}  # ours only


def test_a_good_server_gets_a_login_url(
    daemon: DaemonHarness, documents: tuple[Documents, int]
) -> None:
    serve_docs(
        documents,
        {
            PRM_PATH: prm(scopes_supported=["calendar.read"]),
            AS_PATH: as_metadata(registration_endpoint=None),
        },
    )
    with daemon.client() as c:
        c.remove_server("cal")
    add_cal(daemon, oauth_client_id="pre-registered")
    with daemon.client() as c:
        started = c.auth_login("cal")
    url = started.authorization_url
    assert url.startswith(
        f"{BASE}/authorize?response_type=code&client_id=pre-registered"
    )
    assert "scope=calendar.read" in url
    assert "code_challenge_method=S256" in url
    assert "resource=https%3A%2F%2Fmcp.example.test%2Fmcp" in url
    assert started.issuer.rstrip("/") == BASE


# --- SECURITY.md §6.2 #18: the bypass table through discovery URLs ----------------


@pytest.fixture(scope="module")
def table_daemon(
    tls: TLS, documents: tuple[Documents, int]
) -> Iterator[tuple[DaemonHarness, World]]:
    """One daemon for the whole table (a daemon per row would cost seconds)."""
    world = fake_world(tls, documents[1])
    base = short_tempdir()
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(egress_client, "DEFAULT_NETWORK", world.network())
            with oauth_daemon(base) as harness:
                add_cal(harness)
                yield harness, world
    finally:
        rmtree(base)


@pytest.fixture
def table(
    table_daemon: tuple[DaemonHarness, World], documents: tuple[Documents, int]
) -> tuple[DaemonHarness, World]:
    documents[0].reset()
    table_daemon[1].dns.lookups.clear()
    table_daemon[1].dial.dialled.clear()
    return table_daemon


def only_the_server_was_reached(world: World) -> None:
    """Nothing but ``mcp.example.test`` was looked up or dialled (every address
    of the table is another one, and ``LoopbackDial`` maps no other)."""
    assert set(world.dns.lookups) <= {PUBLIC_NAME}
    assert set(world.dial.dialled) <= {(PUBLIC_V4, 443)}


@pytest.mark.parametrize("url", ADDRESS_NOT_ALLOWED)
def test_the_bypass_table_as_an_authorization_server(
    table: tuple[DaemonHarness, World], documents: tuple[Documents, int], url: str
) -> None:
    daemon, world = table
    serve_docs(documents, {PRM_PATH: prm(authorization_servers=[url])})
    with daemon.client() as c, pytest.raises(RemoteError) as refused:
        c.auth_login("cal")
    if "%25" in url:
        # A zone identifier is no URL to pydantic: the document is unreadable,
        # so unused (RFC 9728), and the server's own origin has no metadata:
        # the 2025-03-26 default endpoints there, which it does not have either.
        assert isinstance(refused.value, LoginError)
        assert "registration endpoint answered 404" in refused.value.message
    else:
        assert isinstance(refused.value, PermissionDeniedError)
        assert refused.value.reason == "address_not_allowed"
        assert documents[0].requests == ["POST /mcp", f"GET {PRM_PATH}"]
    only_the_server_was_reached(world)


@pytest.mark.parametrize("url", ADDRESS_NOT_ALLOWED)
def test_the_bypass_table_as_a_resource_metadata_url(
    table: tuple[DaemonHarness, World], documents: tuple[Documents, int], url: str
) -> None:
    daemon, world = table
    documents[0].challenge = f'Bearer resource_metadata="{url}"'
    serve_docs(documents, {PRM_PATH: prm(), AS_PATH: as_metadata()})
    with daemon.client() as c, pytest.raises(PermissionDeniedError) as refused:
        c.auth_login("cal")
    assert refused.value.reason == "address_not_allowed"
    assert documents[0].requests == ["POST /mcp"]  # no metadata GET, anywhere
    only_the_server_was_reached(world)


# --- §6.2 #20: redirects are never followed, least of all with a code -------------


def pending_login(daemon: DaemonHarness) -> str:
    """A login of a pre-registered client; the callback URL the browser would
    land on."""
    with daemon.client() as c:
        c.remove_server("cal")
    add_cal(daemon, oauth_client_id="pre-registered")
    with daemon.client() as c:
        started = c.auth_login("cal")
    state = parse_qs(urlsplit(started.authorization_url).query)["state"][0]
    return f"{started.redirect_uri}?code=the-code-{state[:4]}&state={state}"


@pytest.mark.parametrize("status", [302, 307, 308])
def test_a_token_endpoint_redirect_is_not_followed(
    daemon: DaemonHarness, world: World, documents: tuple[Documents, int], status: int
) -> None:
    serve_docs(documents, {PRM_PATH: prm(), AS_PATH: as_metadata()})
    documents[0].redirects["/token"] = (status, f"https://{OTHER_NAME}/token")
    callback = pending_login(daemon)
    with daemon.client() as c:
        before = c.server_status("cal")[0].auth
        with pytest.raises(PermissionDeniedError) as refused:
            c.auth_complete("cal", callback)
    assert refused.value.reason == "redirect_blocked"
    assert f"answered {status} (to https://{OTHER_NAME}/token)" in refused.value.message
    assert "the-code" not in refused.value.message
    assert documents[0].requests.count("POST /token") == 1
    assert OTHER_NAME not in world.dns.lookups  # the code went nowhere else
    assert set(world.dial.dialled) == {(PUBLIC_V4, 443)}
    with daemon.client() as c:
        assert c.server_status("cal")[0].auth == before  # no grant


def test_a_refresh_redirected_elsewhere_keeps_the_refresh_token_home(
    daemon: DaemonHarness, world: World, documents: tuple[Documents, int]
) -> None:
    """The keeper's refresh goes through the same guard: a 307 from the token
    endpoint is a failed refresh, and the refresh token goes nowhere else."""
    serve_docs(documents, {PRM_PATH: prm(), AS_PATH: as_metadata()})
    documents[0].posts["/token"] = {
        "access_token": "at-one",
        "token_type": "Bearer",
        "refresh_token": "rt-one",
        "expires_in": 2,  # refreshed about a second from now
    }
    callback = pending_login(daemon)
    with daemon.client() as c:
        assert c.auth_complete("cal", callback).auth.refreshable
    documents[0].redirects["/token"] = (307, f"https://{OTHER_NAME}/token")
    with daemon.client() as c:

        def refused() -> bool:
            error = c.server_status("cal")[0].auth.last_refresh_error or ""
            return "redirect_blocked" in error

        wait_until(refused, timeout=10, what="a refresh refused as redirect_blocked")
        error = c.server_status("cal")[0].auth.last_refresh_error or ""
    assert f"answered 307 (to https://{OTHER_NAME}/token)" in error
    assert "rt-one" not in error
    assert OTHER_NAME not in world.dns.lookups
    assert set(world.dial.dialled) == {(PUBLIC_V4, 443)}


INTERNAL_AS = "https://10.0.0.1"


def test_a_token_endpoint_on_a_private_address_is_refused(
    daemon: DaemonHarness, world: World, documents: tuple[Documents, int]
) -> None:
    serve_docs(
        documents,
        {PRM_PATH: prm(), AS_PATH: as_metadata(token_endpoint=f"{INTERNAL_AS}/token")},
    )
    # At discovery, before the browser: not first at auth/complete.
    with pytest.raises(PermissionDeniedError) as refused:
        pending_login(daemon)
    assert refused.value.reason == "address_not_allowed"
    assert "token endpoint" in refused.value.message
    assert "POST /token" not in documents[0].requests
    only_the_server_was_reached(world)


@pytest.mark.parametrize(
    ("path", "location"),
    [
        (PRM_PATH, f"{BASE}/moved{PRM_PATH}"),  # the same origin, a good document
        (PRM_PATH, f"https://{OTHER_NAME}{PRM_PATH}"),
        (AS_PATH, f"https://{OTHER_NAME}{AS_PATH}"),
        (AS_PATH, "http://169.254.169.254/latest/meta-data/"),
    ],
)
def test_a_metadata_redirect_is_not_followed(
    daemon: DaemonHarness,
    world: World,
    documents: tuple[Documents, int],
    path: str,
    location: str,
) -> None:
    serve_docs(
        documents,
        {PRM_PATH: prm(), f"/moved{PRM_PATH}": prm(), AS_PATH: as_metadata()},
    )
    documents[0].redirects[path] = (302, location)
    with daemon.client() as c, pytest.raises(PermissionDeniedError) as refused:
        c.auth_login("cal")
    assert refused.value.reason == "redirect_blocked"
    assert documents[0].requests[-1] == f"GET {path}"  # the last request
    assert f"GET /moved{PRM_PATH}" not in documents[0].requests
    assert OTHER_NAME not in world.dns.lookups
    assert set(world.dial.dialled) == {(PUBLIC_V4, 443)}


# --- §6.2 #21: a malicious discovery chain ----------------------------------------


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("https://evil.elsewhere.test/prm", "host_not_allowed"),
        (
            "https://10.0.0.1/.well-known/oauth-protected-resource",
            "address_not_allowed",
        ),
        ("https://metadata.example.test/latest/meta-data/", "address_not_allowed"),
        ("https://private.example.test/prm", "address_not_allowed"),
        (f"http://{PUBLIC_NAME}{PRM_PATH}", "scheme_not_allowed"),
        ("http://10.0.0.1/prm", "scheme_not_allowed"),
        (f"https://user:pw@{PUBLIC_NAME}{PRM_PATH}", "credentials_in_url"),
    ],
)
def test_a_resource_metadata_url_elsewhere_is_refused_unfetched(
    daemon: DaemonHarness,
    world: World,
    documents: tuple[Documents, int],
    url: str,
    reason: str,
) -> None:
    documents[
        0
    ].challenge = f'Bearer error="invalid_token", resource_metadata="{url}", scope="x"'
    serve_docs(documents, {PRM_PATH: prm(), AS_PATH: as_metadata()})
    with daemon.client() as c, pytest.raises(PermissionDeniedError) as refused:
        c.auth_login("cal")
    assert refused.value.reason == reason
    assert "pw@" not in refused.value.message
    assert documents[0].requests == ["POST /mcp"]  # not even our own PRM after it
    assert set(world.dns.lookups) <= {
        PUBLIC_NAME,
        "metadata.example.test",
        "private.example.test",
    }
    assert set(world.dial.dialled) == {(PUBLIC_V4, 443)}


@pytest.mark.parametrize(
    ("endpoint", "said"),
    [
        ("javascript:alert(1)", "authorization_endpoint"),
        ("file:///etc/passwd", "authorization_endpoint"),
        ("https://login.example.test/a;$(id)", "authorization endpoint"),
        ("https://login.example.test/a|id", "authorization endpoint"),
        ("https://login.example.test/a?x='$HOME'", "authorization endpoint"),
        ("https://login.example.test/a#x", "a fragment"),
    ],
)
def test_a_hostile_authorization_endpoint_is_refused_before_registration(
    daemon: DaemonHarness,
    world: World,
    documents: tuple[Documents, int],
    endpoint: str,
    said: str,
) -> None:
    serve_docs(
        documents,
        {PRM_PATH: prm(), AS_PATH: as_metadata(authorization_endpoint=endpoint)},
    )
    error = login_error(daemon, documents)
    assert error.reason == "login_failed"
    assert said in error.message
    assert "$(id)" not in error.message
    posts = [r for r in documents[0].requests if r.startswith("POST")]
    assert posts == ["POST /mcp"]  # no /register (nor anything else) after it
    assert "login.example.test" not in world.dns.lookups
    assert set(world.dial.dialled) == {(PUBLIC_V4, 443)}


def test_a_registration_endpoint_on_a_private_address_is_refused(
    daemon: DaemonHarness, world: World, documents: tuple[Documents, int]
) -> None:
    serve_docs(
        documents,
        {
            PRM_PATH: prm(),
            AS_PATH: as_metadata(registration_endpoint="https://10.0.0.1/register"),
        },
    )
    with daemon.client() as c, pytest.raises(PermissionDeniedError) as refused:
        c.auth_login("cal")
    assert refused.value.reason == "address_not_allowed"
    assert "POST /register" not in documents[0].requests
    only_the_server_was_reached(world)
