"""W3C trace context through the daemon (issue 13, item 5): a caller's
``traceparent`` in ``_meta`` (the socket API's ``tools/call``, and the face's,
where the official SDK client puts it) is the parent of the call's span; the
call's steps are its children (policy, the upstream request); and the
upstream request carries the upstream span's context in ``params._meta``, as
MCP's conventions say: a real SDK server's tool answers with the ``_meta`` it
got. Spans are read from opentelemetry-sdk's in-memory exporter."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

pytest.importorskip("opentelemetry.sdk")
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)

from memorizz.api import methods as m
from memorizzd.config import Tracing
from tests.harness import (
    DaemonHarness,
    daemon_config,
    rmtree,
    short_tempdir,
    stdio_spec,
)
from tests.process import MEMORIZZCTL

META_SERVER = str(Path(__file__).parents[1] / "meta_server.py")
TRACE_ID = 0x4BF92F3577B34DA6A3CE929D0E0E4736
CALLER_SPAN = 0x00F067AA0BA902B7
TRACEPARENT = f"00-{TRACE_ID:032x}-{CALLER_SPAN:016x}-01"


@pytest.fixture(scope="module")
def exporter() -> InMemorySpanExporter:
    memory = InMemorySpanExporter()
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):  # the process's, as an application's
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    provider.add_span_processor(SimpleSpanProcessor(memory))
    return memory


@pytest.fixture(scope="module")
def harness(exporter: InMemorySpanExporter) -> Iterator[DaemonHarness]:
    base = short_tempdir()
    try:
        spec = stdio_spec("m", args=[META_SERVER])
        config = daemon_config(base, servers=[spec], tracing=Tracing(enabled=True))
        with DaemonHarness.running(config) as running:
            running.wait_ready("m")
            yield running
    finally:
        rmtree(base)


def ours(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    return [
        s
        for s in exporter.get_finished_spans()
        if s.instrumentation_scope is not None
        and s.instrumentation_scope.name == "memorizzd"
    ]


def received(result: Any) -> dict[str, Any]:
    """The ``_meta`` the upstream tool saw (its answer)."""
    text = (
        result.content[0]["text"]
        if isinstance(result, m.ToolsCallResult)
        else (result.content[0].text)
    )
    seen: dict[str, Any] = msgspec.json.decode(text)
    return seen


def check_family(
    spans: list[ReadableSpan], seen: dict[str, Any], parent_span: int
) -> None:
    """One call span under ``parent_span`` in TRACE_ID, its policy and
    upstream children, and the upstream's traceparent naming the latter."""
    (call,) = [s for s in spans if s.kind == trace.SpanKind.SERVER]
    assert call.name == "tools/call m/meta"
    assert call.context is not None
    assert call.context.trace_id == TRACE_ID
    assert call.parent is not None
    assert call.parent.span_id == parent_span
    assert (call.attributes or {})["memorizz.outcome"] == "ok"
    children = {s.name: s for s in spans if s is not call}
    assert set(children) == {"policy", "tools/call meta"}
    for child in children.values():
        assert child.parent is not None
        assert child.parent.span_id == call.context.span_id
    upstream = children["tools/call meta"]
    assert upstream.kind == trace.SpanKind.CLIENT
    assert upstream.context is not None
    assert seen["traceparent"] == (
        f"00-{TRACE_ID:032x}-{upstream.context.span_id:016x}-01"
    )


def test_a_socket_call_continues_the_callers_trace_upstream(
    harness: DaemonHarness, exporter: InMemorySpanExporter
) -> None:
    exporter.clear()
    with harness.client() as c:
        result = c.call(
            m.TOOLS_CALL,
            m.ToolsCallParams(
                server="m",
                name="meta",
                meta=m.CallMeta(traceparent=TRACEPARENT, tracestate="vendor=1"),
            ),
        )
    seen = received(result)
    check_family(ours(exporter), seen, CALLER_SPAN)
    assert seen["tracestate"] == "vendor=1"


def test_a_call_without_trace_context_starts_a_trace(
    harness: DaemonHarness, exporter: InMemorySpanExporter
) -> None:
    exporter.clear()
    with harness.client() as c:
        seen = received(c.call_tool("m", "meta", {}))
    spans = ours(exporter)
    (call,) = [s for s in spans if s.kind == trace.SpanKind.SERVER]
    assert call.parent is None
    assert call.context is not None
    assert seen["traceparent"].split("-")[1] == f"{call.context.trace_id:032x}"


def test_a_face_call_continues_the_sdk_clients_trace(
    harness: DaemonHarness, exporter: InMemorySpanExporter
) -> None:
    """The official SDK client puts its span's context in ``_meta``
    (SEP-414); through ``memorizzctl mcp serve`` it reaches the face."""
    exporter.clear()
    tracer = trace.get_tracer("agent")

    async def call() -> Any:
        params = StdioServerParameters(
            command=MEMORIZZCTL, args=["--socket", harness.socket, "mcp", "serve"]
        )
        async with Client(stdio_client(params), mode="legacy") as client:
            with tracer.start_as_current_span(
                "agent step",
                context=trace.set_span_in_context(
                    trace.NonRecordingSpan(
                        trace.SpanContext(
                            TRACE_ID,
                            CALLER_SPAN,
                            is_remote=True,
                            trace_flags=trace.TraceFlags(1),
                        )
                    )
                ),
            ):
                return await client.call_tool("meta", {})

    seen = received(anyio.run(call))
    sdk = [
        s
        for s in exporter.get_finished_spans()
        if s.kind == trace.SpanKind.CLIENT
        and s.instrumentation_scope is not None
        and s.instrumentation_scope.name == "mcp-python-sdk"
        and s.name == "MCP send tools/call meta"
        and s.context is not None
        and s.context.trace_id == TRACE_ID
    ]
    (client_span,) = sdk
    assert client_span.context is not None
    check_family(ours(exporter), seen, client_span.context.span_id)
