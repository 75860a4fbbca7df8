"""The pool: every configured server's ``Upstream``, supervised in one task group."""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Final

import anyio
import anyio.abc
import msgspec

from memorizz.api import methods as m
from memorizz.api.errors import ConflictError, NotFoundError
from memorizzd.config import Config
from memorizzd.store import Store
from memorizzd.upstream.actor import Upstream
from memorizzd.upstream.errors import FailureKind
from memorizzd.upstream.supervisor import NoticeListener
from memorizzd.vault import CredentialStore

log = logging.getLogger("memorizzd.pool")

_DRAIN_POLL_S: Final = 0.05
"""How often a retired server's in-flight count is looked at (reloads only)."""


def _modules_for(spec: m.ServerSpec) -> list[str]:
    """The daemon's modules a server of ``spec`` loads that a stdio-only host
    never does: the MCP SDK's client (HTTP transports) and its OAuth client."""
    if spec.transport not in ("streamable_http", "sse"):
        return []
    names = ["memorizzd.upstream.session"]
    if spec.auth == "oauth":
        names += ["memorizzd.oauth.keeper", "memorizzd.oauth.machine"]
    return names


async def _loaded(spec: m.ServerSpec) -> None:
    """``spec``'s modules imported, in a worker thread when some are not yet:
    the SDK takes a second or more of CPU to import (pydantic builds its
    models), and imported on the event loop it froze every caller's call
    meanwhile. In a thread, the loop keeps its turns (the interpreter
    switches threads every few milliseconds)."""
    missing = [name for name in _modules_for(spec) if name not in sys.modules]
    if missing:
        await anyio.to_thread.run_sync(_import_all, missing)


def _import_all(names: list[str]) -> None:
    for name in names:
        importlib.import_module(name)


def unknown_server(name: str) -> NotFoundError:
    """The one answer for a server that does not exist, or not for this caller."""
    return NotFoundError(
        f"unknown server {name!r}", reason="unknown_server", data={"server": name}
    )


class Pool:
    def __init__(
        self,
        config: Config,
        store: Store,
        tg: anyio.abc.TaskGroup,
        vault: CredentialStore,
    ) -> None:
        self._config = config
        self._store = store
        self._vault = vault
        self._tg = tg
        self._upstreams: dict[str, Upstream] = {}
        self._retiring: set[Upstream] = set()
        """Out of the pool (a reload removed or replaced them): their in-flight
        calls finish, then they stop."""
        self.on_tools: Callable[[str, list[m.Tool]], Awaitable[None]] | None = None
        """Told every fresh tools listing (the approvals check schemas)."""
        self.on_notice: NoticeListener | None = None
        """Told what a server says that its callers may hear (``Supervisor.on_notice``)."""

    async def _noticed(self, server: str, method: str, params: msgspec.Raw) -> None:
        if self.on_notice is not None:
            await self.on_notice(server, method, params)

    async def _tools_listed(self, server: str, tools: list[m.Tool]) -> None:
        if self.on_tools is not None:
            await self.on_tools(server, tools)

    def get(self, name: str) -> Upstream:
        try:
            return self._upstreams[name]
        except KeyError:
            raise unknown_server(name) from None

    def all(self) -> list[Upstream]:
        return sorted(self._upstreams.values(), key=lambda u: u.name)

    def __contains__(self, name: str) -> bool:
        return name in self._upstreams

    def holds(self, upstream: Upstream) -> bool:
        """Whether ``upstream`` is still the pool's server of its name (not
        removed, nor removed and another added under its name)."""
        return self._upstreams.get(upstream.name) is upstream

    async def start(
        self,
        spec: m.ServerSpec,
        *,
        source: str,
        refused: str | None = None,
        refused_kind: FailureKind = "refused_by_policy",
    ) -> Upstream:
        """Start supervising ``spec``; with ``refused`` (why it must not run) it is
        only listed, ``failed``, until removed."""
        await _loaded(spec)  # before the check: nothing awaits between it and the entry
        if spec.name in self._upstreams:
            raise ConflictError(f"a server named {spec.name!r} already exists")
        return await self._start(
            spec, source=source, refused=refused, refused_kind=refused_kind
        )

    async def _start(
        self,
        spec: m.ServerSpec,
        *,
        source: str,
        refused: str | None,
        refused_kind: FailureKind,
    ) -> Upstream:
        upstream = Upstream(
            spec,
            source=source,
            config=self._config,
            store=self._store,
            vault=self._vault,
            on_tools=self._tools_listed,
        )
        upstream.on_notice = self._noticed
        self._upstreams[spec.name] = upstream
        if refused is not None:
            log.error("%s: not started: %s", spec.name, refused)
            upstream.refuse(refused, kind=refused_kind)
            return upstream
        await self._tg.start(upstream.run)
        return upstream

    def reconfigure(self, config: Config) -> list[Upstream]:
        """A reload's config, for every upstream at once (no await: no call
        sees half of it); the upstreams whose listing callers see changed."""
        self._config = config
        return [u for u in self._upstreams.values() if u.reconfigure(config)]

    async def replace(
        self,
        spec: m.ServerSpec,
        *,
        source: str,
        refused: str | None = None,
        refused_kind: FailureKind = "refused_by_policy",
    ) -> Upstream:
        """Start ``spec`` in place of the server of that name (a reload changed
        it): new calls go to the new session at once; the old one's calls
        finish, then it stops (``retire``)."""
        await _loaded(spec)  # before the swap: no moment without the server
        old = self._upstreams.pop(spec.name, None)
        if old is not None:
            self._retire(old)
        return await self._start(
            spec, source=source, refused=refused, refused_kind=refused_kind
        )

    def retire(self, name: str) -> None:
        """Take the server out of the pool now (new calls: ``unknown_server``);
        its in-flight calls finish (bounded by ``drain_timeout_s``), then it stops."""
        upstream = self._upstreams.pop(name, None)
        if upstream is not None:
            self._retire(upstream)

    def _retire(self, upstream: Upstream) -> None:
        self._retiring.add(upstream)
        self._tg.start_soon(self._drain_and_stop, upstream)

    async def _drain_and_stop(self, upstream: Upstream) -> None:
        try:
            with anyio.move_on_after(self._config.drain_timeout_s) as waited:
                # polled: a rare wait (reloads), where an Event would cost every call
                while upstream.in_flight:  # noqa: ASYNC110
                    await anyio.sleep(_DRAIN_POLL_S)
            if waited.cancelled_caught:
                log.warning(
                    "%s: %d calls still in flight after %.0f s; stopping it",
                    upstream.name,
                    upstream.in_flight,
                    self._config.drain_timeout_s,
                )
            await upstream.stop()
            log.info("%s: stopped (reload)", upstream.name)
        finally:
            self._retiring.discard(upstream)

    async def stop(self, name: str) -> None:
        upstream = self._upstreams.pop(name, None)
        if upstream is not None:
            await upstream.stop()

    async def stop_all(self) -> None:
        async with anyio.create_task_group() as tg:
            for name in list(self._upstreams):
                tg.start_soon(self.stop, name)
            for upstream in list(self._retiring):
                tg.start_soon(upstream.stop)


@asynccontextmanager
async def running_pool(
    config: Config, store: Store, vault: CredentialStore
) -> AsyncIterator[Pool]:
    """A pool whose upstreams all stop (processes killed, sessions closed) on exit."""
    async with anyio.create_task_group() as tg:
        pool = Pool(config, store, tg, vault)
        try:
            yield pool
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(15):
                await pool.stop_all()
            tg.cancel_scope.cancel()
