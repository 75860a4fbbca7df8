"""How a talk with an upstream fails, whatever speaks it (our stdio client or the SDK).

SDK-free: a host with only stdio servers never imports the MCP SDK, and these
are the failures its sessions raise. ``session.py`` (the SDK adapter, HTTP
transports) maps the SDK's exceptions onto the same classes.
"""

from __future__ import annotations

from typing import Any, Final, Literal

from memorizz.api.errors import (
    AuthRequiredError,
    DeadlineExceededError,
    PermissionDeniedError,
    RemoteError,
    TooLargeError,
    UpstreamError,
)
from memorizzd.egress.oversize import TOO_LARGE_MARKER

CONNECTION_CLOSED: Final = -32000
"""The SDK's code for a request failed by a closed connection."""
REQUEST_TIMEOUT: Final = -32001
METHOD_NOT_FOUND: Final = -32601
"""JSON-RPC's code for a method the server does not have."""
URL_ELICITATION_REQUIRED: Final = -32042
"""MCP's code for a request that waits for the user to open a URL first;
its ``data.elicitations`` say which (the MCP face passes it on as it is)."""


class ConnectionLost(Exception):
    """The transport to the upstream broke; the session must be rebuilt."""


class Unsent(ConnectionLost):
    """The session must be rebuilt, and the request was not run: it may be
    sent again on the next session (``actor.Upstream.request``, once)."""


class SessionExpired(Unsent):
    """The server no longer knows the session (HTTP 404 for its id): the
    session must be rebuilt, and the request was not run (``expired.py``)."""


FailureKind = Literal[
    "authorization_required",
    "login_required",
    "unreachable",
    "refused_by_policy",
    "tls_error",
    "timeout",
    "upstream_error",
]
"""Why a connect failed, as ``servers/test`` reports it."""


def leaves(exc: BaseException) -> list[BaseException]:
    """The leaf exceptions of ``exc`` (itself unless it is a group)."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in leaves(inner)]
    return [exc]


def chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and what caused it (``__cause__``/``__context__``), bounded."""
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and len(seen) < 16 and current not in seen:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def classify(
    found: list[BaseException], remote: list[RemoteError], *, tls: bool = False
) -> FailureKind:
    """A failed connect's kind, from its leaf exceptions and the errors of ours
    among (or translated from) them; ``tls``: a TLS handshake failed among them
    (HTTP only: ``session.py`` knows, and this module imports no ``ssl``)."""
    auth = [r for r in remote if isinstance(r, AuthRequiredError)]
    if any(r.reason == "login_required" for r in auth):
        return "login_required"
    if auth:
        return "authorization_required"
    if any(isinstance(r, PermissionDeniedError) for r in remote):
        return "refused_by_policy"
    if tls:
        return "tls_error"
    if any(isinstance(r, DeadlineExceededError) for r in remote) or any(
        isinstance(leaf, TimeoutError) for leaf in found
    ):
        return "timeout"
    if any(isinstance(r, UpstreamError) for r in remote):
        return "upstream_error"
    return "unreachable"


def failure_kind(exc: BaseException) -> FailureKind:
    """Classify a failed connect of a session of ours (no SDK involved)."""
    found = leaves(exc) or [exc]
    remote = [leaf for leaf in found if isinstance(leaf, RemoteError)]
    if isinstance(exc, RemoteError):
        remote.insert(0, exc)
    return classify(found, remote)


def rpc_error(
    code: int, message: str, data: Any, *, server: str
) -> RemoteError | ConnectionLost:
    """A JSON-RPC error from (or synthesized for) the upstream, as ours."""
    if code == CONNECTION_CLOSED and data != TOO_LARGE_MARKER:
        return ConnectionLost("connection closed")
    if code == REQUEST_TIMEOUT:
        return DeadlineExceededError(f"{server}: the request timed out")
    if data == TOO_LARGE_MARKER:
        return TooLargeError(f"{server}: {message}", data={"server": server})
    said: dict[str, Any] = {"server": server, "upstream_code": code}
    if data is not None:  # the server's own details (MCP's error ``data``)
        said["upstream_data"] = data
    return UpstreamError(f"{server}: {message}", data=said)


def not_honored(server: str, uri: str) -> UpstreamError:
    """A 2026-07-28 server's listen stream acknowledged without ``uri``: it
    takes no subscription to it (the face then does not acknowledge it either)."""
    return UpstreamError(
        f"{server}: the server takes no subscription to {uri[:200]!r}",
        data={"server": server, "uri": uri[:200]},
    )


def malformed_result(server: str, method: str, said: str) -> UpstreamError:
    """A result to ``method`` that is not what MCP says it is (``said``: why)."""
    return UpstreamError(
        f"{server}: the server sent a malformed result to {method} ({said[:200]})",
        data={"server": server},
    )
