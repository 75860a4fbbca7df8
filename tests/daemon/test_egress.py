"""The egress policy's pure half: the deny table and the URL/host rules.

The bypass cases are SECURITY.md §2.6 (literals and encodings, IPv6 wrappers,
metadata addresses, trailing dots, userinfo tricks, IDN confusables) and
smokescreen's/Advocate's address tables (§2.1, §2.2). The same rules run on
the wire in test_egress_client.py.
"""

from __future__ import annotations

from ipaddress import IPv4Address, IPv6Address, ip_address

import pytest

from memorizz.api.errors import InvalidParamsError, PermissionDeniedError
from memorizzd.egress.addresses import address_allowed, describe, embedded_ipv4
from memorizzd.egress.urls import check_url, normalise_pattern, without_trailing_dot

# --- the deny table ------------------------------------------------------------

DENIED = [
    "0.0.0.0",  # noqa: S104 - an address under test, not a bind
    "0.1.1.1",
    "10.0.0.1",
    "10.255.255.255",
    "100.64.0.1",
    "100.127.255.254",
    "100.100.100.200",  # Alibaba Cloud metadata
    "127.0.0.1",
    "127.255.255.255",
    "169.254.169.254",  # AWS/GCP/Azure metadata
    "172.16.0.1",
    "172.31.255.255",
    "192.0.0.170",  # NAT64 discovery
    "192.0.2.1",
    "192.88.99.1",
    "192.168.0.1",
    "192.168.2.1",
    "198.18.0.1",
    "198.19.255.255",
    "198.51.100.1",
    "203.0.113.1",
    "224.0.0.1",
    "239.255.255.250",
    "240.0.0.1",
    "255.255.255.255",
    "::",
    "::1",
    "::127.0.0.1",  # IPv4-compatible
    "::ffff:127.0.0.1",  # IPv4-mapped (is_loopback is False for it)
    "::ffff:7f00:1",
    "::ffff:169.254.169.254",
    "::ffff:10.0.0.1",
    "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254 (is_global is True for it)
    "64:ff9b::a00:1",
    "64:ff9b::808:808",  # NAT64 of a public address: denied all the same
    "64:ff9b::ffff:ffff",
    "64:ff9b:1::a9fe:a9fe",
    "100::1",
    "2001:0:4136:e378:8000:63bf:3fff:fdd2",  # Teredo
    "2001:db8::1",
    "2002:a9fe:a9fe::1",  # 6to4 of 169.254.169.254 (is_global is True for it)
    "2002:c000:201::1",
    "2002:a00:1::1",
    "2002:808:808::1",
    "fc00::1",
    "fd00:ec2::254",  # AWS IMDSv6
    "fe80::1",
    "fe80::1%eth0",
    "fec0::1",  # site-local (is_global is True for it on some interpreters)
    "fec0:cccc::",
    "ff02::2",
    # Issue 9: IPv4-translated (SIIT, ::ffff:0:0:0/96): a translator on the
    # path turns it into the embedded IPv4 address; is_global is True for it.
    "::ffff:0:7f00:1",
    "::ffff:0:127.0.0.1",
    "::ffff:0:a9fe:a9fe",
    "::ffff:0:808:808",  # a public address inside: denied all the same
    # ... and the rest of the IANA special-purpose registries.
    "::ffff:0:0",  # the first IPv4-mapped address: 0.0.0.0
    "100:0:0:1::1",  # dummy prefix (RFC 9780)
    "2001:1::1",  # PCP anycast (2001::/23: IETF protocol assignments)
    "2001:2::1",  # benchmarking
    "2001:3::1",  # AMT
    "2001:4:112::1",  # AS112-v6
    "2001:10::1",  # ORCHID
    "2001:20::1",  # ORCHIDv2
    "2001:1ff:ffff::1",  # the end of 2001::/23
    "2620:4f:8000::1",  # AS112 direct delegation
    "3fff::1",  # documentation (RFC 9637)
    "3fff:fff:ffff::1",
    "5f00::1",  # SRv6 SIDs (RFC 9602)
    "64:ff9c::1",  # just outside the NAT64 /96, but outside 2000::/3 too
    "4000::1",  # outside 2000::/3: not global unicast, whatever is assigned there
    "1::1",
    "e000::1",
    "192.31.196.1",  # AS112-v4
    "192.52.193.1",  # AMT
    "192.175.48.1",  # AS112 direct delegation
]
ALLOWED = [
    "8.8.8.8",
    "1.1.1.1",
    "100.63.255.254",
    "100.128.0.1",
    "172.15.255.255",
    "172.32.0.1",
    "192.167.255.255",
    "198.17.255.255",
    "2001:4860:4860::8888",
    "2606:4700:4700::1111",
    "::ffff:8.8.8.8",  # mapped public: unwrapped, judged as 8.8.8.8
    "2001:200::1",  # just past 2001::/23
    "2620:4f:7fff::1",  # just before the AS112 /48
    "3fff:1000::1",  # just past 3fff::/20
    "3ffe:ffff::1",
    "2c0f:fb50::1",
    "192.31.195.255",
    "192.31.197.0",
    "192.175.49.1",
]


@pytest.mark.parametrize("address", DENIED)
def test_denied_addresses(address: str) -> None:
    assert not address_allowed(ip_address(address))


@pytest.mark.parametrize("address", ALLOWED)
def test_public_addresses_are_allowed(address: str) -> None:
    assert address_allowed(ip_address(address))


@pytest.mark.parametrize(
    ("address", "how", "inner"),
    [
        ("::ffff:7f00:1", "IPv4-mapped", "127.0.0.1"),
        ("64:ff9b::a9fe:a9fe", "NAT64", "169.254.169.254"),
        ("2002:a9fe:a9fe::1", "6to4", "169.254.169.254"),
        # Teredo: the client address is the last 32 bits XOR 0xffffffff.
        ("2001:0:4136:e378:8000:63bf:3f57:fdfe", "Teredo", "192.168.2.1"),
        ("::10.0.0.1", "IPv4-compatible", "10.0.0.1"),
        ("::ffff:0:7f00:1", "IPv4-translated", "127.0.0.1"),
    ],
)
def test_wrapped_ipv4_is_unwrapped_for_the_message(
    address: str, how: str, inner: str
) -> None:
    ip = IPv6Address(address)
    assert embedded_ipv4(ip) == (how, IPv4Address(inner))
    assert describe(ip) == f"{ip} ({how} {inner})"


# --- URLs: what is refused, and why ----------------------------------------------

ADDRESS_NOT_ALLOWED = [
    "https://127.0.0.1/",
    "https://127.1/",
    "https://2130706433/",
    "https://017700000001/",
    "https://0177.0.0.1/",  # httpx refuses it, inet_aton takes it
    "https://0x7f.1/",
    "https://0x7f000001/",
    "https://0X7F.0.0.1/",
    "https://0/",
    "https://0.0.0.0/",
    "https://[::]/",
    "https://[::1]/",
    "https://[::ffff:127.0.0.1]/",
    "https://[::ffff:7f00:1]/",
    "https://[0:0:0:0:0:ffff:127.0.0.1]/",
    "https://[::127.0.0.1]/",
    "https://[64:ff9b::a9fe:a9fe]/",
    "https://[::ffff:0:127.0.0.1]/",  # IPv4-translated (SIIT)
    "https://[::ffff:0:a9fe:a9fe]/",
    "https://[0:0:0:0:ffff:0:7f00:1]/",
    "https://[3fff::1]/",
    "https://[5f00::1]/",
    "https://[2001:20::1]/",
    "https://192.175.48.1/",
    "https://[2002:a9fe:a9fe::]/",
    "https://[2001:0:4136:e378:8000:63bf:3f57:fdfe]/",
    "https://[fd00:ec2::254]/latest/meta-data/",
    "https://[fe80::1%25eth0]/",
    "https://169.254.169.254/latest/meta-data/",
    "https://100.100.100.200/latest/meta-data/",
    "https://localhost/",
    "https://localhost./",
    "https://LOCALHOST/",
    "https://\u24dbocalhost/",  # ⓛocalhost: UTS 46 maps it to localhost
    "https://\uff4c\uff4f\uff43\uff41\uff4c\uff48\uff4f\uff53\uff54/",  # fullwidth
    "https://api.localhost/",
    "https://127.0.0.1:22/",
    "https://10.0.0.1:6379/",
    "https://192.168.1.1:25/",
]


@pytest.mark.parametrize("url", ADDRESS_NOT_ALLOWED)
def test_local_and_numeric_hosts_are_refused(url: str) -> None:
    with pytest.raises(PermissionDeniedError) as err:
        check_url(url, allowlist=[], allow_private_network=False)
    assert err.value.reason == "address_not_allowed"
    assert err.value.message.startswith("address_not_allowed: ")


@pytest.mark.parametrize(
    "url",
    [
        "http://api.example.com/mcp",
        "HTTP://api.example.com/mcp",
        "ftp://api.example.com/",
        "file:///etc/passwd",
        "gopher://127.0.0.1:6379/_INFO",
        "ws://api.example.com/",
        # Issue 9: every other scheme is refused as such, in any case and
        # whatever follows it, never as a malformed URL.
        "FTP://api.example.com/",
        "Ftp://api.example.com/",
        "file:/etc/passwd",
        "FILE:///etc/passwd",
        "file://localhost/etc/passwd",
        "javascript:alert(1)",
        "JavaScript://%0aalert(1)",
        "data:text/html,<script>",
        "mailto:ops@example.com",
        "ldap://ldap.example.com/",
        "dict://127.0.0.1:11211/",
        "svn+ssh://example.com/",
    ],
)
def test_only_https_without_allow_private_network(url: str) -> None:
    with pytest.raises(PermissionDeniedError) as err:
        check_url(url, allowlist=[], allow_private_network=False)
    assert err.value.reason == "scheme_not_allowed"
    assert err.value.message.startswith("scheme_not_allowed: ")


@pytest.mark.parametrize(
    "url",
    [
        "HTTPS://api.example.com/mcp",
        "Https://api.example.com/mcp",
        "hTTpS://API.EXAMPLE.COM:443/mcp",
    ],
)
def test_the_scheme_is_case_insensitive(url: str) -> None:
    checked = check_url(url, allowlist=["api.example.com"], allow_private_network=False)
    assert (checked.scheme, checked.host, checked.port) == (
        "https",
        "api.example.com",
        443,
    )
    with pytest.raises(PermissionDeniedError) as err:  # HTTP is http
        check_url(
            url.replace("S:", ":").replace("s:", ":"),
            allowlist=[],
            allow_private_network=False,
        )
    assert err.value.reason == "scheme_not_allowed"
    checked = check_url(
        "HTTP://127.0.0.1:8080/", allowlist=[], allow_private_network=True
    )
    assert checked.scheme == "http"


@pytest.mark.parametrize(
    "url",
    [
        "https://allowed.example.com@evil.example.org/",
        "https://user:secret@allowed.example.com/mcp",
        "https://:@allowed.example.com/",
        "https://allowed.example.com:443@evil.example.org/",
        "https://token@allowed.example.com/",
    ],
)
def test_credentials_in_the_url_are_refused(url: str) -> None:
    with pytest.raises(PermissionDeniedError) as err:
        check_url(url, allowlist=["allowed.example.com"], allow_private_network=False)
    assert err.value.reason == "credentials_in_url"
    assert "secret" not in err.value.message


@pytest.mark.parametrize(
    "url",
    [
        "https://evil\\@allowed.example.com/",  # a backslash: parsers disagree
        "https://allowed.example.com%00.evil.example.org/",
        "https://allowed.example.com\x00.evil.example.org/",
        "https://ex%41mple.com/",
        "https://allowed.example.com/#fragment",
        "https://allowed.example.com#@evil.example.org/",
        "https://under_score.example.com/",
        "https://allowed.example.com:0/",
        "https://allowed.example.com:65536/",
        "https://allowed.example.com:https/",
        "https://allowed.example.com:/",
        "https://[::1/",
        "https://[::1]x/",
        "https:///path",
        "https://allowed.example.com /",
        "https://allowed.example.com\t/",
        "https://api..example.com/",
        "https://-api.example.com/",
        "https://allowed.example.com../",
        "https://xn--zz.example.com/",  # not valid punycode
        "https://[not:an:address]/",
        "allowed.example.com/mcp",
        "allowed.example.com:443/mcp",  # host:port, no scheme
        "localhost:8080",
        "https:allowed.example.com/mcp",  # no //
        "https://" + "a" * 64 + ".example.com/",
        "https://allowed.example.com/" + "x" * 5000,
        "https://allowed.example.com/\udc80",  # fuzzing: not UTF-8, httpx2 raised
    ],
)
def test_malformed_or_ambiguous_urls_are_invalid(url: str) -> None:
    with pytest.raises(InvalidParamsError):
        check_url(url, allowlist=[], allow_private_network=False)


# --- the allowlist ---------------------------------------------------------------

ALLOWLIST = ["api.example.com", "*.corp.example", "B\u00dcCHER.example."]


@pytest.mark.parametrize(
    ("url", "host"),
    [
        ("https://api.example.com/mcp", "api.example.com"),
        ("https://API.Example.COM./mcp", "api.example.com"),  # case, trailing dot
        ("https://x.corp.example/", "x.corp.example"),
        ("https://a.b.corp.example:8443/mcp", "a.b.corp.example"),  # any depth
        ("https://x.corp.example./", "x.corp.example"),
        ("https://b\u00fccher.example/", "xn--bcher-kva.example"),
        ("https://xn--bcher-kva.example/", "xn--bcher-kva.example"),
    ],
)
def test_the_allowlist_matches_normalised_hosts(url: str, host: str) -> None:
    checked = check_url(url, allowlist=ALLOWLIST, allow_private_network=False)
    assert checked.host == host
    assert checked.address is None


@pytest.mark.parametrize(
    "url",
    [
        "https://corp.example/",  # the wildcard does not match the apex
        "https://evil.example.com/",
        "https://api.example.com.evil.example.org/",
        "https://apiexample.com/",
        "https://xcorp.example/",
        "https://api.example.co/",
        "https://8.8.8.8/",  # an address literal must be listed itself
        "https://[2001:4860:4860::8888]/",
    ],
)
def test_other_hosts_are_refused_when_an_allowlist_is_set(url: str) -> None:
    with pytest.raises(PermissionDeniedError) as err:
        check_url(url, allowlist=ALLOWLIST, allow_private_network=False)
    assert err.value.reason == "host_not_allowed"


@pytest.mark.parametrize(
    ("url", "allowlist"),
    [
        ("https://evil.example.org./", ["api.example.com"]),
        ("https://api.example.com.evil.example.org./", ["api.example.com"]),
        ("https://example.com./", ["*.example.com"]),  # the apex, dotted
        ("https://api.example.com./", ["api.example.com.evil.example.org"]),
    ],
)
def test_a_trailing_dot_does_not_widen_the_allowlist(
    url: str, allowlist: list[str]
) -> None:
    with pytest.raises(PermissionDeniedError) as err:
        check_url(url, allowlist=allowlist, allow_private_network=False)
    assert err.value.reason == "host_not_allowed"


@pytest.mark.parametrize(
    ("url", "sent"),
    [
        ("https://api.example.com./mcp", "https://api.example.com/mcp"),
        (
            "https://api.example.com.:8443/mcp?x=a.",
            "https://api.example.com:8443/mcp?x=a.",
        ),
        ("https://api.example.com.?q", "https://api.example.com?q"),
        ("https://api.example.com.#f", "https://api.example.com#f"),
        ("HTTPS://API.example.com.", "HTTPS://API.example.com"),
        ("https://api.example.com/mcp.", "https://api.example.com/mcp."),
        ("https://api.example.com../", "https://api.example.com../"),  # refused
        ("https://[::1]/", "https://[::1]/"),
        ("https://u@api.example.com./", "https://u@api.example.com./"),  # refused
        ("javascript:x.", "javascript:x."),
    ],
)
def test_a_request_goes_out_without_the_trailing_dot(url: str, sent: str) -> None:
    assert without_trailing_dot(url) == sent


def test_an_empty_allowlist_allows_any_public_host_and_any_port() -> None:
    for url in (
        "https://mcp.example.org/mcp",
        "https://mcp.example.org:8443/mcp",
        "https://8.8.8.8/mcp",
        "https://[2001:4860:4860::8888]:8443/mcp?x=1",
    ):
        check_url(url, allowlist=[], allow_private_network=False)
    checked = check_url(
        "https://mcp.example.org/", allowlist=[], allow_private_network=False
    )
    assert (checked.scheme, checked.port) == ("https", 443)


def test_invalid_allowlist_patterns_match_nothing() -> None:
    for pattern in ("*", "*.1", "exa mple.com", "*.", "example.com:443", ""):
        assert normalise_pattern(pattern) is None
    with pytest.raises(PermissionDeniedError) as err:
        check_url(
            "https://example.com/", allowlist=["*", "*.1"], allow_private_network=False
        )
    assert err.value.reason == "host_not_allowed"


def test_allow_private_network_allows_http_and_local_addresses() -> None:
    for url in (
        "http://127.0.0.1:8080/mcp",
        "http://[::1]:8080/mcp",
        "https://10.0.0.1/mcp",
        "http://localhost:3000/mcp",
        "http://mcp.lan/mcp",
    ):
        check_url(url, allowlist=[], allow_private_network=True)
    # ... but never a non-canonical numeric host, a zone or credentials,
    for url in ("http://127.1/", "http://2130706433/", "http://[fe80::1%25eth0]/"):
        with pytest.raises(PermissionDeniedError) as err:
            check_url(url, allowlist=[], allow_private_network=True)
        assert err.value.reason == "address_not_allowed"
    with pytest.raises(PermissionDeniedError) as err:
        check_url("http://u:p@127.0.0.1/", allowlist=[], allow_private_network=True)
    assert err.value.reason == "credentials_in_url"
    # ... and the allowlist still applies.
    check_url(
        "http://127.0.0.1:8080/", allowlist=["127.0.0.1"], allow_private_network=True
    )
    check_url("http://[::1]:8080/", allowlist=["[::1]"], allow_private_network=True)
    with pytest.raises(PermissionDeniedError) as err:
        check_url(
            "http://10.0.0.1/", allowlist=["127.0.0.1"], allow_private_network=True
        )
    assert err.value.reason == "host_not_allowed"
