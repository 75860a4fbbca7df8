"""What the call's metrics cost the hot path: a micro-benchmark.

Times, per call, in blocks of ``--n`` iterations (median of ``--blocks``):

* off: the hook's call with nothing behind it (the floor of a Python call);
* on: ``CallMeter`` warm (``telemetry/metrics.py``), as ``Calls._audit``
  calls it once per call: one dict lookup, ``Counter.inc``,
  ``Histogram.observe``;
* prometheus-client's own ``Counter`` and ``Histogram`` (children cached):
  what the cells of ``CallStats`` replace (a lock per update, three a call);
* tracing off: the hot path's one test of ``tracing.enabled`` around a call
  (``telemetry/tracing.py``).

The issue's budget: metrics on must cost at most 5 us per call over off.

    .venv/bin/python -m bench.metrics [--n 200000] [--blocks 7]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Final

from prometheus_client import Counter, Histogram

from memorizzd.telemetry import tracing
from memorizzd.telemetry.metrics import CALL_BUCKETS, CallMeter

_COUNTER = Counter("bench_calls", "", ["server", "tool", "decision", "outcome"])
_HISTOGRAM = Histogram("bench_seconds", "", ["server"], buckets=CALL_BUCKETS)

BUDGET_NS: Final = 5_000


def _off(
    server: str, tool: str, decision: str | None, outcome: str, seconds: float
) -> None:
    pass


_COUNTED = _COUNTER.labels("bench", "echo", "allow", "ok")
_TIMED = _HISTOGRAM.labels("bench")


def _unaided(
    server: str, tool: str, decision: str | None, outcome: str, seconds: float
) -> None:
    _COUNTED.inc()
    _TIMED.observe(seconds)


def _traced_off(
    server: str, tool: str, decision: str | None, outcome: str, seconds: float
) -> None:
    if tracing.enabled:  # the hot path's test, with tracing off
        raise AssertionError("tracing is on")


def _per_call_ns(
    hook: Callable[[str, str, str | None, str, float], None], n: int
) -> float:
    started = time.perf_counter_ns()
    for _ in range(n):
        hook("bench", "echo", "allow", "ok", 0.000123)
    return (time.perf_counter_ns() - started) / n


OFF: Final = "off (an empty hook)"
ON: Final = "on (CallMeter, warm)"


def measure(n: int, blocks: int) -> dict[str, float]:
    """Per-call ns of each hook, the median of ``blocks`` blocks of ``n`` calls
    (bench/core.py's row (h) shows these as context, with a small ``n``)."""
    meter = CallMeter(lambda server, tool: (server, tool))
    hooks: dict[str, Callable[[str, str, str | None, str, float], None]] = {
        OFF: _off,
        ON: meter,
        "prometheus-client Counter+Histogram": _unaided,
        "tracing off (one boolean)": _traced_off,
    }
    samples: dict[str, list[float]] = {name: [] for name in hooks}
    for hook in hooks.values():
        _per_call_ns(hook, max(1, n // 10))  # warm up
    for _ in range(blocks):  # interleaved, so drift hits every row alike
        for name, hook in hooks.items():
            samples[name].append(_per_call_ns(hook, n))
    return {name: statistics.median(values) for name, values in samples.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.metrics")
    parser.add_argument("--n", type=int, default=200_000)
    parser.add_argument("--blocks", type=int, default=7)
    args = parser.parse_args(argv)
    medians = measure(args.n, args.blocks)
    off = medians[OFF]
    print(f"per-call cost, median of {args.blocks} blocks of {args.n} calls:")
    for name, median in medians.items():
        print(f"  {name:40} {median:8.0f} ns  (+{median - off:6.0f} ns over off)")
    on = medians[ON]
    verdict = "within" if on - off <= BUDGET_NS else "OVER"
    print(f"metrics on - off: {on - off:.0f} ns, {verdict} the {BUDGET_NS} ns budget")
    return 0 if on - off <= BUDGET_NS else 1


if __name__ == "__main__":
    raise SystemExit(main())
