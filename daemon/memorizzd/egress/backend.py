"""The pinned network backend: resolve, check every address, dial what was checked.

httpcore opens every TCP connection through its pool's ``network_backend``
(``connect_tcp(host, port)``) and then starts TLS with the URL's host name as
SNI and for certificate verification. ``PinnedBackend`` is that backend: it
applies the host rules again (``urls.check_host``), resolves the name itself
(all A and AAAA records), refuses the connection if **any** address is denied
(a name answering {public, 10.0.0.1} fails closed), and connects to an address
it checked, never to the name. Each new connection resolves and checks afresh,
so a second DNS answer (rebinding to 127.0.0.1) is judged like the first, and
a pooled connection stays on the address it was checked at. Unix sockets are
refused. ``allow_private_network`` lifts the address checks, not the pinning,
and not the refusal of cloud metadata endpoints (``addresses.metadata_endpoint``).

``Network`` is the outside world as the hardened client sees it: the
resolver, the final dial and the TLS trust anchors. Production uses the
system's; tests substitute a resolver with fixed answers and a dial that maps
the checked public addresses to loopback test servers.
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from ipaddress import ip_address

import anyio
import httpcore2

from memorizz.api.errors import PermissionDeniedError
from memorizzd.egress.addresses import (
    IPAddress,
    address_allowed,
    describe,
    metadata_endpoint,
)
from memorizzd.egress.urls import check_host, metadata_refused

Resolver = Callable[[str, int], Awaitable[Sequence[IPAddress]]]
"""``(name, port) -> addresses``: every A and AAAA answer for a normalised DNS name."""


HOSTS_FILE = "/etc/hosts"


async def system_resolve(name: str, port: int) -> list[IPAddress]:
    """The system's answer for ``name`` (a normalised DNS name, no trailing dot).

    A dotted name is looked up as written: in /etc/hosts, then in DNS as an
    absolute name (``name.``). The resolver's search list never applies to
    it: with ``ndots:5`` (Kubernetes' default) glibc tries
    ``name.<search domain>`` first, and whichever of those exists would
    answer for the allowlisted name. A single label (``mcp``, a Kubernetes
    service) keeps the search list: the operator wrote a relative name.
    Whatever answers, every address is checked; the name alone proves nothing.
    """
    if "." in name:
        listed = await anyio.to_thread.run_sync(hosts_file_addresses, name)
        if listed:
            return listed
        name += "."
    infos = await anyio.getaddrinfo(
        name, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
    )
    addresses: list[IPAddress] = []
    for info in infos:
        address = ip_address(info[4][0])
        if address not in addresses:
            addresses.append(address)
    return addresses


def hosts_file_addresses(name: str, path: str = HOSTS_FILE) -> list[IPAddress]:
    """Every address /etc/hosts gives ``name`` (any letter case), in file order;
    empty when it names none or cannot be read. A line is an address and its
    names; ``#`` starts a comment; a line whose address does not parse is
    skipped, as glibc skips it."""
    try:
        with open(path, "rb") as f:
            text = f.read(1 << 20).decode("utf-8", "replace")
    except OSError:
        return []
    wanted = name.lower()
    addresses: list[IPAddress] = []
    for line in text.splitlines():
        fields = line.partition("#")[0].split()
        if len(fields) < 2 or wanted not in (n.lower().rstrip(".") for n in fields[1:]):
            continue
        try:
            address = ip_address(fields[0])
        except ValueError:
            continue
        if address not in addresses:
            addresses.append(address)
    return addresses


@dataclass(frozen=True)
class Network:
    """What the hardened client reaches the world through (tests replace it)."""

    resolve: Resolver = system_resolve
    dial: httpcore2.AsyncNetworkBackend = field(default_factory=httpcore2.AnyIOBackend)
    """Connects to an address that was checked (never given a name)."""
    ssl_context: ssl.SSLContext | None = None
    """Trust anchors; None: the system's (``SSL_CERT_FILE`` and friends are ignored)."""


class PinnedBackend(httpcore2.AsyncNetworkBackend):
    def __init__(
        self,
        network: Network,
        *,
        allowlist: Sequence[str],
        allow_private_network: bool,
    ) -> None:
        self._network = network
        self._allowlist = tuple(allowlist)
        self._private = allow_private_network

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore's interface
        local_address: str | None = None,
        socket_options: Iterable[httpcore2.SOCKET_OPTION] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        addresses = await self.checked_addresses(host, port, timeout)
        # Each address in turn (they all passed); the last failure is the answer.
        for address in addresses[:-1]:
            try:
                return _Dialled(
                    await self._network.dial.connect_tcp(
                        str(address), port, timeout, local_address, socket_options
                    )
                )
            except (httpcore2.ConnectError, httpcore2.ConnectTimeout):
                continue
        return _Dialled(
            await self._network.dial.connect_tcp(
                str(addresses[-1]), port, timeout, local_address, socket_options
            )
        )

    async def checked_addresses(
        self, host: str, port: int, within: float | None = None
    ) -> list[IPAddress]:
        """The addresses ``host`` may be reached at; raises if any is denied.

        Resolution is bounded by ``within`` seconds (the connect timeout)."""
        # httpcore passes the URL's host as httpx encoded it; IPv6 unbracketed.
        name, literal = check_host(
            f"[{host}]" if ":" in host else host,
            allowlist=self._allowlist,
            allow_private_network=self._private,
        )
        if literal is not None:
            return [literal]
        try:
            with anyio.fail_after(within):
                addresses = list(await self._network.resolve(name, port))
        except TimeoutError:
            raise httpcore2.ConnectTimeout(
                f"{name}: name resolution timed out"
            ) from None
        except OSError as exc:
            raise httpcore2.ConnectError(
                f"{name}: name resolution failed: {exc.strerror or exc}"
            ) from None
        if not addresses:
            raise httpcore2.ConnectError(f"{name}: the name has no addresses")
        metadata = [a for a in addresses if metadata_endpoint(a)]
        if metadata:
            shown = ", ".join(describe(a) for a in metadata)
            raise metadata_refused(f"{name} resolves to {shown}, which", host=name)
        if not self._private:
            denied = [a for a in addresses if not address_allowed(a)]
            if denied:
                raise PermissionDeniedError(
                    f"address_not_allowed: {name} resolves to "
                    f"{', '.join(describe(a) for a in denied)}, not a public address; "
                    "set allow_private_network on the server to reach an "
                    "intentional local service",
                    reason="address_not_allowed",
                    data={"host": name},
                )
        return addresses

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore's interface
        socket_options: Iterable[httpcore2.SOCKET_OPTION] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        raise PermissionDeniedError(
            "address_not_allowed: the hardened client never connects to unix sockets",
            reason="address_not_allowed",
        )

    async def sleep(self, seconds: float) -> None:
        await anyio.sleep(seconds)


class _Dialled(httpcore2.AsyncNetworkStream):
    """A dialled connection whose TLS handshake closes it on any way out.

    httpcore closes the socket when the handshake raises an ``Exception``, not
    when it is cancelled (a daemon stopping, a caller's deadline): the socket
    was left to the garbage collector, open."""

    def __init__(self, inner: httpcore2.AsyncNetworkStream) -> None:
        self._inner = inner

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:  # noqa: ASYNC109 - httpcore's interface
        return await self._inner.read(max_bytes, timeout)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:  # noqa: ASYNC109 - httpcore's interface
        await self._inner.write(buffer, timeout)

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore's interface
    ) -> httpcore2.AsyncNetworkStream:
        try:
            return await self._inner.start_tls(ssl_context, server_hostname, timeout)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._inner.aclose()
            raise

    def get_extra_info(self, info: str) -> object:
        return self._inner.get_extra_info(info)
