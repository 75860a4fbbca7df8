"""The one hardened HTTP client factory: every request the daemon sends goes
through a client made here (MCP Streamable HTTP and SSE; later OAuth).

The layers, outermost first:

1. ``HardenedClient`` (an ``httpx2.AsyncClient``): no redirects followed, no
   proxy or TLS settings from the environment (``trust_env=False``); a URL's
   scheme is judged before httpx reads a host-less URL (``file:``,
   ``javascript:``) as a path, and a URL httpx cannot parse is refused by the
   policy with its reason (``https://0177.0.0.1/``: ``address_not_allowed``).
2. ``CappedTransport`` (``egress/limits.py``): response bodies counted raw
   against the server's ``max_result_bytes``.
3. ``RefusalReplies``: a refused MCP request fails alone, with its reason.
4. ``BearerTransport`` (OAuth servers only): the current access token.
5. ``GuardTransport``: the URL policy per request; no 3xx, no content coding.
6. ``PinnedTransport`` + ``PinnedBackend``: resolve, check every address,
   connect to the checked address; TLS verifies the URL's host name.
"""

from __future__ import annotations

import functools
import ssl
from collections.abc import Callable, Sequence
from typing import Any

import httpx2

from memorizz.api.errors import InvalidParamsError
from memorizzd.egress.backend import Network, PinnedBackend
from memorizzd.egress.limits import CappedTransport
from memorizzd.egress.replies import RefusalReplies
from memorizzd.egress.transport import (
    BearerSource,
    BearerTransport,
    GuardTransport,
    PinnedTransport,
)
from memorizzd.egress.urls import check_scheme, check_url

DEFAULT_NETWORK = Network()
"""The system's resolver, sockets and CA store (tests substitute their own)."""


def hardened_client(
    *,
    limit: int,
    timeout: httpx2.Timeout,
    allowlist: Sequence[str],
    allow_private_network: bool,
    headers: dict[str, str] | None = None,
    auth: httpx2.Auth | None = None,
    bearer: BearerSource | None = None,
    challenges: bool = True,
    network: Network | None = None,
    wrap: Callable[[httpx2.AsyncBaseTransport], httpx2.AsyncBaseTransport]
    | None = None,
) -> HardenedClient:
    """An HTTP client for one upstream, under the egress policy.

    ``bearer``: an OAuth token source for every request. ``challenges=False``
    (the OAuth client's own requests) hands 401/403 answers back as responses.
    ``wrap``: an outermost transport layer that sees what the caller will see
    (the legacy SSE stream's endpoint check, ``upstream/sse.py``).
    """
    network = network or DEFAULT_NETWORK
    backend = PinnedBackend(
        network, allowlist=allowlist, allow_private_network=allow_private_network
    )
    pinned = PinnedTransport(backend, network.ssl_context or system_ssl_context())
    guarded: httpx2.AsyncBaseTransport = GuardTransport(
        pinned,
        allowlist=allowlist,
        allow_private_network=allow_private_network,
        challenges=challenges,
    )
    if bearer is not None:
        guarded = BearerTransport(guarded, bearer)
    outer: httpx2.AsyncBaseTransport = CappedTransport(RefusalReplies(guarded), limit)
    return HardenedClient(
        allowlist=allowlist,
        allow_private_network=allow_private_network,
        headers=headers,
        auth=auth,
        timeout=timeout,
        follow_redirects=False,
        max_redirects=0,
        trust_env=False,
        transport=outer if wrap is None else wrap(outer),
    )


class HardenedClient(httpx2.AsyncClient):
    """httpx reads a URL without a host (``file:///etc/passwd``,
    ``javascript:x``) as a path relative to ``base_url``, so the transport
    would see ``/etc/passwd``; its scheme is judged here first and refused as
    such (``scheme_not_allowed``). The full URL policy runs per request, in
    ``GuardTransport``; here only for a URL httpx cannot parse (a server's
    ``resource_metadata`` of ``https://0177.0.0.1/`` or ``https://ⓛocalhost/``),
    which must be refused with its reason, not fail as an internal error."""

    def __init__(
        self,
        *,
        allowlist: Sequence[str],
        allow_private_network: bool,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self._allowlist = tuple(allowlist)
        self._private = allow_private_network

    def check(self, url: str) -> None:
        """The policy's verdict on a request to ``url``, now, without a
        connection: for a URL the daemon will send to later (an OAuth token
        endpoint at ``auth/complete``). Raises as ``GuardTransport`` would."""
        check_scheme(url)
        check_url(url, allowlist=self._allowlist, allow_private_network=self._private)

    def _merge_url(self, url: httpx2.URL | str) -> httpx2.URL:
        # httpx2's one funnel for request URLs (build_request, stream); private,
        # but pinned, and test_egress_client covers it.
        check_scheme(str(url))
        try:
            return super()._merge_url(url)
        except httpx2.InvalidURL as exc:
            check_url(
                str(url), allowlist=self._allowlist, allow_private_network=self._private
            )
            raise InvalidParamsError(f"the url cannot be sent: {exc}"[:300]) from None


@functools.cache
def system_ssl_context() -> ssl.SSLContext:
    """The system's trust anchors, never ``SSL_CERT_FILE``/``SSL_CERT_DIR``;
    built once (loading the CA store is slow), shared by every client."""
    return httpx2.create_ssl_context(verify=True, trust_env=False)
