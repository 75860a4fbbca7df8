"""Hot reload: SIGHUP or ``daemon/reload`` re-reads the config file and applies
the difference, without dropping what did not change.

* Config-file servers (source ``config``): an unchanged one keeps its warm
  session and in-flight calls; one whose spec changed is replaced (new calls go
  to the new session at once, the old one's calls finish, then it stops); one
  whose spec changed only in its tool policy (``POLICY_FIELDS``) keeps its
  session and gets the new policy; a removed one is taken out at once (new
  calls: ``unknown_server``), its in-flight calls finish, then it stops; a new
  one starts. Servers added through the API are not touched, but for a name
  the file now gives too: the file wins, as at start (and a server the file no
  longer gives comes back from the state database if it is there). A removed
  server that does not come back has its open proposals invalidated
  (``ApprovalBook.server_removed``); one a profile no longer reaches is not
  removed: its proposals are checked when resumed.
* Everything else the calls read (profiles' scopes, ``[decisions]``, the
  allowlists, limits, timeouts) is swapped in one synchronous step
  (``_apply``: no await), so a call sees either the old config or the new one,
  never half of each; the tool verdicts are decided again from each server's
  cached listing, with no round trip.
* Profiles: a new one's sockets open (``listeners.open_all``) and serve; a
  removed one's stop accepting, are unlinked, and their connections end once
  their in-flight requests are answered; a changed one's rule and limits apply
  to the connections accepted from then on (its socket's mode and group too),
  and an open connection the new rule refuses is cut at once,
  and its server list to every call from then on, on the connections already
  open too: a server dropped from the list is gone for them at once.
  A removed profile's open proposals (pending, approved) are invalidated
  (``ApprovalBook.profiles_in_force``): one of the same name added later is
  another profile, and never inherits them. Its tasks are forgotten
  (``TaskBook.profiles_in_force``), and those not known to have ended are
  cancelled upstream (``Calls.cancel_forgotten``: in the background, bounded,
  best effort, audited as the daemon's ``tasks/cancel`` with reason
  ``profile_removed``; the reload never waits for them). A profile that only
  loses a server keeps its tasks there, hidden from it and running: a reload
  that gives the server back shows them again.
* ``RESTART_KEYS`` are not applied: the result and the log name them.

An invalid file (TOML, validation, a command the execution policy refuses, a
socket that cannot be opened) changes nothing: the error is logged, returned
(``invalid_config``) and kept in ``daemon/status`` until a reload succeeds. A
daemon started without a config file has none to re-read (``no_config_file``).
A reload that fails any other way (a bug) is an internal error, and is kept in
``daemon/status`` too, without the exception's text. Every reload leaves an
audit record (``daemon/reload``).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Final, Literal

import anyio
import anyio.abc
import msgspec

from memorizz.api import methods as m
from memorizz.api.errors import InvalidParamsError
from memorizzd.approvals import ApprovalBook
from memorizzd.audit import Auditor
from memorizzd.broker import Broker
from memorizzd.caller import Caller
from memorizzd.config import Config, ConfigError, Profile, gid_of, open_caps
from memorizzd.execution import check_config_servers
from memorizzd.execution.admission import Admission
from memorizzd.listeners import (
    FACE_SUFFIX,
    OPERATOR_NAME,
    Listening,
    agent_mode,
    agent_socket_path,
    close_all,
    open_all,
)
from memorizzd.rpc.authority import SocketRule, agent_rule, operator_rule
from memorizzd.rpc.server import SocketServer
from memorizzd.sdnotify import notify
from memorizzd.upstream.actor import Upstream
from memorizzd.upstream.errors import FailureKind
from memorizzd.upstream.pool import Pool
from memorizzd.upstream.tasks import PROFILE_REMOVED

log = logging.getLogger("memorizzd.reload")

RESTART_KEYS: Final[dict[str, Callable[[Config], object]]] = {
    "socket": lambda c: c.socket,
    "state_dir": lambda c: c.state_dir,
    "agents_dir": lambda c: c.agents_dir,
    "mcp_face": lambda c: c.mcp_face,
    "operators.socket_group": lambda c: c.operators.socket_group,
    "credentials.stores": lambda c: c.credentials.stores,
    "metrics": lambda c: c.metrics,
    "tracing": lambda c: c.tracing,
}
"""Settings a reload does not apply (the sockets, the state database, the
credential stores, the metrics listeners and the tracer are set up once): the
old value stays until a restart."""
POLICY_FIELDS: Final = ("allow_tools", "block_tools", "require_approval", "risk")
"""A server's keys that change what callers see and get, not how it is reached."""
SIGNAL_CALLER: Final = Caller(
    pid=os.getpid(), uid=os.geteuid(), gid=os.getegid(), socket="SIGHUP"
)
"""Who a SIGHUP's reload is, in the audit trail: the daemon itself."""


class Sockets:
    """The daemon's live sockets, each served in its own cancel scope, so that
    a reload can open and close one. ``listening`` and ``servers`` are the
    daemon's lists (in step: the same index is the same socket)."""

    def __init__(
        self,
        listening: list[Listening],
        servers: list[SocketServer],
        make: Callable[[Listening], SocketServer],
        *,
        acceptor: anyio.abc.TaskGroup,
        connections: anyio.abc.TaskGroup,
    ) -> None:
        self.listening = listening
        self.servers = servers
        self._make = make
        self._acceptor = acceptor
        self._connections = connections
        self._scopes: dict[str, anyio.CancelScope] = {}
        self._max_in_flight: int | None = None
        """A reload's ``max_in_flight_per_connection`` (None: the start's)."""

    async def serve(self, item: Listening, server: SocketServer) -> None:
        """Accept on ``item`` (returns once it does)."""
        await self._acceptor.start(self._serve, item, server)

    async def _serve(
        self,
        item: Listening,
        server: SocketServer,
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        with anyio.CancelScope() as scope:
            self._scopes[item.name] = scope
            await server.serve(
                item.listener, self._connections, task_status=task_status
            )

    async def add(self, opened: list[Listening]) -> None:
        for item in opened:
            server = self._make(item)
            if self._max_in_flight is not None:
                server.reconfigure(
                    item.rule, item.limits, max_in_flight=self._max_in_flight
                )
            self.listening.append(item)
            self.servers.append(server)
            await self.serve(item, server)

    async def remove(self, profile: str) -> None:
        """Stop accepting on the profile's sockets and unlink them; their
        connections end once their in-flight requests are answered."""
        gone = [
            (item, server)
            for item, server in zip(self.listening, self.servers, strict=True)
            if _profile_of(item) == profile
        ]
        for item, server in gone:
            scope = self._scopes.pop(item.name, None)
            if scope is not None:
                scope.cancel()  # serve() closes the listener as it leaves
            self.listening.remove(item)
            self.servers.remove(server)
            self._connections.start_soon(server.drain)
        await close_all([item for item, _ in gone])

    def reconfigure(self, config: Config, changed: set[str]) -> None:
        """Every socket's rule and limits from ``config`` (the operator's and
        each profile's), for connections accepted from now on (an open one
        the new rule refuses is cut: ``SocketServer.reconfigure``); the socket
        files of ``changed`` profiles get their mode and group again."""
        rules: dict[str, tuple[SocketRule, Profile | None]] = {
            OPERATOR_NAME: (operator_rule(config.operators), None)
        }
        rules.update((p.name, (agent_rule(p), p)) for p in config.profiles)
        self._max_in_flight = config.max_in_flight_per_connection
        for item, server in zip(self.listening, self.servers, strict=True):
            found = rules.get(_profile_of(item))
            if found is None:
                continue  # a removed profile: closed next
            rule, profile = found
            limits = None if profile is None else profile.limits
            item.rule, item.limits = rule, limits
            server.reconfigure(
                rule, limits, max_in_flight=config.max_in_flight_per_connection
            )
            if profile is not None and profile.name in changed and not item.activated:
                _restyle(item.path, profile)


class NoConfigFileError(ConfigError):
    """The daemon was started without a config file: there is none to re-read."""


class Reloader:
    """Reloads, one at a time; ``config`` is the configuration in force."""

    def __init__(
        self,
        config: Config,
        *,
        load: Callable[[], Config],
        admitted: list[Admission],
        pool: Pool,
        broker: Broker,
        book: ApprovalBook,
        auditor: Auditor,
        sockets: Sockets,
        api_servers: Callable[[], list[m.ServerSpec]],
        admit: Callable[[m.ServerSpec, Config], Admission],
        background: anyio.abc.TaskGroup,
    ) -> None:
        self.config = config
        self._background = background
        """Where a reload leaves what it does not wait for (the upstream cancels
        of a removed profile's tasks)."""
        self._load = load
        self._admitted = {a.spec.name: a for a in admitted}
        self._pool = pool
        self._broker = broker
        self._book = book
        self._auditor = auditor
        self._sockets = sockets
        self._api_servers = api_servers
        self._admit = admit
        self._lock = anyio.Lock()

    async def reload(
        self, caller: Caller, *, trigger: Literal["api", "signal"] = "api"
    ) -> m.DaemonReloadResult:
        """Re-read the file and apply the difference; ``invalid_config`` (and
        nothing changed) when it cannot be, ``no_config_file`` when there is
        none."""
        async with self._lock:
            started = time.time()
            before = self.config
            notify(
                "RELOADING=1\n"
                f"MONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}"
            )
            try:
                async with self._broker.changing:  # not beside servers/add, remove
                    result = await self._reload()
            except NoConfigFileError as exc:
                message = str(exc)
                log.error("reload refused: %s", message)
                await self._ended(caller, started, trigger, message, "no_config_file")
                raise InvalidParamsError(message, reason="no_config_file") from None
            except ConfigError as exc:
                message = str(exc)
                log.error("reload refused, nothing changed: %s", message)
                await self._ended(caller, started, trigger, message, "invalid_config")
                raise InvalidParamsError(
                    f"invalid configuration, nothing changed: {message}",
                    reason="invalid_config",
                    data={"config_path": self.config.config_path},
                ) from None
            except Exception as exc:
                # A bug: the traceback goes to the log where the exception is
                # caught (the dispatcher, the SIGHUP handler); daemon/status
                # keeps that it failed, never the exception's text (a path, a
                # value of the file: it may hold a secret).
                failure = _internal_failure(exc, applied=self.config is not before)
                await self._ended(caller, started, trigger, failure, "internal")
                raise
            finally:
                notify("READY=1")
            summary = describe(result)
            log.info("reloaded %s: %s", result.config_path, summary)
            if result.restart_required:
                log.warning(
                    "reload: not applied, they take a restart: %s",
                    ", ".join(result.restart_required),
                )
            await self._ended(caller, started, trigger, summary, None)
            return result

    async def _ended(
        self,
        caller: Caller,
        started: float,
        trigger: Literal["api", "signal"],
        message: str,
        failure: str | None,
    ) -> None:
        """How the reload ended, kept for ``daemon/status`` and in the audit
        trail: ``failure`` is the reason it failed for, None when it went well."""
        self._broker.last_reload = m.ReloadStatus(
            time=started, ok=failure is None, message=message, trigger=trigger
        )
        self._auditor.record(
            caller,
            action="daemon/reload",
            started=started,
            outcome="ok" if failure is None else "failed",
            reason=failure,
            refusal=False,
        )

    async def _reload(self) -> m.DaemonReloadResult:
        old = self.config
        if old.config_path is None:
            raise NoConfigFileError(
                "no config file to reload: the daemon was started without one"
                " (restart it with --config FILE to use one)"
            )
        new = await anyio.to_thread.run_sync(self._load)
        admissions = await anyio.to_thread.run_sync(check_config_servers, new)
        restart = [k for k, get in RESTART_KEYS.items() if get(old) != get(new)]
        config = msgspec.structs.replace(
            new,
            socket=old.socket,
            state_dir=old.state_dir,
            agents_dir=old.agents_dir,
            mcp_face=old.mcp_face,
            operators=msgspec.structs.replace(
                new.operators, socket_group=old.operators.socket_group
            ),
            credentials=old.credentials,
            metrics=old.metrics,
            tracing=old.tracing,
        )
        old_profiles = {p.name: p for p in old.profiles}
        new_profiles = {p.name: p for p in config.profiles}
        result = m.DaemonReloadResult(
            config_path=old.config_path,
            profiles_added=[n for n in new_profiles if n not in old_profiles],
            profiles_removed=[n for n in old_profiles if n not in new_profiles],
            profiles_changed=[
                n
                for n, p in new_profiles.items()
                if n in old_profiles and old_profiles[n] != p
            ],
            settings_changed=_settings_changed(old, config),
            restart_required=restart,
        )
        self._sort_servers(old, config, admissions, result)
        # What can fail is done before anything changes: the new sockets.
        try:
            opened = (
                await open_all(config, {}, only=result.profiles_added)
                if result.profiles_added
                else []
            )
        except OSError as exc:  # SocketInUseError too
            raise ConfigError(
                f"{old.config_path}: a new profile's socket: {exc}"
            ) from None
        admitted = {a.spec.name: a for a in admissions}
        changed_views = self._apply(config, admitted, result)
        # A proposal never outlives its profile: a removed one's open proposals
        # end now, before a profile of the same name could be added again.
        await self._book.profiles_in_force(new_profiles.keys(), caps=open_caps(config))
        # And its tasks: forgotten, and cancelled upstream, on the sessions they
        # run on (taken now, before a server is retired or replaced below).
        calls = self._broker.tool_calls
        forgotten = calls.tasks.profiles_in_force(new_profiles.keys())
        if forgotten:
            calls.cancel_forgotten(
                forgotten, why=PROFILE_REMOVED, background=self._background
            )
        # Then what takes time; the config in force is already the new one.
        for name in result.servers_stopped:
            self._pool.retire(name)
        for name in result.servers_restarted + result.servers_started:
            admission = admitted[name]
            if name in self._pool and name in result.servers_started:
                log.warning(
                    "server %s is in both the config file and the state database;"
                    " the config file wins",
                    name,
                )
            await self._replace(admission, source="config")
        await self._restore_api_servers(config, result.servers_stopped)
        if old.host_allowlist != config.host_allowlist:
            await self._recheck_api_servers(config, result)
        # A proposal never outlives its server: one the file gave up and the
        # state database does not give back is gone, and its proposals with it.
        for name in result.servers_stopped:
            if name not in self._pool:
                await self._book.server_removed(name)
        await self._sockets.add(opened)
        for name in result.profiles_removed:
            await self._sockets.remove(name)
        for upstream in changed_views:
            await upstream.announce_tools()
        return result

    def _sort_servers(
        self,
        old: Config,
        new: Config,
        admissions: list[Admission],
        result: m.DaemonReloadResult,
    ) -> None:
        """Each config-file server: started, restarted, updated or unchanged;
        and the ones the file no longer gives, stopped."""
        hosts_changed = old.host_allowlist != new.host_allowlist
        for admission in admissions:
            name = admission.spec.name
            before = self._admitted.get(name)
            if before is None:
                result.servers_started.append(name)
            elif before.problem != admission.problem or (
                hosts_changed and admission.spec.transport != "stdio"
            ):
                result.servers_restarted.append(name)
            elif before.spec == admission.spec:
                result.servers_unchanged.append(name)
            elif _reached_alike(before.spec, admission.spec):
                result.servers_updated.append(name)
            else:
                result.servers_restarted.append(name)
        given = {a.spec.name for a in admissions}
        result.servers_stopped = [n for n in self._admitted if n not in given]

    def _apply(
        self,
        config: Config,
        admitted: dict[str, Admission],
        result: m.DaemonReloadResult,
    ) -> list[Upstream]:
        """The new config everywhere calls read it, in one step (no await)."""
        changed = self._pool.reconfigure(config)
        for name in result.servers_updated:
            upstream = self._pool.get(name)
            if upstream.reconfigure(config, admitted[name].spec):
                changed.append(upstream)
        self._broker.reconfigure(
            config,
            {p.name: agent_socket_path(config, p.name) for p in config.profiles},
        )
        self._book.reconfigure(ttl_s=config.approval_ttl_s)
        self._sockets.reconfigure(config, set(result.profiles_changed))
        self.config = config
        self._admitted = admitted
        return changed

    async def _recheck_api_servers(
        self, config: Config, result: m.DaemonReloadResult
    ) -> None:
        """A changed host allowlist reaches the servers added through the API
        too, as it reaches the file's: each that connects over the network
        starts again, checked against it (an open session to a host no longer
        allowed ends now, not at its next reconnect)."""
        for upstream in self._pool.all():
            if upstream.source != "api" or upstream.spec.transport == "stdio":
                continue
            await self._replace(self._admit(upstream.spec, config), source="api")
            result.servers_restarted.append(upstream.name)

    async def _restore_api_servers(self, config: Config, names: list[str]) -> None:
        """A server the file no longer gives, but the state database has (it
        was shadowed by the file): it runs again, as it would after a restart."""
        if not names:
            return
        stored = await anyio.to_thread.run_sync(self._api_servers)
        for spec in stored:
            if spec.name in names and spec.name not in self._pool:
                log.info(
                    "server %s: the state database's, the file gave it up", spec.name
                )
                await self._replace(self._admit(spec, config), source="api")

    async def _replace(self, admission: Admission, *, source: str) -> None:
        """Start ``admission``'s server in place of the one of its name: run,
        or listed ``failed`` with why it must not."""
        await self._pool.replace(
            admission.spec,
            source=source,
            refused=admission.problem,
            refused_kind=_refused_kind(admission),
        )


def _internal_failure(exc: Exception, *, applied: bool) -> str:
    """``daemon/status``'s word on a reload that failed with a bug: the
    exception's type only, and whether the new config was already in force."""
    state = (
        "the new configuration is in force, but applying it did not finish"
        if applied
        else "nothing changed"
    )
    return (
        f"internal error ({type(exc).__name__}): {state}; the daemon's log has"
        " the details"
    )


def describe(result: m.DaemonReloadResult) -> str:
    """One line: what a reload changed."""
    parts = [
        f"{label} {', '.join(names)}"
        for label, names in (
            ("servers started:", result.servers_started),
            ("restarted:", result.servers_restarted),
            ("updated:", result.servers_updated),
            ("stopped:", result.servers_stopped),
            ("profiles added:", result.profiles_added),
            ("removed:", result.profiles_removed),
            ("changed:", result.profiles_changed),
            ("settings:", result.settings_changed),
            ("restart required for:", result.restart_required),
        )
        if names
    ]
    unchanged = len(result.servers_unchanged)
    return "; ".join([*parts, f"{unchanged} servers unchanged"])


def _profile_of(item: Listening) -> str:
    return item.name[: -len(FACE_SUFFIX)] if item.face else item.name


def _reached_alike(a: m.ServerSpec, b: m.ServerSpec) -> bool:
    """The same server, reached the same way: only the tool policy differs."""
    blank = {
        field: getattr(m.ServerSpec(name="", transport="stdio"), field)
        for field in POLICY_FIELDS
    }
    return msgspec.structs.replace(a, **blank) == msgspec.structs.replace(b, **blank)


def _settings_changed(old: Config, new: Config) -> list[str]:
    """The top-level keys (but servers and profiles) whose values differ."""
    skip = {"servers", "profiles", "config_path", *RESTART_KEYS}
    return [
        key
        for key in new.__struct_fields__
        if key not in skip and getattr(old, key) != getattr(new, key)
    ]


def _restyle(path: str, profile: Profile) -> None:
    """A changed profile's socket file: its mode and group as at start."""
    try:
        group = profile.socket_group
        os.chown(path, -1, os.getegid() if group is None else gid_of(group))
        os.chmod(path, agent_mode(profile))
    except (OSError, ValueError) as exc:  # a group gone since the file was read
        log.error("%s: mode and group not changed: %s", path, exc)


def _refused_kind(admitted: Admission) -> FailureKind:
    return "refused_by_policy" if admitted.forbidden else "unreachable"
