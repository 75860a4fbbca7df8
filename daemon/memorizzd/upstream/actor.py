"""One upstream per configured server: what callers ask of it.

An ``Upstream`` is a ``Supervisor`` (``supervisor.py``: the session kept
warm, probed and replaced) that any number of caller tasks send requests
through concurrently, each under its own deadline, with the retries
``retry.py`` allows. Its tool verdicts come from the warm cache
(``tools.py``); ``servers/test`` is answered by ``diagnostics.py``.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, Final, TypeVar

import anyio

from memorizz.api import methods as m
from memorizz.api.errors import (
    AuthRequiredError,
    DeadlineExceededError,
    MethodNotFoundError,
    RemoteError,
    UnavailableError,
)
from memorizz.api.presets import instructions_of
from memorizzd.config import Config
from memorizzd.loop import deadline_at, now
from memorizzd.policy import ToolsView, ToolVerdict
from memorizzd.redact import scrub_error
from memorizzd.store import Store
from memorizzd.upstream.connection import Connection, ProgressHandler, ToolResult
from memorizzd.upstream.diagnostics import diagnose
from memorizzd.upstream.errors import ConnectionLost, Unsent
from memorizzd.upstream.jsonrpc import JsonRpcSession
from memorizzd.upstream.replicas import ReplicaSet
from memorizzd.upstream.retry import LOST_SENDS, RetryBudget, busy_wait, lost_wait
from memorizzd.upstream.supervisor import Supervisor
from memorizzd.upstream.tools import ToolsListener, listed
from memorizzd.vault import CredentialStore

log = logging.getLogger("memorizzd.upstream")

T = TypeVar("T")
PROBE_TIMEOUT_S: Final = 10.0
LATENCY_WINDOW: Final = 1024


def _nothing() -> None:
    pass


class Upstream(Supervisor):
    def __init__(
        self,
        spec: m.ServerSpec,
        *,
        source: str,
        config: Config,
        store: Store,
        vault: CredentialStore,
        on_tools: ToolsListener | None = None,
    ) -> None:
        super().__init__(
            spec,
            source=source,
            config=config,
            store=store,
            vault=vault,
            on_tools=on_tools,
        )
        self.in_flight = 0
        self.calls_ok = 0
        self.calls_failed = 0
        self._latencies: collections.deque[float] = collections.deque(
            maxlen=LATENCY_WINDOW
        )
        self._budget = RetryBudget()
        """Retries after busy answers (429/503), for the whole server."""
        self._listing: anyio.Event | None = None
        """Set when the listing being fetched for callers that found no fresh
        one is in (``_fresh_view``); None while none is."""

    # --- requests -----------------------------------------------------------

    async def _wait_ready(self, deadline: float, *, patient: bool) -> Connection:
        if self.keeper is not None and not self.keeper.logged_in:
            raise self.keeper.login_required_error()
        if self._client is not None:
            return self._client
        now = anyio.current_time()
        waiting = (
            self.state == "connecting"
            # The session was just lost and is being stopped; a new one is
            # started at once after (a lost ready session backs off least).
            or (self.state == "ready" and not self._stopping)
            or (patient and self.state == "backoff" and self._next_attempt < deadline)
        )
        if waiting:
            with anyio.move_on_after(min(self._config.connect_wait_s, deadline - now)):
                await self._ready.wait()
            if (client := self._current()) is not None:
                return client
        retry_after = max(0.0, self._next_attempt - anyio.current_time())
        if self.last_failure == "authorization_required":
            raise AuthRequiredError(
                f"server {self.name!r} asks for credentials: {self.last_error}",
                data={"server": self.name, "state": self.state},
            )
        raise UnavailableError(
            f"server {self.name!r} is not connected ({self.state})"
            + (f": {self.last_error}" if self.last_error else ""),
            data={
                "server": self.name,
                "state": self.state,
                "retry_after_s": round(retry_after, 3),
            },
        )

    def timeout_for(self, requested: float | None) -> float:
        """The caller may ask for less than the server's timeout, never more."""
        if requested is None or requested <= 0:
            return self.spec.timeout_s
        return min(requested, self.spec.timeout_s)

    def deadline_for(self, requested: float | None) -> float:
        """The absolute deadline (``anyio.current_time()``) of a request asked
        for now, with ``requested`` seconds at most (``timeout_for``)."""
        return now() + self.timeout_for(requested)

    async def request(
        self,
        op: Callable[[Connection], Awaitable[T]],
        *,
        deadline: float,
        safe: bool,
        repeatable: bool | None = None,
        failed: Callable[[T], bool] | None = None,
    ) -> T:
        """Send one request over the warm session, by the caller's ``deadline``
        (absolute, ``anyio.current_time()``: waiting for a session, retries and
        the answer all count against it).

        ``safe`` reads are retried after a transport failure (bounded by the
        deadline); anything else, ``tools/call`` above all, never is, unless
        the server said it did not run it (an expired session).
        ``repeatable`` (default: ``safe``) requests are sent again after a busy
        answer (429/503) within ``retry.py``'s bounds: a tool classified
        ``read`` is repeatable though not ``safe`` (a busy answer says the
        server did not run it; a lost connection says nothing).
        """
        if self.in_flight >= self._config.max_in_flight_per_server:
            raise UnavailableError(
                f"server {self.name!r} has too many requests in flight",
                reason="overloaded",
                data={"server": self.name, "retry_after_s": 0.1},
            )
        timeout_s = max(0.0, deadline - now())
        repeatable = safe if repeatable is None else repeatable
        self.in_flight += 1
        started = time.perf_counter()
        sent = ok = False
        try:
            attempt = busy_sends = 0
            auth_retried = resent = False
            while True:
                checked = await self._wait_checked(deadline)
                client = await self._wait_ready(
                    deadline, patient=attempt > 0 or checked
                )
                if not sent:
                    sent, started = True, time.perf_counter()
                try:
                    async with deadline_at(deadline):
                        result = await op(client)
                except ConnectionLost as exc:
                    attempt += 1
                    # Sent again on the new session: a safe request, or any
                    # request the server did not run, once (retry.py).
                    unrun = isinstance(exc, Unsent) and not resent
                    resent = resent or unrun
                    lost = self.lost(client, str(exc), safe=safe)
                    if not (safe or unrun) or attempt == LOST_SENDS:
                        raise lost from None
                    await anyio.sleep(lost_wait(attempt))
                    continue
                except UnavailableError as exc:
                    if exc.reason != "upstream_busy":
                        raise
                    busy_sends += 1
                    wait = self._busy_wait(exc, deadline, busy_sends, repeatable)
                    if wait is None:
                        exc.data["server"] = self.name
                        raise
                    log.info("%s: busy; sending again in %.3g s", self.name, wait)
                    await anyio.sleep(wait)
                    continue
                except (TimeoutError, DeadlineExceededError):
                    self._suspect()
                    raise
                except AuthRequiredError as exc:
                    # A 401 made the keeper refresh once already; a safe read
                    # is sent once more with the new token, nothing else is.
                    if (
                        not safe
                        or auth_retried
                        or exc.reason != "authorization_required"
                        or self.keeper is None
                        or not self.keeper.logged_in
                    ):
                        raise
                    auth_retried = True
                    continue
                self.answered()
                ok = failed is None or not failed(result)
                return result
        except TimeoutError:
            raise self.no_answer(timeout_s) from None
        except RemoteError as exc:  # the server may quote its secrets back
            self.scrubbed(exc)  # in place
            raise
        finally:
            if sent:  # requests refused before reaching the server are not stats
                self.request_ended(started, ok=ok)
            else:
                self.in_flight -= 1

    # --- the warm relay's side of ``request`` (``memorizzd.relay``) ----------

    def warm_session(
        self,
    ) -> tuple[JsonRpcSession, Callable[[], None], Connection] | None:
        """The stdio session a call may be put on now, with nothing to wait
        for, check or retry first, what to call once it has ended, and the
        connection it belongs to (for ``lost``); None: the call takes
        ``request``'s way. The caller counts it (``request_began``)."""
        client = self._client
        if (
            client is None
            or self._checking is not None
            or (self.keeper is not None and not self.keeper.logged_in)
            or self.in_flight >= self._config.max_in_flight_per_server
        ):
            return None
        if isinstance(client, JsonRpcSession):
            return client, _nothing, client
        if isinstance(client, ReplicaSet):
            return (*client.take(), client)
        return None

    def request_began(self) -> float:
        """A request was sent (its start, for ``request_ended``)."""
        self.in_flight += 1
        return time.perf_counter()

    def request_ended(self, started: float, *, ok: bool) -> None:
        """A sent request ended: ``ok``, a result (not an error, not a tool error)."""
        self.in_flight -= 1
        self._latencies.append(time.perf_counter() - started)
        if ok:
            self.calls_ok += 1
        else:
            self.calls_failed += 1

    def lost(
        self, client: Connection, reason: str, *, safe: bool = False
    ) -> UnavailableError:
        """The session ``client`` ended during a request: marked dead (if it
        is still the session; a replica set only if its primary's ended: any
        other replica is lost alone, ``replicas.py``), and the error its
        caller gets."""
        if self._client is client and (
            not isinstance(client, ReplicaSet) or client.lost()
        ):
            self._mark_dead(reason)
        return UnavailableError(
            f"server {self.name!r}: connection lost during the request"
            + ("" if safe else " (it may have run; not sent again)"),
            data={"server": self.name, "retry_after_s": 0.5},
        )

    def scrubbed(self, exc: RemoteError) -> RemoteError:
        """``exc`` without this server's secrets in it (``redact.py``)."""
        return scrub_error(exc, self.hidden)

    def no_answer(self, timeout_s: float) -> DeadlineExceededError:
        """A request's deadline passed (the health loop probes the session)."""
        self._suspect()
        return DeadlineExceededError(
            f"{self.name}: no answer within {timeout_s:.3g} s",
            data={"server": self.name, "timeout_s": round(timeout_s, 3)},
        )

    def answered(self) -> None:
        """The server answered a request (its session works)."""
        self._last_ok = self._now()
        self._budget.succeeded()

    def _busy_wait(
        self, exc: UnavailableError, deadline: float, sends: int, repeatable: bool
    ) -> float | None:
        """How long to wait before sending a request the server was too busy
        for, or None (the caller gets ``upstream_busy``); see ``retry.py``."""
        within_budget = self._budget.busy()
        hint = exc.data.get("retry_after_s")
        return busy_wait(
            float(hint) if isinstance(hint, int | float) else 1.0,
            remaining_s=deadline - anyio.current_time(),
            attempt=sends,
            repeatable=repeatable and within_budget,
        )

    async def _refresh_tools(self, client: Connection) -> ToolsView:
        return await self._tools.refresh(client, server_name=self.server_name)

    # --- the operations -----------------------------------------------------

    async def list_tools(self, *, refresh: bool) -> list[m.Tool]:
        """The visible tools, each with its risk and decision (the warm cache
        unless ``refresh``, or stale: ``tools.py``)."""
        deadline = self.deadline_for(None)
        if refresh:
            fetched = await self.request(
                self._refresh_tools, deadline=deadline, safe=True
            )
            return fetched.tools
        if (view := self._tools.fresh) is not None and self._client is not None:
            return view.tools
        return (await self._fresh_view(deadline)).tools

    async def _fresh_view(self, deadline: float) -> ToolsView:
        """The listing, fetched once for all the callers that find no fresh
        one meanwhile (calls that arrive together once a listing went stale
        would each fetch it): the first fetches; the others wait for it, by
        their own ``deadline``, and fetch it themselves only if it failed."""
        fetching = self._listing
        if fetching is not None:
            with anyio.move_on_at(deadline):
                await fetching.wait()
            if (view := self._tools.fresh) is not None and self._client is not None:
                return view
        self._listing = done = anyio.Event()
        try:
            return await self.request(self._refresh_tools, deadline=deadline, safe=True)
        finally:
            if self._listing is done:
                self._listing = None
            done.set()

    async def tool_verdict(
        self, name: str, *, deadline: float
    ) -> tuple[ToolVerdict, m.Tool | None]:
        """The policy's verdict on calling ``name`` and the tool as listed
        (None: not listed), from one listing: a dict lookup in the warm cache;
        with no cache (or a stale one: ``tools.py``), the listing is fetched
        first, by ``deadline`` (a failure to fetch it is the call's failure:
        no annotations, no decision)."""
        view = self._tools.fresh
        if view is None:
            view = await self._fresh_view(deadline)
        return view.verdict(name), view.tool(name)

    @property
    def tools_view(self) -> ToolsView | None:
        """The warm listing as policy shows it (None: none now, or stale); a
        new object after every fresh listing, so its identity says whether it
        changed. The warm relay's path: one test for a stdio server."""
        tools = self._tools
        if tools.stale_at and tools.stale_at <= now():
            return None
        return tools.view

    def cached_verdict(self, name: str) -> ToolVerdict | None:
        """The verdict from the warm cache, or None when there is none or it
        is stale (no I/O)."""
        return self._tools.verdict(name)

    async def call_tool(
        self,
        name: str,
        arguments: bytes,
        *,
        risk: m.Risk,
        deadline: float,
        progress: ProgressHandler | None = None,
    ) -> ToolResult:
        """Relay one call: ``arguments`` (a JSON object, the caller's bytes) go
        out as they are, and the result comes back as the server wrote it. A
        ``read`` call may be sent again after a busy answer; no call is ever
        sent again after a lost connection (it may have run)."""
        return await self.request(
            lambda client: client.call_tool(name, arguments, progress),
            deadline=deadline,
            safe=False,
            repeatable=risk == "read",
            failed=_is_error_result,
        )

    async def list_resources(self) -> list[m.Resource]:
        limit = self._config.list_page_limit
        return await self.request(
            lambda client: listed(
                client, "resources", partial(client.list_resources, page_limit=limit)
            ),
            deadline=self.deadline_for(None),
            safe=True,
        )

    async def list_resource_templates(self) -> list[m.ResourceTemplate]:
        limit = self._config.list_page_limit
        return await self.request(
            lambda client: listed(
                client,
                "resources",
                partial(client.list_resource_templates, page_limit=limit),
            ),
            deadline=self.deadline_for(None),
            safe=True,
        )

    async def read_resource(
        self, uri: str, *, timeout_s: float | None
    ) -> m.ResourcesReadResult:
        return await self.request(
            lambda client: client.read_resource(uri),
            deadline=self.deadline_for(timeout_s),
            safe=True,
        )

    async def list_prompts(self) -> list[m.Prompt]:
        limit = self._config.list_page_limit
        return await self.request(
            lambda client: listed(
                client, "prompts", partial(client.list_prompts, page_limit=limit)
            ),
            deadline=self.deadline_for(None),
            safe=True,
        )

    async def get_prompt(
        self, name: str, arguments: dict[str, str], *, timeout_s: float | None
    ) -> m.PromptsGetResult:
        return await self.request(
            lambda client: client.get_prompt(name, arguments),
            deadline=self.deadline_for(timeout_s),
            safe=True,
        )

    @property
    def can_subscribe(self) -> bool:
        """Whether the session now takes ``resources/subscribe``."""
        client = self._client
        return client is not None and client.can_subscribe()

    def declares(self, capability: str) -> bool:
        """Whether the session now declares ``capability`` (False: none now)."""
        client = self._client
        return client is not None and client.declares(capability)

    @property
    def takes_tool_tasks(self) -> bool:
        """Whether a ``tools/call`` may now be sent as a task (``tasks.py``)."""
        client = self._client
        return client is not None and client.takes_tool_tasks()

    def _refuse_unless(self, offered: bool, what: str) -> None:
        """A connected server that does not offer ``what``: ``method_not_found``
        naming it, on every front alike (a server not connected now is waited
        for, or refused as such, by ``request``)."""
        if self._client is not None and not offered:
            raise MethodNotFoundError(
                f"server {self.name!r} {what}", data={"server": self.name}
            )

    async def subscribe_resource(self, holder: object, uri: str) -> None:
        """``holder`` (a face session, a socket connection, a listen stream)
        subscribes to ``uri``: sent upstream only if nobody held it
        (``subscriptions.py``). A server that takes no subscriptions is
        ``method_not_found``."""
        self._refuse_unless(self.can_subscribe, "takes no resource subscriptions")

        async def send(uri: str) -> None:
            await self.request(
                lambda client: client.subscribe_resource(uri),
                deadline=self.deadline_for(None),
                safe=True,
            )

        await self.subscriptions.hold(holder, uri, send)

    async def unsubscribe_resource(self, holder: object, uri: str) -> None:
        """``holder`` lets go of ``uri``; the last one's unsubscribe goes
        upstream (a session that is gone has nothing to unsubscribe)."""

        async def send(uri: str) -> None:
            try:
                await self.request(
                    lambda client: client.unsubscribe_resource(uri),
                    deadline=self.deadline_for(None),
                    safe=True,
                )
            except RemoteError as exc:
                log.info("%s: resources/unsubscribe failed: %s", self.name, exc)

        await self.subscriptions.let_go(holder, uri, send)

    async def complete(
        self, params: dict[str, Any], *, timeout_s: float | None
    ) -> dict[str, Any]:
        """``completion/complete`` with ``params`` (MCP's, the ref under the
        server's own names); a server that declares no ``completions`` is
        ``method_not_found``."""
        self._refuse_unless(self.declares("completions"), "offers no completions")
        return await self.request(
            lambda client: client.complete(params),
            deadline=self.deadline_for(timeout_s),
            safe=True,
        )

    async def test(self, timeout_s: float | None) -> m.ServersTestResult:
        """An honest connection test: ``ok`` only after a fresh ``tools/list``
        (``diagnostics.py``)."""
        return await diagnose(self, timeout_s)

    async def ping(self) -> None:
        await self.request(
            lambda client: client.probe(),
            deadline=self.deadline_for(PROBE_TIMEOUT_S),
            safe=True,
        )

    # --- views --------------------------------------------------------------

    @property
    def instructions(self) -> str | None:
        """What agents are told of this server (MCP ``instructions``: the
        face's handshake, ``servers/status``, ``tools/list``): the configured
        or preset text; without one, the server's own, from its handshake;
        none with ``instructions = false``."""
        if self.spec.instructions is False:
            return None
        return instructions_of(self.spec) or self.server_instructions

    def _pid(self) -> int | None:
        """The server's process: a replica set's primary (the heir after a
        hand-over), else the one process; None for a remote server."""
        if isinstance(client := self._client, ReplicaSet):
            return client.primary_pid
        return self._process.pid if self._process is not None else None

    def status(self) -> m.ServerStatus:
        latencies = list(self._latencies)
        state = self.state
        last_error = self.last_error
        keeper = self.keeper
        if keeper is not None and not keeper.logged_in and state != "stopped":
            state = "login_required"
            # as it stands now: a machine grant's latest refusal (the keeper
            # keeps trying after the state was entered), a login's reason
            last_error = keeper.login_required_error().message
        return m.ServerStatus(
            name=self.name,
            transport=self.spec.transport,
            state=state,
            since=self.since,
            last_error=last_error,
            pid=self._pid() if self.state == "ready" else None,
            protocol_version=self.protocol_version,
            server_name=self.server_name,
            server_version=self.server_version,
            tool_count=self._tools.count,
            in_flight=self.in_flight,
            calls_ok=self.calls_ok,
            calls_failed=self.calls_failed,
            latency_p50_ms=round(_median(latencies) * 1000, 3) if latencies else None,
            restarts=self.restarts,
            auth=self.keeper.status() if self.keeper is not None else None,
        )


def _is_error_result(result: ToolResult) -> bool:
    return result.is_error


def _median(values: list[float]) -> float:
    """The median (``statistics`` would load ``decimal`` and ``fractions``)."""
    ordered = sorted(values)
    mid = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[mid]
    return (ordered[mid - 1] + ordered[mid]) / 2
