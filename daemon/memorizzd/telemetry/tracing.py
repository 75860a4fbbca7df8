"""Optional OpenTelemetry traces: one span per tool call.

Off by default, and free when off: the hot path tests ``enabled`` (a module
attribute, one boolean) and does nothing else; nothing of OpenTelemetry is
imported. ``setup`` turns it on (``[tracing] enabled = true``) with the SDK
and the OTLP/HTTP exporter of the ``otel`` extra (``pip install
'memorizzd[otel]'``); where an application already installed a tracer
provider (a test's in-memory exporter), that one is used.

``call_span`` records a finished call as a span, from its start to its audit
record (``Calls._audit``), with the call's server, tool, profile, decision,
outcome and proposal as attributes (``memorizz.*``; never argument values),
under the caller's W3C trace context when one was given (``traceparent``
and ``tracestate``, as MCP's ``_meta`` carries them).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

log = logging.getLogger("memorizzd.tracing")

enabled = False
"""Whether calls are traced: the one thing the hot path looks at."""
_tracer: Any = None


class TracingUnavailableError(Exception):
    """``[tracing] enabled`` without the otel extra installed."""


def setup(*, endpoint: str, service_name: str) -> None:
    """Turn tracing on. Raises ``TracingUnavailableError`` without the SDK."""
    global enabled, _tracer
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise TracingUnavailableError(
            "[tracing] enabled needs OpenTelemetry's SDK: pip install 'memorizzd[otel]'"
        ) from exc
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):  # none installed yet: ours
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
                OTLPSpanExporter,
            )
        except ImportError as exc:
            raise TracingUnavailableError(
                "[tracing] enabled needs the OTLP exporter: pip install 'memorizzd[otel]'"
            ) from exc
        ours = TracerProvider(resource=Resource.create({"service.name": service_name}))
        exporter = (
            OTLPSpanExporter(endpoint=endpoint) if endpoint else OTLPSpanExporter()
        )
        ours.add_span_processor(BatchSpanProcessor(exporter))
        trace.set_tracer_provider(ours)
        log.info("tracing: spans to %s", endpoint or "the OTLP exporter's default")
    _tracer = trace.get_tracer("memorizzd")
    enabled = True


def shutdown() -> None:
    """Turn tracing off (and flush our provider's spans)."""
    global enabled, _tracer
    enabled, _tracer = False, None


def call_span(
    name: str,
    *,
    started: float,
    ended: float,
    attributes: Mapping[str, str],
    failed: bool,
    carrier: Mapping[str, str] | None = None,
) -> None:
    """One finished call as a span (times: ``time.time()`` seconds)."""
    if _tracer is None:
        return
    from opentelemetry.trace import SpanKind, StatusCode
    from opentelemetry.trace.propagation.tracecontext import (
        TraceContextTextMapPropagator,
    )

    parent = TraceContextTextMapPropagator().extract(dict(carrier)) if carrier else None
    span = _tracer.start_span(
        name,
        context=parent,
        kind=SpanKind.SERVER,
        start_time=int(started * 1e9),
        attributes=dict(attributes),
    )
    if failed:
        span.set_status(StatusCode.ERROR, attributes.get("memorizz.outcome", ""))
    span.end(end_time=int(ended * 1e9))
