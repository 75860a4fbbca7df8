"""The method table and THE boundary where exceptions become JSON-RPC errors.

The table is built from the one declaration of the wire contract
(``memorizz.api.methods.METHODS``): each method's params decoder comes from
it, the roles that may call it too (``rpc.authority``), and a handler must
exist for every declared method and for no other.

Nothing below this module knows JSON-RPC exists: handlers take a decoded
Params struct and return a Result struct or raise a ``RemoteError``. Anything
else that escapes a handler is a bug: it is logged with its traceback and the
wire only ever says "internal error" (exception text may hold a secret).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final, Protocol

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
from memorizz.api.protocol import ErrorObject, Reply, Request, RequestId
from memorizzd.caller import Caller, Handler
from memorizzd.rpc.authority import method_allowed, refuse_method

log = logging.getLogger("memorizzd.rpc")

ErrorHook = Callable[[Caller, str, Params | None, RemoteError], Awaitable[None]]
"""Told of every request that ended in a wire error (the broker audits refusals)."""

_encoder: Final = msgspec.json.Encoder()
_request_decoder: Final = msgspec.json.Decoder(Request)


class _IdProbe(msgspec.Struct):
    id: Any = None


_id_decoder: Final = msgspec.json.Decoder(_IdProbe)


class _Method:
    __slots__ = ("decoder", "handler", "name")

    def __init__(self, name: str, params: type[Params], handler: Handler) -> None:
        self.name = name
        self.decoder = msgspec.json.Decoder(params)
        self.handler = handler


class LineDispatcher(Protocol):
    """What a socket server needs of the protocol it serves (the API's
    ``Dispatcher``, the MCP face's ``FaceDispatcher``)."""

    def parse(self, line: bytes) -> Request | bytes: ...

    def notified(self, session: Session, request: Request) -> bool:
        """Take a notification (no id); False: the server drops and logs it."""
        ...

    async def run(self, caller: Caller, request: Request) -> bytes: ...

    def opened(self, session: Session) -> None:
        """A connection began (a session the protocol may send messages to)."""
        ...

    def closed(self, session: Session) -> None: ...


class Session(Protocol):
    """A connection as a protocol sees it: who, and a way to send it a line."""

    caller: Caller

    async def send(self, line: bytes) -> None: ...

    def cancel(self, request_id: RequestId) -> None:
        """Cancel a request of this connection still running (no reply follows)."""
        ...


class Dispatcher:
    def __init__(
        self, handlers: Mapping[str, Handler], *, on_error: ErrorHook | None = None
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

    def parse(self, line: bytes) -> Request | bytes:
        """The request on one line, or the error reply to send for it at once.

        Malformed lines are answered here (with the id when it can be read), so
        the connection can refuse them without starting a task."""
        return parse_request(line)

    def notified(self, session: Session, request: Request) -> bool:
        """A notification: this API takes none (every method has an effect or
        an answer, so one without an id is dropped by the server)."""
        return False

    def opened(self, session: Session) -> None:
        """This API sends nothing unasked."""

    def closed(self, session: Session) -> None:
        pass

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
                raise MethodNotFoundError(f"unknown method {request.method!r}")
            if not method_allowed(caller, method.name):
                raise refuse_method(method.name)
            try:
                params = method.decoder.decode(request.params)
            except msgspec.ValidationError as exc:
                raise InvalidParamsError(f"invalid params: {exc}") from None
            except msgspec.DecodeError:
                raise InvalidParamsError("params must be a JSON object") from None
            result = await method.handler(caller, params)
        except RemoteError as exc:
            error = exc
        except Exception:  # the boundary; cancellation is a BaseException and passes
            log.exception("internal error handling a request (id %r)", request.id)
            error = InternalError("internal error")
        else:
            return (
                _encoder.encode(Reply(jsonrpc="2.0", id=request.id, result=result))
                + b"\n"
            )
        if self._on_error is not None:
            await self._on_error(caller, request.method, params, error)
        return encode_error(request.id, error.to_wire())


def encode_error(request_id: RequestId | None, error: ErrorObject) -> bytes:
    return (
        _encoder.encode(Reply[None](jsonrpc="2.0", id=request_id, error=error)) + b"\n"
    )


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
        return _request_decoder.decode(line)
    except msgspec.ValidationError as exc:
        request_id = _probe_id(line)
        error = InvalidRequestError(f"not a JSON-RPC 2.0 request: {exc}")
        raise _WithId(error, request_id) from None
    except (msgspec.DecodeError, RecursionError, ValueError):
        raise ParseError("parse error: the line is not valid UTF-8 JSON") from None


def _probe_id(line: bytes) -> RequestId | None:
    try:
        found = _id_decoder.decode(line).id
    except (msgspec.DecodeError, RecursionError, ValueError):
        return None
    return (
        found if isinstance(found, int | str) and not isinstance(found, bool) else None
    )


class _WithId(InvalidRequestError):
    """An invalid request whose id could still be read, so the reply can name it."""

    def __init__(self, error: RemoteError, request_id: RequestId | None) -> None:
        super().__init__(error.message, reason=error.reason, data=error.data)
        self.request_id = request_id
