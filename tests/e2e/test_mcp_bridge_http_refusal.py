"""The HTTP bridge says, on stderr and to its clients, that the daemon refuses
this user, as the stdio bridge does (tests/e2e/test_mcp_bridge.py).

A real daemon from a config file with a profile ``alpha``; the bridge
(``memorizzctl mcp serve --transport streamable-http``) on alpha's agent
socket, run by this process's uid. The daemon refuses a uid that is not the
profile's in-process, at accept (one error line, then close: root passes the
socket file's mode). Before, the bridge printed "serving" and then answered
every request 503 "memorizzd closed the connection", saying nothing on stderr.
"""

from __future__ import annotations

import os
import secrets
import subprocess
from pathlib import Path

import httpx2
import msgspec

from memorizzd.config import load
from tests import proposals_world as pw
from tests.harness import INITIALIZE, DaemonHarness, http_bridge
from tests.peers import ME, NOBODY, agent_socket
from tests.process import MEMORIZZCTL

WAIT_S = 30.0


def _config(base: str, uids: list[int]) -> str:
    return pw.write_config(base, ["t"], {"alpha": (["t"], uids)})


def _refusal(base: str) -> str:
    mcp = os.path.join(os.path.dirname(agent_socket(base, "alpha")), "mcp.sock")
    return f"memorizzd refused the connection on {mcp}: "


def test_a_bridge_the_daemon_refuses_says_so_at_start_with_status_77(
    base_dir: str,
) -> None:
    with DaemonHarness.running(load(_config(base_dir, [NOBODY]))):
        token_file = os.path.join(base_dir, "token")
        Path(token_file).write_text(secrets.token_urlsafe(16), encoding="utf-8")
        done = subprocess.run(
            [MEMORIZZCTL, "--socket", agent_socket(base_dir, "alpha"), "mcp",
             "serve", "--transport", "streamable-http", "--listen", "127.0.0.1:0",
             "--token-file", token_file],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=WAIT_S,
            check=False,
        )  # fmt: skip
    assert (done.returncode, done.stdout) == (77, b""), done.stderr
    said = done.stderr.decode()
    assert said.startswith(f"memorizzctl: error: {_refusal(base_dir)}"), said
    assert said.endswith("(permission_denied)\n"), said
    assert "serving" not in said


def test_a_session_the_daemon_refuses_after_a_reload_is_403_and_said(
    base_dir: str,
) -> None:
    config_file = _config(base_dir, [ME])
    with (
        DaemonHarness.running(load(config_file)) as h,
        http_bridge(agent_socket(base_dir, "alpha")) as (url, token),
    ):
        _config(base_dir, [NOBODY])  # this uid is no longer alpha's
        with h.client() as operator:
            operator.daemon_reload()
        answer = httpx2.post(
            url,
            content=msgspec.json.encode(INITIALIZE),
            headers={
                "Authorization": f"Bearer {token}",
                "Content-Type": "application/json",
                "Accept": "application/json, text/event-stream",
            },
            timeout=WAIT_S,
        )
    assert answer.status_code == 403, answer.text
    error = msgspec.json.decode(answer.content)["error"]
    assert error["message"].startswith(_refusal(base_dir)), error
    assert error["message"].endswith("(permission_denied)"), error
