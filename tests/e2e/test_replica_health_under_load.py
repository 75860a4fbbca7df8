"""A replica set that answers every call it is sent is not health-probed:
answers the warm relay carries (``relay.py``: ``ReplicaSet.take``/release)
count as the replica's, as a single session's do (``Supervisor._last_ok``).
Before, only ``_on`` and ``check`` counted: a busy replica was pinged each
interval, its ping waited behind its queue and failed, and the primary's
failure replaced the whole set, failing every call in flight (found by a
review; the per-replica probe came with per-replica supervision)."""

from __future__ import annotations

import collections
import os
import sys
import threading
import time
from pathlib import Path

from memorizz.api.errors import RemoteError
from memorizz.api.methods import ServerSpec
from tests.harness import daemon_process

SERIAL_SERVER = """\
import json, os, sys, time
LOG = sys.argv[1]
TOOLS = [{"name": "work", "description": "blocking work",
          "inputSchema": {"type": "object"}}]
def send(msg):
    sys.stdout.write(json.dumps(msg) + "\\n"); sys.stdout.flush()
for line in sys.stdin:
    msg = json.loads(line)
    method, rid = msg.get("method"), msg.get("id")
    if rid is None or method is None:
        continue
    with open(LOG, "a") as f:
        f.write(f"{os.getpid()} {method}\\n")
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": rid, "result": {
            "protocolVersion": "2025-06-18", "capabilities": {"tools": {}},
            "serverInfo": {"name": "serial", "version": "1"}}})
    elif method == "ping":
        send({"jsonrpc": "2.0", "id": rid, "result": {}})
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": rid, "result": {"tools": TOOLS}})
    elif method == "tools/call":
        time.sleep(0.25)  # one request at a time, like a CPU-bound server
        send({"jsonrpc": "2.0", "id": rid, "result": {
            "content": [{"type": "text", "text": "done"}], "isError": False}})
    else:
        send({"jsonrpc": "2.0", "id": rid,
              "error": {"code": -32601, "message": "unknown"}})
"""


def test_a_busy_replica_set_answering_every_call_is_not_torn_down(
    base_dir: str,
) -> None:
    server = os.path.join(base_dir, "serial_server.py")
    Path(server).write_text(SERIAL_SERVER)
    methods = os.path.join(base_dir, "methods.log")
    config = os.path.join(base_dir, "c.toml")
    Path(config).write_text("health_interval_s = 1.0\nhealth_timeout_s = 1.0\n")
    with daemon_process(base_dir, config=config) as d:
        with d.client() as c:
            c.add_server(
                ServerSpec(
                    name="pool",
                    transport="stdio",
                    command=sys.executable,
                    args=[server, methods],
                    replicas=2,
                )
            )
        d.wait_ready("pool")
        failed: collections.Counter[str] = collections.Counter()
        answered = collections.Counter[str]()
        until = time.monotonic() + 6.0

        def load() -> None:  # five calls queued on each replica: 1.25 s deep
            with d.client() as c:
                while time.monotonic() < until:
                    try:
                        c.call_tool("pool", "work", {})
                        answered["ok"] += 1
                    except RemoteError as exc:
                        failed[exc.reason] += 1

        threads = [threading.Thread(target=load) for _ in range(10)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        with d.client() as c:
            (status,) = c.server_status("pool")
        pings = Path(methods).read_text().split().count("ping")
        # every replica answered a call at least every 1.25 s: none is suspect
        assert (status.restarts, dict(failed)) == (0, {}), (
            f"{status.last_error}; pings sent: {pings}; answered: {answered}"
        )
