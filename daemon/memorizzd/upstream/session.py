"""The MCP SDK adapter for the HTTP transports: a ``Connection`` on the SDK's client.

Streamable HTTP and legacy HTTP+SSE servers are spoken to through the SDK
(stdio servers through our own ``jsonrpc.py``). This module is imported only
when a server needs it (``supervisor.py`` loads it lazily), so a host with
only stdio servers never loads the SDK. It turns SDK results (pydantic
models) into wire structs and SDK exceptions into our error classes. It uses
the SDK's public API but where SDK 2.3 has none: a 2026-07-28 ``tools/call``
(``_modern_call``), the legacy health probe (``probe``) and the handshake
era's tasks (``_raw_request``) go through the session's private
``_stamp``/``_dispatcher``, pinned by ``mcp<2.4`` (a stdio server's calls
take no SDK at all).
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager, suppress
from typing import Any, Final, TypeVar

import anyio
import httpx2
import msgspec
import pydantic

from memorizz.api import methods as m
from memorizz.api.errors import (
    DeadlineExceededError,
    RemoteError,
    TooLargeError,
    UpstreamError,
)
from memorizzd import __version__
from memorizzd.calllife import ELICIT, SAMPLE, AskRefused
from memorizzd.egress.client import hardened_client
from memorizzd.egress.limits import counted
from memorizzd.egress.oversize import TOO_LARGE_MARKER
from memorizzd.egress.replies import refusal_in
from memorizzd.egress.transport import BearerSource
from memorizzd.egress.urls import check_url, without_trailing_dot
from memorizzd.loop import TaskSet
from memorizzd.upstream.asks import (
    INPUT_ROUNDS_MAX,
    InFlight,
    fulfil,
    input_required,
    unanswered,
)
from memorizzd.upstream.connection import (
    Cursors,
    ProgressHandler,
    ToolResult,
    told,
)
from memorizzd.upstream.errors import (
    METHOD_NOT_FOUND,
    ConnectionLost,
    FailureKind,
    SessionExpired,
    Unsent,
    chain,
    classify,
    leaves,
    not_honored,
    rpc_error,
)
from memorizzd.upstream.expired import SESSION_EXPIRED, expired_answers
from memorizzd.upstream.mcp_sdk import (
    CallOptions,
    Client,
    ClientExtension,
    MCPError,
    NotificationBinding,
    ProgressFnT,
    SubscriptionLost,
    sse_client,
    streamable_http_client,
    types,
    validate_server_result,
)
from memorizzd.upstream.sse import (
    EndpointWatch,
    StreamEnd,
    opened_within,
    watched_to_the_end,
)
from memorizzd.upstream.tasks import STATUS as TASK_STATUS
from memorizzd.vault.server_secrets import ServerSecrets

T = TypeVar("T")
log = logging.getLogger("memorizzd.upstream.session")

MODERN: Final = "2026-07-28"
_CLIENT_INFO: Final = types.Implementation(name="memorizzd", version=__version__)
_SSE_TOO_LARGE: Final = "Server-sent event exceeded"
_PASSED_ON: Final = (
    types.ToolListChangedNotification,
    types.ResourceListChangedNotification,
    types.PromptListChangedNotification,
    types.LoggingMessageNotification,
    types.ResourceUpdatedNotification,
)
LISTEN_AGAIN_S: Final = 1.0
"""A resource listen stream the server ended is opened again after this."""
CLOSE_WAIT_S: Final = 2.0
"""How long a closing connection waits for its listen streams to end."""
SSE_EVENT_MAX: Final = 1 << 20
"""The SDK's legacy SSE reader dies on a larger event; cap below it."""
FORGOTTEN_BODY_MAX: Final = 4096
"""The largest HTTP 400 body read for what it says of the session."""


def failure_kind(exc: BaseException) -> FailureKind:
    """Classify a failed connect (an exception, perhaps a group, from
    ``open_connection``) for an honest ``servers/test``."""
    found = leaves(exc) or [exc]
    remote = [leaf for leaf in found if isinstance(leaf, RemoteError)]
    if isinstance(exc, RemoteError):
        remote.insert(0, exc)
    remote += [
        translated
        for leaf in found
        if isinstance(leaf, MCPError) and (translated := _as_remote(leaf))
    ]
    timeouts: list[BaseException] = [
        TimeoutError() for leaf in found if isinstance(leaf, httpx2.TimeoutException)
    ]
    tls = any(isinstance(c, ssl.SSLError) for leaf in found for c in chain(leaf))
    return classify(found + timeouts, remote, tls=tls)


def _as_remote(exc: MCPError) -> RemoteError | None:
    translated = translate_mcp_error(exc, server="")
    return translated if isinstance(translated, RemoteError) else None


class _AnyParams(pydantic.BaseModel):
    """A notification's params, kept as they came."""

    model_config = pydantic.ConfigDict(extra="allow")


class _Unspoken(ClientExtension):
    """The server notifications that SDK 2.3 knows no type for and would drop
    (``notifications/tasks/status``, MCP 2025-11-25), heard through the SDK's
    own way for them (a notification binding) and passed on as ``on_message``
    passes the others. Its identifier is advertised among the client's
    extensions, where servers that know no such extension ignore it."""

    identifier = "dev.memorizz/unspoken-notifications"

    def __init__(self, on_notification: Callable[[str, msgspec.Raw], None]) -> None:
        self._on_notification = on_notification

    def notifications(self) -> Sequence[NotificationBinding[Any]]:
        async def heard(params: _AnyParams) -> None:
            raw = params.model_dump_json(by_alias=True, exclude_none=True)
            self._on_notification(TASK_STATUS, msgspec.Raw(raw.encode()))

        return (
            NotificationBinding(
                method=TASK_STATUS, params_type=_AnyParams, handler=heard
            ),
        )


def _timeout(spec: m.ServerSpec) -> httpx2.Timeout:
    return httpx2.Timeout(30.0, read=max(300.0, spec.timeout_s + 30))


@asynccontextmanager
async def open_connection(
    spec: m.ServerSpec,
    *,
    mode: str,
    on_notification: Callable[[str, msgspec.Raw], None],
    host_allowlist: Sequence[str],
    secrets: ServerSecrets | None = None,
    bearer: BearerSource | None = None,
) -> AsyncIterator[SdkConnection]:
    """Connect to an HTTP server and negotiate; yields a ready connection
    owned by the calling task.

    ``secrets`` (resolved from the vault just before): HTTP headers sent on
    every request (``Authorization`` among them). ``bearer``: an OAuth
    server's token keeper (the token of the moment on every request).

    Servers are reached only through the hardened client (``egress``); the
    URL is checked again here, since the allowlist may have changed since the
    server was added, and an egress refusal while connecting is raised as such
    (``PermissionDeniedError``), not as the SDK's "connection closed".
    """

    async def on_message(message: Any) -> None:
        """The server's notifications, as our stdio client hands them on
        (method, raw params): list changes and log messages."""
        if isinstance(message, _PASSED_ON):
            params = message.params
            raw = (
                b"{}"
                if params is None
                else params.model_dump_json(by_alias=True, exclude_none=True).encode()
            )
            on_notification(message.method, msgspec.Raw(raw))

    client_kwargs: dict[str, Any] = {
        "extensions": [_Unspoken(on_notification)],
        "mode": mode,
        "read_timeout_seconds": spec.timeout_s,
        "message_handler": on_message,
        "client_info": _CLIENT_INFO,
        "cache": None,  # the daemon caches lists itself
    }
    if spec.roots:  # declared, and roots/list answered, from the configuration
        roots = types.ListRootsResult.model_validate(
            {"roots": [{"uri": uri} for uri in spec.roots]}
        )

        async def list_roots(context: Any) -> types.ListRootsResult:
            return roots

        client_kwargs["list_roots_callback"] = list_roots
    in_flight = InFlight(spec.name)
    client_kwargs.update(_ask_callbacks(in_flight, spec.name))
    secrets = secrets or ServerSecrets()
    if spec.transport == "streamable_http":
        url = _checked_url(spec, host_allowlist)
        ids = _SessionIds()
        http = hardened_client(
            limit=spec.max_result_bytes,
            timeout=_timeout(spec),
            allowlist=host_allowlist,
            allow_private_network=spec.allow_private_network,
            headers=dict(secrets.headers) or None,
            bearer=bearer,
            wrap=lambda inner: expired_answers(_ForgottenSessions(inner, ids)),
        )
        async with http:
            transport = streamable_http_client(
                url,
                http_client=http,
                max_sse_event_size=spec.max_result_bytes + 65536,
            )
            async with (
                _refusals_raised(Client(transport, **client_kwargs)) as client,
                _connection(client, spec, in_flight, ids=ids) as connection,
            ):
                yield connection
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
        end = StreamEnd()
        bounded = watched_to_the_end(
            opened_within(transport, spec.timeout_s, watch), end
        )
        async with (
            _refusals_raised(Client(bounded, **client_kwargs)) as client,
            _connection(client, spec, in_flight, end) as connection,
            _lost_with(end, spec.name),
        ):
            yield connection


@asynccontextmanager
async def _connection(
    client: Client,
    spec: m.ServerSpec,
    in_flight: InFlight,
    end: StreamEnd | None = None,
    *,
    ids: _SessionIds | None = None,
) -> AsyncIterator[SdkConnection]:
    """The connection on ``client``; the listen streams it holds end with it."""
    connection = SdkConnection(
        client,
        server=spec.name,
        in_flight=in_flight,
        end=end,
        max_result_bytes=spec.max_result_bytes,
        ids=ids,
    )
    try:
        yield connection
    finally:
        with anyio.CancelScope(shield=True):
            await connection.close()


@asynccontextmanager
async def _lost_with(end: StreamEnd, server: str) -> AsyncIterator[None]:
    """A legacy SSE session ends with its event stream (every answer comes on
    it): once the stream ended, ``ConnectionLost`` is raised into the body
    (the supervisor's serving, which then connects again), not left for the
    next call to find (``sse.py``)."""

    async def watch() -> None:
        await end.ended.wait()
        log.info("%s: the SSE stream ended: %s", server, end.why)
        raise ConnectionLost(f"the SSE stream ended: {end.why}")

    async with anyio.create_task_group() as tg:
        tg.start_soon(watch)
        yield
        tg.cancel_scope.cancel()


class _SessionIds:
    """Whether a Streamable HTTP server gave the connection an
    ``Mcp-Session-Id``: a handshake-era session, which its server forgets
    when it restarts (a 404, and the daemon connects again)."""

    seen = False


class _ForgottenSessions(httpx2.AsyncBaseTransport):
    """A Streamable HTTP server that lost its sessions (it restarted) must
    answer their requests HTTP 404, which ``expired.py`` turns into a new
    session; many answer 400 instead, with a JSON-RPC error that says so:
    the reference server-everything and the TypeScript SDK's examples ("Bad
    Request: No valid session ID provided"). Such a 400 (to a POST in a
    session, a small JSON body whose error's message names the session) is
    passed on as that 404: the request was refused unread, not run. Any
    other answer goes through as it came. ``ids`` is told whether the
    server gave a session id at all."""

    def __init__(
        self, inner: httpx2.AsyncBaseTransport, ids: _SessionIds | None = None
    ) -> None:
        self._inner = inner
        self._ids = ids or _SessionIds()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self._inner.handle_async_request(request)
        if not self._ids.seen and "mcp-session-id" in response.headers:
            self._ids.seen = True
        if (
            response.status_code != 400
            or request.method != "POST"
            or "mcp-session-id" not in request.headers
            or not response.headers.get("content-type", "").startswith(
                "application/json"
            )
            or not isinstance(response.stream, httpx2.AsyncByteStream)
        ):
            return response
        stream = response.stream
        chunks = aiter(stream)
        head = bytearray()
        async for chunk in chunks:
            head += chunk
            if len(head) > FORGOTTEN_BODY_MAX:
                break
        else:  # all of it: small enough to be read for what it says
            await stream.aclose()
            forgotten = _names_the_session(bytes(head))
            return httpx2.Response(
                status_code=404 if forgotten else 400,
                headers=response.headers,
                content=bytes(head),
                request=request,
                extensions=response.extensions,
            )
        return httpx2.Response(  # larger: passed on as it came
            status_code=400,
            headers=response.headers,
            stream=_Replayed(bytes(head), chunks, stream),
            request=request,
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        await self._inner.aclose()


class _RpcErrorBody(msgspec.Struct):
    message: str


class _RpcError(msgspec.Struct):
    error: _RpcErrorBody


_decode_rpc_error: Final = msgspec.json.Decoder(_RpcError).decode


class _Replayed(httpx2.AsyncByteStream):
    """A body whose first bytes were read already: they, then the rest."""

    def __init__(
        self, head: bytes, rest: AsyncIterator[bytes], inner: httpx2.AsyncByteStream
    ) -> None:
        self._head, self._rest, self._inner = head, rest, inner

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self._head
        async for chunk in self._rest:
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


def _names_the_session(body: bytes) -> bool:
    """Is ``body`` a JSON-RPC error whose message is about the session?"""
    try:
        error = _decode_rpc_error(body)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return False
    return "session" in error.error.message.lower()


_CALL_RESULT: Final = pydantic.TypeAdapter(
    types.CallToolResult | types.InputRequiredResult
)
"""A tool result, or (2026-07-28) a request for input first."""


def _ask_callbacks(in_flight: InFlight, server: str) -> dict[str, Any]:
    """The SDK's elicitation and sampling callbacks (so the client declares
    both, sampling with tools): each request goes to the caller whose call
    it serves (``asks.py``; the SDK's context names no related request, so
    only a session with one call in flight can be tied), its answer back."""

    async def relay(method: str, params: pydantic.BaseModel, into: Any) -> Any:
        raw = params.model_dump_json(by_alias=True, exclude_none=True).encode()
        try:
            result = await in_flight.answer(method, raw)
        except AskRefused as exc:
            log.info("%s: %s not relayed: %s", server, method, exc)
            return types.ErrorData(code=exc.code, message=exc.message)
        try:
            return into.model_validate_json(result)
        except pydantic.ValidationError:
            return types.ErrorData(
                code=types.INTERNAL_ERROR,
                message="the caller's client answered with a malformed result",
            )

    async def elicit(context: Any, params: Any) -> Any:
        return await relay(ELICIT, params, types.ElicitResult)

    async def sample(context: Any, params: Any) -> Any:
        tools = params.tools is not None or params.tool_choice is not None
        into = (
            types.CreateMessageResultWithTools if tools else types.CreateMessageResult
        )
        return await relay(SAMPLE, params, into)

    return {
        "elicitation_callback": elicit,
        "sampling_callback": sample,
        "sampling_capabilities": types.SamplingCapability(
            tools=types.SamplingToolsCapability()
        ),
    }


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


async def guarded(call: Callable[[], Awaitable[T]], *, server: str) -> T:
    """Run one SDK call and translate its failures to our classes."""
    try:
        return await call()
    except MCPError as exc:
        raise translate_mcp_error(exc, server=server) from None
    except (pydantic.ValidationError, msgspec.ValidationError):
        raise UpstreamError(
            f"{server}: the server sent a malformed result", data={"server": server}
        ) from None
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
    error = exc.error
    if (refusal := refusal_in(error.data)) is not None:
        # The hardened client refused this request (egress), which knows the
        # host, not the server's name: the caller is told which server.
        refusal.data.setdefault("server", server)
        return refusal
    if error.data == SESSION_EXPIRED:
        return SessionExpired("the server no longer knows the session (HTTP 404)")
    if (
        exc.code == types.CONNECTION_CLOSED
        and error.data != TOO_LARGE_MARKER
        and _SSE_TOO_LARGE in exc.message
    ):
        return TooLargeError(
            f"{server}: result larger than max_result_bytes", data={"server": server}
        )
    return rpc_error(exc.code, exc.message, error.data, server=server)


async def _modern_call(
    session: Any,
    request: types.CallToolRequest,
    on_progress: ProgressFnT | None,
    log_level: str | None = None,
) -> types.CallToolResult | types.InputRequiredResult:
    """A 2026-07-28 ``tools/call`` as ``ClientSession.send_request`` sends it
    (the same stamp: ``_meta``, ``Mcp-Method``, ``Mcp-Name`` and the
    ``Mcp-Param-*`` headers of the tool's ``x-mcp-header`` parameters), except
    that a result without ``resultType`` is a complete one (SEP-2322: absent
    means ``complete``), where SDK 2.3's result check requires the field and
    refuses it. Takes the session's private ``_stamp``/``_dispatcher`` (pinned
    by ``mcp<2.4``, as ``probe`` does). ``log_level``: the caller hears the
    server's log messages from that level on (2026-07-28 logs only to
    requests that opt in, in ``_meta``)."""
    data = request.model_dump(by_alias=True, mode="json", exclude_none=True)
    if log_level is not None:
        meta = data.setdefault("params", {}).setdefault("_meta", {})
        meta[types.LOG_LEVEL_META_KEY] = log_level
    opts: CallOptions = {}
    session._stamp(data, opts)
    timeout = session._session_read_timeout_seconds
    if timeout is not None:
        opts["timeout"] = timeout
    if on_progress is not None:
        opts["on_progress"] = on_progress
    raw = await session._dispatcher.send_raw_request(
        data["method"], data.get("params"), opts
    )
    if isinstance(raw, dict) and "resultType" not in raw:
        raw = {**raw, "resultType": "complete"}
    validate_server_result(data["method"], MODERN, raw)
    return _CALL_RESULT.validate_python(raw, by_name=False)


class _ResourceStream:
    """A listen stream held for a set of resource URIs (2026-07-28)."""

    def __init__(self, uris: frozenset[str]) -> None:
        self.uris = uris
        """Asked for; once acknowledged, those the server honored."""
        self.acked = anyio.Event()
        self.scope = anyio.CancelScope()
        self.error: RemoteError | ConnectionLost | None = None

    def let_go(self) -> None:
        self.scope.cancel()


def _dump(model: pydantic.BaseModel) -> dict[str, Any]:
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)


class SdkConnection:
    """A ``Connection`` on the SDK's ``Client`` (see the module's docstring
    for the few requests that take its private API)."""

    def __init__(
        self,
        client: Client,
        *,
        server: str,
        in_flight: InFlight | None = None,
        end: StreamEnd | None = None,
        max_result_bytes: int = m.DEFAULT_MAX_RESULT_BYTES,
        ids: _SessionIds | None = None,
    ) -> None:
        self._client = client
        self._server = server
        self._max_result_bytes = max_result_bytes
        """The server's cap on one result, and on a listing's pages together."""
        self._in_flight = in_flight or InFlight(server)
        self._end = end
        """Legacy SSE: the end of the session's event stream."""
        self._ids = ids
        """Streamable HTTP: whether the server gave a session id."""
        self._tools_ttl_s = 0.0
        """The last tool listing's ``ttlMs`` (its pages' smallest), in seconds."""
        self._resources: frozenset[str] = frozenset()
        """2026-07-28: the URIs the held listen stream subscribes to."""
        self._held: _ResourceStream | None = None
        self._streams = TaskSet()
        self._closed = False
        self.protocol_version: str | None = client.protocol_version
        info = client.server_info
        self.server_name = info.name if info else None
        self.server_version = info.version if info else None
        self.instructions = told(client.instructions)

    def declares(self, capability: str) -> bool:
        return getattr(self._client.server_capabilities, capability, None) is not None

    async def _guarded(self, call: Callable[[], Awaitable[T]]) -> T:
        end = self._end
        ended = end is not None and end.ended.is_set()
        try:
            return await guarded(call, server=self._server)
        except ConnectionLost as exc:
            if end is None or not ended or isinstance(exc, Unsent):
                raise
            # The stream had ended first: the SDK's session, closed with it,
            # refused the request unsent (it may go on the next session).
            raise Unsent(f"the SSE stream ended: {end.why}") from None

    async def call_tool(
        self, name: str, arguments: bytes, progress: ProgressHandler | None = None
    ) -> ToolResult:
        """Proxied verbatim: no output-schema validation, no implicit listing
        (``ClientSession.call_tool`` does both), so the request is sent as a
        plain ``send_request`` (2026-07-28: ``_modern_call``). The SDK adds
        the ``Mcp-Param-*`` headers of the tool's ``x-mcp-header`` parameters
        (SEP-2243) from the session's last ``tools/list``; a server that finds
        them missing answers ``HEADER_MISMATCH`` and is listed again, once."""
        decoded = msgspec.json.decode(arguments)
        request = types.CallToolRequest(
            params=types.CallToolRequestParams(name=name, arguments=decoded)
        )
        session = self._client.session

        handler = progress

        async def on_progress(
            progress: float, total: float | None, message: str | None
        ) -> None:  # the SDK's ProgressFnT, by its parameter names
            report: dict[str, object] = {"progressToken": "", "progress": progress}
            if total is not None:
                report["total"] = total
            if message is not None:
                report["message"] = message
            if handler is not None:
                await handler(msgspec.Raw(msgspec.json.encode(report)))

        callback: ProgressFnT | None = None if handler is None else on_progress

        async def once() -> types.CallToolResult | types.InputRequiredResult:
            if self.protocol_version == MODERN:
                return await _modern_call(session, request, callback, call.log_level)
            return await session.send_request(
                request, _CALL_RESULT, progress_callback=callback
            )

        async def send() -> types.CallToolResult | types.InputRequiredResult:
            try:
                return await once()
            except MCPError as exc:
                if exc.code != types.HEADER_MISMATCH or self.protocol_version != MODERN:
                    raise
            # 2026-07-28: the server wants a fresh listing of this tool first; once.
            await self._client.list_tools(cache_mode="refresh")
            return await once()

        key, call = self._in_flight.enter()
        try:
            result = await self._guarded(send)
            for _ in range(INPUT_ROUNDS_MAX):  # 2026-07-28: it asks for input
                if not isinstance(result, types.InputRequiredResult):
                    break
                dumped = result.model_dump_json(by_alias=True, exclude_none=True)
                asked = input_required(dumped.encode())
                if asked is None:
                    break
                try:
                    answers = await fulfil(call, asked)
                except AskRefused as exc:
                    log.info("%s: input not given: %s", self._server, exc)
                    said = unanswered(self._server, exc.message)
                    return ToolResult(msgspec.Raw(said), True)
                retry: dict[str, Any] = {
                    "name": name,
                    "arguments": decoded,
                    "inputResponses": {
                        k: msgspec.json.decode(v) for k, v in answers.items()
                    },
                }
                if asked.request_state is not None:
                    retry["requestState"] = asked.request_state
                request = types.CallToolRequest(
                    params=types.CallToolRequestParams.model_validate(retry)
                )
                result = await self._guarded(send)
        finally:
            self._in_flight.leave(key)
        if isinstance(result, types.InputRequiredResult):
            why = f"it asked again after {INPUT_ROUNDS_MAX} rounds of answers"
            return ToolResult(msgspec.Raw(unanswered(self._server, why)), True)
        # what the server sent, no more: no defaults it left out (``isError``,
        # a handshake-era session's ``resultType``, which its revision lacks)
        raw = result.model_dump_json(
            by_alias=True, exclude_unset=True, exclude_none=True
        ).encode()
        return ToolResult(msgspec.Raw(raw), result.is_error)

    async def _listing(
        self,
        fetch: Callable[..., Awaitable[Any]],
        method: str,
        attr: str,
        into: type[T],
        limit: int,
    ) -> list[T]:
        """Every page of an MCP listing, followed by cursor (at most
        ``limit``), the bytes read for each counted as the transport read
        them (``egress.limits.counted``; legacy SSE answers on its event
        stream, where they are not: each page is capped alone there)."""

        async def pages() -> list[T]:
            items: list[Any] = []
            cursors = Cursors(
                self._server, limit, method=method, max_bytes=self._max_result_bytes
            )
            cursor: str | None = None
            with counted() as read:
                while True:
                    params = (
                        types.PaginatedRequestParams(cursor=cursor) if cursor else None
                    )
                    before = read.total
                    page = await fetch(params=params)
                    cursors.page(read.total - before)
                    items += getattr(page, attr)
                    cursor = cursors.follow(page.next_cursor)
                    if cursor is None:
                        break
            return [msgspec.convert(_dump(item), into) for item in items]

        try:
            return await self._guarded(pages)
        except UpstreamError as exc:
            if exc.data.get("upstream_code") == METHOD_NOT_FOUND:
                return []  # nothing to list is not an error
            raise

    async def list_tools(self, *, page_limit: int) -> list[m.Tool]:
        session = self._client.session
        ttls: list[int] = []

        async def fetch(
            *, params: types.PaginatedRequestParams | None
        ) -> types.ListToolsResult:
            page = await session.list_tools(params=params)
            # absent: 0 (immediately stale); a handshake-era server's is no hint
            hinted = (
                self.protocol_version == MODERN and "ttl_ms" in page.model_fields_set
            )
            ttls.append(page.ttl_ms if hinted else 0)
            return page

        tools = await self._listing(fetch, "tools/list", "tools", m.Tool, page_limit)
        self._tools_ttl_s = min(ttls, default=0) / 1000
        return tools

    def tools_fresh_for(self) -> float | None:
        """How long this session's last tool listing stays fresh, in seconds
        (``tools.ToolCache`` raises it to its floor); None: for as long as the
        session lives, since it tells the daemon when the tools change. Legacy
        SSE: the server's restart ends the event stream. A handshake-era
        session with an id: the restarted server answers 404 (a new session,
        listed at connect). A 2026-07-28 server that declares
        ``tools.listChanged``: the supervisor holds its list-change stream,
        whose end drops the cache. Anything else (a 2026-07-28 server that
        declares none, a handshake-era server that gives no session id, with
        or without ``listChanged``: there is no stream to hear it on) could
        restart with other tools unseen: the listing's ``ttlMs``."""
        if self._end is not None or self._ids is None:
            return None  # legacy SSE; a connection made without the HTTP stack
        if self.protocol_version == MODERN:
            tools = self._client.server_capabilities.tools
            if tools is not None and tools.list_changed is True:
                return None
        elif self._ids.seen:
            return None
        return self._tools_ttl_s

    async def list_resources(self, *, page_limit: int) -> list[m.Resource]:
        fetch = self._client.session.list_resources
        method = "resources/list"
        return await self._listing(fetch, method, "resources", m.Resource, page_limit)

    async def list_resource_templates(
        self, *, page_limit: int
    ) -> list[m.ResourceTemplate]:
        fetch = self._client.session.list_resource_templates
        return await self._listing(
            fetch,
            "resources/templates/list",
            "resource_templates",
            m.ResourceTemplate,
            page_limit,
        )

    async def list_prompts(self, *, page_limit: int) -> list[m.Prompt]:
        fetch = self._client.session.list_prompts
        return await self._listing(
            fetch, "prompts/list", "prompts", m.Prompt, page_limit
        )

    async def read_resource(self, uri: str) -> m.ResourcesReadResult:
        request = types.ReadResourceRequest(
            params=types.ReadResourceRequestParams(uri=uri)
        )
        session = self._client.session
        result = await self._guarded(
            lambda: session.send_request(request, types.ReadResourceResult)
        )
        return m.ResourcesReadResult(contents=[_dump(c) for c in result.contents])

    async def get_prompt(
        self, name: str, arguments: dict[str, str]
    ) -> m.PromptsGetResult:
        request = types.GetPromptRequest(
            params=types.GetPromptRequestParams(name=name, arguments=arguments)
        )
        session = self._client.session
        result = await self._guarded(
            lambda: session.send_request(request, types.GetPromptResult)
        )
        return m.PromptsGetResult(
            messages=[_dump(msg) for msg in result.messages],
            description=result.description,
        )

    def takes_tool_tasks(self) -> bool:
        """The handshake era's tasks (2025-11-25): ``tasks.requests.tools.call``."""
        tasks = self._client.server_capabilities.tasks
        requests = None if tasks is None else tasks.requests
        tools = None if requests is None else requests.tools
        return (
            self.protocol_version != MODERN
            and tools is not None
            and tools.call is not None
        )

    async def call_tool_task(
        self, name: str, arguments: bytes, task: bytes
    ) -> msgspec.Raw:
        """A task-augmented ``tools/call``; the ``CreateTaskResult`` comes back raw."""
        params = {
            "name": name,
            "arguments": msgspec.json.decode(arguments),
            "task": msgspec.json.decode(task),
        }
        return await self._raw_request("tools/call", params)

    async def task_request(self, method: str, params: dict[str, Any]) -> msgspec.Raw:
        return await self._raw_request(method, params)

    async def _raw_request(self, method: str, params: dict[str, Any]) -> msgspec.Raw:
        """A request SDK 2.3's client has no API for (the handshake era's
        ``tasks/*``, a task-augmented ``tools/call``): sent as the session
        sends its own (the same stamp and read timeout), its result returned
        as JSON, unchecked but for being an object; the caller's layer
        (``tasks.py``) reads what it needs. Takes the session's private
        ``_stamp``/``_dispatcher``, pinned by ``mcp<2.4`` as ``probe`` does;
        never on a plain call's path. The server's status notifications are
        heard by ``_Unspoken``."""
        session = self._client.session
        data: dict[str, Any] = {"method": method, "params": params}
        opts: CallOptions = {}
        session._stamp(data, opts)
        timeout = session._session_read_timeout_seconds
        if timeout is not None:
            opts["timeout"] = timeout
        raw = await self._guarded(
            lambda: session._dispatcher.send_raw_request(method, data["params"], opts)
        )
        return msgspec.Raw(msgspec.json.encode(raw))

    def can_subscribe(self) -> bool:
        resources = self._client.server_capabilities.resources
        return resources is not None and resources.subscribe is True

    async def subscribe_resource(self, uri: str) -> None:
        if self.protocol_version == MODERN:
            await self._listen_for(self._resources | {uri})
            if uri not in self._resources:
                raise not_honored(self._server, uri)
            return
        request = types.SubscribeRequest(params=types.SubscribeRequestParams(uri=uri))
        session = self._client.session
        await self._guarded(lambda: session.send_request(request, types.EmptyResult))

    async def unsubscribe_resource(self, uri: str) -> None:
        if self.protocol_version == MODERN:
            await self._listen_for(self._resources - {uri})
            return
        request = types.UnsubscribeRequest(
            params=types.UnsubscribeRequestParams(uri=uri)
        )
        session = self._client.session
        await self._guarded(lambda: session.send_request(request, types.EmptyResult))

    async def _listen_for(self, uris: frozenset[str], *, again: bool = False) -> None:
        """2026-07-28: the URIs held are one listen stream's
        (``resource_subscriptions``), as for stdio servers (``jsonrpc.py``):
        another set is another stream, acknowledged before the old one is let
        go, so no update falls between them. The caller bounds the wait."""
        if (uris == self._resources and not again) or self._closed:
            return
        old, held = self._held, None
        if uris:
            held = _ResourceStream(uris)
            self._streams.spawn(self._hold, held, name=f"{self._server} listen")
            await held.acked.wait()
            if held.error is not None:
                raise held.error
            uris = held.uris  # the server says which it takes
        self._resources, self._held = uris, held
        if old is not None:
            old.let_go()

    async def _hold(self, held: _ResourceStream) -> None:
        """One listen stream, until it is let go or the server ends it; one
        the server ended while it was held is opened again after a pause
        (its URIs still held; a stream has no replay)."""

        async def relay_updates() -> None:
            async with self._client.listen(
                resource_subscriptions=sorted(held.uris)
            ) as stream:
                honored = stream.honored.resource_subscriptions or ()
                held.uris = held.uris & frozenset(honored)
                held.acked.set()
                async for _event in stream:
                    pass  # the SDK also hands each to ``on_message``, as for stdio

        with held.scope:
            try:
                await self._guarded(relay_updates)
            except SubscriptionLost as exc:  # dropped, not ended: held again
                if not held.acked.is_set():
                    held.error = ConnectionLost(f"{self._server}: {exc}")
                log.info("%s: resource listen stream lost: %s", self._server, exc)
            except (RemoteError, ConnectionLost) as exc:
                held.error = exc
                if held.acked.is_set():
                    log.info("%s: resource listen stream: %s", self._server, exc)
            finally:
                held.acked.set()
        if not held.scope.cancel_called and held.error is None and not self._closed:
            await anyio.sleep(LISTEN_AGAIN_S)  # the server ended it
            await self._renew(held)

    async def _renew(self, ended: _ResourceStream) -> None:
        """Hold the URIs again on a new stream, if ``ended`` (which the
        server ended) is still the one that held them."""
        if self._held is ended and not self._closed:
            self._held = None
            with suppress(RemoteError, ConnectionLost):
                await self._listen_for(self._resources, again=True)

    async def close(self) -> None:
        """Let go of the listen streams held (before the client closes)."""
        self._closed = True
        if self._held is not None:
            self._held.let_go()
        with anyio.move_on_after(CLOSE_WAIT_S):
            await self._streams.join()

    async def complete(self, params: dict[str, Any]) -> dict[str, Any]:
        request = types.CompleteRequest(
            params=types.CompleteRequestParams.model_validate(params)
        )
        session = self._client.session
        result = await self._guarded(
            lambda: session.send_request(request, types.CompleteResult)
        )
        return _dump(result)

    async def probe(self) -> None:
        """``ping`` (2025-11-25) or ``server/discover`` (2026-07-28).

        A probe that gets no answer in time sends no ``notifications/cancelled``
        (the SDK sends none for ``server/discover`` either): on a wedged
        transport (a legacy SSE POST the server never answers holds every later
        message) the SDK would wait up to 5 s to write it, holding back the
        verdict that replaces the session, and the callers that wait for it.
        That takes the session's private ``_stamp``/``_dispatcher`` (pinned by
        ``mcp<2.4``; off the hot path: ``call_tool`` uses public API only).
        """
        session = self._client.session
        if self.protocol_version == MODERN:
            await self._guarded(lambda: session.send_discover(MODERN))
            return
        data: dict[str, Any] = {"method": "ping", "params": {}}
        opts: CallOptions = {"cancel_on_abandon": False}
        session._stamp(data, opts)
        await self._guarded(
            lambda: session._dispatcher.send_raw_request("ping", data["params"], opts)
        )

    async def watch_tool_changes(self, on_change: Callable[[], None]) -> bool:
        """2026-07-28: a ``subscriptions/listen`` stream for the tools,
        resources and prompts list changes the server declares, held open
        until the server ends it (True). Its events reach ``on_notification``
        like the handshake era's notifications (the SDK hands each to
        ``on_message`` too), as for stdio servers (``jsonrpc.py``). The
        handshake era needs nothing: returns False at once."""
        capabilities = self._client.server_capabilities

        def changes(name: str) -> bool:
            declared = getattr(capabilities, name, None)
            return declared is not None and declared.list_changed is True

        tools, resources, prompts = (
            changes(name) for name in ("tools", "resources", "prompts")
        )
        if self.protocol_version != MODERN or not (tools or resources or prompts):
            return False
        async with self._client.listen(
            tools_list_changed=tools,
            resources_list_changed=resources,
            prompts_list_changed=prompts,
        ) as subscription:
            async for _event in subscription:
                pass
        return True
