"""The operator's OAuth actions: ``auth/login``, ``auth/complete``, ``auth/logout``.

The broker hands each one the server's spec and its ``TokenKeeper``; this
module runs discovery and the endpoints through the hardened client, keeps
the pending logins, and gives the keeper its new grant (or takes it away).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Literal

import anyio
import msgspec

from memorizz.api import methods as m
from memorizz.api.errors import (
    DeadlineExceededError,
    InvalidParamsError,
    LoginError,
    RemoteError,
)
from memorizzd.egress.client import HardenedClient
from memorizzd.oauth import endpoints
from memorizzd.oauth.discovery import challenge_of, discover
from memorizzd.oauth.endpoints import ClientAuth, EndpointError
from memorizzd.oauth.keeper import (
    MAX_STEP_UPS,
    TokenKeeper,
    client_auth_of,
    http_client_for,
)
from memorizzd.oauth.login import (
    LOGIN_DEADLINE_S,
    LOGIN_TTL_S,
    Logins,
    callback_params,
    check_redirect_uri,
    client_identity,
    finish,
    new_login,
    redirect_uri_of,
    select_scope,
)
from memorizzd.oauth.mcp_sdk import union_scopes
from memorizzd.vault import CredentialStore, VaultError
from memorizzd.vault.server_secrets import oauth_client_secret_ref
from memorizzd.vault.stores import resolve_value

log = logging.getLogger("memorizzd.oauth")


class OAuthService:
    def __init__(
        self,
        vault: CredentialStore,
        allowlist: Sequence[str],
        *,
        login_ttl_s: float = LOGIN_TTL_S,
    ) -> None:
        self._vault = vault
        self._allowlist = tuple(allowlist)
        self._logins = Logins(login_ttl_s)

    def reconfigure(self, allowlist: Sequence[str]) -> None:
        """A reload's host allowlist, for every request from now on (a login
        under way keeps its state; its next request is checked anew)."""
        self._allowlist = tuple(allowlist)

    async def login(
        self, spec: m.ServerSpec, keeper: TokenKeeper, redirect_uri: str | None
    ) -> m.AuthLoginResult:
        url = _oauth_url(spec)
        if spec.oauth_grant != "authorization_code":
            raise InvalidParamsError(
                f"server {spec.name!r} uses the {spec.oauth_grant} grant: no one "
                "logs in; the daemon gets its tokens itself (see servers/status)",
                data={"server": spec.name},
            )
        redirect = redirect_uri or redirect_uri_of(spec)
        check_redirect_uri(redirect)
        wanted = keeper.wanted_scope
        if wanted is not None:
            # Bounded step-up: the same widened scope is asked for at most
            # MAX_STEP_UPS times; a server that keeps refusing what it was
            # granted is not helped by another login.
            previous = keeper.grant.scope if keeper.grant else None
            key = " ".join(sorted(set((union_scopes(previous, wanted) or "").split())))
            asked = keeper.step_ups.get(key, 0)
            if asked >= MAX_STEP_UPS:
                raise LoginError(
                    f"server {spec.name!r} still refuses after {asked} logins that "
                    f"asked for scope {key!r}; not asking again (log out to reset)",
                    data={"server": spec.name},
                )
            keeper.step_ups[key] = asked + 1
        configured, client_secret = await anyio.to_thread.run_sync(
            self._client_secret, spec
        )
        step = "asking the server for its challenge"
        try:
            with anyio.fail_after(LOGIN_DEADLINE_S):
                async with http_client_for(spec, self._allowlist) as http:
                    challenge = await challenge_of(http, url, spec.transport)
                    step = "discovering its authorization server"
                    authz = await discover(http, url, challenge)
                    previous = keeper.grant.scope if keeper.grant else None
                    scope = select_scope(
                        spec, authz, challenge, previous=previous, wanted=wanted
                    )
                    step = f"getting a client identity from {authz.issuer}"
                    client = await client_identity(
                        http,
                        spec,
                        authz,
                        vault=self._vault,
                        client_secret=client_secret,
                        redirect_uri=redirect,
                        scope=scope,
                    )
        except TimeoutError:
            raise DeadlineExceededError(
                f"the authorization server of {spec.name!r} is unreachable or too "
                f"slow: discovery and registration did not finish within "
                f"{LOGIN_DEADLINE_S:g} s (stopped while {step}); try again later",
                data={"server": spec.name, "timeout_s": LOGIN_DEADLINE_S},
            ) from None
        login = new_login(
            spec.name,
            authz,
            client,
            redirect_uri=redirect,
            scope=scope,
            ttl_s=self._logins.ttl_s,
        )
        if configured is not None and configured != client_secret:
            login.kept_secret = configured  # a reference: kept, not its value
        self._logins.add(login)
        log.info("%s: login started with %s", spec.name, authz.issuer)
        return m.AuthLoginResult(
            server=spec.name,
            authorization_url=login.authorization_url,
            redirect_uri=redirect,
            issuer=authz.issuer,
            scope=scope,
            expires_at=login.expires_at,
        )

    async def complete(
        self, spec: m.ServerSpec, keeper: TokenKeeper, callback_url: str
    ) -> m.AuthCompleteResult:
        _oauth_url(spec)
        if len(callback_url) > 8192:
            raise InvalidParamsError("callback_url is longer than 8192 characters")
        params = callback_params(callback_url)
        login = self._logins.take(spec.name, params.get("state"))
        async with http_client_for(spec, self._allowlist) as http:
            grant = await finish(http, login, params, keeper.dpop)
        if login.kept_secret is not None:
            # The grant keeps the reference, never the value it stands for
            # (the state database holds no credential store's secret); each
            # refresh and the revocation resolve it again.
            grant = msgspec.structs.replace(grant, client_secret=login.kept_secret)
        await keeper.install(grant)
        log.info("%s: logged in with %s", spec.name, grant.issuer)
        return m.AuthCompleteResult(server=spec.name, auth=keeper.status())

    async def logout(
        self, spec: m.ServerSpec, keeper: TokenKeeper
    ) -> m.AuthLogoutResult:
        _oauth_url(spec)
        self._logins.cancel(spec.name)
        grant = keeper.grant
        outcome: Literal["revoked", "not_supported", "failed", "nothing_to_revoke"]
        if grant is None:
            outcome, message = "nothing_to_revoke", "there was no grant"
        elif grant.revocation_endpoint is None:
            outcome = "not_supported"
            message = (
                "the authorization server offers no revocation endpoint (RFC 7009)"
            )
        else:
            outcome, message = "revoked", "refresh and access token revoked"
            tokens = [(grant.access_token, "access_token")]
            if grant.refresh_token:
                tokens.insert(0, (grant.refresh_token, "refresh_token"))
            try:
                auth = await client_auth_of(grant, self._vault)
                async with http_client_for(spec, self._allowlist) as http:
                    for token, hint in tokens:
                        await _revoke(
                            http, grant.revocation_endpoint, auth, token, hint
                        )
            except EndpointError as exc:
                outcome, message = "failed", f"revocation failed: {exc}"
            except RemoteError as exc:  # the egress policy refused the endpoint
                outcome, message = "failed", f"revocation failed: {exc.message}"
            except VaultError as exc:  # its message names the reference
                outcome, message = "failed", f"revocation failed: credentials: {exc}"
        await keeper.forget()
        log.info("%s: logged out (%s)", spec.name, outcome)
        return m.AuthLogoutResult(server=spec.name, revocation=outcome, message=message)

    def _client_secret(self, spec: m.ServerSpec) -> tuple[str | None, str | None]:
        """The pre-registered client's secret as configured (inline in the
        config file, else from the vault when the spec says there is one, ""
        once stored) and the value it stands for: a credential store
        reference (``credential:NAME``) resolved. A reference that cannot be
        resolved fails the login, naming the reference."""
        if not spec.oauth_client_id or spec.oauth_client_secret is None:
            return None, None
        configured = spec.oauth_client_secret
        if not configured:
            try:
                configured = self._vault.get(oauth_client_secret_ref(spec.name))
            except VaultError as exc:
                raise LoginError(
                    f"server {spec.name!r}: its client secret cannot be read ({exc}); "
                    "remove the server and add it again with --client-secret",
                    data={"server": spec.name},
                ) from None
        try:
            return configured, resolve_value(self._vault, configured)
        except VaultError as exc:  # its message names the reference
            raise LoginError(
                f"server {spec.name!r}: its client secret cannot be read "
                f"(credentials: {exc})",
                data={"server": spec.name},
            ) from None


async def _revoke(
    http: HardenedClient, url: str, auth: ClientAuth, token: str, hint: str
) -> None:
    """RFC 7009 with the client's token endpoint method; a server that refuses
    HTTP Basic there (the MCP SDK 2.3's revocation route reads the secret only
    from the body, and still checks Basic) gets the secret in both places."""
    try:
        await endpoints.revoke(http, url, auth, token=token, hint=hint)
    except EndpointError as exc:
        if auth.method != "client_secret_basic" or exc.error not in (
            "invalid_request",
            "invalid_client",
            "unauthorized_client",
        ):
            raise
        await endpoints.revoke(
            http, url, auth, token=token, hint=hint, secret_in_body=True
        )


def _oauth_url(spec: m.ServerSpec) -> str:
    if spec.auth != "oauth" or spec.url is None:
        raise InvalidParamsError(
            f"server {spec.name!r} does not use OAuth (its auth is {spec.auth!r});"
            ' to log in, give it auth = "oauth":'
            f" `memorizzctl mcp remove {spec.name}`, then"
            f" `memorizzctl mcp add {spec.name} --url URL --oauth`"
            " (a server of the config file: in its [[servers]] entry)",
            data={"server": spec.name},
        )
    return spec.url
