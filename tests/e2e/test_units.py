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
EXPOSURE_AT_MOST = 9.1
"""``systemd-analyze security --offline=yes`` of memorizzd.service: never worse."""

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
    verified = subprocess.run(
        [str(ANALYZE), "verify", SERVICE.name, SOCKET.name],
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
    assert float(level.group(1)) <= EXPOSURE_AT_MOST
