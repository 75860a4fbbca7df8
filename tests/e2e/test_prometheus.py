"""Debian's real Prometheus scrapes the daemon (issue 13, item 4): the
daemon's ``[metrics] listen`` on 127.0.0.1, Prometheus configured as
deploy/prometheus/prometheus.yml shows (one static target, ``/metrics``);
its HTTP API reports the target up, and a query returns the call counter
after calls. Skipped where ``prometheus`` is not installed (scripts/bootstrap
installs it as root); under CI=true that is a failure."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from memorizzd.config import Metrics
from tests.harness import (
    DaemonHarness,
    daemon_config,
    light_spec,
    rmtree,
    short_tempdir,
    wait_until,
)

ROOT = Path(__file__).parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def prometheus_exe() -> str:
    exe = shutil.which("prometheus")
    if exe is None:
        why = "prometheus is not installed (scripts/bootstrap installs it as root)"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    return exe


@pytest.fixture
def daemon() -> Iterator[DaemonHarness]:
    base = short_tempdir()
    try:
        config = daemon_config(
            base,
            servers=[light_spec("lite")],
            metrics=Metrics(listen=f"127.0.0.1:{free_port()}"),
        )
        with DaemonHarness.running(config) as running:
            running.wait_ready("lite")
            yield running
    finally:
        rmtree(base)


def api(port: int, path: str, **query: str) -> Any:
    url = f"http://127.0.0.1:{port}/api/v1/{path}"
    if query:
        url += "?" + urllib.parse.urlencode(query)
    with urllib.request.urlopen(url, timeout=10) as reply:  # noqa: S310 - loopback
        return msgspec.json.decode(reply.read())["data"]


def test_prometheus_scrapes_the_daemon_and_queries_the_call_counter(
    daemon: DaemonHarness, tmp_path: Path
) -> None:
    exe = prometheus_exe()
    target = daemon.config.metrics.listen
    example = (ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text()
    assert "127.0.0.1:9464" in example  # the example this test runs, retargeted
    config = tmp_path / "prometheus.yml"
    config.write_text(
        example.replace("127.0.0.1:9464", target).replace(
            "scrape_interval: 15s", "scrape_interval: 1s"
        )
    )
    web = free_port()
    with daemon.client() as c:
        for _ in range(3):
            c.call_tool("lite", "hello", {})
    log = (tmp_path / "prometheus.log").open("wb")
    process = subprocess.Popen(
        [
            exe,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{web}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )

    def alive() -> None:
        if process.poll() is not None:
            raise AssertionError(
                f"prometheus exited: {(tmp_path / 'prometheus.log').read_text()}"
            )

    def ready() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{web}/-/ready", timeout=5):
                return True
        except OSError:
            return False

    def target_up() -> bool:
        active = api(web, "targets")["activeTargets"]
        return any(
            t["scrapeUrl"].startswith(f"http://{target}/") and t["health"] == "up"
            for t in active
        )

    def calls() -> float:
        found = api(
            web,
            "query",
            query='sum(memorizz_calls_total{server="lite",tool="hello",outcome="ok"})',
        )["result"]
        return float(found[0]["value"][1]) if found else 0.0

    try:
        wait_until(ready, timeout=60, what="prometheus ready", alive=alive, every=0.2)
        wait_until(target_up, timeout=60, what="the target up", alive=alive, every=0.2)
        wait_until(lambda: calls() >= 3, timeout=60, what="the call counter", every=0.2)
        up = api(web, "query", query="up")["result"]
        assert [r["value"][1] for r in up] == ["1"]
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()
