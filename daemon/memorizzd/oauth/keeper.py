"""One server's OAuth grant while the daemon runs: the token keeper.

* ``bearer()`` is the hot path: the current access token, no I/O, no lock.
  Only a token that has actually expired (the background refresh fell
  behind) makes a caller wait for a refresh.
* Exactly one task talks to the token endpoint: ``run()``. It refreshes a
  margin ahead of expiry (``refresh_margin``), and on request (a 401, an
  expired token). Callers that need a refresh ask for one and wait for *that*
  refresh; twenty callers that hit one expired token cause one request.
* A refresh is shielded from cancellation and its result (the rotated refresh
  token above all) is written to the vault, durably, before anyone uses the
  new access token: a refresh token the authorization server rotated is never
  lost to a caller who gave up waiting.
* A 401 on a token that a 401 made the keeper refresh moments ago is not
  refreshed again (``FORCED_HOLD_S``): a server that refuses every token,
  fresh ones too, gets one forced refresh, and its callers a clear error,
  never a refresh per call (SECURITY.md §3.2, item 3).
* ``invalid_grant`` (and ``invalid_client``) is final: the grant is marked
  ``login_required`` (in the vault too, so a restart does not try again) and
  callers get ``authorization_required`` / ``login_required`` at once.
  Transient failures are retried with backoff while the token still lives.
* A token endpoint that answers 429 or 503 with ``Retry-After`` is asked
  nothing more until that wait is over (at most ``RETRY_MAX_S``), by the
  refresher or for any caller: callers get ``server_unavailable`` with what
  is left of it as ``retry_after_s`` (SECURITY.md item 16).
* A token goes only to the origin of the resource it was issued for (MCP:
  never to another server; RFC 8707 audience). A request elsewhere, which
  means the server's URL changed under its grant (a config file edited, the
  name kept), gets no token: the grant is marked ``login_required`` (a
  machine grant is asked for again, for the new URL).
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Final, Literal, Protocol
from urllib.parse import urlsplit

import anyio
import anyio.abc
import httpx2
import msgspec

from memorizz.api import methods as m
from memorizz.api.errors import (
    AuthRequiredError,
    InvalidParamsError,
    RemoteError,
    UnavailableError,
)
from memorizzd import redact
from memorizzd.egress.client import HardenedClient, hardened_client
from memorizzd.egress.transport import ChallengeError
from memorizzd.egress.urls import normalise_host
from memorizzd.oauth import endpoints
from memorizzd.oauth.discovery import Challenge
from memorizzd.oauth.dpop import Dpop
from memorizzd.oauth.endpoints import ClientAuth, EndpointError
from memorizzd.oauth.grant import Grant, delete_grant, load_grant, save_grant
from memorizzd.oauth.mcp_sdk import union_scopes
from memorizzd.store import StoreError
from memorizzd.telemetry.metrics import oauth_refreshed
from memorizzd.vault import CredentialStore, VaultError
from memorizzd.vault.stores import resolve_value

log = logging.getLogger("memorizzd.oauth")

RETIRED_KEPT: Final = 4
"""Tokens of replaced grants still cut out of what a server says (two grants' worth)."""

EXPIRED_SLACK_S: Final = 1.0
"""A token this close to its expiry is treated as expired (in-flight time)."""
REFRESH_TIMEOUT_S: Final = 30.0
RETRY_MAX_S: Final = 60.0
"""The longest wait between two attempts: the ceiling of the backoff, and the
cap on a token endpoint's ``Retry-After`` (one that asks for two minutes, or
a day, is asked again after a minute)."""
CALLER_RETRY_GAP_S: Final = 1.0
"""A caller waiting for a token may cut a failed refresh's backoff short, but
not below this: refresh attempts stay at most one a second whatever the rate
of calls (an authorization server having trouble is not hammered by them).
A ``Retry-After`` the token endpoint asked for is never cut short."""
MAX_STEP_UPS: Final = 2
"""Step-up logins that may ask one server for the same widened scope (bounded)."""
FORCED_HOLD_S: Final = 60.0
"""A token a 401 made us fetch is not refreshed on a 401 again this long."""

KeeperState = Literal["logged_out", "ok", "login_required"]


MAX_LIFETIME_S: Final = 365 * 86400
"""A longer ``expires_in`` is taken as a year: such a token is still renewed
now and then, and a lifetime too large for a float (``1e400`` written out)
is no crash."""


def expiry_of(expires_in: int | None, now: float) -> float | None:
    """The Unix time a token expires; None when the server did not say (or said
    something that is not a lifetime: zero or negative); at most
    ``MAX_LIFETIME_S`` from ``now``."""
    if expires_in is None or expires_in <= 0:
        return None
    return now + min(expires_in, MAX_LIFETIME_S)


_DEFAULT_PORTS: Final = {"http": 80, "https": 443}


def _origin(url: str) -> tuple[str, str, int | None]:
    """Scheme, host (lower case, no trailing dot) and port, the default one
    spelled out: what two URLs must share for a token to go from one to the
    other."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port
    except ValueError:
        port = -1  # no port at all: matches nothing real
    host = parts.hostname or ""
    if ":" not in host:  # a name (an IDN as punycode, as httpx sends it) or IPv4
        try:
            host = normalise_host(host)
        except InvalidParamsError:
            host = host.rstrip(".")  # compared as written (the guard refuses it)
    return scheme, host, port if port is not None else _DEFAULT_PORTS.get(scheme)


def _shown(url: str) -> str:
    """``scheme://host:port`` of ``url`` (never its path, query or userinfo)."""
    scheme, host, port = _origin(url)
    host = f"[{host}]" if ":" in host else host
    return f"{scheme}://{host}" + (f":{port}" if port is not None else "")


def refresh_margin(lifetime: float) -> float:
    """How long before expiry to refresh: 20% of the lifetime, at least 30 s and
    at most 5 min, never more than half the lifetime (RFC 9700 §3.2 notes)."""
    return min(max(30.0, 0.2 * lifetime), 300.0, lifetime / 2)


def http_client_for(
    spec: m.ServerSpec, allowlist: tuple[str, ...] | list[str]
) -> HardenedClient:
    """The hardened client for a server's authorization server: the same egress
    policy as the server itself, answers read rather than raised."""
    return hardened_client(
        limit=1_000_000,
        timeout=httpx2.Timeout(REFRESH_TIMEOUT_S / 2),
        allowlist=allowlist,
        allow_private_network=spec.allow_private_network,
        challenges=False,
    )


async def client_auth_of(grant: Grant, vault: CredentialStore) -> ClientAuth:
    """How a login's client authenticates for its grant's refresh or
    revocation. A client secret that is a credential store reference
    (``credential:NAME``: the grant keeps the reference) is resolved now, at
    each use; ``VaultError`` (naming the reference) when it cannot be."""
    secret = grant.client_secret
    if secret is not None:
        secret = await anyio.to_thread.run_sync(resolve_value, vault, secret)
    return ClientAuth(grant.client_id, secret, grant.auth_method)


class Acquirer(Protocol):
    """A machine grant (``oauth.machine``): a new grant without a person."""

    grant_type: m.OAuthGrantType

    def acquire(
        self, http: HardenedClient, previous: Grant | None, dpop: Dpop
    ) -> Awaitable[Grant]: ...


class TokenKeeper:
    def __init__(
        self,
        server: str,
        *,
        vault: CredentialStore,
        http: Callable[[], HardenedClient],
        clock: Callable[[], float] = time.time,
        machine: Acquirer | None = None,
    ) -> None:
        self.server = server
        self._machine = machine
        """A machine grant: no login; the keeper gets and renews tokens itself."""
        self._vault = vault
        self.dpop = Dpop(server, vault)
        """The server's DPoP key (made on first use) and nonces."""
        self._http = http
        self._clock = clock
        self.grant: Grant | None = None
        self.generation = 0
        self.retired: deque[str] = deque(maxlen=RETIRED_KEPT)
        """The tokens of the grants replaced last: a request sent with one may
        be answered after a refresh, and what it quotes back is still cut
        out (``Supervisor.hidden``)."""
        self.last_refresh: float | None = None
        self.refreshes = 0
        self.last_refresh_error: str | None = None
        self.wanted_scope: str | None = None
        """Scopes a ``403 insufficient_scope`` asked for; the next login adds them."""
        self.step_ups: dict[str, int] = {}
        """Step-up logins so far, by the scope set they asked for."""
        self._wanted_for: int | None = None
        """A refresh is asked for, to replace the grant of this generation."""
        self._failed_at = -math.inf
        """When (monotonic) the last refresh attempt failed."""
        self._held_until = -math.inf
        """Until when (monotonic) the token endpoint asked not to be asked
        again (its ``Retry-After``, at most ``RETRY_MAX_S``): no attempt
        before then, whoever asks."""
        self._forced: tuple[int, float] | None = None
        """The generation a 401 made us refresh to, and when (monotonic)."""
        self._kick = anyio.Event()
        self._done = anyio.Event()
        self._logged_in = anyio.Event()
        self._installed = anyio.Event()

    # --- state ---------------------------------------------------------------

    async def load(self) -> None:
        grant = await anyio.to_thread.run_sync(load_grant, self._vault, self.server)
        self._publish(grant)

    @property
    def state(self) -> KeeperState:
        if self.grant is None:
            return "logged_out"
        return "login_required" if self.grant.login_required else "ok"

    @property
    def logged_in(self) -> bool:
        return self.state == "ok"

    async def wait_logged_in(self) -> None:
        while not self.logged_in:
            await self._logged_in.wait()

    def status(self) -> m.AuthStatus:
        grant = self.grant
        return m.AuthStatus(
            state=self.state,
            issuer=grant.issuer if grant else None,
            client_id=grant.client_id if grant else None,
            scope=grant.scope if grant else None,
            expires_at=grant.expires_at if grant else None,
            refreshable=bool(grant and grant.refresh_token),
            last_refresh=self.last_refresh,
            refreshes=self.refreshes,
            last_refresh_error=self.last_refresh_error,
            grant=(
                "authorization_code"
                if self._machine is None
                else self._machine.grant_type
            ),
        )

    async def install(self, grant: Grant) -> None:
        """A new login's grant: stored durably, then used."""
        await anyio.to_thread.run_sync(save_grant, self._vault, self.server, grant)
        self.wanted_scope = None
        self.last_refresh_error = None
        self._publish(grant)
        installed, self._installed = self._installed, anyio.Event()
        installed.set()

    async def wait_installed(self) -> None:
        """Return at the next login."""
        await self._installed.wait()

    async def forget(self) -> None:
        """Logout: the grant is deleted from the vault and from memory."""
        await anyio.to_thread.run_sync(delete_grant, self._vault, self.server)
        self.step_ups = {}
        self.wanted_scope = None
        self._publish(None)

    def _publish(self, grant: Grant | None) -> None:
        if (old := self.grant) is not None:
            self.retired.extend(t for t in (old.access_token, old.refresh_token) if t)
        self.grant = grant
        self.generation += 1
        redact.changed()
        if self.logged_in:
            self._logged_in.set()
        elif self._logged_in.is_set():
            self._logged_in = anyio.Event()
        self._kick.set()  # the schedule changed

    def login_required_error(self) -> AuthRequiredError:
        if self._machine is not None:
            grant = self._machine.grant_type.replace("_", " ")
            return AuthRequiredError(
                f"server {self.server!r} has no access token yet: the {grant} "
                "grant failed"
                + (f" ({self.last_refresh_error})" if self.last_refresh_error else "")
                + "; the daemon keeps trying",
                reason="authorization_required",
                data={"server": self.server},
            )
        if self.grant is None:
            why = "no one has logged in"
        else:
            why = "the authorization server no longer accepts its grant"
        return AuthRequiredError(
            f"server {self.server!r} needs an OAuth login ({why}): run "
            f"`memorizzctl mcp login {self.server}`",
            reason="login_required",
            data={"server": self.server},
        )

    # --- the hot path ----------------------------------------------------------

    async def bearer(self) -> tuple[str, int]:
        grant, generation = self.grant, self.generation
        if grant is None or grant.login_required:
            raise self.login_required_error()
        if (
            grant.expires_at is not None
            and self._clock() >= grant.expires_at - EXPIRED_SLACK_S
        ):
            await self.refreshed(generation)
            grant, generation = self.grant, self.generation
            if grant is None or grant.login_required:
                raise self.login_required_error()
        return grant.access_token, generation

    async def proof(self, method: str, url: str, token: str) -> str | None:
        """A DPoP proof for one request when the grant is DPoP-bound; asked
        for every request before it is sent, so the audience is checked here:
        a request to another origin than the grant's resource is refused."""
        grant = self.grant
        if grant is None:
            return None
        if _origin(url) != _origin(grant.resource):
            raise await self._misdirected(grant, url)
        if not grant.dpop:
            return None
        return await self.dpop.proof(method, url, access_token=token)

    async def _misdirected(self, grant: Grant, url: str) -> AuthRequiredError:
        """The grant is for another server than the one now asked: it is not
        sent, and no longer used (a new login, for this server, replaces it)."""
        why = (
            f"its grant was issued for {_shown(grant.resource)}, not for {_shown(url)}"
        )
        if self.grant is grant and not grant.login_required:
            self.last_refresh_error = why
            dead = msgspec.structs.replace(grant, login_required=True)
            await self._store(dead)
            self._publish(dead)
            log.warning(
                "%s: the access token was not sent: %s; login required "
                "(memorizzctl mcp login %s)",
                self.server,
                why,
                self.server,
            )
        if self._machine is not None:
            return self.login_required_error()
        return AuthRequiredError(
            f"server {self.server!r} needs an OAuth login ({why}): run "
            f"`memorizzctl mcp login {self.server}`",
            reason="login_required",
            data={"server": self.server},
        )

    def nonce(self, url: str, value: str) -> bool:
        return self.dpop.nonce(url, value)

    async def rejected(self, generation: int, challenge: ChallengeError) -> None:
        """The server refused the token of ``generation``: a 401 gets one
        refresh (single-flight); a 403 ``insufficient_scope`` asks for a login
        with the wider scope."""
        parsed = Challenge.parse(challenge.status, challenge.www_authenticate)
        if parsed.status == 403 and parsed.error == "insufficient_scope":
            self.wanted_scope = union_scopes(self.wanted_scope, parsed.scope)
            raise AuthRequiredError(
                f"server {self.server!r} needs more scope"
                + (f" ({parsed.scope})" if parsed.scope else "")
                + f" for this: run `memorizzctl mcp login {self.server}` to grant it",
                reason="insufficient_scope",
                data={"server": self.server, "scope": parsed.scope or ""},
            )
        if parsed.status != 401:
            return
        if self._forced is not None:
            forced, at = self._forced
            if generation == forced and time.monotonic() - at < FORCED_HOLD_S:
                # Refused although fresh: another refresh would not help.
                self.last_refresh_error = (
                    "the server refuses even a freshly refreshed access token (401)"
                )
                return
        try:
            await self.refreshed(generation)
        except RemoteError:
            return  # the caller's 401 stands; the state says the rest
        if self._forced is None or self._forced[0] != self.generation:
            self._forced = (self.generation, time.monotonic())

    async def refreshed(self, seen_generation: int) -> None:
        """Return once a grant newer than ``seen_generation`` is in place
        (a refresh is asked for if none is under way); raise if it failed."""
        if self.generation != seen_generation:
            return
        now = time.monotonic()
        wait = max(self._failed_at + CALLER_RETRY_GAP_S, self._held_until) - now
        if wait > 0 and self.logged_in:  # failed just now: not asked again yet
            raise self._refresh_failed(wait)
        done = self._done
        self._wanted_for = seen_generation
        self._kick.set()
        await done.wait()
        if self.generation == seen_generation or not self.logged_in:
            if not self.logged_in:
                raise self.login_required_error()
            held = self._held_until - time.monotonic()
            raise self._refresh_failed(max(CALLER_RETRY_GAP_S, held))

    def _refresh_failed(self, retry_after_s: float) -> UnavailableError:
        """``server_unavailable``; ``retry_after_s``: when a caller may ask
        again (never zero: a wait about to end is a millisecond)."""
        return UnavailableError(
            f"server {self.server!r}: the token refresh failed: "
            f"{self.last_refresh_error}",
            data={
                "server": self.server,
                "retry_after_s": max(0.001, round(retry_after_s, 3)),
            },
        )

    # --- the refresher ----------------------------------------------------------

    def _due_in(self) -> float:
        grant = self.grant
        if self._machine is not None:
            if grant is None or grant.login_required:
                return 0.0  # no token yet: ask (the run loop backs off failures)
            if grant.expires_at is None:
                return math.inf
        elif (
            grant is None
            or grant.login_required
            or grant.expires_at is None
            or not grant.refresh_token
        ):
            return math.inf
        lifetime = max(0.0, grant.expires_at - grant.obtained_at)
        # Up to 5% earlier at random: servers logged in together do not refresh together.
        jitter = random.uniform(0.0, 0.05) * lifetime  # noqa: S311 - not cryptographic
        due = grant.expires_at - refresh_margin(lifetime) - jitter
        return max(0.0, due - self._clock())

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        await self.load()
        task_status.started()
        failures = 0
        while True:
            if not self._requested:
                with anyio.move_on_after(self._due_in()) as waited:
                    await self._kicked()
                if not waited.cancelled_caught and not self._requested:
                    continue  # the grant changed: compute the schedule again
            try:
                ok = await self._refresh_once()
            except Exception as exc:  # the refresher's supervision boundary
                log.exception("%s: token refresh failed unexpectedly", self.server)
                self._failed(f"internal error: {type(exc).__name__}")
                ok = False
            self._wanted_for = None  # its waiters are answered by this attempt
            done, self._done = self._done, anyio.Event()
            done.set()
            if ok or (not self.logged_in and self._machine is None):
                failures, self._failed_at = 0, -math.inf
                self._held_until = -math.inf
                continue
            failures += 1
            self._failed_at = time.monotonic()
            backoff = min(RETRY_MAX_S, 2.0**failures) * random.uniform(0.5, 1.0)  # noqa: S311
            held = max(0.0, self._held_until - self._failed_at)
            delay = max(backoff, held)
            with anyio.move_on_after(delay):
                # The token endpoint's Retry-After is waited out whoever asks;
                # the rest of the backoff a caller may cut short, after a gap.
                await anyio.sleep(max(held, min(delay, CALLER_RETRY_GAP_S)))
                await self._wait_for_request()

    @property
    def _requested(self) -> bool:
        return self._wanted_for is not None and self._wanted_for == self.generation

    async def _wait_for_request(self) -> None:
        while not self._requested:
            await self._kicked()

    async def _kicked(self) -> None:
        """Return at the next kick (a grant change or a refresh request)."""
        kick = self._kick
        await kick.wait()
        if self._kick is kick:
            self._kick = anyio.Event()

    async def _refresh_once(self) -> bool:
        if self._machine is not None:
            return await self._acquire_once(self._machine)
        grant = self.grant
        if grant is None or grant.login_required:
            return False
        if not grant.refresh_token:
            await self._mark_login_required(grant, "no refresh token was issued")
            return False
        with anyio.CancelScope(shield=True):
            try:
                with anyio.fail_after(REFRESH_TIMEOUT_S):
                    auth = await client_auth_of(grant, self._vault)
                    async with self._http() as http:
                        token = await endpoints.refresh(
                            http,
                            grant.token_endpoint,
                            auth,
                            refresh_token=grant.refresh_token,
                            resource=grant.resource,
                            scope=None,
                            dpop=self.dpop if grant.dpop else None,
                        )
            except EndpointError as exc:
                if exc.final:
                    await self._mark_login_required(grant, str(exc))
                else:
                    self._failed(str(exc), exc.retry_after_s)
                return False
            except TimeoutError:
                self._failed("the token endpoint did not answer in time")
                return False
            except RemoteError as exc:  # the egress policy refused the endpoint
                self._failed(exc.message)
                return False
            except VaultError as exc:  # the client secret's reference, named
                self._failed(f"credentials: the client secret: {exc}")
                return False
            now = self._clock()
            fresh = msgspec.structs.replace(
                grant,
                access_token=token.access_token,
                refresh_token=token.refresh_token or grant.refresh_token,
                expires_at=expiry_of(token.expires_in, now),
                obtained_at=now,
                scope=token.scope or grant.scope,
                dpop=token.dpop,
            )
            # Durable before use: the vault commits with synchronous=FULL.
            stored = await self._store(fresh)
        self.last_refresh = now
        self.refreshes += 1
        oauth_refreshed(self.server, "ok")
        self.last_refresh_error = (
            None if stored else "the new grant could not be stored (see the log)"
        )
        self._publish(fresh)
        log.info("%s: access token refreshed", self.server)
        return True

    async def _acquire_once(self, machine: Acquirer) -> bool:
        """A machine grant's token, asked for again (there is no refresh
        token to spend, so nothing is lost to a cancelled request)."""
        previous = self.grant
        if previous is not None and previous.login_required:
            previous = None
        with anyio.CancelScope(shield=True):
            try:
                with anyio.fail_after(REFRESH_TIMEOUT_S):
                    async with self._http() as http:
                        fresh = await machine.acquire(http, previous, self.dpop)
            except EndpointError as exc:
                self._failed(str(exc), exc.retry_after_s)
                return False
            except TimeoutError:
                self._failed("the token endpoint did not answer in time")
                return False
            except RemoteError as exc:  # discovery failed, or the egress policy
                self._failed(exc.message)
                return False
            stored = await self._store(fresh)
        self.last_refresh = fresh.obtained_at
        self.refreshes += previous is not None
        self.last_refresh_error = (
            None if stored else "the new grant could not be stored (see the log)"
        )
        self._publish(fresh)
        log.info("%s: access token obtained (%s)", self.server, fresh.grant_type)
        return True

    async def _store(self, grant: Grant) -> bool:
        """Write ``grant`` to the vault; False (logged) when that fails.

        A refreshed grant is used even when it could not be stored (a full
        disk, a vault error): the authorization server has already rotated
        the refresh token, so the old one is dead either way, and the new one
        in memory keeps the server working until the next restart, which
        will then need a login. The failure is shown in ``servers/status``.
        """
        try:
            await anyio.to_thread.run_sync(save_grant, self._vault, self.server, grant)
        except (OSError, VaultError, StoreError) as exc:
            log.error(
                "%s: the OAuth grant could not be stored: %s: %s; it is used from "
                "memory until the daemon restarts",
                self.server,
                type(exc).__name__,
                exc,
            )
            return False
        return True

    def _failed(self, why: str, retry_after_s: float | None = None) -> None:
        """A passing failure; ``retry_after_s``: the token endpoint's
        ``Retry-After`` (a 429 or 503), waited out before the next attempt,
        at most ``RETRY_MAX_S``. Without one, the backoff alone decides."""
        self.last_refresh_error = why
        oauth_refreshed(self.server, "failed")
        held = None if retry_after_s is None else min(retry_after_s, RETRY_MAX_S)
        if not held:
            self._held_until = -math.inf
            log.warning("%s: token refresh failed (will retry): %s", self.server, why)
            return
        self._held_until = time.monotonic() + held
        log.warning(
            "%s: token refresh failed (Retry-After %g s: will retry in %g s): %s",
            self.server,
            round(retry_after_s or 0.0, 1),
            round(held, 1),
            why,
        )

    async def _mark_login_required(self, grant: Grant, why: str) -> None:
        self.last_refresh_error = why
        oauth_refreshed(self.server, "login_required")
        dead = msgspec.structs.replace(grant, login_required=True)
        await self._store(dead)
        self._publish(dead)
        log.warning(
            "%s: the grant is dead (%s): login required (memorizzctl mcp login %s)",
            self.server,
            why,
            self.server,
        )
