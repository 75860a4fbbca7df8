"""The daemon as memorizzd.service starts it: no flags, its directories from
systemd's ``$RUNTIME_DIRECTORY``, ``$STATE_DIRECTORY`` and
``$CONFIGURATION_DIRECTORY`` (RuntimeDirectory=, StateDirectory=,
ConfigurationDirectory=; the user memorizzd has no /run/memorizzd or
/var/lib/memorizzd default of its own), and the vault key from
``$CREDENTIALS_DIRECTORY`` (LoadCredentialEncrypted=memorizzd-key)."""

from __future__ import annotations

import base64
import os
import subprocess
from pathlib import Path

import pytest

from memorizz import Client
from memorizz.api.errors import DaemonUnreachableError
from tests.harness import DAEMON_EXE, stdio_spec, wait_until


@pytest.fixture
def unit_dirs(base_dir: str) -> dict[str, str]:
    dirs = {
        kind: os.path.join(base_dir, kind.lower())
        for kind in ("RUNTIME", "STATE", "CONFIGURATION", "CREDENTIALS")
    }
    for path in dirs.values():
        os.mkdir(path, 0o700)
    return dirs


def test_the_daemon_takes_its_directories_and_key_from_the_unit(
    unit_dirs: dict[str, str], base_dir: str
) -> None:
    spec = stdio_spec("from-the-unit-config")
    config = Path(unit_dirs["CONFIGURATION"], "memorizzd.toml")
    config.write_text(
        f"""
[[servers]]
name = "{spec.name}"
transport = "stdio"
command = "{spec.command}"
args = {list(spec.args)!r}
""".replace("'", '"')
    )
    key = base64.urlsafe_b64encode(os.urandom(32)).decode()
    Path(unit_dirs["CREDENTIALS"], "memorizzd-key").write_text(key + "\n")
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("MEMORIZZ_", "LISTEN_", "NOTIFY_"))
    }
    env |= {f"{kind}_DIRECTORY": path for kind, path in unit_dirs.items()}
    socket_path = os.path.join(unit_dirs["RUNTIME"], "memorizzd.sock")

    def answers() -> bool:
        try:
            with Client(socket_path) as c:
                c.hello("memorizz-tests")
        except DaemonUnreachableError:
            return False
        return True

    with open(os.path.join(base_dir, "daemon.log"), "wb") as log:
        proc = subprocess.Popen(
            [DAEMON_EXE, "--log-level", "debug"],  # no flags, as ExecStart=
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
        )
    try:
        wait_until(answers, what="the socket in $RUNTIME_DIRECTORY")
        with Client(socket_path) as c:
            status = c.daemon_status()
            assert status.socket == socket_path
            assert status.state_dir == unit_dirs["STATE"]
            assert status.config_path == str(config)
            assert [s.name for s in c.list_servers()] == [spec.name]
        assert os.path.exists(os.path.join(unit_dirs["STATE"], "state.db"))
        # The key came from the credential: no key file was generated.
        assert not os.path.exists(os.path.join(unit_dirs["STATE"], "vault.key"))
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0
