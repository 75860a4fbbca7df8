"""The daemon's metrics: what is counted, without ``prometheus-client``.

Two kinds:

* events, counted where they happen: calls (``CallMeter`` into
  ``CallStats``: one dict lookup and three plain updates per call, no lock:
  see ``bench/metrics.py``), OAuth refreshes, approvals proposed and decided,
  egress refusals (``Events``). Process-wide, plain integers, updated on the
  event loop's thread;
* state, read when scraped (``Snapshot``): each upstream's state and
  reconnects, calls in flight, connections per socket, approvals pending,
  OAuth tokens' seconds to expiry. Nothing on the hot path pays for them.

``telemetry/exposition.py`` turns both into the Prometheus text format with
``prometheus-client``, which is imported only then, at the first scrape (it
brings ``email``, ``wsgiref``, ``http`` and more: about 3 MB a daemon that is
never scraped need not carry).

Label values are bounded: a server label is a configured server's name, a
tool label one of that server's listed tools; anything else (a name an agent
made up) is ``other``. Argument values are never labels.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Final

OTHER: Final = "other"
"""The label value of a server or tool that is not configured or listed."""
NONE: Final = "none"
"""The decision label of a call refused before the policy was asked."""

CALL_BUCKETS: Final = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
)
"""From a warm stdio call (~100 us) to a slow HTTP tool (minutes)."""


class _Count:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0


class _Histogram:
    __slots__ = ("counts", "sum")

    def __init__(self) -> None:
        self.counts = [0] * (len(CALL_BUCKETS) + 1)  # the last: +Inf
        self.sum = 0.0


class CallStats:
    """The calls' counter and latency histogram, process-wide.

    Plain integers, updated without a lock: calls are counted on the event
    loop's thread, and ``generate_latest`` reads them on that thread too
    (``telemetry/exposition.py``). prometheus-client's own ``Counter`` and
    ``Histogram`` take a lock per update (three per call), which costs more
    than the issue's 5 us budget on a loaded host (``bench/metrics.py``)."""

    def __init__(self) -> None:
        self.calls: dict[tuple[str, str, str, str], _Count] = {}
        self.seconds: dict[str, _Histogram] = {}

    def child(
        self, server: str, tool: str, decision: str, outcome: str
    ) -> tuple[_Count, _Histogram]:
        key = (server, tool, decision, outcome)
        count = self.calls.get(key)
        if count is None:
            count = self.calls[key] = _Count()
        histogram = self.seconds.get(server)
        if histogram is None:
            histogram = self.seconds[server] = _Histogram()
        return count, histogram


class Events:
    """A counter of events by label values (plain integers: the loop's thread)."""

    def __init__(self, name: str, documentation: str, labels: tuple[str, ...]) -> None:
        self.name = name
        self.documentation = documentation
        self.labels = labels
        self.counts: dict[tuple[str, ...], int] = {}

    def inc(self, *values: str) -> None:
        self.counts[values] = self.counts.get(values, 0) + 1


CALLS: Final = CallStats()
OAUTH_REFRESHES: Final = Events(
    "memorizz_oauth_refreshes",
    "OAuth access token refreshes, by server and outcome"
    " (ok, failed: retried, login_required: the grant is dead).",
    ("server", "outcome"),
)
APPROVALS_PROPOSED: Final = Events(
    "memorizz_approvals_proposed",
    "Calls held for an operator's approval (proposals made), by server.",
    ("server",),
)
APPROVALS_DECIDED: Final = Events(
    "memorizz_approvals_decided",
    "Proposals that left pending or approved, by what became of them"
    " (approved, rejected, cancelled, invalidated, expired, consumed).",
    ("decision",),
)
EGRESS_REFUSALS: Final = Events(
    "memorizz_egress_refusals",
    "Outgoing HTTP requests the egress policy refused, by reason.",
    ("reason",),
)
EVENTS: Final = (
    OAUTH_REFRESHES,
    APPROVALS_PROPOSED,
    APPROVALS_DECIDED,
    EGRESS_REFUSALS,
)

_EGRESS_REASONS: Final = frozenset(
    {
        "address_not_allowed",
        "host_not_allowed",
        "scheme_not_allowed",
        "credentials_in_url",
        "redirect_blocked",
    }
)


def egress_refused(reason: str | None) -> None:
    """Count one refused outgoing request (a reason we do not know: ``other``)."""
    EGRESS_REFUSALS.inc(reason if reason in _EGRESS_REASONS else OTHER)


def oauth_refreshed(server: str, outcome: str) -> None:
    OAUTH_REFRESHES.inc(server, outcome)


def approval_proposed(server: str) -> None:
    APPROVALS_PROPOSED.inc(server)


def approval_decided(decision: str) -> None:
    APPROVALS_DECIDED.inc(decision)


Labeller = Callable[[str, str], tuple[str, str]]
"""A call's (server, tool) as label values: each itself when configured and
listed, else ``other``."""
_CACHE_MAX: Final = 4096


class CallMeter:
    """Counts one call: ``meter(server, tool, decision, outcome, seconds)``.

    The counter and histogram cells are kept per (server, tool, decision,
    outcome) as given, so a warm call costs one dict lookup, an increment,
    a bisection and an addition; only calls whose labels are their own names
    are kept (a made-up name is relabelled each time, and cannot grow the
    cache). On the event loop's thread only (``CallStats``)."""

    __slots__ = ("_children", "_labels")

    def __init__(self, labels: Labeller) -> None:
        self._labels = labels
        self._children: dict[
            tuple[str, str, str | None, str], tuple[_Count, _Histogram]
        ] = {}

    def __call__(
        self,
        server: str,
        tool: str,
        decision: str | None,
        outcome: str,
        seconds: float,
    ) -> None:
        key = (server, tool, decision, outcome)
        children = self._children.get(key)
        if children is None:
            children = self._miss(key)
        count, histogram = children
        count.value += 1
        histogram.counts[bisect_left(CALL_BUCKETS, seconds)] += 1
        histogram.sum += seconds

    def _miss(self, key: tuple[str, str, str | None, str]) -> tuple[_Count, _Histogram]:
        server, tool, decision, outcome = key
        shown_server, shown_tool = self._labels(server, tool)
        children = CALLS.child(shown_server, shown_tool, decision or NONE, outcome)
        if (shown_server, shown_tool) == (server, tool) and len(
            self._children
        ) < _CACHE_MAX:
            self._children[key] = children
        return children


@dataclass
class UpstreamState:
    name: str
    state: str
    reconnects: int
    token_expires_at: float | None = None
    """An OAuth server's access token's expiry (Unix time), if it has one."""


@dataclass
class Snapshot:
    """The daemon's state as a scrape sees it (``exposition.DaemonCollector``)."""

    upstreams: list[UpstreamState] = field(default_factory=list)
    states: Iterable[str] = ()
    """Every state an upstream can be in: each gets a 0 or a 1."""
    calls_in_flight: int = 0
    connections: dict[tuple[str, str], int] = field(default_factory=dict)
    """(profile, socket kind: ``api`` or ``mcp``) -> open connections."""
    approvals_pending: int = 0
    now: float = 0.0
