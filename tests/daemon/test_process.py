"""The daemon-process helper (tests/process.py, shared with bench/) never lets
the daemon under test read the host's /etc/memorizzd/memorizzd.toml.

The daemon falls back to ``memorizzd.config.DEFAULT_CONFIG_PATH`` when it is
given no ``--config``. These tests run the real entry point with that default
pointed at a config of ours that names a server (a host's config, in effect),
once bare (the control: the default is read) and once with the helper's argv
(it is not).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from bench.harness import DaemonProcess as BenchDaemonProcess

from tests.harness import stdio_spec
from tests.process import DAEMON_EXE, OWN_CONFIG, DaemonProcess

# The entry point with the default config path moved to argv[1].
WITH_DEFAULT = """
import sys
from pathlib import Path
import memorizzd.config
memorizzd.config.DEFAULT_CONFIG_PATH = Path(sys.argv[1])
from memorizzd.__main__ import main
sys.exit(main(sys.argv[2:]))
"""


def _host_config(base: str) -> str:
    spec = stdio_spec("from-the-host")
    path = os.path.join(base, "host.toml")
    Path(path).write_text(
        f"""
[[servers]]
name = "{spec.name}"
transport = "stdio"
command = "{spec.command}"
args = {list(spec.args)!r}
""".replace("'", '"')
    )
    return path


def _check_config(default: str, argv: list[str]) -> str:
    done = subprocess.run(
        [sys.executable, "-c", WITH_DEFAULT, default, *argv, "--check-config"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_helper_names_its_own_config_socket_and_state(base_dir: str) -> None:
    process = DaemonProcess(base_dir)
    argv = process.argv()
    assert argv[0] == DAEMON_EXE
    flags = dict(zip(argv[1::2], argv[2::2], strict=False))
    assert flags["--config"] == os.path.join(base_dir, OWN_CONFIG)
    assert flags["--socket"] == os.path.join(base_dir, "d.sock")
    assert flags["--state-dir"] == os.path.join(base_dir, "state")
    # The older spelling, --config among the extra arguments, replaces it.
    mine = os.path.join(base_dir, "mine.toml")
    argv = DaemonProcess(base_dir, ["--config", mine]).argv()
    assert argv.count("--config") == 1
    assert argv[argv.index("--config") + 1] == mine


def test_a_daemon_from_the_helper_ignores_a_config_at_the_default_path(
    base_dir: str,
) -> None:
    host = _host_config(base_dir)
    # The control: without --config the entry point reads the default path.
    bare = _check_config(host, ["--socket", os.path.join(base_dir, "x.sock")])
    assert f"({host}, 1 servers)" in bare
    process = DaemonProcess(base_dir)
    Path(process.config).write_text("")  # what start() writes, without starting
    seen = _check_config(host, process.argv()[1:])
    assert f"({process.config}, 0 servers)" in seen
    bench = BenchDaemonProcess(base_dir, "bench")
    Path(bench.config).write_text("")
    assert f"({bench.config}, 0 servers)" in _check_config(host, bench.argv()[1:])


def test_the_started_daemon_serves_its_own_config_only(base_dir: str) -> None:
    process = DaemonProcess(base_dir).start()
    try:
        with process.client() as c:
            assert c.list_servers() == []
        assert Path(process.config).read_text().startswith("#")
    finally:
        process.stop()
