"""The Prometheus text exposition of the daemon's metrics (``prometheus-client``).

Imported at the first scrape only (``telemetry/http.py``): the counting
itself (``telemetry/metrics.py``) needs no part of prometheus-client, and a
daemon nobody scrapes never loads it. Everything here runs on the event
loop's thread, as the counting does, so the plain integers are read without
a lock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, PlatformCollector, ProcessCollector
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from memorizzd.telemetry.metrics import CALL_BUCKETS, CALLS, EVENTS, Snapshot


class CallsCollector(Collector):
    """``metrics.CALLS``: the calls' counter and latency histogram."""

    def collect(self) -> Iterator[Metric]:
        calls = CounterMetricFamily(
            "memorizz_calls",
            "Tool calls (tools/call, approvals/resume, the MCP face), by server,"
            " tool, policy decision and outcome (the audit's).",
            labels=["server", "tool", "decision", "outcome"],
        )
        for key, count in sorted(CALLS.calls.items()):
            calls.add_metric(list(key), count.value)
        yield calls
        seconds = HistogramMetricFamily(
            "memorizz_call_duration_seconds",
            "Tool calls' duration, from arrival to the audit record, by server.",
            labels=["server"],
        )
        for server, histogram in sorted(CALLS.seconds.items()):
            cumulative, buckets = 0, []
            for bound, observed in zip(
                (*(repr(float(b)) for b in CALL_BUCKETS), "+Inf"),
                histogram.counts,
                strict=True,
            ):
                cumulative += observed
                buckets.append((bound, float(cumulative)))
            seconds.add_metric([server], buckets, histogram.sum)
        yield seconds


class EventsCollector(Collector):
    """``metrics.EVENTS``: the other counters."""

    def collect(self) -> Iterator[Metric]:
        for events in EVENTS:
            family = CounterMetricFamily(
                events.name, events.documentation, labels=list(events.labels)
            )
            for values, count in sorted(events.counts.items()):
                family.add_metric(list(values), count)
            yield family


class DaemonCollector(Collector):
    """What the daemon is now, read at each scrape from ``snapshot()``."""

    def __init__(self, snapshot: Callable[[], Snapshot], version: str) -> None:
        self._snapshot = snapshot
        self._version = version

    def collect(self) -> Iterator[Metric]:
        seen = self._snapshot()
        info = GaugeMetricFamily(
            "memorizz_build_info",
            "The daemon's version (always 1).",
            labels=["version"],
        )
        info.add_metric([self._version], 1)
        yield info
        state = GaugeMetricFamily(
            "memorizz_upstream_state",
            "Each server's session state: 1 for the state it is in, 0 for the others.",
            labels=["server", "state"],
        )
        reconnects = CounterMetricFamily(
            "memorizz_upstream_reconnects",
            "Sessions a server lost or failed to open, since it was started.",
            labels=["server"],
        )
        expiry = GaugeMetricFamily(
            "memorizz_oauth_token_expiry_seconds",
            "Seconds until an OAuth server's access token expires (negative: expired).",
            labels=["server"],
        )
        for upstream in seen.upstreams:
            for name in seen.states:
                state.add_metric(
                    [upstream.name, name], 1.0 if name == upstream.state else 0.0
                )
            reconnects.add_metric([upstream.name], upstream.reconnects)
            if upstream.token_expires_at is not None:
                expiry.add_metric([upstream.name], upstream.token_expires_at - seen.now)
        yield state
        yield reconnects
        yield expiry
        yield GaugeMetricFamily(
            "memorizz_calls_in_flight",
            "Tool calls running now.",
            value=seen.calls_in_flight,
        )
        connections = GaugeMetricFamily(
            "memorizz_connections",
            "Open socket connections, by profile (operator: the operator's) and"
            " socket (api: the socket API, mcp: the MCP face).",
            labels=["profile", "socket"],
        )
        for (profile, kind), count in sorted(seen.connections.items()):
            connections.add_metric([profile, kind], count)
        yield connections
        yield GaugeMetricFamily(
            "memorizz_approvals_pending",
            "Proposals waiting for an operator's decision.",
            value=seen.approvals_pending,
        )


def registry(snapshot: Callable[[], Snapshot], version: str) -> CollectorRegistry:
    """One daemon's metrics: the events, its state, and the process's."""
    built = CollectorRegistry(auto_describe=False)
    built.register(CallsCollector())
    built.register(EventsCollector())
    built.register(DaemonCollector(snapshot, version))
    ProcessCollector(registry=built)
    PlatformCollector(registry=built)
    return built
