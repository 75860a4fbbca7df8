"""The official MCP conformance suite's client scenarios, run against memorizzd.

Opt-in: needs the suite installed in .conformance/ (``scripts/conformance`` installs it;
that needs the npm registry) and ``MEMORIZZ_CONFORMANCE=1``. Each scenario runs through
``scripts/conformance``, which starts a private daemon per scenario via
tests/conformance/adapter.py. ``make conformance`` runs every client scenario.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PREFIX = ROOT / ".conformance" / "node_modules"
INSTALLED = (PREFIX / "node" / "bin" / "node").exists() and (
    PREFIX / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"
).exists()
ENABLED = os.environ.get("MEMORIZZ_CONFORMANCE") == "1"

pytestmark = [
    pytest.mark.skipif(
        not ENABLED, reason="conformance suite is opt-in: set MEMORIZZ_CONFORMANCE=1"
    ),
    pytest.mark.skipif(
        not INSTALLED,
        reason="conformance suite not installed in .conformance/ (run scripts/conformance)",
    ),
]


@pytest.mark.timeout(150)
@pytest.mark.parametrize("scenario", ["initialize", "tools_call"])
def test_client_scenario(scenario: str) -> None:
    run = subprocess.run(
        [str(ROOT / "scripts" / "conformance"), scenario],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=140,
        check=False,
    )
    assert run.returncode == 0, f"{scenario} failed:\n{run.stdout}\n{run.stderr}"
    assert "PASS" in run.stdout
