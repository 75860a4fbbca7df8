"""The daemon's task tree: store, pool of upstreams, socket server; signals; sd_notify."""

from __future__ import annotations

import ctypes
import gc
import logging
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial

import anyio
import msgspec

from memorizz.api import methods as m
from memorizz.api.errors import RemoteError
from memorizzd import __version__, stored
from memorizzd.approvals import ApprovalBook
from memorizzd.audit import Auditor, load_key
from memorizzd.broker import Broker
from memorizzd.config import Config, check_tracing, load, open_caps
from memorizzd.execution import admit, check_config_servers
from memorizzd.execution.admission import Admission
from memorizzd.face import FaceDispatcher
from memorizzd.listeners import Listening, close_all, open_all
from memorizzd.observe import serve_metrics
from memorizzd.relay import WarmRelay
from memorizzd.reload import SIGNAL_CALLER, Reloader, Sockets
from memorizzd.rpc.answers import AnsweringDispatcher
from memorizzd.rpc.server import SocketServer
from memorizzd.sdnotify import notify, run_watchdog
from memorizzd.spool import Spool
from memorizzd.state_dir import free_bytes, no_room
from memorizzd.store import Store, StoreError
from memorizzd.subscribers import UPDATED
from memorizzd.telemetry import tracing
from memorizzd.telemetry.logs import fields_kept
from memorizzd.upstream.errors import FailureKind
from memorizzd.upstream.pool import Pool, running_pool
from memorizzd.upstream.tasks import STATUS as TASK_STATUS
from memorizzd.vault import FernetCredentialStore, KeySource, keys_for
from memorizzd.vault.server_secrets import forget_servers_gone
from memorizzd.vault.stores import CredentialStores, build_stores

log = logging.getLogger("memorizzd")


class Daemon(msgspec.Struct):
    config: Config
    pool: Pool
    server: SocketServer
    """The operator socket's."""
    servers: list[SocketServer]
    """Every socket's: the operator's first, then its MCP face's (unless
    ``mcp_face`` is off), then each agent profile's socket and face."""
    book: ApprovalBook
    reloader: Reloader
    """SIGHUP and ``daemon/reload`` (``reloader.config``: the config in force)."""

    @property
    def connections(self) -> int:
        return sum(s.connections for s in self.servers)

    @property
    def in_flight(self) -> int:
        return sum(s.in_flight for s in self.servers)


@asynccontextmanager
async def running_daemon(
    config: Config,
    keys: KeySource | None = None,
    *,
    reload_config: Callable[[], Config] | None = None,
) -> AsyncIterator[Daemon]:
    """Everything up and serving inside the block; drained and stopped after it.

    ``keys``: the vault's key source, read by ``__main__`` before the
    environment was scrubbed; by default read here (``vault.keys_for``). A key
    that does not decrypt the vault's canary raises ``VaultKeyError``.

    On exit: stop accepting, stop reading new requests, let in-flight calls finish
    (bounded by ``drain_timeout_s``), then stop every upstream (no orphans).

    ``reload_config``: how a reload reads the config (``memorizzd.reload``);
    by default the same file, with the socket and state directory in force.
    """
    # A config server whose command the execution policy refuses: ConfigError.
    config_servers = check_config_servers(config)
    check_tracing(config)  # [tracing] enabled without the otel extra: ConfigError
    # The sockets first: a second daemon must fail before it starts anything.
    # Connections queue in the kernel until the acceptors run.
    listening = await open_all(config)
    try:
        # The plugin stores' factories called before anything is written: one
        # that raises stops the start (VaultKeyError) with no vault key made.
        others = build_stores(config.credentials.stores, config=config)
        store = await anyio.to_thread.run_sync(Store, config.state_dir)
    except BaseException:
        await close_all(listening)
        raise
    try:
        if keys is None:
            keys = await anyio.to_thread.run_sync(keys_for, store, config.state_dir)
        fernet = await anyio.to_thread.run_sync(FernetCredentialStore.open, store, keys)
        vault = CredentialStores(fernet, others)
    except BaseException:
        await close_all(listening)
        await anyio.to_thread.run_sync(store.close)
        raise
    log.info("vault key from %s", keys.name)
    if no_room(config.state_dir):
        log.warning(
            "the file system of the state directory %s is full (%d bytes free):"
            " memorizzd serves, but refuses what it would write (servers/add,"
            " servers/remove, proposals and their steps: storage_full) and loses"
            " audit records until there is room",
            config.state_dir,
            free_bytes(config.state_dir),
        )
    auditor: Auditor | None = None
    try:
        async with running_pool(config, store, vault) as pool:
            for admitted in config_servers:
                await pool.start(
                    admitted.spec,
                    source="config",
                    refused=admitted.problem,
                    refused_kind=_refused_kind(admitted),
                )
            for spec in await anyio.to_thread.run_sync(stored.servers, store):
                if spec.name in pool:
                    log.warning(
                        "server %s is in both the config file and the state database;"
                        " the config file wins",
                        spec.name,
                    )
                    continue
                # Checked again: the allowlist may have changed since it was added.
                admitted = admit(spec, config)
                await pool.start(
                    admitted.spec,
                    source="api",
                    refused=admitted.problem,
                    refused_kind=_refused_kind(admitted),
                )

            auditor = Auditor(
                store,
                await anyio.to_thread.run_sync(load_key, config.state_dir),
                mirror_to_journal=fields_kept(),  # journald's or JSON lines
                spool=await anyio.to_thread.run_sync(Spool, config.state_dir),
            )
            await anyio.to_thread.run_sync(auditor.recover)
            book = ApprovalBook(store, vault, auditor, ttl_s=config.approval_ttl_s)
            face_listeners: list[FaceDispatcher] = []

            async def tools_listed(server: str, tools: list[m.Tool]) -> None:
                await book.tools_listed(server, tools)  # approvals re-check first
                for face_dispatcher in face_listeners:
                    await face_dispatcher.tools_listed(server, tools)

            pool.on_tools = tools_listed
            servers: list[SocketServer] = []
            broker = Broker(
                config,
                store,
                pool,
                connections=lambda: sum(s.connections for s in servers),
                in_flight=lambda: sum(s.in_flight for s in servers),
                agent_sockets={
                    item.name: item.path for item in listening[1:] if not item.face
                },
                auditor=auditor,
                vault=vault,
                book=book,
            )
            warm = WarmRelay(broker.tool_calls)
            dispatcher = AnsweringDispatcher(
                broker.handlers(),
                on_error=broker.on_error,
                relay=warm,
                held=broker.subscribers,
            )
            face = FaceDispatcher(broker, warm)
            face_listeners.append(face)
            tasks = broker.tool_calls.tasks

            async def notice(server: str, method: str, params: msgspec.Raw) -> None:
                if method == TASK_STATUS:  # to the task's creator only
                    await tasks.noticed(server, params)
                    return
                await face.notice(server, method, params)
                if method == UPDATED:  # and to the socket API's holders
                    await broker.subscribers.updated(server, params)

            pool.on_notice = notice

            def socket_server(item: Listening) -> SocketServer:
                return SocketServer(
                    item.path,
                    face if item.face else dispatcher,
                    max_in_flight=config.max_in_flight_per_connection,
                    rule=item.rule,
                    limits=item.limits,
                    on_refused=broker.on_refused_connection,
                    handoff=item.face,
                )

            servers += [socket_server(item) for item in listening]
            server = servers[0]
            try:
                # The metrics (and the tracer, [tracing]) outlive the drain:
                # a call that ends during it, or that it cuts off, is still
                # counted and traced; the spans are flushed once it is over.
                async with anyio.create_task_group() as observing:
                    async with anyio.create_task_group() as connections:
                        # systemd's watchdog, pinged by a task of this loop (until the
                        # drain ends): a blocked loop stops the pings.
                        await connections.start(run_watchdog)
                        async with anyio.create_task_group() as acceptor:
                            await acceptor.start(auditor.run)
                            await acceptor.start(book.run)
                            # before anyone connects: a profile the file no longer
                            # gives (edited while stopped) takes its proposals along
                            await book.profiles_in_force(
                                [p.name for p in config.profiles],
                                caps=open_caps(config),
                            )
                            # ... and so does a server gone from the file and the database
                            await book.servers_in_force([u.name for u in pool.all()])
                            # ... and its secrets (a removal killed half way)
                            try:
                                gone = await anyio.to_thread.run_sync(
                                    forget_servers_gone,
                                    vault,
                                    {u.name for u in pool.all()},
                                )
                            except StoreError as exc:  # a full disk: next start
                                gone = []
                                log.warning(
                                    "secrets of servers that are gone stay in the"
                                    " vault until the next start: %s",
                                    exc,
                                )
                            if gone:
                                log.info(
                                    "deleted %d secrets of servers that are gone",
                                    len(gone),
                                )
                            sockets = Sockets(
                                listening,
                                servers,
                                socket_server,
                                acceptor=acceptor,
                                connections=connections,
                            )
                            reloader = Reloader(
                                config,
                                load=reload_config
                                or partial(
                                    load,
                                    config.config_path,
                                    socket=config.socket,
                                    state_dir=config.state_dir,
                                ),
                                admitted=config_servers,
                                pool=pool,
                                broker=broker,
                                book=book,
                                auditor=auditor,
                                sockets=sockets,
                                api_servers=partial(stored.servers, store),
                                admit=admit,
                                background=connections,
                            )
                            broker.reload = reloader.reload
                            for item, each in zip(listening, servers, strict=True):
                                await sockets.serve(item, each)
                            await observing.start(
                                serve_metrics,
                                config,
                                pool,
                                broker.tool_calls,
                                servers,
                                store,
                            )
                            # Everything imported and built so far lives as long as the
                            # daemon: keep it out of the cyclic GC's collections, and
                            # collect the young generation less often (every call
                            # allocates hundreds of short-lived objects; the default
                            # threshold of 700 runs a collection every few calls).
                            gc.freeze()
                            gc.set_threshold(20_000, 20, 20)
                            _trim_heap()
                            try:
                                yield Daemon(
                                    config, pool, server, servers, book, reloader
                                )
                            finally:
                                acceptor.cancel_scope.cancel()
                        with anyio.CancelScope(shield=True):
                            drain_s = reloader.config.drain_timeout_s
                            with anyio.move_on_after(drain_s) as drain:
                                async with anyio.create_task_group() as draining:
                                    for each in servers:
                                        draining.start_soon(each.drain)
                            if drain.cancelled_caught:
                                log.warning(
                                    "drain timed out with %d calls in flight; cancelling them",
                                    sum(s.in_flight for s in servers),
                                )
                        connections.cancel_scope.cancel()
                    # The last call has ended: its spans exported (bounded, in
                    # a worker thread), then tracing off with the metrics.
                    if tracing.enabled:
                        with anyio.CancelScope(shield=True):
                            await anyio.to_thread.run_sync(tracing.flush)
                    observing.cancel_scope.cancel()
            finally:
                await close_all(listening)
    finally:
        await close_all(listening)  # idempotent; serve() closes them on the normal path
        if auditor is not None:
            # the records of calls answered during the drain, which ended
            # after the auditor's own task: the database is whole at a stop
            auditor.flush()
        await anyio.to_thread.run_sync(store.close)


async def run(
    config: Config,
    keys: KeySource | None = None,
    reload_config: Callable[[], Config] | None = None,
) -> None:
    """Serve until SIGTERM or SIGINT, reload on SIGHUP; tell systemd what happens."""
    with anyio.open_signal_receiver(
        signal.SIGTERM, signal.SIGINT, signal.SIGHUP
    ) as signals:
        async with running_daemon(config, keys, reload_config=reload_config) as daemon:
            log.info(
                "memorizzd %s listening on %s and %d agent sockets (state in %s, %d servers)",
                __version__,
                config.socket,
                len(config.profiles),
                config.state_dir,
                len(daemon.pool.all()),
            )
            notify("READY=1")
            async with anyio.create_task_group() as tg:
                tg.start_soon(_report_status, daemon)
                async for signum in signals:
                    if signum == signal.SIGHUP:
                        log.info("SIGHUP: reloading %s", config.config_path)
                        tg.start_soon(_reload_on_signal, daemon.reloader)
                        continue
                    log.info("%s: draining and stopping", signal.Signals(signum).name)
                    notify("STOPPING=1")
                    tg.cancel_scope.cancel()
                    break
    log.info("stopped")


async def _reload_on_signal(reloader: Reloader) -> None:
    try:
        await reloader.reload(SIGNAL_CALLER, trigger="signal")
    except RemoteError:
        pass  # logged, audited and kept for daemon/status by the reloader
    except Exception:
        log.exception("SIGHUP: the reload failed")


async def _report_status(daemon: Daemon) -> None:
    last = ""
    while True:
        upstreams = daemon.pool.all()
        ready = sum(u.state == "ready" for u in upstreams)
        status = (
            f"STATUS={ready}/{len(upstreams)} servers ready, "
            f"{daemon.connections} connections, {daemon.in_flight} in flight"
        )
        if status != last:
            notify(status)
            last = status
        await anyio.sleep(5)


def _trim_heap() -> None:
    """Hand the heap pages freed during start-up (import garbage) back to the OS."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def _refused_kind(admitted: Admission) -> FailureKind:
    """A forbidden command is the policy's refusal; a missing one, unreachable."""
    return "refused_by_policy" if admitted.forbidden else "unreachable"
