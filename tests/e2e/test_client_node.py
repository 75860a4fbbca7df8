"""The Node.js client (clients/node/memorizz.mjs) against a real daemon and a
real stdio server: hello, tools/list, tools/call, a typed error by reason, and
50 calls pipelined on one connection, held in flight together and answered out
of order (tests/node/node_client.mjs drives it)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import msgspec

from memorizz.api.paths import SYSTEM_SOCKET
from tests.harness import NODE_DIR, DaemonHarness, node, wait_until

DRIVER = str(NODE_DIR / "node_client.mjs")


def test_the_node_client_calls_tools_and_pipelines(
    stdio_daemon: DaemonHarness, base_dir: str
) -> None:
    exe = node("the Node.js client test")
    gate = Path(base_dir, "gate")
    proc = subprocess.Popen(
        [exe, DRIVER, "t", str(gate)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "MEMORIZZ_SOCKET": stdio_daemon.socket},
    )
    try:
        assert proc.stdout is not None
        # the listing asked after the gate calls has been answered...
        assert proc.stdout.readline() == b'{"held": true}\n', proc.communicate()
        with stdio_daemon.client() as operator:

            def alive() -> None:
                assert proc.poll() is None, proc.communicate()

            # ...while the 50 gate calls are in flight together (with this
            # status request), the node client's on its one connection
            wait_until(
                lambda: operator.daemon_status().calls_in_flight >= 51,
                what="50 pipelined calls in flight",
                alive=alive,
            )
            assert operator.daemon_status().connections == 2
            gate.touch()
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err.decode()
    seen: dict[str, Any] = msgspec.json.decode(out)

    assert seen["socketPath"] == stdio_daemon.socket
    assert seen["hello"] == {
        "protocol_version": 1,
        "daemon_version": "0.1.0",
        "servers": ["t"],
    }
    assert {"echo", "fail", "gate"} <= set(seen["tools"])
    assert seen["echo"]["content"] == [{"type": "text", "text": "hi from node"}]
    # a tool's own failure is a result, not an exception
    assert seen["failed"]["isError"] is True
    assert seen["unknown"] == {
        "name": "NotFoundError",
        "isNotFound": True,
        "isRemote": True,
        "isMemorizz": True,
        "code": -32002,
        "reason": "unknown_server",
        "data": {"server": "nope"},
        "message": "unknown server 'nope'",
    }
    assert seen["method"] == {
        "name": "MethodNotFoundError",
        "reason": "method_not_found",
    }
    # pipelined: the listing asked after the 50 held calls is answered first,
    # and every reply reaches its own request
    assert seen["after"] == len(seen["tools"])
    assert seen["firstAnswered"] == "tools"
    assert seen["gates"] == ["opened"] * 50
    assert seen["echoesMatch"] is True
    assert seen["connections"] == 1
    # the hello said again first on a new connection: its log lines go on
    assert seen["heard"] == ["first connection", "second connection"]
    assert seen["progress"] == [1, 2, 3]  # callTool's progressToken
    assert seen["defaults"] == {
        "env": "/given.sock",
        "root": "/run/memorizzd/memorizzd.sock",
        "user": "/run/user/1000/memorizzd/memorizzd.sock",
        "bare": "/tmp/memorizzd-1000/memorizzd.sock",
        "system": SYSTEM_SOCKET,
    }
    assert seen["unreachable"] == {
        "name": "DaemonUnreachableError",
        "isUnreachable": True,
    }
