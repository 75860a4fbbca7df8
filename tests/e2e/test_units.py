"""The systemd units under systemd/: the settings the daemon relies on, and
``systemd-analyze verify`` (skipped where systemd-analyze is not installed;
nothing here needs a running systemd)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.harness import DAEMON_EXE

UNITS = Path(__file__).parents[2] / "systemd"
SERVICE = UNITS / "memorizzd.service"
SOCKET = UNITS / "memorizzd.socket"
MCP_SOCKET = UNITS / "memorizzd-mcp.socket"
EXPOSURE_AT_MOST = 2.0
"""``systemd-analyze security --offline=yes`` of memorizzd.service (9.1 as root,
unsandboxed; 1.6 now): never worse than 2.0."""

ANALYZE = shutil.which("systemd-analyze")
needs_analyze = pytest.mark.skipif(
    ANALYZE is None, reason="systemd-analyze not installed"
)


def _settings(path: Path) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        if "=" in line and not line.lstrip().startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            found.setdefault(key.strip(), []).append(value.strip())
    return found


def test_the_runtime_directory_survives_a_service_stop() -> None:
    """memorizzd.socket's sockets live in /run/memorizzd, the service's
    RuntimeDirectory: without RuntimeDirectoryPreserve=yes every stop or
    restart of the service deletes them."""
    service, sockets = _settings(SERVICE), _settings(SOCKET)
    assert service["RuntimeDirectory"] == ["memorizzd"]
    assert service["RuntimeDirectoryPreserve"] == ["yes"]
    assert all(path.startswith("/run/memorizzd/") for path in sockets["ListenStream"])
    assert sockets["RemoveOnStop"] == ["no"]


def test_the_service_sets_its_open_files_limit() -> None:
    assert _settings(SERVICE)["LimitNOFILE"] == ["65536"]


def test_the_service_has_a_watchdog_the_daemon_pings() -> None:
    """systemd kills and restarts a daemon whose event loop stops pinging
    (tests/e2e/test_watchdog.py shows the pings stop when the loop blocks).
    NotifyAccess=main: the pings come from the main process itself."""
    service = _settings(SERVICE)
    assert service["Type"] == ["notify"]
    assert service["NotifyAccess"] == ["main"]
    assert service["WatchdogSec"] == ["30s"]
    assert service["Restart"] == ["on-failure"]  # a watchdog timeout is a failure


@needs_analyze
def test_the_units_verify_and_keep_their_exposure(tmp_path: Path) -> None:
    # The units as shipped, but ExecStart pointing at this checkout's memorizzd
    # (verify checks that the executable exists).
    text = re.sub(
        r"^ExecStart=\S+",
        f"ExecStart={DAEMON_EXE}",
        SERVICE.read_text(),
        flags=re.MULTILINE,
    )
    (tmp_path / SERVICE.name).write_text(text)
    shutil.copy(SOCKET, tmp_path / SOCKET.name)
    shutil.copy(MCP_SOCKET, tmp_path / MCP_SOCKET.name)
    verified = subprocess.run(
        [str(ANALYZE), "verify", SERVICE.name, SOCKET.name, MCP_SOCKET.name],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert verified.returncode == 0, verified.stderr
    assert verified.stderr == "", verified.stderr
    security = subprocess.run(
        [str(ANALYZE), "security", "--offline=yes", SERVICE.name],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    level = re.search(r"Overall exposure level for \S+: ([0-9.]+)", security.stdout)
    assert level is not None, security.stdout + security.stderr
    assert float(level.group(1)) <= EXPOSURE_AT_MOST, security.stdout


def test_the_service_runs_as_its_own_user_in_a_sandbox() -> None:
    """Not root; the directories from systemd; the vault key as a credential;
    and the sandbox settings a daemon spawning node and python servers keeps
    (the unit's comments say why each one left out is)."""
    service = _settings(SERVICE)
    assert service["User"] == ["memorizzd"]
    assert service["SupplementaryGroups"] == ["memorizzd-operators"]
    assert service["StateDirectory"] == ["memorizzd"]
    assert service["ConfigurationDirectory"] == ["memorizzd"]
    assert service["LoadCredentialEncrypted"] == ["memorizzd-key"]
    for key, value in {
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "NoNewPrivileges": "yes",
        "CapabilityBoundingSet": "",
    }.items():
        assert service[key] == [value], key
    text = SERVICE.read_text()
    for left_out in ("MemoryDenyWriteExecute=", "PrivateUsers=", "PrivateNetwork="):
        assert f"# - {left_out}" in text, left_out
    assert "come with the operations work" not in text


def test_the_sockets_let_the_operators_group_in() -> None:
    for unit in (SOCKET, MCP_SOCKET):
        sockets = _settings(unit)
        assert sockets["SocketUser"] == ["memorizzd"]
        assert sockets["SocketGroup"] == ["memorizzd-operators"]
        assert sockets["SocketMode"] == ["0660"]
    assert _settings(SOCKET)["Also"] == ["memorizzd-mcp.socket"]
