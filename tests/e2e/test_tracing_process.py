"""Tracing with the real executable (docs/operations.md, "Tracing").

* Calls in flight at SIGTERM keep their spans whole: tracing stays on through
  the drain, so a call that ends during it and one the drain cuts off are
  both annotated (``memorizz.*``; the cut-off one ``failed``, an error
  status), and the spans reach the OTLP/HTTP receiver before the daemon
  stops (flushed by the daemon, not left to the SDK's exit hook). It used to
  turn tracing off as the drain began, leaving those spans bare.
* ``[tracing] enabled`` without OpenTelemetry's SDK is an invalid
  configuration: ``--check-config`` refuses it and a start exits 78 with the
  one line, no traceback. It used to pass the check and then crash the start
  (exit 1, an ExceptionGroup's traceback).
"""

from __future__ import annotations

import gzip
import http.server
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from memorizz.api.errors import MemorizzError
from tests.harness import MCP_SERVER, daemon_process, wait_until
from tests.process import DAEMON_EXE

pytest.importorskip("opentelemetry.sdk")
pytest.importorskip("opentelemetry.exporter.otlp.proto.http")
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

DRAIN_S = 3.0
STOPPED = re.compile(r" memorizzd: stopped$", re.MULTILINE)
"""The daemon's last log line (``app.run``)."""


@dataclass
class _Received:
    """What the receiver got: each span, and whether the daemon's log said
    ``stopped`` when the request carrying it arrived."""

    spans: list[tuple[Span, bool]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


@contextmanager
def _otlp_receiver(
    daemon_log: Path, *, stalled: bool = False
) -> Iterator[tuple[str, _Received]]:
    """An OTLP/HTTP traces receiver on 127.0.0.1; yields its endpoint.
    ``stalled``: it never answers (until the end)."""
    received = _Received()
    released = threading.Event()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if stalled:
                released.wait(60)
                return
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            try:
                stopped = bool(STOPPED.search(daemon_log.read_text(errors="replace")))
            except FileNotFoundError:
                stopped = False
            request = ExportTraceServiceRequest.FromString(body)
            with received.lock:
                for resource in request.resource_spans:
                    for scope in resource.scope_spans:
                        received.spans.extend((s, stopped) for s in scope.spans)
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1/traces", received
    finally:
        released.set()
        server.shutdown()
        server.server_close()
        thread.join(10)


def _attributes(span: Span) -> dict[str, str]:
    return {a.key: a.value.string_value for a in span.attributes}


def _traced_config(base_dir: str, endpoint: str, top: str = "") -> Path:
    """A config file: ``top``, server ``t`` (the SDK test server), tracing on
    to ``endpoint``."""
    config = Path(base_dir, "memorizzd.toml")
    config.write_text(
        f"""{top}
[[servers]]
name = "t"
transport = "stdio"
command = {sys.executable!r}
args = [{MCP_SERVER!r}, "stdio"]

[tracing]
enabled = true
endpoint = {endpoint!r}
"""
    )
    return config


def test_calls_in_flight_at_sigterm_keep_their_spans_whole_and_are_flushed(
    base_dir: str,
) -> None:
    log = Path(base_dir, "daemon.log")
    with _otlp_receiver(log) as (endpoint, received):
        config = _traced_config(base_dir, endpoint, f"drain_timeout_s = {DRAIN_S}\n")
        with daemon_process(base_dir, config=str(config)) as d:
            d.wait_ready("t")
            answers: dict[str, object] = {}

            def call(key: str, seconds: float) -> None:
                with d.client() as c:
                    try:
                        answers[key] = c.call_tool(
                            "t", "slow", {"seconds": seconds}
                        ).is_error
                    except MemorizzError as exc:
                        answers[key] = getattr(exc, "reason", exc)

            callers = [
                threading.Thread(
                    target=call, args=("during", 1.0)
                ),  # ends in the drain
                threading.Thread(target=call, args=("cut", 60.0)),  # cut off by it
            ]
            for t in callers:
                t.start()
            with d.client() as c:
                wait_until(
                    lambda: c.server_status("t")[0].in_flight == 2,
                    what="two calls in flight",
                )
            assert d.stop(signal.SIGTERM) == 0
            for t in callers:
                t.join(10)
        assert answers == {"during": False, "cut": "shutting_down"}
    calls = [
        (s, stopped) for s, stopped in received.spans if s.name == "tools/call t/slow"
    ]
    assert len(calls) == 2, [s.name for s, _ in received.spans]
    by_outcome = {
        _attributes(s)["memorizz.outcome"]: (s, stopped) for s, stopped in calls
    }
    assert sorted(by_outcome) == ["failed", "ok"]
    for outcome, (span, _) in by_outcome.items():
        assert _attributes(span) == {
            "memorizz.server": "t",
            "memorizz.tool": "slow",
            "memorizz.profile": "operator",
            "memorizz.decision": "allow",
            "memorizz.outcome": outcome,
        }
        assert span.kind == Span.SPAN_KIND_SERVER
    assert by_outcome["ok"][0].status.code != Status.STATUS_CODE_ERROR
    assert by_outcome["failed"][0].status.code == Status.STATUS_CODE_ERROR
    # sent by the daemon's own flush after the drain, before it stopped
    assert not any(stopped for _, stopped in calls)


def test_a_collector_that_does_not_answer_holds_the_stop_a_bounded_time(
    base_dir: str,
) -> None:
    """The flush after the drain waits ``tracing.FLUSH_TIMEOUT_S`` (5 s) at
    most, then the daemon stops (exit 0), saying what it dropped."""
    log = Path(base_dir, "daemon.log")
    with _otlp_receiver(log, stalled=True) as (endpoint, _):
        config = _traced_config(base_dir, endpoint)
        with daemon_process(base_dir, config=str(config)) as d:
            d.wait_ready("t")
            with d.client() as c:
                assert c.call_tool("t", "echo", {"text": "hi"}).is_error is False
            started = time.monotonic()
            assert d.stop(signal.SIGTERM) == 0
            took = time.monotonic() - started
    assert 4.5 < took < 5 + 4, took  # the bound, and what a busy machine adds
    assert "tracing: spans not all exported after 5 s" in d.log()
    assert STOPPED.search(d.log())


NO_SDK = "[tracing] enabled needs OpenTelemetry's SDK: pip install 'memorizzd[otel]'"


def test_tracing_without_the_sdk_is_an_invalid_configuration(base_dir: str) -> None:
    # OpenTelemetry's API stays (the MCP SDK needs it); its SDK cannot be
    # imported, as in a venv without the otel extra.
    shadow = Path(base_dir, "no-otel-sdk", "opentelemetry", "sdk")
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text(
        "raise ModuleNotFoundError(\n"
        "    \"No module named 'opentelemetry.sdk'\", name='opentelemetry.sdk'\n"
        ")\n"
    )
    config = Path(base_dir, "memorizzd.toml")
    config.write_text('[tracing]\nenabled = true\nendpoint = "http://127.0.0.1:9/"\n')
    path = os.environ.get("PYTHONPATH")
    env = os.environ | {
        "PYTHONPATH": os.pathsep.join(
            [str(shadow.parent.parent), *([path] if path else [])]
        )
    }
    argv = [
        DAEMON_EXE,
        "--config",
        str(config),
        "--socket",
        os.path.join(base_dir, "d.sock"),
        "--state-dir",
        os.path.join(base_dir, "state"),
    ]
    for extra in (["--check-config"], []):
        proc = subprocess.run(
            [*argv, *extra],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert (proc.returncode, proc.stderr, proc.stdout) == (
            78,
            f"memorizzd: invalid configuration: {NO_SDK}\n",
            "",
        ), extra
    assert not Path(base_dir, "d.sock").exists()
