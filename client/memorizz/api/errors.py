"""Error codes, exception classes and their wire mapping.

The tree (one class per code; ``reason`` refines it and is what clients branch on)::

    MemorizzError
    +-- RemoteError                    crosses the socket: .code .message .reason .data
    |   +-- ParseError                 -32700 parse_error
    |   +-- InvalidRequestError        -32600 invalid_request, frame_too_large
    |   +-- MethodNotFoundError        -32601 method_not_found
    |   +-- InvalidParamsError         -32602 invalid_params, invalid_config,
    |                                         no_config_file
    |   +-- InternalError              -32603 internal
    |   +-- UnsupportedProtocolError   -32000 unsupported_protocol
    |   +-- PermissionDeniedError      -32001 permission_denied, read_only_server,
    |                                         scheme_not_allowed, host_not_allowed,
    |                                         address_not_allowed, credentials_in_url,
    |                                         redirect_blocked, command_not_allowed,
    |                                         tool_blocked
    |   +-- NotFoundError              -32002 unknown_server, not_found
    |   +-- UnavailableError           -32003 server_unavailable, overloaded, shutting_down,
    |                                         upstream_busy, storage_full
    |   +-- AuthRequiredError          -32004 authorization_required, login_required,
    |                                         insufficient_scope
    |   +-- DeadlineExceededError      -32005 timeout, idle_timeout
    |   +-- UpstreamError              -32006 upstream_error
    |   +-- TooLargeError              -32007 result_too_large
    |   +-- ConflictError              -32008 server_exists, not_approved
    |   +-- ApprovalRequiredError      -32009 approval_required
    |   +-- LoginError                 -32010 login_failed, invalid_state
    +-- DaemonUnreachableError         client side only, never on the wire
    |   +-- SocketPermissionError      the socket refused this user
    +-- ProtocolError                  the reply could not be decoded (client side)

Codes -32000..-32099 are ours: append only, never reuse a value. Upstream MCP
errors are wrapped in ``UpstreamError`` (their band would collide with ours);
the upstream's own code is in ``data.upstream_code``.
"""

from __future__ import annotations

from enum import IntEnum
from typing import ClassVar, Final

from memorizz.api.protocol import ErrorObject


class ErrorCode(IntEnum):
    PARSE_ERROR = -32700
    """The line is not valid UTF-8 JSON."""
    INVALID_REQUEST = -32600
    """Valid JSON, but not a JSON-RPC 2.0 request (or the frame is too large)."""
    METHOD_NOT_FOUND = -32601
    """No such method."""
    INVALID_PARAMS = -32602
    """The params do not match the method's schema, or a value is out of range."""
    INTERNAL_ERROR = -32603
    """A bug in the daemon; details are in its log, never on the wire."""
    UNSUPPORTED_PROTOCOL = -32000
    """``daemon/hello`` found no common protocol version."""
    PERMISSION_DENIED = -32001
    """The caller may not do this."""
    NOT_FOUND = -32002
    """Unknown server (or another named thing)."""
    UNAVAILABLE = -32003
    """Upstream down, reconnecting or overloaded; retryable (see ``data.retry_after_s``)."""
    AUTH_REQUIRED = -32004
    """The upstream needs an operator to log in."""
    DEADLINE_EXCEEDED = -32005
    """The call did not finish within its deadline."""
    UPSTREAM_ERROR = -32006
    """The upstream MCP server answered with an error (``data.upstream_code``)."""
    TOO_LARGE = -32007
    """The upstream result exceeded the server's ``max_result_bytes``."""
    CONFLICT = -32008
    """The request conflicts with current state (e.g. the server name is taken)."""
    APPROVAL_REQUIRED = -32009
    """Policy says an operator must approve this call first."""
    LOGIN_FAILED = -32010
    """An OAuth login could not be started or completed (discovery, the
    authorization server's answer, an unknown/expired/replayed ``state``)."""


# Stable reasons (data.reason). Append only.
REASONS: Final = frozenset(
    {
        "parse_error",
        "invalid_request",
        "frame_too_large",
        "method_not_found",
        "invalid_params",
        "internal",
        "unsupported_protocol",
        "permission_denied",
        "read_only_server",
        "unknown_server",
        "not_found",
        "server_unavailable",
        "overloaded",
        "shutting_down",
        "authorization_required",
        "timeout",
        "idle_timeout",
        "upstream_error",
        "result_too_large",
        "server_exists",
        "scheme_not_allowed",
        "host_not_allowed",
        "address_not_allowed",
        "credentials_in_url",
        "redirect_blocked",
        "command_not_allowed",
        "tool_blocked",
        "approval_required",
        "login_required",
        "insufficient_scope",
        "login_failed",
        "invalid_state",
        "not_approved",
        "upstream_busy",
        "invalid_config",
        "no_config_file",
        "unknown_preset",
        "storage_full",
    }
)


class MemorizzError(Exception):
    """Base of every error this package raises."""


class RemoteError(MemorizzError):
    """An error that crosses the socket as a JSON-RPC error object."""

    default_code: ClassVar[int] = ErrorCode.INTERNAL_ERROR
    default_reason: ClassVar[str] = "internal"

    def __init__(
        self,
        message: str,
        *,
        reason: str | None = None,
        data: dict[str, object] | None = None,
        code: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason or self.default_reason
        self.data: dict[str, object] = dict(data or {})
        self.code: int = code if code is not None else self.default_code

    def to_wire(self) -> ErrorObject:
        return ErrorObject(
            code=int(self.code),
            message=self.message,
            data={"reason": self.reason, **self.data},
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, reason={self.reason!r})"


class ParseError(RemoteError):
    default_code = ErrorCode.PARSE_ERROR
    default_reason = "parse_error"


class InvalidRequestError(RemoteError):
    default_code = ErrorCode.INVALID_REQUEST
    default_reason = "invalid_request"


class MethodNotFoundError(RemoteError):
    default_code = ErrorCode.METHOD_NOT_FOUND
    default_reason = "method_not_found"


class InvalidParamsError(RemoteError):
    default_code = ErrorCode.INVALID_PARAMS
    default_reason = "invalid_params"


class InternalError(RemoteError):
    default_code = ErrorCode.INTERNAL_ERROR
    default_reason = "internal"


class UnsupportedProtocolError(RemoteError):
    default_code = ErrorCode.UNSUPPORTED_PROTOCOL
    default_reason = "unsupported_protocol"


class PermissionDeniedError(RemoteError):
    default_code = ErrorCode.PERMISSION_DENIED
    default_reason = "permission_denied"


class NotFoundError(RemoteError):
    default_code = ErrorCode.NOT_FOUND
    default_reason = "not_found"


class UnavailableError(RemoteError):
    default_code = ErrorCode.UNAVAILABLE
    default_reason = "server_unavailable"


class AuthRequiredError(RemoteError):
    default_code = ErrorCode.AUTH_REQUIRED
    default_reason = "authorization_required"


class DeadlineExceededError(RemoteError):
    default_code = ErrorCode.DEADLINE_EXCEEDED
    default_reason = "timeout"


class UpstreamError(RemoteError):
    default_code = ErrorCode.UPSTREAM_ERROR
    default_reason = "upstream_error"


class TooLargeError(RemoteError):
    default_code = ErrorCode.TOO_LARGE
    default_reason = "result_too_large"


class ConflictError(RemoteError):
    default_code = ErrorCode.CONFLICT
    default_reason = "server_exists"


class ApprovalRequiredError(RemoteError):
    default_code = ErrorCode.APPROVAL_REQUIRED
    default_reason = "approval_required"


class LoginError(RemoteError):
    default_code = ErrorCode.LOGIN_FAILED
    default_reason = "login_failed"


class DaemonUnreachableError(MemorizzError, ConnectionError):
    """The client could not reach the daemon's socket, or the connection broke
    (client side only). ``reason``: memorizzctl's (and the Node.js client's)
    word for it, never the daemon's."""

    reason: ClassVar[str] = "daemon_unreachable"


class SocketPermissionError(DaemonUnreachableError, PermissionError):
    """The socket exists but this user may not connect to it (client side only)."""

    reason: ClassVar[str] = "socket_permission_denied"


class ProtocolError(MemorizzError):
    """The daemon's reply could not be understood (client side only)."""


_BY_CODE: Final[dict[int, type[RemoteError]]] = {
    cls.default_code: cls
    for cls in (
        ParseError,
        InvalidRequestError,
        MethodNotFoundError,
        InvalidParamsError,
        InternalError,
        UnsupportedProtocolError,
        PermissionDeniedError,
        NotFoundError,
        UnavailableError,
        AuthRequiredError,
        DeadlineExceededError,
        UpstreamError,
        TooLargeError,
        ConflictError,
        ApprovalRequiredError,
        LoginError,
    )
}


def from_wire(error: ErrorObject) -> RemoteError:
    """Rebuild the exception for a wire error; an unknown code stays a RemoteError."""
    data = dict(error.data or {})
    reason = data.pop("reason", None)
    cls = _BY_CODE.get(error.code, RemoteError)
    return cls(
        error.message,
        reason=reason if isinstance(reason, str) else None,
        data=data,
        code=None if cls is not RemoteError else error.code,
    )
