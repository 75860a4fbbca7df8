"""The MCP face: memorizzd as one MCP server, on ``mcp.sock`` beside each API socket.

A connection to an ``mcp.sock`` is one MCP session, framed as MCP's stdio
transport (one JSON-RPC message per line; ``memorizzctl mcp serve`` bridges a
stdio-only client to it). The caller is who the kernel says, with the scope of
the API socket beside it (``listeners.py`` opens both with the same rule): the
operator's face shows every server, an agent's face its profile's.

What it serves (this first version; issue 11 has the rest):

* both protocol eras: the handshake era (``initialize``, 2025-06-18 or
  2025-11-25, ``notifications/initialized``, ``ping``) and 2026-07-28
  (``server/discover``; a request stamped with that version in
  ``params._meta`` gets its results as that era has them: ``resultType``,
  and the cache hints of listings). Each upstream keeps the version it
  negotiated; a relayed tool result gains only ``resultType``;
* ``tools/list``: the tools of every server in scope that is connected, named
  ``SERVER__TOOL`` (``names.py``; the separator per profile: valid names within the common
  64-character ``[A-Za-z0-9_-]`` limit of model APIs; a scope of one server
  keeps the names unchanged). A blocked or denied tool is not listed; a tool decided
  ``ask`` says in its description that it needs approval; the daemon's
  verdict is in ``_meta`` (``memorizz/risk``, ``memorizz/decision``,
  ``memorizz/server``);
* ``tools/call``: the call pipeline every front uses (``calls.py``: the same
  policy, deadline, relay and audit record as a socket ``tools/call``). A call
  decided ``ask`` becomes the usual durable proposal, and the call waits for
  the operator (``face_approval_wait_s``, 50 s by default): approved, it runs
  once (``Calls.resume``) and its result is the answer; rejected, expired or
  still pending, the answer is an ``isError`` result naming the proposal and
  its status. A refusal or an upstream failure is a JSON-RPC error with the
  stable ``reason`` in ``data``, as on the API socket;
* ``resources/list``, ``resources/templates/list`` and ``resources/read`` (a
  URI goes to the first server, by name, that lists it), ``prompts/list`` and
  ``prompts/get`` (named like tools).

* progress: a call whose client gave a ``progressToken`` has the upstream's
  ``notifications/progress`` passed on under that token (the upstream gets a
  token of the daemon's own);
* ``notifications/cancelled`` from the client cancels that call, upstream too;
* an upstream's ``elicitation/create`` and ``sampling/createMessage`` during
  a call go to the session that made it, as requests with ids of the face's
  own, if its client declared them in ``initialize`` (``calllife.Asker``;
  ``upstream/asks.py`` decides which call a request is for); the client's
  response lines come back through ``parse`` (``rpc/answers.py``); a
  2026-07-28 client that declared them in its request's ``_meta`` gets an
  input-required result instead, and its retry's answers (``rounds.py``);
* two built-in tools on an agent's face, off unless its profile names them
  (``face_tools``): ``memorizz__proposals`` (the profile's own proposals and
  their status) and ``memorizz__resume`` (run an approved one, once);
* ``logging/setLevel`` per session: an upstream's ``notifications/message``
  at that level and above reaches the sessions that can see it, the
  server's name as the logger (the shared upstream sessions are not told);
* resources and prompts list changes pass on to the sessions that can see
  the server;
* ``completion/complete`` (advertised when a server in scope offers
  completions) goes to the server that owns the reference: a prompt by its
  shown name (sent upstream under its own), a resource template by its URI
  template;
* ``resources/subscribe`` and ``resources/unsubscribe`` (advertised when a
  server in scope takes them: a handshake-era session that declares
  ``resources.subscribe``): a URI is routed as ``resources/read`` routes it,
  subscribed upstream once for all the sessions that hold it
  (``upstream/subscriptions.py``; the socket API's connections are holders
  too, ``memorizzd.subscribers`` keeps both fronts'), and an upstream's
  ``notifications/resources/updated`` reaches the sessions subscribed to
  that URI of that server that still see it, and no other;
* ``notifications/tools/list_changed``: when an upstream says its tools
  changed, the daemon lists them again (``supervisor.py``) and every session
  that can see that server is told (``tools_listed``).

A session may send ``memorizz/scope`` (``{"server": NAME}``) first to see one
server of its scope, under its own names: a transparent proxy
(``memorizzctl mcp serve --server NAME``); it narrows, never widens.

Nothing else is kept per session: names are a function of the listings, so a
call resolves its name against the warm caches as they are now.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from contextvars import ContextVar
from functools import partial
from typing import Any, Final, Literal, TypeVar, cast, get_args

import anyio
import msgspec

from memorizz.api import mcp_meta
from memorizz.api import methods as m
from memorizz.api.errors import (
    ApprovalRequiredError,
    InvalidParamsError,
    MethodNotFoundError,
    NotFoundError,
    RemoteError,
)
from memorizz.api.protocol import ErrorObject, Reply, Request
from memorizzd import __version__, rounds, uri_templates
from memorizzd.approvals import not_found
from memorizzd.broker import Broker
from memorizzd.caller import Caller
from memorizzd.calllife import (
    ASKED,
    client_asker,
    client_send,
    client_session,
    offer_asks,
    want_logs,
)
from memorizzd.calls import ProgressReport, progress_to_client
from memorizzd.names import exposed_names
from memorizzd.policy import ToolsView
from memorizzd.relay import WarmRelay
from memorizzd.rpc.answers import parse_line, take
from memorizzd.rpc.dispatch import Relayed, Session, encode_error, unexpected
from memorizzd.subscribers import UPDATED, Subscribers
from memorizzd.telemetry import tracing
from memorizzd.upstream.actor import Upstream
from memorizzd.upstream.asks import DAEMONS_ERROR, daemons_error
from memorizzd.upstream.connection import ProgressHandler
from memorizzd.upstream.errors import URL_ELICITATION_REQUIRED
from memorizzd.upstream.jsonrpc import ACKNOWLEDGED
from memorizzd.upstream.pool import unknown_server

log = logging.getLogger("memorizzd.face")
T = TypeVar("T")

VERSIONS: Final = ("2025-06-18", "2025-11-25")
"""Handshake-era protocol versions the face negotiates, oldest first."""
MODERN: Final = "2026-07-28"
"""The era without a handshake: ``server/discover``, and every request stamped."""
_CACHED: Final = frozenset(
    {
        "server/discover",
        "tools/list",
        "resources/list",
        "resources/templates/list",
        "prompts/list",
        "resources/read",
    }
)
"""2026-07-28 results that carry cache hints (``cacheScope``, ``ttlMs``)."""
SCOPE_METHOD: Final = "memorizz/scope"
"""A notification a session sends first to see one server of its scope, under
its own names (``memorizzctl mcp serve --server NAME``)."""
POLICY_NOTE: Final = (
    "Calls go through the host's policy; a tool marked as needing approval "
    "waits for an operator."
)

_encoder: Final = msgspec.json.Encoder()
_TOOLS_CHANGED: Final = "notifications/tools/list_changed"
_LIST_CHANGES: Final = {
    _TOOLS_CHANGED: "tools_list_changed",
    "notifications/prompts/list_changed": "prompts_list_changed",
    "notifications/resources/list_changed": "resources_list_changed",
}
"""The list changes a 2026-07-28 listen stream may ask for (``_Filter``'s fields)."""
LIST_CHANGED_SEND_S: Final = 1.0
APPROVAL_PROGRESS_S: Final = 5.0
"""How often a call held for the operator tells its client (given a progress token)."""
_CAPABILITIES: Final = {
    "logging": {},
    "tools": {"listChanged": True},
    "resources": {"listChanged": True},
    "prompts": {"listChanged": True},
}
"""What the face always offers (``_capabilities`` adds what its scope can)."""
_TASKS: Final[dict[str, Any]] = {
    "list": {},
    "cancel": {},
    "requests": {"tools": {"call": {}}},
}
"""Offered in ``initialize`` when a server in scope takes tasks."""
Handler = Callable[[Caller, msgspec.Raw], Awaitable[Any]]


class _Stamp(msgspec.Struct):
    version: str | None = msgspec.field(default=None, name=mcp_meta.PROTOCOL_VERSION)


class _Stamped(msgspec.Struct):
    """A request's 2026-07-28 stamp, if any (``params._meta``)."""

    meta: _Stamp | None = msgspec.field(default=None, name="_meta")


_decode_stamped: Final = msgspec.json.Decoder(_Stamped).decode


class _ResultType(msgspec.Struct, rename="camel"):
    result_type: str | None = None


_decode_result_type: Final = msgspec.json.Decoder(_ResultType).decode


class _Scope(msgspec.Struct):
    server: str


class _Cancelled(msgspec.Struct, rename="camel"):
    request_id: int | str


LogLevel = Literal[
    "debug", "info", "notice", "warning", "error", "critical", "alert", "emergency"
]
_LEVELS: Final[tuple[str, ...]] = get_args(LogLevel)


class _SetLevel(msgspec.Struct):
    level: LogLevel


class _LogMessage(msgspec.Struct):
    level: LogLevel
    data: Any = None
    logger: str | None = None


class _Implementation(msgspec.Struct):
    """MCP's ``Implementation`` (``clientInfo``): its other members pass unread."""

    name: str
    version: str


class _Initialize(msgspec.Struct, rename="camel"):
    protocol_version: str = VERSIONS[-1]
    capabilities: dict[str, Any] = {}
    client_info: _Implementation | msgspec.UnsetType = msgspec.UNSET
    """Checked, not kept: a malformed one is ``invalid_params``."""


class _Cursor(msgspec.Struct):
    cursor: str | None = None


class _CallMeta(msgspec.Struct, rename="camel"):
    version: str | None = msgspec.field(default=None, name=mcp_meta.PROTOCOL_VERSION)
    """2026-07-28's stamp (``_stamped``, read with the rest of the call)."""
    progress_token: m.ProgressToken | None = None
    """Capped as the socket API's (``memorizz.api.methods.ProgressToken``)."""
    client_capabilities: dict[str, Any] | None = msgspec.field(
        default=None, name=mcp_meta.CLIENT_CAPABILITIES
    )
    """2026-07-28: what the client answers (``rounds.py``)."""
    traceparent: str | None = None
    """W3C trace context: the parent of the call's span (``[tracing]``)."""
    tracestate: str | None = None


class _Call(msgspec.Struct):
    name: str
    arguments: msgspec.Raw = msgspec.field(default_factory=m.arguments)
    meta: _CallMeta | None = msgspec.field(default=None, name="_meta")
    task: dict[str, Any] | None = None
    """MCP 2025-11-25: call the tool as a task (``ttl``)."""
    input_responses: dict[str, msgspec.Raw] | None = msgspec.field(
        default=None, name="inputResponses"
    )
    request_state: str | None = msgspec.field(default=None, name="requestState")
    """2026-07-28: a retry with the answers to an input-required result."""


_decode_call: Final = msgspec.json.Decoder(_Call).decode


class _TaskRef(msgspec.Struct, rename="camel"):
    task_id: str


class _Filter(msgspec.Struct, rename="camel", omit_defaults=True):
    """What a 2026-07-28 ``subscriptions/listen`` asks for (MCP's ``SubscriptionFilter``)."""

    tools_list_changed: bool | None = None
    prompts_list_changed: bool | None = None
    resources_list_changed: bool | None = None
    resource_subscriptions: list[str] | None = None


class _ListenParams(msgspec.Struct):
    notifications: _Filter = msgspec.field(default_factory=_Filter)


class _Listen:
    """One 2026-07-28 listen stream of a session: the list changes and the
    resources (server, URI) it takes, every frame stamped with its id."""

    __slots__ = ("changes", "ended", "holds", "id", "resources")

    def __init__(self, request_id: int | str, changes: frozenset[str]) -> None:
        self.id = request_id
        self.changes = changes
        self.resources: set[tuple[str, str]] = set()
        self.holds: set[Upstream] = set()
        """The servers it holds subscriptions of: released when it ends, in
        scope or not by then (a reload may have taken one out of it)."""
        self.ended = anyio.Event()
        """Set when its socket stops: the stream ends with its result."""

    def line(self, method: str, params: dict[str, Any] | None = None) -> bytes:
        stamped = {**(params or {}), "_meta": {mcp_meta.SUBSCRIPTION_ID: self.id}}
        message = {"jsonrpc": "2.0", "method": method, "params": stamped}
        return _encoder.encode(message) + b"\n"


class _Read(msgspec.Struct):
    uri: str


class _Ref(msgspec.Struct):
    type: str
    name: str | None = None
    uri: str | None = None


class _Complete(msgspec.Struct):
    ref: _Ref
    argument: m.CompletionArgument
    """Checked here, as the socket API's are: the params go on as they came."""
    context: m.CompletionContext | None = None


class _GetPrompt(msgspec.Struct):
    name: str
    arguments: dict[str, str] = {}


class _ResumeArguments(msgspec.Struct):
    id: str


_BUILTIN_TOOLS: Final = {
    "proposals": {
        "name": "memorizz__proposals",
        "description": (
            "Your calls that wait for or got an operator's decision (memorizzd "
            "proposals): id, status, server and tool."
        ),
        "inputSchema": {"type": "object", "properties": {}},
        "annotations": {"readOnlyHint": True},
    },
    "resume": {
        "name": "memorizz__resume",
        "description": (
            "Run one of your proposals that an operator approved, once; its "
            "result is the call's."
        ),
        "inputSchema": {
            "type": "object",
            "properties": {"id": {"type": "string", "description": "The proposal id"}},
            "required": ["id"],
        },
    },
}
"""Built-in tools of an agent's face, off unless its profile names them."""
_BUILTIN_NAMES: Final = {tool["name"]: key for key, tool in _BUILTIN_TOOLS.items()}


class _Routes(msgspec.Struct):
    names: dict[str, tuple[str, str]]
    views: list[Any]


_ROUTE_CACHE_MAX: Final = 256
_SAID_MAX: Final = 200
"""The most of a name the client made up that an error says back to it
(a name is any string up to the frame's size)."""


class FaceDispatcher:
    """The MCP face's protocol on one socket (a ``rpc.dispatch.LineDispatcher``)."""

    settles: Final = frozenset({"initialize", "logging/setLevel"})
    """What the client answers, and the log messages it wants: a call sent
    right behind them (a client that does not wait) runs with them."""

    def __init__(self, broker: Broker, relay: WarmRelay | None = None) -> None:
        self._broker = broker
        self._relay = relay
        """Plain calls without a task (``relay.py``); None: every call in a task."""
        self._sessions: set[Session] = set()
        """The open connections of every face socket (told of list changes)."""
        self._levels: dict[Session, int] = {}
        """Sessions that asked for log messages, and from which level on."""
        self._narrowed: dict[Session, str] = {}
        """Sessions that chose one server (``memorizz/scope``): its names unchanged."""
        self._emptied: set[Session] = set()
        """Sessions that chose two servers in turn: they see none (a scope is
        only ever narrowed)."""
        self._clients: dict[Session, dict[str, Any]] = {}
        """What each session's client declared in ``initialize`` (it is asked
        an upstream's elicitation and sampling requests only if it can)."""
        self._subscribers: Subscribers[Session] = Subscribers(
            sees=self._sees, line=_updated_line
        )
        """Each session's resource subscriptions (``resources/subscribe``), as
        the socket API keeps its connections' (``memorizzd.subscribers``)."""
        self._listens: dict[Session, dict[int | str, _Listen]] = {}
        """Each 2026-07-28 session's listen streams, by request id."""
        self._stopping: weakref.WeakSet[Session] = weakref.WeakSet()
        """Sessions whose socket is draining (a listen admitted meanwhile ends too)."""

        self._routes: dict[tuple[object, ...], _Routes] = {}
        """Tool names resolved per scope and listings (``_route``)."""
        self._handlers: dict[str, Handler] = {
            "initialize": self._initialize,
            "server/discover": self._discover,
            "ping": self._ping,
            "logging/setLevel": self._set_level,
            "tools/list": self._tools_list,
            "tools/call": self._tools_call,
            "resources/list": self._resources_list,
            "resources/templates/list": self._templates_list,
            "resources/read": self._resources_read,
            "resources/subscribe": self._subscribe,
            "resources/unsubscribe": self._unsubscribe,
            "subscriptions/listen": self._listen,
            "prompts/list": self._prompts_list,
            "prompts/get": self._prompts_get,
            "completion/complete": self._complete,
            "tasks/get": self._task_get,
            "tasks/result": self._task_result,
            "tasks/cancel": self._task_cancel,
            "tasks/list": self._tasks_list,
        }

    def parse(self, line: bytes) -> Request | bytes:
        return parse_line(line)  # the client's responses to our requests too

    def _scope_of(self, session: Session) -> list[Upstream]:
        """The servers this session sees: its caller's, or the one it chose
        (``memorizz/scope``: a session may narrow its scope, never widen it)."""
        found = self._broker.in_scope(session.caller)
        chosen = self._narrowed.get(session)
        if chosen is None:
            return found
        if session in self._emptied:
            return []
        return [u for u in found if u.name == chosen]

    def _sees(self, session: Session, server: str) -> bool:
        """Whether the session may hear of ``server`` now: in its caller's
        scope (``Broker.sees``, which the socket API asks too) and in the one
        server it chose, if it chose one (``memorizz/scope``)."""
        chosen = self._narrowed.get(session)
        if chosen is not None and (chosen != server or session in self._emptied):
            return False
        return self._broker.sees(session.caller, server)

    def _in_scope(self, caller: Caller) -> list[Upstream]:
        """The running request's session's servers (``_scope_of``); a session
        narrowed to a server its caller does not see (a name mistyped after
        ``mcp serve --server``, a server a reload removed) is answered
        ``unknown_server``, not shown an empty server."""
        session = client_session()
        if session is None:
            return self._broker.in_scope(caller)
        found = self._scope_of(cast(Session, session))
        chosen = self._narrowed.get(cast(Session, session))
        if chosen is not None and not found:
            raise unknown_server(chosen[:_SAID_MAX])
        return found

    def relay(self, session: Session, request: Request) -> Relayed | None:
        """A plain ``tools/call``, relayed with no task (``relay.py``): one
        that asks for no progress, no task, no log messages and no rounds, of
        a client that answers no upstream request, to a tool the session's
        warm listings name. Anything else runs in a task (``_tools_call``)."""
        if (
            self._relay is None
            or request.method != "tools/call"
            or request.id is None
            or tracing.enabled
            or session in self._levels
        ):
            return None
        try:
            call = _decode_call(request.params)
        except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
            return None
        meta = call.meta
        if (
            call.task is not None
            or call.request_state is not None
            or call.name in _BUILTIN_NAMES
            or (meta is not None and meta.progress_token is not None)
        ):
            return None
        modern = meta is not None and meta.version == MODERN
        can = (meta.client_capabilities if meta else None) if modern else None
        if _answers_asks(can or {} if modern else self._clients.get(session, {})):
            return None
        route = self._warm_route(session, call.name)
        if route is None:
            return None
        server, tool, typed = route
        shown = _completed_tool if modern else None
        if typed:
            shown = _fitted_tool if modern else _fitted
        return self._relay.start(
            session,
            request.id,
            server,
            tool,
            call.arguments,
            None,
            shown=shown,
            error_shown=_face_error,
        )

    def _warm_route(self, session: Session, name: str) -> tuple[str, str, bool] | None:
        """``_route`` from the warm listings only (None: one is cold), and
        whether the tool declares an ``outputSchema`` (``_typed``, from the
        same listings)."""
        upstreams = self._scope_of(session)
        views = [(u.name, u.tools_view) for u in upstreams if u.connected]
        if any(view is None for _, view in views):
            return None
        route = self._routes_of(upstreams, views, session.caller).get(name)
        if route is None:
            return None
        server, tool = route
        view = next(view for each, view in views if each == server)
        listed = None if view is None else view.tool(tool)
        return server, tool, listed is not None and listed.output_schema is not None

    def opened(self, session: Session) -> None:
        self._sessions.add(session)

    def draining(self, session: Session) -> None:
        """The session's socket stops (the daemon stops, or a reload removes
        its profile): its listen streams end gracefully, with their results."""
        self._stopping.add(session)
        for listen in self._listens.get(session, {}).values():
            listen.ended.set()

    def holds(self, session: Session) -> bool:
        return self._subscribers.holds(session)

    def closed(self, session: Session) -> None:
        for listen in self._listens.pop(session, {}).values():
            self._let_go(listen)
        self._sessions.discard(session)
        self._levels.pop(session, None)
        self._narrowed.pop(session, None)
        self._emptied.discard(session)
        self._clients.pop(session, None)
        self._subscribers.closed(session)  # the last holder's unsubscribe follows

    async def tools_listed(self, server: str, tools: list[m.Tool]) -> None:
        """A server's tools were listed afresh (``Pool.on_tools``): every
        session that can see it hears ``notifications/tools/list_changed``
        (a slow reader is skipped after a second, never waited for)."""
        await self._tell(server, _TOOLS_CHANGED)

    async def notice(self, server: str, method: str, params: msgspec.Raw) -> None:
        """What a server says that callers may hear (``Pool.on_notice``): its
        resources or prompts list changes go to every session that can see
        it; its log messages to those that set a level (``logging/setLevel``)
        at or below the message's, with the server's name as the logger."""
        if method == UPDATED:
            await self._updated(server, params)
            return
        if method != "notifications/message":
            await self._tell(server, method)
            return
        try:
            message = msgspec.json.decode(params, type=_LogMessage)
        except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
            return
        rank = _LEVELS.index(message.level)
        logger = server if message.logger is None else f"{server}/{message.logger}"
        line = (
            _encoder.encode(
                {
                    "jsonrpc": "2.0",
                    "method": method,
                    "params": {
                        "level": message.level,
                        "logger": logger,
                        "data": message.data,
                    },
                }
            )
            + b"\n"
        )
        for session, level in list(self._levels.items()):
            if rank < level or not any(
                u.name == server for u in self._scope_of(session)
            ):
                continue
            with anyio.move_on_after(LIST_CHANGED_SEND_S):
                await session.send(line)

    async def _updated(self, server: str, params: msgspec.Raw) -> None:
        """``notifications/resources/updated``: to the sessions subscribed to
        that URI of that server, and the listen streams that hold it, that
        still see the server; no other."""
        uri = await self._subscribers.updated(server, params)
        if uri is None:
            return
        for session, listens in list(self._listens.items()):
            if not self._sees(session, server):  # a reload narrowed its scope
                continue
            for listen in list(listens.values()):
                if (server, uri) in listen.resources:
                    with anyio.move_on_after(LIST_CHANGED_SEND_S):
                        await session.send(listen.line(UPDATED, {"uri": uri}))

    async def _tell(self, server: str, method: str) -> None:
        """A list change of ``server``, to every session that sees it: on
        each of its listen streams that asked for it (2026-07-28), else as
        the handshake era sends it, once the session is initialized (a client
        hears nothing before its ``initialize`` is answered)."""
        plain = _encoder.encode({"jsonrpc": "2.0", "method": method}) + b"\n"
        for session in list(self._sessions):
            if not any(u.name == server for u in self._scope_of(session)):
                continue
            listens = self._listens.get(session)
            if listens:
                lines = [
                    listen.line(method)
                    for listen in listens.values()
                    if method in listen.changes
                ]
            else:
                lines = [plain] if session in self._clients else []
            for line in lines:
                with anyio.move_on_after(LIST_CHANGED_SEND_S):
                    await session.send(line)

    def notified(self, session: Session, request: Request) -> bool:
        """``notifications/cancelled`` cancels that request of the session (and
        its upstream request); ``notifications/initialized`` and the rest are
        taken, with nothing to do."""
        if take(session, request):  # a response to an upstream's request
            return True
        if request.method == SCOPE_METHOD:  # the bridge's --server NAME
            try:
                chosen = msgspec.json.decode(request.params, type=_Scope)
            except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
                return True
            # Only ever narrowed: the bridge's choice is the first, and what
            # its client sends after it (through the pipes, over HTTP) must
            # not move the session to another server: another name leaves it
            # nothing (what the two have in common), said under the last name.
            previous = self._narrowed.get(session)
            self._narrowed[session] = chosen.server
            if previous not in (None, chosen.server):
                self._emptied.add(session)
            return True
        if request.method == "notifications/cancelled":
            try:
                cancelled = msgspec.json.decode(request.params, type=_Cancelled)
            except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
                return True
            session.cancel(cancelled.request_id)
        return True

    async def run(self, caller: Caller, request: Request) -> bytes:
        handler = self._handlers.get(request.method)
        try:
            if handler is None:
                raise MethodNotFoundError(
                    f"unknown method {request.method[:_SAID_MAX]!r}"
                )
            _request_id.set(request.id)
            result = await handler(caller, request.params)
            if result is rounds.ANSWERED:
                return b""  # answered already (an input-required result)
        except RemoteError as exc:
            return encode_error(request.id, _face_error(exc))
        except Exception as exc:  # noqa: BLE001 - the boundary: unexpected() logs it
            error = unexpected(exc, f"face: {request.method}", request.id)
            return encode_error(request.id, error.to_wire())
        if _modern(request):
            result = _completed(request.method, result)
        return (
            _encoder.encode(Reply(jsonrpc="2.0", id=request.id, result=result)) + b"\n"
        )

    # --- the session ----------------------------------------------------------

    async def _initialize(self, caller: Caller, params: msgspec.Raw) -> dict[str, Any]:
        initialize = _decode(params, _Initialize)
        asked = initialize.protocol_version
        version = asked if asked in VERSIONS else VERSIONS[-1]
        session = client_session()
        if session is not None:
            self._clients[cast(Session, session)] = initialize.capabilities
        capabilities = self._capabilities(caller)
        if any(u.takes_tool_tasks for u in self._in_scope(caller)):
            capabilities["tasks"] = _TASKS  # the handshake era's (2025-11-25)
        return {
            "protocolVersion": version,
            "capabilities": capabilities,
            "serverInfo": {"name": "memorizzd", "version": __version__},
            "instructions": self._instructions(caller),
        }

    async def _discover(self, caller: Caller, params: msgspec.Raw) -> dict[str, Any]:
        """2026-07-28: what ``initialize`` says, without a session."""
        return {
            "supportedVersions": [MODERN],
            "capabilities": self._capabilities(caller),
            "instructions": self._instructions(caller),
            "_meta": {
                mcp_meta.SERVER_INFO: {"name": "memorizzd", "version": __version__}
            },
        }

    def _instructions(self, caller: Caller) -> str:
        """The session's servers' connection instructions (``Upstream.instructions``:
        configured, a preset's, else the server's own): a single server's as
        they are (its tools keep their names), else ours, naming the
        separator, with each server's, named."""
        upstreams = self._in_scope(caller)
        given = [(u.name, text) for u in upstreams if (text := u.instructions)]
        if len(upstreams) == 1:
            if given:
                return given[0][1]
            return (
                f"memorizzd: the tools of the MCP server {upstreams[0].name}, "
                f"under their own names. {POLICY_NOTE}"
            )
        separator = self.separator_of(caller)
        ours = (
            "memorizzd: the tools of several MCP servers, named "
            f"SERVER{separator}TOOL. {POLICY_NOTE}"
        )
        lines = [f"{name}: {text}" for name, text in given]
        return "\n\n".join([ours, *lines])

    def _capabilities(self, caller: Caller) -> dict[str, Any]:
        """What the face offers this session: always tools, resources, prompts
        and logging; ``resources.subscribe`` when a server in its scope takes
        subscriptions now (the handshake era's ``resources/subscribe``)."""
        upstreams = self._in_scope(caller)
        capabilities = dict(_CAPABILITIES)
        if any(u.can_subscribe for u in upstreams):
            capabilities["resources"] = {"listChanged": True, "subscribe": True}
        if any(u.declares("completions") for u in upstreams):
            capabilities["completions"] = {}
        return capabilities

    async def _set_level(self, caller: Caller, params: msgspec.Raw) -> dict[str, Any]:
        """This session's log level: upstream log messages from it on reach it
        (each session its own; the shared upstream sessions are not told)."""
        level = _decode(params, _SetLevel).level
        session = client_session()
        if session is not None:
            self._levels[cast(Session, session)] = _LEVELS.index(level)
        return {}

    async def _ping(self, caller: Caller, params: msgspec.Raw) -> dict[str, Any]:
        return {}

    # --- tools ------------------------------------------------------------------

    async def _tools(
        self, caller: Caller
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """(exposed name -> (upstream, tool)), and the MCP tool objects."""
        upstreams = self._in_scope(caller)
        found: list[tuple[Upstream, m.Tool]] = []
        for upstream in upstreams:
            if not upstream.connected:
                continue  # listed again once it is: nothing here is cached
            try:
                tools = await upstream.list_tools(refresh=False)
            except RemoteError as exc:
                log.info("face: %s not listed: %s", upstream.name, exc.message)
                continue
            found += [
                (upstream, tool)
                for tool in sorted(tools, key=lambda t: t.name)
                if tool.decision != "deny"  # refused whatever the arguments
            ]
        names = exposed_names(
            ((u.name, t.name) for u, t in found),
            single=len(upstreams) == 1,
            separator=self.separator_of(caller),
        )
        by_pair = {pair: shown for shown, pair in names.items()}
        listed = [  # a tool its server lists twice is listed once (pop)
            _mcp_tool(tool, shown, upstream.name)
            for upstream, tool in found
            if (shown := by_pair.pop((upstream.name, tool.name), None)) is not None
        ]
        return dict(names), listed

    async def _tools_list(self, caller: Caller, params: msgspec.Raw) -> dict[str, Any]:
        _first_page(params)
        _, listed = await self._tools(caller)
        return {"tools": self._builtin_tools(caller) + listed}

    def separator_of(self, caller: Caller) -> str:
        """Between a server's name and a tool's: the caller's profile's
        ``separator``, the operator's ``face_separator``."""
        return self._broker.separator_of(caller)

    def _builtins_of(self, caller: Caller) -> frozenset[str]:
        """The built-in tools the caller's profile names (``face_tools``)."""
        if caller.profile is None:
            return frozenset()
        profile = next(
            (p for p in self._broker.config.profiles if p.name == caller.profile), None
        )
        return frozenset() if profile is None else frozenset(profile.face_tools)

    def _builtin_tools(self, caller: Caller) -> list[dict[str, Any]]:
        names = self._builtins_of(caller)
        return [dict(tool) for key, tool in _BUILTIN_TOOLS.items() if key in names]

    async def _builtin_call(
        self, caller: Caller, key: str, arguments: msgspec.Raw
    ) -> Any:
        """``memorizz__proposals`` and ``memorizz__resume``: an agent's own
        proposals, on the servers of the session's scope (a session narrowed
        to one server, ``memorizz/scope``, sees and resumes that one's only)."""
        book = self._broker.book
        seen = {u.name for u in self._in_scope(caller)}
        if key == "proposals":
            # the newest 50 in scope (a profile's open ones are capped far below)
            proposals = await book.list_for(caller, status=None, limit=1000)
            rows = [
                {
                    "id": p.id,
                    "status": p.status,
                    "server": p.server,
                    "tool": p.tool,
                    "expires_at": p.expires_at,
                }
                for p in proposals
                if p.server in seen
            ][:50]
            text = "\n".join(
                f"{r['id']} {r['status']} {r['server']}/{r['tool']}" for r in rows
            )
            return {
                "content": [{"type": "text", "text": text or "no proposals"}],
                "structuredContent": {"proposals": rows},
            }
        try:
            proposal_id = _decode(arguments, _ResumeArguments).id
            proposal = await book.get(caller, proposal_id)
            if proposal.server not in seen:  # as if it were not there
                raise not_found(proposal_id)
        except (InvalidParamsError, NotFoundError) as exc:
            # its input, not the protocol: a result the model reads and
            # corrects (MCP 2025-11-25, SEP-1303), not an error its client eats
            return _refused_input(exc)
        if proposal.status != "approved":
            return _not_run(proposal.id, proposal.status)
        return await self._broker.tool_calls.resume(caller, proposal, timeout_s=None)

    async def _route(self, caller: Caller, name: str) -> tuple[str, str] | None:
        """Which server's which tool a shown name is. Resolved from the warm
        listings, and remembered until one of them changes (a call must not
        rebuild every server's listing); a cold listing is fetched first."""
        upstreams = self._in_scope(caller)
        views = [(u.name, u.tools_view) for u in upstreams if u.connected]
        if any(view is None for _, view in views):
            routes, _ = await self._tools(caller)
            return routes.get(name)
        return self._routes_of(upstreams, views, caller).get(name)

    def _routes_of(
        self,
        upstreams: list[Upstream],
        views: list[tuple[str, ToolsView | None]],
        caller: Caller,
    ) -> dict[str, tuple[str, str]]:
        """The shown names of warm ``views``, remembered per scope and listings."""
        single = len(upstreams) == 1
        separator = self.separator_of(caller)
        key = (single, separator, *((server, id(view)) for server, view in views))
        found = self._routes.get(key)
        if found is None:
            pairs = [
                (server, tool.name)
                for server, view in views
                if view is not None
                for tool in sorted(view.tools, key=lambda t: t.name)
                if tool.decision != "deny"
            ]
            names = exposed_names(pairs, single=single, separator=separator)
            if len(self._routes) >= _ROUTE_CACHE_MAX:
                self._routes.clear()
            # the views are kept with their names: their ids stay theirs
            found = self._routes[key] = _Routes(names, [v for _, v in views])
        return found.names

    async def _tools_call(self, caller: Caller, params: msgspec.Raw) -> Any:
        call = _decode(params, _Call)
        if tracing.enabled and not tracing.in_call():  # one span, approval wait and all
            meta = call.meta
            trace = (
                None
                if meta is None
                else {"traceparent": meta.traceparent, "tracestate": meta.tracestate}
            )
            with tracing.call_scope(None, trace):
                return await self._tools_call(caller, params)
        builtin = _BUILTIN_NAMES.get(call.name)
        if builtin is not None and builtin in self._builtins_of(caller):
            return await self._builtin_call(caller, builtin, call.arguments)
        route = await self._route(caller, call.name)
        if route is None:
            raise InvalidParamsError(
                f"unknown tool {call.name[:_SAID_MAX]!r} (tools/list shows the tools)",
                data={"tool": call.name[:_SAID_MAX]},
            )
        server, tool = route
        if call.task is not None:  # created at once; the caller polls (tasks/*)
            return await self._broker.tool_calls.call(
                caller,
                server,
                tool=tool,
                arguments=call.arguments,
                timeout_s=None,
                task=_encoder.encode(call.task),
            )
        result = await self._run_call(caller, params, call, server, tool)
        return _fitted(result) if self._typed(server, tool) else result

    def _typed(self, server: str, tool: str) -> bool:
        """Whether ``server``'s ``tool`` declares an ``outputSchema`` (as its
        warm listing has it; a cold one: as if it did)."""
        try:
            view = self._broker.server_named(server).tools_view
        except NotFoundError:  # removed meanwhile
            return True
        listed = None if view is None else view.tool(tool)
        return view is None or (listed is not None and listed.output_schema is not None)

    async def _run_call(
        self, caller: Caller, params: msgspec.Raw, call: _Call, server: str, tool: str
    ) -> Any:
        """A routed ``tools/call`` without a task: the upstream's rounds, an
        approval waited for, or the call."""
        calls = self._broker.tool_calls
        progress = _progress_to(call)
        session = client_session()
        level = None if session is None else self._levels.get(cast(Session, session))
        if level is not None:  # a 2026-07-28 upstream logs to calls that ask
            want_logs(_LEVELS[level])
        modern = session is not None and _stamped(params)
        if modern:  # 2026-07-28: what the upstream asks goes in rounds
            if call.request_state is not None:  # a retry with the answers
                return await rounds.retried(
                    session, call.name, call.request_state, call.input_responses or {}
                )
            can = None if call.meta is None else call.meta.client_capabilities
            wait_s = self._broker.config.upstream_request_wait_s
            if not isinstance(client_asker(), rounds.RoundAsker) and (
                held_call := rounds.hold(session, call.name, can or {}, wait_s)
            ):
                return await rounds.first(
                    held_call, partial(self._tools_call, caller, params), _reply_now
                )
        if session is not None and not modern:
            # the handshake era: what the upstream asks goes to this client
            # (2026-07-28 has no server-to-client requests: none is offered)
            offer_asks(
                self._clients.get(cast(Session, session), {}),
                self._broker.config.upstream_request_wait_s,
            )
        try:
            return await calls.call(
                caller,
                server,
                tool=tool,
                arguments=call.arguments,
                timeout_s=None,
                reuse_approved=True,
                progress=progress,
            )
        except ApprovalRequiredError as exc:
            held = exc
        # Held for the operator: wait (face_approval_wait_s), then run it once.
        proposal_id = str(held.data.get("proposal_id"))
        wait_s = self._broker.config.face_approval_wait_s
        book = self._broker.book
        token = None if call.meta is None else call.meta.progress_token
        send = client_send()
        waited = time.time()
        if token is None or send is None:
            proposal = await book.wait(caller, proposal_id, wait_s)
        else:  # the client hears that its call waits, and how long it may
            proposal = await _telling(
                book.wait(caller, proposal_id, wait_s),
                partial(_waiting_notes, send, token, proposal_id, wait_s),
            )
        if tracing.enabled:
            tracing.child(
                "approval wait",
                waited,
                {"memorizz.proposal": proposal_id, "memorizz.status": proposal.status},
            )
        if proposal.status == "approved":
            return await calls.resume(
                caller, proposal, timeout_s=None, progress=progress
            )
        return _not_run(
            proposal_id, proposal.status, {"reason": held.reason, **held.data}
        )

    # --- tasks (MCP 2025-11-25: calls.py, upstream/tasks.py) ------------------

    async def _task_get(self, caller: Caller, params: msgspec.Raw) -> dict[str, Any]:
        task_id = _decode(params, _TaskRef).task_id
        return await self._broker.tool_calls.task(caller, "tasks/get", task_id)

    async def _task_result(self, caller: Caller, params: msgspec.Raw) -> dict[str, Any]:
        """Waits for the task to end (at most its server's ``timeout_s``)."""
        task_id = _decode(params, _TaskRef).task_id
        return await self._broker.tool_calls.task(caller, "tasks/result", task_id)

    async def _task_cancel(self, caller: Caller, params: msgspec.Raw) -> dict[str, Any]:
        task_id = _decode(params, _TaskRef).task_id
        return await self._broker.tool_calls.task(caller, "tasks/cancel", task_id)

    async def _tasks_list(self, caller: Caller, params: msgspec.Raw) -> dict[str, Any]:
        """The caller's own tasks, in one page."""
        _first_page(params)
        return {"tasks": await self._broker.tool_calls.task_list(caller)}

    # --- resources and prompts -----------------------------------------------

    async def _listed(
        self, caller: Caller, fetch: Callable[[Upstream], Awaitable[list[Any]]]
    ) -> list[tuple[Upstream, Any]]:
        found: list[tuple[Upstream, Any]] = []
        for upstream in self._in_scope(caller):
            if not upstream.connected:
                continue
            try:
                found += [(upstream, item) for item in await fetch(upstream)]
            except RemoteError as exc:
                log.info("face: %s not listed: %s", upstream.name, exc.message)
        return found

    async def _resources_list(
        self, caller: Caller, params: msgspec.Raw
    ) -> dict[str, Any]:
        _first_page(params)
        found = await self._listed(caller, lambda u: u.list_resources())
        return {"resources": [_builtins(item) for _, item in found]}

    async def _templates_list(
        self, caller: Caller, params: msgspec.Raw
    ) -> dict[str, Any]:
        _first_page(params)
        found = await self._listed(caller, lambda u: u.list_resource_templates())
        return {"resourceTemplates": [_builtins(item) for _, item in found]}

    async def _resources_read(
        self, caller: Caller, params: msgspec.Raw
    ) -> dict[str, Any]:
        uri = _decode(params, _Read).uri
        owner = await self._owner_of(caller, uri)
        result = await owner.read_resource(uri, timeout_s=None)
        return _builtins(result)

    async def _subscribe(self, caller: Caller, params: msgspec.Raw) -> dict[str, Any]:
        """This session subscribes to ``uri`` of the server that lists it
        (routed as ``resources/read``); the server is asked once for all the
        holders, of either front (``memorizzd.subscribers``); one that takes
        no subscriptions is ``method_not_found`` (``Upstream.subscribe_resource``)."""
        uri = _decode(params, _Read).uri
        session = cast(Session | None, client_session())
        owner = await self._owner_of(caller, uri)
        if session is None:
            raise MethodNotFoundError(
                f"server {owner.name!r} takes no resource subscriptions",
                data={"server": owner.name},
            )
        await self._subscribers.hold(session, owner, uri)
        return {}

    async def _unsubscribe(self, caller: Caller, params: msgspec.Raw) -> dict[str, Any]:
        """This session lets go of ``uri`` (of the server it subscribed it
        on): the server hears it when no other holder is left. Unsubscribing
        what is not held is no error."""
        uri = _decode(params, _Read).uri
        session = cast(Session | None, client_session())
        server = None if session is None else self._subscribers.server_of(session, uri)
        if session is not None and server is not None:
            await self._subscribers.let_go(session, server, uri)
        return {}

    async def _listen(self, caller: Caller, params: msgspec.Raw) -> dict[str, Any]:
        """2026-07-28 ``subscriptions/listen``: this request is the stream.
        The acknowledgement first (what is honored: the list changes asked
        for, and the resources whose server takes subscriptions, each asked
        of its server once for all holders), then the stream's frames, each
        stamped with the request's id; it ends when the client cancels it or
        leaves (no result), or gracefully when the daemon stops (its result)."""
        wanted = _decode(params, _ListenParams).notifications
        session = cast(Session | None, client_session())
        request_id = _request_id.get()
        if session is None or request_id is None:
            raise InvalidParamsError("subscriptions/listen needs a session and an id")
        changes = frozenset(m for m, f in _LIST_CHANGES.items() if getattr(wanted, f))
        listen = _Listen(request_id, changes)
        self._listens.setdefault(session, {})[request_id] = listen
        if session in self._stopping:
            listen.ended.set()
        try:
            honored: dict[str, Any] = {
                _camel(_LIST_CHANGES[m]): True for m in sorted(changes)
            }
            if wanted.resource_subscriptions is not None:
                honored["resourceSubscriptions"] = [
                    uri
                    for uri in wanted.resource_subscriptions
                    if await self._hold(caller, listen, uri)
                ]
            await session.send(listen.line(ACKNOWLEDGED, {"notifications": honored}))
            await listen.ended.wait()
        finally:
            held = self._listens.get(session, {})
            if held.pop(request_id, None) is not None:
                self._let_go(listen)
            if not held:
                self._listens.pop(session, None)
        return {"_meta": {mcp_meta.SUBSCRIPTION_ID: request_id}}

    async def _hold(self, caller: Caller, listen: _Listen, uri: str) -> bool:
        """The listen stream subscribes to ``uri`` of the server that lists it
        (False: none does, or it takes no subscriptions)."""
        try:
            owner = await self._owner_of(caller, uri)
            if not owner.can_subscribe:
                return False
            await owner.subscribe_resource(listen, uri)
        except RemoteError:
            return False
        listen.resources.add((owner.name, uri))
        listen.holds.add(owner)
        return True

    def _let_go(self, listen: _Listen) -> None:
        """A listen stream ended: its resources are held no more (the last
        holder's unsubscribe follows, ``subscriptions.py``)."""
        listen.resources.clear()
        for upstream in listen.holds:  # those a reload took out of scope too
            upstream.subscriptions.release(listen)
        listen.holds.clear()

    async def _owner_of(self, caller: Caller, uri: str) -> Upstream:
        """The server a URI goes to: the first, by name, that lists it; else
        (a URI built from a template) the first whose template it matches."""
        found = await self._listed(caller, lambda u: u.list_resources())
        owner = next((u for u, item in found if item.uri == uri), None)
        if owner is None:  # perhaps a template's
            templated = await self._listed(
                caller, lambda u: u.list_resource_templates()
            )
            owner = next(
                (u for u, t in templated if uri_templates.matches(t.uri_template, uri)),
                None,
            )
        if owner is None:
            raise NotFoundError(
                f"no server in scope lists the resource {uri[:_SAID_MAX]!r}",
                reason="not_found",
            )
        return owner

    async def _prompts(
        self, caller: Caller
    ) -> tuple[dict[str, tuple[str, str]], list[Any]]:
        upstreams = self._in_scope(caller)
        found = await self._listed(caller, lambda u: u.list_prompts())
        names = exposed_names(
            ((u.name, p.name) for u, p in found),
            single=len(upstreams) == 1,
            separator=self.separator_of(caller),
        )
        by_pair = {pair: shown for shown, pair in names.items()}
        listed = []
        for upstream, prompt in found:
            shown = by_pair.pop((upstream.name, prompt.name), None)
            if shown is None:  # a prompt its server lists twice: listed once
                continue
            item = _builtins(prompt)
            item["name"] = shown
            listed.append(item)
        return names, listed

    async def _prompts_list(
        self, caller: Caller, params: msgspec.Raw
    ) -> dict[str, Any]:
        _first_page(params)
        _, listed = await self._prompts(caller)
        return {"prompts": listed}

    async def _prompts_get(self, caller: Caller, params: msgspec.Raw) -> dict[str, Any]:
        get = _decode(params, _GetPrompt)
        routes, _ = await self._prompts(caller)
        route = routes.get(get.name)
        if route is None:
            raise InvalidParamsError(f"unknown prompt {get.name[:_SAID_MAX]!r}")
        server, name = route
        upstream = self._broker.scoped(caller, server)
        result = await upstream.get_prompt(name, get.arguments, timeout_s=None)
        return _builtins(result)

    # --- completions ------------------------------------------------------------

    async def _complete(self, caller: Caller, params: msgspec.Raw) -> dict[str, Any]:
        """``completion/complete``, to the server that owns the ref: a prompt
        by its shown name (sent under its own), a resource template by its
        URI template (the first server, by name, that lists it)."""
        ref = _decode(params, _Complete).ref
        forwarded: dict[str, Any] = _decode(params, dict[str, Any])
        forwarded.pop("_meta", None)  # the upstream request carries its own
        owner: Upstream | None = None
        if ref.type == "ref/prompt" and ref.name is not None:
            routes, _ = await self._prompts(caller)
            route = routes.get(ref.name)
            if route is None:
                raise InvalidParamsError(f"unknown prompt {ref.name[:_SAID_MAX]!r}")
            owner = self._broker.scoped(caller, route[0])
            forwarded["ref"] = {**forwarded["ref"], "name": route[1]}
        elif ref.type == "ref/resource" and ref.uri is not None:
            uri = ref.uri
            templates = await self._listed(
                caller, lambda u: u.list_resource_templates()
            )
            owner = next((u for u, t in templates if t.uri_template == uri), None)
            if owner is None:
                raise InvalidParamsError(
                    f"no server in scope lists the resource template {uri[:_SAID_MAX]!r}"
                )
        else:
            raise InvalidParamsError(
                f"unknown completion reference {ref.type[:_SAID_MAX]!r}"
            )
        # a server that offers none is refused there, as on the socket API
        return await owner.complete(forwarded, timeout_s=None)


def _updated_line(server: str, uri: str, params: msgspec.Raw) -> bytes:
    """An update as MCP has it: the server's params, as it sent them."""
    return (
        b'{"jsonrpc":"2.0","method":"'
        + UPDATED.encode()
        + b'","params":'
        + bytes(params)
        + b"}\n"
    )


def _progress_to(call: _Call) -> ProgressHandler | None:
    """Where the call's progress goes: the client's own token, on its
    connection (None: the client asked for none, or cannot be sent to)."""
    token = None if call.meta is None else call.meta.progress_token
    if token is None:
        return None

    def note(report: ProgressReport) -> bytes:
        params = {"progressToken": token, **msgspec.to_builtins(report)}
        message = {
            "jsonrpc": "2.0",
            "method": "notifications/progress",
            "params": params,
        }
        return _encoder.encode(message) + b"\n"

    return progress_to_client(note)


async def _telling(
    wait: Awaitable[T], notes: Callable[[], Coroutine[Any, Any, None]]
) -> T:
    """``wait``, with ``notes`` sent meanwhile (stopped when it is over)."""
    failed: Exception | None = None
    async with anyio.create_task_group() as tg:
        tg.start_soon(notes)
        try:
            result = await wait
        except Exception as exc:  # noqa: BLE001 - raised again, outside the group
            failed = exc
        finally:
            tg.cancel_scope.cancel()
    if failed is not None:
        raise failed
    return result


async def _waiting_notes(
    send: Callable[[bytes], Awaitable[None]],
    token: int | str,
    proposal_id: str,
    wait_s: float,
) -> None:
    """While a call waits for the operator: ``notifications/progress`` under
    the client's token at once and every ``APPROVAL_PROGRESS_S``, saying so
    (progress: the seconds waited, of ``wait_s``), so the client knows the
    call lives (and may reset its request timeout on progress)."""
    started = anyio.current_time()
    while True:
        waited = anyio.current_time() - started
        params = {
            "progressToken": token,
            "progress": round(waited, 3),
            "total": wait_s,
            "message": (
                f"waiting for operator approval of proposal {proposal_id} "
                f"({max(0.0, wait_s - waited):.0f} s left)"
            ),
        }
        note = {"jsonrpc": "2.0", "method": "notifications/progress", "params": params}
        with anyio.move_on_after(LIST_CHANGED_SEND_S):
            await send(_encoder.encode(note) + b"\n")
        await anyio.sleep(APPROVAL_PROGRESS_S)


def _decode(params: msgspec.Raw, into: type[Any]) -> Any:
    try:
        return msgspec.json.decode(params, type=into)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise InvalidParamsError(f"invalid params: {exc}") from None
    except RecursionError:  # readable where the line was parsed, not here
        raise InvalidParamsError("invalid params: nested too deeply") from None


def _first_page(params: msgspec.Raw) -> None:
    """A list request's params: the face lists everything in one page (every
    server's pages followed to the end; it gives no ``nextCursor``), so any
    cursor is one it never gave, ``invalid_params`` as MCP has it."""
    if _decode(params, _Cursor).cursor is not None:
        raise InvalidParamsError(
            "invalid cursor: this server lists everything in one page"
            " (it gives no nextCursor)"
        )


def _builtins(value: Any) -> dict[str, Any]:
    built: dict[str, Any] = msgspec.to_builtins(value)
    return built


def _mcp_tool(tool: m.Tool, shown: str, server: str) -> dict[str, Any]:
    """The tool as MCP lists it, under its shown name, the daemon's verdict in ``_meta``."""
    item = _builtins(tool)
    risk, decision = item.pop("risk", None), item.pop("decision", None)
    item["name"] = shown
    if decision == "ask":
        note = "[needs an operator's approval before it runs]"
        item["description"] = f"{note} {item.get('description', '')}".rstrip()
    item["_meta"] = {
        **(item.get("_meta") or {}),
        "memorizz/server": server,
        "memorizz/tool": tool.name,
        "memorizz/risk": risk,
        "memorizz/decision": decision,
    }
    return item


def _not_run(
    proposal_id: str, status: str, facts: dict[str, Any] | None = None
) -> msgspec.Raw:
    """A call the operator has not approved (yet), as a tool result the model
    can read: the proposal, its status (and ``facts``: the refusal's data) and
    what to do."""
    if status == "pending":
        text = (
            f"This call needs an operator's approval; it is stored as proposal "
            f"{proposal_id} and is still pending. An operator approves it with "
            f"`memorizzctl mcp approve {proposal_id}`; once it is approved, the same "
            "call (same tool, same arguments) runs it."
        )
    else:
        text = f"This call was not approved: proposal {proposal_id} is {status}."
    said = {**(facts or {}), "proposal_id": proposal_id, "status": status}
    return msgspec.Raw(_encoder.encode(daemons_error(text, said)))


_DAEMONS_ERROR: Final = DAEMONS_ERROR.encode()


def _face_error(exc: RemoteError) -> ErrorObject:
    """``exc`` as the face's error: the socket API's, but an upstream's URL
    elicitation required error (-32042) keeps its code and its ``data``
    (``elicitations``), which MCP's clients act on (open the URL, retry)."""
    wire = exc.to_wire()
    upstream = exc.data.get("upstream_data")
    if (
        exc.reason == "upstream_error"
        and exc.data.get("upstream_code") == URL_ELICITATION_REQUIRED
        and isinstance(upstream, dict)
    ):
        ours = {k: v for k, v in (wire.data or {}).items() if k != "upstream_data"}
        data = {**upstream, **ours}
        return ErrorObject(
            code=URL_ELICITATION_REQUIRED, message=wire.message, data=data
        )
    return wire


def _refused_input(exc: RemoteError) -> dict[str, Any]:
    """A built-in tool's input it cannot take (a malformed or unknown id), as
    a tool result that says why, with the error's reason and data."""
    return daemons_error(exc.message, {"reason": exc.reason, **(exc.data or {})})


def _fitted(result: Any) -> Any:
    """A tool result for a tool that declares an ``outputSchema``: an
    ``isError`` result of the daemon's own (``DAEMONS_ERROR`` in its
    ``_meta``: a call not approved, a question its caller could not answer)
    without its ``structuredContent``, which would not match that schema
    (clients check it, errors too: the TypeScript SDK's refuses the result);
    its facts stay in ``_meta``. Anything else, the server's, as it is."""
    if not isinstance(result, msgspec.Raw):
        return _unstructured(result)
    if _DAEMONS_ERROR not in bytes(result):  # the relayed bytes, looked at only
        return result
    try:
        decoded = msgspec.json.decode(result)
    except (msgspec.DecodeError, RecursionError):
        return result
    fitted = _unstructured(decoded)
    return result if fitted is decoded else msgspec.Raw(_encoder.encode(fitted))


def _unstructured(result: Any) -> Any:
    """``result`` without ``structuredContent`` if it is a daemon's ``isError``
    result (``DAEMONS_ERROR`` in its ``_meta``); else ``result`` itself."""
    if not isinstance(result, dict):
        return result
    meta = result.get("_meta")
    if not (
        result.get("isError") is True
        and isinstance(meta, dict)
        and DAEMONS_ERROR in meta
    ):
        return result
    return {k: v for k, v in result.items() if k != "structuredContent"}


_request_id: ContextVar[int | str | None] = ContextVar("face_request_id", default=None)
"""The running request's id (its reply may go out before its handler ends)."""


async def _reply_now(result: Any) -> None:
    """Answer the running request now, its handler going on (``rounds.first``)."""
    send = client_send()
    if send is not None:
        reply = Reply(jsonrpc="2.0", id=_request_id.get(), result=result)
        await send(_encoder.encode(reply) + b"\n")


def _modern(request: Request) -> bool:
    """Whether the request is of the 2026-07-28 era (its params are stamped)."""
    return request.method == "server/discover" or _stamped(request.params)


def _stamped(params: msgspec.Raw) -> bool:
    """Whether request params carry the 2026-07-28 stamp."""
    try:
        stamp = _decode_stamped(params).meta
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
        return False
    return stamp is not None and stamp.version == MODERN


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(word.title() for word in rest)


def _answers_asks(capabilities: Mapping[str, Any]) -> bool:
    """Whether a client that declared ``capabilities`` answers an upstream's
    elicitation or sampling requests (then its calls run in a task)."""
    return any(isinstance(capabilities.get(c), dict) for c in ASKED.values())


def _fitted_tool(result: msgspec.Raw) -> object:
    """``_completed_tool`` of a result ``_fitted`` to a typed tool."""
    fitted = _fitted(result)
    return _completed("tools/call", fitted)


def _completed_tool(result: msgspec.Raw) -> object:
    """A relayed tool result as 2026-07-28 has it (``_completed``)."""
    return _completed("tools/call", result)


def _completed(method: str, result: Any) -> Any:
    """A result as 2026-07-28 has it: ``resultType`` (and the cache hints of a
    listing: private to this caller, not to be reused)."""
    if isinstance(result, msgspec.Raw):  # a relayed tool result
        raw = bytes(result).strip()
        try:
            if _decode_result_type(raw).result_type is not None:
                return result  # a 2026-07-28 upstream's, as it wrote it
        except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
            return result
        rest = raw[1:].lstrip()
        joined = b"}" if rest.startswith(b"}") else b"," + rest
        return msgspec.Raw(b'{"resultType":"complete"' + joined)
    if isinstance(result, dict):
        result = {"resultType": "complete", **result}
        if method in _CACHED:
            result = {"cacheScope": "private", "ttlMs": 0, **result}
    return result
