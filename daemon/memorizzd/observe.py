"""The daemon's metrics endpoint: ``metrics.sock`` and, if asked, loopback
TCP; and the tracer's life (``[tracing]``), for as long as it serves.

``serve_metrics`` serves the daemon's metrics (``telemetry.metrics``) over
what it is now (the pool's upstreams, the calls in flight, the sockets'
connections, the pending proposals) and serves it (``telemetry.http``):

* on ``[metrics] socket``, by default ``metrics.sock`` beside the operator
  socket, with that socket's mode and group (a directory made for it is
  0755 when that group, or root, must reach it, else 0700), and only to
  callers the operator socket's rule admits (the same peer-credential check);
* on ``[metrics] listen`` (``127.0.0.1:9464``), when set: loopback only
  unless ``allow_remote`` (``config.py`` refuses anything else).
"""

from __future__ import annotations

import os
import socket
import time
import typing
from collections.abc import Sequence
from contextlib import suppress

import anyio
import anyio.abc

from memorizz.api import methods as m
from memorizzd import __version__
from memorizzd.calls import Calls
from memorizzd.config import Config, ConfigError, gid_of, metrics_address
from memorizzd.rpc.authority import SocketRule, operator_rule
from memorizzd.rpc.peer import peer_of
from memorizzd.rpc.server import ListenError, SocketServer, prepare_socket_path
from memorizzd.store import Store
from memorizzd.telemetry import tracing
from memorizzd.telemetry.http import MetricsServer
from memorizzd.telemetry.metrics import Snapshot, UpstreamState
from memorizzd.upstream.pool import Pool

METRICS_SOCKET = "metrics.sock"
_STATES = typing.get_args(m.ServerState)


def metrics_socket_path(config: Config) -> str:
    """``[metrics] socket``, else ``metrics.sock`` beside the operator socket."""
    return config.metrics.socket or os.path.join(
        os.path.dirname(config.socket) or ".", METRICS_SOCKET
    )


class _Watched:
    """What a scrape reads of the daemon."""

    def __init__(
        self, pool: Pool, calls: Calls, servers: Sequence[SocketServer], store: Store
    ) -> None:
        self._pool = pool
        self._calls = calls
        self._servers = servers
        self._store = store
        self._pending = 0

    async def refresh(self) -> None:
        """The pending proposals' count, from the store (in a worker thread)."""
        rows = await anyio.to_thread.run_sync(
            lambda: self._store.proposals(
                now=time.time(), status="pending", limit=1_000_000
            )
        )
        self._pending = len(rows)

    def snapshot(self) -> Snapshot:
        now = time.time()
        upstreams = []
        for upstream in self._pool.all():
            grant = upstream.keeper.grant if upstream.keeper is not None else None
            upstreams.append(
                UpstreamState(
                    upstream.name,
                    upstream.state,
                    upstream.restarts,
                    None if grant is None else grant.expires_at,
                )
            )
        connections: dict[tuple[str, str], int] = {}
        for server in self._servers:
            kind = "mcp" if os.path.basename(server.path) == "mcp.sock" else "api"
            key = (server.rule.profile or "operator", kind)
            connections[key] = connections.get(key, 0) + server.connections
        return Snapshot(
            upstreams=upstreams,
            states=_STATES,
            calls_in_flight=self._calls.in_flight,
            connections=connections,
            approvals_pending=self._pending,
            now=now,
        )


async def serve_metrics(
    config: Config,
    pool: Pool,
    calls: Calls,
    servers: Sequence[SocketServer],
    store: Store,
    *,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the metrics until cancelled (returns at once when disabled);
    with ``[tracing] enabled``, trace calls meanwhile."""
    if config.tracing.enabled:
        try:
            tracing.setup(
                endpoint=config.tracing.endpoint,
                service_name=config.tracing.service_name,
            )
        except tracing.TracingUnavailableError as exc:
            raise ConfigError(str(exc)) from None
    try:
        await _serve_metrics(config, pool, calls, servers, store, task_status)
    finally:
        if config.tracing.enabled:
            tracing.shutdown()


async def _serve_metrics(
    config: Config,
    pool: Pool,
    calls: Calls,
    servers: Sequence[SocketServer],
    store: Store,
    task_status: anyio.abc.TaskStatus[None],
) -> None:
    if not config.metrics.enabled:
        task_status.started()
        return
    watched = _Watched(pool, calls, servers, store)
    server = MetricsServer(watched.snapshot, __version__, refresh=watched.refresh)
    path = metrics_socket_path(config)
    started_with = operator_rule(config.operators)

    def operators() -> SocketRule:
        """The operator socket's rule as the last reload left it (``servers``
        is the daemon's own list, which a reload reconfigures)."""
        for each in servers:
            if each.rule.profile is None:
                return each.rule
        return started_with

    def admits(stream: anyio.abc.SocketStream) -> bool:
        raw: socket.socket = stream.extra(anyio.abc.SocketAttribute.raw_socket)
        return operators().admits(peer_of(raw, path, profile=None, role="operator"))

    unix = await _bind_unix(config, path)
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(server.serve, unix, admits)
            if config.metrics.listen:
                host, port = metrics_address(config.metrics.listen)
                family = socket.AF_INET6 if ":" in host else socket.AF_INET
                try:
                    raw = socket.create_server((host, port), family=family)
                except OSError as exc:
                    raise ListenError(
                        f"[metrics] listen = {config.metrics.listen!r}: cannot"
                        f" listen there: {os.strerror(exc.errno) if exc.errno else exc}"
                    ) from None
                raw.setblocking(False)
                tcp = await anyio.abc.SocketListener.from_socket(raw)
                await tg.start(server.serve, tcp)
            task_status.started()
    finally:
        with suppress(FileNotFoundError):
            os.unlink(path)


async def _bind_unix(config: Config, path: str) -> anyio.abc.SocketListener:
    """``path`` bound like the operator socket: 0660 with its group (or as
    root), else 0600; a directory made for it 0755 then (the group must
    traverse it to reach the socket), else 0700."""
    shared = os.geteuid() == 0 or config.operators.socket_group is not None
    _make_directory(os.path.dirname(path) or ".", 0o755 if shared else 0o700)
    prepare_socket_path(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        old_umask = os.umask(0o177)
        try:
            sock.bind(path)
        finally:
            os.umask(old_umask)
        if config.operators.socket_group is not None:
            os.chown(path, -1, gid_of(config.operators.socket_group))
        os.chmod(path, 0o660 if shared else 0o600)
        sock.listen(64)
        sock.setblocking(False)
        return await anyio.abc.SocketListener.from_socket(sock)
    except BaseException:
        sock.close()
        with suppress(FileNotFoundError):
            os.unlink(path)
        raise


def _make_directory(directory: str, mode: int) -> None:
    """``directory`` and its missing parents created with exactly ``mode``,
    whatever the umask (UMask=0077 under systemd); an existing one is left as
    it is (``/run``, ``$XDG_RUNTIME_DIR``: not the daemon's to widen)."""
    missing: list[str] = []
    path = os.path.abspath(directory)
    while not os.path.lexists(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    for each in reversed(missing):
        try:
            os.mkdir(each, mode)
        except FileExistsError:  # made meanwhile by someone else: theirs
            continue
        os.chmod(each, mode)
