"""Finding a server's authorization server (MCP authorization, 2025-06-18 and 2025-11-25).

1. The challenge: an unauthenticated request to the MCP endpoint; a 401 (or
   403) ``WWW-Authenticate`` may name ``resource_metadata`` and ``scope``.
2. RFC 9728 protected resource metadata: the challenge's URL, then
   ``/.well-known/oauth-protected-resource/<path>``, then the root. Its
   ``resource`` must cover the server's URL; its first authorization server
   is used. No metadata anywhere: the 2025-03-26 fallback, the server's origin
   (its RFC 8414 metadata there, else the default ``/authorize``, ``/token``
   and ``/register`` endpoints).
3. RFC 8414 / OpenID Connect discovery for that issuer, in the order the MCP
   specification gives; the metadata's ``issuer`` must equal it exactly.
4. PKCE: an authorization server that does not list ``S256`` in
   ``code_challenge_methods_supported`` is refused (MCP 2025-11-25); so is
   an authorization endpoint the operator's browser would open over plain
   http anywhere but loopback (or any other scheme).
5. The token endpoint, which the daemon sends to later, is judged by the
   egress policy now, with the reason the request would be refused for: a
   login is refused before the operator goes through the browser, not at
   ``auth/complete``. (The revocation endpoint is judged at logout only: a
   login that works must not fail over it.)
"""

from __future__ import annotations

import re
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import urlsplit

import anyio
import httpx2
import msgspec
from pydantic import ValidationError

from memorizz.api.errors import LoginError, RemoteError
from memorizz.api.spec import LOOPBACK_HOSTS
from memorizzd.egress.client import HardenedClient
from memorizzd.egress.urls import without_trailing_dot
from memorizzd.oauth.endpoints import EndpointError, deadline_of, get_json, printable
from memorizzd.oauth.mcp_sdk import (
    OAuthMetadata,
    ProtectedResourceMetadata,
    build_oauth_authorization_server_metadata_discovery_urls,
    build_protected_resource_metadata_discovery_urls,
    check_resource_allowed,
    get_client_metadata_scopes,
    issuers_match,
    resource_url_from_server_url,
)

_AUTH_PARAM = re.compile(
    r'([!#$%&\'*+.^_`|~0-9A-Za-z-]+)[ \t]*=[ \t]*(?:"((?:[^"\\]++|\\.)*+)"|([^\s,"]*))',
    re.DOTALL,
)
"""One ``name=value`` auth-param (RFC 9110 §11.2): a token, or a quoted
string (matched whole, so a parameter quoted inside another's value is
never taken for one)."""
_QUOTED_PAIR = re.compile(r"\\(.)", re.DOTALL)
_SHELL_UNSAFE = re.compile(r"""[#$`;()|'"!*\\<>{}\s]|[^\x21-\x7e]""")


@dataclass(frozen=True, slots=True)
class Challenge:
    """What a ``WWW-Authenticate: Bearer ...`` header says (RFC 6750, RFC 9728)."""

    status: int
    resource_metadata: str | None = None
    scope: str | None = None
    error: str | None = None

    @classmethod
    def parse(cls, status: int, header: str | None) -> Challenge:
        if not header:
            return cls(status)
        return cls(
            status,
            resource_metadata=_param(header, "resource_metadata"),
            scope=_param(header, "scope"),
            error=_param(header, "error"),
        )


@dataclass(frozen=True, slots=True)
class AuthorizationServer:
    """Everything a login needs to know about where to log in."""

    resource: str
    """The RFC 8707 resource indicator for this server."""
    issuer: str
    metadata: OAuthMetadata
    resource_metadata: ProtectedResourceMetadata | None
    dpop_algorithms: tuple[str, ...] = ()
    """RFC 9449 §5.1 ``dpop_signing_alg_values_supported`` (the SDK's model
    drops it): DPoP-bound tokens are asked for when it holds ES256."""


def _param(header: str, name: str) -> str | None:
    """The first ``name`` parameter of the header's challenges (names are
    case-insensitive; a quoted value is unescaped)."""
    for match in _AUTH_PARAM.finditer(header):
        if match.group(1).lower() == name:
            quoted = match.group(2)
            return match.group(3) if quoted is None else _QUOTED_PAIR.sub(r"\1", quoted)
    return None


async def challenge_of(
    http: HardenedClient, server_url: str, transport: str
) -> Challenge | None:
    """Ask the MCP endpoint without a token; its challenge, if it sends one.

    Only the answer's head is read (a server that answers with an event
    stream it keeps open is not waited for), within the OAuth requests'
    deadline."""
    if transport == "sse":
        method, body, accept = "GET", None, "text/event-stream"
    else:
        method = "POST"
        body = b'{"jsonrpc":"2.0","id":"memorizz-auth-probe","method":"ping"}'
        accept = "application/json, text/event-stream"
    headers = {"Accept": accept}
    if body is not None:
        headers["Content-Type"] = "application/json"
    status, header = 0, None
    try:
        with anyio.move_on_after(deadline_of(http)):
            async with http.stream(
                method, server_url, content=body, headers=headers
            ) as response:
                status, header = (
                    response.status_code,
                    response.headers.get("www-authenticate"),
                )
    except httpx2.HTTPError:
        return None  # the metadata requests below will say what is wrong
    if status in (401, 403):
        return Challenge.parse(status, header)
    return None


async def discover(
    http: HardenedClient,
    server_url: str,
    challenge: Challenge | None,
    *,
    interactive: bool = True,
) -> AuthorizationServer:
    """The authorization server for ``server_url``, checked; ``LoginError`` if none.

    ``interactive``: a login through a browser (PKCE S256 and a safe
    authorization endpoint required); else a machine grant (token endpoint only)."""
    # The server as the allowlist matched it and TLS verified it: one
    # trailing dot is no other resource (``urls.without_trailing_dot``).
    server_url = without_trailing_dot(server_url)
    expected_resource = resource_url_from_server_url(server_url)
    prm = await _resource_metadata(
        http, server_url, challenge.resource_metadata if challenge else None
    )
    if prm is not None:
        issuer = str(prm.authorization_servers[0])
        resource = str(prm.resource)
        try:
            urls = build_oauth_authorization_server_metadata_discovery_urls(
                issuer, server_url
            )
        except ValueError:  # urljoin: "https://a//[" passes pydantic, not urllib
            raise LoginError(
                f"the protected resource metadata names authorization server "
                f"{printable(issuer)!r}, which is not a usable URL; refused"
            ) from None
    else:
        parsed = httpx2.URL(server_url)
        issuer = f"{parsed.scheme}://{parsed.netloc.decode()}"
        resource = expected_resource
        urls = build_oauth_authorization_server_metadata_discovery_urls(
            None, server_url
        )
    found = await _server_metadata(http, urls, issuer)
    dpop_algorithms: tuple[str, ...] = ()
    if found is not None:
        metadata, written_issuer, dpop_algorithms = found
    elif prm is None:
        # MCP 2025-03-26 §2.3.3: a server without any metadata has the
        # default endpoints at its origin (that revision made PKCE a MUST).
        metadata, written_issuer = _fallback_metadata(issuer), issuer
    else:
        raise LoginError(
            f"no authorization server metadata found for {issuer} "
            "(tried RFC 8414 and OpenID Connect discovery)"
        )
    # A machine grant (``interactive=False``) uses the token endpoint only:
    # no browser, no authorization endpoint, no PKCE.
    if interactive:
        if "S256" not in (metadata.code_challenge_methods_supported or []):
            raise LoginError(
                f"the authorization server {issuer} does not advertise PKCE S256 "
                "(code_challenge_methods_supported); refusing to log in without it"
            )
        check_authorization_endpoint(str(metadata.authorization_endpoint))
    check_endpoint(http, str(metadata.token_endpoint), "token endpoint")
    return AuthorizationServer(
        resource=resource,
        issuer=written_issuer,
        metadata=metadata,
        resource_metadata=prm,
        dpop_algorithms=dpop_algorithms,
    )


def scope_to_ask(
    challenge: Challenge | None,
    authz: AuthorizationServer,
    grant_types: list[str],
) -> str | None:
    """MCP scope selection (2025-11-25): the challenge's ``scope``, else every
    ``scopes_supported`` of the protected resource metadata, else none (the
    parameter is omitted). Never the authorization server's own
    ``scopes_supported``, which the SDK falls back to: that is every scope
    the server knows, the omnibus request scope minimisation rules out.
    ``offline_access`` is added where the server lists it and refresh tokens
    are wanted (SEP-2207)."""
    chosen = challenge.scope if challenge is not None else None
    prm = authz.resource_metadata
    if not chosen and prm is not None and prm.scopes_supported:
        chosen = " ".join(prm.scopes_supported)
    if not chosen or not chosen.strip():
        return None
    return get_client_metadata_scopes(chosen, None, authz.metadata, grant_types)


def check_authorization_endpoint(url: str) -> None:
    """The URL the operator will open: https, or http on loopback (a local
    test server); never ``javascript:``, ``file:`` or anything else; no
    fragment (RFC 6749 §3.1) and none of the characters a shell acts on, so
    that the URL printed for the operator is plain text wherever it is pasted
    (``https://login.example/a;$(id)``)."""
    try:
        parts = urlsplit(url)
    except ValueError:  # "https://[x": an unclosed IPv6 bracket
        parts = urlsplit("")
    loopback = parts.scheme == "http" and (parts.hostname or "") in LOOPBACK_HOSTS
    if not (parts.scheme == "https" or loopback) or not parts.netloc:
        raise LoginError(
            f"the authorization endpoint {url[:200]!r} is not an https URL; refused"
        )
    unsafe = sorted(set(_SHELL_UNSAFE.findall(url)))
    if unsafe:
        raise LoginError(
            f"the authorization endpoint of {parts.scheme}://{parts.netloc[:100]} "
            f"contains {', '.join(repr(c) for c in unsafe)}: a fragment or "
            "characters a shell would act on; refused"
        )


def check_endpoint(http: HardenedClient, url: str, what: str) -> None:
    """An endpoint of the authorization server (``what``), judged by the
    egress policy of ``http`` without a connection; refused with the reason
    (``host_not_allowed``, ``address_not_allowed``, ``scheme_not_allowed``
    ...) and the words a request to it would get."""
    try:
        http.check(url)
    except RemoteError as exc:
        raise type(exc)(
            f"the authorization server's {what} is refused: {exc.message}",
            reason=exc.reason,
            data=exc.data,
        ) from None


M = TypeVar("M", ProtectedResourceMetadata, OAuthMetadata)


class _Issuer(msgspec.Struct):
    issuer: str
    dpop_signing_alg_values_supported: object = None


async def _documents(
    http: HardenedClient,
    urls: list[str],
    kind: type[M],
    what: str,
    unreadable: list[str] | None = None,
) -> AsyncGenerator[tuple[str, M, bytes], None]:
    """Each URL's metadata document that parses, in order; a URL that is not
    there (4xx), unreachable or unreadable is skipped (``unreadable`` gets what
    was wrong with a document that was there); a 5xx stops discovery (it says
    nothing about where the metadata is)."""
    for url in urls:
        try:
            response = await get_json(http, url)
        except EndpointError:
            continue
        if response.status_code >= 500:
            raise LoginError(
                f"{what} at {url} answered {response.status_code}; try again later"
            )
        if response.status_code != 200:
            continue
        try:
            document = kind.model_validate_json(response.content)
        except ValidationError as exc:
            if unreadable is not None:
                unreadable.append(f"{url}: {_first_problem(exc)}")
            continue
        yield url, document, response.content


def _first_problem(exc: ValidationError) -> str:
    """``field: what is wrong`` (pydantic's words, never the document's value)."""
    error = exc.errors(include_url=False, include_input=False)[0]
    where = ".".join(str(part) for part in error["loc"]) or "the document"
    return printable(f"{where}: {error['msg']}")


async def _resource_metadata(
    http: HardenedClient, server_url: str, hinted: str | None
) -> ProtectedResourceMetadata | None:
    expected = resource_url_from_server_url(server_url)
    mismatched: str | None = None
    urls = build_protected_resource_metadata_discovery_urls(hinted, server_url)
    documents = _documents(
        http, urls, ProtectedResourceMetadata, "protected resource metadata"
    )
    async with aclosing(documents):
        async for _, prm, _raw in documents:
            if check_resource_allowed(expected, str(prm.resource)):
                return prm
            mismatched = str(prm.resource)  # RFC 9728 §3.3: not this server's
    if mismatched is not None:
        raise LoginError(
            f"the protected resource metadata names resource {mismatched!r}, "
            f"not this server ({expected}); refusing it"
        )
    return None


def _fallback_metadata(origin: str) -> OAuthMetadata:
    """The 2025-03-26 default endpoints: /authorize, /token, /register."""
    return OAuthMetadata.model_validate(
        {
            "issuer": origin,
            "authorization_endpoint": f"{origin}/authorize",
            "token_endpoint": f"{origin}/token",
            "registration_endpoint": f"{origin}/register",
            "response_types_supported": ["code"],
            "code_challenge_methods_supported": ["S256"],
        }
    )


async def _server_metadata(
    http: HardenedClient, urls: list[str], issuer: str
) -> tuple[OAuthMetadata, str, tuple[str, ...]] | None:
    """The metadata and its ``issuer`` exactly as the document writes it (what
    an authorization response's ``iss`` is compared with, RFC 9207 §2.4)."""
    unreadable: list[str] = []
    documents = _documents(
        http, urls, OAuthMetadata, "authorization server metadata", unreadable
    )
    async with aclosing(documents):
        async for url, metadata, raw in documents:
            if not issuers_match(str(metadata.issuer), issuer):
                raise LoginError(
                    f"authorization server metadata at {url} names issuer "
                    f"{str(metadata.issuer)!r}, not {issuer!r} (RFC 8414 §3.3); refused"
                )
            try:
                written = msgspec.json.decode(raw, type=_Issuer)
            except msgspec.DecodeError:  # pydantic reads NaN, msgspec does not
                unreadable.append(f"{url}: not valid JSON")
                continue
            listed = written.dpop_signing_alg_values_supported
            algs = tuple(
                alg
                for alg in (listed if isinstance(listed, list) else ())
                if isinstance(alg, str)
            )
            return metadata, written.issuer, algs
    if unreadable:
        raise LoginError(
            f"the authorization server metadata of {issuer} is not usable "
            f"({unreadable[0]}); refused"
        )
    return None
