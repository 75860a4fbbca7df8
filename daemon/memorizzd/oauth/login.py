"""Logging in a daemon: ``auth/login`` hands out the authorization URL,
``auth/complete`` takes the final callback URL back.

The operator opens the URL in any browser, anywhere. The redirect URI is a
loopback address (RFC 8252 §7.3): either ``memorizzctl mcp login`` listens
there and forwards the callback, or the browser shows an error page whose
address the operator pastes. Either way the daemon gets the full callback
URL and checks it: ``state`` must name a pending login of that server (one
use, then forgotten: a replay is refused), ``iss`` must be the issuer the
login was sent to (RFC 9207), and the PKCE verifier never left the daemon.

Client identity, in the order the MCP specification gives: the operator's
pre-registered client (``oauth_client_id``), a client ID metadata document
(``oauth_client_metadata_url``, where the authorization server supports
them), then RFC 7591 dynamic registration, kept per issuer.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
import socket
import time
from dataclasses import dataclass, field
from typing import Final
from urllib.parse import parse_qs, urlencode, urlsplit

import anyio
from pydantic import AnyUrl, ValidationError

from memorizz.api import methods as m
from memorizz.api.errors import InvalidParamsError, LoginError
from memorizz.api.spec import redirect_uri_ok
from memorizzd.egress.client import HardenedClient
from memorizzd.oauth import endpoints
from memorizzd.oauth.discovery import (
    AuthorizationServer,
    Challenge,
    check_endpoint,
    scope_to_ask,
)
from memorizzd.oauth.dpop import Dpop
from memorizzd.oauth.dpop import wanted as dpop_wanted
from memorizzd.oauth.endpoints import ClientAuth, EndpointError, printable
from memorizzd.oauth.grant import (
    Grant,
    Registration,
    load_registration,
    save_registration,
)
from memorizzd.oauth.keeper import expiry_of
from memorizzd.oauth.mcp_sdk import (
    OAuthClientMetadata,
    issuers_match,
    union_scopes,
)
from memorizzd.vault import CredentialStore

DEFAULT_REDIRECT_URI: Final = "http://127.0.0.1:33418/callback"
LOGIN_TTL_S: Final = 600.0
"""A login not completed within this long is forgotten (its verifier with it)."""
LOGIN_DEADLINE_S: Final = 30.0
"""``auth/login``'s requests together (the probe, discovery, registration),
each of them bounded on its own too (``endpoints.deadline_of``): about ten
requests in a row would otherwise hold a login for minutes."""
_PREFERRED_METHODS: Final = ("client_secret_basic", "client_secret_post", "none")


@dataclass(slots=True)
class PendingLogin:
    server: str
    state: str
    verifier: str = field(repr=False)
    redirect_uri: str
    authz: AuthorizationServer
    client: ClientAuth
    scope: str | None
    authorization_url: str
    expires: float
    """``time.monotonic()`` deadline."""
    expires_at: float
    """The same, as Unix time, for the operator."""
    kept_secret: str | None = None
    """What the grant keeps instead of the client secret it was made with:
    the secret's credential store reference (``credential:NAME``), resolved
    again at each refresh and revocation (None: the secret itself)."""


class Logins:
    """Pending logins, in memory only: a restart forgets them (log in again)."""

    def __init__(self, ttl_s: float = LOGIN_TTL_S) -> None:
        self._ttl = ttl_s
        self._by_state: dict[str, PendingLogin] = {}

    @property
    def ttl_s(self) -> float:
        return self._ttl

    def add(self, login: PendingLogin) -> None:
        """One pending login per server: a new one replaces the last."""
        self._expire()
        for state, other in list(self._by_state.items()):
            if other.server == login.server:
                del self._by_state[state]
        self._by_state[login.state] = login

    def take(self, server: str, state: str | None) -> PendingLogin:
        """The pending login ``state`` names, removed (single use)."""
        self._expire()
        login = self._by_state.get(state or "")
        if login is None or login.server != server:
            raise LoginError(
                f"no pending login of {server!r} has this state: it expired "
                f"(after {self._ttl:g} s), was already used, or belongs to "
                "another login; run `memorizzctl mcp login` again",
                reason="invalid_state",
                data={"server": server},
            )
        del self._by_state[login.state]
        return login

    def cancel(self, server: str) -> None:
        for state, other in list(self._by_state.items()):
            if other.server == server:
                del self._by_state[state]

    def _expire(self) -> None:
        now = time.monotonic()
        for state, login in list(self._by_state.items()):
            if login.expires <= now:
                del self._by_state[state]


def redirect_uri_of(spec: m.ServerSpec) -> str:
    return spec.oauth_redirect_uri or DEFAULT_REDIRECT_URI


def check_redirect_uri(uri: str) -> None:
    """Loopback ``http`` (RFC 8252 §7.3) or ``https``; nothing else, no fragment."""
    if not redirect_uri_ok(uri):
        raise InvalidParamsError(
            f"oauth_redirect_uri {uri[:200]!r}: use http://127.0.0.1:PORT/PATH "
            "(loopback) or an https URL, without a fragment"
        )


def choose_auth_method(supported: list[str] | None, *, has_secret: bool) -> str:
    """RFC 8414: absent means ``client_secret_basic``."""
    offered = supported or ["client_secret_basic"]
    for method in _PREFERRED_METHODS:
        if method in offered and (has_secret or method == "none"):
            return method
    return "none" if not has_secret else offered[0]


def select_scope(
    spec: m.ServerSpec,
    authz: AuthorizationServer,
    challenge: Challenge | None,
    *,
    previous: str | None,
    wanted: str | None,
) -> str | None:
    """The operator's ``oauth_scopes``, else the challenge's, else the
    protected resource's ``scopes_supported``, else none (MCP scope
    selection, ``scope_to_ask``); plus what was granted before and what a
    step-up challenge asked for."""
    if spec.oauth_scopes:
        scope: str | None = " ".join(spec.oauth_scopes)
    else:
        scope = scope_to_ask(challenge, authz, ["authorization_code", "refresh_token"])
    return union_scopes(union_scopes(previous, scope), wanted)


async def client_identity(
    http: HardenedClient,
    spec: m.ServerSpec,
    authz: AuthorizationServer,
    *,
    vault: CredentialStore,
    client_secret: str | None,
    redirect_uri: str,
    scope: str | None,
) -> ClientAuth:
    meta = authz.metadata
    if spec.oauth_client_id:
        method = spec.oauth_token_endpoint_auth_method or choose_auth_method(
            meta.token_endpoint_auth_methods_supported,
            has_secret=client_secret is not None,
        )
        return ClientAuth(spec.oauth_client_id, client_secret, method)
    known = await anyio.to_thread.run_sync(load_registration, vault, spec.name)
    if (
        known is not None
        and issuers_match(known.issuer, authz.issuer)
        and known.redirect_uri == redirect_uri
    ):
        return ClientAuth(known.client_id, known.client_secret, known.auth_method)
    cimd = spec.oauth_client_metadata_url
    if cimd and meta.client_id_metadata_document_supported:
        return ClientAuth(cimd, None, "none")
    if meta.registration_endpoint is None:
        raise LoginError(
            f"{authz.issuer} supports neither dynamic client registration nor "
            "client ID metadata documents here: register a client with it and "
            "set oauth_client_id (and oauth_client_secret) for this server"
        )
    method = choose_auth_method(
        meta.token_endpoint_auth_methods_supported, has_secret=True
    )
    try:
        metadata = OAuthClientMetadata(
            redirect_uris=[AnyUrl(redirect_uri)],
            client_name=f"memorizzd on {socket.gethostname()}"[:120],
            grant_types=["authorization_code", "refresh_token"],
            response_types=["code"],
            token_endpoint_auth_method=method,  # type: ignore[arg-type]
            scope=scope,
            application_type="native",
        )
    except ValidationError as exc:
        raise LoginError(
            f"cannot describe this client: {exc.errors()[0]['msg']}"
        ) from None
    check_endpoint(http, str(meta.registration_endpoint), "registration endpoint")
    try:
        info = await endpoints.register(http, str(meta.registration_endpoint), metadata)
    except EndpointError as exc:
        raise LoginError(f"dynamic client registration failed: {exc}") from None
    registered_method = info.token_endpoint_auth_method or method
    if registered_method != "none" and not info.client_secret:
        registered_method = "none"
    registration = Registration(
        issuer=authz.issuer,
        client_id=info.client_id,
        client_secret=info.client_secret,
        auth_method=registered_method,
        redirect_uri=redirect_uri,
    )
    await anyio.to_thread.run_sync(save_registration, vault, spec.name, registration)
    return ClientAuth(info.client_id, info.client_secret, registered_method)


def new_login(
    server: str,
    authz: AuthorizationServer,
    client: ClientAuth,
    *,
    redirect_uri: str,
    scope: str | None,
    ttl_s: float,
) -> PendingLogin:
    endpoint = str(authz.metadata.authorization_endpoint)
    verifier = secrets.token_urlsafe(64)  # 86 characters of [A-Za-z0-9_-]
    digest = hashlib.sha256(verifier.encode()).digest()
    challenge = base64.urlsafe_b64encode(digest).decode().rstrip("=")
    state = secrets.token_urlsafe(32)
    params = {
        "response_type": "code",
        "client_id": client.client_id,
        "redirect_uri": redirect_uri,
        "code_challenge": challenge,
        "code_challenge_method": "S256",
        "state": state,
        "resource": authz.resource,
    }
    if scope:
        params["scope"] = scope
    separator = "&" if urlsplit(endpoint).query else "?"
    return PendingLogin(
        server=server,
        state=state,
        verifier=verifier,
        redirect_uri=redirect_uri,
        authz=authz,
        client=client,
        scope=scope,
        authorization_url=endpoint + separator + urlencode(params),
        expires=time.monotonic() + ttl_s,
        expires_at=time.time() + ttl_s,
    )


def callback_params(callback_url: str) -> dict[str, str]:
    """The query of a pasted callback URL (or of a bare ``?code=...`` query)."""
    text = callback_url.strip()
    query = urlsplit(text).query if "://" in text else text.lstrip("?")
    parsed = parse_qs(query, keep_blank_values=True)
    return {key: values[0] for key, values in parsed.items() if values}


async def finish(
    http: HardenedClient,
    login: PendingLogin,
    params: dict[str, str],
    dpop: Dpop | None = None,
) -> Grant:
    """Check the callback and exchange its code; the new grant (not yet stored).

    ``dpop``: the server's DPoP key, used when the authorization server takes
    DPoP proofs (a DPoP-bound token, RFC 9449)."""
    iss = params.get("iss")
    if iss is not None:
        # RFC 9207 §2.4: simple string comparison with the issuer of the
        # metadata, as written there: no case folding, default port or
        # trailing slash is forgiven (a lookalike issuer is a mix-up attack).
        # Error responses too: one from another issuer is not this server's word.
        if iss != login.authz.issuer:
            raise LoginError(
                "the callback's iss does not name the authorization server this "
                "login was sent to (RFC 9207); refused",
                reason="invalid_state",
                data={"server": login.server},
            )
    elif login.authz.metadata.authorization_response_iss_parameter_supported:
        raise LoginError(
            "the callback carries no iss although the authorization server "
            "promises one (RFC 9207); refused",
            reason="invalid_state",
            data={"server": login.server},
        )
    if "error" in params:
        error = printable(params["error"], 64)
        description = printable(params.get("error_description", ""))
        raise LoginError(
            f"the authorization server refused the login: {error}"
            + (f" ({description})" if description else ""),
            data={"server": login.server, "error": error},
        )
    code = params.get("code")
    if not code:
        raise LoginError(
            "the callback URL holds no code; paste the full address the browser "
            "was sent to",
            data={"server": login.server},
        )
    meta = login.authz.metadata
    try:
        token = await endpoints.exchange_code(
            http,
            str(meta.token_endpoint),
            login.client,
            code=code,
            verifier=login.verifier,
            redirect_uri=login.redirect_uri,
            resource=login.authz.resource,
            dpop=dpop if dpop_wanted(login.authz.dpop_algorithms) else None,
        )
    except EndpointError as exc:
        raise LoginError(
            f"the token request failed: {exc}", data={"server": login.server}
        ) from None
    now = time.time()
    return Grant(
        access_token=token.access_token,
        refresh_token=token.refresh_token,
        expires_at=expiry_of(token.expires_in, now),
        obtained_at=now,
        scope=token.scope or login.scope,
        issuer=login.authz.issuer,
        token_endpoint=str(meta.token_endpoint),
        revocation_endpoint=str(meta.revocation_endpoint)
        if meta.revocation_endpoint
        else None,
        resource=login.authz.resource,
        client_id=login.client.client_id,
        client_secret=login.client.client_secret,
        auth_method=login.client.method,
        dpop=token.dpop,
    )
