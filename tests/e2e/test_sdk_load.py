"""The first HTTP server loads the MCP SDK's client (a second or more of CPU:
pydantic builds its models) without freezing the daemon: the import runs in a
worker thread, and every other caller is answered meanwhile.

A real daemon, a real socket, a real loopback Streamable HTTP server: a
thread pings the daemon without pause while the first HTTP server is added
and connects, and the longest a ping waited is compared with the time the SDK
takes to import in a process of its own on this machine (measured here, as
the host's speed varies): imported on the event loop, some ping waited for
all of it.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from memorizz.client import Client
from tests.harness import daemon_process, http_spec, serve_http
from tests.process import DaemonProcess


@pytest.fixture
def daemon(base_dir: str) -> Iterator[DaemonProcess]:
    with daemon_process(base_dir) as d:
        yield d


def _sdk_import_s() -> float:
    """How long importing the daemon's SDK client modules takes here, alone."""
    code = (
        "import time; t = time.perf_counter(); "
        "import memorizzd.sdk_client_side as s; s.install(); "
        "import memorizzd.upstream.session; print(time.perf_counter() - t)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    return float(out.stdout)


def test_the_first_http_server_loads_the_sdk_without_freezing_the_daemon(
    daemon: DaemonProcess,
) -> None:
    import_s = _sdk_import_s()
    waits: list[float] = []
    stop = threading.Event()

    def ping() -> None:
        with Client(daemon.socket) as c:
            while not stop.is_set():
                t = time.perf_counter()
                c.ping()
                waits.append(time.perf_counter() - t)

    with serve_http("streamable_http") as url:
        pinger = threading.Thread(target=ping)
        pinger.start()
        try:
            with daemon.client() as c:
                c.add_server(http_spec("web", url, "streamable_http"))
            daemon.wait_ready("web")
            with daemon.client() as c:
                answer = c.call_tool("web", "echo", {"text": "loaded"})
        finally:
            stop.set()
            pinger.join()
    assert answer.content[0]["text"] == "loaded"
    assert len(waits) > 10
    # On the loop, one ping waited for the whole import; in a thread, none
    # waits for more than a fraction of it (the loop gets its turns).
    assert max(waits) < import_s / 2, (max(waits), import_s)
    print(f"longest ping {max(waits):.3f} s, import alone {import_s:.3f} s")
