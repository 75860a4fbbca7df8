"""Supervision: one task keeps one server's MCP session warm.

``Supervisor.run`` enters and exits the SDK client (cancel scopes must exit in
the task that entered them) and keeps it warm; caller tasks send requests over
the shared session concurrently (``actor.Upstream``). When the session dies
(process exit, broken pipe, transport fault, failed health probe) ``run``
reconnects with jittered exponential backoff while callers get
``server_unavailable`` at once.

This is the circuit breaker (SECURITY.md §6.2 #11), per server, with no
separate failure counter: a request that times out has the session probed at
once (``_suspect``), and a lost connection or a probe that gets no answer
within ``health_timeout_s`` drops the session (open); while it is open,
calls fail at once with ``server_unavailable`` and ``retry_after_s``; after
the jittered backoff, doubling up to ``backoff_max_s`` with every failed
connect in a row (state ``backoff``, then ``failed`` after ``FAILED_AFTER``),
one connect is tried (half-open: ``connecting``, bounded by ``timeout_s``; a
stdio server's start and handshake by at least ``STDIO_HANDSHAKE_MIN_S``,
doubled after each start in a row that ran out of it), and
a ready session closes it. A session that still answers its probe
stays, even if one tool hangs: the failure is that tool's, and each call's
deadline bounds what it costs.
"""

from __future__ import annotations

import collections
import errno
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from functools import partial
from typing import TYPE_CHECKING, Final

import anyio
import anyio.abc
import msgspec

from memorizz.api import methods as m
from memorizz.api.errors import RemoteError
from memorizzd.config import Config
from memorizzd.loop import Clock, now
from memorizzd.redact import changed, hold, ordered, scrub
from memorizzd.store import Negotiated, Store, StoreError
from memorizzd.stored import fingerprint
from memorizzd.upstream import errors
from memorizzd.upstream.connection import Connection
from memorizzd.upstream.jsonrpc import MODERN, Launch, open_session
from memorizzd.upstream.logs import LogSink, tell
from memorizzd.upstream.replicas import Care, ReplicaSet, open_replicas
from memorizzd.upstream.stdio import (
    STDIO_HANDSHAKE_MIN_S,
    InterpreterNotFoundError,
    StdioProcess,
    WorkingDirectoryError,
    child_environment,
    no_handshake,
    stdio_handshake_budget,
)
from memorizzd.upstream.subscriptions import Subscriptions
from memorizzd.upstream.tools import ToolCache, ToolsListener
from memorizzd.vault import CredentialStore, VaultError, resolve_secrets
from memorizzd.vault.server_secrets import ServerSecrets

if TYPE_CHECKING:
    from memorizzd.oauth.keeper import TokenKeeper

log = logging.getLogger("memorizzd.upstream")

NOTICES: Final = frozenset(
    {
        "notifications/resources/list_changed",
        "notifications/prompts/list_changed",
        "notifications/message",
        "notifications/resources/updated",
        "notifications/tasks/status",
    }
)
"""What a server says that its callers may hear (``on_notice``)."""
NOTICES_MAX: Final = 256
LISTEN_AGAIN_S: Final = 1.0
LISTEN_AGAIN_MAX_S: Final = 60.0
"""A list-change stream that ended is opened again after LISTEN_AGAIN_S,
doubling up to this while they keep failing at once."""
"""Notices waiting to be passed on; past it the oldest are dropped."""
NoticeListener = Callable[[str, str, msgspec.Raw], Awaitable[None]]
"""Told (server name, notification method, its raw params)."""

OUTPUT_EXIT_GRACE_S: Final = 0.5
"""How long a closed stdout waits for the process's exit before it ends the session."""
RELIST_EVERY_S: Final = 1.0
"""A server that says its tools changed is listed again at most this often."""
FAILED_AFTER: Final = 5
"""Consecutive failed connects after which the state reads ``failed`` (it still retries)."""
LEAVE_GRACE_S: Final = 2.0
"""How long a stop lets a served session end in order (an HTTP session's
``DELETE``, a stdio server's stdin closed first) before it is cancelled."""


class Supervisor:
    """One server's session and its life: connect, stay warm, probe, replace
    (``actor.Upstream`` adds the requests)."""

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
        self.spec = spec
        self._vault = vault
        self.name = spec.name
        self.source = source
        self._config = config
        self._store = store
        self.state: m.ServerState = "connecting"
        self._announced = False
        """Whether a state was logged yet (the first is, though it is no change)."""
        self.since = time.time()
        self.last_error: str | None = None
        self.last_failure: errors.FailureKind | None = None
        """Why the last connect failed, machine-readable (None once ready)."""
        self.restarts = 0
        self.protocol_version: str | None = None
        self.server_name: str | None = None
        self.server_instructions: str | None = None
        """The server's own ``instructions``, from its handshake (``told``)."""
        self.server_version: str | None = None
        self._client: Connection | None = None
        self._ready = anyio.Event()
        self._settled = anyio.Event()
        """Set while the state is anything but ``connecting``."""
        self._dead = anyio.Event()
        self._process: StdioProcess | None = None
        """A stdio server's process (the first, with replicas)."""
        self._processes: list[StdioProcess] = []
        self._tools = ToolCache(spec, config=config, on_tools=on_tools)
        """The warm tools cache: the listing as policy shows it, verdicts precomputed."""
        self._next_attempt = 0.0
        self._last_ok = 0.0
        self._now: Callable[[], float] = now
        """The loop's clock (``run`` keeps the loop: no lookup on each call)."""
        self._scope: anyio.CancelScope | None = None
        self._stopped = anyio.Event()
        self._serving = False
        """Set while a ready session is served (``_open_and_serve``)."""
        self._stopping = False
        self._was_ready = False
        self._check = anyio.Event()
        """Set: the health loop probes the session now (a request timed out)."""
        self._relist = anyio.Event()
        """Set: the server said its tools changed; list them again."""
        self.on_notice: NoticeListener | None = None
        """Told what the server says that callers may hear: its resources or
        prompts list changes and its log messages (the MCP face passes them on)."""
        self._notices: collections.deque[tuple[str, msgspec.Raw]] = collections.deque(
            maxlen=NOTICES_MAX
        )
        self._noticed = anyio.Event()
        self.subscriptions = Subscriptions()
        """The resource URIs callers hold, subscribed upstream once each."""
        self.log_sinks: set[LogSink] = set()
        """Socket calls in flight whose clients hear the server's log messages."""
        self._checking: anyio.Event | None = None
        """While such a probe runs: set when it has its answer."""
        self._handshake_next = False
        self._slow_starts = 0
        """Consecutive stdio starts that ran out of their handshake budget."""
        """The next auto-mode connect uses the handshake era (the probe timed out)."""
        self._hidden: tuple[str, ...] = ()
        """The secret values sent at the last connect (``ServerSecrets.hidden``):
        cut out of what the server says back (``redact.py``); the log's
        filter asks ``hidden`` of every supervisor alive."""
        hold(self)
        self.keeper: TokenKeeper | None = None
        """OAuth servers: the grant and its refresher."""
        if spec.auth == "oauth" and spec.transport != "stdio":
            # Imported here: a host without OAuth servers never loads the
            # SDK's OAuth client modules (about a megabyte of the daemon).
            from memorizzd.oauth.keeper import TokenKeeper, http_client_for

            machine = None
            if spec.oauth_grant == "client_credentials":
                from memorizzd.oauth.machine import ClientCredentials

                machine = ClientCredentials(spec, vault)
            elif spec.oauth_grant == "jwt_bearer":
                from memorizzd.oauth.machine import JwtBearer

                machine = JwtBearer(spec, vault)
            elif spec.oauth_grant == "token_exchange":
                from memorizzd.oauth.machine import TokenExchange

                machine = TokenExchange(spec, vault)
            self.keeper = TokenKeeper(
                spec.name,
                vault=vault,
                # the allowlist in force at each use: a reload narrows it
                http=lambda: http_client_for(self.spec, self._config.host_allowlist),
                machine=machine,
            )

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Connect, stay warm, reconnect; until ``stop()``. Started = first attempt begun."""
        self._now = Clock().now
        try:
            with anyio.CancelScope() as self._scope:
                if self.keeper is None:
                    task_status.started()
                    await self._supervise()
                else:
                    async with anyio.create_task_group() as tg:
                        await tg.start(self.keeper.run)
                        task_status.started()
                        await self._supervise()  # returns only when stopping
                        tg.cancel_scope.cancel()  # the keeper's refreshes too
        finally:
            self._publish(None)
            self._set_state("stopped")
            self._stopped.set()
            # No session comes any more: a call waiting for one (made while it
            # connected, then the server was removed) is answered now, not
            # when connect_wait_s has passed.
            self._ready.set()

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
                if self._stopping:
                    log.debug("%s: the session ended with an error: %s", self.name, exc)
                    return
                if not self._dead.is_set():  # else _mark_dead said why
                    self.last_error = scrub(_describe_failure(exc), self.hidden)
                    self.last_failure = self._failure_kind(exc)
                log.warning(
                    "%s: connection failed: %s",
                    self.name,
                    self.last_error,
                    extra={"MEMORIZZ_SERVER": self.name},
                )
            finally:
                self._publish(None)
            if self._stopping:
                return
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

    @property
    def hidden(self) -> tuple[str, ...]:
        """What must never be shown of what the server says back: the secrets
        sent at the last connect and, for OAuth, the grant's tokens."""
        keeper = self.keeper
        if keeper is None:
            return self._hidden
        grant = keeper.grant
        tokens = (
            ()
            if grant is None
            else (
                grant.access_token,
                grant.refresh_token or "",
                grant.client_secret or "",
            )
        )
        return ordered((*self._hidden, *tokens, *keeper.retired))

    def _failure_kind(self, exc: BaseException) -> errors.FailureKind:
        if self.spec.transport in ("stdio", "builtin"):
            return errors.failure_kind(exc)
        from memorizzd.upstream.session import failure_kind  # the SDK: loaded already

        return failure_kind(exc)

    def refuse(
        self, reason: str, *, kind: errors.FailureKind = "refused_by_policy"
    ) -> None:
        """Never run (instead of ``run``): ``failed`` with ``reason`` as last_error."""
        self._set_state("failed")
        self.last_error = reason
        self.last_failure = kind
        self._stopped.set()

    def reconfigure(self, config: Config, spec: m.ServerSpec | None = None) -> bool:
        """A reload, in one synchronous step: the new config (and a spec that
        differs only in its tool policy), the tool verdicts decided again from
        the cached listing. True: what callers see changed (``announce_tools``)."""
        self._config = config
        if spec is not None:
            self.spec = spec
        return self._tools.reconfigure(config, self.spec)

    async def announce_tools(self) -> None:
        """Tell the tools listener (approvals, the MCP face) the current listing."""
        await self._tools.announce()

    async def stop(self) -> None:
        """Stop for good. A session being served is left the way its transport
        says, within ``LEAVE_GRACE_S`` (a Streamable HTTP session is
        ``DELETE``d: the SDK sends it only when its client is left, never when
        cancelled); anything else (a connect, a backoff) is cancelled."""
        self._stopping = True
        if self._serving:
            self._dead.set()
            with anyio.move_on_after(LEAVE_GRACE_S) as waited:
                await self._stopped.wait()
            if waited.cancelled_caught:  # a stdio server's own stop goes on, shielded
                log.info(
                    "%s: the session did not end in order within %g s; cancelled",
                    self.name,
                    LEAVE_GRACE_S,
                    extra={"MEMORIZZ_SERVER": self.name},
                )
        if self._scope is not None:
            self._scope.cancel()
        await self._stopped.wait()

    def _backoff(self, failures: int) -> float:
        base = self._config.backoff_initial_s * float(2 ** min(failures - 1, 30))
        jitter: float = random.uniform(0.5, 1.0)  # noqa: S311 - not cryptographic
        return min(self._config.backoff_max_s, base) * jitter

    async def _connect_and_serve(self) -> None:
        self._processes = (
            [StdioProcess(self.name) for _ in range(self.spec.replicas)]
            if self.spec.transport == "stdio"
            else []
        )
        self._process = self._processes[0] if self._processes else None
        self._dead = anyio.Event()
        known = await anyio.to_thread.run_sync(self._store.negotiated, self.name)
        if known is not None and known.fingerprint != fingerprint(self.spec):
            known = None  # reached differently now: negotiate afresh
        mode = self.spec.protocol
        if mode == "auto" and known is not None:
            # Never pay the slow probe twice: a known-legacy server gets the handshake.
            mode = "legacy" if known.protocol_version != MODERN else "auto"
        elif mode == "auto" and self._handshake_next:
            mode = "legacy"  # the probe found no answer last time
        # The connect and the handshake are answers like any other, bounded
        # by timeout_s (over HTTP not by the SDK's 30 s connect timeout and
        # 10 s server/discover probe; a legacy SSE stream first has timeout_s
        # to open, sse.py). A stdio server's start-up counts against its
        # handshake: it has at least STDIO_HANDSHAKE_MIN_S, so that a short
        # timeout_s does not fail a process that is still starting; one that
        # never answers is stopped and started again, not waited for forever.
        budget = self.spec.timeout_s * (2 if self.spec.transport == "sse" else 1)
        if self.spec.transport == "stdio":
            budget = stdio_handshake_budget(budget, self._slow_starts)
        handshake = anyio.CancelScope(deadline=anyio.current_time() + budget)
        with handshake:
            await self._open_and_serve(mode, known, handshake)
        if handshake.cancelled_caught:
            self._slow_starts += 1
            # An auto-mode server that left the probe unanswered is tried next
            # in the handshake era (it may ignore methods it does not know),
            # then in auto mode again, and so on.
            self._handshake_next = mode == "auto"
            later = (
                stdio_handshake_budget(self.spec.timeout_s, self._slow_starts)
                if self.spec.transport == "stdio"
                else None
            )
            raise no_handshake(budget, later)

    async def _open_and_serve(
        self,
        mode: str,
        known: Negotiated | None,
        handshake: anyio.CancelScope,
    ) -> None:
        # The secrets, from the vault right before connecting (never kept longer
        # than the connect, but by a replica set: its launch, env included, starts
        # a lost replica again; a missing one fails the attempt, naming its ref).
        secrets = await anyio.to_thread.run_sync(
            resolve_secrets, self.spec, self._vault
        )
        self._hidden = secrets.hidden()
        changed()
        async with self._open(mode, secrets) as client:
            handshake.deadline = math.inf
            self._handshake_next = False
            self._slow_starts = 0
            del secrets
            version = client.protocol_version
            self.server_name, self.server_version = (
                client.server_name,
                client.server_version,
            )
            self.server_instructions = client.instructions
            self.protocol_version = version
            if version and (known is None or known.protocol_version != version):
                negotiated = Negotiated(version, fingerprint(self.spec))
                try:
                    await anyio.to_thread.run_sync(
                        self._store.set_negotiated, self.name, negotiated
                    )
                except StoreError as exc:  # a full disk: a hint kept for next time
                    log.warning(
                        "%s: the negotiated protocol version is not remembered"
                        " (it is negotiated again next time): %s",
                        self.name,
                        exc,
                        extra={"MEMORIZZ_SERVER": self.name},
                    )
            try:
                await self._tools.refresh(client, server_name=self.server_name)
            except RemoteError as exc:
                log.info("%s: no tool listing at connect: %s", self.name, exc.message)
            except TimeoutError:
                log.info("%s: no tool listing at connect: it timed out", self.name)
            self.last_error = None
            self.last_failure = None
            self._last_ok = anyio.current_time()
            self._publish(client)
            self._was_ready = True
            self._set_state(
                "ready",
                f" ({self.server_name or 'unnamed server'}, protocol {version})",
            )
            self._serving = True
            try:
                async with anyio.create_task_group() as tg:
                    if not isinstance(client, ReplicaSet):  # a set watches its own
                        for process in self._processes:
                            tg.start_soon(self._watch_process, process)
                            tg.start_soon(self._watch_output, process)
                    tg.start_soon(self._health_loop, client)
                    tg.start_soon(self._watch_tool_changes, client)
                    tg.start_soon(self._relist_on_change, client)
                    tg.start_soon(self._forward_notices)
                    if client.can_subscribe():
                        tg.start_soon(self._keep_subscriptions, client)
                    await self._dead.wait()  # or stop() asks to leave
                    tg.cancel_scope.cancel()
            finally:
                self._serving = False
            self._publish(None)

    def _open(
        self, mode: str, secrets: ServerSecrets
    ) -> AbstractAsyncContextManager[Connection]:
        """A session to the server: our own JSON-RPC client for a stdio server,
        the SDK's for HTTP (imported here: a host with only stdio servers
        never loads it)."""
        spec = self.spec
        if spec.transport == "stdio":
            if spec.command is None or self._process is None:
                raise ValueError("a stdio server needs a command")
            launch = Launch(
                argv=[spec.command, *spec.args],
                server=self.name,
                env=child_environment(spec.env, secrets.env),
                cwd=spec.cwd,
                max_result_bytes=spec.max_result_bytes,
                mode=mode,
                on_notification=self._on_notification,
                roots=tuple(spec.roots),
            )
            if len(self._processes) > 1:
                return open_replicas(launch, self._processes, self._care())
            return open_session(launch, self._process)
        if spec.transport == "builtin":  # the daemon's own bridge (no SDK)
            from memorizzd.upstream.cognee import open_cognee

            return open_cognee(
                spec, secrets=secrets, host_allowlist=self._config.host_allowlist
            )
        from memorizzd.upstream.session import open_connection

        return open_connection(
            spec,
            mode=mode,
            on_notification=self._on_notification,
            host_allowlist=self._config.host_allowlist,
            secrets=secrets,
            bearer=self.keeper,
        )

    def _care(self) -> Care:
        """What a replica set is lent to keep its replicas (``replicas.py``)."""
        return Care(
            budget_s=max(self.spec.timeout_s, STDIO_HANDSHAKE_MIN_S),
            backoff=self._backoff,
            lost=self._replica_lost,
            set_lost=self._mark_dead,
            relist=self._tools_changed,
            listen=self._watch_tool_changes,
            describe=lambda exc: scrub(_describe_failure(exc), self.hidden),
            back=self._replica_back,
        )

    def _replica_back(self, which: str) -> None:
        """A replica started again serves: its loss is no longer the server's
        last error."""
        self.last_error = None
        log.info("%s: %s serves again", self.name, which)

    def _replica_lost(self, reason: str) -> None:
        """A replica was lost and starts again alone; the others serve on
        (the state stays ``ready``)."""
        self.restarts += 1
        self.last_error = reason
        log.warning("%s: %s", self.name, reason, extra={"MEMORIZZ_SERVER": self.name})

    async def _watch_process(self, process: StdioProcess) -> None:
        await process.exited.wait()
        self._mark_dead(f"process exited with code {process.returncode}")

    async def _watch_output(self, process: StdioProcess) -> None:
        """A server that closed its stdout and goes on running answers
        nothing more: its session ends now, not at the next request or probe
        (an exit that comes with it says more: its code, ``_watch_process``)."""
        await process.stdout_closed.wait()
        with anyio.move_on_after(OUTPUT_EXIT_GRACE_S):
            await process.exited.wait()
        if not process.exited.is_set():
            self._mark_dead("the server closed its stdout (its process goes on)")

    async def _health_loop(self, client: Connection) -> None:
        """Probe an idle session every ``health_interval_s``, and at once after
        a request timed out (``_suspect``): a session that cannot answer a
        ping (a reply dripping slowly ahead of every other on one stdio pipe
        or SSE stream, a frozen process) is replaced. Requests wait for the
        verdict of such a check instead of queueing behind the stuck reply."""
        interval = self._config.health_interval_s
        self._check = anyio.Event()
        # A set's replicas are probed each on its own: one answering does not
        # vouch for another (a frozen one), and one that fails is lost alone.
        replicas = client if isinstance(client, ReplicaSet) else None
        while True:
            with anyio.move_on_after(interval):
                await self._check.wait()
            suspect = self._check.is_set()
            if not suspect and (
                anyio.current_time() - self._last_ok < interval
                if replicas is None
                else replicas.answered_within(interval)
            ):
                continue
            try:
                if suspect:
                    self._check, self._checking = anyio.Event(), anyio.Event()
                if replicas is not None:
                    # the requests held for the verdict go as soon as one
                    # replica answers: to it, not to one still being probed
                    checking = self._checking
                    await replicas.check(
                        self._config.health_timeout_s,
                        quiet_s=None if suspect else interval,
                        vouched=None if checking is None else checking.set,
                    )
                else:
                    with anyio.fail_after(self._config.health_timeout_s):
                        await client.probe()
            except (RemoteError, errors.ConnectionLost, TimeoutError) as exc:
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

    def _on_notification(self, method: str, params: msgspec.Raw) -> None:
        if method == "notifications/tools/list_changed":
            self._tools_changed()
        elif method in NOTICES:
            if method == "notifications/message" and self.log_sinks:
                tell(self.log_sinks, self.name, params)  # in order, before the result
            self._notices.append((method, params))  # the oldest go past NOTICES_MAX
            self._noticed.set()

    async def _forward_notices(self) -> None:
        """Pass the server's notices on (``on_notice``), in order, in this task:
        the reader that received them never waits for a listener."""
        while True:
            await self._noticed.wait()
            self._noticed = anyio.Event()
            while self._notices:
                method, params = self._notices.popleft()
                if self.on_notice is None:
                    continue
                try:
                    await self.on_notice(self.name, method, params)
                except Exception:  # the session goes on; a listener's fault is logged
                    log.exception("%s: a notice listener failed", self.name)

    async def _keep_subscriptions(self, client: Connection) -> None:
        """A new session is subscribed to every URI still held; then the URIs
        whose last holder went away are unsubscribed (``Subscriptions``)."""

        async def send(uri: str, subscribe: bool) -> None:
            verb = "subscribe" if subscribe else "unsubscribe"
            try:
                with anyio.fail_after(self.spec.timeout_s):
                    if subscribe:
                        await client.subscribe_resource(uri)
                    else:
                        await client.unsubscribe_resource(uri)
            except (RemoteError, errors.ConnectionLost, TimeoutError) as exc:
                log.info("%s: resources/%s failed: %s", self.name, verb, exc)

        for uri in self.subscriptions.renewed():
            await send(uri, True)
        while True:
            await self.subscriptions.flush(partial(send, subscribe=False))

    def _tools_changed(self) -> None:
        self._tools.invalidate()  # a tools/list until the relist is in fetches afresh
        self._relist.set()

    async def _relist_on_change(self, client: Connection) -> None:
        """Fetch the listing again as soon as the server says it changed, so
        that its listeners (approvals re-check, the MCP face tells its
        sessions) hear of the change without waiting for a caller to list;
        at most once every ``RELIST_EVERY_S``: the changes said meanwhile
        are one listing (a server that says its tools changed whenever it is
        listed would otherwise be listed in a loop as fast as it answers)."""
        while True:
            await self._relist.wait()
            self._relist = anyio.Event()
            log.info("%s: tools/list_changed; listing again", self.name)
            try:
                with anyio.fail_after(self.spec.timeout_s):
                    await self._tools.refresh(client, server_name=self.server_name)
            except (RemoteError, errors.ConnectionLost, TimeoutError) as exc:
                log.info("%s: no listing after a change: %s", self.name, exc)
            await anyio.sleep(RELIST_EVERY_S)

    async def _watch_tool_changes(
        self, client: Connection, replica: int | None = None
    ) -> None:
        """Hold the server's list-change stream (2026-07-28) while the session
        lives. One that ends (the server closed it) or fails is opened again
        after a pause (1 s, doubling to a minute while they keep failing at
        once), and the tools are listed again: a stream has no replay, so a
        change in the gap would be missed. With replicas, each replica has its
        own (``replica``, its index: ``replicas.py``)."""
        pause = LISTEN_AGAIN_S
        which = "" if replica is None else f" (replica {replica})"
        while True:
            began = anyio.current_time()
            try:
                if not await client.watch_tool_changes(self._tools_changed):
                    return  # the handshake era: notifications say it
                log.info(
                    "%s: the server ended its list-change stream%s", self.name, which
                )
            except Exception as exc:  # noqa: BLE001 - best effort; refresh=true still works
                log.info(
                    "%s: no tools/list_changed subscription%s: %s",
                    self.name,
                    which,
                    exc,
                )
            if anyio.current_time() - began > LISTEN_AGAIN_MAX_S:
                pause = LISTEN_AGAIN_S  # it lived: not failing at once
            await anyio.sleep(pause)
            pause = min(pause * 2, LISTEN_AGAIN_MAX_S)
            self._tools_changed()

    def _mark_dead(self, reason: str) -> None:
        if not self._dead.is_set():
            reason = scrub(reason, self.hidden)
            self.last_error = reason
            self.last_failure = "unreachable"
            log.warning(
                "%s: session lost: %s",
                self.name,
                reason,
                extra={"MEMORIZZ_SERVER": self.name},
            )
            self._publish(None)
            self._dead.set()

    async def wait_ready(self) -> None:
        """Return once the session is ready (the caller bounds the wait)."""
        while self._current() is None and not self._stopped.is_set():
            await self._ready.wait()

    def _current(self) -> Connection | None:
        return self._client

    @property
    def connected(self) -> bool:
        """Whether there is a session now."""
        return self._client is not None

    async def wait_settled(self) -> None:
        """Wait until a connect under way has ended, at most ``connect_wait_s``."""
        with anyio.move_on_after(self._config.connect_wait_s):
            await self._settled.wait()

    def _publish(self, client: Connection | None) -> None:
        self._client = client
        if client is not None:
            self._ready.set()
        elif self._ready.is_set():
            self._ready = anyio.Event()

    def _set_state(self, state: m.ServerState, detail: str = "") -> None:
        if state != self.state or not self._announced:
            self._announced = True  # the first state is logged too (connecting)
            self.state = state
            self.since = time.time()
            log.info(
                "%s: %s%s",
                self.name,
                state,
                detail,
                extra={"MEMORIZZ_SERVER": self.name, "MEMORIZZ_STATE": state},
            )
        if state == "connecting":
            if self._settled.is_set():
                self._settled = anyio.Event()
        else:
            self._settled.set()


_CWD_PROBLEMS: Final = {
    errno.ENOENT: "not found",
    errno.ENOTDIR: "is not a directory",
    errno.EACCES: "not accessible (permission denied)",
}
"""How ``_describe_failure`` says why a server's ``cwd`` could not be entered."""


def _describe_failure(exc: BaseException) -> str:
    """A short, secret-free description: the innermost exception's type and
    message (our own error first, where a group holds one)."""
    found = errors.leaves(exc) or [exc]
    exc = next((e for e in found if isinstance(e, RemoteError)), found[0])
    if isinstance(exc, RemoteError):
        return exc.message
    if isinstance(exc, VaultError):
        return f"credentials: {exc}"
    if isinstance(exc, WorkingDirectoryError):
        problem = _CWD_PROBLEMS.get(exc.errno or 0) or f"unusable ({exc.strerror})"
        return f"working directory (cwd) {problem}: {exc.filename}"
    if isinstance(exc, InterpreterNotFoundError):
        return f"interpreter not found: {exc.filename} (the #! line of {exc.script})"
    if isinstance(exc, FileNotFoundError):
        return f"executable not found: {exc.filename}"
    if isinstance(exc, PermissionError):
        return f"permission denied: {exc.filename}"
    if isinstance(exc, errors.ConnectionLost):  # not its class's name
        return f"connection lost: {str(exc).strip()[:200] or 'connection closed'}"
    text = str(exc).strip()
    name = type(exc).__name__
    return f"{name}: {text[:200]}" if text else name
