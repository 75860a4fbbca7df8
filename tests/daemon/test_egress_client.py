"""The hardened HTTP client on the wire: real TLS, real sockets, real httpcore pool.

Only the DNS answer is fake (``FakeDNS``); the final dial maps the checked
public address (8.8.8.8:443 ...) to a loopback HTTPS server with a certificate
for ``mcp.example.test`` (``LoopbackDial``), and the conftest tripwire fails
any test that reaches for anything but loopback.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from typing import Any

import anyio
import httpcore2
import httpx2
import msgspec
import pytest

from memorizz.api.errors import PermissionDeniedError, UpstreamError
from memorizzd.egress.backend import Network, PinnedBackend
from memorizzd.egress.replies import REFUSAL_KEY, refusal_in, refusal_reply
from tests.egress_world import (
    PUBLIC_NAME,
    PUBLIC_V4,
    PUBLIC_V6,
    REDIRECT_TARGETS,
    SECOND_NAME,
    SECOND_V4,
    TLS,
    FakeDNS,
    LoopbackDial,
    World,
    client,
    recording_listener,
    refused,
    serve,
    tls_material,
    trap_app,
)

pytestmark = pytest.mark.anyio

ANSWERS: dict[str, Any] = {
    PUBLIC_NAME: [PUBLIC_V4],
    SECOND_NAME: [SECOND_V4],
    "other.example.org": [PUBLIC_V4],  # not in the certificate
    "dual.example.test": [PUBLIC_V6, PUBLIC_V4],
    "mixed.example.test": [PUBLIC_V4, "10.0.0.1"],
    "mixed-first.example.test": ["10.0.0.1", PUBLIC_V4],
    "mixed6.example.test": [PUBLIC_V6, "fd00::1"],
    "aaaa-only-internal.example.test": ["fd00::1"],
    "cname-to-internal.example.test": ["10.1.2.3"],  # the resolver follows CNAMEs
    "metadata.google.internal": ["169.254.169.254"],
    "alibaba-metadata.example.test": ["100.100.100.200"],
    "imds6.example.test": ["fd00:ec2::254"],
    "loopback.example.test": ["127.0.0.1"],
    "loopback6.example.test": ["::1"],
    "zero.example.test": ["0.0.0.0"],  # noqa: S104 - an answer, not a bind
    "mapped.example.test": ["::ffff:127.0.0.1"],
    "translated.example.test": ["::ffff:0:7f00:1"],  # SIIT (issue 9)
    "translated-public.example.test": [PUBLIC_V4, "::ffff:0:a9fe:a9fe"],
    "srv6.example.test": ["5f00::1"],
    "doc3fff.example.test": ["3fff::1"],
    "nat64.example.test": ["64:ff9b::a9fe:a9fe"],
    "sixtofour.example.test": ["2002:a9fe:a9fe::1"],
    "teredo.example.test": ["2001:0:4136:e378:8000:63bf:3f57:fdfe"],
    "linklocal6.example.test": ["fe80::1"],
    "cgnat.example.test": ["100.64.0.1"],
    "multicast.example.test": ["224.0.0.251"],
    "rebind.example.test": [["8.8.4.4"], ["127.0.0.1"]],
}
PRIVATE_NAMES = [
    name
    for name, answer in ANSWERS.items()
    if name not in (PUBLIC_NAME, SECOND_NAME, "other.example.org", "dual.example.test")
    and not isinstance(answer[0], list)
]


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, Any]]:
    return "asyncio", {"use_uvloop": True}


@pytest.fixture(scope="module")
def tls() -> Iterator[TLS]:
    with tls_material() as material:
        yield material


SERVED: list[str] = []
"""``"<method> <path>"`` of every request the HTTPS server got (this test's)."""


@pytest.fixture(scope="module")
def https_port(tls: TLS) -> Iterator[int]:
    """A loopback HTTPS server answering ``/trap/<action>``."""
    with serve(trap_app(log=SERVED), tls, lifespan="off") as port:
        yield port


@pytest.fixture
def world(tls: TLS, https_port: int) -> World:
    world = World(tls, FakeDNS(dict(ANSWERS)), LoopbackDial())
    world.route(PUBLIC_V4, 443, https_port)
    world.route("8.8.4.4", 443, https_port)
    world.route(SECOND_V4, 443, https_port)
    SERVED.clear()
    return world


# --- an allowed public name connects -----------------------------------------------


async def test_an_allowed_public_name_connects_to_the_checked_address(
    world: World,
) -> None:
    async with client(world, allowlist=[PUBLIC_NAME]) as http:
        response = await http.get(f"https://{PUBLIC_NAME}/trap/headers")
    assert response.status_code == 200
    sent = response.json()
    assert sent["host"] == PUBLIC_NAME  # Host (and SNI) carry the name, not the IP
    assert sent["accept-encoding"] == "identity"
    assert world.dns.lookups == [PUBLIC_NAME]
    assert world.dial.dialled == [(PUBLIC_V4, 443)]


@pytest.mark.parametrize(
    "url",
    [
        f"https://{PUBLIC_NAME}./trap/headers",
        f"https://{PUBLIC_NAME}.:443/trap/headers",
        f"HTTPS://{PUBLIC_NAME.upper()}./trap/headers",
    ],
)
async def test_a_trailing_dot_or_an_upper_case_url_reaches_the_allowed_host(
    world: World, url: str
) -> None:
    """Issue 9: ``mcp.example.test.`` failed TLS; it is the name the allowlist
    matched, and that is what SNI, the certificate check and Host carry."""
    async with client(world, allowlist=[PUBLIC_NAME]) as http:
        response = await http.get(url)
    assert response.status_code == 200
    assert response.json()["host"] == PUBLIC_NAME
    assert world.dns.lookups == [PUBLIC_NAME]
    assert world.dial.dialled == [(PUBLIC_V4, 443)]


async def test_tls_verifies_the_url_host_name_not_the_address(world: World) -> None:
    async with client(world) as http:
        with pytest.raises(httpx2.ConnectError) as err:
            await http.get("https://other.example.org/trap/ok")
    assert "CERTIFICATE_VERIFY_FAILED" in str(err.value)
    assert world.dial.dialled == [(PUBLIC_V4, 443)]


async def test_every_checked_address_is_tried_in_turn(world: World) -> None:
    closed = socket.socket()  # bound, never listening: connection refused
    closed.bind(("127.0.0.1", 0))
    try:
        world.route(PUBLIC_V6, 443, closed.getsockname()[1])
        async with client(world) as http:
            response = await http.get("https://dual.example.test/trap/ok")
    finally:
        closed.close()
    assert response.text == "ok"
    assert world.dial.dialled == [(PUBLIC_V6, 443), (PUBLIC_V4, 443)]


async def test_a_pooled_connection_stays_on_its_checked_address(world: World) -> None:
    world.dns.answers[PUBLIC_NAME] = [[PUBLIC_V4], ["127.0.0.1"]]
    async with client(world) as http:
        for _ in range(3):
            assert (await http.get(f"https://{PUBLIC_NAME}/trap/ok")).text == "ok"
    assert world.dns.lookups == [PUBLIC_NAME]  # one connection, one lookup
    assert world.dial.dialled == [(PUBLIC_V4, 443)]


# --- resolution: every address is checked, any bad one fails the connection --------


@pytest.mark.parametrize("name", PRIVATE_NAMES)
async def test_a_name_with_any_denied_address_is_refused(
    world: World, name: str
) -> None:
    error = await refused(
        world,
        f"https://{name}/trap/ok",
        allowlist=["*.example.test", "metadata.google.internal"],
    )
    assert isinstance(error, PermissionDeniedError)
    assert error.reason == "address_not_allowed"
    assert error.data["host"] == name
    assert world.dns.lookups == [name]
    assert world.dial.dialled == []  # nothing was dialled, not even the public one


async def test_dns_rebinding_between_two_connections_is_refused(world: World) -> None:
    url = "https://rebind.example.test/trap"
    async with client(world) as http:
        first = await http.get(f"{url}/close")  # the server closes the connection
        assert first.text == "ok"
        with pytest.raises(PermissionDeniedError) as err:
            await http.get(f"{url}/ok")  # a new connection: resolved and checked again
    assert err.value.reason == "address_not_allowed"
    assert "127.0.0.1" in err.value.message
    assert world.dns.lookups == ["rebind.example.test"] * 2
    assert world.dial.dialled == [("8.8.4.4", 443)]  # never loopback


async def test_an_unknown_name_fails_to_connect_without_the_system_resolver(
    world: World,
) -> None:
    async with client(world) as http:
        with pytest.raises(httpx2.ConnectError) as err:
            await http.get("https://nowhere.example.test/")
    assert "name resolution failed" in str(err.value)


# --- hosts that never reach a resolver -----------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "https://127.0.0.1/",
        "https://127.1/",
        "https://2130706433/",
        "https://017700000001/",
        "https://0x7f.1/",
        "https://0x7f000001/",
        "https://0/",
        "https://[::1]/",
        "https://[::ffff:127.0.0.1]/",
        "https://[::ffff:7f00:1]/",
        "https://[64:ff9b::a9fe:a9fe]/",
        "https://[::ffff:0:127.0.0.1]/",
        "https://[::ffff:0:a9fe:a9fe]/",
        "https://169.254.169.254/latest/meta-data/",
        "https://[fd00:ec2::254]/",
        "https://localhost/",
        "https://localhost./",
    ],
)
async def test_numeric_and_local_hosts_are_refused_before_any_lookup(
    world: World, url: str
) -> None:
    error = await refused(world, url)
    assert error.reason == "address_not_allowed"
    assert world.dns.lookups == []
    assert world.dial.dialled == []


@pytest.mark.parametrize(
    "url",
    [
        "https://0177.0.0.1/",  # inet_aton would take it
        "https://\u24dbocalhost/",  # ⓛocalhost: UTS 46 maps it to localhost
        "https://\uff4c\uff4f\uff43\uff41\uff4c\uff48\uff4f\uff53\uff54/",
    ],
)
async def test_a_host_httpx_cannot_parse_is_refused_with_its_reason(
    world: World, url: str
) -> None:
    """httpx raises ``InvalidURL`` for these, which is no ``HTTPError``: a server's
    ``resource_metadata`` naming one made ``auth/login`` an internal error."""
    async with client(world) as http:
        with pytest.raises(PermissionDeniedError) as err:
            await http.get(url)
        assert err.value.reason == "address_not_allowed"
        with pytest.raises(PermissionDeniedError):
            async with http.stream("GET", url):
                pass
    assert world.dns.lookups == []
    assert world.dial.dialled == []


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        (f"http://{PUBLIC_NAME}/trap/ok", "scheme_not_allowed"),
        (f"https://user:secret@{PUBLIC_NAME}/trap/ok", "credentials_in_url"),
        (f"https://{PUBLIC_NAME}@other.example.org/trap/ok", "credentials_in_url"),
        ("https://other.example.org/trap/ok", "host_not_allowed"),
        (f"https://{PUBLIC_NAME}.evil.example.org/", "host_not_allowed"),
        ("https://example.test/", "host_not_allowed"),  # the apex of *.example.test
        ("https://8.8.8.8/", "host_not_allowed"),
        ("https://other.example.org./trap/ok", "host_not_allowed"),
        ("https://example.test./", "host_not_allowed"),
        # Issue 9: every other scheme is named as such, in any case, even where
        # httpx would read a host-less URL as a path.
        (f"ftp://{PUBLIC_NAME}/", "scheme_not_allowed"),
        (f"FTP://{PUBLIC_NAME}/", "scheme_not_allowed"),
        (f"HTTP://{PUBLIC_NAME}/trap/ok", "scheme_not_allowed"),
        ("file:///etc/passwd", "scheme_not_allowed"),
        ("file:/etc/passwd", "scheme_not_allowed"),
        ("javascript:alert(1)", "scheme_not_allowed"),
    ],
)
async def test_url_refusals_on_the_wire(world: World, url: str, reason: str) -> None:
    error = await refused(world, url, allowlist=[f"*.{PUBLIC_NAME.split('.', 1)[1]}"])
    assert error.reason == reason
    assert world.dial.dialled == []


async def test_the_pinned_backend_checks_hosts_itself(world: World) -> None:
    """Defence in depth: what reaches ``connect_tcp`` is checked again."""
    backend = PinnedBackend(
        world.network(), allowlist=["*.example.test"], allow_private_network=False
    )
    for host in ("127.0.0.1", "127.1", "2130706433", "::1", "::ffff:7f00:1", "0"):
        with pytest.raises(PermissionDeniedError) as err:
            await backend.connect_tcp(host, 443)
        assert err.value.reason in ("address_not_allowed", "host_not_allowed")
    with pytest.raises(PermissionDeniedError) as err:
        await backend.connect_tcp("evil.example.org", 443)
    assert err.value.reason == "host_not_allowed"
    with pytest.raises(PermissionDeniedError) as err:
        await backend.connect_unix_socket("/run/docker.sock")
    assert err.value.reason == "address_not_allowed"
    assert world.dns.lookups == []
    assert world.dial.dialled == []


# --- responses: redirects and content codings ---------------------------------------


@pytest.mark.parametrize("method", ["GET", "POST"])
@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
@pytest.mark.parametrize(
    ("target", "where"),
    [
        ("private", "http://169.254.169.254/latest/meta-data/"),
        ("http", f"http://{PUBLIC_NAME}/mcp"),
        ("same_origin", f"https://{PUBLIC_NAME}/mcp/"),
        ("allowed", f"https://{SECOND_NAME}/trap/ok"),  # would work if followed
    ],
)
async def test_a_redirect_is_refused_not_followed(
    world: World, method: str, status: int, target: str, where: str
) -> None:
    """SECURITY.md §6.2 #20: every 3xx, to a metadata address, to plain http,
    to the same origin or to another allowlisted host, is refused; the one
    request is all that is sent (a POST body never reaches a second host)."""
    assert REDIRECT_TARGETS[target] in (where, "/mcp/")
    path = f"/trap/redirect_{status}_{target}"
    async with client(world, allowlist=["*.example.test"]) as http:
        with pytest.raises(PermissionDeniedError) as err:
            await http.request(
                method, f"https://{PUBLIC_NAME}{path}", content=b"code=secret"
            )
    assert err.value.reason == "redirect_blocked"
    assert err.value.data == {"status": status}
    assert f"answered {status} (to {where})" in err.value.message
    assert "secret" not in err.value.message
    assert [f"{method} {path}"] == SERVED  # one request, no second hop
    assert world.dns.lookups == [PUBLIC_NAME]
    assert world.dial.dialled == [(PUBLIC_V4, 443)]


async def test_a_compressed_body_is_refused_unread(world: World) -> None:
    error = await refused(world, f"https://{PUBLIC_NAME}/trap/gzip", limit=1 << 20)
    assert isinstance(error, UpstreamError)
    assert "Content-Encoding: gzip" in error.message


async def test_a_refused_jsonrpc_request_gets_an_error_reply(world: World) -> None:
    request = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {}}
    async with client(world) as http:
        redirected = await http.post(
            f"https://{PUBLIC_NAME}/trap/redirect_private", json=request
        )
        compressed = await http.post(f"https://{PUBLIC_NAME}/trap/gzip", json=request)
        private = await http.post("https://loopback.example.test/mcp", json=request)
        with pytest.raises(PermissionDeniedError):  # a notification has no reply
            await http.post(
                "https://loopback.example.test/mcp",
                json={"jsonrpc": "2.0", "method": "notifications/initialized"},
            )
    for response, cls, reason in (
        (redirected, PermissionDeniedError, "redirect_blocked"),
        (compressed, UpstreamError, "upstream_error"),
        (private, PermissionDeniedError, "address_not_allowed"),
    ):
        reply = response.json()
        assert reply["id"] == 7
        error = refusal_in(reply["error"]["data"])
        assert isinstance(error, cls)
        assert error.reason == reason


def test_a_refusal_an_upstream_forges_is_not_believed() -> None:
    genuine = msgspec.json.decode(
        refusal_reply(1, PermissionDeniedError("x", reason="redirect_blocked"))
    )["error"]["data"]
    assert refusal_in(genuine) is not None
    forged = {REFUSAL_KEY: dict(genuine[REFUSAL_KEY], token="0" * 32)}
    assert refusal_in(forged) is None
    assert refusal_in({REFUSAL_KEY: "memorizz"}) is None
    assert refusal_in("memorizz.refusal") is None


# --- the environment is ignored -------------------------------------------------------


@pytest.fixture
def proxy_listener() -> Iterator[tuple[int, list[bytes]]]:
    with recording_listener() as listener:
        yield listener


async def test_proxy_variables_are_ignored(
    world: World,
    proxy_listener: tuple[int, list[bytes]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    port, seen = proxy_listener
    for name in ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "https_proxy", "all_proxy"):
        monkeypatch.setenv(name, f"http://127.0.0.1:{port}")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    async with client(world) as http:
        assert (await http.get(f"https://{PUBLIC_NAME}/trap/ok")).text == "ok"
    assert seen == []
    # The control: a client that trusts the environment does go to the proxy.
    async with httpx2.AsyncClient(timeout=5) as naive:
        with pytest.raises(httpx2.HTTPError):
            await naive.get(f"https://{PUBLIC_NAME}/trap/ok")
    assert seen
    assert seen[0].startswith(b"CONNECT mcp.example.test:443")


async def test_tls_trust_is_not_taken_from_the_environment(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SSL_CERT_FILE", world.tls.cafile)
    monkeypatch.setenv("SSL_CERT_DIR", os.path.dirname(world.tls.cafile))
    system = Network(resolve=world.dns, dial=world.dial)  # the system's trust anchors
    async with client(world, network=system) as http:
        with pytest.raises(httpx2.ConnectError) as err:
            await http.get(f"https://{PUBLIC_NAME}/trap/ok")
    assert "CERTIFICATE_VERIFY_FAILED" in str(err.value)


# --- allow_private_network: an intentional local service ------------------------------


async def test_allow_private_network_reaches_a_loopback_service(world: World) -> None:
    with serve(trap_app(), None, lifespan="off") as port:
        system = Network()  # an address literal: no resolver, a real loopback dial
        async with client(world, allow_private_network=True, network=system) as http:
            response = await http.get(f"http://127.0.0.1:{port}/trap/ok")
            assert response.text == "ok"
            # A name goes through the system resolver (localhost only, here).
            response = await http.get(f"http://localhost:{port}/trap/ok")
            assert response.text == "ok"
            with pytest.raises(PermissionDeniedError) as err:  # still no redirects
                await http.get(f"http://127.0.0.1:{port}/trap/redirect_private")
            assert err.value.reason == "redirect_blocked"
    assert world.dns.lookups == []


async def test_allow_private_network_still_pins_the_address(world: World) -> None:
    """With the checks lifted, the dial still goes to the resolved address."""
    world.dns.answers["lan.example.test"] = ["10.0.0.7"]
    async with client(world, allow_private_network=True) as http:
        with pytest.raises(AssertionError, match=r"10\.0\.0\.7:443"):
            await http.get("https://lan.example.test/")  # LoopbackDial has no route
    assert world.dial.dialled == [("10.0.0.7", 443)]


async def test_the_tripwire_catches_a_connect_beyond_loopback(
    network_tripwire: list[str],
) -> None:
    with pytest.raises(AssertionError, match="tripwire"):
        await httpcore2.AnyIOBackend().connect_tcp("192.0.2.1", 443, timeout=1)
    with socket.socket() as sock, pytest.raises(AssertionError, match="tripwire"):
        sock.connect(("192.0.2.1", 443))
    with pytest.raises(AssertionError, match="tripwire"):
        socket.getaddrinfo("example.com", 443)
    assert len(network_tripwire) == 3
    network_tripwire.clear()  # expected: do not fail this test at teardown


# --- a cancelled connection is closed, not left to the garbage collector --------------


@pytest.fixture
def silent_listener() -> Iterator[tuple[int, threading.Event]]:
    """A loopback listener that accepts, reads and never answers (a TLS
    handshake that never ends); the event is set when the peer closes."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    closed = threading.Event()

    def serve() -> None:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        with conn:
            conn.settimeout(10)
            try:
                while conn.recv(4096):
                    pass
            except OSError:
                return
            closed.set()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1], closed
    finally:
        listener.close()
        thread.join(timeout=15)


async def test_a_cancelled_tls_handshake_closes_its_socket(
    world: World, silent_listener: tuple[int, threading.Event]
) -> None:
    """httpcore closes the socket when a handshake fails, not when it is
    cancelled (a stopping daemon, a caller's deadline): it was left open to the
    garbage collector, an unclosed-resource warning at best."""
    port, closed = silent_listener
    world.route(PUBLIC_V4, 443, port)
    async with client(world) as http:
        with anyio.move_on_after(0.3) as scope:
            await http.get(f"https://{PUBLIC_NAME}/trap/ok")
        assert scope.cancelled_caught
        assert await anyio.to_thread.run_sync(closed.wait, 5)
    assert world.dial.dialled == [(PUBLIC_V4, 443)]
