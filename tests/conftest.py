"""Fixtures for every room of tests/ (client, component, daemon, e2e).

The daemon's harness is imported where a fixture needs it, not here: the
client's tests (tests/client/) run without loading the daemon.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from tests.harness import DaemonHarness


def _tempdir() -> str:
    """Under /tmp: AF_UNIX paths must stay under 108 bytes (as harness.short_tempdir)."""
    return tempfile.mkdtemp(prefix="mz-", dir="/tmp")


@pytest.fixture
def base_dir() -> Iterator[str]:
    path = _tempdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def daemon(base_dir: str) -> Iterator[DaemonHarness]:
    """An in-process daemon with no servers."""
    from tests.harness import DaemonHarness, daemon_config

    with DaemonHarness.running(daemon_config(base_dir)) as harness:
        yield harness


@pytest.fixture
def stdio_daemon(base_dir: str) -> Iterator[DaemonHarness]:
    """An in-process daemon with one warm stdio test server named ``t``."""
    from tests.harness import DaemonHarness, daemon_config, stdio_spec

    with DaemonHarness.running(
        daemon_config(base_dir, servers=[stdio_spec("t")])
    ) as harness:
        harness.wait_ready("t")
        yield harness


@pytest.fixture(scope="module")
def shared_daemon() -> Iterator[DaemonHarness]:
    """As ``daemon``, one for a whole module: for tests that add servers of
    their own names, or read, and leave nothing behind that others would see."""
    from tests.harness import DaemonHarness, daemon_config

    base = _tempdir()
    try:
        with DaemonHarness.running(daemon_config(base)) as harness:
            yield harness
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def shared_stdio_daemon() -> Iterator[DaemonHarness]:
    """As ``stdio_daemon``, one for a whole module (a server's start costs a
    second or more): for tests that change nothing in it and break nothing,
    each on connections of its own."""
    from tests.harness import DaemonHarness, daemon_config, stdio_spec

    base = _tempdir()
    try:
        with DaemonHarness.running(
            daemon_config(base, servers=[stdio_spec("t")])
        ) as harness:
            harness.wait_ready("t")
            yield harness
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(autouse=True)
def sdk_kept_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """The daemon's entry point (``memorizzd.__main__.main``), run in this
    process by a test (``--check-config``), installs the guard that keeps
    the MCP SDK's server side out of the daemon's process for good
    (``memorizzd/sdk_client_side.py``); every later test in the worker that
    runs an SDK server here would then fail (``ServerSideNotLoaded``), or
    not, by how xdist happened to group the modules. The pytest process
    keeps the whole SDK: the guard is tested in fresh interpreters
    (tests/daemon/test_sdk_client_side.py)."""
    module = sys.modules.get("memorizzd.sdk_client_side")
    if module is not None:
        monkeypatch.setattr(module, "install", lambda: False)


@pytest.fixture(autouse=True)
def network_tripwire(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Tests send packets to loopback only.

    A connect to a non-loopback address, or a name lookup of anything but
    ``localhost`` or a loopback address, raises at once and fails the test at
    teardown even if the code under test swallowed the error. Python sockets
    (``connect``, ``connect_ex``) and anyio's ``connect_tcp``/``getaddrinfo``
    are watched: asyncio and uvloop connect below ``socket.connect``, and every
    connection the daemon makes goes through anyio (httpcore's AnyIOBackend).
    """
    import ipaddress
    import socket

    import anyio

    violations: list[str] = []

    def loopback(host: object) -> bool:
        if isinstance(host, bytes):
            host = host.decode(errors="replace")
        if host in (None, "", "localhost"):
            return True
        try:
            return ipaddress.ip_address(str(host).split("%")[0]).is_loopback
        except ValueError:
            return False

    def refuse(what: str) -> None:
        violations.append(what)
        raise AssertionError(f"network tripwire: {what} (tests reach loopback only)")

    def checked(sock: socket.socket, address: Any) -> None:
        inet = sock.family in (socket.AF_INET, socket.AF_INET6)
        if inet and not loopback(address[0]):
            refuse(f"connect to {address!r}")

    real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex

    def connect(self: socket.socket, address: Any) -> None:
        checked(self, address)
        real_connect(self, address)

    def connect_ex(self: socket.socket, address: Any) -> int:
        checked(self, address)
        return real_connect_ex(self, address)

    real_getaddrinfo = socket.getaddrinfo

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if not loopback(host):
            refuse(f"name lookup of {host!r}")
        return real_getaddrinfo(host, *args, **kwargs)

    real_connect_tcp, real_anyio_getaddrinfo = anyio.connect_tcp, anyio.getaddrinfo

    async def connect_tcp(remote_host: Any, remote_port: int, **kwargs: Any) -> Any:
        if not loopback(remote_host):
            refuse(f"connect to {remote_host!r}:{remote_port}")
        return await real_connect_tcp(remote_host, remote_port, **kwargs)

    async def anyio_getaddrinfo(host: Any, port: Any, **kwargs: Any) -> Any:
        if not loopback(host):
            refuse(f"name lookup of {host!r}")
        return await real_anyio_getaddrinfo(host, port, **kwargs)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(anyio, "connect_tcp", connect_tcp)
    monkeypatch.setattr(anyio, "getaddrinfo", anyio_getaddrinfo)
    yield violations
    if violations:
        pytest.fail("network tripwire: " + "; ".join(violations))
