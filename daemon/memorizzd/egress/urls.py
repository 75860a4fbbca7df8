"""Which URLs the daemon may send requests to (pure: no DNS, no sockets).

``check_url`` is the static half of the egress policy, run at ``servers/add``,
at every connect and on every request the hardened client sends; the pinned
network backend (``backend.py``) does the other half, on the addresses a name
resolves to.

The rules:

* ``https`` only; ``http`` only for a server with ``allow_private_network``.
  The scheme is matched case-insensitively (``HTTPS://`` is ``https://``,
  RFC 3986 §3.1); any other scheme (``ftp:``, ``file:``, ``javascript:``)
  is refused as ``scheme_not_allowed``, not as a malformed URL.
* No userinfo (``credentials_in_url``), no fragment, no control characters,
  spaces or backslashes anywhere (parsers disagree about them: a backslash is a
  path separator to a browser and part of the userinfo to httpx), and no lone
  surrogate (not UTF-8: httpx raised UnicodeEncodeError sending it).
* The host is normalised before anything looks at it: UTS 46 / IDNA 2008 (as
  httpx encodes it: ``ⓛocalhost`` is ``localhost``, ``BÜCHER.de`` is
  ``xn--bcher-kva.de``), lower case, one trailing dot removed (``.``, or a
  full-width or ideographic one that UTS 46 maps to ``.``). It must then be
  letters, digits and hyphens (LDH); ``%``-escapes and ``_`` are refused.
  The request itself goes out without the trailing dot too
  (``without_trailing_dot``: SNI, certificate check and ``Host``), so
  ``api.example.com.`` reaches exactly the host the allowlist matched.
* A host whose last label is a number (``127.1``, ``2130706433``,
  ``017700000001``, ``0x7f.1``, ``0``) is an IPv4 address to some parser
  (``inet_aton`` takes every one of those) and is never handed to a resolver:
  only the canonical dotted quad is accepted, as an address. IPv6 goes in
  brackets; a zone (``%eth0``) is refused. An address literal is judged by
  the deny table (``addresses.py``) and so is ``localhost`` (RFC 6761), unless
  the server sets ``allow_private_network``; a cloud metadata endpoint
  (``169.254.169.254``, ``[fd00:ec2::254]``, ``168.63.129.16`` ...) is refused
  even then.
* The host allowlist, when not empty, must match: ``api.example.com`` exactly,
  ``*.example.com`` any name below ``example.com`` at any depth (not
  ``example.com`` itself), an address literal exactly (``127.0.0.1``,
  ``::1``). Patterns are normalised like hosts. The allowlist applies to
  ``allow_private_network`` servers too.
* Any port is allowed; an address that is allowed is public, so a port opens
  nothing private.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv6Address
from typing import Final

from memorizz.api.errors import InvalidParamsError, PermissionDeniedError
from memorizz.api.methods import ServerSpec
from memorizzd.egress.addresses import (
    IPAddress,
    address_allowed,
    describe,
    metadata_endpoint,
)
from memorizzd.redact import REDACTED

URL_MAX: Final = 4096
DEFAULT_PORTS: Final = {"https": 443, "http": 80}
_LABEL: Final = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
_NUMERIC: Final = re.compile(r"(?:0x[0-9a-f]*|[0-9]+)")
_FORBIDDEN: Final = re.compile(r"[\x00-\x20\x7f\\\ud800-\udfff]")
_SCHEME: Final = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")
_HOST_PORT: Final = re.compile(r"[0-9]+(?:[/?#].*)?", re.DOTALL)
_LOCAL_NAMES: Final = ("localhost",)


@dataclass(frozen=True, slots=True)
class CheckedURL:
    url: str
    scheme: str
    host: str
    """Normalised: IDNA A-labels, lower case, no trailing dot; IPv6 without brackets."""
    port: int
    address: IPAddress | None
    """Set when the host is an address literal."""


def check_url(
    url: str, *, allowlist: Sequence[str], allow_private_network: bool
) -> CheckedURL:
    """Parse ``url`` and apply the egress policy to it.

    Raises ``PermissionDeniedError`` (reasons ``scheme_not_allowed``,
    ``credentials_in_url``, ``address_not_allowed``, ``host_not_allowed``)
    or ``InvalidParamsError`` for a URL that is malformed or ambiguous.
    """
    if len(url) > URL_MAX:
        raise InvalidParamsError(f"the url is longer than {URL_MAX} characters")
    if _FORBIDDEN.search(url):
        raise InvalidParamsError(
            "the url contains a space, a control character, a backslash or a"
            " lone surrogate"
        )
    scheme, rest = _scheme(url)
    if scheme == "http" and not allow_private_network:
        raise PermissionDeniedError(
            "scheme_not_allowed: http:// is allowed only for a server with "
            "allow_private_network (an intentional local service: `memorizzctl"
            " mcp add NAME --url URL --allow-private-network`); use https://",
            reason="scheme_not_allowed",
        )
    if "#" in rest:
        raise InvalidParamsError("the url must not have a fragment (#...)")
    authority = re.split(r"[/?]", rest, maxsplit=1)[0]
    if "@" in authority:
        raise PermissionDeniedError(
            "credentials_in_url: the url must not carry credentials (user@host); "
            "configure credentials separately",
            reason="credentials_in_url",
        )
    host, port = _split_authority(authority, scheme)
    checked = check_host(
        host, allowlist=allowlist, allow_private_network=allow_private_network
    )
    return CheckedURL(url, scheme, checked[0], port, checked[1])


def check_scheme(url: str) -> None:
    """Refuse a URL whose scheme is neither ``https`` nor ``http``
    (``scheme_not_allowed``); the rest is ``check_url``'s."""
    match = _SCHEME.match(url)
    if match is not None and match.group(1).lower() not in DEFAULT_PORTS:
        _scheme(url)


def _scheme(url: str) -> tuple[str, str]:
    """The URL's scheme in lower case (RFC 3986 §3.1: case-insensitive) and
    what follows ``scheme://``. Any scheme but ``https``/``http`` is refused
    as such (``scheme_not_allowed``), whatever follows it."""
    match = _SCHEME.match(url)
    if match is None or _HOST_PORT.fullmatch(url, match.end()):
        # No scheme, or "host:port/..." (a scheme to RFC 3986, a typo to people).
        raise InvalidParamsError(
            f"{_shown_url(url)} is not an absolute URL (https://host/path)"
        )
    scheme = match.group(1).lower()
    if scheme not in DEFAULT_PORTS:
        raise PermissionDeniedError(
            f"scheme_not_allowed: {_shown(scheme)[1:-1]}: is not allowed; use https://",
            reason="scheme_not_allowed",
        )
    if not url.startswith("//", match.end()):
        raise InvalidParamsError(f"{_shown_url(url)} has no //host after {scheme}:")
    return scheme, url[match.end() + 2 :]


def without_trailing_dot(url: str) -> str:
    """``url`` with one trailing dot removed from its host name.

    ``api.example.com.`` is the same DNS name as ``api.example.com`` (and is
    matched against the allowlist as such), but a certificate, SNI (RFC 6066
    §3) and a server's ``Host`` check know only the dot-less form, so the
    request goes out with that. Anything that is not a plain
    ``scheme://host[:port]...`` URL is returned unchanged (``check_url``
    refuses it).
    """
    match = _SCHEME.match(url)
    if match is None or not url.startswith("//", match.end()):
        return url
    start = match.end() + 2
    end = len(url)
    for sep in "/?#":
        found = url.find(sep, start)
        if found >= 0:
            end = min(end, found)
    authority = url[start:end]
    if authority.startswith("[") or "@" in authority:
        return url
    host, colon, port = authority.partition(":")
    if not host.endswith(".") or host.endswith(".."):
        return url
    return url[:start] + host[:-1] + colon + port + url[end:]


def check_host(
    host: str, *, allowlist: Sequence[str], allow_private_network: bool
) -> tuple[str, IPAddress | None]:
    """Normalise a URL's host (IPv6 in brackets) and apply the host rules.

    Returns the normalised host and, for an address literal, the address.
    """
    address: IPAddress | None = None
    if host.startswith("["):
        address = _ipv6_literal(host)
        name = str(address)
    else:
        name = normalise_host(host)
        if _NUMERIC.fullmatch(name.rpartition(".")[2]):
            address = _ipv4_literal(name)
    if address is not None and metadata_endpoint(address):
        raise metadata_refused(describe(address))
    if not allow_private_network:
        if address is not None and not address_allowed(address):
            raise _address_refused(f"{describe(address)} is not a public address")
        if any(name == n or name.endswith("." + n) for n in _LOCAL_NAMES):
            raise _address_refused(f"{name} is the local host")
    if allowlist and not host_allowed(name, allowlist, literal=address is not None):
        raise PermissionDeniedError(
            f"host_not_allowed: {name} is not in the host allowlist "
            "(MEMORIZZ_MCP_HOST_ALLOWLIST / host_allowlist)",
            reason="host_not_allowed",
            data={"host": name},
        )
    return name, address


def normalise_host(host: str) -> str:
    """A DNS name as it is matched and resolved; raises InvalidParamsError."""
    if "%" in host:
        raise InvalidParamsError(f"host {_shown(host)}: %-escapes are not allowed")
    name = host.removesuffix(".").lower()  # as httpx does, before IDNA
    if not name.isascii() or any(label.startswith("xn--") for label in name.split(".")):
        import idna  # only for internationalised names (about 2 MB)

        try:
            name = idna.encode(name, uts46=True).decode("ascii")
        except (idna.IDNAError, UnicodeError):
            raise InvalidParamsError(
                f"host {_shown(host)} is not a valid internationalised name"
            ) from None
        if not host.endswith("."):
            # The one trailing dot may be a full-width or ideographic one
            # (U+FF0E, U+3002): a dot only after UTS 46 mapping.
            name = name.removesuffix(".")
    if len(name) > 253 or not all(_LABEL.fullmatch(x) for x in name.split(".")):
        raise InvalidParamsError(
            f"host {_shown(host)} is not a valid host name "
            "(letters, digits and hyphens only)"
        )
    return name


def host_allowed(name: str, allowlist: Sequence[str], *, literal: bool) -> bool:
    """Does the normalised host ``name`` (an address if ``literal``) match?"""
    for pattern in allowlist:
        normal = normalise_pattern(pattern)
        if normal is None:
            continue  # a pattern that cannot be normalised matches nothing
        if normal.startswith("*."):
            if not literal and name.endswith(normal[1:]):
                return True
        elif name == normal:
            return True
    return False


@functools.lru_cache(maxsize=1024)
def normalise_pattern(pattern: str) -> str | None:
    """An allowlist pattern in normal form (``*.`` kept), or None if invalid."""
    pattern = pattern.strip()
    try:
        if pattern.startswith("*."):
            suffix = normalise_host(pattern[2:])
            if _NUMERIC.fullmatch(suffix.rpartition(".")[2]):
                return None  # a wildcard over addresses means nothing
            return "*." + suffix
        if pattern.startswith("[") or ":" in pattern:
            bracketed = pattern if pattern.startswith("[") else f"[{pattern}]"
            return str(_ipv6_literal(bracketed))
        name = normalise_host(pattern)
        if _NUMERIC.fullmatch(name.rpartition(".")[2]):
            return str(_ipv4_literal(name))
        return name
    except (InvalidParamsError, PermissionDeniedError):
        return None


def _split_authority(authority: str, scheme: str) -> tuple[str, int]:
    if authority.startswith("["):
        end = authority.find("]")
        if end < 0:
            raise InvalidParamsError("the url has an unclosed '[' in its host")
        host, after = authority[: end + 1], authority[end + 1 :]
        if after and not after.startswith(":"):
            raise InvalidParamsError("the url has characters after its IPv6 host")
        port_text = after[1:] if after else None
    else:
        host, colon, port_text_or_empty = authority.partition(":")
        port_text = port_text_or_empty if colon else None
    if not host or host == "[]":
        raise InvalidParamsError("the url has no host")
    if port_text is None:
        return host, DEFAULT_PORTS[scheme]
    if not (port_text.isascii() and port_text.isdigit()) or len(port_text) > 5:
        raise InvalidParamsError(f"the url's port {_shown(port_text)} is not a number")
    port = int(port_text)
    if not 0 < port < 65536:
        raise InvalidParamsError(f"the url's port {port} is out of range")
    return host, port


def _ipv6_literal(host: str) -> IPv6Address:
    inner = host[1:-1] if host.endswith("]") else host[1:]
    if "%" in inner:
        raise _address_refused(
            f"{_shown(host)}: an IPv6 zone (%interface) names a local interface",
            hint=False,
        )
    try:
        return IPv6Address(inner)
    except ValueError:
        raise InvalidParamsError(f"{_shown(host)} is not an IPv6 address") from None


def _ipv4_literal(name: str) -> IPv4Address:
    try:
        address = IPv4Address(name)
    except ValueError:
        address = None
    if address is None or str(address) != name:
        raise _address_refused(
            f"{name} is a numeric host in a non-canonical form "
            "(an address is written as a dotted quad)",
            hint=False,
        )
    return address


def metadata_refused(what: str, *, host: str | None = None) -> PermissionDeniedError:
    """``what`` (an address, or a name and what it resolves to) is a cloud
    metadata endpoint: no server setting lifts that."""
    return PermissionDeniedError(
        f"address_not_allowed: {what} is a cloud metadata endpoint, refused "
        "even with allow_private_network",
        reason="address_not_allowed",
        data=None if host is None else {"host": host},
    )


def _address_refused(detail: str, *, hint: bool = True) -> PermissionDeniedError:
    if hint:
        detail += (
            "; set allow_private_network on the server to reach an intentional "
            "local service (`memorizzctl mcp add NAME --url URL"
            " --allow-private-network`)"
        )
    return PermissionDeniedError(
        f"address_not_allowed: {detail}", reason="address_not_allowed"
    )


def _shown(text: str) -> str:
    return repr(text[:100])


_USERINFO: Final = re.compile(r"^((?:[A-Za-z][A-Za-z0-9+.-]*:)?(?://)?)[^/?#]*@")


def without_userinfo(url: str) -> str:
    """``url`` with what precedes an ``@`` before its path (user
    information, a password perhaps) shown as ``[redacted]``; well-formed or
    not (``https:u:pw@host``, ``u:pw@host``)."""
    return _USERINFO.sub(rf"\1{REDACTED}@", url)


def _shown_url(url: str) -> str:
    """A malformed URL as an error shows it (``without_userinfo``)."""
    return _shown(without_userinfo(url))


def check_server_url(spec: ServerSpec, *, allowlist: Sequence[str]) -> None:
    """``servers/add``: an HTTP server's URL must pass before it is stored."""
    if spec.transport != "stdio" and spec.url is not None:
        check_url(
            spec.url,
            allowlist=allowlist,
            allow_private_network=spec.allow_private_network,
        )
