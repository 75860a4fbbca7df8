"""One handler per method: who may call -> (policy) -> upstream -> result.

Handlers take the caller and a decoded Params struct and return a Result
struct, raising ``RemoteError`` subclasses for expected failures. Policy,
audit and per-socket authority plug in here in later issues.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

import anyio

from memorizz.api import methods as m
from memorizz.api.errors import (
    ConflictError,
    InvalidParamsError,
    PermissionDeniedError,
    RemoteError,
    UnsupportedProtocolError,
)
from memorizz.api.protocol import PROTOCOL_VERSION
from memorizzd import __version__
from memorizzd.config import Config, validate_server
from memorizzd.rpc.dispatch import Handler
from memorizzd.rpc.peer import Caller
from memorizzd.store import Store
from memorizzd.upstream.actor import Upstream
from memorizzd.upstream.pool import Pool
from memorizzd.upstream.session import ConnectionLost

log = logging.getLogger("memorizzd.broker")


class Broker:
    def __init__(
        self,
        config: Config,
        store: Store,
        pool: Pool,
        *,
        connections: Callable[[], int],
        in_flight: Callable[[], int],
    ) -> None:
        self._config = config
        self._store = store
        self._pool = pool
        self._connections = connections
        self._in_flight = in_flight
        self._started = time.monotonic()
        self._changing = anyio.Lock()

    def handlers(self) -> Mapping[str, Handler]:
        table: dict[str, Any] = {
            "daemon/hello": self.daemon_hello,
            "daemon/status": self.daemon_status,
            "servers/list": self.servers_list,
            "servers/add": self.servers_add,
            "servers/remove": self.servers_remove,
            "servers/status": self.servers_status,
            "servers/test": self.servers_test,
            "tools/list": self.tools_list,
            "tools/call": self.tools_call,
            "resources/list": self.resources_list,
            "resources/templates/list": self.resources_templates_list,
            "resources/read": self.resources_read,
            "prompts/list": self.prompts_list,
            "prompts/get": self.prompts_get,
            "ping": self.ping,
        }
        return table

    # --- the daemon ---------------------------------------------------------

    async def daemon_hello(
        self, caller: Caller, p: m.DaemonHelloParams
    ) -> m.DaemonHelloResult:
        if p.protocol_version != PROTOCOL_VERSION:
            raise UnsupportedProtocolError(
                f"client speaks protocol {p.protocol_version}, daemon speaks {PROTOCOL_VERSION}",
                data={"supported": [PROTOCOL_VERSION]},
            )
        log.debug("hello from pid %d uid %d: %s", caller.pid, caller.uid, p.client)
        return m.DaemonHelloResult(
            protocol_version=PROTOCOL_VERSION, daemon_version=__version__
        )

    async def daemon_status(
        self, caller: Caller, p: m.DaemonStatusParams
    ) -> m.DaemonStatusResult:
        upstreams = self._pool.all()
        return m.DaemonStatusResult(
            version=__version__,
            protocol_version=PROTOCOL_VERSION,
            pid=os.getpid(),
            uptime_s=round(time.monotonic() - self._started, 3),
            socket=self._config.socket,
            state_dir=self._config.state_dir,
            config_path=self._config.config_path,
            servers_total=len(upstreams),
            servers_ready=sum(u.state == "ready" for u in upstreams),
            connections=self._connections(),
            calls_in_flight=self._in_flight(),
            rss_bytes=_rss_bytes(),
        )

    async def ping(self, caller: Caller, p: m.PingParams) -> m.PingResult:
        started = time.perf_counter()
        if p.server is not None:
            await self._pool.get(p.server).ping()
        return m.PingResult(latency_ms=round((time.perf_counter() - started) * 1000, 3))

    # --- servers ------------------------------------------------------------

    def _info(self, upstream: Upstream) -> m.ServerInfo:
        spec = upstream.spec
        return m.ServerInfo(
            name=spec.name,
            transport=spec.transport,
            source="config" if upstream.source == "config" else "api",
            command=spec.command,
            args=list(spec.args),
            env_keys=sorted(spec.env),
            cwd=spec.cwd,
            url=spec.url,
            timeout_s=spec.timeout_s,
            max_result_bytes=spec.max_result_bytes,
            protocol=spec.protocol,
            state=upstream.state,
        )

    async def servers_list(
        self, caller: Caller, p: m.ServersListParams
    ) -> m.ServersListResult:
        return m.ServersListResult(servers=[self._info(u) for u in self._pool.all()])

    async def servers_add(
        self, caller: Caller, p: m.ServersAddParams
    ) -> m.ServersAddResult:
        spec = p.server
        try:
            validate_server(spec)
        except ValueError as exc:
            raise InvalidParamsError(str(exc)) from None
        async with self._changing:
            if spec.name in self._pool:
                raise ConflictError(f"a server named {spec.name!r} already exists")
            if not await anyio.to_thread.run_sync(self._store.add_server, spec):
                raise ConflictError(f"a server named {spec.name!r} already exists")
            upstream = await self._pool.start(spec, source="api")
        log.info(
            "server %s added by uid %d (%s)", spec.name, caller.uid, spec.transport
        )
        return m.ServersAddResult(server=self._info(upstream))

    async def servers_remove(
        self, caller: Caller, p: m.ServersRemoveParams
    ) -> m.ServersRemoveResult:
        async with self._changing:
            upstream = self._pool.get(p.name)
            if upstream.source == "config":
                raise PermissionDeniedError(
                    f"server {p.name!r} is declared in the config file; remove it there",
                    reason="read_only_server",
                )
            await anyio.to_thread.run_sync(self._store.remove_server, p.name)
            await self._pool.stop(p.name)
        log.info("server %s removed by uid %d", p.name, caller.uid)
        return m.ServersRemoveResult(name=p.name)

    async def servers_status(
        self, caller: Caller, p: m.ServersStatusParams
    ) -> m.ServersStatusResult:
        upstreams = [self._pool.get(p.name)] if p.name is not None else self._pool.all()
        return m.ServersStatusResult(servers=[u.status() for u in upstreams])

    async def servers_test(
        self, caller: Caller, p: m.ServersTestParams
    ) -> m.ServersTestResult:
        upstream = self._pool.get(p.name)
        started = time.perf_counter()
        try:
            with anyio.fail_after(upstream.timeout_for(p.timeout_s)):
                tools = await upstream.list_tools(refresh=True)
        except TimeoutError:
            return _test_result(p.name, "timeout", "no answer within the deadline")
        except RemoteError as exc:
            outcome = {
                "timeout": "timeout",
                "upstream_error": "upstream_error",
            }.get(exc.reason, "unreachable")
            return _test_result(p.name, outcome, exc.message)
        except ConnectionLost as exc:
            return _test_result(p.name, "unreachable", str(exc))
        latency = round((time.perf_counter() - started) * 1000, 3)
        return m.ServersTestResult(
            name=p.name,
            outcome="ok",
            message=f"tools/list answered with {len(tools)} tools",
            tool_count=len(tools),
            latency_ms=latency,
        )

    # --- MCP pass-through ---------------------------------------------------

    async def tools_list(
        self, caller: Caller, p: m.ToolsListParams
    ) -> m.ToolsListResult:
        tools = await self._pool.get(p.server).list_tools(refresh=p.refresh)
        return m.ToolsListResult(tools=tools)

    async def tools_call(
        self, caller: Caller, p: m.ToolsCallParams
    ) -> m.ToolsCallResult:
        upstream = self._pool.get(p.server)
        return await upstream.call_tool(p.name, p.arguments, timeout_s=p.timeout_s)

    async def resources_list(
        self, caller: Caller, p: m.ResourcesListParams
    ) -> m.ResourcesListResult:
        return m.ResourcesListResult(
            resources=await self._pool.get(p.server).list_resources()
        )

    async def resources_templates_list(
        self, caller: Caller, p: m.ResourcesTemplatesListParams
    ) -> m.ResourcesTemplatesListResult:
        templates = await self._pool.get(p.server).list_resource_templates()
        return m.ResourcesTemplatesListResult(resource_templates=templates)

    async def resources_read(
        self, caller: Caller, p: m.ResourcesReadParams
    ) -> m.ResourcesReadResult:
        return await self._pool.get(p.server).read_resource(
            p.uri, timeout_s=p.timeout_s
        )

    async def prompts_list(
        self, caller: Caller, p: m.PromptsListParams
    ) -> m.PromptsListResult:
        return m.PromptsListResult(
            prompts=await self._pool.get(p.server).list_prompts()
        )

    async def prompts_get(
        self, caller: Caller, p: m.PromptsGetParams
    ) -> m.PromptsGetResult:
        upstream = self._pool.get(p.server)
        return await upstream.get_prompt(p.name, p.arguments, timeout_s=p.timeout_s)


def _test_result(name: str, outcome: Any, message: str) -> m.ServersTestResult:
    return m.ServersTestResult(
        name=name, outcome=outcome, message=message, tool_count=None, latency_ms=None
    )


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0
