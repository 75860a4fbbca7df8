"""docs/operations.md's metrics table lists exactly the metrics the daemon
exports, each with its type and labels, and its dashboards query only those.

The exported metrics are what a scrape of the daemon's registry
(``memorizzd.telemetry.exposition.registry``) yields, with a sample in
every family: a call counted, each event counter counted once, a server
with an OAuth token, a connection.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest
from prometheus_client.core import Metric

from memorizzd.telemetry import exposition, metrics
from tests.doc_blocks import ROOT, blocks

OPERATIONS = ROOT / "docs" / "operations.md"
_ROW = re.compile(
    r"^\| `(?P<name>[a-z_*]+)`(?:, `(?P<also>[a-z_*]+)`)? \|\s*(?P<type>[a-z]*)\s*\|(?P<labels>[^|]*)\|",
    re.MULTILINE,
)


@dataclass(frozen=True)
class Documented:
    name: str
    """As a query names it: a counter's with ``_total``."""
    type: str
    labels: frozenset[str]


def _section() -> str:
    text = OPERATIONS.read_text(encoding="utf-8")
    return text.split("\n## Metrics\n", 1)[1].split("\n## ", 1)[0]


def documented() -> tuple[dict[str, Documented], list[str]]:
    """The table's metrics by name, and its rows of other names (``process_*``)."""
    rows: dict[str, Documented] = {}
    others: list[str] = []
    for row in _ROW.finditer(_section()):
        if not row["name"].startswith("memorizz_"):
            others += [n for n in (row["name"], row["also"]) if n]
            continue
        labels = frozenset(re.findall(r"`([a-z_]+)`", row["labels"]))
        assert row["name"] not in rows, f"{row['name']} twice"
        rows[row["name"]] = Documented(row["name"], row["type"], labels)
    return rows, others


def exported(monkeypatch: pytest.MonkeyPatch) -> list[Metric]:
    """One scrape of a daemon whose every family has a sample; the process's
    own counts are left as they are (fresh copies stand in)."""
    calls = metrics.CallStats()
    count, histogram = calls.child("docs", "search", "allow", "ok")
    count.value, histogram.counts[0], histogram.sum = 1, 1, 0.0001
    events = tuple(
        metrics.Events(e.name, e.documentation, e.labels) for e in metrics.EVENTS
    )
    for event in events:
        event.inc(*("x" for _ in event.labels))
    monkeypatch.setattr(exposition, "CALLS", calls)
    monkeypatch.setattr(exposition, "EVENTS", events)
    snapshot = metrics.Snapshot(
        upstreams=[metrics.UpstreamState("docs", "ready", 2, token_expires_at=100.0)],
        states=("ready", "failed"),
        calls_in_flight=1,
        connections={("operator", "api"): 1},
        approvals_pending=1,
        now=40.0,
    )
    registry = exposition.registry(lambda: snapshot, "0.1.0")
    return list(registry.collect())


def _exposed_name(family: Metric) -> str:
    return f"{family.name}_total" if family.type == "counter" else family.name


def _labels(family: Metric) -> frozenset[str]:
    return frozenset(
        name for sample in family.samples for name in sample.labels if name != "le"
    )


def test_the_table_lists_every_metric_exported_and_no_other(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rows, others = documented()
    families = exported(monkeypatch)
    ours = {_exposed_name(f): f for f in families if f.name.startswith("memorizz_")}
    assert sorted(set(rows) - set(ours)) == [], "documented, not exported"
    assert sorted(set(ours) - set(rows)) == [], "exported: document it"
    for name, family in ours.items():
        assert family.samples, name  # a family without one would hide its labels
        assert rows[name].type == family.type, name
        assert rows[name].labels == _labels(family), name
    # the rest are the process's, as the last row says
    assert others == ["process_*", "python_info"]
    rest = {f.name for f in families if not f.name.startswith("memorizz_")}
    assert rest, "the process collectors"
    assert all(n.startswith("process_") or n == "python_info" for n in rest), rest


def test_the_dashboards_query_exported_metrics(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every ``memorizz_`` name in the page's PromQL is a series a scrape has."""
    series = {
        sample.name for family in exported(monkeypatch) for sample in family.samples
    }
    promql = [b for b in blocks(OPERATIONS) if b.lang == "promql"]
    assert promql, "the dashboards' block"
    queried = set()
    for block in promql:
        for line in block.text.splitlines():
            if not line.lstrip().startswith("#"):
                queried |= set(re.findall(r"\bmemorizz_[a-z_]+", line))
    assert len(queried) >= 8
    assert sorted(queried - series) == []


def test_the_check_sees_a_wrong_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """The table is read as written: its names, types and labels."""
    rows, _ = documented()
    assert rows["memorizz_calls_total"] == Documented(
        "memorizz_calls_total",
        "counter",
        frozenset({"server", "tool", "decision", "outcome"}),
    )
    assert rows["memorizz_calls_in_flight"].labels == frozenset()
    assert len(rows) >= 13
    families = {f.name: f for f in exported(monkeypatch)}
    assert _exposed_name(families["memorizz_calls"]) == "memorizz_calls_total"
    assert _labels(families["memorizz_call_duration_seconds"]) == {"server"}
