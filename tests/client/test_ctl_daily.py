"""memorizzctl for daily use: --version, bare help, and the start hint that
names the right way to start the daemon here (offline: no daemon)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import memorizz.client
from memorizz import __version__
from memorizz.ctl.run import main

CTL = str(Path(sys.executable).with_name("memorizzctl"))


def test_version_prints_the_version_and_exits_0() -> None:
    done = subprocess.run(
        [CTL, "--version"], capture_output=True, text=True, check=False, timeout=30
    )
    assert (done.returncode, done.stdout) == (0, f"memorizzctl {__version__}\n")


def test_bare_memorizzctl_prints_the_help_and_exits_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main([]) == 2  # argparse's usage status: nothing was done
    out = capsys.readouterr().out
    assert out.startswith("usage: memorizzctl")
    assert "mcp" in out
    assert "daemon" in out


def test_the_hint_names_scripts_run_in_a_checkout(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.setattr(memorizz.client, "UNIT_PATHS", (str(tmp_path / "none"),))
    assert main(["--socket", str(tmp_path / "no.sock"), "daemon", "status"]) == 69
    err = capsys.readouterr().err
    assert os.path.join("scripts", "run") in err
    assert "systemctl" not in err


def test_the_hint_names_the_unit_when_it_is_installed(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    unit = tmp_path / "memorizzd.service"
    unit.write_text("[Service]\n")
    monkeypatch.setattr(memorizz.client, "UNIT_PATHS", (str(unit),))
    assert main(["--socket", str(tmp_path / "no.sock"), "daemon", "status"]) == 69
    err = capsys.readouterr().err
    assert "`systemctl start memorizzd`" in err
    assert "scripts/run" not in err
