"""Optional OpenTelemetry traces: one span per tool call.

Off by default, and free when off: the hot path tests ``enabled`` (a module
attribute, one boolean) and does nothing else; nothing of OpenTelemetry is
imported. ``setup`` turns it on (``[tracing] enabled = true``) with the SDK
and the OTLP/HTTP exporter of the ``otel`` extra (``pip install
'memorizzd[otel]'``); where an application already installed a tracer
provider (a test's in-memory exporter), that one is used. ``check`` asks
for the extra without turning anything on (``--check-config``). At a stop
tracing stays on through the drain; once the last call has ended ``flush``
exports the spans still buffered (``FLUSH_TIMEOUT_S`` at most) and only then
``shutdown`` turns it off.

A call is one span (``call_scope``, kind server), opened by the front that
took it (the face: its approval wait included) or else by ``Calls``, under
the caller's W3C trace context when one was given (``traceparent`` and
``tracestate`` in the request's ``_meta``, MCP's convention; the socket API's
``tools/call`` takes the same ``_meta``). Its audit record annotates it
(``annotate``: server, tool, profile, decision, outcome and proposal as
``memorizz.*`` attributes; never argument values). Its children: ``policy``
(the verdict, with a cold listing fetched), ``approval wait`` (the face's)
and the upstream request (``upstream_span``, kind client), whose context the
request carries upstream in ``params._meta`` (``upstream_carrier``: the
stdio relay adds it; the SDK's client does for HTTP upstreams).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from importlib import import_module
from typing import Any, Final

log = logging.getLogger("memorizzd.tracing")

TraceContext = Mapping[str, str | None]
"""A caller's W3C trace context: ``traceparent`` and ``tracestate``, from ``_meta``."""

FLUSH_TIMEOUT_S: Final = 5.0
"""How long ``flush`` waits for the spans still buffered to be exported."""

enabled = False
"""Whether calls are traced: the one thing the hot path looks at."""
_tracer: Any = None
_ours: Any = None
"""The tracer provider ``setup`` made (none when the process had one)."""
_flushed = False
"""Whether ``flush`` shut ``_ours`` down since ``setup``."""


class TracingUnavailableError(Exception):
    """``[tracing] enabled`` without the otel extra installed."""


def check() -> None:
    """Raise ``TracingUnavailableError`` where ``setup`` would (the otel extra
    not installed), without turning anything on: ``--check-config`` and the
    start, before anything is started."""
    _sdk()


def _sdk() -> Any:
    """The SDK's tracer provider class; raises ``TracingUnavailableError``
    without the SDK, or without the OTLP exporter when the process has no
    tracer provider of its own (ours would need it)."""
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
    except ImportError as exc:
        raise TracingUnavailableError(
            "[tracing] enabled needs OpenTelemetry's SDK: pip install 'memorizzd[otel]'"
        ) from exc
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        try:
            import_module("opentelemetry.exporter.otlp.proto.http.trace_exporter")
        except ImportError as exc:
            raise TracingUnavailableError(
                "[tracing] enabled needs the OTLP exporter: pip install 'memorizzd[otel]'"
            ) from exc
    return TracerProvider


def setup(*, endpoint: str, service_name: str) -> None:
    """Turn tracing on. Raises ``TracingUnavailableError`` without the SDK."""
    global enabled, _tracer, _ours, _flushed
    tracer_provider = _sdk()
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = trace.get_tracer_provider()
    if not isinstance(provider, tracer_provider) or provider is _ours:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter,
        )

        exporter = (
            OTLPSpanExporter(endpoint=endpoint) if endpoint else OTLPSpanExporter()
        )
        if provider is _ours:  # ours, flushed by a daemon that stopped before
            provider.add_span_processor(BatchSpanProcessor(exporter))
            _flushed = False
        else:  # none installed yet: ours
            _ours = provider = tracer_provider(
                resource=Resource.create({"service.name": service_name})
            )
            provider.add_span_processor(BatchSpanProcessor(exporter))
            trace.set_tracer_provider(provider)
        log.info("tracing: spans to %s", endpoint or "the OTLP exporter's default")
    _tracer = trace.get_tracer("memorizzd")
    enabled = True


def flush(timeout_s: float = FLUSH_TIMEOUT_S) -> None:
    """Export the spans our provider still holds, waiting at most
    ``timeout_s``; it then takes no more. Once the last call has ended (the
    drain is over), not left to the SDK's exit hook. Blocks: the daemon runs
    it in a worker thread. A provider the process had is left alone."""
    global _flushed
    if not enabled or _ours is None or _flushed:
        return
    _flushed = True
    # The SDK bounds its own wait (30 s), and an export still running when it
    # gives up goes on: ours is bounded, in a daemon thread.
    exporting = threading.Thread(
        target=_ours.shutdown, name="memorizzd-trace-flush", daemon=True
    )
    exporting.start()
    exporting.join(timeout_s)
    if exporting.is_alive():
        log.warning(
            "tracing: spans not all exported after %g s at shutdown; dropped",
            timeout_s,
        )


def shutdown() -> None:
    """Turn tracing off, our provider's spans flushed first (``flush``)."""
    global enabled, _tracer
    flush()
    enabled, _tracer = False, None


class _Scope:
    """A call's span while the call runs (``call_scope``)."""

    __slots__ = ("named", "span")

    def __init__(self, span: Any, *, named: bool) -> None:
        self.span = span
        self.named = named


_scope: ContextVar[_Scope | None] = ContextVar("memorizz_call_span", default=None)


def in_call() -> bool:
    """Whether a call's span is open in this context (a front opened it)."""
    return _scope.get() is not None


def _extract(carrier: TraceContext | None) -> Any:
    """The caller's W3C trace context (``traceparent``, ``tracestate``) as a
    parent context; None (a new trace) when absent or malformed."""
    if not carrier or not carrier.get("traceparent"):
        return None
    from opentelemetry.trace import get_current_span
    from opentelemetry.trace.propagation.tracecontext import (
        TraceContextTextMapPropagator,
    )

    found = {k: v for k, v in carrier.items() if isinstance(v, str)}
    context = TraceContextTextMapPropagator().extract(found)
    return context if get_current_span(context).get_span_context().is_valid else None


@contextmanager
def call_scope(name: str | None, carrier: TraceContext | None = None) -> Iterator[None]:
    """The call's span (kind server) from here to the end of the block, the
    current span meanwhile (its children: ``child``, ``upstream_span``); its
    parent the caller's trace context when given. ``name`` None: the first
    ``annotate`` names it. Only called when ``enabled``."""
    from opentelemetry import context as otel_context
    from opentelemetry.trace import SpanKind, set_span_in_context

    span = _tracer.start_span(
        name or "tools/call", context=_extract(carrier), kind=SpanKind.SERVER
    )
    token = otel_context.attach(set_span_in_context(span))
    scope = _scope.set(_Scope(span, named=name is not None))
    try:
        yield
    finally:
        _scope.reset(scope)
        otel_context.detach(token)
        span.end()


def annotate(name: str, *, attributes: Mapping[str, str], failed: bool) -> None:
    """What the call's audit says, on its span (``name`` if it has none yet)."""
    scope = _scope.get()
    if scope is None:
        return
    from opentelemetry.trace import StatusCode

    if not scope.named:
        scope.span.update_name(name)
        scope.named = True
    scope.span.set_attributes(dict(attributes))
    if failed:
        scope.span.set_status(StatusCode.ERROR, attributes.get("memorizz.outcome", ""))


def child(
    name: str, started: float, attributes: Mapping[str, str] | None = None
) -> None:
    """A finished step of the call (policy, approval wait) as a child span,
    from ``started`` (``time.time()`` seconds) to now."""
    if _scope.get() is None:
        return
    span = _tracer.start_span(
        name, start_time=int(started * 1e9), attributes=dict(attributes or {})
    )
    span.end()


class Upstream:
    """The upstream request's span (kind client) while it runs: the current
    span, so the request carries its context (``upstream_carrier``)."""

    __slots__ = ("span", "token")

    def __init__(self, server: str, tool: str) -> None:
        from opentelemetry import context as otel_context
        from opentelemetry.trace import SpanKind, set_span_in_context

        self.span = _tracer.start_span(
            f"tools/call {tool}",
            kind=SpanKind.CLIENT,
            attributes={
                "mcp.method.name": "tools/call",
                "gen_ai.tool.name": tool,
                "memorizz.server": server,
            },
        )
        self.token = otel_context.attach(set_span_in_context(self.span))

    def end(self) -> None:
        from opentelemetry import context as otel_context

        otel_context.detach(self.token)
        self.span.end()


def upstream_span(server: str, tool: str) -> Upstream | None:
    """The span of a call's upstream request, started; None outside a call."""
    if _scope.get() is None:
        return None
    return Upstream(server, tool)


def upstream_carrier() -> dict[str, str]:
    """The current span's W3C trace context (``traceparent``, ``tracestate``)
    for a request's ``params._meta``, as MCP's conventions say (empty
    outside a span)."""
    from opentelemetry.trace.propagation.tracecontext import (
        TraceContextTextMapPropagator,
    )

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return carrier
