"""Requests to an authorization server's endpoints: token, registration, revocation.

Client authentication (RFC 6749 §2.3, OAuth 2.1 §2.4): ``client_secret_basic``
(the id and secret form-encoded, then HTTP Basic), ``client_secret_post``
(both in the body), ``private_key_jwt`` (RFC 7523: a signed assertion in the
body) or ``none`` (the id in the body). Every request sends the
RFC 8707 ``resource``. An error answer becomes ``EndpointError`` carrying the
OAuth ``error`` code (``invalid_grant`` is how callers tell a dead grant from
a passing failure), a 200 whose body is an error too (some servers answer so);
one to a 429 or 503 carries its ``Retry-After`` (``retry_after_s``), which the
keeper honours.
A token answer is parsed strictly but for ``expires_in``: a lifetime that is
not a usable number (``"an hour"``, ``-5``) is unknown, never a reason to
throw away a token response, least of all one that rotated the refresh token.
Nothing here logs or formats a token, a code, a verifier or a secret, and the
server's own text (``error``, ``error_description``) is shown with the
request's secrets cut out: a server that quotes them back does not put them
in an error, a log line or ``servers/status``.
"""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Final
from urllib.parse import quote

import anyio
import httpx2
import msgspec
from pydantic import ValidationError

from memorizzd.egress.busy import BUSY_STATUSES, parse_retry_after
from memorizzd.egress.client import HardenedClient
from memorizzd.oauth import jws
from memorizzd.oauth.mcp_sdk import (
    OAuthClientInformationFull,
    OAuthClientMetadata,
    OAuthToken,
)
from memorizzd.redact import ordered, scrub

if TYPE_CHECKING:
    from memorizzd.oauth.dpop import Dpop

MAX_DESCRIPTION: Final = 200
_SECRET_FIELDS: Final = frozenset(
    {
        "code",
        "code_verifier",
        "refresh_token",
        "client_secret",
        "client_assertion",
        "assertion",
        "subject_token",
        "token",
    }
)
"""Form fields whose values are never shown, even quoted back by the server."""
_MAX_LIFETIME_DIGITS: Final = 18
AUTH_METHODS: Final = (
    "none",
    "client_secret_basic",
    "client_secret_post",
    "private_key_jwt",
)


class EndpointError(Exception):
    """The authorization server refused, or could not be understood.

    ``error`` is the OAuth error code (``invalid_grant``, ``invalid_client``,
    ...) or, for a transport failure or an unreadable answer, ``unreachable``
    / ``bad_response`` / ``server_error``. ``retry_after_s``: how long a
    429 or 503 answer asked the client to wait (its ``Retry-After``, RFC 9110
    §10.2.3, in seconds from when it was read); None when it did not say, or
    said nothing readable, and for any other answer.
    """

    def __init__(
        self, error: str, description: str, *, retry_after_s: float | None = None
    ) -> None:
        super().__init__(f"{error}: {description}" if description else error)
        self.error = error
        self.description = description
        self.retry_after_s = retry_after_s

    @property
    def final(self) -> bool:
        """Only a new login can help (the grant or the client is dead)."""
        return self.error in ("invalid_grant", "invalid_client", "unauthorized_client")


class ClientAuth(msgspec.Struct, frozen=True):
    client_id: str
    client_secret: str | None
    method: str
    private_key: str | None = None
    """``private_key_jwt``: the PEM key that signs each client assertion."""
    audience: str | None = None
    """``private_key_jwt``: the authorization server's issuer (the assertion's ``aud``)."""

    def __repr__(self) -> str:
        return f"ClientAuth(client_id={self.client_id!r}, method={self.method!r})"

    def apply(self, form: dict[str, str], headers: dict[str, str]) -> None:
        """The id is always in the body too (RFC 6749 §3.2.1 allows it; some
        servers, the SDK's among them, look for it there); the secret only
        where the method puts it; ``private_key_jwt`` a fresh signed assertion
        (RFC 7523 §2.2)."""
        form["client_id"] = self.client_id
        if self.method == "private_key_jwt" and self.private_key:
            try:
                assertion = jws.client_assertion(
                    self.private_key,
                    client_id=self.client_id,
                    audience=self.audience or "",
                )
            except jws.KeyError_ as exc:
                raise EndpointError("invalid_client_key", str(exc)) from None
            form["client_assertion_type"] = jws.ASSERTION_TYPE
            form["client_assertion"] = assertion
            return
        if self.method == "client_secret_basic" and self.client_secret is not None:
            pair = (
                f"{quote(self.client_id, safe='')}:{quote(self.client_secret, safe='')}"
            )
            headers["Authorization"] = (
                "Basic " + base64.b64encode(pair.encode()).decode()
            )
            return
        if self.method == "client_secret_post" and self.client_secret is not None:
            form["client_secret"] = self.client_secret


class Token(OAuthToken):
    """A token response; ``dpop``: the token is DPoP-bound (``token_type``
    ``DPoP``, RFC 9449 §5), presented as ``Authorization: DPoP``."""

    dpop: bool = False


class _ErrorBody(msgspec.Struct):
    error: str
    error_description: str | None = None


async def exchange_code(
    http: HardenedClient,
    token_endpoint: str,
    auth: ClientAuth,
    *,
    code: str,
    verifier: str,
    redirect_uri: str,
    resource: str,
    dpop: Dpop | None = None,
) -> Token:
    form = {
        "grant_type": "authorization_code",
        "code": code,
        "redirect_uri": redirect_uri,
        "code_verifier": verifier,
        "resource": resource,
    }
    return await _token_request(http, token_endpoint, auth, form, dpop)


async def refresh(
    http: HardenedClient,
    token_endpoint: str,
    auth: ClientAuth,
    *,
    refresh_token: str,
    resource: str,
    scope: str | None,
    dpop: Dpop | None = None,
) -> Token:
    form = {
        "grant_type": "refresh_token",
        "refresh_token": refresh_token,
        "resource": resource,
    }
    if scope:
        form["scope"] = scope
    return await _token_request(http, token_endpoint, auth, form, dpop)


async def client_credentials(
    http: HardenedClient,
    token_endpoint: str,
    auth: ClientAuth,
    *,
    resource: str,
    scope: str | None,
    dpop: Dpop | None = None,
) -> Token:
    """RFC 6749 §4.4: a token for the client itself (no user, no refresh token)."""
    form = {"grant_type": "client_credentials", "resource": resource}
    if scope:
        form["scope"] = scope
    return await _token_request(http, token_endpoint, auth, form, dpop)


JWT_BEARER: Final = "urn:ietf:params:oauth:grant-type:jwt-bearer"


async def jwt_bearer(
    http: HardenedClient,
    token_endpoint: str,
    auth: ClientAuth,
    *,
    assertion: str,
    resource: str,
    scope: str | None,
    dpop: Dpop | None = None,
) -> Token:
    """RFC 7523 §2.1: a token for the subject of ``assertion`` (a JWT from
    the workload's identity provider; workload identity federation, SEP-1933)."""
    form = {"grant_type": JWT_BEARER, "assertion": assertion, "resource": resource}
    if scope:
        form["scope"] = scope
    return await _token_request(http, token_endpoint, auth, form, dpop)


TOKEN_EXCHANGE: Final = "urn:ietf:params:oauth:grant-type:token-exchange"  # noqa: S105
ID_TOKEN: Final = "urn:ietf:params:oauth:token-type:id_token"  # noqa: S105
ID_JAG: Final = "urn:ietf:params:oauth:token-type:id-jag"


class _Exchanged(msgspec.Struct):
    access_token: str
    issued_token_type: str


async def exchange_token(
    http: HardenedClient,
    token_endpoint: str,
    auth: ClientAuth | None,
    *,
    subject_token: str,
    audience: str,
    resource: str,
    scope: str | None,
    subject_token_type: str = ID_TOKEN,
    requested_token_type: str = ID_JAG,
) -> str:
    """RFC 8693 §2.1 at the enterprise identity provider: ``subject_token``
    (an ID token) for an Identity Assertion JWT Authorization Grant, for the
    authorization server ``audience`` and the MCP server ``resource``
    (draft-ietf-oauth-identity-assertion-authz-grant §4.3; SEP-990 §4).
    The answer must say it issued what was asked (``issued_token_type``);
    its ``token_type`` is ``N_A``, not a token to present anywhere."""
    form = {
        "grant_type": TOKEN_EXCHANGE,
        "requested_token_type": requested_token_type,
        "audience": audience,
        "resource": resource,
        "subject_token": subject_token,
        "subject_token_type": subject_token_type,
    }
    if scope:
        form["scope"] = scope
    headers = {"Accept": "application/json"}
    if auth is not None:  # else an identity provider that takes the ID token alone
        auth.apply(form, headers)
    response = await _send(http, "POST", token_endpoint, data=form, headers=headers)
    if response.status_code != 200:
        raise _error_of(response, "token exchange", _secrets_of(form, headers, auth))
    try:
        answer = msgspec.json.decode(_unmarked(response.content), type=_Exchanged)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        raise EndpointError(
            "bad_response", "the token exchange answer is not a token exchange response"
        ) from None
    if answer.issued_token_type != requested_token_type:
        raise EndpointError(
            "bad_response",
            "the identity provider issued "
            f"{printable(answer.issued_token_type, 80)!r}, not an ID-JAG",
        )
    if not answer.access_token or answer.access_token.count(".") != 2:
        raise EndpointError("bad_response", "the ID-JAG issued is not a JWT")
    return answer.access_token


async def _token_request(
    http: HardenedClient,
    url: str,
    auth: ClientAuth,
    form: dict[str, str],
    dpop: Dpop | None = None,
) -> Token:
    """POST ``form``; with ``dpop``, a proof on the request and, when the
    server answers ``use_dpop_nonce`` (RFC 9449 §8), once more with its nonce."""
    for attempt in range(2):
        headers = {"Accept": "application/json"}
        body = dict(form)
        auth.apply(body, headers)  # a fresh client assertion each time
        if dpop is not None:
            headers["DPoP"] = await dpop.proof("POST", url)
        response = await _send(http, "POST", url, data=body, headers=headers)
        nonce = response.headers.get("dpop-nonce")
        fresh = dpop is not None and nonce is not None and dpop.nonce(url, nonce)
        hidden = _secrets_of(body, headers, auth)
        if response.status_code == 200:
            break
        error = _error_of(response, "token", hidden)
        if not (attempt == 0 and fresh and error.error == "use_dpop_nonce"):
            raise error
    return _token_of(response.content, dpop_sent=dpop is not None, secrets=hidden)


def _token_of(
    content: bytes, *, dpop_sent: bool, secrets: tuple[str, ...] = ()
) -> Token:
    """A Bearer token, or a DPoP-bound one when a proof was sent."""
    try:
        raw = msgspec.json.decode(_unmarked(content))
        if (
            isinstance(raw, dict)
            and "access_token" not in raw
            and isinstance(raw.get("error"), str)
        ):  # an error answer, with status 200
            raise _oauth_error(raw["error"], raw.get("error_description"), secrets)
        if isinstance(raw, dict) and "expires_in" in raw:
            raw["expires_in"] = _lifetime(raw["expires_in"])
        bound = (
            isinstance(raw, dict)
            and isinstance(raw.get("token_type"), str)
            and raw["token_type"].lower() == "dpop"
        )
        if bound and not dpop_sent:
            raise EndpointError(
                "bad_response", "the token endpoint issued a DPoP token unasked"
            )
        if bound:  # pydantic takes only token_type Bearer (any case)
            raw = {**raw, "token_type": "Bearer", "dpop": True}
        elif isinstance(raw, dict):
            raw.pop("dpop", None)
        token = Token.model_validate(raw)
    except (msgspec.DecodeError, ValidationError, RecursionError):
        raise EndpointError(
            "bad_response", "the token endpoint's answer is not a token response"
        ) from None
    if not _visible(token.access_token):
        raise EndpointError(
            "bad_response",
            "the token endpoint issued an empty or malformed access token",
        )
    return token


_BOM: Final = b"\xef\xbb\xbf"


def _unmarked(content: bytes) -> bytes:
    """The body without a leading UTF-8 byte order mark, which a JSON parser
    may ignore (RFC 8259 §8.1) and some servers send: a token answer is not
    thrown away for it (a refresh that rotated would cost the grant)."""
    return content.removeprefix(_BOM)


def _visible(token: str) -> bool:
    """Printable ASCII without spaces: what an ``Authorization`` header can
    carry as a token (RFC 6750 §2.1 is stricter still)."""
    return bool(token) and token.isascii() and token.isprintable() and " " not in token


def _lifetime(value: object) -> int | None:
    """``expires_in`` as a number of seconds, or None (unknown): an integer,
    a float (cut to whole seconds) or a string of digits; anything else (a
    boolean, text, a negative string) is unknown. How large it may be is the
    keeper's business (``expiry_of``)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value)  # JSON has no NaN or infinity; msgspec refuses them
    if isinstance(value, str) and value.isascii() and value.isdigit():
        if len(value) > _MAX_LIFETIME_DIGITS:
            return 10**_MAX_LIFETIME_DIGITS
        return int(value)
    return None


async def register(
    http: HardenedClient, url: str, metadata: OAuthClientMetadata
) -> OAuthClientInformationFull:
    """RFC 7591 dynamic client registration."""
    body = metadata.model_dump(by_alias=True, mode="json", exclude_none=True)
    response = await _send(
        http, "POST", url, json=body, headers={"Accept": "application/json"}
    )
    if response.status_code not in (200, 201):
        raise _error_of(response, "registration")
    try:
        raw = msgspec.json.decode(_unmarked(response.content))
        if isinstance(raw, dict):
            raw.pop("issuer", None)  # our binding, never the server's word
        return OAuthClientInformationFull.model_validate(raw)
    except (msgspec.DecodeError, ValidationError, RecursionError):
        raise EndpointError(
            "bad_response", "the registration endpoint's answer is not a client"
        ) from None


async def revoke(
    http: HardenedClient,
    url: str,
    auth: ClientAuth,
    *,
    token: str,
    hint: str,
    secret_in_body: bool = False,
) -> None:
    """RFC 7009: the server answers 200 for any token, known or not."""
    form = {"token": token, "token_type_hint": hint}
    headers: dict[str, str] = {}
    auth.apply(form, headers)
    if secret_in_body and auth.client_secret is not None:
        form["client_secret"] = auth.client_secret
    response = await _send(http, "POST", url, data=form, headers=headers)
    if response.status_code != 200:
        raise _error_of(response, "revocation", _secrets_of(form, headers, auth))


async def get_json(http: HardenedClient, url: str) -> httpx2.Response:
    """A metadata GET (the caller reads status and body)."""
    return await _send(
        http,
        "GET",
        url,
        headers={"Accept": "application/json", "MCP-Protocol-Version": "2025-11-25"},
    )


async def _send(
    http: HardenedClient, method: str, url: str, **kwargs: object
) -> httpx2.Response:
    """One request and its whole answer within the client's read timeout
    (``deadline_of``): httpx's timeouts are per read, so a server that drips
    its body a byte at a time would otherwise hold the login for as long as
    it likes."""
    within = deadline_of(http)
    try:
        with anyio.fail_after(within):
            response = await http.request(method, url, **kwargs)  # type: ignore[arg-type]
            await response.aread()
        return response
    except TimeoutError:
        raise EndpointError(
            "unreachable", f"no complete answer from {_origin(url)} within {within} s"
        ) from None
    except httpx2.TimeoutException:
        raise EndpointError("unreachable", f"no answer from {_origin(url)}") from None
    except httpx2.HTTPError as exc:
        raise EndpointError(
            "unreachable", f"{_origin(url)}: {type(exc).__name__}"
        ) from None


def deadline_of(http: HardenedClient) -> float | None:
    """How long one request to an authorization server may take, whole."""
    return http.timeout.read


def _error_of(
    response: httpx2.Response, endpoint: str, secrets: tuple[str, ...] = ()
) -> EndpointError:
    try:
        body = msgspec.json.decode(_unmarked(response.content), type=_ErrorBody)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        kind = "server_error" if response.status_code >= 500 else "bad_response"
        error = EndpointError(
            kind, f"the {endpoint} endpoint answered {response.status_code}"
        )
    else:
        error = _oauth_error(body.error, body.error_description, secrets)
    if response.status_code in BUSY_STATUSES:
        error.retry_after_s = parse_retry_after(response.headers.get("retry-after"))
    return error


def _oauth_error(
    error: str, description: object, secrets: tuple[str, ...]
) -> EndpointError:
    """An OAuth error answer (RFC 6749 §5.2), its text cleaned: the request's
    secrets cut out first (before cutting to length: no half secret stays),
    then printable characters only."""
    said = description if isinstance(description, str) else ""
    return EndpointError(
        printable(scrub(error, secrets), 64) or "bad_response",
        printable(scrub(said, secrets)),
    )


def _secrets_of(
    form: dict[str, str], headers: dict[str, str], auth: ClientAuth | None
) -> tuple[str, ...]:
    """What a request carried that must never be shown: the secret form
    fields, the client secret and the HTTP Basic credentials, longest first."""
    found = {value for key, value in form.items() if key in _SECRET_FIELDS and value}
    if auth is not None and auth.client_secret:
        found.add(auth.client_secret)
        found.add(quote(auth.client_secret, safe=""))
    basic = headers.get("Authorization", "")
    if basic.startswith("Basic "):
        found.add(basic.removeprefix("Basic "))
    return ordered(found)


def printable(text: str, limit: int = MAX_DESCRIPTION) -> str:
    """Server-controlled text (an OAuth ``error``, its description), made safe
    to show: printable characters only, at most ``limit`` of them."""
    return "".join(ch if ch.isprintable() else "?" for ch in text[:limit])


def _origin(url: str) -> str:
    try:
        parsed = httpx2.URL(url)
    except (httpx2.InvalidURL, TypeError):
        return "the authorization server"
    return f"{parsed.scheme}://{parsed.host}" + (
        f":{parsed.port}" if parsed.port else ""
    )
