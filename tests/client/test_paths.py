"""Where the daemon's socket is by default (memorizz/api/paths.py): one
function, used by the client library, memorizzctl's one-shot path and the MCP
bridge alike (neither of the last two loads msgspec to find it)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from memorizz.api import paths
from memorizz.ctl import oneshot, serve


@pytest.mark.parametrize(
    ("euid", "env", "expected"),
    [
        (1000, {"MEMORIZZ_SOCKET": "/srv/mz.sock"}, "/srv/mz.sock"),
        (0, {"MEMORIZZ_SOCKET": "/srv/mz.sock"}, "/srv/mz.sock"),
        (0, {}, "/run/memorizzd/memorizzd.sock"),
        (0, {"XDG_RUNTIME_DIR": "/run/user/0"}, "/run/memorizzd/memorizzd.sock"),
        (
            1000,
            {"XDG_RUNTIME_DIR": "/run/user/1000"},
            "/run/user/1000/memorizzd/memorizzd.sock",
        ),
        (1000, {}, "/tmp/memorizzd-1000/memorizzd.sock"),
    ],
)
def test_the_default_socket(
    euid: int, env: dict[str, str], expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MEMORIZZ_SOCKET", raising=False)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(os, "geteuid", lambda: euid)
    monkeypatch.setattr(paths, "SYSTEM_SOCKET", "/nonexistent/memorizzd.sock")
    assert paths.default_socket_path() == expected
    call = oneshot.parse(["mcp", "call", "s", "t"])
    assert call is not None
    assert call.socket_path == expected
    bridge = serve.parse(["mcp", "serve"])
    assert bridge is not None
    assert bridge.mcp_socket == os.path.join(os.path.dirname(expected), "mcp.sock")


def test_an_operator_without_a_daemon_of_their_own_reaches_the_system_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    system = tmp_path / "memorizzd.sock"
    system.touch()
    monkeypatch.delenv("MEMORIZZ_SOCKET", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "runtime"))
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(paths, "SYSTEM_SOCKET", str(system))
    assert paths.default_socket_path() == str(system)
    own = tmp_path / "runtime" / "memorizzd" / "memorizzd.sock"
    own.parent.mkdir(parents=True)
    own.touch()  # a daemon of their own: theirs wins
    assert paths.default_socket_path() == str(own)
