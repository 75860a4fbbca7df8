"""OpenTelemetry traces (issue 13, item 5): with ``[tracing] enabled`` a real
daemon records one span per tool call (server, tool, profile, decision,
outcome; never argument values), into the tracer provider the process has
(here opentelemetry-sdk's in-memory exporter); off, nothing is recorded and
the hot path only tests one boolean (``bench/metrics.py``)."""

from __future__ import annotations

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
from tests.harness import light_daemon


@pytest.fixture(scope="module")
def exporter() -> InMemorySpanExporter:
    memory = InMemorySpanExporter()
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):  # the process's, as an application's
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    provider.add_span_processor(SimpleSpanProcessor(memory))
    return memory


def test_a_traced_daemon_records_one_span_per_call(
    exporter: InMemorySpanExporter,
) -> None:
    exporter.clear()
    with light_daemon("lite", tracing=Tracing(enabled=True)) as harness:
        with harness.client() as c:
            c.call_tool("lite", "hello", {"secret": "never an attribute"})
        assert tracing.enabled
    assert not tracing.enabled  # off again when the daemon stops
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
    exporter.clear()
    with light_daemon("lite", tracing=Tracing(enabled=False)) as harness:
        assert not tracing.enabled
        with harness.client() as c:
            c.call_tool("lite", "hello", {})
    assert exporter.get_finished_spans() == ()
