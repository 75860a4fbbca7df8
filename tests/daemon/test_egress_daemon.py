"""Egress through the real daemon: ``servers/add`` refusals with their reasons,
connect-time refusals in ``last_error``, and a full MCP session (Streamable
HTTP and SSE) with an allowlisted public name over verified TLS.

The daemon's hardened clients use ``DEFAULT_NETWORK``; these tests replace it
with the fake DNS and the loopback dial of ``egress_world``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from memorizz.api.errors import (
    InvalidParamsError,
    PermissionDeniedError,
    RemoteError,
    UnavailableError,
    UpstreamError,
)
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
    mcp_app,
    serve,
    tls_material,
    trap_app,
)
from tests.harness import DaemonHarness, daemon_config, wait_until

SSE_NAME = "sse.example.test"
SSE_V4 = "8.8.4.4"
ALLOWLIST = ["*.example.test"]


@pytest.fixture(scope="module")
def tls() -> Iterator[TLS]:
    with tls_material() as material:
        yield material


@pytest.fixture(scope="module")
def ports(tls: TLS) -> Iterator[dict[str, int]]:
    """The test MCP server over HTTPS on loopback, both transports."""
    with (
        serve(trap_app(mcp_app("streamable_http")), tls) as streamable,
        serve(trap_app(mcp_app("sse", host=SSE_NAME)), tls) as sse,
    ):
        yield {"streamable_http": streamable, "sse": sse}


@pytest.fixture
def world(tls: TLS, ports: dict[str, int], monkeypatch: pytest.MonkeyPatch) -> World:
    dns = FakeDNS(
        {
            PUBLIC_NAME: [PUBLIC_V4],
            SSE_NAME: [SSE_V4],
            "private.example.test": ["10.0.0.1"],
            "mixed.example.test": [PUBLIC_V4, "10.0.0.1"],
            "metadata.example.test": ["169.254.169.254"],
        }
    )
    world = World(tls, dns, LoopbackDial())
    world.route(PUBLIC_V4, 443, ports["streamable_http"])
    world.route(SSE_V4, 443, ports["sse"])
    monkeypatch.setattr(egress_client, "DEFAULT_NETWORK", world.network())
    return world


@pytest.fixture
def daemon(base_dir: str, world: World) -> Iterator[DaemonHarness]:
    """A daemon that may reach ``*.example.test`` only."""
    config = daemon_config(base_dir, host_allowlist=ALLOWLIST)
    with DaemonHarness.running(config) as harness:
        yield harness


def http_spec(name: str, url: str, **fields: Any) -> ServerSpec:
    transport = "sse" if "/sse" in url else "streamable_http"
    return ServerSpec(name=name, transport=transport, url=url, **fields)


URLS = {
    "streamable_http": f"https://{PUBLIC_NAME}/mcp",
    "sse": f"https://{SSE_NAME}/sse",
}


@pytest.mark.parametrize("transport", ["streamable_http", "sse"])
def test_an_allowlisted_public_name_works_end_to_end(
    daemon: DaemonHarness, world: World, transport: str
) -> None:
    daemon.add(http_spec("pub", URLS[transport]))
    with daemon.client() as c:
        assert c.call_tool("pub", "echo", {"text": "hi"}).content[0]["text"] == "hi"
        assert c.call_tool("pub", "add", {"a": 2, "b": 3}).structured_content == {
            "result": 5
        }
        status = c.server_status("pub")[0]
        assert status.state == "ready"
        assert status.server_name == "memorizz-test-server"
        c.remove_server("pub")
    name, address = (
        (PUBLIC_NAME, PUBLIC_V4)
        if transport == "streamable_http"
        else (SSE_NAME, SSE_V4)
    )
    assert set(world.dns.lookups) == {name}
    assert world.dial.dialled
    assert set(world.dial.dialled) == {(address, 443)}


def test_a_redirect_or_a_compressed_body_fails_one_call_not_the_session(
    daemon: DaemonHarness,
) -> None:
    daemon.add(http_spec("pub", URLS["streamable_http"]))
    with daemon.client() as c:
        for tool in ("__redirect_private", "__redirect_http", "__redirect_same_origin"):
            with pytest.raises(PermissionDeniedError) as err:
                c.call_tool("pub", tool, {})
            assert err.value.reason == "redirect_blocked"
        with pytest.raises(UpstreamError) as upstream:
            c.call_tool("pub", "__gzip", {})
        assert "Content-Encoding: gzip" in upstream.value.message
        assert (
            c.call_tool("pub", "echo", {"text": "still"}).content[0]["text"] == "still"
        )
        status = c.server_status("pub")[0]
        assert (status.state, status.restarts) == ("ready", 0)
        c.remove_server("pub")


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        (f"http://{PUBLIC_NAME}/mcp", "scheme_not_allowed"),
        # Issue 9: these answered invalid_params.
        (f"ftp://{PUBLIC_NAME}/mcp", "scheme_not_allowed"),
        (f"FTP://{PUBLIC_NAME}/mcp", "scheme_not_allowed"),
        ("file:///etc/passwd", "scheme_not_allowed"),
        ("FILE:///etc/passwd", "scheme_not_allowed"),
        ("file:/etc/passwd", "scheme_not_allowed"),
        ("javascript:alert(1)", "scheme_not_allowed"),
        (f"HTTP://{PUBLIC_NAME}/mcp", "scheme_not_allowed"),
        (f"https://user:secret@{PUBLIC_NAME}/mcp", "credentials_in_url"),
        (f"https://{PUBLIC_NAME}@evil.example.org/mcp", "credentials_in_url"),
        ("https://evil.example.org/mcp", "host_not_allowed"),
        # HTTPS:// is https (test_a_trailing_dot_or_an_upper_case_url_connects):
        # past the scheme, the host rules apply as usual.
        ("HTTPS://evil.example.org/mcp", "host_not_allowed"),
        ("HTTPS://127.0.0.1/mcp", "address_not_allowed"),
        ("https://example.test/mcp", "host_not_allowed"),
        (f"https://{PUBLIC_NAME}.evil.example.org/mcp", "host_not_allowed"),
        ("https://127.0.0.1/mcp", "address_not_allowed"),
        ("https://2130706433/mcp", "address_not_allowed"),
        ("https://0x7f.1/mcp", "address_not_allowed"),
        ("https://[::ffff:7f00:1]/mcp", "address_not_allowed"),
        ("https://169.254.169.254/latest/meta-data/", "address_not_allowed"),
        ("https://localhost/mcp", "address_not_allowed"),
        (f"https://{PUBLIC_NAME}/mcp#frag", "invalid_params"),
        (f"https://{PUBLIC_NAME}%00.evil.example.org/mcp", "invalid_params"),
    ],
)
def test_servers_add_refuses_with_the_reason(
    daemon: DaemonHarness, world: World, url: str, reason: str
) -> None:
    with daemon.client() as c:
        with pytest.raises(RemoteError) as err:
            c.add_server(http_spec("bad", url))
        assert err.value.reason == reason
        assert isinstance(
            err.value,
            InvalidParamsError if reason == "invalid_params" else PermissionDeniedError,
        )
        assert "secret" not in err.value.message
        assert [s.name for s in c.list_servers()] == []
    assert world.dns.lookups == []
    assert world.dial.dialled == []


def test_servers_add_refuses_the_whole_bypass_table(
    daemon: DaemonHarness, world: World
) -> None:
    """SECURITY.md §6.2 #18: every address literal and local name of §2.6
    (``test_egress.ADDRESS_NOT_ALLOWED``), through the operator's
    ``servers/add``, on both transports; test_oauth_discovery runs the same
    table through discovery URLs."""
    reasons: dict[str, str] = {}
    with daemon.client() as c:
        for transport in ("streamable_http", "sse"):
            for url in ADDRESS_NOT_ALLOWED:
                spec = ServerSpec(name="bad", transport=transport, url=url)
                with pytest.raises(PermissionDeniedError) as err:
                    c.add_server(spec)
                reasons[f"{transport} {url}"] = err.value.reason
        assert c.list_servers() == []
    assert reasons == dict.fromkeys(reasons, "address_not_allowed")
    assert len(reasons) == 2 * len(ADDRESS_NOT_ALLOWED)
    assert world.dns.lookups == []
    assert world.dial.dialled == []


@pytest.mark.parametrize("transport", ["streamable_http", "sse"])
@pytest.mark.parametrize("spelling", ["trailing_dot", "upper_case"])
def test_a_trailing_dot_or_an_upper_case_url_connects(
    daemon: DaemonHarness, world: World, transport: str, spelling: str
) -> None:
    """Issue 9: ``https://mcp.example.test./mcp`` failed TLS (and the server's
    Host check); ``HTTPS://...`` was refused as invalid_params."""
    url = URLS[transport]
    if spelling == "trailing_dot":
        host = url.split("/")[2]
        url = url.replace(host, host + ".", 1)
    else:
        url = url.replace("https://", "HTTPS://", 1)
    daemon.add(http_spec("pub", url))
    with daemon.client() as c:
        assert c.call_tool("pub", "echo", {"text": "hi"}).content[0]["text"] == "hi"
        assert c.server_status("pub")[0].state == "ready"
        c.remove_server("pub")
    name = PUBLIC_NAME if transport == "streamable_http" else SSE_NAME
    assert set(world.dns.lookups) == {name}


def test_allow_private_network_takes_http_and_still_pins_the_address(
    daemon: DaemonHarness, world: World
) -> None:
    """An intentional local service: plain HTTP, found by name, dialled at the
    address the name resolved to."""
    with serve(trap_app(mcp_app("streamable_http")), None) as port:
        world.route(PUBLIC_V4, 8080, port)
        spec = http_spec(
            "lan", f"http://{PUBLIC_NAME}:8080/mcp", allow_private_network=True
        )
        daemon.add(spec)
        with daemon.client() as c:
            assert c.call_tool("lan", "echo", {"text": "x"}).content[0]["text"] == "x"
            c.remove_server("lan")
    assert set(world.dial.dialled) == {(PUBLIC_V4, 8080)}


def wait_for_refusal(daemon: DaemonHarness, name: str, reason: str) -> str:
    with daemon.client() as c:

        def refused() -> bool:
            status = c.server_status(name)[0]
            return status.state in ("backoff", "failed") and reason in (
                status.last_error or ""
            )

        wait_until(refused, what=f"{name}: {reason} in last_error")
        return c.server_status(name)[0].last_error or ""


@pytest.mark.parametrize(
    "host", ["private.example.test", "mixed.example.test", "metadata.example.test"]
)
def test_a_denied_address_at_connect_reaches_last_error_and_callers(
    daemon: DaemonHarness, world: World, host: str
) -> None:
    with daemon.client() as c:
        c.add_server(
            http_spec("p", f"https://{host}/mcp")
        )  # a name: checked at connect
    error = wait_for_refusal(daemon, "p", "address_not_allowed")
    assert host in error
    with daemon.client() as c:
        started = time.monotonic()
        with pytest.raises(UnavailableError) as err:
            c.call_tool("p", "echo", {"text": "x"})
        assert time.monotonic() - started < 6  # at most connect_wait_s
        assert err.value.reason == "server_unavailable"
        assert "address_not_allowed" in err.value.message
        c.remove_server("p")
    assert world.dial.dialled == []


@pytest.mark.parametrize(
    "url",
    [
        f"https://{PUBLIC_NAME}/trap/redirect_private",
        f"https://{PUBLIC_NAME}/trap/redirect_http",
        f"https://{SSE_NAME}/trap/redirect_private?/sse",  # the SSE GET itself
    ],
)
def test_a_redirect_at_connect_reaches_last_error(
    daemon: DaemonHarness, world: World, url: str
) -> None:
    with daemon.client() as c:
        c.add_server(http_spec("r", url))
    error = wait_for_refusal(daemon, "r", "redirect_blocked")
    assert "never followed" in error
    assert all(address in (PUBLIC_V4, SSE_V4) for address, _ in world.dial.dialled)


def test_config_servers_are_checked_again_at_connect(
    base_dir: str, world: World
) -> None:
    """The allowlist may have changed since a server was configured or stored."""
    servers = [
        http_spec("evil", "https://evil.example.org/mcp"),
        http_spec("plain", f"http://{PUBLIC_NAME}/mcp"),
        http_spec("pub", f"https://{PUBLIC_NAME}/mcp"),
    ]
    config = daemon_config(base_dir, servers=servers, host_allowlist=ALLOWLIST)
    with DaemonHarness.running(config) as harness:
        assert "host_not_allowed" in wait_for_refusal(
            harness, "evil", "host_not_allowed"
        )
        wait_for_refusal(harness, "plain", "scheme_not_allowed")
        harness.wait_ready("pub")
    assert "evil.example.org" not in world.dns.lookups


# --- the legacy SSE stream's endpoint event (issue 9) ---------------------------------


def wait_for_failure(daemon: DaemonHarness, name: str, text: str) -> tuple[str, float]:
    """The server's ``last_error`` once it holds ``text``, and the seconds it took."""
    started = time.monotonic()
    error = wait_for_refusal(daemon, name, text)
    return error, time.monotonic() - started


@pytest.mark.parametrize(
    ("trap", "shown"),
    [
        ("sse_foreign", "https://evil.example.test"),
        ("sse_foreign_http", f"http://{SSE_NAME}"),
        ("sse_foreign_port", f"https://{SSE_NAME}:8443"),
        ("sse_foreign_relative", "https://evil.example.test"),
    ],
)
def test_an_sse_endpoint_on_another_origin_fails_at_once(
    daemon: DaemonHarness, world: World, trap: str, shown: str
) -> None:
    """It left the server ``connecting`` for as long as the stream stayed open."""
    spec = ServerSpec(
        name="s", transport="sse", url=f"https://{SSE_NAME}/trap/{trap}", timeout_s=60
    )
    with daemon.client() as c:
        c.add_server(spec)
    error, took = wait_for_failure(daemon, "s", "redirect_blocked")
    assert took < 10  # generous: it fails on the first event, not on a timeout
    assert error.startswith("redirect_blocked: the SSE endpoint event names")
    assert repr(shown) in error
    with daemon.client() as c:
        assert c.test_server("s").outcome == "refused_by_policy"
        c.remove_server("s")
    assert {address for address, _ in world.dial.dialled} == {SSE_V4}


@pytest.mark.parametrize(
    ("trap", "timeout_s", "text"),
    [
        ("sse_message_first", 60, "a message before its endpoint event"),
        ("sse_closed", 60, "closed before its endpoint event"),
        ("sse_silent", 1, "within 1 s"),  # only keep-alives: bounded by timeout_s
    ],
)
def test_an_sse_stream_without_a_usable_endpoint_fails_within_its_timeout(
    daemon: DaemonHarness, trap: str, timeout_s: float, text: str
) -> None:
    spec = ServerSpec(
        name="s",
        transport="sse",
        url=f"https://{SSE_NAME}/trap/{trap}",
        timeout_s=timeout_s,
    )
    with daemon.client() as c:
        c.add_server(spec)
    error, took = wait_for_failure(daemon, "s", text)
    assert took < 10
    with daemon.client() as c:
        # never ready; after a 0.05 s backoff it may already be trying again
        assert c.server_status("s")[0].state != "ready"
        c.remove_server("s")
    assert error
