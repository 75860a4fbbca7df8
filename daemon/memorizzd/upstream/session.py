"""The MCP SDK adapter: opening a client for a server spec, the calls, and the errors.

Together with ``stdio.py`` this is the only code that imports ``mcp``. It turns
SDK results (pydantic models) into wire structs and SDK exceptions into our
error classes; nothing above it knows the SDK exists.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, Final, Literal, TypeVar

import anyio
import httpx2
import msgspec
import pydantic

from memorizz.api import methods as m
from memorizz.api.errors import (
    AuthRequiredError,
    DeadlineExceededError,
    PermissionDeniedError,
    RemoteError,
    TooLargeError,
    UpstreamError,
)
from memorizzd import __version__
from memorizzd.egress.client import hardened_client
from memorizzd.egress.limits import TOO_LARGE_MARKER
from memorizzd.egress.replies import refusal_in
from memorizzd.egress.transport import BearerSource
from memorizzd.egress.urls import check_url, without_trailing_dot
from memorizzd.upstream.expired import SESSION_EXPIRED, expired_answers
from memorizzd.upstream.mcp_sdk import (
    MCP_NAME_HEADER,
    CallOptions,
    Client,
    ClientSession,
    MCPError,
    encode_header_value,
    sse_client,
    streamable_http_client,
    types,
)
from memorizzd.upstream.sse import EndpointWatch, opened_within
from memorizzd.upstream.stdio import StdioProcess, stdio_transport
from memorizzd.vault.server_secrets import ServerSecrets

T = TypeVar("T")
MessageHandler = Callable[[Any], Awaitable[None]]

MODERN: Final = "2026-07-28"
_CLIENT_INFO: Final = types.Implementation(name="memorizzd", version=__version__)
_BASE_ENV_KEYS: Final = (
    "HOME",
    "LOGNAME",
    "PATH",
    "SHELL",
    "TERM",
    "USER",
    "LANG",
    "TZ",
)
_SSE_TOO_LARGE: Final = "Server-sent event exceeded"


class ConnectionLost(Exception):
    """The transport to the upstream broke; the session must be rebuilt."""


class SessionExpired(ConnectionLost):
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


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and what caused it (``__cause__``/``__context__``), bounded."""
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and len(seen) < 16 and current not in seen:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def failure_kind(exc: BaseException) -> FailureKind:
    """Classify a failed connect (an exception, perhaps a group, from
    ``open_client``) for an honest ``servers/test``."""
    found = leaves(exc) or [exc]
    remote = [leaf for leaf in found if isinstance(leaf, RemoteError)]
    if isinstance(exc, RemoteError):
        remote.insert(0, exc)
    remote += [
        translated
        for leaf in found
        if isinstance(leaf, MCPError) and (translated := _as_remote(leaf))
    ]
    auth = [r for r in remote if isinstance(r, AuthRequiredError)]
    if any(r.reason == "login_required" for r in auth):
        return "login_required"
    if auth:
        return "authorization_required"
    if any(isinstance(r, PermissionDeniedError) for r in remote):
        return "refused_by_policy"
    if any(isinstance(c, ssl.SSLError) for leaf in found for c in _chain(leaf)):
        return "tls_error"
    if any(isinstance(r, DeadlineExceededError) for r in remote) or any(
        isinstance(leaf, TimeoutError | httpx2.TimeoutException) for leaf in found
    ):
        return "timeout"
    if any(isinstance(r, UpstreamError) for r in remote):
        return "upstream_error"
    return "unreachable"


def _as_remote(exc: MCPError) -> RemoteError | None:
    translated = translate_mcp_error(exc, server="")
    return translated if isinstance(translated, RemoteError) else None


def child_environment(
    spec: m.ServerSpec, secret_env: Mapping[str, str] | None = None
) -> dict[str, str]:
    """A minimal base environment plus the server's own variables (and its
    secret ones, resolved from the vault); nothing else."""
    base = {k: v for k in _BASE_ENV_KEYS if (v := os.environ.get(k)) is not None}
    return base | dict(spec.env) | dict(secret_env or {})


SSE_EVENT_MAX: Final = 1 << 20
"""The SDK's legacy SSE reader dies on a larger event; cap below it."""


def _timeout(spec: m.ServerSpec) -> httpx2.Timeout:
    return httpx2.Timeout(30.0, read=max(300.0, spec.timeout_s + 30))


@asynccontextmanager
async def open_client(
    spec: m.ServerSpec,
    *,
    mode: str,
    process: StdioProcess | None,
    message_handler: MessageHandler,
    host_allowlist: Sequence[str],
    secrets: ServerSecrets | None = None,
    bearer: BearerSource | None = None,
) -> AsyncIterator[Client]:
    """Connect and negotiate; yields a ready ``Client`` owned by the calling task.

    ``secrets`` (resolved from the vault just before): HTTP headers sent on
    every request (``Authorization`` among them), or a stdio child's secret env.
    ``bearer``: an OAuth server's token keeper (the token of the moment on
    every request).

    HTTP servers are reached only through the hardened client (``egress``); the
    URL is checked again here, since the allowlist may have changed since the
    server was added, and an egress refusal while connecting is raised as such
    (``PermissionDeniedError``), not as the SDK's "connection closed".
    """
    client_kwargs: dict[str, Any] = {
        "mode": mode,
        "read_timeout_seconds": spec.timeout_s,
        "message_handler": message_handler,
        "client_info": _CLIENT_INFO,
        "cache": None,  # the daemon caches lists itself
    }
    secrets = secrets or ServerSecrets()
    if spec.transport == "stdio":
        if spec.command is None or process is None:
            raise ValueError("a stdio server needs a command")
        transport = stdio_transport(
            [spec.command, *spec.args],
            env=child_environment(spec, secrets.env),
            cwd=spec.cwd,
            max_message_bytes=spec.max_result_bytes + 64 * 1024,
            process_info=process,
        )
        async with Client(transport, **client_kwargs) as client:
            yield client
    elif spec.transport == "streamable_http":
        url = _checked_url(spec, host_allowlist)
        http = hardened_client(
            limit=spec.max_result_bytes,
            timeout=_timeout(spec),
            allowlist=host_allowlist,
            allow_private_network=spec.allow_private_network,
            headers=dict(secrets.headers) or None,
            bearer=bearer,
            wrap=expired_answers,
        )
        async with http:
            transport = streamable_http_client(
                url,
                http_client=http,
                max_sse_event_size=spec.max_result_bytes + 65536,
            )
            async with _refusals_raised(Client(transport, **client_kwargs)) as client:
                yield client
    else:
        url = _checked_url(spec, host_allowlist)
        # The endpoint event is checked before the SDK reads it, and the open
        # is bounded by timeout_s: the SDK hangs on any failure before it
        # (upstream/sse.py).
        watch = EndpointWatch(url)
        transport = sse_client(
            url,
            timeout=30.0,
            sse_read_timeout=24 * 3600.0,
            httpx_client_factory=lambda headers=None, timeout=None, auth=None: (
                hardened_client(
                    limit=min(spec.max_result_bytes, SSE_EVENT_MAX - 65536),
                    timeout=timeout or _timeout(spec),
                    allowlist=host_allowlist,
                    allow_private_network=spec.allow_private_network,
                    headers={**(headers or {}), **secrets.headers} or None,
                    auth=auth,
                    bearer=bearer,
                    wrap=watch.wrap,
                )
            ),
        )
        bounded = opened_within(transport, spec.timeout_s, watch)
        async with _refusals_raised(Client(bounded, **client_kwargs)) as client:
            yield client


def _checked_url(spec: m.ServerSpec, host_allowlist: Sequence[str]) -> str:
    if spec.url is None:
        raise ValueError("an HTTP server needs a url")
    check_url(
        spec.url,
        allowlist=host_allowlist,
        allow_private_network=spec.allow_private_network,
    )
    # The SDK sees the host as the allowlist matched it (and as TLS knows it).
    return without_trailing_dot(spec.url)


@asynccontextmanager
async def _refusals_raised(client: Client) -> AsyncIterator[Client]:
    """Enter ``client``; when connecting failed because egress refused, raise
    the refusal itself (the SDK reports it as a failed handshake)."""
    async with AsyncExitStack() as stack:
        try:
            entered = await stack.enter_async_context(client)
        except Exception as exc:
            refusal = _refusal_of(exc)
            if refusal is None:
                raise
            raise refusal from None
        yield entered


def _refusal_of(exc: BaseException) -> RemoteError | None:
    if isinstance(exc, RemoteError):
        return exc
    if isinstance(exc, MCPError):
        return refusal_in(exc.error.data)
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            if (refusal := _refusal_of(inner)) is not None:
                return refusal
    return None


def is_modern(client: Client) -> bool:
    return client.protocol_version == MODERN


async def guarded(call: Callable[[], Awaitable[T]], *, server: str) -> T:
    """Run one SDK call and translate its failures to our classes."""
    try:
        return await call()
    except MCPError as exc:
        raise translate_mcp_error(exc, server=server) from None
    except (pydantic.ValidationError, msgspec.ValidationError):
        raise UpstreamError(f"{server}: the server sent a malformed result") from None
    except TimeoutError:
        raise DeadlineExceededError(f"{server}: the request timed out") from None
    except (
        httpx2.TransportError,
        anyio.ClosedResourceError,
        anyio.BrokenResourceError,
        anyio.EndOfStream,
        OSError,
    ) as exc:
        raise ConnectionLost(f"{type(exc).__name__}") from None


def translate_mcp_error(exc: MCPError, *, server: str) -> RemoteError | ConnectionLost:
    if (refusal := refusal_in(exc.error.data)) is not None:
        return refusal  # the hardened client refused this request (egress)
    if exc.error.data == SESSION_EXPIRED:
        return SessionExpired("the server no longer knows the session (HTTP 404)")
    if exc.code == types.CONNECTION_CLOSED and exc.error.data != TOO_LARGE_MARKER:
        if _SSE_TOO_LARGE in exc.message:
            return TooLargeError(f"{server}: result larger than max_result_bytes")
        return ConnectionLost("connection closed")
    if exc.code == types.REQUEST_TIMEOUT:
        return DeadlineExceededError(f"{server}: the request timed out")
    if exc.error.data == TOO_LARGE_MARKER:
        return TooLargeError(f"{server}: {exc.message}")
    return UpstreamError(
        f"{server}: {exc.message}", data={"server": server, "upstream_code": exc.code}
    )


def _dump(model: pydantic.BaseModel) -> dict[str, Any]:
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)


ItemT = TypeVar("ItemT")
Fetch = Callable[..., Awaitable[Any]]


async def _listing(
    fetch: Fetch, attr: str, item_type: type[ItemT], page_limit: int
) -> list[ItemT]:
    """Every page of an MCP listing, followed by cursor (at most ``page_limit``)."""
    items: list[Any] = []
    cursor: str | None = None
    for _ in range(page_limit):
        params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
        page = await fetch(params=params)
        items += getattr(page, attr)
        cursor = page.next_cursor
        if cursor is None:
            return [msgspec.convert(_dump(item), item_type) for item in items]
    raise UpstreamError(
        f"the listing has more than {page_limit} pages; refusing to follow"
    )


async def list_tools(client: Client, *, page_limit: int) -> list[m.Tool]:
    return await _listing(client.session.list_tools, "tools", m.Tool, page_limit)


async def list_resources(client: Client, *, page_limit: int) -> list[m.Resource]:
    fetch = client.session.list_resources
    return await _listing(fetch, "resources", m.Resource, page_limit)


async def list_resource_templates(
    client: Client, *, page_limit: int
) -> list[m.ResourceTemplate]:
    fetch = client.session.list_resource_templates
    return await _listing(fetch, "resource_templates", m.ResourceTemplate, page_limit)


async def list_prompts(client: Client, *, page_limit: int) -> list[m.Prompt]:
    return await _listing(client.session.list_prompts, "prompts", m.Prompt, page_limit)


async def call_tool(
    client: Client, name: str, arguments: dict[str, Any]
) -> m.ToolsCallResult:
    """Proxy verbatim: no output-schema validation, no implicit listing.

    The hot path. ``ClientSession.send_request`` builds and dumps pydantic
    models, then validates the result twice (against the negotiated revision's
    schema and as a model) before we would dump it again; a result is passed
    through, so we send the raw request through the session's own dispatcher,
    stamped by the session for its era (``_meta``, HTTP headers), and decode
    the raw result once, into the wire struct. ``_stamp`` and ``_dispatcher``
    are private in mcp 2.3 (pinned <2.4); the transports tests cover both eras.
    """
    try:
        raw = await _send_call(client.session, name, arguments)
    except MCPError as exc:
        if exc.code != types.HEADER_MISMATCH or not is_modern(client):
            raise
        # 2026-07-28: the server wants a fresh listing of this tool first; once.
        await client.list_tools(cache_mode="refresh")
        raw = await _send_call(client.session, name, arguments)
    return msgspec.convert(raw, m.ToolsCallResult)


async def _send_call(
    session: ClientSession, name: str, arguments: dict[str, Any]
) -> dict[str, Any]:
    data: dict[str, Any] = {
        "method": "tools/call",
        "params": {"name": name, "arguments": arguments},
    }
    opts: CallOptions = {}
    session._stamp(data, opts)
    headers = opts.setdefault("headers", {})
    headers.setdefault(MCP_NAME_HEADER, encode_header_value(name))
    raw: dict[str, Any] = await session._dispatcher.send_raw_request(
        "tools/call", data["params"], opts
    )
    return raw


async def read_resource(client: Client, uri: str) -> m.ResourcesReadResult:
    request = types.ReadResourceRequest(params=types.ReadResourceRequestParams(uri=uri))
    result = await client.session.send_request(request, types.ReadResourceResult)
    return m.ResourcesReadResult(contents=[_dump(c) for c in result.contents])


async def get_prompt(
    client: Client, name: str, arguments: dict[str, str]
) -> m.PromptsGetResult:
    request = types.GetPromptRequest(
        params=types.GetPromptRequestParams(name=name, arguments=arguments)
    )
    result = await client.session.send_request(request, types.GetPromptResult)
    return m.PromptsGetResult(
        messages=[_dump(msg) for msg in result.messages], description=result.description
    )


async def probe(client: Client) -> None:
    """A cheap liveness round trip: ``ping`` (2025-11-25) or ``server/discover`` (2026-07-28).

    A probe that gets no answer in time sends no ``notifications/cancelled``
    (the SDK sends none for ``server/discover`` either): on a wedged transport
    (a legacy SSE POST the server never answers holds every later message)
    the SDK would wait up to 5 s to write it, holding back the verdict that
    replaces the session, and the callers that wait for it.
    """
    session = client.session
    if is_modern(client):
        await session.send_discover(MODERN)
        return
    data: dict[str, Any] = {"method": "ping", "params": {}}
    opts: CallOptions = {"cancel_on_abandon": False}
    session._stamp(data, opts)
    await session._dispatcher.send_raw_request("ping", data["params"], opts)


def describe(client: Client) -> tuple[str | None, str | None, str | None]:
    """(protocol version, server name, server version)."""
    info = client.server_info
    return (
        client.protocol_version,
        info.name if info else None,
        info.version if info else None,
    )


async def watch_tool_changes(client: Client, on_change: Callable[[], None]) -> None:
    """2026-07-28: changes arrive only on a ``subscriptions/listen`` stream.

    Returns at once when the server does not announce tool list changes; the
    handshake era delivers them as notifications (``is_tool_list_changed``).
    """
    tools = client.server_capabilities.tools
    if not is_modern(client) or tools is None or not tools.list_changed:
        return
    async with client.listen(tools_list_changed=True) as subscription:
        async for _event in subscription:
            on_change()


def is_tool_list_changed(message: object) -> bool:
    return isinstance(message, types.ToolListChangedNotification)
