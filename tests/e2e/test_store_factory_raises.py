"""A plugin credential store whose factory is found but raises when called
(its secret manager unreachable, say): ``--check-config`` passes it (it finds
factories, never calls them: one may reach a secret manager), and the start
stops with one line and exit 78 before it makes a vault key. The start used
to generate ``vault.key`` first, for a daemon that never ran."""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.process import daemon_argv

BROKEN = '''
"""A deployment's store whose secret manager cannot be reached."""


def factory(config):
    raise RuntimeError("cannot reach the secret manager with token s3cr3t-t0k3n")
'''


@pytest.fixture
def plugin_path(tmp_path: Path) -> str:
    """A directory for ``PYTHONPATH``: ``mz_broken_store`` and an entry point
    ``broken`` naming its factory (a ``.dist-info`` beside it)."""
    (tmp_path / "mz_broken_store.py").write_text(textwrap.dedent(BROKEN))
    info = tmp_path / "mz_broken_store-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: mz-broken-store\nVersion: 1.0\n"
    )
    (info / "entry_points.txt").write_text(
        "[memorizz.credential_stores]\nbroken = mz_broken_store:factory\n"
    )
    return str(tmp_path)


@pytest.mark.parametrize("name", ["mz_broken_store:factory", "broken"])
def test_a_store_whose_factory_raises_stops_the_start_before_any_key(
    base_dir: str, plugin_path: str, name: str
) -> None:
    config = Path(base_dir, "memorizzd.toml")
    config.write_text(f'[credentials]\nstores = ["vault", "{name}"]\n')
    env = {
        k: v
        for k, v in os.environ.items()
        if k != "MEMORIZZ_MCP_ENCRYPTION_KEY"  # the key file is the one made
    }
    env["PYTHONPATH"] = os.pathsep.join(
        [plugin_path, *filter(None, [os.environ.get("PYTHONPATH")])]
    )

    def run(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            daemon_argv(base_dir, *extra, config=str(config), log_level="warning"),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env=env,
        )

    check = run("--check-config")  # the factory is found, and not called
    assert check.returncode == 0, check.stderr
    start = run()
    assert start.returncode == 78, start.stderr
    assert start.stderr == (
        f"memorizzd: vault: credential store {name!r}: cannot load it: RuntimeError\n"
    )
    assert "s3cr3t-t0k3n" not in start.stderr  # the plugin's message is not shown
    assert not Path(base_dir, "state", "vault.key").exists()
    assert not Path(base_dir, "d.sock").exists()  # it cleaned up as it went
