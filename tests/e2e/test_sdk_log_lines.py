"""The MCP SDK's own log lines stay one line each in the daemon's log.

The SDK's legacy SSE client logs the end of its event stream (its server
went away) as an error with the whole traceback, some 65 lines, every time;
the daemon says the same thing itself in one line (``session lost``). Its
record is kept, as one line at info, with the exception's type and text.
"""

from __future__ import annotations

import os

from memorizz.api.methods import ServerSpec
from tests.harness import serve_http, wait_until
from tests.process import DaemonProcess


def test_an_sse_server_that_goes_away_leaves_no_traceback_in_the_log(
    base_dir: str,
) -> None:
    config = os.path.join(base_dir, "memorizzd.toml")
    with open(config, "w", encoding="utf-8") as f:
        f.write("health_interval_s = 1.0\nhealth_timeout_s = 2.0\n")
    os.makedirs(os.path.join(base_dir, "d"))
    d = DaemonProcess(
        os.path.join(base_dir, "d"), config=config, log_level="info"
    ).start()
    try:
        with serve_http("sse") as url:
            spec = ServerSpec(
                name="h", transport="sse", url=url, allow_private_network=True
            )
            with d.client() as c:
                c.add_server(spec)
            d.wait_ready("h")
        wait_until(lambda: "h: session lost" in d.log(), what=d.log()[-3000:])
        d.stop()
        log = d.log()
        assert "Traceback" not in log, log[-4000:]
        said = [line for line in log.splitlines() if " mcp.client.sse: " in line]
        assert all(" INFO " in line for line in said), said
    finally:
        if d.running:
            d.stop()
