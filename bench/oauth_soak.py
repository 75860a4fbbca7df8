"""OAuth soak: short-lived access tokens, many callers, minutes of traffic.

A real authorization server and a protected MCP server on 127.0.0.1
(``tests/oauth_world.py``) issue access tokens that live ``--lifetime``
seconds (default 60) and rotate the refresh token on every use. A real
``memorizzd`` subprocess logs in once, then ``--callers`` threads (default
20), each on its own socket connection, call a tool for ``--duration``
seconds (default 300), paced at ``--rate`` calls per second each.

What must hold: no call fails (none with ``authorization_required`` above
all: the daemon refreshes ahead of expiry, so no request carries a dead
token), and the refresh count is about duration / (lifetime - margin). The
margin is the daemon's own ``refresh_margin(lifetime)``; a little jitter
(up to 5% of the lifetime, earlier) makes the interval slightly shorter.

    scripts/soak [--duration 300] [--lifetime 60] [--callers 20] [--rate 5]
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import tempfile
import threading
import time

from tests.harness import DaemonProcess
from tests.oauth_world import TestAuthorizationServer, browser, serve_protected

from bench.harness import median, p99
from memorizz.api import methods as m
from memorizz.api.errors import RemoteError
from memorizz.client import Client
from memorizzd.oauth.keeper import refresh_margin


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=300.0)
    parser.add_argument("--lifetime", type=int, default=60)
    parser.add_argument("--callers", type=int, default=20)
    parser.add_argument("--rate", type=float, default=5.0, help="calls/s per caller")
    args = parser.parse_args()

    world = TestAuthorizationServer(access_ttl=args.lifetime)
    base = tempfile.mkdtemp(prefix="mz-soak-", dir="/tmp")
    failures: collections.Counter[str] = collections.Counter()
    latencies: list[float] = []
    lock = threading.Lock()
    stop = threading.Event()
    try:
        with serve_protected(world) as url:
            daemon = DaemonProcess(base).start()
            try:
                with Client(daemon.socket) as c:
                    c.add_server(
                        m.ServerSpec(
                            name="soak",
                            transport="streamable_http",
                            url=url,
                            allow_private_network=True,
                            auth="oauth",
                        )
                    )
                    started = c.auth_login("soak")
                    c.auth_complete("soak", browser(started.authorization_url))
                daemon.wait_ready("soak")
                logins = world.count("authorization_code")

                def caller() -> None:
                    interval = 1.0 / args.rate
                    with Client(daemon.socket) as client:
                        next_at = time.monotonic()
                        while not stop.is_set():
                            t0 = time.perf_counter()
                            try:
                                result = client.call_tool("soak", "echo", {"text": "x"})
                                kind = "tool_error" if result.is_error else None
                            except RemoteError as exc:
                                kind = exc.reason
                            elapsed = time.perf_counter() - t0
                            with lock:
                                latencies.append(elapsed)
                                if kind is not None:
                                    failures[kind] += 1
                            next_at += interval
                            stop.wait(max(0.0, next_at - time.monotonic()))

                threads = [threading.Thread(target=caller) for _ in range(args.callers)]
                t_start = time.monotonic()
                for t in threads:
                    t.start()
                stop.wait(args.duration)
                stop.set()
                for t in threads:
                    t.join(60)
                ran = time.monotonic() - t_start
                with Client(daemon.socket) as c:
                    auth = c.server_status("soak")[0].auth
            finally:
                daemon.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)

    refreshes = world.count("refresh_token")
    margin = refresh_margin(float(args.lifetime))
    expected = ran / (args.lifetime - margin)
    calls = len(latencies)
    print(
        f"memorizzd OAuth soak: {args.callers} callers x {args.rate:g} calls/s for "
        f"{ran:.0f} s; access tokens live {args.lifetime} s, refresh margin {margin:g} s; "
        f"nproc {os.cpu_count()}"
    )
    print(f"calls: {calls:,}; failed: {sum(failures.values())} {dict(failures) or ''}")
    print(
        f"call latency: median {median(latencies) * 1000:.2f} ms, "
        f"p99 {p99(latencies) * 1000:.2f} ms, max {max(latencies) * 1000:.2f} ms"
    )
    print(
        f"refreshes at the authorization server: {refreshes} "
        f"(expected about {expected:.1f} = {ran:.0f} / ({args.lifetime} - {margin:g})); "
        f"daemon counted {auth.refreshes if auth else '?'}; logins: {logins}"
    )
    unauthorized = failures.get("authorization_required", 0) + failures.get(
        "login_required", 0
    )
    ok = (
        unauthorized == 0
        and not failures
        and abs(refreshes - expected) <= max(2, 0.2 * expected)
    )
    print(
        "result: "
        + ("PASS" if ok else "MISS")
        + f" (401-class failures {unauthorized}, other failures "
        f"{sum(failures.values()) - unauthorized})"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
