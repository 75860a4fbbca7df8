"""``auth/login`` refuses early and ends in time, through the real daemon.

* An endpoint the egress guard will refuse later (the token endpoint at
  ``auth/complete``, the registration endpoint) is refused at discovery, with the reason the guard gives, before
  a client is registered or an authorization URL handed out: the operator
  does not go through the browser for a login that cannot finish.
* The whole of discovery and registration has one deadline: each request
  is bounded on its own, but a slow authorization server answering every
  one of them just in time held a login for as long as all of them took.

The MCP server and its authorization server are ``https://mcp.example.test``
(fake DNS, verified TLS, dialled on loopback: ``egress_world``). The network
tripwire and the loopback-only dial make a refused address impossible to
reach even if the guard were broken.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

import anyio
import msgspec
import pytest

from memorizz.api.errors import (
    DeadlineExceededError,
    LoginError,
    PermissionDeniedError,
    RemoteError,
)
from memorizz.api.methods import ServerSpec
from memorizzd.egress.urls import check_url
from memorizzd.oauth import keeper as oauth_keeper
from memorizzd.oauth import service as oauth_service
from tests.egress_world import (
    PUBLIC_V4,
    TLS,
    World,
    serve,
    tls_material,
)
from tests.harness import DaemonHarness, daemon_config
from tests.oauth_site import (
    ALLOWLIST,
    AS_PATH,
    BASE,
    MCP_URL,
    OUTSIDE,
    PRM_PATH,
    metadata,
    site_world,
)

CLIENT_SECRET = "client-secret-bounds-2b7d"  # noqa: S105 - a test marker
REGISTERED = msgspec.json.encode(
    {
        "client_id": "dyn-client-1",
        "client_secret": "dyn-secret-bounds-81fa",
        "redirect_uris": ["http://127.0.0.1:33418/callback"],
        "token_endpoint_auth_method": "client_secret_basic",
    }
)


@dataclass
class Site:
    """The fake server: the answers by ``"<METHOD> <path>"``, each after
    ``delay_s`` (``hang``: none before ``stop``), and what it was asked."""

    answers: dict[str, tuple[int, bytes]] = field(default_factory=dict)
    requests: list[str] = field(default_factory=list)
    delay_s: float = 0.0
    hang: bool = False
    stop: threading.Event = field(default_factory=threading.Event)

    def reset(self) -> None:
        self.answers.clear()
        self.requests.clear()
        self.delay_s, self.hang = 0.0, False
        self.stop = threading.Event()

    def discovery(self, **fields: Any) -> None:
        prm = {"resource": MCP_URL, "authorization_servers": [BASE]}
        self.answers[f"GET {PRM_PATH}"] = (200, msgspec.json.encode(prm))
        registration = {"registration_endpoint": f"{BASE}/register"}
        published = metadata(**{**registration, **fields})
        self.answers[f"GET {AS_PATH}"] = (200, msgspec.json.encode(published))
        self.answers["POST /register"] = (201, REGISTERED)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        key = f"{scope['method']} {scope['path']}"
        self.requests.append(key)
        while (await receive()).get("more_body"):
            pass
        stop = self.stop
        waited = 0.0
        while (self.hang or waited < self.delay_s) and not stop.is_set():
            await anyio.sleep(0.05)
            waited += 0.05
        headers = [(b"content-type", b"application/json")]
        if key == "POST /mcp":
            status, body = 401, b""
            challenge = f'Bearer resource_metadata="{BASE}{PRM_PATH}"'
            headers.append((b"www-authenticate", challenge.encode()))
        else:
            status, body = self.answers.get(key, (404, b"{}"))
        headers.append((b"content-length", str(len(body)).encode()))
        await send(
            {"type": "http.response.start", "status": status, "headers": headers}
        )
        await send({"type": "http.response.body", "body": body})


@pytest.fixture(scope="module")
def tls() -> Iterator[TLS]:
    with tls_material() as material:
        yield material


@pytest.fixture(scope="module")
def site(tls: TLS) -> Iterator[tuple[Site, int]]:
    state = Site()
    with serve(state, tls, lifespan="off") as port:
        yield state, port
        state.stop.set()


@pytest.fixture
def world(
    tls: TLS, site: tuple[Site, int], monkeypatch: pytest.MonkeyPatch
) -> Iterator[World]:
    world = site_world(tls, site[1], monkeypatch)
    site[0].reset()
    yield world
    site[0].stop.set()


@pytest.fixture
def daemon(base_dir: str, world: World) -> Iterator[DaemonHarness]:
    config = daemon_config(base_dir, host_allowlist=ALLOWLIST)
    with DaemonHarness.running(config) as harness:
        yield harness


def add_cal(daemon: DaemonHarness, *, registered: bool) -> None:
    """``cal``: a pre-registered client (``registered``), else one the daemon
    registers itself (RFC 7591)."""
    client: dict[str, Any] = {}
    if registered:
        client = {
            "oauth_client_id": "pre-registered",
            "oauth_client_secret": CLIENT_SECRET,
        }
    with daemon.client() as c:
        c.add_server(
            ServerSpec(
                name="cal",
                transport="streamable_http",
                url=MCP_URL,
                auth="oauth",
                **client,
            )
        )


def no_login_pending(daemon: DaemonHarness) -> None:
    with daemon.client() as c, pytest.raises(LoginError) as refused:
        c.auth_complete("cal", "http://127.0.0.1:33418/callback?code=c&state=s")
    assert refused.value.reason == "invalid_state"


# --- the egress guard's verdict on every endpoint, at discovery ---------------------

HOSTILE = [
    (f"https://{OUTSIDE}/x", "host_not_allowed"),
    ("https://10.0.0.1/x", "address_not_allowed"),
    ("https://169.254.169.254/x", "address_not_allowed"),
    ("https://[::1]/x", "address_not_allowed"),
    ("http://as.example.test/x", "scheme_not_allowed"),
]


@pytest.mark.parametrize(("url", "reason"), HOSTILE)
@pytest.mark.parametrize("endpoint", ["token_endpoint", "registration_endpoint"])
def test_an_endpoint_the_guard_refuses_is_refused_at_login(
    daemon: DaemonHarness,
    world: World,
    site: tuple[Site, int],
    endpoint: str,
    url: str,
    reason: str,
) -> None:
    """Before: a token endpoint outside the allowlist was first refused at
    ``auth/complete``, once the operator had logged in in the browser."""
    state = site[0]
    add_cal(daemon, registered=endpoint != "registration_endpoint")
    state.discovery(**{endpoint: url})
    with daemon.client() as c, pytest.raises(PermissionDeniedError) as refused:
        c.auth_login("cal")
    error = refused.value
    # The reason the egress layer itself gives that URL (what auth/complete
    # or the registration request would have got).
    with pytest.raises(PermissionDeniedError) as guard:
        check_url(url, allowlist=ALLOWLIST, allow_private_network=False)
    assert error.reason == guard.value.reason == reason
    what = endpoint.replace("_", " ")
    assert error.message == (
        f"the authorization server's {what} is refused: {guard.value.message}"
    )
    assert CLIENT_SECRET not in error.message
    # Nothing went anywhere but the server's discovery documents: no client
    # registered, no request to the endpoint, no lookup of its name.
    assert state.requests == ["POST /mcp", f"GET {PRM_PATH}", f"GET {AS_PATH}"]
    assert OUTSIDE not in world.dns.lookups
    assert set(world.dial.dialled) == {(PUBLIC_V4, 443)}
    no_login_pending(daemon)


def test_a_registration_endpoint_a_known_client_does_not_use_is_not_judged(
    daemon: DaemonHarness, site: tuple[Site, int]
) -> None:
    """A pre-registered client never sends to the registration endpoint:
    where it points does not stop its login."""
    add_cal(daemon, registered=True)
    site[0].discovery(registration_endpoint=f"https://{OUTSIDE}/register")
    with daemon.client() as c:
        started = c.auth_login("cal")
    assert started.authorization_url.startswith(f"{BASE}/authorize?")


def test_good_endpoints_log_in_and_complete(
    daemon: DaemonHarness, site: tuple[Site, int]
) -> None:
    state = site[0]
    add_cal(daemon, registered=False)
    state.discovery()
    state.answers["POST /token"] = (
        200,
        msgspec.json.encode(
            {"access_token": "at-bounds-1", "token_type": "Bearer", "expires_in": 60}
        ),
    )
    with daemon.client() as c:
        started = c.auth_login("cal")
        query = parse_qs(urlsplit(started.authorization_url).query)
        callback = f"{started.redirect_uri}?code=c1&state={query['state'][0]}"
        done = c.auth_complete("cal", callback)
    assert done.auth.state == "ok"
    assert state.requests.count("POST /register") == 1


# --- one deadline for the whole of discovery and registration -----------------------


@pytest.mark.parametrize("server", ["slow", "hanging"])
def test_a_slow_authorization_server_cannot_hold_a_login(
    daemon: DaemonHarness,
    site: tuple[Site, int],
    monkeypatch: pytest.MonkeyPatch,
    server: str,
) -> None:
    """Scaled down (1.5 s per request, 2 s for the login; 15 s and 30 s in
    the daemon). ``slow``: every request answered in 0.7 s, well within its
    own deadline, four in a row (probe, resource metadata, authorization
    server metadata, registration): the login used to succeed after about
    3 s. ``hanging``: no answer at all; each request is cut off at 1.5 s,
    and the login used to try one discovery URL after another (about 10 s).
    Either way the deadline ends it in discovery (the third request ends
    after 2.1 s at the earliest)."""
    monkeypatch.setattr(oauth_keeper, "REFRESH_TIMEOUT_S", 3.0)  # 1.5 s a request
    monkeypatch.setattr(oauth_service, "LOGIN_DEADLINE_S", 2.0)
    state = site[0]
    add_cal(daemon, registered=False)
    state.discovery()
    if server == "slow":
        state.delay_s = 0.7
    else:
        state.hang = True
    started = time.monotonic()
    with daemon.client() as c, pytest.raises(RemoteError) as refused:
        c.auth_login("cal")
    took = time.monotonic() - started
    state.stop.set()
    error = refused.value
    assert isinstance(error, DeadlineExceededError), error
    assert error.reason == "timeout"
    assert error.data == {"server": "cal", "timeout_s": 2.0}
    assert error.message == (
        "the authorization server of 'cal' is unreachable or too slow: discovery"
        " and registration did not finish within 2 s (stopped while discovering"
        " its authorization server); try again later"
    )
    assert 2.0 <= took < 3.5, f"took {took:.1f} s"
    no_login_pending(daemon)
    # The same server answering in time: the deadline is the login's, not
    # a state the server is left in.
    state.reset()
    state.discovery()
    with daemon.client() as c:
        assert c.auth_login("cal").authorization_url.startswith(f"{BASE}/authorize?")


def test_the_login_deadline_is_thirty_seconds_and_fifteen_per_request() -> None:
    """As docs/auth.md says."""
    assert oauth_service.LOGIN_DEADLINE_S == 30.0
    assert oauth_keeper.REFRESH_TIMEOUT_S / 2 == 15.0
