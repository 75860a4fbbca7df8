"""A small fake Internet for the egress tests, all of it on loopback.

* ``TLS``: a throwaway CA and a certificate for ``mcp.example.test`` and
  ``*.example.test``, so the hardened client verifies a real certificate
  against the URL's host name while it talks to 127.0.0.1.
* ``FakeDNS``: the only mock, the DNS answer. Names map to fixed addresses
  (a list of answers is served in turn: rebinding); any other name fails as
  NXDOMAIN, so no test ever asks the system resolver.
* ``LoopbackDial``: the pinned backend's final dial. It maps a checked public
  address and port (``8.8.8.8:443``) to a loopback test server and refuses
  anything else loudly, so a test cannot reach a non-loopback address even
  when the code under test is wrong.
* ``serve_https``: a uvicorn server with that certificate on 127.0.0.1, for
  the test MCP server (Streamable HTTP or SSE) behind ``trap_app``, which
  answers some requests with a redirect, a gzip bomb or ``Connection: close``.
* ``client``: the hardened client on a ``World``'s network (``refused``: how
  it refuses a request); ``recording_listener``: a would-be proxy.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import gzip
import ipaddress
import socket
import ssl
import tempfile
import threading
from collections.abc import Awaitable, Callable, Iterable, Iterator, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpcore2
import httpx2
import msgspec
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from memorizz.api.errors import RemoteError
from memorizzd.egress.addresses import IPAddress
from memorizzd.egress.backend import Network
from memorizzd.egress.client import hardened_client
from tests.harness import rmtree, serve_asgi

PUBLIC_NAME = "mcp.example.test"
PUBLIC_V4 = "8.8.8.8"
"""What ``mcp.example.test`` resolves to: a public address, never dialled for real."""
PUBLIC_V6 = "2001:4860:4860::8888"
SECOND_NAME = "second.example.test"
"""Another allowlisted public name (in the certificate too): a redirect target
that would work if a redirect were followed."""
SECOND_V4 = "9.9.9.9"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


@dataclass
class TLS:
    certfile: str
    keyfile: str
    cafile: str
    ca_pem: str

    def client_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cadata=self.ca_pem)


def make_tls(
    directory: str, names: tuple[str, ...] = (PUBLIC_NAME, "*.example.test")
) -> TLS:
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "memorizz test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, PUBLIC_NAME)]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName(name) for name in names]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    certfile = Path(directory, "cert.pem")
    keyfile = Path(directory, "key.pem")
    certfile.write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    keyfile.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    ca_pem = ca.public_bytes(serialization.Encoding.PEM).decode()
    cafile = Path(directory, "ca.pem")
    cafile.write_text(ca_pem)
    return TLS(str(certfile), str(keyfile), str(cafile), ca_pem)


@contextlib.contextmanager
def tls_material(
    names: tuple[str, ...] = (PUBLIC_NAME, "*.example.test"),
) -> Iterator[TLS]:
    directory = tempfile.mkdtemp(prefix="mz-tls-", dir="/tmp")
    try:
        yield make_tls(directory, names)
    finally:
        rmtree(directory)


@dataclass
class FakeDNS:
    """``name -> addresses``, or a list of answers served in turn (the last repeats)."""

    answers: dict[str, list[str] | list[list[str]]] = field(default_factory=dict)
    lookups: list[str] = field(default_factory=list)

    async def __call__(self, host: str, port: int) -> list[IPAddress]:
        self.lookups.append(host)
        entry = self.answers.get(host)
        if not entry:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        if isinstance(entry[0], list):
            turn = sum(1 for name in self.lookups if name == host) - 1
            answer: Any = entry[min(turn, len(entry) - 1)]
        else:
            answer = entry
        return [ipaddress.ip_address(a) for a in answer]


class UnmappedDial(AssertionError):
    """The code under test dialled an address no route maps to loopback."""


@dataclass
class LoopbackDial(httpcore2.AsyncNetworkBackend):
    """Dials ``(checked address, port)`` as ``127.0.0.1:<route>``; nothing else."""

    routes: dict[tuple[str, int], int] = field(default_factory=dict)
    dialled: list[tuple[str, int]] = field(default_factory=list)

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore's interface
        local_address: str | None = None,
        socket_options: Iterable[httpcore2.SOCKET_OPTION] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        self.dialled.append((host, port))
        target = self.routes.get((host, port))
        if target is None:
            raise UnmappedDial(
                f"dialled {host}:{port}, which no route maps to loopback"
            )
        return await httpcore2.AnyIOBackend().connect_tcp(
            "127.0.0.1", target, timeout=timeout
        )


@dataclass
class World:
    """Everything a test needs to reach ``https://mcp.example.test`` on loopback."""

    tls: TLS
    dns: FakeDNS
    dial: LoopbackDial

    def network(self) -> Network:
        return Network(
            resolve=self.dns, dial=self.dial, ssl_context=self.tls.client_context()
        )

    def route(self, address: str, port: int, loopback_port: int) -> None:
        self.dial.routes[(address, port)] = loopback_port


def client(world: World, **overrides: Any) -> httpx2.AsyncClient:
    """The hardened client on ``world``'s network: no allowlist, no private
    network, 1 MiB bodies, 10 s; ``overrides`` replace any of its settings."""
    options: dict[str, Any] = {
        "limit": 1 << 20,
        "timeout": httpx2.Timeout(10.0),
        "allowlist": [],
        "allow_private_network": False,
        "network": world.network(),
    }
    options.update(overrides)
    return hardened_client(**options)


async def refused(world: World, url: str, **overrides: Any) -> RemoteError:
    """The error ``client(world, **overrides)`` refuses ``GET url`` with."""
    async with client(world, **overrides) as http:
        with pytest.raises(RemoteError) as err:
            await http.get(url)
    return err.value


@contextlib.contextmanager
def recording_listener() -> Iterator[tuple[int, list[bytes]]]:
    """A loopback listener that records what connects to it (a would-be
    proxy): its port, and the first bytes each connection sent."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    seen: list[bytes] = []

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(2)
                try:
                    seen.append(conn.recv(4096))
                except OSError:
                    seen.append(b"")

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1], seen
    finally:
        listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        thread.join(timeout=5)


# --- servers ---------------------------------------------------------------------

TRAP_TOOLS = {
    "__redirect_private": "redirect_private",
    "__redirect_http": "redirect_http",
    "__redirect_same_origin": "redirect_same_origin",
    "__gzip": "gzip",
}
"""``tools/call`` of these names is answered by ``trap_app``, never by the server."""

BOMB_BYTES = 16 << 20


@functools.cache
def gzip_bomb() -> bytes:
    """16 MiB of zeros in about 16 KiB."""
    return gzip.compress(b"0" * BOMB_BYTES, compresslevel=9)


async def _respond(
    send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes = b""
) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def answer_trap(
    action: str, scope: Scope, send: Send, receive: Receive | None = None
) -> None:
    """Answer one request the way ``action`` says."""
    if action == "headers":  # what the client sent, as JSON
        sent = {k.decode(): v.decode() for k, v in scope["headers"]}
        body = msgspec.json.encode(sent)
        await _respond(send, 200, [(b"content-type", b"application/json")], body)
    elif action.startswith("redirect_"):
        status, location = redirect_of(action)
        await _respond(send, status, [(b"location", location.encode())])
    elif action == "gzip":
        headers = [
            (b"content-type", b"application/json"),
            (b"content-encoding", b"gzip"),
            (b"content-length", str(len(gzip_bomb())).encode()),
        ]
        await _respond(send, 200, headers, gzip_bomb())
    elif action.startswith("sse_"):
        await _sse_trap(action, scope, receive, send)
    elif action == "close":
        headers = [(b"content-type", b"text/plain"), (b"connection", b"close")]
        await _respond(send, 200, headers, b"ok")
    else:
        await _respond(send, 200, [(b"content-type", b"text/plain")], b"ok")


REDIRECT_TARGETS = {
    "private": "http://169.254.169.254/latest/meta-data/",
    "http": f"http://{PUBLIC_NAME}/mcp",
    "same_origin": "/mcp/",
    "allowed": f"https://{SECOND_NAME}/trap/ok",
}
"""Where ``/trap/redirect_<status>_<target>`` sends the client."""
_REDIRECT_ALIASES = {
    "redirect_private": "redirect_302_private",
    "redirect_http": "redirect_302_http",
    "redirect_same_origin": "redirect_307_same_origin",
}


def redirect_of(action: str) -> tuple[int, str]:
    """``redirect_<status>_<target>`` (or an older alias): status and Location."""
    _, status, target = _REDIRECT_ALIASES.get(action, action).split("_", 2)
    return int(status), REDIRECT_TARGETS[target]


SSE_TRAPS = {
    # What a legacy SSE stream sends first; {origin} is the stream's own.
    "sse_foreign": "event: endpoint\ndata: https://evil.example.test/messages/?s=1\n\n",
    "sse_foreign_http": "event: endpoint\ndata: http://{host}/messages/?s=1\n\n",
    "sse_foreign_port": "event: endpoint\ndata: https://{host}:8443/messages/?s=1\n\n",
    "sse_foreign_relative": "event: endpoint\ndata: //evil.example.test/messages/\n\n",
    "sse_message_first": (
        'data: {{"jsonrpc":"2.0","method":"notifications/message",'
        '"params":{{"level":"info","data":"x"}}}}\n\n'
        "event: endpoint\ndata: /messages/?s=1\n\n"
    ),
    "sse_silent": ": ping\n\n",
    "sse_closed": "",
}
"""``/trap/<name>``: an event stream that starts like this, then idles
(``sse_closed`` ends at once)."""


async def _sse_trap(
    action: str, scope: Scope, receive: Receive | None, send: Send
) -> None:
    host = dict(scope["headers"]).get(b"host", b"").decode()
    body = SSE_TRAPS[action].format(host=host).encode()
    headers = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-store")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": True})
    if action == "sse_closed" or receive is None:
        await send({"type": "http.response.body", "body": b""})
        return
    while (await receive())["type"] != "http.disconnect":
        pass  # hold the stream open until the client goes


def trap_app(inner: ASGIApp | None = None, log: list[str] | None = None) -> ASGIApp:
    """``/trap/<action>`` answers with ``answer_trap``; a ``tools/call`` of a
    ``TRAP_TOOLS`` name too; everything else goes to ``inner``. ``log`` gets
    ``"<method> <path>"`` of every HTTP request."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if inner is not None:
                await inner(scope, receive, send)
            return
        path: str = scope["path"]
        if log is not None:
            log.append(f"{scope['method']} {path}")
        if path.startswith("/trap/"):
            await answer_trap(path.removeprefix("/trap/"), scope, send, receive)
            return
        if inner is None:
            await _respond(send, 404, [(b"content-type", b"text/plain")], b"no")
            return
        if scope["method"] != "POST":
            await inner(scope, receive, send)
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if (action := _trap_of(body)) is not None:
            await answer_trap(action, scope, send)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await inner(scope, replay, send)

    return app


def _trap_of(body: bytes) -> str | None:
    try:
        message = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return None
    if not isinstance(message, dict) or message.get("method") != "tools/call":
        return None
    params = message.get("params")
    name = params.get("name") if isinstance(params, dict) else None
    return TRAP_TOOLS.get(name) if isinstance(name, str) else None


def mcp_app(kind: str, host: str = PUBLIC_NAME) -> ASGIApp:
    """The test MCP server; it accepts ``Host: <host>`` (and only that)."""
    from mcp.server.transport_security import TransportSecuritySettings

    from tests.mcp_server import mcp

    security = TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=[host, f"{host}:*"],
        allowed_origins=[],
    )
    if kind == "streamable_http":
        app: ASGIApp = mcp.streamable_http_app(transport_security=security)
    else:
        app = mcp.sse_app(transport_security=security)
    return app


@contextlib.contextmanager
def serve(app: ASGIApp, tls: TLS | None, *, lifespan: str = "on") -> Iterator[int]:
    """Serve ``app`` on 127.0.0.1 in a thread, over HTTPS with ``tls`` (else
    plain HTTP); yields the port."""
    certs = {"ssl_certfile": tls.certfile, "ssl_keyfile": tls.keyfile} if tls else {}
    with serve_asgi(lambda _base: app, lifespan=lifespan, **certs) as base:
        yield int(base.rsplit(":", 1)[1])


# --- a real resolver's world: a DNS server for a test's own network namespace ------

Record = tuple[str, str]
"""``("A", "8.8.8.8")``, ``("AAAA", "2001:db8::1")`` or ``("CNAME", "other.name")``."""

_QTYPES = {1: "A", 5: "CNAME", 28: "AAAA"}
_RTYPES = {name: number for number, name in _QTYPES.items()}


@dataclass
class TinyDNS:
    """A UDP DNS server answering from ``zone`` with TTL 0 (nothing is cached).

    ``zone`` maps a name to its answers, served in turn per query type (the
    last repeats: rebinding), each a list of records; a CNAME is followed
    inside the zone as a recursive resolver would. A name not in the zone is
    NXDOMAIN. ``queries`` gets ``"<name> <type>"`` of every question. It binds
    wherever it is told (port 53 needs a network namespace of the test's own:
    ``unshare -rn``), so the system resolver (``getaddrinfo``) can be pointed
    at it with a ``resolv.conf``.
    """

    zone: dict[str, list[list[Record]]]
    queries: list[str] = field(default_factory=list)
    _turns: dict[tuple[str, str], int] = field(default_factory=dict)

    def answer(self, packet: bytes) -> bytes | None:
        if len(packet) < 17:
            return None
        offset, labels = 12, []
        while (length := packet[offset]) != 0:
            labels.append(packet[offset + 1 : offset + 1 + length].decode("ascii"))
            offset += 1 + length
        end = offset + 5
        qtype = int.from_bytes(packet[offset + 1 : offset + 3], "big")
        name = ".".join(labels).lower()
        kind = _QTYPES.get(qtype, str(qtype))
        self.queries.append(f"{name} {kind}")
        records = self._records(name, kind, depth=0)
        flags = 0x8180 | (3 if records is None else 0)  # NXDOMAIN when unknown
        answers = b"".join(
            _rr(owner, rtype, value) for owner, rtype, value in records or []
        )
        header = packet[:2] + flags.to_bytes(2, "big") + b"\x00\x01"
        counts = len(records or []).to_bytes(2, "big") + b"\x00\x00\x00\x00"
        return header + counts + packet[12:end] + answers

    def _records(
        self, name: str, kind: str, depth: int
    ) -> list[tuple[str, str, str]] | None:
        turns = self.zone.get(name)
        if turns is None or depth > 8:
            return None
        key = (name, kind)
        turn = self._turns.get(key, 0)
        self._turns[key] = turn + 1
        found: list[tuple[str, str, str]] = []
        for rtype, value in turns[min(turn, len(turns) - 1)]:
            if rtype == "CNAME":
                found.append((name, rtype, value))
                found.extend(self._records(value, kind, depth + 1) or [])
            elif rtype == kind:
                found.append((name, rtype, value))
        return found

    def serve(self, sock: socket.socket) -> None:
        """Answer on the bound UDP ``sock`` until it is closed."""
        while True:
            try:
                packet, peer = sock.recvfrom(4096)
            except OSError:
                return
            reply = self.answer(packet)
            if reply is not None:
                sock.sendto(reply, peer)


def _wire_name(name: str) -> bytes:
    return (
        b"".join(
            len(label).to_bytes(1, "big") + label.encode("ascii")
            for label in name.split(".")
        )
        + b"\x00"
    )


def _rr(owner: str, rtype: str, value: str) -> bytes:
    name = rtype == "CNAME"
    data = _wire_name(value) if name else ipaddress.ip_address(value).packed
    return (
        _wire_name(owner)
        + _RTYPES[rtype].to_bytes(2, "big")
        + b"\x00\x01\x00\x00\x00\x00"  # class IN, TTL 0
        + len(data).to_bytes(2, "big")
        + data
    )
