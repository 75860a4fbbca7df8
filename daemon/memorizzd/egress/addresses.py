"""Which IP addresses the daemon may connect to: the deny table (pure).

The table is SECURITY.md §2.5: the IANA special-purpose ranges, private and
shared (CGNAT) space, loopback, link-local (cloud metadata at 169.254.169.254,
Alibaba's 100.100.100.200 in 100.64/10, AWS IMDSv6 at fd00:ec2::254 in
fc00::/7), documentation and benchmarking ranges, multicast and reserved
space. An IPv4-mapped IPv6 address (``::ffff:a.b.c.d``) is unwrapped and its
IPv4 address judged; every other IPv6 wrapper of IPv4 (IPv4-compatible, NAT64,
6to4, Teredo) is denied outright, whatever it embeds. What survives the table
must also be ``is_global``: Python's flags alone are no policy (their tables
differ by interpreter patch level), the table alone may miss a range.
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
        "192.88.99.0/24",  # 6to4 relay anycast
        "192.168.0.0/16",
        "198.18.0.0/15",  # benchmarking
        "198.51.100.0/24",  # TEST-NET-2
        "203.0.113.0/24",  # TEST-NET-3
        "224.0.0.0/4",  # multicast
        "240.0.0.0/4",  # reserved, and 255.255.255.255
    )
)
DENIED_V6: Final = tuple(
    IPv6Network(n)
    for n in (
        "::/96",  # unspecified, loopback, IPv4-compatible
        "64:ff9b::/96",  # NAT64 well-known prefix
        "64:ff9b:1::/48",  # NAT64 local-use prefix
        "100::/64",  # discard-only
        "2001::/32",  # Teredo
        "2001:db8::/32",  # documentation
        "2002::/16",  # 6to4
        "fc00::/7",  # unique local (AWS IMDSv6 fd00:ec2::254)
        "fe80::/10",  # link-local
        "fec0::/10",  # site-local (deprecated, still routed by some stacks)
        "ff00::/8",  # multicast
    )
)
_COMPATIBLE: Final = IPv6Network("::/96")
_NAT64: Final = IPv6Network("64:ff9b::/96")


def address_allowed(ip: IPAddress) -> bool:
    """True if the daemon may connect to ``ip`` (a public unicast address)."""
    if isinstance(ip, IPv6Address):
        if ip.scope_id:
            return False  # a zone names a local interface
        mapped = ip.ipv4_mapped
        if mapped is not None:
            return address_allowed(mapped)
        if any(ip in net for net in DENIED_V6):
            return False
    elif any(ip in net for net in DENIED_V4):
        return False
    return ip.is_global


def embedded_ipv4(ip: IPv6Address) -> tuple[str, IPv4Address] | None:
    """The IPv4 address an IPv6 address wraps, and how (for messages)."""
    if (mapped := ip.ipv4_mapped) is not None:
        return "IPv4-mapped", mapped
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
