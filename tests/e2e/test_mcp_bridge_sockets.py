"""``memorizzctl mcp serve`` checks the API socket it was told about.

The installed ``memorizzctl`` against a real daemon: the operator's directory
and an agent profile's (what a container mounts) each hold the API socket
and ``mcp.sock``. ``--socket`` / ``$MEMORIZZ_SOCKET`` naming an API socket
that is not there (or is not a socket) is refused with exit 69, as every
other command refuses it, even though a live ``mcp.sock`` sits beside it;
``--mcp-socket`` names the face itself and is taken as it is. A daemon whose
face is turned off (``mcp_face = false``) is told apart from one without it.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from memorizzd.config import Profile
from memorizzd.listeners import agent_socket_path, face_socket_path
from tests.harness import (
    DaemonHarness,
    daemon_config,
    rmtree,
    short_tempdir,
    tempdir_fixture,
)
from tests.process import MEMORIZZCTL

WAIT_S = 30  # a guard against a hang, never a measurement
INITIALIZE = (
    b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":'
    b'"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}\n'
)


base = tempdir_fixture()


@pytest.fixture(scope="module")
def daemon(base: str) -> Iterator[DaemonHarness]:
    config = daemon_config(
        base,
        profiles=[Profile(name="alpha", uids=[os.getuid()])],
        agents_dir=os.path.join(base, "agents"),
    )
    with DaemonHarness.running(config) as harness:
        yield harness


def _bridge(*args: str, env: dict[str, str] | None = None) -> tuple[int, bytes, str]:
    """The bridge with one ``initialize`` on stdin: its status, stdout, stderr."""
    done = subprocess.run(
        [MEMORIZZCTL, "mcp", "serve", *args],
        input=INITIALIZE,
        capture_output=True,
        env={**os.environ, **(env or {})},
        timeout=WAIT_S,
        check=False,
    )
    return done.returncode, done.stdout, done.stderr.decode()


def _initialized(stdout: bytes) -> bool:
    reply = msgspec.json.decode(stdout.splitlines()[0])
    return bool(reply["id"] == 1 and "serverInfo" in reply["result"])


def _api_sockets(daemon: DaemonHarness) -> dict[str, str]:
    return {
        "operator": daemon.socket,
        "agent": agent_socket_path(daemon.config, "alpha"),
    }


@pytest.mark.parametrize("where", ["operator", "agent"])
@pytest.mark.parametrize("via", ["--socket", "MEMORIZZ_SOCKET"])
def test_an_api_socket_that_is_not_there_is_refused_beside_a_live_face(
    daemon: DaemonHarness, where: str, via: str
) -> None:
    api = _api_sockets(daemon)[where]
    face = face_socket_path(api)
    assert os.path.exists(face)  # the face answers right beside it
    nope = os.path.join(os.path.dirname(api), "nope.sock")
    if via == "--socket":
        status, out, err = _bridge("--socket", nope)
    else:
        status, out, err = _bridge(env={"MEMORIZZ_SOCKET": nope})
    assert (status, out) == (69, b""), err
    assert err.startswith(
        f"memorizzctl: error: cannot reach memorizzd at {nope}: No such file or directory; "
        "is memorizzd running? start it with "
    ), err
    assert "point --socket/MEMORIZZ_SOCKET at its API socket" in err
    assert err.count("\n") == 1


@pytest.mark.parametrize("kind", ["a regular file", "a directory"])
def test_an_api_socket_that_is_not_a_socket_is_refused(
    daemon: DaemonHarness, kind: str
) -> None:
    path = os.path.join(os.path.dirname(daemon.socket), kind.split()[-1])
    if kind == "a directory":
        os.makedirs(path, exist_ok=True)
    else:
        Path(path).touch()
    status, out, err = _bridge("--socket", path)
    assert (status, out) == (69, b""), err
    assert err == (
        f"memorizzctl: error: cannot reach memorizzd: {path} is {kind}, not a socket;"
        " point --socket/MEMORIZZ_SOCKET at its API socket\n"
    )


@pytest.mark.parametrize("where", ["operator", "agent"])
def test_the_api_socket_or_the_face_named_directly_bridges(
    daemon: DaemonHarness, where: str
) -> None:
    api = _api_sockets(daemon)[where]
    status, out, err = _bridge("--socket", api)
    assert status == 0, err
    assert _initialized(out)
    # --mcp-socket names the face itself: the API socket is not looked at
    nope = os.path.join(os.path.dirname(api), "nope.sock")
    status, out, err = _bridge(
        "--mcp-socket", face_socket_path(api), env={"MEMORIZZ_SOCKET": nope}
    )
    assert status == 0, err
    assert _initialized(out)


def test_a_daemon_with_its_face_turned_off_says_so() -> None:
    base = short_tempdir()
    try:
        with DaemonHarness.running(daemon_config(base, mcp_face=False)) as faceless:
            assert not os.path.exists(face_socket_path(faceless.socket))
            status, out, err = _bridge("--socket", faceless.socket)
    finally:
        rmtree(base)
    assert (status, out) == (69, b""), err
    face = face_socket_path(faceless.socket)
    assert err == (
        f"memorizzctl: error: cannot reach memorizzd's MCP socket at {face}: No such file"
        f" or directory; its API socket {faceless.socket} answers: its MCP face may be"
        " turned off (`mcp_face = false` in its config) or this memorizzd may predate it"
        " (upgrade and restart it)\n"
    )
