"""Our MCP client for stdio servers: JSON-RPC 2.0, one message per line, no SDK.

Why not the SDK's ``ClientSession``: on the hot path it builds pydantic
models for every request, validates each result twice and dumps it again,
and it costs a megabyte-scale import on a host that runs only stdio servers.
Here a ``tools/call`` goes out as the caller's argument bytes and comes back
as the bytes the server wrote (``ToolResult.raw``), checked for MCP's shape
(``CallShape``) but never rebuilt; listings are decoded once, straight into
the wire structs.

Both protocol eras (MCP-SDK-2.3.md §1):

* handshake era (2025-11-25 and earlier): ``initialize``, then
  ``notifications/initialized``; change notifications arrive as such;
* 2026-07-28: no handshake; ``server/discover`` probes the server, and every
  request carries the protocol version, our identity and capabilities in
  ``params._meta``; tool list changes arrive on a ``subscriptions/listen``
  stream.

``auto`` tries ``server/discover`` first (at most ``DISCOVER_TIMEOUT_S``) and
falls back to ``initialize`` on any error answer or silence, as the SDK does.
A server known to speak 2026-07-28 (``2026-07-28`` mode) has no fallback: its
``server/discover`` is bounded only by the start's own budget (the caller's
scope), so that a server slow to start is not cut off at the probe's bound on
every try.

A request the caller abandons (its deadline, its client gone) is cancelled
upstream with ``notifications/cancelled``; the negotiation and the probe
never are (the spec forbids cancelling them; a probe that gets no answer
condemns the session anyway). The server's own requests get an answer:
``ping`` an empty result, ``roots/list`` the server's configured roots (if
any: then the handshake declares ``roots``), ``elicitation/create`` and
``sampling/createMessage`` the answer of the caller whose call they serve
(``asks.py``: declared in the handshake, relayed in a task of their own),
anything else a ``-32601``.
"""

from __future__ import annotations

import collections
import itertools
import logging
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from typing import Any, Final, Protocol, TypeVar

import anyio
import anyio.abc
import msgspec

from memorizz.api import mcp_meta
from memorizz.api import methods as m
from memorizz.api.errors import RemoteError, UpstreamError
from memorizzd import __version__
from memorizzd.calllife import ASKED, INTERNAL_ERROR, AskRefused
from memorizzd.egress.envelope import EnvelopeScanner
from memorizzd.loop import Signal
from memorizzd.telemetry import tracing
from memorizzd.upstream.asks import (
    INPUT_ROUNDS_MAX,
    Call,
    InFlight,
    InputRequired,
    fulfil,
    input_required,
    unanswered,
)
from memorizzd.upstream.connection import (
    CallShape,
    Cursors,
    ProgressHandler,
    ToolResult,
    told,
)
from memorizzd.upstream.errors import (
    METHOD_NOT_FOUND,
    ConnectionLost,
    Unsent,
    malformed_result,
    not_honored,
    rpc_error,
)
from memorizzd.upstream.stdio import LogBudget, StdioPipes, StdioProcess, stdio_pipes

log = logging.getLogger("memorizzd.upstream.jsonrpc")

MODERN: Final = "2026-07-28"
ACKNOWLEDGED: Final = "notifications/subscriptions/acknowledged"
LISTEN_AGAIN_S: Final = 1.0
"""A resource listen stream the server ended is opened again after this."""
HANDSHAKE_VERSION: Final = "2025-11-25"
HANDSHAKE_VERSIONS: Final = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
DISCOVER_TIMEOUT_S: Final = 10.0
ENVELOPE_MAX: Final = 64 * 1024
"""A stdio message's bytes besides its result, at most: the pipes take a line
of the server's ``max_result_bytes`` and this more (``Launch``)."""
PROGRESS_SEND_S: Final = 1.0
"""How long one progress notification may take to pass on before it is dropped."""
REPLIES_UNREAD_MAX: Final = 4 << 20
"""Bytes the server has not read from its stdin past which its requests go unanswered."""
PROGRESS_KEPT_BYTES: Final = 256 * 1024
"""One call's progress notifications waiting for a slow caller, at most (the oldest go)."""
JUNK_LINES_LOGGED: Final = 5
JUNK_WINDOW_S: Final = 60.0
"""Lines on stdout that are not JSON-RPC: at most ``JUNK_LINES_LOGGED`` of them
are logged in each ``JUNK_WINDOW_S`` (a window opens with the first such line
after the last window ended); the rest are counted, and the count logged once
when the window ends or the session does (``stdio.LogBudget``)."""

_LOG_LEVEL: Final = mcp_meta.LOG_LEVEL.encode()
"""2026-07-28: a request's ``_meta`` member that asks for the server's logs."""
_CLIENT_INFO: Final = {"name": "memorizzd", "version": __version__}
_NOT_CANCELLED: Final = frozenset({"initialize", "server/discover", "ping"})
_ASKS: Final[dict[str, Any]] = {
    "elicitation": {"form": {}, "url": {}},
    "sampling": {"tools": {}},
}
"""Declared in the handshake: a caller's client may answer them (``asks.py``)."""

T = TypeVar("T")
NotificationHandler = Callable[[str, msgspec.Raw], None]
"""Told each notification from the server: its method and raw params (empty: none)."""


class _Error(msgspec.Struct):
    code: int
    message: str = ""
    data: Any = None


def _absent() -> msgspec.Raw:
    return msgspec.Raw(b"")


class _Message(msgspec.Struct):
    """Any JSON-RPC message, its payload left unread (``msgspec.Raw``; an
    empty one: the member is absent)."""

    id: int | str | None = None
    method: str | None = None
    params: msgspec.Raw = msgspec.field(default_factory=_absent)
    result: msgspec.Raw = msgspec.field(default_factory=_absent)
    error: _Error | None = None


Message = _Message
"""One JSON-RPC message as the server wrote it (``result`` unread)."""


class _Subscription(msgspec.Struct):
    id: str | int | None = msgspec.field(default=None, name=mcp_meta.SUBSCRIPTION_ID)


class _Stamped(msgspec.Struct):
    meta: _Subscription | None = msgspec.field(default=None, name="_meta")


class _Honored(msgspec.Struct, rename="camel"):
    resource_subscriptions: list[str] | None = None


class _Acknowledged(msgspec.Struct):
    notifications: _Honored | None = None


def _honored_uris(params: msgspec.Raw) -> frozenset[str] | None:
    """The resource URIs a listen stream's acknowledgement honors (None: it
    says nothing we can read, so what was asked is taken as honored)."""
    try:
        honored = msgspec.json.decode(params, type=_Acknowledged).notifications
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
        return None
    if honored is None:
        return None
    return frozenset(honored.resource_subscriptions or ())


def _subscription_of(params: msgspec.Raw) -> str | None:
    """The listen stream a notification's ``_meta`` names (ours are strings)."""
    try:
        meta = msgspec.json.decode(params, type=_Stamped).meta
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
        return None
    found = None if meta is None else meta.id
    return found if isinstance(found, str) else None


class _Info(msgspec.Struct):
    name: str | None = None
    version: str | None = None


class _InitializeResult(msgspec.Struct, rename="camel"):
    protocol_version: str
    capabilities: dict[str, Any] = {}
    server_info: _Info | None = None
    instructions: Any = None
    """Kept if a string (``told``): a server's odd one fails no handshake."""


class _DiscoverResult(msgspec.Struct, rename="camel"):
    supported_versions: list[str]
    capabilities: dict[str, Any] = {}
    instructions: Any = None
    meta: dict[str, Any] | None = msgspec.field(default=None, name="_meta")


class _ToolsPage(msgspec.Struct, rename="camel"):
    items: list[m.Tool] = msgspec.field(name="tools")
    next_cursor: str | None = None


class _ResourcesPage(msgspec.Struct, rename="camel"):
    items: list[m.Resource] = msgspec.field(name="resources")
    next_cursor: str | None = None


class _TemplatesPage(msgspec.Struct, rename="camel"):
    items: list[m.ResourceTemplate] = msgspec.field(name="resourceTemplates")
    next_cursor: str | None = None


class _PromptsPage(msgspec.Struct, rename="camel"):
    items: list[m.Prompt] = msgspec.field(name="prompts")
    next_cursor: str | None = None


class _Progress(msgspec.Struct, rename="camel"):
    progress_token: int | str | None = None


_decode_progress = msgspec.json.Decoder(_Progress).decode
_decode_message = msgspec.json.Decoder(_Message).decode
_decode_call_shape = msgspec.json.Decoder(CallShape).decode
_encode = msgspec.json.Encoder().encode
TOO_DEEP: Final = "nested too deeply to be read"
"""Past msgspec's nesting limit (about 1000 levels, the recursion limit's)."""


def _decode_shape(raw: bytes) -> CallShape:
    """A tool result's shape; ``ValidationError`` for one nested too deeply
    (a result the reader could read may be too deep where it is read again,
    higher up the stack)."""
    try:
        return _decode_call_shape(raw)
    except RecursionError:
        raise msgspec.ValidationError(f"the result is {TOO_DEEP}") from None


class _Waiter:
    """A task waiting for the answer to one request."""

    __slots__ = ("done", "message")

    def __init__(self) -> None:
        self.done = Signal()
        self.message: _Message | None = None

    def deliver(self, message: _Message | None) -> None:
        """The answer (None: the session ended first)."""
        self.message = message
        self.done.set()


class _ProgressLane:
    """One call's progress on its way to its caller, apart from the
    session's reader: reports are passed on in order, one at a time (each
    for at most ``PROGRESS_SEND_S``, then skipped); those that come
    meanwhile wait, up to ``PROGRESS_KEPT_BYTES``, past which the oldest
    waiting are dropped. So a caller that reads its progress slower than
    the server sends it gets the latest reports, and holds up neither the
    other callers' answers nor the daemon's memory."""

    __slots__ = ("_handler", "_idle", "_kept", "_sending", "_spawn", "_waiting")

    def __init__(
        self,
        handler: ProgressHandler,
        spawn: Callable[[Callable[[], Coroutine[Any, Any, None]]], bool],
    ) -> None:
        self._handler = handler
        self._spawn = spawn
        self._waiting: collections.deque[msgspec.Raw] = collections.deque()
        self._kept = 0
        self._sending = False
        self._idle: Signal | None = None

    def tell(self, params: msgspec.Raw) -> None:
        waiting = self._waiting
        waiting.append(params)
        self._kept += len(params)
        while self._kept > PROGRESS_KEPT_BYTES and len(waiting) > 1:
            self._kept -= len(waiting.popleft())
        if not self._sending:
            self._sending = self._spawn(self._send)

    async def _send(self) -> None:
        waiting = self._waiting
        try:
            while waiting:
                params = waiting.popleft()
                self._kept -= len(params)
                with anyio.move_on_after(PROGRESS_SEND_S):
                    await self._handler(params)
        except Exception:  # a bug: logged; the session goes on
            log.exception("passing a progress report on failed")
        finally:
            self._sending = False
            if self._idle is not None:
                self._idle.set()

    async def settle(self) -> None:
        """The call ends: the reports told are passed on before its result,
        within ``PROGRESS_SEND_S``; those still waiting then are dropped."""
        if self._sending:
            self._idle = Signal()
            with anyio.move_on_after(PROGRESS_SEND_S):
                await self._idle.wait()
        self.drop()

    def drop(self) -> None:
        """Pass nothing more on (the one being passed on ends by itself)."""
        self._waiting.clear()
        self._kept = 0


class AsksFirst(Exception):
    """A 2026-07-28 server answered a call by asking its caller first."""

    def __init__(self, asked: InputRequired) -> None:
        super().__init__("input required")
        self.asked = asked


class Answered(Protocol):
    """Whoever waits for one request's answer (a task's ``_Waiter``, or the
    warm relay's call, ``memorizzd.relay``, which has no task)."""

    def deliver(self, message: _Message | None) -> None: ...


class JsonRpcSession:
    """One negotiated MCP session over a stdio server's pipes (a ``Connection``)."""

    def __init__(
        self,
        pipes: StdioPipes,
        *,
        server: str,
        on_notification: NotificationHandler | None = None,
        roots: tuple[str, ...] = (),
        max_result_bytes: int = m.DEFAULT_MAX_RESULT_BYTES,
    ) -> None:
        self._pipes = pipes
        self._server = server
        self._max_result_bytes = max_result_bytes
        """The server's cap on one result, and on a listing's pages together."""
        self._on_notification = on_notification
        self._roots = roots
        """The server's configured roots (declared in the handshake era)."""
        self._ids = itertools.count(1)
        self._waiting: dict[int | str, Answered] = {}
        self._closed: str | None = None
        """Why the session ended (None while it lives)."""
        self._meta: bytes = b""
        """The 2026-07-28 ``_meta`` member every request's params carry (empty before)."""
        self._plain: bytes = b""
        """... as a ``tools/call`` of a caller that answers nothing carries it:
        its client capabilities empty (``_call_meta``)."""
        self._stamp: dict[str, Any] = {}
        """``_meta``'s members as a dict (2026-07-28)."""
        self.protocol_version: str | None = None
        self.server_name: str | None = None
        self.server_version: str | None = None
        self.instructions: str | None = None
        """What the server tells its clients at the handshake (``told``)."""
        self._capabilities: dict[str, Any] = {}
        self._progress: dict[str, _ProgressLane] = {}
        """Calls that asked for progress, by the token we sent."""
        self._progress_ids = itertools.count(1)
        self._listens = itertools.count(1)
        """Our ``subscriptions/listen`` requests' ids (``listen-N``)."""
        self._resources: frozenset[str] = frozenset()
        """2026-07-28: the URIs held, all on one listen stream (``_resource_stream``)."""
        self._resource_stream: str | None = None
        self._acks: dict[str, Signal] = {}
        """Listen streams of ours not acknowledged yet, by id."""
        self._honored: dict[str, frozenset[str]] = {}
        """The resource URIs each listen stream's acknowledgement honored."""
        self._in_flight = InFlight(server)
        """Calls in flight, for the server's requests of a caller (``asks.py``)."""
        self._tasks: anyio.abc.TaskGroup | None = None
        """Where the server's requests of a caller wait (``open_session``)."""
        self.ended = anyio.Event()
        """Set when the server closed its stdout (the session is over)."""
        self._unread = False
        """Its requests go unanswered: it does not read its stdin (``_reply``)."""
        self._junk = LogBudget(JUNK_LINES_LOGGED, JUNK_WINDOW_S, self._junk_not_logged)
        """The log of lines on stdout that are not JSON-RPC, bounded (``read``)."""
        pipes.take_answers(self._answers_now)

    # --- the Connection ----------------------------------------------------

    def declares(self, capability: str) -> bool:
        return isinstance(self._capabilities.get(capability), dict)

    async def call_tool(
        self, name: str, arguments: bytes, progress: ProgressHandler | None = None
    ) -> ToolResult:
        key, call = self._in_flight.enter()
        try:
            return await self._call_tool(name, arguments, progress, call)
        finally:
            self._in_flight.leave(key)

    def start_call(
        self, name: str, arguments: bytes, waiter: Answered
    ) -> tuple[int, int, Call] | None:
        """Send ``tools/call`` now, its answer to ``waiter`` (from the reader,
        no task): the warm relay's way (``memorizzd.relay``). Returns the
        request's id, and its key and entry among the calls in flight (for the
        server's requests of a caller; ``end_call`` when it is over). None when
        it cannot be sent that way now (the session ended, or the server is not
        reading its stdin); the call then takes ``call_tool``'s way."""
        if self._closed is not None or not self._pipes.has_room():
            return None
        rid = next(self._ids)
        line = (
            b'{"jsonrpc":"2.0","id":'
            + _encode(rid)
            + b',"method":"tools/call","params":{"name":'
            + _encode(name)
            + b',"arguments":'
            + arguments
            + self._plain  # a relayed call's caller answers nothing
            + b"}}\n"
        )
        try:
            self._pipes.write_now(line)
        except ConnectionLost:
            return None
        self._waiting[rid] = waiter
        key, call = self._in_flight.enter()
        return rid, key, call

    def end_call(self, key: int) -> None:
        """A call ``start_call`` began is over."""
        self._in_flight.leave(key)

    def forget(self, rid: int | str) -> bool:
        """Stop waiting for ``rid`` and tell the server so (no task: the
        notification is put in the pipe). False: it was answered already."""
        if self._waiting.pop(rid, None) is None:
            return False
        self._tell_cancelled(rid)
        return True

    def _tell_cancelled(self, rid: int | str) -> None:
        """Tell the server we stopped waiting for ``rid``: put in the pipe,
        never waited for (a server that does not read its stdin must not
        hold the caller past its deadline)."""
        note = {
            "jsonrpc": "2.0",
            "method": "notifications/cancelled",
            "params": {"requestId": rid, "reason": "the caller stopped waiting"},
        }
        with suppress(ConnectionLost):
            self._pipes.write_now(_encode(note) + b"\n")

    def result_of(self, message: _Message | None) -> ToolResult:
        """A ``tools/call`` answer as ``call_tool`` returns it, or its error raised
        (``AsksFirst``: a 2026-07-28 server asks first, see ``input_rounds``)."""
        if message is None:
            raise ConnectionLost(self._why())
        if message.error is not None:
            error = message.error
            raise rpc_error(error.code, error.message, error.data, server=self._server)
        raw = message.result
        if not raw:  # absent: msgspec.Raw(b"")
            raise _neither(self._server)
        try:
            shape = _decode_shape(raw)
        except msgspec.ValidationError as exc:
            if (asked := input_required(raw)) is not None:
                raise AsksFirst(asked) from None
            raise UpstreamError(
                f"{self._server}: the server sent a malformed tool result ({exc})",
                data={"server": self._server},
            ) from None
        return ToolResult(raw, shape.is_error)

    def _call_meta(self, call: Call) -> bytes:
        """A ``tools/call``'s ``_meta`` member (2026-07-28; else empty). Its
        client capabilities are what the caller can answer: a server reads
        them per request, and one that would ask a caller who cannot answer
        can do without, or say so itself (and parses less). With the
        caller's log level when it asked for log messages (a server logs only
        to requests that opt in), and with tracing on the call's trace
        context (``traceparent``, MCP's convention)."""
        if not self._meta:
            return _traced(b"") if tracing.enabled else b""
        if call.asker is None:
            meta = self._plain
        else:
            meta = b',"_meta":' + _encode(
                self._stamp
                | {mcp_meta.CLIENT_CAPABILITIES: _answerable(call.asker.capabilities)}
            )
        if tracing.enabled:
            meta = _traced(meta)
        if call.log_level is None:
            return meta
        stamp = b'"' + _LOG_LEVEL + b'":' + _encode(call.log_level) + b","
        return b',"_meta":{' + stamp + meta[len(b',"_meta":{') :]

    async def _call_tool(
        self, name: str, arguments: bytes, progress: ProgressHandler | None, call: Call
    ) -> ToolResult:
        params = b'{"name":' + _encode(name) + b',"arguments":' + arguments
        if progress is None:
            raw = await self._request(
                "tools/call", params + self._call_meta(call) + b"}"
            )
        else:  # a token of ours in _meta: its notifications come to progress
            token = call.token = f"mz-{next(self._progress_ids)}"
            lane = self._progress[token] = _ProgressLane(progress, self._spawn)
            stamp = b'"progressToken":' + _encode(token)
            base = self._call_meta(call)
            meta = (
                b',"_meta":{' + stamp + b"," + base[len(b',"_meta":{') :]
                if base
                else b',"_meta":{' + stamp + b"}"
            )
            try:
                raw = await self._request("tools/call", params + meta + b"}")
            except Exception:
                del self._progress[token]
                await lane.settle()  # the reports passed on come before the error
                raise
            except BaseException:
                del self._progress[token]
                lane.drop()  # cancelled: no report after its end
                raise
            del self._progress[token]
            await lane.settle()  # ... and before the result
        try:
            shape = _decode_shape(raw)
        except msgspec.ValidationError as exc:
            if (asked := input_required(raw)) is not None:  # 2026-07-28 asks
                return await self.input_rounds(name, arguments, call, asked)
            raise UpstreamError(
                f"{self._server}: the server sent a malformed tool result ({exc})",
                data={"server": self._server},
            ) from None
        return ToolResult(raw, shape.is_error)

    async def input_rounds(
        self, name: str, arguments: bytes, call: Call, asked: InputRequired
    ) -> ToolResult:
        """A 2026-07-28 server asked for input instead of a result: its
        requests go to the caller (``asks.fulfil``), the call is sent again
        with the answers and the server's state, until a result (at most
        ``INPUT_ROUNDS_MAX`` rounds); a caller that cannot answer ends it
        with an ``isError`` result saying why."""
        for _ in range(INPUT_ROUNDS_MAX):
            try:
                answers = await fulfil(call, asked)
            except AskRefused as exc:
                log.info("%s: input not given: %s", self._server, exc)
                return ToolResult(
                    msgspec.Raw(unanswered(self._server, exc.message)), True
                )
            retry: dict[str, Any] = {"inputResponses": answers}
            if asked.request_state is not None:
                retry["requestState"] = asked.request_state
            params = (
                b'{"name":'
                + _encode(name)
                + b',"arguments":'
                + arguments
                + b","
                + _encode(retry)[1:-1]
                + self._call_meta(call)
                + b"}"
            )
            raw = await self._request("tools/call", params)
            found = input_required(raw)
            if found is None:
                try:
                    return ToolResult(raw, _decode_shape(raw).is_error)
                except msgspec.ValidationError as exc:
                    raise UpstreamError(
                        f"{self._server}: the server sent a malformed tool result ({exc})",
                        data={"server": self._server},
                    ) from None
            asked = found
        why = f"it asked again after {INPUT_ROUNDS_MAX} rounds of answers"
        return ToolResult(msgspec.Raw(unanswered(self._server, why)), True)

    def takes_tool_tasks(self) -> bool:
        """The handshake era's tasks (2025-11-25): ``tasks.requests.tools.call``."""
        tasks = self._capabilities.get("tasks")
        requests = tasks.get("requests") if isinstance(tasks, dict) else None
        tools = requests.get("tools") if isinstance(requests, dict) else None
        return (
            self.protocol_version != MODERN
            and isinstance(tools, dict)
            and isinstance(tools.get("call"), dict)
        )

    async def call_tool_task(
        self, name: str, arguments: bytes, task: bytes
    ) -> msgspec.Raw:
        """A task-augmented ``tools/call``: the arguments and the task metadata
        go out as the caller's bytes; the ``CreateTaskResult`` comes back raw."""
        params = (
            b'{"name":'
            + _encode(name)
            + b',"arguments":'
            + arguments
            + b',"task":'
            + task
            + self._meta
            + b"}"
        )
        return await self._request("tools/call", params)

    async def task_request(self, method: str, params: dict[str, Any]) -> msgspec.Raw:
        return await self._request(method, self._params(params))

    async def list_tools(self, *, page_limit: int) -> list[m.Tool]:
        return await self._listing("tools/list", _ToolsPage, page_limit)

    async def list_resources(self, *, page_limit: int) -> list[m.Resource]:
        return await self._listing("resources/list", _ResourcesPage, page_limit)

    async def list_resource_templates(
        self, *, page_limit: int
    ) -> list[m.ResourceTemplate]:
        method = "resources/templates/list"
        return await self._listing(method, _TemplatesPage, page_limit)

    async def read_resource(self, uri: str) -> m.ResourcesReadResult:
        raw = await self._request("resources/read", self._params({"uri": uri}))
        return self._decode(raw, m.ResourcesReadResult, "resources/read")

    async def list_prompts(self, *, page_limit: int) -> list[m.Prompt]:
        return await self._listing("prompts/list", _PromptsPage, page_limit)

    async def get_prompt(
        self, name: str, arguments: dict[str, str]
    ) -> m.PromptsGetResult:
        params = self._params({"name": name, "arguments": arguments})
        raw = await self._request("prompts/get", params)
        return self._decode(raw, m.PromptsGetResult, "prompts/get")

    def can_subscribe(self) -> bool:
        resources = self._capabilities.get("resources")
        return isinstance(resources, dict) and resources.get("subscribe") is True

    async def subscribe_resource(self, uri: str) -> None:
        if self.protocol_version == MODERN:
            await self._listen_for(self._resources | {uri})
            if uri not in self._resources:
                raise not_honored(self._server, uri)
        else:
            await self._request("resources/subscribe", self._params({"uri": uri}))

    async def unsubscribe_resource(self, uri: str) -> None:
        if self.protocol_version == MODERN:
            await self._listen_for(self._resources - {uri})
        else:
            await self._request("resources/unsubscribe", self._params({"uri": uri}))

    async def _listen_for(self, uris: frozenset[str], *, again: bool = False) -> None:
        """2026-07-28: the URIs held are one listen stream's
        (``resourceSubscriptions``); another set is another stream, opened and
        acknowledged before the old one is let go, so no update falls between
        them. The caller bounds the wait for the acknowledgement."""
        if uris == self._resources and not again:
            return
        old, stream = self._resource_stream, None
        if uris:
            stream = f"listen-{next(self._listens)}"
            acked = self._acks[stream] = Signal()
            params = self._params(
                {"notifications": {"resourceSubscriptions": sorted(uris)}}
            )
            if self._tasks is None:
                raise ConnectionLost("the session is not running")
            self._tasks.start_soon(self._hold_stream, stream, params)
            try:
                await acked.wait()
            finally:
                self._acks.pop(stream, None)
                honored = self._honored.pop(stream, uris)
            if stream not in self._waiting:  # refused, or the session ended
                raise UpstreamError(
                    f"{self._server}: the server did not open a resource listen stream"
                )
            uris = uris & honored  # the server says which it takes
        self._resources, self._resource_stream = uris, stream
        if old is not None:  # let go: the server is told, its task ends
            waiter = self._waiting.get(old)
            self.forget(old)
            if waiter is not None:
                waiter.deliver(None)

    async def _hold_stream(self, stream: str, params: bytes) -> None:
        """One listen stream of ours, until it is let go or the server ends it;
        one the server ended while it was ours is opened again (its URIs
        still held; a stream has no replay)."""
        try:
            await self._request("subscriptions/listen", params, request_id=stream)
        except (RemoteError, ConnectionLost) as exc:
            if self._resource_stream == stream or stream in self._acks:
                log.info("%s: resource listen stream %s: %s", self._server, stream, exc)
        finally:
            if (acked := self._acks.pop(stream, None)) is not None:
                acked.set()  # refused before its acknowledgement
        if self._resource_stream == stream and self._closed is None:
            self._resource_stream = None  # the server ended it: hold the URIs again
            await anyio.sleep(LISTEN_AGAIN_S)
            await self._renew()

    async def _renew(self) -> None:
        """Open a stream for the URIs held, if none is open (the server ended it)."""
        if self._resource_stream is None and self._resources:
            with suppress(RemoteError, ConnectionLost):
                await self._listen_for(self._resources, again=True)

    async def complete(self, params: dict[str, Any]) -> dict[str, Any]:
        raw = await self._request("completion/complete", self._params(params))
        return self._decode(raw, dict[str, Any], "completion/complete")

    async def probe(self) -> None:
        if self.protocol_version == MODERN:
            await self._request("server/discover", self._params({}))
        else:
            await self._request("ping", b"{}")

    async def watch_tool_changes(self, on_change: Callable[[], None]) -> bool:
        """2026-07-28: a ``subscriptions/listen`` stream for the tools,
        resources and prompts list changes the server declares (its
        notifications reach ``on_notification`` like the handshake era's);
        held open until the server ends it (True). The handshake era needs
        nothing: returns False at once."""
        if self.protocol_version != MODERN:
            return False
        wanted = {
            f"{capability}ListChanged": True
            for capability in ("tools", "resources", "prompts")
            if isinstance(declared := self._capabilities.get(capability), dict)
            and declared.get("listChanged")
        }
        if not wanted:
            return False
        params = self._params({"notifications": wanted})
        listen_id = f"listen-{next(self._listens)}"
        await self._request("subscriptions/listen", params, request_id=listen_id)
        return True

    # --- negotiation -------------------------------------------------------

    async def negotiate(self, mode: str) -> None:
        """The handshake (or the probe) for ``mode``, within the caller's scope."""
        if mode not in ("auto", MODERN):
            await self._initialize()
            return
        if mode == MODERN:
            await self._discover()
            return
        try:
            with anyio.fail_after(DISCOVER_TIMEOUT_S):
                await self._discover()
            return
        except (RemoteError, TimeoutError) as exc:
            late = isinstance(exc, TimeoutError)
            log.info(
                "%s: no answer to server/discover (%s); trying initialize",
                self._server,
                str(exc) or "timed out",
            )
        try:
            await self._initialize()
        except RemoteError:
            if not late:
                raise
            # A server slow to start (a loaded host) answered the probe after
            # its deadline and now refuses the handshake: it speaks 2026-07-28.
            await self._discover()

    async def _discover(self) -> None:
        meta = {
            mcp_meta.PROTOCOL_VERSION: MODERN,
            mcp_meta.CLIENT_INFO: _CLIENT_INFO,
            mcp_meta.CLIENT_CAPABILITIES: _ASKS,  # asked the 2026-07-28 way (asks.py)
        }
        raw = await self._request("server/discover", _encode({"_meta": meta}))
        result = self._decode(raw, _DiscoverResult, "server/discover")
        if MODERN not in result.supported_versions:
            raise UpstreamError(
                f"{self._server}: server/discover offers no version we speak "
                f"({', '.join(result.supported_versions[:8])})"
            )
        info = (result.meta or {}).get(mcp_meta.SERVER_INFO)
        if isinstance(info, dict):
            name, version = info.get("name"), info.get("version")
            self.server_name = name if isinstance(name, str) else None
            self.server_version = version if isinstance(version, str) else None
        self.instructions = told(result.instructions)
        self._capabilities = result.capabilities
        self.protocol_version = MODERN
        self._stamp = meta
        self._meta = b',"_meta":' + _encode(meta)
        self._plain = b',"_meta":' + _encode(meta | {mcp_meta.CLIENT_CAPABILITIES: {}})

    async def _initialize(self) -> None:
        params = {
            "protocolVersion": HANDSHAKE_VERSION,
            "capabilities": _ASKS
            | ({"roots": {"listChanged": False}} if self._roots else {}),
            "clientInfo": _CLIENT_INFO,
        }
        raw = await self._request("initialize", _encode(params))
        result = self._decode(raw, _InitializeResult, "initialize")
        if result.protocol_version not in HANDSHAKE_VERSIONS:
            raise UpstreamError(
                f"{self._server}: the server answered initialize with protocol "
                f"version {result.protocol_version[:40]!r}, which we do not speak"
            )
        if result.server_info is not None:
            self.server_name = result.server_info.name
            self.server_version = result.server_info.version
        self.instructions = told(result.instructions)
        self._capabilities = result.capabilities
        self.protocol_version = result.protocol_version
        self._stamp = {}
        self._meta = self._plain = b""
        await self._send(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')

    # --- requests ----------------------------------------------------------

    def _params(self, params: Mapping[str, Any]) -> bytes:
        """``params`` as JSON, with the era's ``_meta`` (``_meta`` must be
        last: the stamp is appended before the closing brace)."""
        encoded = _encode(params)
        if not self._meta:
            return encoded
        if encoded == b"{}":
            return b"{" + self._meta[1:] + b"}"
        return encoded[:-1] + self._meta + b"}"

    async def _listing(
        self, method: str, page_type: type[Any], page_limit: int
    ) -> list[Any]:
        """Every item of a listing, pages followed by cursor (at most
        ``page_limit``, their results' bytes counted before each is decoded)."""
        items: list[Any] = []
        cursors = Cursors(
            self._server, page_limit, method=method, max_bytes=self._max_result_bytes
        )
        cursor: str | None = None
        while True:
            params = self._params({"cursor": cursor} if cursor else {})
            raw = await self._request(method, params)
            cursors.page(len(raw))
            page = self._decode(raw, page_type, method)
            items += page.items
            cursor = cursors.follow(page.next_cursor)
            if cursor is None:
                return items

    def _decode(self, raw: bytes, into: type[T], method: str) -> T:
        try:
            return msgspec.json.decode(raw, type=into)
        except (msgspec.ValidationError, RecursionError) as exc:
            said = str(exc) if isinstance(exc, msgspec.ValidationError) else TOO_DEEP
            raise malformed_result(self._server, method, said) from None

    async def _request(
        self, method: str, params: bytes, *, request_id: int | str | None = None
    ) -> msgspec.Raw:
        """Send one request and wait for its answer: the result's raw JSON, or
        the error raised as ours. The caller's cancel scope bounds the wait."""
        if self._closed is not None:  # not sent: it may go on the next session
            raise Unsent(self._why())
        rid = next(self._ids) if request_id is None else request_id
        waiter = self._waiting[rid] = _Waiter()
        head = b'{"jsonrpc":"2.0","id":' + _encode(rid) + b',"method":"'
        try:
            await self._send(head + method.encode() + b'","params":' + params + b"}\n")
            await waiter.done.wait()
        except BaseException:
            if (
                self._waiting.pop(rid, None) is not None
                and method not in _NOT_CANCELLED
            ):
                self._tell_cancelled(rid)
            raise
        message = waiter.message
        if message is None:  # the session ended first
            raise ConnectionLost(self._why())
        if message.error is not None:
            error = message.error
            raise rpc_error(error.code, error.message, error.data, server=self._server)
        if not message.result:  # absent: msgspec.Raw(b"")
            raise _neither(self._server)
        return message.result

    async def _send(self, data: bytes) -> None:
        await self._pipes.send(data)

    # --- the reader ----------------------------------------------------------

    async def read(self) -> None:
        """Route every line the server writes, until its stdout closes."""
        try:
            async for line in self._pipes.lines():
                try:
                    message = _decode_message(line)
                except RecursionError:
                    self._too_deep(line)
                    continue
                except (msgspec.DecodeError, msgspec.ValidationError):
                    if self._junk.take():
                        log.warning(
                            "%s: ignored a non-JSON-RPC line on stdout (%d bytes)",
                            self._server,
                            len(line),
                        )
                    continue
                if message.method is None:
                    self._answered(message)
                elif message.id is None:
                    if message.method == "notifications/progress":
                        self._progressed(message.params)
                    else:
                        self._notified(message.method, message)
                else:
                    self._answer_request(message)
        finally:
            self._junk.close()
            self._close("the server closed its stdout")

    def _junk_not_logged(self, dropped: int) -> None:
        log.warning(
            "%s: %d more non-JSON-RPC lines on stdout not logged"
            " (at most %d are logged every %.0f s)",
            self._server,
            dropped,
            JUNK_LINES_LOGGED,
            JUNK_WINDOW_S,
        )

    def _answers_now(self, data: bytes) -> bool:
        """Whole lines the pipes read while the reader waited: taken here, in
        the loop's callback, when every one is an answer (a relayed call then
        ends with no task woken); else False, and ``read`` takes them all."""
        answers = []
        for line in data.split(b"\n"):
            if not line.strip():
                continue
            try:
                message = _decode_message(line)
            except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
                return False
            if message.method is not None:
                return False
            answers.append(message)
        for message in answers:
            self._answered(message)
        return True

    def _too_deep(self, line: bytes) -> None:
        """A line nested too deeply to decode: when it plainly answers a
        request of ours (its id found by the envelope scanner), that request
        fails at once; anything else is dropped, as junk is."""
        scanner = EnvelopeScanner()
        scanner.feed(line)
        answers = scanner.done and scanner.answerable
        if answers or self._junk.take():  # junk's log budget (a flood of them)
            log.warning(
                "%s: ignored a line on stdout %s (%d bytes)%s",
                self._server,
                TOO_DEEP,
                len(line),
                f"; request {scanner.id!r} fails" if answers else "",
            )
        if answers:
            error = _Error(INTERNAL_ERROR, f"the server's answer is {TOO_DEEP}")
            self._answered(_Message(id=scanner.id, error=error))

    def _answered(self, message: _Message) -> None:
        if message.id is None:
            error = message.error
            said = "no error" if error is None else f"{error.code} {error.message}"
            log.info("%s: an error without an id: %s", self._server, said[:300])
            return
        waiter = self._waiting.pop(message.id, None)
        if waiter is None:
            return  # abandoned, or not ours
        waiter.deliver(message)

    def _progressed(self, params: msgspec.Raw) -> None:
        """A call's progress, to whoever asked for it (``_ProgressLane``: the
        reader never waits for a caller, so a slow one holds up no other)."""
        try:
            token = _decode_progress(params).progress_token
        except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
            return
        lane = self._progress.get(token) if isinstance(token, str) else None
        if lane is not None:
            lane.tell(params)

    def _spawn(self, run: Callable[[], Coroutine[Any, Any, None]]) -> bool:
        """Run ``run`` in a task of the session's (False: it is not running)."""
        if self._tasks is None:
            return False
        self._tasks.start_soon(run)
        return True

    def _notified(self, method: str, message: _Message) -> None:
        if method == ACKNOWLEDGED:  # one of our listen streams is open
            stream = _subscription_of(message.params)
            if stream is not None and (acked := self._acks.get(stream)) is not None:
                if (honored := _honored_uris(message.params)) is not None:
                    self._honored[stream] = honored
                acked.set()
            return
        if self._on_notification is not None:
            self._on_notification(method, message.params)

    def _answer_request(self, message: _Message) -> None:
        if message.method in ASKED and self._tasks is not None:
            self._tasks.start_soon(self._ask_caller, message)  # never in the reader
            return
        rid = _encode(message.id)
        if message.method == "ping":
            reply = b'{"jsonrpc":"2.0","id":' + rid + b',"result":{}}\n'
        elif message.method == "roots/list" and self._roots:
            roots = {"roots": [{"uri": uri} for uri in self._roots]}
            reply = (
                b'{"jsonrpc":"2.0","id":'
                + rid
                + b',"result":'
                + _encode(roots)
                + b"}\n"
            )
        else:
            error = {"code": METHOD_NOT_FOUND, "message": "not supported by memorizzd"}
            reply = (
                b'{"jsonrpc":"2.0","id":' + rid + b',"error":' + _encode(error) + b"}\n"
            )
        self._reply(reply)

    async def _ask_caller(self, message: _Message) -> None:
        """The server's request of a caller, relayed (``InFlight.answer``):
        the caller's result, or the error that says why there is none."""
        rid = _encode(message.id)
        try:
            result = await self._in_flight.answer(
                message.method or "", bytes(message.params) or b"{}"
            )
        except AskRefused as exc:
            log.info("%s: %s not relayed: %s", self._server, message.method, exc)
            error = {"code": exc.code, "message": exc.message}
            reply = b'{"jsonrpc":"2.0","id":' + rid + b',"error":' + _encode(error)
        else:
            reply = b'{"jsonrpc":"2.0","id":' + rid + b',"result":' + result
        self._reply(reply + b"}\n")

    def _reply(self, line: bytes) -> None:
        """An answer to the server's request, put in its stdin's pipe and not
        waited for: the reader must not stop until the server reads (one that
        writes requests and reads nothing until they are written would
        never read, and neither would we). Past ``REPLIES_UNREAD_MAX`` bytes
        the server has not read, its requests go unanswered (logged once)."""
        if self._pipes.kept() > REPLIES_UNREAD_MAX:
            if not self._unread:
                log.warning(
                    "%s: the server does not read its stdin; its requests "
                    "go unanswered until it does",
                    self._server,
                )
            self._unread = True
            return
        self._unread = False
        with suppress(ConnectionLost):
            self._pipes.write_now(line)

    def _why(self) -> str:
        return self._closed or "connection closed"

    def _close(self, reason: str) -> None:
        if self._closed is None:
            self._closed = reason
        waiting, self._waiting = self._waiting, {}
        for waiter in waiting.values():
            waiter.deliver(None)  # ConnectionLost
        self.ended.set()


@dataclass(frozen=True, kw_only=True)
class Launch:
    """How to start and speak to one stdio server's process."""

    argv: list[str]
    server: str
    env: dict[str, str]
    cwd: str | None
    max_result_bytes: int
    """The server's cap on one result, and on a listing's pages together."""
    mode: str
    on_notification: NotificationHandler | None = None
    roots: tuple[str, ...] = ()

    @property
    def max_message_bytes(self) -> int:
        """The longest line the pipes take: a result and its envelope."""
        return self.max_result_bytes + ENVELOPE_MAX


@asynccontextmanager
async def open_session(
    launch: Launch, process: StdioProcess
) -> AsyncIterator[JsonRpcSession]:
    """Spawn the server, negotiate, and yield the session; the process is
    stopped on exit (``stdio.py``). Owned by the calling task."""
    async with (
        stdio_pipes(
            launch.argv,
            env=launch.env,
            cwd=launch.cwd,
            max_message_bytes=launch.max_message_bytes,
            process_info=process,
        ) as pipes,
        anyio.create_task_group() as tg,
    ):
        session = JsonRpcSession(
            pipes,
            server=launch.server,
            on_notification=launch.on_notification,
            roots=launch.roots,
            max_result_bytes=launch.max_result_bytes,
        )
        session._tasks = tg

        async def read() -> None:
            await session.read()
            process.stdout_closed.set()  # the supervisor ends the session

        tg.start_soon(read)
        try:
            await session.negotiate(launch.mode)
            yield session
        finally:
            tg.cancel_scope.cancel()


def _neither(server: str) -> UpstreamError:
    """An answer with neither ``result`` nor ``error`` (JSON-RPC requires one)."""
    return UpstreamError(
        f"{server}: the server answered with neither a result nor an error",
        data={"server": server},
    )


def _answerable(capabilities: Mapping[str, Any]) -> dict[str, Any]:
    """Of a caller's client capabilities, those of the requests the daemon
    relays to it (elicitation, sampling), as the caller declared them."""
    return {
        name: value
        for name, value in capabilities.items()
        if name in _ASKS and isinstance(value, dict)
    }


def _traced(meta: bytes) -> bytes:
    """``meta`` (a ``,"_meta":{...}`` member, or empty) with the current
    span's W3C trace context added (``traceparent``, ``tracestate``)."""
    carrier = tracing.upstream_carrier()
    if not carrier:
        return meta
    members = _encode(carrier)[1:-1]
    if not meta:
        return b',"_meta":{' + members + b"}"
    return b',"_meta":{' + members + b"," + meta[len(b',"_meta":{') :]
