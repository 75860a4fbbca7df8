"""One server's warm tool cache: the listing as policy shows it, every verdict
decided once per listing.

The supervisor fills it at connect (``refresh``) and empties it on
``notifications/tools/list_changed`` (``invalidate``); callers look verdicts
up in it without I/O (``verdict``, ``tool``). An empty cache is refilled by
the next ``tools/list`` or ``tools/call`` (``Upstream.list_tools`` and
``Upstream.tool_verdict``).

A listing the daemon cannot be told about goes stale: a Streamable HTTP
server with no change signal (a 2026-07-28 server that declares no
``tools.listChanged``, a handshake-era one that gives no session id: its
restart with other tools shows nowhere) has its listing trusted for
``max(ttlMs, LISTING_FRESH_MIN_S)`` after it was fetched (``stale_at``), then
taken as an empty cache. Any other session's listing never goes stale: a
stdio server's restart is the daemon's own, a handshake-era HTTP session is
lost with its server (a 404), a listing that changes is said.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Final, Protocol, TypeVar, runtime_checkable

import anyio

from memorizz.api import methods as m
from memorizz.api.errors import UpstreamError
from memorizzd.config import Config
from memorizzd.loop import now
from memorizzd.policy import ToolPolicy, ToolsView, ToolVerdict
from memorizzd.upstream.connection import Connection
from memorizzd.upstream.errors import METHOD_NOT_FOUND

log = logging.getLogger("memorizzd.upstream")

T = TypeVar("T")

LISTING_FRESH_MIN_S: Final = 5.0
"""A listing the daemon cannot be told about (see above) is fresh for the
server's ``ttlMs``, and never less than this (``ttlMs`` 0 or absent: this)."""
LISTING_FRESH_MAX_S: Final = 24 * 3600.0
"""... and never more than this (the MCP SDK's own cache caps ``ttlMs`` so)."""

ToolsListener = Callable[[str, list[m.Tool]], Awaitable[None]]
"""Told each fresh listing (server name, visible tools): approvals re-check."""


class ToolCache:
    def __init__(
        self,
        spec: m.ServerSpec,
        *,
        config: Config,
        on_tools: ToolsListener | None = None,
    ) -> None:
        self._spec = spec
        self._config = config
        self._on_tools = on_tools
        self.view: ToolsView | None = None
        """The listing as policy shows it, verdicts precomputed (None: none yet)."""
        self.count: int | None = None
        """How many tools callers saw in the last listing (kept on invalidation)."""
        self._listed: list[m.Tool] = []
        """The last listing as the server sent it (``reconfigure`` decides it again)."""
        self._server_name: str | None = None
        self.stale_at = 0.0
        """When the listing goes stale (the loop's clock); 0.0: never (the
        session tells the daemon of changes). Read as ``stale_at and
        stale_at <= now()``: one test on a stdio server's warm path."""
        self._expiry_said = False
        """Whether the log said yet that this server's listing expires."""

    async def refresh(
        self, client: Connection, *, server_name: str | None
    ) -> ToolsView:
        """Fetch the listing and decide every tool once; calls look verdicts up."""
        name = self._spec.name
        limit = self._config.list_page_limit
        asked = now()
        old = self.view
        expired = old is not None and self.stale_at != 0.0 and self.stale_at <= asked
        with anyio.fail_after(self._spec.timeout_s):
            tools = await listed(
                client, "tools", partial(client.list_tools, page_limit=limit)
            )
        policy = ToolPolicy.for_server(
            self._spec, self._config.decisions, server_name=server_name
        )
        self.view = view = policy.view(tools)
        self._listed, self._server_name = tools, server_name
        self.count = len(view.tools)  # what callers see
        self.stale_at = self._stale_at(client, asked)
        changed = (
            old is None or view.tools != old.tools or view.verdicts != old.verdicts
        )
        if expired and changed:
            log.info("%s: the tools changed (a stale listing fetched again)", name)
        if self._on_tools is not None and (changed or not expired):
            try:
                await self._on_tools(name, view.tools)
            except Exception:  # the listing stands; resume re-checks anyway
                log.exception("%s: the tools listener failed", name)
        return view

    def _stale_at(self, client: Connection, asked: float) -> float:
        """When a listing asked for at ``asked`` goes stale (0.0: never)."""
        fresh_for = client.tools_fresh_for() if isinstance(client, _Expiring) else None
        if fresh_for is None:
            return 0.0
        fresh_for = min(max(fresh_for, LISTING_FRESH_MIN_S), LISTING_FRESH_MAX_S)
        if not self._expiry_said:
            self._expiry_said = True
            log.info(
                "%s: the server gives no signal when its tools change; "
                "its listing is fetched again once %g s old",
                self._spec.name,
                fresh_for,
            )
        return asked + fresh_for

    def reconfigure(self, config: Config, spec: m.ServerSpec) -> bool:
        """A reload's config and spec (same name): the cached listing decided
        again under the new policy, with no round trip to the server. True:
        what callers see or get changed (a visible tool, a risk, a decision)."""
        self._config, self._spec = config, spec
        old = self.view
        if old is None:
            return False  # the next listing is decided under the new policy
        policy = ToolPolicy.for_server(
            spec, config.decisions, server_name=self._server_name
        )
        self.view = new = policy.view(self._listed)
        return new.tools != old.tools or new.verdicts != old.verdicts

    async def announce(self) -> None:
        """Tell the listener the listing as it is now (after ``reconfigure``)."""
        view = self.view
        if view is not None and self._on_tools is not None:
            try:
                await self._on_tools(self._spec.name, view.tools)
            except Exception:
                log.exception("%s: the tools listener failed", self._spec.name)

    def invalidate(self) -> None:
        """The server's tools changed: the next listing is fetched afresh."""
        self.view = None  # logged by the relist (once, however many come)

    @property
    def fresh(self) -> ToolsView | None:
        """The listing, unless there is none or it is stale (None: fetch it)."""
        stale_at = self.stale_at
        if stale_at and stale_at <= now():
            return None
        return self.view

    def tool(self, name: str) -> m.Tool | None:
        """A visible tool (None: not listed, or no fresh cache)."""
        view = self.fresh
        return None if view is None else view.tool(name)

    def verdict(self, name: str) -> ToolVerdict | None:
        """The verdict on calling ``name``, or None when there is no fresh cache."""
        view = self.fresh
        return None if view is None else view.verdict(name)


@runtime_checkable
class _Expiring(Protocol):
    """A session whose listings may go stale (``session.SdkConnection``: an
    HTTP server's); any other tells the daemon of changes."""

    def tools_fresh_for(self) -> float | None: ...


async def listed(
    client: Connection, capability: str, fetch: Callable[[], Awaitable[list[T]]]
) -> list[T]:
    """A listing; empty, without asking, from a server that does not declare
    ``capability``, and empty from one that answers that it has no such method
    (``-32601``): nothing to list is not an error."""
    if not client.declares(capability):
        return []
    try:
        return await fetch()
    except UpstreamError as exc:
        if exc.data.get("upstream_code") != METHOD_NOT_FOUND:
            raise
        return []
