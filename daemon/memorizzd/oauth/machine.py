"""Grants for machines: the client credentials grant (RFC 6749 §4.4, MCP's
``io.modelcontextprotocol/oauth-client-credentials`` extension, SEP-1046).

No person logs in: the daemon asks the authorization server for a token with
the pre-registered client's credentials, ``client_secret_basic``,
``client_secret_post`` or ``private_key_jwt`` (a key from the vault). The
token keeper calls ``ClientCredentials.acquire`` when there is no token, ahead
of expiry and on a 401: the same background schedule, single flight and
durable write as a user's refresh. The secret and the key are read from the
vault (a credential store reference resolved) at each request and never kept
in the grant, a log line or an error.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import anyio
import msgspec

from memorizz.api import methods as m
from memorizzd.egress.client import HardenedClient
from memorizzd.oauth import endpoints
from memorizzd.oauth.discovery import challenge_of, discover, scope_to_ask
from memorizzd.oauth.dpop import Dpop
from memorizzd.oauth.dpop import wanted as dpop_wanted
from memorizzd.oauth.endpoints import ClientAuth, EndpointError
from memorizzd.oauth.grant import Grant
from memorizzd.oauth.keeper import expiry_of
from memorizzd.oauth.mcp_sdk import (
    build_oauth_authorization_server_metadata_discovery_urls,
    issuers_match,
)
from memorizzd.vault import CredentialStore, VaultError
from memorizzd.vault.server_secrets import (
    oauth_assertion_ref,
    oauth_client_secret_ref,
    oauth_idp_client_secret_ref,
    oauth_private_key_ref,
    oauth_subject_token_ref,
)
from memorizzd.vault.stores import resolve_value

_PREFERRED = ("client_secret_basic", "client_secret_post")


class ClientCredentials:
    """The acquirer the keeper of a ``client_credentials`` server holds."""

    def __init__(self, spec: m.ServerSpec, vault: CredentialStore) -> None:
        if spec.url is None or not spec.oauth_client_id:
            raise ValueError("a client_credentials server needs a URL and a client")
        self._spec = spec
        self._url: str = spec.url
        self._client_id: str = spec.oauth_client_id
        self._vault = vault

    async def acquire(
        self, http: HardenedClient, previous: Grant | None, dpop: Dpop
    ) -> Grant:
        """A new grant (not yet stored); ``EndpointError`` if refused.

        The first time, the authorization server is discovered as for a login
        (protected resource metadata, RFC 8414), without the browser's checks;
        later, the previous grant's endpoint, resource and scope are reused.
        A DPoP-bound token is asked for when the authorization server takes
        DPoP proofs (``oauth.dpop``)."""
        spec = self._spec
        secret, key = await anyio.to_thread.run_sync(self._credentials)
        if previous is not None:
            issuer, token_endpoint = previous.issuer, previous.token_endpoint
            resource, scope = previous.resource, _scope_asked(spec, previous.scope)
            method = previous.auth_method
            bind = previous.dpop
        else:
            challenge = await challenge_of(http, self._url, spec.transport)
            authz = await discover(http, self._url, challenge, interactive=False)
            meta = authz.metadata
            issuer, token_endpoint = authz.issuer, str(meta.token_endpoint)
            resource = authz.resource
            scope = (
                " ".join(spec.oauth_scopes)
                if spec.oauth_scopes
                else scope_to_ask(challenge, authz, ["client_credentials"])
            )
            method = _method(spec, meta.token_endpoint_auth_methods_supported, key)
            bind = dpop_wanted(authz.dpop_algorithms)
        auth = ClientAuth(
            self._client_id, secret, method, private_key=key, audience=issuer
        )
        token = await self._token(
            http,
            token_endpoint,
            auth,
            issuer=issuer,
            resource=resource,
            scope=scope,
            dpop=dpop if bind else None,
        )
        now = time.time()
        return Grant(
            access_token=token.access_token,
            refresh_token=None,
            expires_at=expiry_of(token.expires_in, now),
            obtained_at=now,
            scope=token.scope or scope,
            issuer=issuer,
            token_endpoint=token_endpoint,
            revocation_endpoint=None,
            resource=resource,
            client_id=self._client_id,
            client_secret=None,
            auth_method=method,
            grant_type=self.grant_type,
            dpop=token.dpop,
        )

    grant_type: m.OAuthGrantType = "client_credentials"

    async def _token(
        self,
        http: HardenedClient,
        token_endpoint: str,
        auth: ClientAuth,
        *,
        issuer: str,
        resource: str,
        scope: str | None,
        dpop: Dpop | None,
    ) -> endpoints.Token:
        return await endpoints.client_credentials(
            http, token_endpoint, auth, resource=resource, scope=scope, dpop=dpop
        )

    def _credentials(self) -> tuple[str | None, str | None]:
        """The client secret and the private key: inline (a config file's
        server, in memory only), else from the vault when the spec says there
        is one ("" once stored)."""
        spec = self._spec
        return (
            self._secret(spec.oauth_client_secret, oauth_client_secret_ref, "secret"),
            self._secret(spec.oauth_private_key, oauth_private_key_ref, "private key"),
        )

    def _secret(
        self, inline: str | None, ref: Callable[[str], str], what: str
    ) -> str | None:
        """Inline (a config file's server) or from the vault; a credential
        store reference (``credential:NAME``) resolved, afresh for each token
        request. A reference that cannot be resolved fails the request, naming
        the reference (never a value), as a static secret fails a connect."""
        if inline is None:
            return None
        value = inline
        if not value:
            try:
                value = self._vault.get(ref(self._spec.name))
            except VaultError as exc:
                raise EndpointError(
                    "invalid_client",
                    f"the client {what} cannot be read from the vault "
                    f"({type(exc).__name__}); add the server again",
                ) from None
        try:
            return resolve_value(self._vault, value)
        except VaultError as exc:  # its message names the reference
            raise EndpointError("credentials", f"the client {what}: {exc}") from None


class JwtBearer(ClientCredentials):
    """The JWT bearer grant (RFC 7523 §2.1; workload identity federation,
    SEP-1933): the workload's JWT, from a file read at each request (its
    platform rotates it) or from the vault, exchanged for an access token.
    The client authenticates as configured, or not at all (``none``) when it
    has no secret or key. Renewed like client credentials, with the
    assertion of the moment; a refusal is reported, not worked around."""

    grant_type: m.OAuthGrantType = "jwt_bearer"

    async def _token(
        self,
        http: HardenedClient,
        token_endpoint: str,
        auth: ClientAuth,
        *,
        issuer: str,
        resource: str,
        scope: str | None,
        dpop: Dpop | None,
    ) -> endpoints.Token:
        assertion = await anyio.to_thread.run_sync(self._assertion)
        return await endpoints.jwt_bearer(
            http,
            token_endpoint,
            auth,
            assertion=assertion,
            resource=resource,
            scope=scope,
            dpop=dpop,
        )

    def _assertion(self) -> str:
        spec = self._spec
        if spec.oauth_assertion_file is not None:
            try:
                with open(spec.oauth_assertion_file, encoding="ascii") as file:
                    text = file.read(MAX_ASSERTION + 1).strip()
            except (OSError, UnicodeDecodeError) as exc:
                raise EndpointError(
                    "invalid_assertion",
                    f"the assertion file cannot be read ({type(exc).__name__})",
                ) from None
            if not text or len(text) > MAX_ASSERTION:
                raise EndpointError(
                    "invalid_assertion", "the assertion file is empty or too large"
                )
            return text
        value = self._secret(spec.oauth_assertion, oauth_assertion_ref, "assertion")
        if not value:
            raise EndpointError("invalid_assertion", "no assertion is configured")
        return value


MAX_ASSERTION = 64 * 1024


class TokenExchange(JwtBearer):
    """Enterprise-managed authorization (SEP-990; the ``io.modelcontextprotocol/
    enterprise-managed-authorization`` extension): the ID token of the
    operator's single sign-on, from a file read at each exchange or from the
    vault, exchanged at the enterprise identity provider (RFC 8693) for an
    ID-JAG whose audience is the authorization server's issuer and whose
    resource is the MCP server; the ID-JAG is then presented with the JWT
    bearer grant (RFC 7523), the client authenticating as configured. A new
    ID-JAG for every token: it lives minutes and is never stored. The
    identity provider's token endpoint is configured, or discovered from its
    issuer (OpenID Connect discovery, RFC 8414; the ``issuer`` must match)."""

    grant_type: m.OAuthGrantType = "token_exchange"

    def __init__(self, spec: m.ServerSpec, vault: CredentialStore) -> None:
        super().__init__(spec, vault)
        self._idp: tuple[str, list[str] | None] | None = (
            None
            if spec.oauth_idp_token_endpoint is None
            else (spec.oauth_idp_token_endpoint, None)
        )

    async def _token(
        self,
        http: HardenedClient,
        token_endpoint: str,
        auth: ClientAuth,
        *,
        issuer: str,
        resource: str,
        scope: str | None,
        dpop: Dpop | None,
    ) -> endpoints.Token:
        subject, idp_secret = await anyio.to_thread.run_sync(self._exchange_inputs)
        if self._idp is None:
            self._idp = await _idp_token_endpoint(http, self._spec.oauth_idp_issuer)
        idp_endpoint, offered = self._idp
        client_id = self._spec.oauth_idp_client_id
        idp_auth = (
            None
            if client_id is None
            else ClientAuth(client_id, idp_secret, _idp_method(idp_secret, offered))
        )
        id_jag = await endpoints.exchange_token(
            http,
            idp_endpoint,
            idp_auth,
            subject_token=subject,
            audience=issuer,
            resource=resource,
            scope=scope,
        )
        return await endpoints.jwt_bearer(
            http,
            token_endpoint,
            auth,
            assertion=id_jag,
            resource=resource,
            scope=scope,
            dpop=dpop,
        )

    def _exchange_inputs(self) -> tuple[str, str | None]:
        """The ID token of the moment and the identity provider client's secret."""
        spec = self._spec
        if spec.oauth_subject_token_file is not None:
            subject = _read_jwt(spec.oauth_subject_token_file, "subject token")
        else:
            subject = (
                self._secret(
                    spec.oauth_subject_token, oauth_subject_token_ref, "subject token"
                )
                or ""
            )
            if not subject:
                raise EndpointError(
                    "invalid_subject_token", "no subject token is configured"
                )
        secret = self._secret(
            spec.oauth_idp_client_secret,
            oauth_idp_client_secret_ref,
            "identity provider secret",
        )
        return subject, secret


class _IdpMetadata(msgspec.Struct):
    issuer: str
    token_endpoint: str
    token_endpoint_auth_methods_supported: list[str] | None = None


async def _idp_token_endpoint(
    http: HardenedClient, issuer: str | None
) -> tuple[str, list[str] | None]:
    """The identity provider's token endpoint and client authentication
    methods, from its metadata (RFC 8414 and OpenID Connect discovery URLs,
    in the MCP specification's order); its ``issuer`` must be ``issuer``."""
    if issuer is None:
        raise EndpointError("invalid_request", "no identity provider is configured")
    try:
        urls = build_oauth_authorization_server_metadata_discovery_urls(issuer, issuer)
    except ValueError:  # urljoin: "https://idp.example//[" passes urlsplit, not urljoin
        raise EndpointError(
            "invalid_request", "the identity provider's issuer is not a usable URL"
        ) from None
    for url in urls:
        response = await endpoints.get_json(http, url)
        if response.status_code >= 500:
            raise EndpointError(
                "server_error",
                f"the identity provider's metadata answered {response.status_code}",
            )
        if response.status_code != 200:
            continue
        try:
            meta = msgspec.json.decode(response.content, type=_IdpMetadata)
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
            continue
        try:
            same = issuers_match(meta.issuer, issuer)
        except ValueError:  # urlparse: "https://idp.exampl].com" is no URL
            same = False
        if not same:
            raise EndpointError(
                "bad_response",
                "the identity provider's metadata names another issuer "
                "(RFC 8414 §3.3); refused",
            )
        return meta.token_endpoint, meta.token_endpoint_auth_methods_supported
    raise EndpointError(
        "bad_response", "the identity provider's metadata was not found at its issuer"
    )


def _idp_method(secret: str | None, offered: list[str] | None) -> str:
    """``none`` without a secret; else what the identity provider offers
    (RFC 8414: absent means basic)."""
    if secret is None:
        return "none"
    for method in _PREFERRED:
        if method in (offered or ["client_secret_basic"]):
            return method
    return "client_secret_basic"


def _read_jwt(path: str, what: str) -> str:
    """A JWT from a file the platform (or a sign-in) keeps fresh; read afresh."""
    reason = f"invalid_{what.replace(' ', '_')}"
    try:
        with open(path, encoding="ascii") as file:
            text = file.read(MAX_ASSERTION + 1).strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise EndpointError(
            reason, f"the {what} file cannot be read ({type(exc).__name__})"
        ) from None
    if not text or len(text) > MAX_ASSERTION:
        raise EndpointError(reason, f"the {what} file is empty or too large")
    return text


def _method(spec: m.ServerSpec, supported: list[str] | None, key: str | None) -> str:
    """The operator's choice, else ``private_key_jwt`` with a key, else what
    the authorization server offers (RFC 8414: absent means basic)."""
    if spec.oauth_token_endpoint_auth_method:
        return spec.oauth_token_endpoint_auth_method
    if key is not None:
        return "private_key_jwt"
    if (
        spec.oauth_grant in ("jwt_bearer", "token_exchange")
        and spec.oauth_client_secret is None
    ):
        return "none"  # the assertion authenticates the workload
    offered = supported or ["client_secret_basic"]
    for method in _PREFERRED:
        if method in offered:
            return method
    return "client_secret_basic"


def _scope_asked(spec: m.ServerSpec, granted: str | None) -> str | None:
    return " ".join(spec.oauth_scopes) if spec.oauth_scopes else granted
