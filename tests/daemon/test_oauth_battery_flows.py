"""An outside battery's probes of the OAuth flows through the real daemon.

The MCP server and its authorization server are ``https://mcp.example.test``
(fake DNS, verified TLS, dialled on loopback: ``egress_world``); what each
endpoint answers is up to the test, down to how slowly the bytes come. The
network tripwire and the loopback-only dial make a refused address
impossible to reach even if the guard were broken.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

import msgspec
import pytest

from memorizz.api.errors import PermissionDeniedError, RemoteError
from memorizz.api.methods import ServerSpec
from memorizzd.oauth import keeper as oauth_keeper
from tests.egress_world import (
    PUBLIC_NAME,
    PUBLIC_V4,
    TLS,
    World,
    serve,
    tls_material,
)
from tests.harness import DaemonHarness, daemon_config
from tests.oauth_site import (
    AS_PATH,
    BASE,
    MCP_URL,
    OUTSIDE,
    PRM_PATH,
    metadata,
    site_world,
)

ACCESS = "at-battery-7d1f0c"
REFRESH = "rt-battery-52e9aa"
CODE = "code-battery-0be4c3"
TOKEN_BODY = msgspec.json.encode(
    {
        "access_token": ACCESS,
        "token_type": "Bearer",
        "refresh_token": REFRESH,
        "expires_in": 3600,
    }
)


@dataclass
class Answer:
    status: int = 200
    body: bytes = b""
    content_type: bytes = b"application/json"
    drip_s: float = 0.0
    """Each byte of ``body`` sent alone, this long after the last."""
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)


@dataclass
class Site:
    """The fake server's answers by ``"<METHOD> <path>"`` and what it was asked."""

    answers: dict[str, Answer] = field(default_factory=dict)
    requests: list[str] = field(default_factory=list)
    forms: list[bytes] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    """Set: a drip still under way ends at once (the test is over)."""

    def reset(self) -> None:
        self.answers.clear()
        self.requests.clear()
        self.forms.clear()
        self.stop = threading.Event()

    def document(self, path: str, doc: Any) -> None:
        self.answers[f"GET {path}"] = Answer(body=msgspec.json.encode(doc))

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        import anyio

        key = f"{scope['method']} {scope['path']}"
        self.requests.append(key)
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if scope["method"] == "POST" and scope["path"] != "/mcp":
            self.forms.append(body)
        answer = self.answers.get(key)
        if answer is None and scope["path"] == "/mcp":
            header = f'Bearer resource_metadata="{BASE}{PRM_PATH}"'
            answer = Answer(401, b"", b"text/plain")
            headers = [(b"www-authenticate", header.encode())]
        else:
            headers = []
        if answer is None:
            answer = Answer(404, b"no", b"text/plain")
        headers += [
            *answer.headers,
            (b"content-type", answer.content_type),
            (b"content-length", str(len(answer.body)).encode()),
        ]
        await send(
            {"type": "http.response.start", "status": answer.status, "headers": headers}
        )
        if not answer.drip_s:
            await send({"type": "http.response.body", "body": answer.body})
            return
        stop = self.stop
        for i in range(len(answer.body)):
            if stop.is_set():
                return
            await anyio.sleep(answer.drip_s)
            more = i + 1 < len(answer.body)
            await send(
                {
                    "type": "http.response.body",
                    "body": answer.body[i : i + 1],
                    "more_body": more,
                }
            )


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
    names = {"private.example.test": ["10.0.0.1"]}
    world = site_world(tls, site[1], monkeypatch, names)
    site[0].reset()
    yield world
    site[0].stop.set()


@pytest.fixture
def daemon(base_dir: str, world: World) -> Iterator[DaemonHarness]:
    config = daemon_config(base_dir, host_allowlist=["*.example.test"])
    with DaemonHarness.running(config) as harness:
        with harness.client() as c:
            c.add_server(
                ServerSpec(
                    name="cal",
                    transport="streamable_http",
                    url=MCP_URL,
                    auth="oauth",
                    oauth_client_id="pre-registered",
                    oauth_client_secret="client-secret-battery-9f3e",  # noqa: S106
                )
            )
        yield harness


def serve_discovery(site: Site, **fields: Any) -> None:
    site.document(PRM_PATH, {"resource": MCP_URL, "authorization_servers": [BASE]})
    site.document(AS_PATH, metadata(**fields))


def callback(daemon: DaemonHarness) -> str:
    with daemon.client() as c:
        started = c.auth_login("cal")
    state = parse_qs(urlsplit(started.authorization_url).query)["state"][0]
    return f"{started.redirect_uri}?code={CODE}&state={state}"


def no_secret_in(text: str) -> None:
    for secret in (ACCESS, REFRESH, CODE, "client-secret-battery-9f3e"):
        assert secret not in text


def timed(call: Any) -> tuple[BaseException | None, float]:
    """Run ``call`` in a thread for at most 60 s: what it raised and how long it took."""
    outcome: list[BaseException | None] = []
    started = time.monotonic()

    def run() -> None:
        try:
            call()
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(60)
    assert outcome, "the call did not end within 60 s"
    return outcome[0], time.monotonic() - started


# --- slow and huge answers: one deadline for each OAuth request -------------------


@pytest.mark.parametrize("where", ["token", "metadata", "probe"])
def test_a_dripping_authorization_server_is_cut_off_at_the_deadline(
    daemon: DaemonHarness,
    site: tuple[Site, int],
    monkeypatch: pytest.MonkeyPatch,
    where: str,
) -> None:
    """A body that keeps coming, one byte just inside the read timeout at a
    time, must not hold ``auth/complete`` (or ``auth/login``) open for as
    long as the server likes: the OAuth requests have a total deadline, as
    the refresh has."""
    monkeypatch.setattr(oauth_keeper, "REFRESH_TIMEOUT_S", 2.0)  # 1 s per read
    state = site[0]
    serve_discovery(state)
    if where == "token":
        url = callback(daemon)
        padded = TOKEN_BODY[:-1] + b"," + b'"x":"' + b"y" * 200 + b'"}'
        state.answers["POST /token"] = Answer(body=padded, drip_s=0.1)

        def call() -> None:
            with daemon.client() as c:
                c.auth_complete("cal", url)

    else:
        if where == "metadata":
            doc = msgspec.json.encode(metadata())
            state.answers[f"GET {AS_PATH}"] = Answer(body=doc + b" " * 300, drip_s=0.1)
        else:  # the unauthenticated probe answered by a stream kept open
            stream = Answer(200, b": ping\n\n" * 100, b"text/event-stream", 0.1)
            state.answers["POST /mcp"] = stream

        def call() -> None:
            with daemon.client() as c:
                c.auth_login("cal")

    error, took = timed(call)
    state.stop.set()
    assert took < 8, f"held for {took:.1f} s"
    if where == "probe":  # no challenge: discovery goes on without one
        assert error is None
        return
    assert isinstance(error, RemoteError), error
    assert took < 8, f"held for {took:.1f} s"
    no_secret_in(error.message)
    if where == "token":
        with daemon.client() as c:
            assert c.server_status("cal")[0].auth.state == "logged_out"


def test_a_huge_token_answer_installs_nothing_and_says_why(
    daemon: DaemonHarness, site: tuple[Site, int]
) -> None:
    state = site[0]
    serve_discovery(state)
    url = callback(daemon)
    huge = TOKEN_BODY[:-1] + b',"x":"' + b"y" * (2 << 20) + b'"}'
    state.answers["POST /token"] = Answer(body=huge)
    with daemon.client() as c:
        with pytest.raises(RemoteError) as refused:
            c.auth_complete("cal", url)
        assert c.server_status("cal")[0].auth.state == "logged_out"
    no_secret_in(refused.value.message)
    assert state.requests.count("POST /token") == 1


# --- the host allowlist on every OAuth hop ------------------------------------------


@pytest.mark.parametrize(
    "endpoint", ["token_endpoint", "registration_endpoint", "revocation_endpoint"]
)
def test_an_endpoint_outside_the_allowlist_is_refused_unsent(
    daemon: DaemonHarness,
    world: World,
    site: tuple[Site, int],
    endpoint: str,
) -> None:
    state = site[0]
    elsewhere = f"https://{OUTSIDE}/{endpoint}"
    if endpoint == "registration_endpoint":
        with daemon.client() as c:
            c.remove_server("cal")
            c.add_server(
                ServerSpec(
                    name="cal", transport="streamable_http", url=MCP_URL, auth="oauth"
                )
            )
        serve_discovery(state, registration_endpoint=elsewhere)
        with daemon.client() as c, pytest.raises(PermissionDeniedError) as refused:
            c.auth_login("cal")
        error = refused.value.reason, refused.value.message
    elif endpoint == "token_endpoint":
        # Refused at discovery, before the browser (test_oauth_login_bounds),
        # not left to auth/complete.
        serve_discovery(state, token_endpoint=elsewhere)
        with daemon.client() as c, pytest.raises(PermissionDeniedError) as refused:
            c.auth_login("cal")
        error = refused.value.reason, refused.value.message
    else:  # the revocation endpoint: the login works, the logout cannot revoke
        serve_discovery(state, revocation_endpoint=elsewhere)
        state.answers["POST /token"] = Answer(body=TOKEN_BODY)
        url = callback(daemon)
        with daemon.client() as c:
            c.auth_complete("cal", url)
            result = c.auth_logout("cal")
        assert result.revocation == "failed"
        error = (
            "host_not_allowed" if "host_not_allowed" in result.message else "",
            (result.message),
        )
    assert error[0] == "host_not_allowed", error
    no_secret_in(error[1])
    assert OUTSIDE not in world.dns.lookups
    assert set(world.dial.dialled) == {(PUBLIC_V4, 443)}
    assert not any(r.startswith(f"POST /{endpoint}") for r in state.requests)


# --- RFC 8707 / 9728: the resource of a server written with a trailing dot ---------


def test_a_trailing_dot_server_url_logs_in_for_the_dot_less_resource(
    daemon: DaemonHarness, site: tuple[Site, int]
) -> None:
    """``https://mcp.example.test./mcp`` is the server the allowlist matched
    and TLS verified as ``mcp.example.test``; its protected resource metadata
    names ``https://mcp.example.test/mcp``, which is this server, and the
    resource indicator sent is that one."""
    state = site[0]
    serve_discovery(state)
    with daemon.client() as c:
        c.remove_server("cal")
        c.add_server(
            ServerSpec(
                name="cal",
                transport="streamable_http",
                url=f"https://{PUBLIC_NAME}./mcp",
                auth="oauth",
                oauth_client_id="pre-registered",
            )
        )
        started = c.auth_login("cal")
    query = parse_qs(urlsplit(started.authorization_url).query)
    assert query["resource"] == [MCP_URL]


# --- errors never carry a secret ----------------------------------------------------


def test_a_token_endpoint_redirect_with_the_code_in_its_location_hides_it(
    daemon: DaemonHarness, world: World, site: tuple[Site, int]
) -> None:
    state = site[0]
    serve_discovery(state)
    url = callback(daemon)
    location = (
        f"https://{CODE}:client-secret-battery-9f3e@other.example.test/token"
        f"?code={CODE}&refresh_token={REFRESH}#{ACCESS}"
    )
    state.answers["POST /token"] = Answer(
        307, b"", b"text/plain", headers=[(b"location", location.encode())]
    )
    with daemon.client() as c, pytest.raises(RemoteError) as refused:
        c.auth_complete("cal", url)
    assert refused.value.reason == "redirect_blocked"
    no_secret_in(refused.value.message)


# --- WWW-Authenticate resource_metadata in shapes parsers read differently --------


@pytest.mark.parametrize(
    "hinted",
    [
        "/.well-known/oauth-protected-resource/mcp",
        "//10.0.0.1/prm",
        "https://mcp.example.test\\@10.0.0.1/prm",
        "https://mcp.example.test\t@10.0.0.1/prm",
        "https://10.0.0.1\t/prm",
        "https:\\\\10.0.0.1\\prm",
        "https://mcp.example.test%2e/prm",
        "https://%6d%63%70.example.test/prm",
        "https://mcp.example.test:443@10.0.0.1/prm",
        "https://2130706433/prm",
        "https://[::ffff:a9fe:a9fe]/prm",
        "https://private.example.test./prm",
        "file:///etc/passwd",
        "javascript:alert(1)",
        "",
    ],
)
def test_a_resource_metadata_url_in_any_shape_reaches_only_the_server(
    daemon: DaemonHarness, world: World, site: tuple[Site, int], hinted: str
) -> None:
    state = site[0]
    serve_discovery(state)
    header = f'Bearer resource_metadata="{hinted}"'
    state.answers["POST /mcp"] = Answer(
        401, b"", b"text/plain", headers=[(b"www-authenticate", header.encode())]
    )
    with daemon.client() as c:
        try:
            started: Any = c.auth_login("cal")
        except RemoteError as exc:
            started = exc
    if isinstance(started, RemoteError):
        assert started.reason != "internal_error", started.message
        assert started.reason in (
            "address_not_allowed",
            "credentials_in_url",
            "scheme_not_allowed",
            "invalid_params",
            "login_failed",
        ), (started.reason, started.message)
    assert set(world.dns.lookups) <= {PUBLIC_NAME, "private.example.test"}
    assert set(world.dial.dialled) <= {(PUBLIC_V4, 443)}
