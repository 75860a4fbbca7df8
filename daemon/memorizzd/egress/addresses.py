"""Which IP addresses the daemon may connect to: the deny table (pure).

The rule admits, rather than denies: an address is allowed only if it lies in
globally routable unicast space and outside every special-purpose block.

* IPv6: only global unicast, ``2000::/3`` (RFC 4291 §2.4); everything outside
  it is refused whatever it is (``::/128``, ``::1``, IPv4-compatible ``::/96``,
  IPv4-translated ``::ffff:0:0:0/96`` (SIIT, RFC 2765/6052), NAT64
  ``64:ff9b::/96`` and ``64:ff9b:1::/48``, discard ``100::/64`` and the dummy
  prefix ``100:0:0:1::/64``, SRv6 SIDs ``5f00::/16``, ``fc00::/7``,
  ``fe80::/10``, ``fec0::/10``, ``ff00::/8``, and whatever IANA assigns
  there next). Inside ``2000::/3`` the IANA IPv6 special-purpose blocks are
  refused (``DENIED_V6``). The one exception is the IPv4-mapped form
  (``::ffff:a.b.c.d``): the kernel dials the IPv4 address itself, so it is
  unwrapped and the IPv4 address judged.
* IPv4: unicast space minus the IANA IPv4 special-purpose blocks, private
  and shared (CGNAT) space, loopback, link-local (cloud metadata at
  169.254.169.254, Alibaba's 100.100.100.200 in 100.64/10), multicast and
  reserved space (``DENIED_V4``).

What survives must also be ``is_global``: Python's flags alone are no policy
(their tables differ by interpreter patch level), but a second opinion that
can only refuse costs nothing. ``allow_private_network`` (a server's explicit
choice) skips the deny table; see ``urls.py`` and ``backend.py``.

It does not skip the cloud metadata endpoints (``metadata_endpoint``): the
instance metadata services (IPv4 link-local ``169.254/16``, where every
cloud's lives, AWS's ``fd00:ec2::/48``, Alibaba's ``100.100.100.200``,
Oracle's ``192.0.0.192``) and Azure's WireServer ``168.63.129.16``, a public
address that only answers inside Azure. No intentional local service lives
there, and a private-network server names the URLs of its own OAuth discovery,
so lifting the table must not hand out the host's cloud credentials. They are
matched inside every IPv6 wrapping too (``::ffff:169.254.169.254``, NAT64,
6to4, Teredo).
"""

from __future__ import annotations

from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network
from typing import Final

IPAddress = IPv4Address | IPv6Address

DENIED_V4: Final = tuple(
    IPv4Network(n)
    for n in (
        "0.0.0.0/8",  # "this network"; 0.0.0.0 reaches the local host on Linux
        "10.0.0.0/8",
        "100.64.0.0/10",  # CGNAT shared space (Alibaba metadata 100.100.100.200)
        "127.0.0.0/8",
        "169.254.0.0/16",  # link-local (AWS/GCP/Azure metadata 169.254.169.254)
        "172.16.0.0/12",
        "192.0.0.0/24",  # IETF protocol assignments (NAT64 discovery .170/.171)
        "192.0.2.0/24",  # TEST-NET-1
        "192.31.196.0/24",  # AS112-v4 (RFC 7535)
        "192.52.193.0/24",  # AMT (RFC 7450)
        "192.88.99.0/24",  # 6to4 relay anycast (deprecated, RFC 7526)
        "192.168.0.0/16",
        "192.175.48.0/24",  # AS112 direct delegation (RFC 7534)
        "198.18.0.0/15",  # benchmarking
        "198.51.100.0/24",  # TEST-NET-2
        "203.0.113.0/24",  # TEST-NET-3
        "224.0.0.0/4",  # multicast
        "240.0.0.0/4",  # reserved, and 255.255.255.255
    )
)
GLOBAL_UNICAST_V6: Final = IPv6Network("2000::/3")
"""The only IPv6 space the daemon dials (RFC 4291 §2.4)."""
DENIED_V6: Final = tuple(
    IPv6Network(n)
    for n in (
        # Inside 2000::/3: the IANA IPv6 special-purpose registry.
        "2001::/23",  # IETF protocol assignments: Teredo 2001::/32, 2001:1::/48
        # anycast, benchmarking 2001:2::/48, AMT 2001:3::/32, AS112
        # 2001:4:112::/48, ORCHID 2001:10::/28, ORCHIDv2 2001:20::/28, ...
        "2001:db8::/32",  # documentation
        "2002::/16",  # 6to4
        "2620:4f:8000::/48",  # AS112 direct delegation (RFC 7534)
        "3fff::/20",  # documentation (RFC 9637)
        # Outside 2000::/3, refused by the rule; listed for describe() and
        # for anyone who reads this table alone.
        "::/96",  # unspecified, loopback, IPv4-compatible
        "::ffff:0:0:0/96",  # IPv4-translated (SIIT, RFC 2765)
        "64:ff9b::/96",  # NAT64 well-known prefix
        "64:ff9b:1::/48",  # NAT64 local-use prefix
        "100::/64",  # discard-only
        "100:0:0:1::/64",  # dummy prefix (RFC 9780)
        "5f00::/16",  # SRv6 SIDs (RFC 9602)
        "fc00::/7",  # unique local (AWS IMDSv6 fd00:ec2::254)
        "fe80::/10",  # link-local
        "fec0::/10",  # site-local (deprecated, still routed by some stacks)
        "ff00::/8",  # multicast
    )
)
METADATA_V4: Final = tuple(
    IPv4Network(n)
    for n in (
        # Link-local: the instance metadata of AWS, GCP, Azure, Oracle,
        # DigitalOcean, OpenStack, Hetzner (169.254.169.254), AWS ECS and EKS
        # credentials (169.254.170.2, 169.254.170.23), Tencent (169.254.0.23),
        # Scaleway (169.254.42.42).
        "169.254.0.0/16",
        "100.100.100.200/32",  # Alibaba Cloud
        "192.0.0.192/32",  # Oracle Cloud
        "168.63.129.16/32",  # Azure WireServer and host agent (a public address)
    )
)
"""Refused even with ``allow_private_network`` (and by the deny table)."""
METADATA_V6: Final = (
    IPv6Network("fd00:ec2::/48"),  # AWS: IMDS ::254, EKS Pod Identity ::23, DNS, NTP
)
_COMPATIBLE: Final = IPv6Network("::/96")
_TRANSLATED: Final = IPv6Network("::ffff:0:0:0/96")
_NAT64: Final = IPv6Network("64:ff9b::/96")


def address_allowed(ip: IPAddress) -> bool:
    """True if the daemon may connect to ``ip`` (a public unicast address)."""
    if metadata_endpoint(ip):
        return False
    if isinstance(ip, IPv6Address):
        if ip.scope_id:
            return False  # a zone names a local interface
        mapped = ip.ipv4_mapped
        if mapped is not None:
            return address_allowed(mapped)
        if ip not in GLOBAL_UNICAST_V6 or any(ip in net for net in DENIED_V6):
            return False
    elif any(ip in net for net in DENIED_V4):
        return False
    return ip.is_global


def metadata_endpoint(ip: IPAddress) -> bool:
    """True if ``ip`` is, or wraps, a cloud metadata endpoint: refused whatever
    the server's ``allow_private_network``."""
    if isinstance(ip, IPv6Address):
        if any(ip in net for net in METADATA_V6):
            return True
        wrapped = embedded_ipv4(ip)
        if wrapped is None:
            return False
        ip = wrapped[1]
    return any(ip in net for net in METADATA_V4)


def embedded_ipv4(ip: IPv6Address) -> tuple[str, IPv4Address] | None:
    """The IPv4 address an IPv6 address wraps, and how (for messages)."""
    if (mapped := ip.ipv4_mapped) is not None:
        return "IPv4-mapped", mapped
    if ip in _TRANSLATED:
        return "IPv4-translated", IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip in _NAT64:
        return "NAT64", IPv4Address(int(ip) & 0xFFFFFFFF)
    if (sixtofour := ip.sixtofour) is not None:
        return "6to4", sixtofour
    if (teredo := ip.teredo) is not None:
        return "Teredo", teredo[1]  # the client; Python undoes the XOR
    if ip in _COMPATIBLE and int(ip) > 1:
        return "IPv4-compatible", IPv4Address(int(ip))
    return None


def describe(ip: IPAddress) -> str:
    """``ip``, with the IPv4 address it wraps, if any."""
    if isinstance(ip, IPv6Address) and (wrapped := embedded_ipv4(ip)) is not None:
        how, inner = wrapped
        return f"{ip} ({how} {inner})"
    return str(ip)
