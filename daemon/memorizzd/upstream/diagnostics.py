"""The diagnosis behind ``servers/test``: one honest connection test.

``ok`` only after a fresh ``tools/list``; anything else is a failure kind
(``errors.FailureKind``, the result's ``outcome``) with the facts behind it:
the message, the error's ``reason``, the server's auth mode and where it is
configured. What to do about it is the client's to say (``memorizzctl`` keys
its hints by outcome, in ``memorizz.ctl.render``).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import anyio

from memorizz.api import methods as m
from memorizz.api.errors import (
    AuthRequiredError,
    DeadlineExceededError,
    PermissionDeniedError,
    RemoteError,
    UnavailableError,
)
from memorizzd.upstream import errors

if TYPE_CHECKING:
    from memorizzd.upstream.actor import Upstream


async def diagnose(upstream: Upstream, timeout_s: float | None) -> m.ServersTestResult:
    """Test ``upstream``'s connection within ``timeout_s`` (at most its own).

    A server that is not connected is not waited for past the connect
    wait: in backoff or failed, the recorded failure is the answer.
    """
    timeout = upstream.timeout_for(timeout_s)
    deadline = anyio.current_time() + timeout
    keeper = upstream.keeper
    if keeper is not None and not keeper.logged_in:
        error = keeper.login_required_error()
        return failed(upstream, "login_required", error.message, error.reason)
    if not upstream.connected and upstream.state == "connecting":
        with anyio.move_on_after(timeout):
            await upstream.wait_settled()
    if not upstream.connected:
        if upstream.state == "connecting":
            return failed(upstream, "timeout", "still connecting")
        return failed(
            upstream,
            upstream.last_failure or "unreachable",
            upstream.last_error or f"not connected ({upstream.state})",
        )
    started = time.perf_counter()
    try:
        with anyio.fail_after(max(0.0, deadline - anyio.current_time())):
            tools = await upstream.list_tools(refresh=True)
    except TimeoutError:
        return failed(upstream, "timeout", "no answer within the deadline")
    except AuthRequiredError as exc:
        kind: errors.FailureKind = (
            "login_required"
            if exc.reason == "login_required"
            else "authorization_required"
        )
        return failed(upstream, kind, exc.message, exc.reason)
    except PermissionDeniedError as exc:
        return failed(upstream, "refused_by_policy", exc.message, exc.reason)
    except DeadlineExceededError as exc:
        return failed(upstream, "timeout", exc.message, exc.reason)
    except UnavailableError as exc:
        kind = upstream.last_failure or "unreachable"
        return failed(upstream, kind, exc.message, exc.reason)
    except RemoteError as exc:
        return failed(upstream, "upstream_error", exc.message, exc.reason)
    except errors.ConnectionLost as exc:
        return failed(upstream, "unreachable", str(exc) or "connection lost")
    latency = round((time.perf_counter() - started) * 1000, 3)
    return m.ServersTestResult(
        name=upstream.name,
        outcome="ok",
        message=f"tools/list answered with {len(tools)} tools",
        tool_count=len(tools),
        latency_ms=latency,
        auth=upstream.spec.auth,
        source="config" if upstream.source == "config" else "api",
    )


def failed(
    upstream: Upstream,
    kind: errors.FailureKind,
    message: str,
    reason: str | None = None,
) -> m.ServersTestResult:
    """A failed test's result: facts only (``kind`` as the outcome)."""
    return m.ServersTestResult(
        name=upstream.name,
        outcome=kind,
        message=message,
        tool_count=None,
        latency_ms=None,
        reason=reason,
        auth=upstream.spec.auth,
        source="config" if upstream.source == "config" else "api",
    )
