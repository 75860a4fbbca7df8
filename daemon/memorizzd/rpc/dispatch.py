"""The method table and THE boundary where exceptions become JSON-RPC errors.

The table is built from the one declaration of the wire contract
(``memorizz.api.methods.METHODS``): each method's params decoder comes from
it, the roles that may call it too (``rpc.authority``), and a handler must
exist for every declared method and for no other.

Nothing below this module knows JSON-RPC exists: handlers take a decoded
Params struct and return a Result struct or raise a ``RemoteError``. A write
the full file system of the state directory refused (``StorageFullError``,
from the store wherever it was called) is ``storage_full``, said in one line
of the log. Anything else that escapes a handler is a bug: it is logged with
its traceback and the wire only ever says "internal error" (exception text
may hold a secret). ``unexpected`` is that rule, for every front (the MCP
face's too).
"""

from __future__ import annotations

import decimal
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final, Literal, Protocol

import msgspec

from memorizz.api.errors import (
    InternalError,
    InvalidParamsError,
    InvalidRequestError,
    MethodNotFoundError,
    ParseError,
    RemoteError,
)
from memorizz.api.methods import METHODS, Params
from memorizz.api.protocol import Request, RequestId, error_line, result_line
from memorizzd import stored
from memorizzd.caller import Caller, Handler
from memorizzd.egress.envelope import EnvelopeScanner
from memorizzd.rpc.authority import method_allowed, refuse_method
from memorizzd.store import StorageFullError, full

log = logging.getLogger("memorizzd.rpc")

ErrorHook = Callable[[Caller, str, Params | None, RemoteError], Awaitable[None]]
"""Told of every request that ended in a wire error (the broker audits refusals)."""


class Relayed(Protocol):
    """A request on its way without a task of its own (the warm relay,
    ``memorizzd.relay``): it ends by calling its session's ``finish``."""

    def cancel(self) -> None:
        """The client asked to stop it: no reply follows."""
        ...

    def client_gone(self) -> None:
        """Its client went away: stop it if nothing is lost by that."""
        ...

    def shut_down(self) -> None:
        """The daemon stops before it ended: end it now, replying why."""
        ...


Relay = Callable[["Session", Request], Relayed | None]
"""Starts a request without a task when it can (None: it takes the task's way)."""


class Held(Protocol):
    """What a connection holds between its requests (its resource
    subscriptions, ``memorizzd.subscribers``): kept while it lasts, released
    when it closes."""

    def holds(self, holder: Session) -> bool: ...

    def closed(self, holder: Session) -> None: ...


_encoder: Final = msgspec.json.Encoder()
_request_decoder: Final = msgspec.json.Decoder(Request)


class _IdProbe(msgspec.Struct):
    id: Any = msgspec.UNSET
    """``UNSET``: the message has no ``id`` member; ``None``: ``"id": null``."""


_id_decoder: Final = msgspec.json.Decoder(_IdProbe)


class _NumberIdRequest(msgspec.Struct):
    """A request whose id is not an integer nor a string, kept as written."""

    jsonrpc: Literal["2.0"]
    method: str
    id: msgspec.Raw
    params: msgspec.Raw = msgspec.Raw(b"{}")


_number_id_decoder: Final = msgspec.json.Decoder(_NumberIdRequest)
_INTEGRAL_DIGITS_MAX: Final = 64
"""An id written as a float (``1.0``, ``1e2``) is read as an integer of at
most this many digits (``1e999999999`` is not worth its memory)."""


class _Method:
    __slots__ = ("decoder", "handler", "name")

    def __init__(self, name: str, params: type[Params], handler: Handler) -> None:
        self.name = name
        self.decoder = msgspec.json.Decoder(params)
        self.handler = handler


class LineDispatcher(Protocol):
    """What a socket server needs of the protocol it serves (the API's
    ``Dispatcher``, the MCP face's ``FaceDispatcher``)."""

    @property
    def settles(self) -> frozenset[str]:
        """Methods that set a session up (what its client answers, its log
        level): while one runs, the requests after it on the connection are
        not relayed past it, so they run with what it set."""
        ...

    def parse(self, line: bytes) -> Request | bytes: ...

    def notified(self, session: Session, request: Request) -> bool:
        """Take a notification (no id); False: the server drops and logs it."""
        ...

    async def run(self, caller: Caller, request: Request) -> bytes: ...

    def relay(self, session: Session, request: Request) -> Relayed | None:
        """Start ``request`` without a task, if it can be (see ``Relay``)."""
        ...

    def opened(self, session: Session) -> None:
        """A connection began (a session the protocol may send messages to)."""
        ...

    def draining(self, session: Session) -> None:
        """``session``'s socket stops (the daemon stops, or a reload removes
        it): its requests that would run until told (the MCP face's listen
        streams) end now."""
        ...

    def holds(self, session: Session) -> bool:
        """Whether ``session`` waits for what the protocol sends it unasked
        (a resource subscription's updates): with nothing in flight it is
        not idle (``limits.idle_timeout_s``)."""
        ...

    def closed(self, session: Session) -> None: ...


class Session(Protocol):
    """A connection as a protocol sees it: who, and a way to send it a line."""

    caller: Caller

    async def send(self, line: bytes) -> None: ...

    def cancel(self, request_id: RequestId) -> None:
        """Cancel a request of this connection still running (no reply follows)."""
        ...

    def finish(self, request_id: RequestId, line: bytes | None) -> None:
        """A relayed request ended: its reply line (None: none is sent)."""
        ...


class Dispatcher:
    settles: Final = frozenset({"daemon/hello"})  # its capabilities (calllife.declare)

    def __init__(
        self,
        handlers: Mapping[str, Handler],
        *,
        on_error: ErrorHook | None = None,
        relay: Relay | None = None,
        held: Held | None = None,
    ) -> None:
        missing = METHODS.keys() - handlers.keys()
        if missing:
            raise ValueError(f"no handler for {sorted(missing)}")
        undeclared = handlers.keys() - METHODS.keys()
        if undeclared:  # a method must be declared in memorizz.api.methods first
            raise ValueError(f"handlers for undeclared methods {sorted(undeclared)}")
        self._methods = {
            name: _Method(name, spec.params, handlers[name])
            for name, spec in METHODS.items()
        }
        self._on_error = on_error
        self._relay = relay
        self._held = held
        """The connections' resource subscriptions (``resources/subscribe``)."""

    def parse(self, line: bytes) -> Request | bytes:
        """The request on one line, or the error reply to send for it at once.

        Malformed lines are answered here (with the id when it can be read), so
        the connection can refuse them without starting a task."""
        return parse_request(line)

    def notified(self, session: Session, request: Request) -> bool:
        """A notification: this API takes none (every method has an effect or
        an answer, so one without an id is dropped by the server)."""
        return False

    def relay(self, session: Session, request: Request) -> Relayed | None:
        """A warm ``tools/call`` the caller may make, relayed without a task."""
        if (
            self._relay is None
            or request.method != "tools/call"
            or not method_allowed(session.caller, "tools/call")
        ):
            return None
        return self._relay(session, request)

    def draining(self, session: Session) -> None:
        """Every method of this API ends by itself."""

    def opened(self, session: Session) -> None:
        """What this API sends unasked goes to a connection that asked (a
        call's progress, its server's log messages, its tasks' status, its
        subscriptions' updates): nothing to keep per connection here."""

    def holds(self, session: Session) -> bool:
        return self._held is not None and self._held.holds(session)

    def closed(self, session: Session) -> None:
        """Its subscriptions are let go (the last holder's unsubscribe follows)."""
        if self._held is not None:
            self._held.closed(session)

    async def run(
        self,
        caller: Caller,
        request: Request,
    ) -> bytes:
        """Run one request to its reply line: the result, or the error it raised."""
        method = self._methods.get(request.method)
        params: Params | None = None
        try:
            if method is None:
                raise MethodNotFoundError(f"unknown method {request.method[:200]!r}")
            if not method_allowed(caller, method.name):
                raise refuse_method(method.name, caller)
            try:
                params = method.decoder.decode(request.params)
            except msgspec.DecodeError as exc:  # a ValidationError, or bytes
                # the line's decoder let through (invalid UTF-8 in a string)
                raise InvalidParamsError(f"invalid params: {exc}") from None
            except RecursionError:  # readable where the line was parsed, not here
                raise InvalidParamsError("invalid params: nested too deeply") from None
            result = await method.handler(caller, params)
        except RemoteError as exc:
            error = exc
        except Exception as exc:  # noqa: BLE001 - the boundary: unexpected() logs it
            error = unexpected(exc, request.method, request.id)
        else:
            return encode_result(request.id, result)
        if self._on_error is not None:
            await self._on_error(caller, request.method, params, error)
        return encode_error(request.id, error.to_wire())


encode_result: Final = result_line
encode_error: Final = error_line


def unexpected(
    exc: Exception, method: str, request_id: RequestId | None
) -> RemoteError:
    """The wire error for an exception a handler raised that is not a
    ``RemoteError``: ``storage_full`` for a write the full file system of the
    state directory refused (``StorageFullError`` from the store, ``ENOSPC``
    from a file written there: one line in the log, at error level; nothing
    was changed, and it is not a bug); for anything else, a bug, ``internal``
    (its traceback in the log, nothing of its text on the wire)."""
    if isinstance(exc, StorageFullError) or full(exc):  # ENOSPC: a key file's write
        log.error(
            "%s (id %r) refused, the state directory is full: %s",
            method[:200],
            request_id,
            exc,
        )
        return stored.storage_full()
    log.exception("internal error handling %s (id %r)", method[:200], request_id)
    return InternalError("internal error")


def parse_request(line: bytes) -> Request | bytes:
    """The JSON-RPC request on one line, or the error reply for it (any front)."""
    try:
        return _decode_request(line)
    except _WithId as exc:
        return encode_error(exc.request_id, exc.to_wire())
    except RemoteError as exc:
        return encode_error(None, exc.to_wire())


def _decode_request(line: bytes) -> Request:
    try:
        request = _request_decoder.decode(line)
    except msgspec.ValidationError as exc:
        if (whole := _integral_id_request(line)) is not None:
            return whole
        request_id = _probe_id(line)
        error = InvalidRequestError(f"not a JSON-RPC 2.0 request: {exc}")
        raise _WithId(error, request_id) from None
    except (msgspec.DecodeError, RecursionError, ValueError) as exc:
        scanner = EnvelopeScanner()
        scanner.feed(line.strip())
        refused: RemoteError = (
            InvalidRequestError(
                "the message is nested too deeply to be read (JSON-RPC 2.0"
                " request not run)"
            )
            if isinstance(exc, RecursionError) and scanner.done
            else ParseError("parse error: the line is not valid UTF-8 JSON")
        )
        # A whole request whose id is plain to see (a lone surrogate escape or
        # a nesting too deep somewhere in its params) is answered under it.
        request_id = scanner.id if scanner.done and scanner.has_method else None
        raise _WithId(refused, request_id) from None
    if request.id is None and _has_null_id(line):
        # JSON-RPC 2.0's notification has no ``id`` member; MCP forbids a null
        # request id. Dropped as a notification, it left its client waiting.
        raise _WithId(
            InvalidRequestError(
                "not a JSON-RPC 2.0 request: `id` is null (a request's id is an"
                " integer or a string; a notification has no `id` member)"
            ),
            None,
        )
    return request


def _has_null_id(line: bytes) -> bool:
    """Whether a line that decoded with no id has an ``id`` member (null).

    Read again only for such lines (notifications), never for a request."""
    try:
        return _id_decoder.decode(line).id is None
    except (msgspec.DecodeError, RecursionError, ValueError):
        return False


def _probe_id(line: bytes) -> RequestId | None:
    try:
        found = _id_decoder.decode(line).id
    except (msgspec.DecodeError, RecursionError, ValueError):
        return None
    if isinstance(found, float):
        return _integral_id_request_id(line)
    return (
        found if isinstance(found, int | str) and not isinstance(found, bool) else None
    )


def _integral(written: bytes) -> int | None:
    """An id written as a number with no fractional part (``1.0``, ``1e2``,
    ``-0.0``) is an integer: MCP's schema types a request id ``["string",
    "integer"]``, and JSON Schema's ``integer`` is any number whose
    fractional part is zero. Answered as that integer (the same JSON number,
    as server-everything answers it); ``1.5`` is no integer. Read from the
    text, exactly: a float would take ``9007199254740993.0`` for ...992."""
    try:
        number = decimal.Decimal(written.decode("ascii"))
    except (UnicodeDecodeError, decimal.InvalidOperation):
        return None
    if not number.is_finite() or number.adjusted() >= _INTEGRAL_DIGITS_MAX:
        return None
    if number != number.to_integral_value():
        return None
    return int(number)


def _integral_id_request(line: bytes) -> Request | None:
    """The request on a line that ``Request`` refused only for its id being
    an integral float (``_integral``); None for anything else."""
    try:
        found = _number_id_decoder.decode(line)
    except (msgspec.DecodeError, RecursionError, ValueError):
        return None
    request_id = _integral(bytes(found.id))
    if request_id is None:
        return None
    return Request(
        jsonrpc="2.0", method=found.method, id=request_id, params=found.params
    )


class _RawId(msgspec.Struct):
    id: msgspec.Raw = msgspec.Raw(b"null")


def _integral_id_request_id(line: bytes) -> int | None:
    """The id of a line whose id is a number written as a float, if that
    number is an integer (``_integral``): its error is answered under it."""
    try:
        return _integral(bytes(msgspec.json.decode(line, type=_RawId).id))
    except (msgspec.DecodeError, RecursionError, ValueError):
        return None


class _WithId(InvalidRequestError):
    """An invalid request whose id could still be read, so the reply can name it."""

    def __init__(self, error: RemoteError, request_id: RequestId | None) -> None:
        super().__init__(
            error.message, reason=error.reason, data=error.data, code=error.code
        )
        self.request_id = request_id
