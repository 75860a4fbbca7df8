"""scripts/install and scripts/uninstall, into a temporary DESTDIR.

``--no-venv`` lays out everything but the virtual environment (the links
point into /opt/memorizzd as they would on the host); the installed units
are checked with ``systemd-analyze verify`` and ``security --offline=yes``,
the sysusers.d and tmpfiles.d snippets with ``systemd-sysusers`` and
``systemd-tmpfiles`` run with ``--root`` on the tree (each skipped where the
tool is not installed; nothing here needs a running systemd or the network).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from tests.harness import DAEMON_EXE

ROOT = Path(__file__).parents[2]
INSTALL = ROOT / "scripts" / "install"
UNINSTALL = ROOT / "scripts" / "uninstall"
UNITS = ("memorizzd.service", "memorizzd.socket", "memorizzd-mcp.socket")
EXPOSURE_AT_MOST = 2.0


def _run(script: Path, dest: Path, *args: str, **env: str) -> str:
    done = subprocess.run(
        [str(script), *args],
        env={**os.environ, "DESTDIR": str(dest), **env},
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stderr


def _tree(dest: Path) -> dict[str, tuple[int, str]]:
    """Every path under ``dest``: its mode, and its link target or content hash."""
    found: dict[str, tuple[int, str]] = {}
    for path in sorted(dest.rglob("*")):
        st = path.lstat()
        if path.is_symlink():
            what = "-> " + os.readlink(path)
        elif path.is_file():
            what = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            what = "dir"
        found[str(path.relative_to(dest))] = (stat.S_IMODE(st.st_mode), what)
    return found


@pytest.fixture
def dest(tmp_path: Path) -> Path:
    root = tmp_path / "dest"
    _run(INSTALL, root, "--no-venv")
    return root


def test_install_links_the_commands_and_lays_out_units_users_and_config(
    dest: Path,
) -> None:
    for exe in ("memorizzd", "memorizzctl"):
        link = dest / "usr/local/bin" / exe
        assert os.readlink(link) == f"/opt/memorizzd/bin/{exe}"
    unit_dir = dest / "etc/systemd/system"
    for unit in UNITS:
        assert stat.S_IMODE((unit_dir / unit).stat().st_mode) == 0o644
        assert (unit_dir / unit).read_text() == (ROOT / "systemd" / unit).read_text()
    sysusers = dest / "etc/sysusers.d/memorizzd.conf"
    tmpfiles = dest / "etc/tmpfiles.d/memorizzd.conf"
    assert sysusers.read_bytes() == (ROOT / "systemd/memorizzd.sysusers").read_bytes()
    assert tmpfiles.read_bytes() == (ROOT / "systemd/memorizzd.tmpfiles").read_bytes()
    config = dest / "etc/memorizzd/memorizzd.toml"
    assert stat.S_IMODE(config.stat().st_mode) == 0o640  # it may hold secret env
    assert 'groups = ["memorizzd-operators"]' in config.read_text()
    assert 'socket_group = "memorizzd-operators"' in config.read_text()
    docs = dest / "usr/local/share/doc/memorizzd"
    assert (docs / "README.md").exists()
    assert (docs / "docs/operations.md").exists()
    assert (docs / "examples/memorizzd.service.d/writable.conf").exists()


def test_install_is_idempotent_and_keeps_an_edited_config(dest: Path) -> None:
    config = dest / "etc/memorizzd/memorizzd.toml"
    config.write_text("# the operator's own\n")
    before = _tree(dest)
    said = _run(INSTALL, dest, "--no-venv")
    assert _tree(dest) == before
    assert "kept" in said
    assert config.read_text() == "# the operator's own\n"


def test_prefix_moves_the_links_and_the_unit_follows(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    _run(INSTALL, dest, "--no-venv", PREFIX="/usr")
    assert os.readlink(dest / "usr/bin/memorizzd") == "/opt/memorizzd/bin/memorizzd"
    service = (dest / "etc/systemd/system/memorizzd.service").read_text()
    assert re.search(r"^ExecStart=/usr/bin/memorizzd$", service, re.MULTILINE)
    assert "file:///usr/share/doc/memorizzd/README.md" in service
    assert not (dest / "usr/local").exists()


SYSUSERS = shutil.which("systemd-sysusers")
TMPFILES = shutil.which("systemd-tmpfiles")


@pytest.mark.skipif(SYSUSERS is None, reason="systemd-sysusers not installed")
def test_sysusers_makes_the_daemons_user_and_the_operators_group(dest: Path) -> None:
    assert SYSUSERS is not None
    subprocess.run(
        [SYSUSERS, f"--root={dest}", str(dest / "etc/sysusers.d/memorizzd.conf")],
        check=True,
        capture_output=True,
        timeout=30,
    )
    passwd = {
        line.split(":")[0]: line.split(":")
        for line in (dest / "etc/passwd").read_text().splitlines()
    }
    groups = {
        line.split(":")[0] for line in (dest / "etc/group").read_text().splitlines()
    }
    assert {"memorizzd", "memorizzd-operators"} <= groups
    user = passwd["memorizzd"]
    assert user[5] == "/var/lib/memorizzd"  # HOME: the one writable place of its own
    assert user[6].endswith("nologin")


@pytest.mark.skipif(
    shutil.which("systemd-tmpfiles") is None
    or shutil.which("systemd-sysusers") is None,
    reason="systemd-tmpfiles or systemd-sysusers not installed",
)
def test_tmpfiles_makes_the_runtime_and_state_directories(dest: Path) -> None:
    assert SYSUSERS is not None
    assert TMPFILES is not None
    subprocess.run([SYSUSERS, f"--root={dest}"], check=True, capture_output=True)
    subprocess.run(
        [
            TMPFILES,
            f"--root={dest}",
            "--create",
            str(dest / "etc/tmpfiles.d/memorizzd.conf"),
        ],
        check=True,
        capture_output=True,
        timeout=30,
    )
    assert stat.S_IMODE((dest / "run/memorizzd").stat().st_mode) == 0o755
    assert stat.S_IMODE((dest / "var/lib/memorizzd").stat().st_mode) == 0o700


ANALYZE = shutil.which("systemd-analyze")


@pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze not installed")
def test_the_installed_units_verify_and_score_at_most_2(
    dest: Path, tmp_path: Path
) -> None:
    """The units as installed; ExecStart names this checkout's memorizzd,
    since verify checks the executable exists (the DESTDIR's link points into
    a venv that --no-venv did not make)."""
    assert ANALYZE is not None
    work = tmp_path / "units"
    work.mkdir()
    for unit in UNITS:
        text = (dest / "etc/systemd/system" / unit).read_text()
        text = re.sub(
            r"^ExecStart=/usr/local/bin/memorizzd",
            f"ExecStart={DAEMON_EXE}",
            text,
            flags=re.MULTILINE,
        )
        (work / unit).write_text(text)
    verified = subprocess.run(
        [ANALYZE, "verify", *UNITS],
        cwd=work,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert verified.returncode == 0, verified.stderr
    assert verified.stderr == "", verified.stderr
    security = subprocess.run(
        [ANALYZE, "security", "--offline=yes", "memorizzd.service"],
        cwd=work,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    level = re.search(r"Overall exposure level for \S+: ([0-9.]+)", security.stdout)
    assert level is not None, security.stdout + security.stderr
    assert float(level.group(1)) <= EXPOSURE_AT_MOST, security.stdout


def test_uninstall_keeps_the_configuration_and_state_unless_purged(
    dest: Path,
) -> None:
    state = dest / "var/lib/memorizzd"
    state.mkdir(parents=True)
    (state / "state.db").write_text("keep me")
    (dest / "opt/memorizzd/bin").mkdir(parents=True)  # a venv, as install makes
    said = _run(UNINSTALL, dest)
    assert "kept" in said
    assert not (dest / "opt/memorizzd").exists()
    assert not (dest / "usr/local/bin/memorizzd").is_symlink()
    assert not (dest / "usr/local/bin/memorizzctl").is_symlink()
    assert not any((dest / "etc/systemd/system").iterdir())
    assert not (dest / "etc/sysusers.d/memorizzd.conf").exists()
    assert (state / "state.db").read_text() == "keep me"
    assert (dest / "etc/memorizzd/memorizzd.toml").exists()
    _run(UNINSTALL, dest)  # again: nothing left to remove is no error
    _run(UNINSTALL, dest, "--purge")
    assert not state.exists()
    assert not (dest / "etc/memorizzd").exists()
