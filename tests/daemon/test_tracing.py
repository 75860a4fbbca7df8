"""OpenTelemetry traces (issue 13, item 5): with ``[tracing] enabled`` a real
daemon records one span per tool call (server, tool, profile, decision,
outcome; never argument values), into the tracer provider the process has
(here opentelemetry-sdk's in-memory exporter); off, nothing is recorded and
the hot path only tests one boolean (``bench/metrics.py``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("opentelemetry.sdk")
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)

from memorizzd.config import Tracing
from memorizzd.telemetry import tracing
from tests.harness import (
    DaemonHarness,
    daemon_config,
    light_spec,
    rmtree,
    short_tempdir,
)


@pytest.fixture(scope="module")
def exporter() -> InMemorySpanExporter:
    memory = InMemorySpanExporter()
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):  # the process's, as an application's
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    provider.add_span_processor(SimpleSpanProcessor(memory))
    return memory


def daemon(base: str, *, traced: bool) -> Iterator[DaemonHarness]:
    config = daemon_config(
        base, servers=[light_spec("lite")], tracing=Tracing(enabled=traced)
    )
    with DaemonHarness.running(config) as running:
        running.wait_ready("lite")
        yield running


def test_a_traced_daemon_records_one_span_per_call(
    exporter: InMemorySpanExporter,
) -> None:
    base = short_tempdir()
    try:
        exporter.clear()
        for harness in daemon(base, traced=True):
            with harness.client() as c:
                c.call_tool("lite", "hello", {"secret": "never an attribute"})
            assert tracing.enabled
        assert not tracing.enabled  # off again when the daemon stops
    finally:
        rmtree(base)
    spans = exporter.get_finished_spans()
    assert sorted(s.name for s in spans) == [
        "policy",  # its children: tests/daemon/test_trace_context.py
        "tools/call hello",
        "tools/call lite/hello",
    ]
    (span,) = [s for s in spans if s.name == "tools/call lite/hello"]
    assert dict(span.attributes or {}) == {
        "memorizz.server": "lite",
        "memorizz.tool": "hello",
        "memorizz.profile": "operator",
        "memorizz.decision": "allow",
        "memorizz.outcome": "ok",
    }
    assert span.kind == trace.SpanKind.SERVER
    assert span.start_time is not None
    assert span.end_time is not None
    assert span.end_time >= span.start_time


def test_an_untraced_daemon_records_nothing(exporter: InMemorySpanExporter) -> None:
    base = short_tempdir()
    try:
        exporter.clear()
        for harness in daemon(base, traced=False):
            assert not tracing.enabled
            with harness.client() as c:
                c.call_tool("lite", "hello", {})
    finally:
        rmtree(base)
    assert exporter.get_finished_spans() == ()
