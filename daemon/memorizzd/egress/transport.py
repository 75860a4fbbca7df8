"""The httpx transports of the hardened client: the policy per request and the pin.

* ``GuardTransport`` checks every request's URL (``check_url``: the SDK may
  build URLs of its own, from an SSE ``endpoint`` event or, later, OAuth
  metadata), asks for ``Accept-Encoding: identity`` and refuses what comes
  back as a redirect (any 3xx: ``redirect_blocked``) or with a content coding
  (a compressed body is never inflated: a gzip bomb stays a few kilobytes on
  the wire and is dropped). A host name's trailing dot is dropped from the
  request (SNI, certificate check, ``Host``). An authentication challenge (401, or 403 with
  ``WWW-Authenticate``) becomes ``ChallengeError`` (``authorization_required``,
  holding the header for the OAuth layer), so a wrong or missing token is named
  as such instead of surfacing as the SDK's generic error. The OAuth client's
  own requests (token, registration, revocation endpoints) turn this off: a 401
  from a token endpoint is an answer to read (``invalid_client``). It raises ``RemoteError`` subclasses;
  ``replies.py`` turns them into answers for the one MCP request.
* ``PinnedTransport`` is httpx's own transport over an httpcore connection
  pool whose ``network_backend`` is the ``PinnedBackend``.
"""

from __future__ import annotations

import re
import ssl
from collections.abc import Sequence
from typing import Protocol

import httpcore2
import httpx2

from memorizz.api.errors import (
    AuthRequiredError,
    PermissionDeniedError,
    UpstreamError,
)
from memorizzd.egress.backend import PinnedBackend
from memorizzd.egress.urls import check_url
from memorizzd.telemetry.metrics import egress_refused

_IDENTITY = ("", "identity")


class GuardTransport(httpx2.AsyncBaseTransport):
    def __init__(
        self,
        inner: httpx2.AsyncBaseTransport,
        *,
        allowlist: Sequence[str],
        allow_private_network: bool,
        challenges: bool = True,
    ) -> None:
        self._inner = inner
        self._allowlist = tuple(allowlist)
        self._private = allow_private_network
        self._challenges = challenges

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        try:
            return await self._guarded(request)
        except PermissionDeniedError as exc:  # the URL, the address, a redirect
            egress_refused(exc.reason)
            raise

    async def _guarded(self, request: httpx2.Request) -> httpx2.Response:
        checked = check_url(
            str(request.url),
            allowlist=self._allowlist,
            allow_private_network=self._private,
        )
        if request.url.host.endswith("."):
            _drop_trailing_dot(request)
        request.headers["Accept-Encoding"] = "identity"
        response = await self._inner.handle_async_request(request)
        status = response.status_code
        if 300 <= status < 400:
            location = _location(request, response.headers.get("location"))
            await response.aclose()
            raise PermissionDeniedError(
                f"redirect_blocked: {checked.host} answered {status}{location}; "
                "redirects are never followed (use the final URL as the server's url)",
                reason="redirect_blocked",
                data={"status": status},
            )
        if self._challenges and is_challenge(response):
            await response.aclose()
            raise ChallengeError(
                status,
                response.headers.get("www-authenticate"),
                response.headers.get("dpop-nonce"),
            )
        coding = response.headers.get("content-encoding", "").strip().lower()
        if coding not in _IDENTITY:
            await response.aclose()
            raise UpstreamError(
                f"{checked.host} sent a compressed body (Content-Encoding: "
                f"{coding[:40]}) although identity was asked for; refused unread"
            )
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


def _drop_trailing_dot(request: httpx2.Request) -> None:
    """``api.example.com.`` goes out as ``api.example.com``: the name the
    allowlist matched, and the only form SNI, a certificate and a server's
    ``Host`` check know."""
    request.url = request.url.copy_with(host=request.url.host[:-1])
    request.headers["Host"] = request.url.netloc.decode("ascii")


def is_challenge(response: httpx2.Response) -> bool:
    """A 401, or a 403 that carries ``WWW-Authenticate`` (RFC 6750 ``insufficient_scope``)."""
    status = response.status_code
    return status == 401 or (status == 403 and "www-authenticate" in response.headers)


class ChallengeError(AuthRequiredError):
    """The server answered with an authentication challenge.

    ``www_authenticate`` (the raw header, server-controlled input) stays in the
    daemon: the OAuth layer reads ``resource_metadata``, ``scope`` and
    ``error`` from it; it is never put on the wire.
    """

    def __init__(
        self,
        status: int,
        www_authenticate: str | None,
        dpop_nonce: str | None = None,
    ) -> None:
        super().__init__(
            f"authorization required: the server answered {status}",
            data={"status": status},
        )
        self.status = status
        self.www_authenticate = www_authenticate
        self.dpop_nonce = dpop_nonce
        """RFC 9449 §9: the ``DPoP-Nonce`` the server wants in the next proof."""


class BearerSource(Protocol):
    """Where ``BearerTransport`` gets its token (the OAuth token keeper)."""

    async def bearer(self) -> tuple[str, int]:
        """The access token to send and its generation; raises ``AuthRequiredError``
        (``login_required``) when there is none."""
        ...

    async def rejected(self, generation: int, challenge: ChallengeError) -> None:
        """The server refused the token of ``generation`` with ``challenge``."""
        ...

    async def proof(self, method: str, url: str, token: str) -> str | None:
        """A DPoP proof for this request when ``token`` is DPoP-bound (RFC 9449
        §7), else None (a Bearer token)."""
        ...

    def nonce(self, url: str, value: str) -> bool:
        """The server at ``url`` supplied a ``DPoP-Nonce``; True if it is new."""
        ...


class BearerTransport(httpx2.AsyncBaseTransport):
    """Puts the current access token on every request (never a stale copy:
    a refreshed token is used from the next request on) and reports a
    challenge to the keeper, which refreshes once before the error goes on.

    A DPoP-bound token (RFC 9449) goes as ``Authorization: DPoP`` with a fresh
    proof in ``DPoP``; a ``use_dpop_nonce`` challenge that brings a new
    ``DPoP-Nonce`` sends the request once more with it (§9), and a nonce on
    any answer is kept for the next proof."""

    def __init__(self, inner: httpx2.AsyncBaseTransport, source: BearerSource) -> None:
        self._inner = inner
        self._source = source

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        token, generation = await self._source.bearer()
        url = str(request.url)
        for attempt in range(2):
            proof = await self._source.proof(request.method, url, token)
            if proof is None:
                request.headers["Authorization"] = f"Bearer {token}"
            else:
                request.headers["Authorization"] = f"DPoP {token}"
                request.headers["DPoP"] = proof
            try:
                response = await self._inner.handle_async_request(request)
            except ChallengeError as exc:
                if (
                    proof is not None
                    and attempt == 0
                    and exc.dpop_nonce is not None
                    and _asks_nonce(exc.www_authenticate)
                    and self._source.nonce(url, exc.dpop_nonce)
                ):
                    continue
                await self._source.rejected(generation, exc)
                raise
            if proof is not None and (nonce := response.headers.get("dpop-nonce")):
                self._source.nonce(url, nonce)
            return response
        raise AssertionError("unreachable")  # pragma: no cover

    async def aclose(self) -> None:
        await self._inner.aclose()


class PinnedTransport(httpx2.AsyncHTTPTransport):
    """``AsyncHTTPTransport`` with the pool rebuilt around ``backend``.

    httpx does not expose ``network_backend``; its transport's request and
    exception mapping is what we want, so only the pool is replaced (the
    end-to-end tests prove the dial goes through the backend).
    """

    def __init__(self, backend: PinnedBackend, ssl_context: ssl.SSLContext) -> None:
        super().__init__(verify=ssl_context, trust_env=False)
        limits = httpx2.Limits(max_connections=100, max_keepalive_connections=20)
        self._pool = httpcore2.AsyncConnectionPool(
            ssl_context=ssl_context,
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=backend,
        )


def _asks_nonce(www_authenticate: str | None) -> bool:
    """``WWW-Authenticate: DPoP error="use_dpop_nonce"`` (RFC 9449 §9)."""
    return bool(www_authenticate and _USE_DPOP_NONCE.search(www_authenticate))


_USE_DPOP_NONCE = re.compile(r'\berror="?use_dpop_nonce"?', re.IGNORECASE)


def _location(request: httpx2.Request, location: str | None) -> str:
    """`` (to <where>)`` without userinfo, query or fragment, or nothing."""
    if not location:
        return ""
    try:
        target = request.url.join(location)
        shown = target.copy_with(userinfo=b"", query=None, fragment=None)
    except (httpx2.InvalidURL, ValueError, TypeError):
        return " (to an unreadable location)"
    return f" (to {str(shown)[:200]})"
