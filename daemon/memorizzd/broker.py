"""One handler per method: who may call -> (policy) -> upstream -> result.

Handlers take the caller and a decoded Params struct and return a Result
struct, raising ``RemoteError`` subclasses for expected failures. Which methods
a caller's socket allows is decided before a handler runs
(``memorizzd.rpc.authority``); inside one, an agent's scope is its profile's
servers (``_get``: any other is ``unknown_server``, as if it did not exist)
and its own proposals (``memorizzd.approvals``).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any, Final, TypeVar, cast

import anyio
import msgspec

from memorizz.api import methods as m
from memorizz.api.errors import (
    ConflictError,
    InternalError,
    InvalidParamsError,
    PermissionDeniedError,
    RemoteError,
    UnavailableError,
    UnsupportedProtocolError,
)
from memorizz.api.presets import PRESETS, expand_preset, instructions_of
from memorizz.api.protocol import PROTOCOL_VERSION
from memorizz.api.spec import check_server_spec
from memorizzd import __version__, stored
from memorizzd.approval_methods import ApprovalMethods
from memorizzd.approvals import ApprovalBook
from memorizzd.audit import REFUSALS, Auditor
from memorizzd.caller import Caller, Handler
from memorizzd.calllife import (
    client_send,
    client_session,
    declare,
    declared,
    offer_asks,
    want_logs,
)
from memorizzd.calls import Calls, ProgressReport, progress_to_client
from memorizzd.config import Config
from memorizzd.egress.urls import check_server_url, without_userinfo
from memorizzd.execution import resolve_command
from memorizzd.names import exposed_names, renamed
from memorizzd.presets import preset_tools
from memorizzd.store import Store, StoreError
from memorizzd.subscribers import Holder, Subscribers
from memorizzd.upstream.actor import Upstream
from memorizzd.upstream.connection import ProgressHandler
from memorizzd.upstream.errors import malformed_result
from memorizzd.upstream.logs import LEVELS, LogSink
from memorizzd.upstream.pool import Pool, unknown_server
from memorizzd.vault import (
    CredentialStore,
    FernetCredentialStore,
    VaultError,
    VaultKeyError,
    extract_secrets,
    server_refs,
    stripped,
)

if TYPE_CHECKING:
    from memorizzd.oauth.keeper import TokenKeeper
    from memorizzd.oauth.service import OAuthService

log = logging.getLogger("memorizzd.broker")
R = TypeVar("R")
SAID_MAX: Final = 200
"""The most of a server name the caller made up that an error says back (a
name is any string up to the request's size; a real one has at most 64)."""
_encoder = msgspec.json.Encoder()


class Broker:
    def __init__(
        self,
        config: Config,
        store: Store,
        pool: Pool,
        *,
        connections: Callable[[], int],
        in_flight: Callable[[], int],
        agent_sockets: Mapping[str, str] | None = None,
        auditor: Auditor,
        vault: CredentialStore,
        book: ApprovalBook,
    ) -> None:
        self._config = config
        self._book = book
        self._scopes: dict[str, frozenset[str]] = {
            profile.name: frozenset(profile.servers) for profile in config.profiles
        }
        self._vault = vault
        self._store = store
        self._pool = pool
        self._auditor = auditor
        self._tool_calls = Calls(
            pool,
            book=book,
            auditor=auditor,
            scope=self._get,
            sees=self.sees,
            metered=config.metrics.enabled,
        )
        self._connections = connections
        self._in_flight = in_flight
        # Absolute, as daemon/status shows them (the daemon never changes directory).
        self._paths = (
            os.path.abspath(config.socket),
            os.path.abspath(config.state_dir),
        )
        self._agent_sockets = {  # profile -> its socket
            name: os.path.abspath(path) for name, path in (agent_sockets or {}).items()
        }
        self._started = time.monotonic()
        self._changing = anyio.Lock()
        """Held while the set of servers changes: servers/add, servers/remove
        and a reload (``changing``), so that none sees another half done."""
        self.reload: Callable[[Caller], Awaitable[m.DaemonReloadResult]] | None = None
        """``daemon/reload``'s work (``memorizzd.reload``, set once it runs)."""
        self.last_reload: m.ReloadStatus | None = None
        """The last reload's outcome, for ``daemon/status``."""
        self._oauth_service: OAuthService | None = None
        self.subscribers: Subscribers[Holder] = Subscribers(
            sees=lambda holder, server: self.sees(holder.caller, server),
            line=_updated_line,
        )
        """The socket API's resource subscriptions: each connection holds its
        own, and hears of their updates for as long as it may see the server
        (``rpc.dispatch.Dispatcher`` releases them when it closes)."""

    def handlers(self) -> Mapping[str, Handler]:
        """One handler per method of the table (``memorizz.api.methods``); the
        dispatcher refuses a table with a method missing or undeclared."""
        passthrough: dict[m.Method[Any, Any], Handler] = {
            m.TOOLS_LIST: self.tools_list,
            m.TOOLS_CALL: self.tools_call,
            m.RESOURCES_LIST: self.resources_list,
            m.RESOURCES_TEMPLATES_LIST: self.resources_templates_list,
            m.RESOURCES_READ: self.resources_read,
            m.RESOURCES_SUBSCRIBE: self.resources_subscribe,
            m.RESOURCES_UNSUBSCRIBE: self.resources_unsubscribe,
            m.PROMPTS_LIST: self.prompts_list,
            m.PROMPTS_GET: self.prompts_get,
            m.COMPLETION_COMPLETE: self.completion_complete,
            m.PING: self.ping,
        }
        own: dict[m.Method[Any, Any], Handler] = {
            m.DAEMON_HELLO: self.daemon_hello,
            m.DAEMON_STATUS: self.daemon_status,
            m.DAEMON_RELOAD: self.daemon_reload,
            m.SERVERS_LIST: self.servers_list,
            m.PRESETS_LIST: self.presets_list,
            m.SERVERS_ADD: self._audited_servers_add,
            m.SERVERS_REMOVE: self._audited_servers_remove,
            m.SERVERS_STATUS: self.servers_status,
            m.SERVERS_TEST: self.servers_test,
            m.AUDIT_LIST: self.audit_list,
            m.VAULT_ROTATE: self._audited_vault_rotate,
            m.AUTH_LOGIN: self._audited_auth_login,
            m.AUTH_COMPLETE: self._audited_auth_complete,
            m.AUTH_LOGOUT: self._audited_auth_logout,
            m.TASKS_GET: self.tasks_get,
            m.TASKS_RESULT: self.tasks_result,
            m.TASKS_CANCEL: self.tasks_cancel,
            m.TASKS_LIST: self.tasks_list,
        }
        return {
            **{method.name: handler for method, handler in passthrough.items()},
            **{method.name: handler for method, handler in own.items()},
            **ApprovalMethods(
                self._pool, book=self._book, calls=self._tool_calls
            ).handlers(),
        }

    def in_scope(self, caller: Caller) -> list[Upstream]:
        """The servers the caller may use, by name: an operator's all, an
        agent's its profile's (none for a caller without a role)."""
        if caller.role == "operator":
            found = self._pool.all()
        elif caller.profile is None:
            found = []
        else:
            scope = self._scopes.get(caller.profile, frozenset())
            found = [u for u in self._pool.all() if u.name in scope]
        return sorted(found, key=lambda u: u.name)

    def sees(self, caller: Caller, server: str) -> bool:
        """Whether ``server`` is in the caller's scope now (an operator's:
        every server; an agent's: its profile's), as ``in_scope`` has it: what
        may reach a caller unasked (a resource's updates) is asked per message,
        so a reload that narrows a profile stops it at once."""
        if server not in self._pool:
            return False
        if caller.role == "operator":
            return True
        return caller.profile is not None and server in self._scopes.get(
            caller.profile, frozenset()
        )

    def scoped(self, caller: Caller, name: str) -> Upstream:
        """The caller's server ``name`` (``unknown_server`` outside its scope)."""
        return self._get(caller, name)

    @property
    def changing(self) -> anyio.Lock:
        """The lock a reload holds too while it changes the servers: a
        servers/add between its check and its start, or one landing between a
        reload's retiring a server and invalidating its proposals, saw half of
        the other (a refused add that stayed stored; proposals inherited)."""
        return self._changing

    @property
    def book(self) -> ApprovalBook:
        return self._book

    @property
    def config(self) -> Config:
        return self._config

    @property
    def tool_calls(self) -> Calls:
        """The call pipeline (every front calls tools through it)."""
        return self._tool_calls

    # --- tasks (MCP 2025-11-25; calls.py, upstream/tasks.py) ---------------

    async def _task_call(self, caller: Caller, p: m.ToolsCallParams) -> msgspec.Raw:
        """A ``tools/call`` with ``task``: the pipeline relays it as a task; the
        server's status notifications of it come to this connection."""
        return await self._tool_calls.call(
            caller,
            p.server,
            tool=p.name,
            arguments=p.arguments,
            timeout_s=p.timeout_s,
            task=_encoder.encode(p.task),
        )

    async def tasks_get(self, caller: Caller, p: m.TasksGetParams) -> msgspec.Raw:
        return _raw(await self._tool_calls.task(caller, "tasks/get", p.task_id))

    async def tasks_result(self, caller: Caller, p: m.TasksResultParams) -> msgspec.Raw:
        calls = self._tool_calls
        found = await calls.task(
            caller, "tasks/result", p.task_id, timeout_s=p.timeout_s
        )
        return _raw(found)

    async def tasks_cancel(self, caller: Caller, p: m.TasksCancelParams) -> msgspec.Raw:
        return _raw(await self._tool_calls.task(caller, "tasks/cancel", p.task_id))

    async def tasks_list(self, caller: Caller, p: m.TasksListParams) -> msgspec.Raw:
        return _raw({"tasks": await self._tool_calls.task_list(caller)})

    def _get(self, caller: Caller, name: str) -> Upstream:
        """The caller's server: an operator's any, an agent's where its profile
        names it; else (and for a caller without a role) it does not exist."""
        if caller.role != "operator" and (
            caller.profile is None
            or name not in self._scopes.get(caller.profile, frozenset())
        ):
            raise unknown_server(name[:SAID_MAX])
        return self._server(name)

    def server_named(self, name: str) -> Upstream:
        """Any server by name, whoever asks (``unknown_server`` if none)."""
        return self._server(name)

    def _server(self, name: str) -> Upstream:
        """Any server by name; the answer for one that does not exist says
        back at most ``SAID_MAX`` characters of the name the caller made up."""
        if name not in self._pool:
            raise unknown_server(name[:SAID_MAX])
        return self._pool.get(name)

    # --- the audit trail ----------------------------------------------------

    async def on_error(
        self, caller: Caller, method: str, params: m.Params | None, error: RemoteError
    ) -> None:
        """The dispatcher's hook: a refused request of anyone but an operator
        (an agent, or a caller without a role) leaves a record.

        tools/call records its own (it knows the risk and the verdict)."""
        if (
            caller.role == "operator"
            or error.reason not in REFUSALS
            or method == "tools/call"
        ):
            return
        self._auditor.record(
            caller,
            action=method if method in m.METHODS else "unknown_method",
            outcome="denied",
            started=time.time(),
            reason=error.reason,
            server=getattr(params, "server", None),
            tool=getattr(params, "name", None) if method == "prompts/get" else None,
        )

    async def on_refused_connection(self, caller: Caller, error: RemoteError) -> None:
        """A connection refused before it was read: recorded as ``connect``."""
        self._auditor.record(
            caller,
            action="connect",
            started=time.time(),
            outcome="denied",
            reason=error.reason,
            refusal=True,  # also when over a cap (overloaded): within the budget
        )

    async def tools_call(self, caller: Caller, p: m.ToolsCallParams) -> msgspec.Raw:
        """The call pipeline (``calls.py``): policy, relay, one audit record."""
        if p.task is not None:
            return await self._task_call(caller, p)
        # what the upstream asks during the call goes to this connection's
        # client, if it said it answers that (daemon/hello capabilities)
        capabilities = declared()
        offer_asks(capabilities, self.config.upstream_request_wait_s)
        call = partial(
            self._tool_calls.call,
            caller,
            p.server,
            tool=p.name,
            arguments=p.arguments,
            timeout_s=p.timeout_s,
            progress=_progress_to(p.progress_token),
            trace=None if p.meta is None else msgspec.structs.asdict(p.meta),
        )
        sink = _logs_to(capabilities.get("logging"))
        if sink is None:
            return await call()
        # the server's log messages while the call runs, if this client asked
        try:
            upstream = self.scoped(caller, p.server)
        except RemoteError:  # refused by the pipeline, and audited there
            return await call()
        return await sink.forwarding(upstream.log_sinks, call)

    async def _audited_servers_add(
        self, caller: Caller, p: m.ServersAddParams
    ) -> m.ServersAddResult:
        return await self._audited(
            caller, "servers/add", p.server.name, self.servers_add(caller, p)
        )

    async def _audited_servers_remove(
        self, caller: Caller, p: m.ServersRemoveParams
    ) -> m.ServersRemoveResult:
        return await self._audited(
            caller, "servers/remove", p.name, self.servers_remove(caller, p)
        )

    async def _audited_vault_rotate(
        self, caller: Caller, p: m.VaultRotateParams
    ) -> m.VaultRotateResult:
        return await self._audited(caller, "vault/rotate", None, self.vault_rotate(p))

    async def _audited_auth_login(
        self, caller: Caller, p: m.AuthLoginParams
    ) -> m.AuthLoginResult:
        upstream = self._server(p.server)
        return await self._audited(
            caller,
            "auth/login",
            p.server,
            self._oauth().login(upstream.spec, self._keeper(upstream), p.redirect_uri),
        )

    async def _audited_auth_complete(
        self, caller: Caller, p: m.AuthCompleteParams
    ) -> m.AuthCompleteResult:
        upstream = self._server(p.server)
        return await self._audited(
            caller,
            "auth/complete",
            p.server,
            self._oauth().complete(
                upstream.spec, self._keeper(upstream), p.callback_url
            ),
        )

    async def _audited_auth_logout(
        self, caller: Caller, p: m.AuthLogoutParams
    ) -> m.AuthLogoutResult:
        upstream = self._server(p.server)
        return await self._audited(
            caller,
            "auth/logout",
            p.server,
            self._oauth().logout(upstream.spec, self._keeper(upstream)),
        )

    def _oauth(self) -> OAuthService:
        """Made at first use (see ``Upstream.keeper``: OAuth loads lazily)."""
        if self._oauth_service is None:
            from memorizzd.oauth.service import OAuthService

            self._oauth_service = OAuthService(self._vault, self._config.host_allowlist)
        return self._oauth_service

    @staticmethod
    def _keeper(upstream: Upstream) -> TokenKeeper:
        if upstream.keeper is None:
            raise InvalidParamsError(
                f"server {upstream.name!r} does not use OAuth (its auth is"
                f' {upstream.spec.auth!r}); to log in, give it auth = "oauth":'
                f" `memorizzctl mcp remove {upstream.name}`, then"
                f" `memorizzctl mcp add {upstream.name} --url URL --oauth`"
                " (a server of the config file: in its [[servers]] entry)",
                data={"server": upstream.name},
            )
        return upstream.keeper

    async def _audited(
        self, caller: Caller, action: str, server: str | None, work: Awaitable[R]
    ) -> R:
        """Run an operator action and record it (``Auditor.action``): ok,
        failed with its reason, or interrupted; spooled as it begins, so that
        a daemon killed after its change committed leaves a record too."""
        with self._auditor.action(
            caller, action=action, started=time.time(), server=server
        ):
            return await work

    async def audit_list(
        self, caller: Caller, p: m.AuditListParams
    ) -> m.AuditListResult:
        if not 1 <= p.limit <= 1000:
            raise InvalidParamsError("limit must be in 1..1000")
        self._auditor.flush()  # the spooled records too
        records = await anyio.to_thread.run_sync(
            partial(
                stored.list_audit,
                self._store,
                server=p.server,
                tool=p.tool,
                outcome=p.outcome,
                since=p.since,
                before_id=p.before_id,
                limit=p.limit,
            )
        )
        more = len(records) == p.limit and records[-1].id > 1
        return m.AuditListResult(
            records=records, next_before_id=records[-1].id if more else None
        )

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
        declare(p.capabilities)  # this connection's client answers these
        return m.DaemonHelloResult(
            protocol_version=PROTOCOL_VERSION,
            daemon_version=__version__,
            servers=[u.name for u in self.in_scope(caller)],
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
            socket=self._paths[0],
            state_dir=self._paths[1],
            config_path=self._config.config_path,
            servers_total=len(upstreams),
            servers_ready=sum(u.state == "ready" for u in upstreams),
            connections=self._connections(),
            calls_in_flight=self._in_flight(),
            rss_bytes=_rss_bytes(),
            agent_sockets=dict(self._agent_sockets),
            last_reload=self.last_reload,
        )

    async def daemon_reload(
        self, caller: Caller, p: m.DaemonReloadParams
    ) -> m.DaemonReloadResult:
        if self.reload is None:
            raise UnavailableError(
                "the daemon is still starting", reason="shutting_down"
            )
        return await self.reload(caller)

    def reconfigure(self, config: Config, agent_sockets: Mapping[str, str]) -> None:
        """A reload's config: scopes, policy and settings for every call that
        starts from now on (no await: no call sees half of each). A profile's
        connections read its scope per call, so one whose server list shrank
        loses those servers at once."""
        self._config = config
        if self._oauth_service is not None:  # logins and logouts from now on
            self._oauth_service.reconfigure(config.host_allowlist)
        self._scopes = {
            profile.name: frozenset(profile.servers) for profile in config.profiles
        }
        self._agent_sockets = {
            name: os.path.abspath(path) for name, path in agent_sockets.items()
        }

    async def ping(self, caller: Caller, p: m.PingParams) -> m.PingResult:
        started = time.perf_counter()
        if p.server is not None:
            await self._get(caller, p.server).ping()
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
            url=_listed_url(spec),
            timeout_s=spec.timeout_s,
            max_result_bytes=spec.max_result_bytes,
            protocol=spec.protocol,
            state=upstream.state,
            replicas=spec.replicas,
            allow_private_network=spec.allow_private_network,
            allow_tools=list(spec.allow_tools),
            block_tools=list(spec.block_tools),
            require_approval=spec.require_approval,
            risk=dict(spec.risk),
            auth=spec.auth,
            header_names=sorted(spec.headers),
            secret_env_keys=sorted(spec.secret_env),
            oauth_client_id=spec.oauth_client_id,
            oauth_client_metadata_url=spec.oauth_client_metadata_url,
            oauth_scopes=list(spec.oauth_scopes),
            oauth_token_endpoint_auth_method=spec.oauth_token_endpoint_auth_method,
            oauth_grant=spec.oauth_grant,
            oauth_redirect_uri=spec.oauth_redirect_uri,
            oauth_assertion_file=spec.oauth_assertion_file,
            oauth_subject_token_file=spec.oauth_subject_token_file,
            oauth_idp_issuer=spec.oauth_idp_issuer,
            oauth_idp_token_endpoint=spec.oauth_idp_token_endpoint,
            oauth_idp_client_id=spec.oauth_idp_client_id,
            preset=spec.preset,
            workspace=spec.workspace,
            fixed_arguments=dict(spec.fixed_arguments),
            instructions=instructions_of(spec),
        )

    async def presets_list(
        self, caller: Caller, p: m.PresetsListParams
    ) -> m.PresetsListResult:
        """The built-in presets, each with its provider's reviewed tools."""
        return m.PresetsListResult(
            presets=[
                msgspec.structs.replace(preset, tools=preset_tools(preset.provider))
                for preset in PRESETS
            ]
        )

    async def servers_list(
        self, caller: Caller, p: m.ServersListParams
    ) -> m.ServersListResult:
        return m.ServersListResult(servers=[self._info(u) for u in self._pool.all()])

    async def servers_add(
        self, caller: Caller, p: m.ServersAddParams
    ) -> m.ServersAddResult:
        spec = expand_preset(p.server)  # a preset fills what the spec leaves out
        # What needs no state first, as the CLI checks it (the same reason and
        # message), then the egress policy on the URL and the stdio allowlist.
        check_server_spec(spec)
        check_server_url(spec, allowlist=self._config.host_allowlist)
        spec = resolve_command(  # stdio: the absolute path is what is stored and runs
            spec,
            allowlist=self._config.stdio_allowlist,
            allow_inline_code=self._config.stdio_allow_inline_code,
        )
        secrets = extract_secrets(spec)
        spec = stripped(spec)  # the values go to the vault, never to the spec
        async with self._changing:
            if spec.name in self._pool:
                raise ConflictError(f"a server named {spec.name!r} already exists")
            await anyio.to_thread.run_sync(self._replace_secrets, spec.name, secrets)
            try:
                added = await anyio.to_thread.run_sync(
                    stored.add_server, self._store, spec
                )
            except StoreError:  # a full disk: no server, and no secrets of it
                await self._forget_secrets(spec.name)
                raise
            if not added:
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
            upstream = self._server(p.name)
            if upstream.source == "config":
                raise PermissionDeniedError(
                    f"server {p.name!r} is declared in the config file; remove its"
                    " [[servers]] entry there, then `memorizzctl daemon reload`",
                    reason="read_only_server",
                )
            if upstream.keeper is not None and upstream.keeper.grant is not None:
                # Best effort: a grant is revoked where the server supports it
                # before its record goes (a slow or failing server does not
                # block the removal).
                with anyio.move_on_after(10):
                    try:
                        await self._oauth().logout(upstream.spec, upstream.keeper)
                    except RemoteError as exc:
                        log.info("%s: not revoked at removal: %s", p.name, exc.message)
            # The removal itself: a full disk refuses it whole (storage_full),
            # and the server stays. What follows is finished later if a full
            # disk refuses it now (the secrets at the next start, the
            # proposals by the approval book), never undone.
            await anyio.to_thread.run_sync(self._store.remove_server, p.name)
            # Its secrets go with its record, before it is stopped (a daemon
            # killed while a server is slow to stop kept them for ever), and
            # again after (a refresh may have stored a grant meanwhile).
            await self._forget_secrets(p.name)
            await self._pool.stop(p.name)
            await self._forget_secrets(p.name)
            # Its open proposals end now (out of the pool: a call on its way
            # invalidates its own), before one of the same name can be added.
            await self._book.server_removed(p.name)
        log.info("server %s removed by uid %d", p.name, caller.uid)
        return m.ServersRemoveResult(name=p.name)

    async def _forget_secrets(self, server: str) -> None:
        """Delete the secrets of a server that is not (any more): best effort,
        as the next start deletes those of every server that is gone."""
        try:
            await anyio.to_thread.run_sync(self._replace_secrets, server, {})
        except (StoreError, VaultError) as exc:
            log.warning(
                "server %s: its secrets stay in the vault until the next start: %s",
                server,
                exc,
            )

    def _replace_secrets(self, server: str, secrets: dict[str, str]) -> None:
        """The server's secrets become exactly ``secrets`` (stale refs deleted)."""
        for ref in server_refs(self._vault, server):
            if ref not in secrets:
                self._vault.delete(ref)
        if secrets:
            self._vault.put_many(secrets)

    async def vault_rotate(self, p: m.VaultRotateParams) -> m.VaultRotateResult:
        vault = getattr(self._vault, "primary", self._vault)  # the vault, of the stores
        if not isinstance(vault, FernetCredentialStore):
            raise InvalidParamsError("this credential store does not rotate keys")
        try:
            count = await anyio.to_thread.run_sync(
                partial(vault.rotate, new_key=p.new_key)
            )
        except VaultKeyError as exc:
            raise InvalidParamsError(str(exc)) from None
        except VaultError as exc:
            raise InternalError(f"rotation stopped: {exc}") from None
        log.info("vault: %d secrets re-encrypted (%s)", count, vault.source.name)
        return m.VaultRotateResult(
            reencrypted=count, key_source=vault.source.name, new_key=p.new_key
        )

    async def servers_status(
        self, caller: Caller, p: m.ServersStatusParams
    ) -> m.ServersStatusResult:
        upstreams = [self._server(p.name)] if p.name is not None else self._pool.all()
        shown = {u.name for u in upstreams}
        return m.ServersStatusResult(
            servers=[
                msgspec.structs.replace(u.status(), instructions=u.instructions)
                for u in upstreams
            ],
            face_renames=[r for r in self._face_renames() if r.server in shown],
        )

    def separator_of(self, caller: Caller) -> str:
        """The separator of the caller's MCP face: its profile's, or the
        operator's ``face_separator``."""
        if caller.role != "operator" and caller.profile is not None:
            for profile in self._config.profiles:
                if profile.name == caller.profile:
                    return profile.separator
        return self._config.face_separator

    def _face_renames(self) -> list[m.FaceRename]:
        """Every face's renames (``names.renamed``), from the warm listings as
        the face resolves calls: the operator's face, then each profile's."""
        faces = [("operator", self._pool.all(), self._config.face_separator)]
        faces += [
            (
                profile.name,
                [
                    u
                    for u in self._pool.all()
                    if u.name in self._scopes.get(profile.name, ())
                ],
                profile.separator,
            )
            for profile in self._config.profiles
        ]
        found: list[m.FaceRename] = []
        for face, upstreams, separator in faces:
            single = len(upstreams) == 1
            pairs = [
                (u.name, tool.name)
                for u in upstreams
                if u.connected and (view := u.tools_view) is not None
                for tool in sorted(view.tools, key=lambda t: t.name)
                if tool.decision != "deny"
            ]
            names = exposed_names(pairs, single=single, separator=separator, quiet=True)
            found += [
                m.FaceRename(face=face, shown=shown, server=server, tool=tool)
                for shown, server, tool in renamed(
                    names, single=single, separator=separator
                )
            ]
        return found

    async def servers_test(
        self, caller: Caller, p: m.ServersTestParams
    ) -> m.ServersTestResult:
        return await self._server(p.name).test(p.timeout_s)

    # --- MCP pass-through ---------------------------------------------------

    async def tools_list(
        self, caller: Caller, p: m.ToolsListParams
    ) -> m.ToolsListResult:
        upstream = self._get(caller, p.server)
        tools = await upstream.list_tools(refresh=p.refresh)
        return m.ToolsListResult(tools=tools, instructions=upstream.instructions)

    async def resources_list(
        self, caller: Caller, p: m.ResourcesListParams
    ) -> m.ResourcesListResult:
        return m.ResourcesListResult(
            resources=await self._get(caller, p.server).list_resources()
        )

    async def resources_templates_list(
        self, caller: Caller, p: m.ResourcesTemplatesListParams
    ) -> m.ResourcesTemplatesListResult:
        templates = await self._get(caller, p.server).list_resource_templates()
        return m.ResourcesTemplatesListResult(resource_templates=templates)

    async def resources_read(
        self, caller: Caller, p: m.ResourcesReadParams
    ) -> m.ResourcesReadResult:
        return await self._get(caller, p.server).read_resource(
            p.uri, timeout_s=p.timeout_s
        )

    async def prompts_list(
        self, caller: Caller, p: m.PromptsListParams
    ) -> m.PromptsListResult:
        return m.PromptsListResult(
            prompts=await self._get(caller, p.server).list_prompts()
        )

    async def prompts_get(
        self, caller: Caller, p: m.PromptsGetParams
    ) -> m.PromptsGetResult:
        upstream = self._get(caller, p.server)
        return await upstream.get_prompt(p.name, p.arguments, timeout_s=p.timeout_s)

    async def completion_complete(
        self, caller: Caller, p: m.CompletionCompleteParams
    ) -> m.CompletionCompleteResult:
        """The server's ``completion/complete``, its ref under the server's
        own names (``Upstream.complete`` refuses a server that offers none)."""
        upstream = self._get(caller, p.server)
        params: dict[str, Any] = {
            "ref": msgspec.to_builtins(p.ref),
            "argument": msgspec.to_builtins(p.argument),
        }
        if p.context is not None:
            params["context"] = msgspec.to_builtins(p.context)
        result = await upstream.complete(params, timeout_s=p.timeout_s)
        try:
            return msgspec.convert(result, m.CompletionCompleteResult)
        except msgspec.ValidationError as exc:
            raise malformed_result(
                upstream.name, "completion/complete", str(exc)
            ) from None

    async def resources_subscribe(
        self, caller: Caller, p: m.ResourcesSubscribeParams
    ) -> m.EmptyResult:
        """This connection holds a subscription to ``uri`` of the server (held
        upstream once for every holder, of either front): the updates come on
        it as ``notifications/resources/updated`` lines until it unsubscribes
        or closes. Subscribing is the opt-in: nothing else sends them."""
        upstream = self._get(caller, p.server)
        await self.subscribers.hold(_holder(), upstream, p.uri)
        return m.EmptyResult()

    async def resources_unsubscribe(
        self, caller: Caller, p: m.ResourcesUnsubscribeParams
    ) -> m.EmptyResult:
        """This connection lets go of ``uri`` (not held: nothing); the server
        hears it when no holder is left."""
        self._get(caller, p.server)  # a server out of scope is unknown, as always
        await self.subscribers.let_go(_holder(), p.server, p.uri)
        return m.EmptyResult()


def _raw(value: Any) -> msgspec.Raw:
    return msgspec.Raw(_encoder.encode(value))


def _holder() -> Holder:
    """The running request's connection, which holds its subscriptions."""
    session = client_session()
    if session is None:  # every socket request has one
        raise InternalError("a subscription needs a connection")
    return cast(Holder, session)


def _updated_line(server: str, uri: str, params: msgspec.Raw) -> bytes:
    """An update as the socket API sends it: with its server's name."""
    params_of = m.ResourceUpdatedParams(server=server, uri=uri)
    return _encoder.encode(m.ResourceUpdatedNotification(params=params_of)) + b"\n"


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _logs_to(asked: object) -> LogSink | None:
    """Where a socket ``tools/call``'s server's log messages go, if its
    connection asked for them (``daemon/hello`` capabilities ``logging``:
    ``{}`` for every level, ``{"level": L}`` from ``L`` on):
    ``notifications/message`` lines with the server's name, on its connection
    (None: it asked for none, or cannot be sent to)."""
    if not isinstance(asked, dict):
        return None
    level = asked.get("level", LEVELS[0])
    send = client_send()
    if send is None or level not in LEVELS:
        return None
    want_logs(level)  # a 2026-07-28 upstream logs only to requests that ask

    def note(server: str, level: str, data: Any, logger: str | None) -> bytes:
        params = m.LogParams(
            server=server,
            level=cast(m.LogLevel, level),
            data=data,
            logger=logger,
        )
        return _encoder.encode(m.LogNotification(params=params)) + b"\n"

    return LogSink(send, level, note)


def _progress_to(token: m.ProgressToken | None) -> ProgressHandler | None:
    """Where a socket ``tools/call``'s progress goes: ``notifications/progress``
    lines under the caller's token, on its connection (None: the caller asked
    for none, so it gets exactly the reply, as before)."""
    if token is None:
        return None

    def note(report: ProgressReport) -> bytes:
        params = m.ProgressParams(
            progress_token=token,
            progress=report.progress,
            total=report.total,
            message=report.message,
        )
        return _encoder.encode(m.ProgressNotification(params=params)) + b"\n"

    return progress_to_client(note)


def _listed_url(spec: m.ServerSpec) -> str | None:
    """A server's URL as ``servers/list`` shows it: none for a built-in
    bridge (its tenant URL is a secret, as ``servers/add`` keeps it), and
    without user information (``https://user:password@host``, refused at
    connect, but written so in a config file)."""
    if spec.transport == "builtin" or spec.url is None:
        return None
    return without_userinfo(spec.url)
