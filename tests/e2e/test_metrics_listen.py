"""A metrics address the daemon cannot have (a port another program holds) is
one line on stderr and exit 1, as a socket in use is: it came from inside the
daemon's task groups, wrapped, and the daemon died with a traceback."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

from tests.process import daemon_argv


def test_a_metrics_port_in_use_is_one_line_and_exit_1(base_dir: str) -> None:
    holder = socket.create_server(("127.0.0.1", 0))
    port = holder.getsockname()[1]
    try:
        config = Path(base_dir, "memorizzd.toml")
        config.write_text(
            f'[metrics]\nenabled = true\nlisten = "127.0.0.1:{port}"\n',
            encoding="utf-8",
        )
        run = subprocess.run(
            daemon_argv(base_dir, config=str(config), log_level="warning"),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env=dict(os.environ),
        )
    finally:
        holder.close()
    assert run.returncode == 1, run.stderr
    assert "Traceback" not in run.stderr
    assert run.stderr.splitlines()[-1] == (
        f"memorizzd: [metrics] listen = '127.0.0.1:{port}': cannot listen there:"
        " Address already in use"
    )
    assert not Path(base_dir, "d.sock").exists()  # it cleaned up as it went
