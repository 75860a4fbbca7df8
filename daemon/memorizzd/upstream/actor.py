"""One supervised upstream per configured server.

An ``Upstream`` owns its MCP session: one task (``run``) enters and exits the
SDK client (cancel scopes must exit in the task that entered them) and keeps it
warm; any number of caller tasks send requests over the shared session
concurrently. When the session dies (process exit, broken pipe, transport
fault, failed health probe) ``run`` reconnects with jittered exponential
backoff while callers get ``server_unavailable`` at once.

This is the circuit breaker (SECURITY.md §6.2 #11), per server, with no
separate failure counter: a request that times out has the session probed at
once (``_suspect``), and a lost connection or a probe that gets no answer
within ``health_timeout_s`` drops the session (open); while it is open,
calls fail at once with ``server_unavailable`` and ``retry_after_s``; after
the jittered backoff, doubling up to ``backoff_max_s`` with every failed
connect in a row (state ``backoff``, then ``failed`` after ``FAILED_AFTER``),
one connect is tried (half-open: ``connecting``, bounded by ``timeout_s`` over
HTTP), and a ready session closes it. A session that still answers its probe
stays, even if one tool hangs: the failure is that tool's, and each call's
deadline bounds what it costs.
"""

from __future__ import annotations

import collections
import logging
import math
import random
import statistics
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING, Any, Final, TypeVar

import anyio
import anyio.abc

from memorizz.api import methods as m
from memorizz.api.errors import (
    AuthRequiredError,
    DeadlineExceededError,
    PermissionDeniedError,
    RemoteError,
    UnavailableError,
)
from memorizzd.config import Config
from memorizzd.policy import ToolPolicy, ToolsView, ToolVerdict
from memorizzd.store import Negotiated, Store, fingerprint
from memorizzd.upstream import session as sdk
from memorizzd.upstream.mcp_sdk import Client, MCPError
from memorizzd.upstream.retry import LOST_SENDS, RetryBudget, busy_wait, lost_wait
from memorizzd.upstream.stdio import StdioProcess
from memorizzd.vault import CredentialStore, VaultError, resolve_secrets

if TYPE_CHECKING:
    from memorizzd.oauth.keeper import TokenKeeper

log = logging.getLogger("memorizzd.upstream")

T = TypeVar("T")
FAILED_AFTER: Final = 5
"""Consecutive failed connects after which the state reads ``failed`` (it still retries)."""
PROBE_TIMEOUT_S: Final = 10.0
LATENCY_WINDOW: Final = 1024
METHOD_NOT_FOUND: Final = -32601
"""JSON-RPC's code for a method the server does not have."""


class Upstream:
    def __init__(
        self,
        spec: m.ServerSpec,
        *,
        source: str,
        config: Config,
        store: Store,
        vault: CredentialStore,
        on_tools: Callable[[str, list[m.Tool]], Awaitable[None]] | None = None,
    ) -> None:
        self.spec = spec
        self._on_tools = on_tools
        self._vault = vault
        self.name = spec.name
        self.source = source
        self._config = config
        self._store = store
        self.state: m.ServerState = "connecting"
        self.since = time.time()
        self.last_error: str | None = None
        self.last_failure: sdk.FailureKind | None = None
        """Why the last connect failed, machine-readable (None once ready)."""
        self.restarts = 0
        self.protocol_version: str | None = None
        self.server_name: str | None = None
        self.server_version: str | None = None
        self.in_flight = 0
        self.calls_ok = 0
        self.calls_failed = 0
        self._latencies: collections.deque[float] = collections.deque(
            maxlen=LATENCY_WINDOW
        )
        self._client: Client | None = None
        self._ready = anyio.Event()
        self._settled = anyio.Event()
        """Set while the state is anything but ``connecting``."""
        self._dead = anyio.Event()
        self._process: StdioProcess | None = None
        self._view: ToolsView | None = None
        """The warm tools cache: the listing as policy shows it, verdicts precomputed."""
        self._tool_count: int | None = None
        self._next_attempt = 0.0
        self._last_ok = 0.0
        self._scope: anyio.CancelScope | None = None
        self._stopped = anyio.Event()
        self._was_ready = False
        self._check = anyio.Event()
        """Set: the health loop probes the session now (a request timed out)."""
        self._checking: anyio.Event | None = None
        """While such a probe runs: set when it has its answer."""
        self._budget = RetryBudget()
        self._handshake_next = False
        """The next auto-mode connect uses the handshake era (the probe timed out)."""
        """Retries after busy answers (429/503), for the whole server."""
        self.keeper: TokenKeeper | None = None
        """OAuth servers: the grant and its refresher."""
        if spec.auth == "oauth" and spec.transport != "stdio":
            # Imported here: a host without OAuth servers never loads the
            # SDK's OAuth client modules (about a megabyte of the daemon).
            from memorizzd.oauth.keeper import TokenKeeper, http_client_for

            self.keeper = TokenKeeper(
                spec.name,
                vault=vault,
                http=partial(http_client_for, spec, config.host_allowlist),
            )

    # --- supervision --------------------------------------------------------

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Connect, stay warm, reconnect; until ``stop()``. Started = first attempt begun."""
        try:
            with anyio.CancelScope() as self._scope:
                if self.keeper is None:
                    task_status.started()
                    await self._supervise()
                else:
                    async with anyio.create_task_group() as tg:
                        await tg.start(self.keeper.run)
                        task_status.started()
                        await self._supervise()
        finally:
            self._publish(None)
            self._set_state("stopped")
            self._stopped.set()

    async def _supervise(self) -> None:
        failures = 0
        while True:
            if self.keeper is not None and not self.keeper.logged_in:
                self._set_state("login_required")
                self.last_failure = "login_required"
                self.last_error = self.keeper.login_required_error().message
                await self.keeper.wait_logged_in()
                failures = 0
            self._set_state("connecting")
            self._was_ready = False
            try:
                await self._connect_and_serve()
            except Exception as exc:  # noqa: BLE001 - the supervision boundary
                if not self._dead.is_set():  # else _mark_dead said why
                    self.last_error = _describe_failure(exc)
                    self.last_failure = sdk.failure_kind(exc)
                log.warning("%s: connection failed: %s", self.name, self.last_error)
            finally:
                self._publish(None)
            # A session that was ready starts the backoff ladder afresh.
            failures = 1 if self._was_ready else failures + 1
            self.restarts += 1
            delay = self._backoff(max(failures, 1))
            self._next_attempt = anyio.current_time() + delay
            self._set_state("failed" if failures >= FAILED_AFTER else "backoff")
            if self.keeper is None:
                await anyio.sleep(delay)
            else:  # a login ends the wait: connect with the new grant at once
                with anyio.move_on_after(delay):
                    await self.keeper.wait_installed()

    def refuse(
        self, reason: str, *, kind: sdk.FailureKind = "refused_by_policy"
    ) -> None:
        """Never run (instead of ``run``): ``failed`` with ``reason`` as last_error."""
        self._set_state("failed")
        self.last_error = reason
        self.last_failure = kind
        self._stopped.set()

    async def stop(self) -> None:
        if self._scope is not None:
            self._scope.cancel()
        await self._stopped.wait()

    def _backoff(self, failures: int) -> float:
        base = self._config.backoff_initial_s * float(2 ** min(failures - 1, 30))
        jitter: float = random.uniform(0.5, 1.0)  # noqa: S311 - not cryptographic
        return min(self._config.backoff_max_s, base) * jitter

    async def _connect_and_serve(self) -> None:
        self._process = (
            StdioProcess(self.name) if self.spec.transport == "stdio" else None
        )
        self._dead = anyio.Event()
        known = await anyio.to_thread.run_sync(self._store.negotiated, self.name)
        if known is not None and known.fingerprint != fingerprint(self.spec):
            known = None  # reached differently now: negotiate afresh
        mode = self.spec.protocol
        if mode == "auto" and known is not None:
            # Never pay the slow probe twice: a known-legacy server gets the handshake.
            mode = "legacy" if known.protocol_version != sdk.MODERN else "auto"
        elif mode == "auto" and self._handshake_next:
            mode = "legacy"  # the probe found no answer last time
        # Over HTTP the connect and the handshake are answers like any other,
        # bounded by timeout_s (not by the SDK's 30 s connect timeout and 10 s
        # server/discover probe; a legacy SSE stream first has timeout_s to
        # open, sse.py). A stdio server's start-up counts against its
        # handshake, so there the SDK's own per-request bounds apply.
        handshake = anyio.CancelScope()
        budget = self.spec.timeout_s * (2 if self.spec.transport == "sse" else 1)
        if self.spec.transport != "stdio":
            handshake.deadline = anyio.current_time() + budget
        with handshake:
            await self._open_and_serve(mode, known, handshake)
        if handshake.cancelled_caught:
            # An auto-mode server that left the probe unanswered is tried next
            # in the handshake era (it may ignore methods it does not know),
            # then in auto mode again, and so on.
            self._handshake_next = mode == "auto"
            raise DeadlineExceededError(
                f"no answer to the handshake within {budget:g} s (timed out)"
            )

    async def _open_and_serve(
        self,
        mode: str,
        known: Negotiated | None,
        handshake: anyio.CancelScope,
    ) -> None:
        # The secrets, from the vault right before connecting (never kept longer
        # than the connect; a missing one fails the attempt, naming its ref).
        secrets = await anyio.to_thread.run_sync(
            resolve_secrets, self.spec, self._vault
        )
        async with sdk.open_client(
            self.spec,
            mode=mode,
            process=self._process,
            message_handler=self._on_message,
            host_allowlist=self._config.host_allowlist,
            secrets=secrets,
            bearer=self.keeper,
        ) as client:
            handshake.deadline = math.inf
            self._handshake_next = False
            del secrets
            version, self.server_name, self.server_version = sdk.describe(client)
            self.protocol_version = version
            if version and (known is None or known.protocol_version != version):
                negotiated = Negotiated(version, fingerprint(self.spec))
                await anyio.to_thread.run_sync(
                    self._store.set_negotiated, self.name, negotiated
                )
            try:
                await self._refresh_tools(client)
            except RemoteError as exc:
                log.info("%s: no tool listing at connect: %s", self.name, exc.message)
            except TimeoutError:
                log.info("%s: no tool listing at connect: it timed out", self.name)
            self.last_error = None
            self.last_failure = None
            self._last_ok = anyio.current_time()
            self._publish(client)
            self._was_ready = True
            self._set_state("ready")
            log.info(
                "%s: ready (%s, protocol %s)",
                self.name,
                self.server_name or "unnamed server",
                version,
            )
            async with anyio.create_task_group() as tg:
                if self._process is not None:
                    tg.start_soon(self._watch_process, self._process)
                tg.start_soon(self._health_loop, client)
                tg.start_soon(self._watch_tool_changes, client)
                await self._dead.wait()
                tg.cancel_scope.cancel()
            self._publish(None)

    async def _watch_process(self, process: StdioProcess) -> None:
        await process.exited.wait()
        self._mark_dead(f"process exited with code {process.returncode}")

    async def _health_loop(self, client: Client) -> None:
        """Probe an idle session every ``health_interval_s``, and at once after
        a request timed out (``_suspect``): a session that cannot answer a
        ping (a reply dripping slowly ahead of every other on one stdio pipe
        or SSE stream, a frozen process) is replaced. Requests wait for the
        verdict of such a check instead of queueing behind the stuck reply."""
        interval = self._config.health_interval_s
        self._check = anyio.Event()
        while True:
            with anyio.move_on_after(interval):
                await self._check.wait()
            suspect = self._check.is_set()
            if not suspect and anyio.current_time() - self._last_ok < interval:
                continue
            try:
                if suspect:
                    self._check, self._checking = anyio.Event(), anyio.Event()
                with anyio.fail_after(self._config.health_timeout_s):
                    await sdk.guarded(partial(sdk.probe, client), server=self.name)
            except (RemoteError, sdk.ConnectionLost, TimeoutError) as exc:
                self._mark_dead(
                    f"health probe failed: {str(exc) or 'no answer in time'}"
                    + (" (after a request timed out)" if suspect else "")
                )
                return
            finally:
                checking, self._checking = self._checking, None
                if checking is not None:
                    checking.set()
            self._last_ok = anyio.current_time()

    def _suspect(self) -> None:
        """A request timed out: have the health loop probe the session now."""
        self._check.set()

    async def _wait_checked(self, deadline: float) -> bool:
        """Wait (within ``deadline``) for a check of the session that a timeout
        started; whether there was one."""
        checking = self._checking
        if checking is None:
            return False
        with anyio.move_on_after(max(0.0, deadline - anyio.current_time())):
            await checking.wait()
        return True

    async def _on_message(self, message: Any) -> None:
        if sdk.is_tool_list_changed(message):
            self._tools_changed()

    def _tools_changed(self) -> None:
        log.info("%s: tools/list_changed", self.name)
        self._view = None  # the next tools/list fetches afresh

    async def _watch_tool_changes(self, client: Client) -> None:
        try:
            await sdk.watch_tool_changes(client, self._tools_changed)
        except Exception as exc:  # noqa: BLE001 - best effort; refresh=true still works
            log.info("%s: no tools/list_changed subscription: %s", self.name, exc)

    def _mark_dead(self, reason: str) -> None:
        if not self._dead.is_set():
            self.last_error = reason
            self.last_failure = "unreachable"
            log.warning("%s: session lost: %s", self.name, reason)
            self._publish(None)
            self._dead.set()

    async def wait_ready(self) -> None:
        """Return once the session is ready (the caller bounds the wait)."""
        while self._current() is None:
            await self._ready.wait()

    def _current(self) -> Client | None:
        return self._client

    def _publish(self, client: Client | None) -> None:
        self._client = client
        if client is not None:
            self._ready.set()
        elif self._ready.is_set():
            self._ready = anyio.Event()

    def _set_state(self, state: m.ServerState) -> None:
        if state != self.state:
            self.state = state
            self.since = time.time()
        if state == "connecting":
            if self._settled.is_set():
                self._settled = anyio.Event()
        else:
            self._settled.set()

    # --- requests -----------------------------------------------------------

    async def _wait_ready(self, deadline: float, *, patient: bool) -> Client:
        if self.keeper is not None and not self.keeper.logged_in:
            raise self.keeper.login_required_error()
        if self._client is not None:
            return self._client
        now = anyio.current_time()
        waiting = self.state == "connecting" or (
            patient
            and (
                self.state == "ready"  # the session was just lost: reconnecting
                or (self.state == "backoff" and self._next_attempt < deadline)
            )
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

    async def request(
        self,
        op: Callable[[Client], Awaitable[T]],
        *,
        timeout_s: float,
        safe: bool,
        repeatable: bool | None = None,
        failed: Callable[[T], bool] | None = None,
    ) -> T:
        """Send one request over the warm session, under a deadline of ``timeout_s``.

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
        deadline = anyio.current_time() + timeout_s
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
                    with anyio.fail_after(deadline - anyio.current_time()):
                        result = await sdk.guarded(
                            partial(op, client), server=self.name
                        )
                except sdk.ConnectionLost as exc:
                    if self._client is client:
                        self._mark_dead(str(exc))
                    attempt += 1
                    # Sent again on the new session: a safe request, or any
                    # request the server did not run, once (retry.py).
                    unrun = isinstance(exc, sdk.SessionExpired) and not resent
                    resent = resent or unrun
                    if not (safe or unrun) or attempt == LOST_SENDS:
                        raise UnavailableError(
                            f"server {self.name!r}: connection lost during the request"
                            + ("" if safe else " (it may have run; not sent again)"),
                            data={"server": self.name, "retry_after_s": 0.5},
                        ) from None
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
                self._last_ok = anyio.current_time()
                self._budget.succeeded()
                ok = failed is None or not failed(result)
                return result
        except TimeoutError:
            raise DeadlineExceededError(
                f"{self.name}: no answer within {timeout_s:g} s",
                data={"server": self.name, "timeout_s": timeout_s},
            ) from None
        finally:
            self.in_flight -= 1
            if sent:  # requests refused before reaching the server are not stats
                self._latencies.append(time.perf_counter() - started)
                if ok:
                    self.calls_ok += 1
                else:
                    self.calls_failed += 1

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

    async def _refresh_tools(self, client: Client) -> list[m.Tool]:
        return (await self._refresh_view(client)).tools

    async def _refresh_view(self, client: Client) -> ToolsView:
        """Fetch the listing and decide every tool once; calls look verdicts up."""
        limit = self._config.list_page_limit
        with anyio.fail_after(self.spec.timeout_s):
            tools = await sdk.guarded(
                partial(
                    _listed, client, "tools", partial(sdk.list_tools, page_limit=limit)
                ),
                server=self.name,
            )
        policy = ToolPolicy.for_server(
            self.spec, self._config.decisions, server_name=self.server_name
        )
        self._view = view = policy.view(tools)
        self._tool_count = len(view.tools)  # what callers see
        if self._on_tools is not None:
            try:
                await self._on_tools(self.name, view.tools)
            except Exception:  # the listing stands; resume re-checks anyway
                log.exception("%s: the tools listener failed", self.name)
        return view

    # --- the operations -----------------------------------------------------

    async def list_tools(self, *, refresh: bool) -> list[m.Tool]:
        """The visible tools, each with its risk and decision (the warm cache
        unless ``refresh``)."""
        if (
            not refresh
            and (view := self._view) is not None
            and self._client is not None
        ):
            return view.tools
        return await self.request(
            self._refresh_tools, timeout_s=self.spec.timeout_s, safe=True
        )

    async def tool_verdict(self, name: str, *, timeout_s: float | None) -> ToolVerdict:
        """The policy's verdict on calling ``name``: a dict lookup in the warm
        cache; with no cache, the listing is fetched first (a failure to fetch
        it is the call's failure: no annotations, no decision)."""
        view = self._view
        if view is None:
            view = await self.request(
                self._refresh_view, timeout_s=self.timeout_for(timeout_s), safe=True
            )
        return view.verdict(name)

    def cached_tool(self, name: str) -> m.Tool | None:
        """A visible tool from the warm cache (None: not listed, or no cache)."""
        view = self._view
        if view is None:
            return None
        return next((tool for tool in view.tools if tool.name == name), None)

    def cached_verdict(self, name: str) -> ToolVerdict | None:
        """The verdict from the warm cache, or None when there is none (no I/O)."""
        view = self._view
        return None if view is None else view.verdict(name)

    async def call_tool(
        self, name: str, arguments: dict[str, Any], *, timeout_s: float | None
    ) -> m.ToolsCallResult:
        verdict = self.cached_verdict(name)
        return await self.request(
            lambda client: sdk.call_tool(client, name, arguments),
            timeout_s=self.timeout_for(timeout_s),
            safe=False,
            repeatable=verdict is not None and verdict.risk == "read",
            failed=_is_error_result,
        )

    async def list_resources(self) -> list[m.Resource]:
        limit = self._config.list_page_limit
        return await self.request(
            lambda client: _listed(
                client, "resources", partial(sdk.list_resources, page_limit=limit)
            ),
            timeout_s=self.spec.timeout_s,
            safe=True,
        )

    async def list_resource_templates(self) -> list[m.ResourceTemplate]:
        limit = self._config.list_page_limit
        return await self.request(
            lambda client: _listed(
                client,
                "resources",
                partial(sdk.list_resource_templates, page_limit=limit),
            ),
            timeout_s=self.spec.timeout_s,
            safe=True,
        )

    async def read_resource(
        self, uri: str, *, timeout_s: float | None
    ) -> m.ResourcesReadResult:
        return await self.request(
            lambda client: sdk.read_resource(client, uri),
            timeout_s=self.timeout_for(timeout_s),
            safe=True,
        )

    async def list_prompts(self) -> list[m.Prompt]:
        limit = self._config.list_page_limit
        return await self.request(
            lambda client: _listed(
                client, "prompts", partial(sdk.list_prompts, page_limit=limit)
            ),
            timeout_s=self.spec.timeout_s,
            safe=True,
        )

    async def get_prompt(
        self, name: str, arguments: dict[str, str], *, timeout_s: float | None
    ) -> m.PromptsGetResult:
        return await self.request(
            lambda client: sdk.get_prompt(client, name, arguments),
            timeout_s=self.timeout_for(timeout_s),
            safe=True,
        )

    async def test(self, timeout_s: float | None) -> m.ServersTestResult:
        """An honest connection test: ``ok`` only after a fresh ``tools/list``.

        A server that is not connected is not waited for past the connect
        wait: in backoff or failed, the recorded failure is the answer.
        """
        timeout = self.timeout_for(timeout_s)
        deadline = anyio.current_time() + timeout
        if self.keeper is not None and not self.keeper.logged_in:
            return self._test_failed(
                "login_required", self.keeper.login_required_error().message
            )
        if self._client is None and self.state == "connecting":
            with anyio.move_on_after(min(self._config.connect_wait_s, timeout)):
                await self._settled.wait()
        if self._client is None:
            if self.state == "connecting":
                return self._test_failed("timeout", "still connecting")
            return self._test_failed(
                self.last_failure or "unreachable",
                self.last_error or f"not connected ({self.state})",
            )
        started = time.perf_counter()
        try:
            with anyio.fail_after(max(0.0, deadline - anyio.current_time())):
                tools = await self.list_tools(refresh=True)
        except TimeoutError:
            return self._test_failed("timeout", "no answer within the deadline")
        except AuthRequiredError as exc:
            kind: sdk.FailureKind = (
                "login_required"
                if exc.reason == "login_required"
                else "authorization_required"
            )
            return self._test_failed(kind, exc.message)
        except PermissionDeniedError as exc:
            return self._test_failed("refused_by_policy", exc.message)
        except DeadlineExceededError as exc:
            return self._test_failed("timeout", exc.message)
        except UnavailableError as exc:
            return self._test_failed(self.last_failure or "unreachable", exc.message)
        except RemoteError as exc:
            return self._test_failed("upstream_error", exc.message)
        except sdk.ConnectionLost as exc:
            return self._test_failed("unreachable", str(exc) or "connection lost")
        latency = round((time.perf_counter() - started) * 1000, 3)
        return m.ServersTestResult(
            name=self.name,
            outcome="ok",
            message=f"tools/list answered with {len(tools)} tools",
            tool_count=len(tools),
            latency_ms=latency,
        )

    def _test_failed(self, kind: sdk.FailureKind, message: str) -> m.ServersTestResult:
        if kind == "authorization_required" and self.keeper is not None:
            message = (
                f"{message}; the server refused the OAuth grant: log in again "
                f"(`memorizzctl mcp login {self.name}`)"
            )
        elif kind == "authorization_required":
            where = (
                'set `token` (or auth = "oauth") in its [[servers]] entry in the config file'
                if self.source == "config"
                else f"remove it and add it again with a token or OAuth (`memorizzctl mcp remove {self.name}`, then `memorizzctl mcp add {self.name} ... --token -` or `... --oauth`)"
            )
            message = f"{message}; the server asks for credentials: {where}"
        elif kind == "tls_error":
            message = f"TLS failed: {message}"
        return m.ServersTestResult(
            name=self.name,
            outcome=kind,
            message=message,
            tool_count=None,
            latency_ms=None,
        )

    async def ping(self) -> None:
        await self.request(
            sdk.probe, timeout_s=self.timeout_for(PROBE_TIMEOUT_S), safe=True
        )

    # --- views --------------------------------------------------------------

    def status(self) -> m.ServerStatus:
        latencies = list(self._latencies)
        state = self.state
        if self.keeper is not None and not self.keeper.logged_in and state != "stopped":
            state = "login_required"
        return m.ServerStatus(
            name=self.name,
            transport=self.spec.transport,
            state=state,
            since=self.since,
            last_error=self.last_error,
            pid=self._process.pid if self._process and self.state == "ready" else None,
            protocol_version=self.protocol_version,
            server_name=self.server_name,
            server_version=self.server_version,
            tool_count=self._tool_count,
            in_flight=self.in_flight,
            calls_ok=self.calls_ok,
            calls_failed=self.calls_failed,
            latency_p50_ms=round(statistics.median(latencies) * 1000, 3)
            if latencies
            else None,
            restarts=self.restarts,
            auth=self.keeper.status() if self.keeper is not None else None,
        )


async def _listed(
    client: Client, capability: str, fetch: Callable[[Client], Awaitable[list[T]]]
) -> list[T]:
    """A listing; empty, without asking, from a server that does not declare
    ``capability``, and empty from one that answers that it has no such method
    (``-32601``): nothing to list is not an error."""
    if getattr(client.server_capabilities, capability, None) is None:
        return []
    try:
        return await fetch(client)
    except MCPError as exc:
        if exc.code != METHOD_NOT_FOUND:
            raise
        return []


def _is_error_result(result: m.ToolsCallResult) -> bool:
    return result.is_error


def _describe_failure(exc: BaseException) -> str:
    """A short, secret-free description: the innermost exception's type and
    message (our own error first, where a group holds one)."""
    found = sdk.leaves(exc) or [exc]
    exc = next((e for e in found if isinstance(e, RemoteError)), found[0])
    if isinstance(exc, RemoteError):
        return exc.message
    if isinstance(exc, VaultError):
        return f"credentials: {exc}"
    if isinstance(exc, FileNotFoundError):
        return f"executable not found: {exc.filename}"
    if isinstance(exc, PermissionError):
        return f"permission denied: {exc.filename}"
    text = str(exc).strip()
    name = type(exc).__name__
    return f"{name}: {text[:200]}" if text else name
