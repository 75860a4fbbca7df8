"""The SSRF battery: every bypass class of SECURITY.md §2.6 against the
hardened client on the wire, and the §2.5 deny table entry by entry.

Each class, and where it is tested (here unless named):

* IPv4 in decimal, octal, hex and short forms: refused before any lookup, with
  and without ``allow_private_network``, in ``https://`` and ``http://``
  URLs, and where httpcore hands the host to the pinned backend; the public
  ones too (``134744072`` is 8.8.8.8): a host is an address only as a dotted
  quad. test_egress.py has the policy table.
* IPv6 embeddings of a denied IPv4 address (mapped, compatible, translated,
  NAT64, 6to4, Teredo), as literals and as DNS answers.
* IPv6 zones and brackets; userinfo; percent-encoded hosts; IDNA, full-width
  dots and ignorable code points; trailing dots and letter case in hosts and
  in allowlist patterns.
* DNS answers that mix allowed and denied addresses, and rebinding to each
  denied class between two connections; the dial goes to a checked address.
* Redirects: every 3xx, not only the five httpx follows (test_egress_client.py
  has those); in OAuth discovery, token and refresh requests:
  test_oauth_discovery.py.
* Proxy variables for ``http://`` (``HTTP_PROXY``, ``ALL_PROXY``, an empty
  ``NO_PROXY``); ``HTTPS_PROXY``: test_egress_client.py.
* ``0.0.0.0`` and ``::``, broadcast, multicast, cloud metadata names and
  addresses; the metadata endpoints are refused even with
  ``allow_private_network``.
* The same flows through the system resolver (glibc ``getaddrinfo``) and real
  sockets, in a network namespace of the test's own (``unshare -rnm``): a DNS
  server on its loopback, the "public" addresses on its ``lo``, no other
  interface, so no packet can leave even if the guard were broken.

Only the DNS answer is fake (``FakeDNS``, or ``TinyDNS`` in the namespace);
``LoopbackDial`` maps the checked public addresses to a loopback server and
refuses anything else, and the conftest tripwire fails a test that reaches for
anything but loopback.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from ipaddress import IPv4Address, IPv4Network, ip_address, ip_network
from pathlib import Path
from typing import Any

import anyio
import httpcore2
import httpx2
import msgspec
import pytest

from memorizz.api.errors import (
    InvalidParamsError,
    PermissionDeniedError,
    RemoteError,
)
from memorizzd.egress.addresses import address_allowed
from memorizzd.egress.backend import Network, PinnedBackend, hosts_file_addresses
from memorizzd.egress.client import hardened_client
from memorizzd.egress.urls import check_url
from tests.egress_world import (
    PUBLIC_NAME,
    PUBLIC_V4,
    PUBLIC_V6,
    SECOND_V4,
    TLS,
    FakeDNS,
    LoopbackDial,
    TinyDNS,
    World,
    client,
    make_tls,
    recording_listener,
    refused,
    serve,
    tls_material,
    trap_app,
)

pytestmark = pytest.mark.anyio

ANSWERS: dict[str, Any] = {
    PUBLIC_NAME: [PUBLIC_V4],
    "second.example.test": [SECOND_V4],
    "lan.example.test": ["127.0.0.1"],  # for allow_private_network
}


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, Any]]:
    return "asyncio", {"use_uvloop": True}


@pytest.fixture(scope="module")
def tls() -> Iterator[TLS]:
    with tls_material() as material:
        yield material


SERVED: list[str] = []


@pytest.fixture(scope="module")
def https_port(tls: TLS) -> Iterator[int]:
    with serve(trap_app(log=SERVED), tls, lifespan="off") as port:
        yield port


@pytest.fixture
def world(tls: TLS, https_port: int) -> World:
    world = World(tls, FakeDNS(dict(ANSWERS)), LoopbackDial())
    world.route(PUBLIC_V4, 443, https_port)
    world.route(SECOND_V4, 443, https_port)
    SERVED.clear()
    return world


async def refusal(world: World, url: str, **overrides: Any) -> RemoteError:
    """The refusal of ``GET url``; nothing was looked up or dialled."""
    error = await refused(world, url, **overrides)
    assert world.dns.lookups == []
    assert world.dial.dialled == []
    return error


# --- IPv4 in every spelling -----------------------------------------------------------

NUMERIC_HOSTS = {
    # host: the address inet_aton (glibc's getaddrinfo, curl, browsers) reads
    "2130706433": "127.0.0.1",
    "0x7f.1": "127.0.0.1",
    "017700000001": "127.0.0.1",
    "0177.0.0.1": "127.0.0.1",
    "0x7f000001": "127.0.0.1",
    "0x7f.0x0.0x0.0x1": "127.0.0.1",
    "127.1": "127.0.0.1",
    "127.0.1": "127.0.0.1",
    "127.0.0.01": "127.0.0.1",
    "0": "0.0.0.0",  # noqa: S104 - an address under test, not a bind
    "2852039166": "169.254.169.254",
    "0xa9fea9fe": "169.254.169.254",
    "0251.0376.0251.0376": "169.254.169.254",
    "169.254.43518": "169.254.169.254",
    "0xa9.0xfe.0xa9.0xfe": "169.254.169.254",
    "167772161": "10.0.0.1",
    "10.1": "10.0.0.1",
    "4294967295": "255.255.255.255",
    # Public, but not a dotted quad: refused all the same (never resolved).
    "134744072": "8.8.8.8",
    "0x8.0x8.0x8.0x8": "8.8.8.8",
    "8.8.2056": "8.8.8.8",
}


@pytest.mark.parametrize("host", NUMERIC_HOSTS)
def test_the_numeric_spellings_are_what_the_resolver_reads(host: str) -> None:
    """The table's premise, from the C library itself (pure parsing)."""
    assert str(IPv4Address(socket.inet_aton(host))) == NUMERIC_HOSTS[host]


@pytest.mark.parametrize("private", [False, True], ids=["default", "private"])
@pytest.mark.parametrize("scheme", ["https", "http"])
@pytest.mark.parametrize("host", NUMERIC_HOSTS)
async def test_a_numeric_host_in_any_spelling_is_refused_unresolved(
    world: World, host: str, scheme: str, private: bool
) -> None:
    for suffix in ("", "."):
        error = await refusal(
            world, f"{scheme}://{host}{suffix}/", allow_private_network=private
        )
        if scheme == "http" and not private:
            assert error.reason == "scheme_not_allowed"
        else:
            assert error.reason == "address_not_allowed", error.message


@pytest.mark.parametrize("private", [False, True], ids=["default", "private"])
async def test_the_backend_refuses_numeric_hosts_as_httpcore_hands_them(
    world: World, private: bool
) -> None:
    """Defence in depth: the host httpcore passes to ``connect_tcp``."""
    backend = PinnedBackend(
        world.network(), allowlist=[], allow_private_network=private
    )
    for host in NUMERIC_HOSTS:
        with pytest.raises(PermissionDeniedError) as err:
            await backend.connect_tcp(host, 443)
        assert err.value.reason == "address_not_allowed"
    assert world.dns.lookups == []
    assert world.dial.dialled == []


# --- IPv6 that wraps a denied IPv4 address -----------------------------------------------

EMBEDDED = [
    "::ffff:169.254.169.254",  # IPv4-mapped
    "::ffff:a9fe:a9fe",
    "0:0:0:0:0:ffff:a9fe:a9fe",
    "::ffff:127.0.0.1",
    "::ffff:10.0.0.1",
    "::169.254.169.254",  # IPv4-compatible
    "::a9fe:a9fe",
    "::ffff:0:169.254.169.254",  # IPv4-translated (SIIT)
    "64:ff9b::a9fe:a9fe",  # NAT64
    "64:ff9b::169.254.169.254",
    "64:ff9b::7f00:1",
    "64:ff9b:1::a9fe:a9fe",  # NAT64 local use
    "2002:a9fe:a9fe::",  # 6to4
    "2002:a9fe:a9fe::1",
    "2002:7f00:1::",
    "2001:0:4136:e378:8000:63bf:5601:5601",  # Teredo: client 169.254.169.254
    "2001:0:a9fe:a9fe::1",  # Teredo: server 169.254.169.254
]


EMBEDDED_METADATA = [
    "::ffff:169.254.169.254",
    "::ffff:a9fe:a9fe",
    "0:0:0:0:0:ffff:a9fe:a9fe",
    "::169.254.169.254",
    "::a9fe:a9fe",
    "::ffff:0:169.254.169.254",
    "64:ff9b::a9fe:a9fe",
    "64:ff9b::169.254.169.254",
    "2002:a9fe:a9fe::",
    "2002:a9fe:a9fe::1",
    "2001:0:4136:e378:8000:63bf:5601:5601",  # Teredo's client is XORed
]
"""The wrappings of 169.254.169.254 that unwrap to it (mapped, compatible,
translated, NAT64 /96, 6to4, Teredo client)."""


@pytest.mark.parametrize(
    ("address", "private"),
    [(a, False) for a in EMBEDDED] + [(a, True) for a in EMBEDDED_METADATA],
)
async def test_an_embedded_denied_ipv4_literal_is_refused(
    world: World, address: str, private: bool
) -> None:
    """With ``allow_private_network`` the deny table is lifted, but not for
    the cloud metadata address, however it is wrapped."""
    error = await refusal(world, f"https://[{address}]/", allow_private_network=private)
    assert error.reason == "address_not_allowed"


@pytest.mark.parametrize("address", EMBEDDED)
async def test_an_embedded_denied_ipv4_answer_is_refused(
    world: World, address: str
) -> None:
    world.dns.answers["wrapped.example.test"] = [PUBLIC_V4, address]
    async with client(world) as http:
        with pytest.raises(PermissionDeniedError) as err:
            await http.get("https://wrapped.example.test/trap/ok")
    assert err.value.reason == "address_not_allowed"
    assert world.dial.dialled == []  # not even the public address


# --- zones, brackets, userinfo, escapes ----------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "https://[fe80::1%25eth0]/",
        "https://[fe80::a9fe:a9fe%25eth0]/",
        "https://[::1%25lo]/",
        "https://[::ffff:127.0.0.1%251]/",
        "https://[2001:4860:4860::8888%25eth0]/",  # public, with a zone
        "https://[::%31]/",
        "https://[127.0.0.1]/",
        "https://[0x7f.1]/",
        "https://[::1]]/",
        "https://[[::1]]/",
        "https://[::1/",
        "https://::1/",
        "https://[v1.fe80::1]/",  # IPvFuture
    ],
)
@pytest.mark.parametrize("private", [False, True], ids=["default", "private"])
async def test_zones_and_broken_brackets_are_refused(
    world: World, url: str, private: bool
) -> None:
    error = await refusal(world, url, allow_private_network=private)
    assert isinstance(error, PermissionDeniedError | InvalidParamsError)
    if isinstance(error, PermissionDeniedError):
        assert error.reason == "address_not_allowed"


async def test_the_backend_refuses_a_zone_however_it_is_spelt(world: World) -> None:
    backend = PinnedBackend(world.network(), allowlist=[], allow_private_network=True)
    for host in ("fe80::1%eth0", "fe80::1%25eth0", "::1%lo", "::ffff:7f00:1%1"):
        with pytest.raises(PermissionDeniedError) as err:
            await backend.connect_tcp(host, 443)
        assert err.value.reason == "address_not_allowed"
    assert world.dial.dialled == []


async def test_a_zoned_dns_answer_is_refused(world: World) -> None:
    world.dns.answers["zoned.example.test"] = [PUBLIC_V4, "2001:4860:4860::8888%eth0"]
    async with client(world) as http:
        with pytest.raises(PermissionDeniedError) as err:
            await http.get("https://zoned.example.test/")
    assert err.value.reason == "address_not_allowed"
    assert world.dial.dialled == []


@pytest.mark.parametrize(
    "url",
    [
        "http://allowed@169.254.169.254/",
        f"http://{PUBLIC_NAME}@127.0.0.1/",
        f"http://{PUBLIC_NAME}:443@127.0.0.1/",
        f"https://{PUBLIC_NAME}%2f@127.0.0.1/",
        f"https://{PUBLIC_NAME}%40127.0.0.1/",
        f"https://127.0.0.1%40{PUBLIC_NAME}/",
        f"https://{PUBLIC_NAME}\\@127.0.0.1/",
        f"https://127.0.0.1\\@{PUBLIC_NAME}/",
        f"https://127.0.0.1#@{PUBLIC_NAME}/",
        f"https://127.0.0.1?@{PUBLIC_NAME}/",
        f"https://:@{PUBLIC_NAME}/",
    ],
)
@pytest.mark.parametrize("private", [False, True], ids=["default", "private"])
async def test_userinfo_tricks_are_refused(
    world: World, url: str, private: bool
) -> None:
    error = await refusal(
        world, url, allowlist=[PUBLIC_NAME], allow_private_network=private
    )
    assert error.reason in (
        "credentials_in_url",
        "invalid_params",
        "address_not_allowed",
        "host_not_allowed",
        "scheme_not_allowed",
    )


@pytest.mark.parametrize(
    "url",
    [
        "https://mcp%2eexample.test/",
        "https://%6dcp.example.test/",
        "https://loc%61lhost/",
        "https://127%2e0%2e0%2e1/",
        "https://%31%32%37.0.0.1/",
        "https://mcp.example.test%00/",
        "https://mcp.example.test%00.evil.example.org/",
        "https://localhost%00.mcp.example.test/",
    ],
)
@pytest.mark.parametrize("private", [False, True], ids=["default", "private"])
async def test_percent_encoded_hosts_are_refused(
    world: World, url: str, private: bool
) -> None:
    error = await refusal(
        world, url, allowlist=["*.example.test"], allow_private_network=private
    )
    assert error.reason in ("invalid_params", "address_not_allowed")


# --- IDNA, full-width dots, trailing dots, letter case ----------------------------------

LOCAL_LOOKALIKES = [
    "https://127\u30020\u30020\u30021/",  # ideographic full stop
    "https://127\uff0e0\uff0e0\uff0e1/",  # full-width full stop
    "https://127\uff610\uff610\uff611/",  # half-width ideographic full stop
    "https://\uff11\uff12\uff17\uff0e\uff10\uff0e\uff10\uff0e\uff11/",  # full-width
    "https://\u2460\u2461\u2466.0.0.1/",  # circled digits
    "https://169\u3002254\u3002169\u3002254/",
    "https://localhost\u3002/",
    "https://\uff4c\uff4f\uff43\uff41\uff4c\uff48\uff4f\uff53\uff54\uff0e/",
    "https://localho\u00adst/",  # a soft hyphen is ignored (UTS 46)
    "https://LOCALHOST\u3002/",
    "https://\u24db\u24de\u24d2\u24d0\u24db\u24d7\u24de\u24e2\u24e3/",
]


@pytest.mark.parametrize("url", LOCAL_LOOKALIKES)
async def test_unicode_spellings_of_local_hosts_are_refused(
    world: World, url: str
) -> None:
    error = await refusal(world, url)
    assert error.reason == "address_not_allowed", error.message


@pytest.mark.parametrize(
    "url",
    [
        "https://mcp\u3002example\u3002test/trap/headers",
        "https://mcp\uff0eexample\uff0etest\uff0e/trap/headers",
        "https://MCP.Example.TEST./trap/headers",
        "HTTPS://mcp.EXAMPLE.test:443/trap/headers",
    ],
)
@pytest.mark.parametrize(
    "pattern", [PUBLIC_NAME, "MCP.Example.Test.", "*.EXAMPLE.test", "*.example.test."]
)
async def test_unicode_dots_case_and_a_trailing_dot_reach_the_allowed_host(
    world: World, url: str, pattern: str
) -> None:
    try:
        async with client(world, allowlist=[pattern]) as http:
            response = await http.get(url)
    except InvalidParamsError:
        # httpx cannot send every name the policy reads (full-width dots):
        # refused, never sent anywhere else.
        assert world.dial.dialled == []
        return
    assert response.json()["host"].removesuffix(":443") == PUBLIC_NAME
    assert world.dns.lookups == [PUBLIC_NAME]
    assert world.dial.dialled == [(PUBLIC_V4, 443)]


@pytest.mark.parametrize(
    ("url", "pattern"),
    [
        ("https://evil.example.org./", PUBLIC_NAME),
        ("https://mcp.example.test.evil.example.org./", PUBLIC_NAME),
        ("https://example.test./", "*.example.test"),
        ("https://mcp.example.test/", "mcp.example.test.evil.example.org"),
        ("https://mcp.example.test/", "mcp.example.test.."),
        ("https://mcp.example.test/", "*.mcp.example.test"),
        ("https://xmcp.example.test/", PUBLIC_NAME),
        ("https://mcp\u3002example\u3002org/", PUBLIC_NAME),
        ("https://\uff4d\uff43\uff50.example.org/", PUBLIC_NAME),
        ("https://8.8.8.8/", "*.8.8.8"),
        ("https://8.8.8.8/", "*.8"),
    ],
)
async def test_normalisation_never_widens_the_allowlist(
    world: World, url: str, pattern: str
) -> None:
    error = await refusal(world, url, allowlist=[pattern])
    assert error.reason in ("host_not_allowed", "invalid_params")


# --- DNS: mixed answers, rebinding, the pin -------------------------------------------------

DENIED_ANSWERS = [
    "127.0.0.1",
    "10.0.0.1",
    "169.254.169.254",
    "100.100.100.200",
    "168.63.129.16",  # Azure WireServer: a public address
    "0.0.0.0",  # noqa: S104 - a DNS answer, not a bind
    "255.255.255.255",
    "224.0.0.251",
    "239.255.255.250",
    "::",
    "::1",
    "fd00:ec2::254",
    "fe80::1",
    "ff02::fb",
    "ff05::1:3",
    "::ffff:a9fe:a9fe",
    "64:ff9b::a9fe:a9fe",
    "2002:a9fe:a9fe::",
]


@pytest.mark.parametrize("denied", DENIED_ANSWERS)
@pytest.mark.parametrize("first", [True, False], ids=["denied-first", "denied-last"])
async def test_one_denied_answer_among_public_ones_fails_the_name(
    world: World, denied: str, first: bool
) -> None:
    answer = [PUBLIC_V4, PUBLIC_V6]
    world.dns.answers["mixed.example.test"] = (
        [denied, *answer]
        if first
        else [
            *answer,
            denied,
        ]
    )
    async with client(world) as http:
        with pytest.raises(PermissionDeniedError) as err:
            await http.get("https://mixed.example.test/trap/ok")
    assert err.value.reason == "address_not_allowed"
    assert ip_address(denied).compressed in err.value.message
    assert world.dns.lookups == ["mixed.example.test"]
    assert world.dial.dialled == []


@pytest.mark.parametrize("denied", DENIED_ANSWERS)
async def test_rebinding_to_a_denied_address_is_refused_at_the_next_connection(
    world: World, denied: str
) -> None:
    world.dns.answers["rebind.example.test"] = [[PUBLIC_V4], [PUBLIC_V4, denied]]
    async with client(world) as http:
        first = await http.get("https://rebind.example.test/trap/close")
        assert first.text == "ok"
        with pytest.raises(PermissionDeniedError) as err:
            await http.get("https://rebind.example.test/trap/ok")
    assert err.value.reason == "address_not_allowed"
    assert world.dns.lookups == ["rebind.example.test"] * 2
    assert world.dial.dialled == [(PUBLIC_V4, 443)]


async def test_each_connection_dials_an_address_of_its_own_lookup(
    world: World,
) -> None:
    """A second answer that is public but different is dialled as answered:
    the address checked is the address dialled, never the name."""
    world.dns.answers["moving.example.test"] = [[PUBLIC_V4], [SECOND_V4]]
    async with client(world) as http:
        assert (await http.get("https://moving.example.test/trap/close")).text == "ok"
        assert (await http.get("https://moving.example.test/trap/ok")).text == "ok"
    assert world.dial.dialled == [(PUBLIC_V4, 443), (SECOND_V4, 443)]


# --- redirects: every 3xx ----------------------------------------------------------------


@pytest.mark.parametrize("status", [300, 304, 305, 306, 309, 399])
@pytest.mark.parametrize("target", ["private", "allowed"])
async def test_every_3xx_is_refused_not_only_those_httpx_follows(
    world: World, status: int, target: str
) -> None:
    path = f"/trap/redirect_{status}_{target}"
    async with client(world, allowlist=["*.example.test"]) as http:
        with pytest.raises(PermissionDeniedError) as err:
            await http.get(f"https://{PUBLIC_NAME}{path}")
    assert err.value.reason == "redirect_blocked"
    assert [f"GET {path}"] == SERVED
    assert world.dial.dialled == [(PUBLIC_V4, 443)]


# --- proxies for http:// ------------------------------------------------------------------


@pytest.fixture
def proxy_listener() -> Iterator[tuple[int, list[bytes]]]:
    with recording_listener() as listener:
        yield listener


async def test_http_proxy_variables_do_not_route_plain_http(
    world: World,
    proxy_listener: tuple[int, list[bytes]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``allow_private_network`` allows ``http://``: ``HTTP_PROXY`` (also as
    set by a CGI ``Proxy:`` header, httpoxy) and ``ALL_PROXY`` would take such
    requests to a proxy that resolves and connects as it likes."""
    port, seen = proxy_listener
    proxy = f"http://127.0.0.1:{port}"
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(name, proxy)
    monkeypatch.setenv("NO_PROXY", "")
    monkeypatch.setenv("no_proxy", "")
    with serve(trap_app(), None, lifespan="off") as plain:
        world.route("127.0.0.1", plain, plain)
        async with client(world, allow_private_network=True) as http:
            response = await http.get(f"http://lan.example.test:{plain}/trap/ok")
        assert response.text == "ok"
        assert seen == []
        assert world.dial.dialled == [("127.0.0.1", plain)]
        # The control: a client that trusts the environment goes to the proxy.
        async with httpx2.AsyncClient(timeout=5) as naive:
            with contextlib.suppress(httpx2.HTTPError):
                await naive.get(f"http://lan.example.test:{plain}/trap/ok")
    assert seen
    assert seen[0].startswith(b"GET http://lan.example.test:")


# --- 0.0.0.0, ::, broadcast, multicast, cloud metadata ------------------------------------

UNSPECIFIED_BROADCAST_MULTICAST = [
    "https://0.0.0.0/",
    "https://0.0.0.0./",
    "https://0.0.0.0:443/",
    "https://[::]/",
    "https://[::0]/",
    "https://[0:0:0:0:0:0:0:0]/",
    "https://[::ffff:0.0.0.0]/",
    "https://[::ffff:0:0]/",
    "https://255.255.255.255/",
    "https://224.0.0.1/",
    "https://239.255.255.250/",
    "https://[ff02::1]/",
    "https://[ff05::1:3]/",
    "https://[ff0e::1]/",
    "https://[::ffff:224.0.0.1]/",
]


@pytest.mark.parametrize("url", UNSPECIFIED_BROADCAST_MULTICAST)
async def test_unspecified_broadcast_and_multicast_are_refused(
    world: World, url: str
) -> None:
    error = await refusal(world, url)
    assert error.reason == "address_not_allowed"


METADATA_NAMES = {
    "metadata.google.internal": ["169.254.169.254"],  # GCP
    "metadata": ["169.254.169.254"],  # GCP, short name
    "instance-data.ec2.internal": ["169.254.169.254"],  # AWS
    "ecs-credentials.example.test": ["169.254.170.2"],  # AWS ECS task role
    "eks-pod-identity.example.test": ["169.254.170.23", "fd00:ec2::23"],
    "imds6.example.test": ["fd00:ec2::254"],  # AWS IMDS over IPv6
    "metadata.tencentyun.com": ["169.254.0.23"],  # Tencent Cloud
    "scaleway-metadata.example.test": ["169.254.42.42"],  # Scaleway
    "alibaba-metadata.example.test": ["100.100.100.200"],  # Alibaba Cloud
    "oracle-metadata.example.test": ["192.0.0.192"],  # Oracle Cloud
    "wireserver.example.test": ["168.63.129.16"],  # Azure WireServer (public!)
    "mapped-metadata.example.test": ["::ffff:169.254.169.254"],
    "nat64-metadata.example.test": ["64:ff9b::a9fe:a9fe"],
}
METADATA_LITERALS = [
    "169.254.169.254",
    "169.254.170.2",
    "169.254.0.23",
    "169.254.42.42",
    "100.100.100.200",
    "192.0.0.192",
    "168.63.129.16",
    "[fd00:ec2::254]",
    "[fd00:ec2::23]",
    "[::ffff:169.254.169.254]",
    "[::ffff:a9fe:a9fe]",
    "[64:ff9b::a9fe:a9fe]",
    "[2002:a9fe:a9fe::]",
    "[::ffff:168.63.129.16]",
]


@pytest.mark.parametrize("private", [False, True], ids=["default", "private"])
@pytest.mark.parametrize("name", METADATA_NAMES)
async def test_cloud_metadata_names_are_refused_even_for_a_private_network_server(
    world: World, name: str, private: bool
) -> None:
    """``allow_private_network`` opens the LAN to one server and, through its
    OAuth discovery, to whatever URLs that server names: never the cloud's
    instance metadata (credentials) or Azure's WireServer."""
    world.dns.answers.update(METADATA_NAMES)
    async with client(world, allow_private_network=private) as http:
        for scheme in ("https", "http") if private else ("https",):
            with pytest.raises(PermissionDeniedError) as err:
                await http.get(f"{scheme}://{name}/latest/meta-data/")
            assert err.value.reason == "address_not_allowed"
    assert world.dial.dialled == []


@pytest.mark.parametrize("private", [False, True], ids=["default", "private"])
@pytest.mark.parametrize("host", METADATA_LITERALS)
async def test_cloud_metadata_addresses_are_refused_even_for_a_private_network_server(
    world: World, host: str, private: bool
) -> None:
    for scheme in ("https", "http") if private else ("https",):
        error = await refusal(
            world,
            f"{scheme}://{host}/latest/meta-data/",
            allow_private_network=private,
        )
        assert error.reason == "address_not_allowed"
        if private:
            assert "metadata" in error.message
    backend = PinnedBackend(
        world.network(), allowlist=[], allow_private_network=private
    )
    with pytest.raises(PermissionDeniedError):
        await backend.connect_tcp(host.strip("[]"), 80)
    assert world.dial.dialled == []


async def test_a_private_network_server_still_reaches_the_lan(world: World) -> None:
    """The control: the metadata rule leaves the rest of private space to
    ``allow_private_network``, pinned as ever."""
    world.dns.answers["lan10.example.test"] = ["10.0.0.7"]
    world.dns.answers["linklocal.example.test"] = ["169.254.1.1"]
    async with client(world, allow_private_network=True) as http:
        with pytest.raises(AssertionError, match=r"10\.0\.0\.7:443"):
            await http.get("https://lan10.example.test/")  # no route: not dialled
        with pytest.raises(PermissionDeniedError):
            await http.get("https://linklocal.example.test/")
    assert world.dial.dialled == [("10.0.0.7", 443)]


# --- the deny table of SECURITY.md §2.5, entry by entry --------------------------------

DENY_TABLE = [
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.0.0.0/24",
    "192.0.2.0/24",
    "192.88.99.0/24",
    "192.168.0.0/16",
    "198.18.0.0/15",
    "198.51.100.0/24",
    "203.0.113.0/24",
    "224.0.0.0/4",
    "240.0.0.0/4",
    "::/128",
    "::1/128",
    "::/96",
    "64:ff9b::/96",
    "64:ff9b:1::/48",
    "100::/64",
    "2001::/32",
    "2001:db8::/32",
    "2002::/16",
    "fc00::/7",
    "fe80::/10",
    "fec0::/10",
    "ff00::/8",
]
JUST_OUTSIDE = [
    "1.0.0.1",
    "9.255.255.255",
    "11.0.0.0",
    "100.63.255.255",
    "100.128.0.0",
    "126.255.255.255",
    "128.0.0.0",
    "169.253.255.255",
    "169.255.0.0",
    "172.15.255.255",
    "172.32.0.0",
    "191.255.255.255",
    "192.0.1.0",
    "192.0.3.0",
    "192.88.98.255",
    "192.88.100.0",
    "192.167.255.255",
    "192.169.0.0",
    "198.17.255.255",
    "198.20.0.0",
    "198.51.99.255",
    "198.51.101.0",
    "203.0.112.255",
    "203.0.114.0",
    "223.255.255.255",
    "2001:200::",
    "2001:db7:ffff:ffff:ffff:ffff:ffff:ffff",
    "2001:db9::",
    "2001:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
    "2003::",
    "::ffff:8.8.8.8",  # IPv4-mapped: unwrapped and judged as 8.8.8.8
]


@pytest.mark.parametrize("block", DENY_TABLE)
def test_every_deny_table_block_is_denied_end_to_end(block: str) -> None:
    net = ip_network(block)
    samples = {net[0], net[-1], net[net.num_addresses // 2]}
    if isinstance(net, IPv4Network):
        samples |= {ip_address(f"::ffff:{a}") for a in (net[0], net[-1])}
    for address in samples:
        assert not address_allowed(address), address
        literal = f"[{address}]" if address.version == 6 else str(address)
        with pytest.raises(PermissionDeniedError) as err:
            check_url(f"https://{literal}/", allowlist=[], allow_private_network=False)
        assert err.value.reason == "address_not_allowed"


def test_the_ipv4_mapped_block_is_unwrapped_and_judged_again() -> None:
    """``::ffff:0:0/96``: the kernel dials the IPv4 address inside, so the
    mapped address is judged exactly as that address."""
    v4 = [
        ip_network(b)[1] for b in DENY_TABLE if isinstance(ip_network(b), IPv4Network)
    ]
    v4 += [a for a in map(ip_address, JUST_OUTSIDE) if a.version == 4]
    for address in v4:
        mapped = ip_address(f"::ffff:{address}")
        assert address_allowed(mapped) == address_allowed(address), address


@pytest.mark.parametrize("address", JUST_OUTSIDE)
def test_the_addresses_just_outside_each_block_are_allowed(address: str) -> None:
    assert address_allowed(ip_address(address))
    for block in DENY_TABLE:
        assert ip_address(address) not in ip_network(block)


def test_the_hosts_file_is_read_as_glibc_reads_it(tmp_path: Path) -> None:
    """``/etc/hosts`` comes before DNS for a dotted name (DNS then gets the
    absolute name): every line naming it counts, in any letter case; comments,
    bad addresses and other names do not."""
    hosts = tmp_path / "hosts"
    hosts.write_text(
        "# 10.0.0.9 mcp.example.test\n"
        "127.0.0.1 localhost\n"
        "8.8.8.8 other.example.test MCP.Example.Test # a comment 10.0.0.8\n"
        "not-an-address mcp.example.test\n"
        "2001:4860:4860::8888\tmcp.example.test.\n"
        "8.8.8.8 mcp.example.test\n"
        "9.9.9.9 mcp.example.testing\n"
    )
    assert hosts_file_addresses("mcp.example.test", str(hosts)) == [
        ip_address("8.8.8.8"),
        ip_address("2001:4860:4860::8888"),
    ]
    assert hosts_file_addresses("example.test", str(hosts)) == []
    assert hosts_file_addresses("mcp.example.test", str(tmp_path / "none")) == []


# --- the system resolver and real sockets, in a network namespace of our own --------------


UNSHARE = shutil.which("unshare")


def _netns_available() -> bool:
    if sys.platform != "linux" or not (UNSHARE and shutil.which("ip")):
        return False
    try:
        probe = subprocess.run(
            [UNSHARE, "-rnm", "true"], capture_output=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


NETNS_ZONE: dict[str, list[list[tuple[str, str]]]] = {
    PUBLIC_NAME: [[("A", PUBLIC_V4), ("AAAA", PUBLIC_V6)]],
    "second.example.test": [[("A", SECOND_V4)]],
    "private.example.test": [[("A", "10.0.0.1")]],
    "mixed.example.test": [[("A", PUBLIC_V4), ("A", "10.0.0.1")]],
    "mixed6.example.test": [[("A", PUBLIC_V4), ("AAAA", "fd00:ec2::254")]],
    "mapped.example.test": [[("A", PUBLIC_V4), ("AAAA", "::ffff:169.254.169.254")]],
    "cname.example.test": [[("CNAME", "inside.example.test")]],
    "inside.example.test": [[("A", "169.254.169.254")]],
    "cname-public.example.test": [[("CNAME", PUBLIC_NAME)]],
    "rebind.example.test": [[("A", PUBLIC_V4)], [("A", "127.0.0.1")]],
    "wireserver.example.test": [[("A", "168.63.129.16")]],
    "metadata.google.internal": [[("A", "169.254.169.254")]],
    "localhost.example.test": [[("A", "127.0.0.1"), ("AAAA", "::1")]],
    # The resolver's search domain (resolv.conf: search evil.test, ndots:5):
    # answers that would win for an allowlisted name if it were searched.
    f"{PUBLIC_NAME}.evil.test": [[("A", SECOND_V4)]],
    "hosts-first.example.test": [[("A", SECOND_V4)]],
    "hosts-first.example.test.evil.test": [[("A", SECOND_V4)]],
    "svc.evil.test": [[("A", SECOND_V4)]],
}
"""What the namespace's DNS server answers (TTL 0)."""
NETNS_ADDRESSES = [
    PUBLIC_V4,
    SECOND_V4,
    "10.0.0.1",
    "169.254.169.254",
    "168.63.129.16",
    "100.100.100.200",
    PUBLIC_V6,
    "fd00:ec2::254",
]
"""Put on the namespace's ``lo``: an HTTPS server answers on every one of them,
so a connection the guard should have refused would succeed, and is recorded."""

NETNS_CASES: list[tuple[str, dict[str, Any], str]] = [
    # (url, hardened_client options, what must happen)
    (f"https://{PUBLIC_NAME}/ok", {}, f"ok {PUBLIC_V4} {PUBLIC_V6}"),
    (f"https://{PUBLIC_NAME.upper()}./ok", {"allowlist": [PUBLIC_NAME]}, "ok *"),
    # /etc/hosts first (its entry, not the DNS one), then DNS as an absolute
    # name: never the search list for a dotted name, however many dots
    # ndots asks for. A single label keeps it (a relative name, written so).
    ("https://hosts-first.example.test/ok", {}, f"ok {PUBLIC_V4}"),
    ("https://svc/ok", {}, f"dialled {SECOND_V4}"),
    ("https://cname-public.example.test/ok", {}, "ok *"),
    ("https://mixed.example.test/ok", {}, "denied"),
    ("https://mixed6.example.test/ok", {}, "denied"),
    ("https://mapped.example.test/ok", {}, "denied"),
    ("https://cname.example.test/ok", {}, "denied"),
    ("https://wireserver.example.test/ok", {}, "denied"),
    ("https://metadata.google.internal/ok", {}, "denied"),
    ("https://metadata.google.internal/ok", {"allow_private_network": True}, "denied"),
    ("https://localhost.example.test/ok", {}, "denied"),
    ("https://private.example.test/ok", {}, "denied"),
    ("https://private.example.test/ok", {"allow_private_network": True}, "ok 10.0.0.1"),
    ("https://rebind.example.test/ok", {}, f"ok {PUBLIC_V4}"),  # the first answer
    ("https://rebind.example.test/ok", {}, "denied"),  # then 127.0.0.1, TTL 0
    ("https://localhost/ok", {}, "unresolved"),
    ("https://2130706433/ok", {}, "unresolved"),
    ("https://0x7f.1/ok", {}, "unresolved"),
    ("https://017700000001/ok", {}, "unresolved"),
    ("https://134744072/ok", {}, "unresolved"),
    ("https://0xa9fea9fe/ok", {"allow_private_network": True}, "unresolved"),
    ("https://[::ffff:169.254.169.254]/ok", {}, "unresolved"),
    ("https://[64:ff9b::a9fe:a9fe]/ok", {}, "unresolved"),
    ("https://168.63.129.16/ok", {}, "unresolved"),
    ("https://169.254.169.254/ok", {"allow_private_network": True}, "unresolved"),
    # An address literal has no certificate here: dialled, then TLS fails.
    ("https://10.0.0.1/ok", {"allow_private_network": True}, "dialled 10.0.0.1"),
]


def test_the_battery_through_the_system_resolver_in_a_network_namespace() -> None:
    """The production ``Network`` (glibc ``getaddrinfo``, anyio sockets) in a
    namespace whose only interface is ``lo``: its DNS server is ``TinyDNS``
    and every address of the table is local, with an HTTPS server on it, so
    a connection the guard let through would succeed; none leaves the
    namespace, whatever the guard does. Proxy variables point at a listener
    that must see nothing (and does see a client that trusts them)."""
    if not _netns_available():
        pytest.skip("needs unshare -rnm (user and network namespaces) and ip")
    root = Path(__file__).resolve().parents[2]
    child = subprocess.run(
        [UNSHARE or "unshare", "-rnm", sys.executable, "-m", __name__],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        timeout=90,
        check=False,
    )
    assert child.returncode == 0, child.stderr.decode()[-3000:]
    report = msgspec.json.decode(child.stdout)
    assert len(report["results"]) == len(NETNS_CASES)
    for result, (_, _, expect) in zip(report["results"], NETNS_CASES, strict=True):
        kind, *where = expect.split()
        if kind == "ok":
            assert result["outcome"] == "ok:ok", result
            assert len(result["connected"]) == 1, result
            assert where == ["*"] or result["connected"][0] in where, result
        elif kind == "dialled":
            assert result["connected"] == where, result
        else:
            assert result["outcome"] == "refused:address_not_allowed", result
            assert result["connected"] == [], result
            if kind == "unresolved":
                assert result["queried"] == [], result
    first = report["results"][1]["queried"]
    assert first
    assert all(q.startswith(f"{PUBLIC_NAME} ") for q in first)  # never searched
    assert report["results"][2]["queried"] == []  # /etc/hosts answered
    assert all(q.startswith("svc.evil.test ") for q in report["results"][3]["queried"])
    assert report["proxied"] == 0  # the hardened client never used the proxy
    assert report["naive_proxied"] == 1  # the control did


class _Recorder:
    """An HTTPS server on ``[::]:443`` (both families): it records the local
    address of every connection before the handshake and answers ``ok``."""

    def __init__(self, context: ssl.SSLContext) -> None:
        self.context = context
        self.connected: list[str] = []
        self.sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("::", 443))
        self.sock.listen(64)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            local = ip_address(conn.getsockname()[0])
            mapped = getattr(local, "ipv4_mapped", None)
            self.connected.append(str(mapped or local))
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError), conn:
            conn.settimeout(5)
            tls = self.context.wrap_socket(conn, server_side=True)
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = tls.recv(4096)
                if not chunk:
                    return
                data += chunk
            tls.sendall(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n"
                b"content-length: 2\r\nconnection: close\r\n\r\nok"
            )
            tls.close()


def _netns_child() -> None:
    """Run inside ``unshare -rnm``; prints the report as JSON."""
    interfaces = [name for _, name in socket.if_nameindex()]
    if interfaces != ["lo"]:  # never outside a fresh, empty network namespace
        raise SystemExit(f"not in an empty network namespace: {interfaces}")

    def run(*argv: str) -> None:
        subprocess.run(argv, check=True, capture_output=True)

    run("ip", "link", "set", "lo", "up")
    for address in NETNS_ADDRESSES:
        run("ip", "addr", "add", str(ip_network(address)), "dev", "lo")
    work = tempfile.mkdtemp(prefix="mz-netns-")
    Path(work, "resolv.conf").write_text(
        "nameserver 127.0.0.1\nsearch evil.test\noptions ndots:5 timeout:1 attempts:1\n"
    )
    Path(work, "hosts").write_text(
        f"127.0.0.1 localhost\n::1 localhost\n{PUBLIC_V4} Hosts-First.example.test\n"
    )
    run("mount", "--bind", f"{work}/resolv.conf", "/etc/resolv.conf")
    run("mount", "--bind", f"{work}/hosts", "/etc/hosts")

    dns = TinyDNS(
        {name: [list(t) for t in turns] for name, turns in NETNS_ZONE.items()}
    )
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 53))
    threading.Thread(target=dns.serve, args=(udp,), daemon=True).start()

    tls = make_tls(work)
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(tls.certfile, tls.keyfile)
    recorder = _Recorder(server_context)
    proxy = socket.socket()
    proxy.bind(("127.0.0.1", 3128))
    proxy.listen(8)
    proxy.setblocking(False)
    for name in ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "https_proxy"):
        os.environ[name] = "http://127.0.0.1:3128"
    os.environ["NO_PROXY"] = ""

    async def probe() -> dict[str, Any]:
        network = Network(ssl_context=tls.client_context())
        results = []
        for url, options, _ in NETNS_CASES:
            before_c, before_q = len(recorder.connected), len(dns.queries)
            settings: dict[str, Any] = {
                "limit": 1 << 16,
                "timeout": httpx2.Timeout(5.0),
                "allowlist": [],
                "allow_private_network": False,
                "network": network,
                **options,
            }
            try:
                async with hardened_client(**settings) as http:
                    outcome = f"ok:{(await http.get(url)).text}"
            except RemoteError as exc:
                outcome = f"refused:{exc.reason}"
            except (httpx2.HTTPError, httpcore2.ConnectError) as exc:
                outcome = f"error:{type(exc).__name__}:{exc}"
            await anyio.sleep(0.05)  # the recorder's thread
            results.append(
                {
                    "url": url,
                    "outcome": outcome,
                    "connected": recorder.connected[before_c:],
                    "queried": dns.queries[before_q:],
                }
            )
        proxied = _accepted(proxy)
        async with httpx2.AsyncClient(verify=tls.client_context(), timeout=2) as http:
            with contextlib.suppress(httpx2.HTTPError):
                await http.get(f"https://{PUBLIC_NAME}/ok")
        return {
            "results": results,
            "proxied": proxied,
            "naive_proxied": _accepted(proxy),
        }

    report = anyio.run(probe)
    sys.stdout.write(msgspec.json.encode(report).decode())


def _accepted(listener: socket.socket) -> int:
    """How many connections wait on the non-blocking ``listener`` (taken)."""
    count = 0
    while True:
        try:
            conn, _ = listener.accept()
        except BlockingIOError:
            return count
        conn.close()
        count += 1


if __name__ == "__main__":
    _netns_child()
