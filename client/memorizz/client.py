"""A blocking client for the memorizzd socket: one method per RPC.

Each typed method sends one method of the table in ``memorizz.api.methods``
(``Client.call``: the name and the result type come from the declaration); a
test checks that every declared method has one.

It depends on the standard library and msgspec only, so it starts in
milliseconds and can be vendored into any tool. One ``Client`` holds one
connection and sends one request at a time (guarded by a lock, so threads may
share it); open one client per thread for parallel calls.

A call that asks for progress (``call_tool(..., on_progress=...)``) gets the
daemon's ``notifications/progress`` lines before its reply; each is handed to
the callback, in order, on the calling thread. A call that answers an
upstream's requests (``on_elicit``, ``on_sample``) declares so on its
connection (``daemon/hello`` capabilities) and gets them as request lines
before its reply; each callback's return value is sent back as the answer.

A resource this connection subscribed to (``subscribe_resource``) may change
at any time: its ``notifications/resources/updated`` lines come between
replies, or while the client waits for one. The client keeps each one it
reads, in order, and ``resource_updates`` hands them out, reading the socket
for more while it waits. Any other line the daemon sends unasked is skipped.
"""

from __future__ import annotations

import collections
import itertools
import math
import os
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from types import TracebackType
from typing import Any, Final, Literal, Self, TypeVar, overload

import msgspec

from memorizz.api import methods as m
from memorizz.api.errors import (
    DaemonUnreachableError,
    DeadlineExceededError,
    ProtocolError,
    RemoteError,
    SocketPermissionError,
    UpstreamError,
)
from memorizz.api.paths import default_socket_path
from memorizz.api.protocol import JSONRPC, PROTOCOL_VERSION
from memorizz.api.replies import (
    Notification,
    decode_log,
    decode_progress,
    decode_reply,
    decode_update,
    notification,
)

P = TypeVar("P", bound=m.Params)
R = TypeVar("R", bound=m.Result)

_encoder: Final = msgspec.json.Encoder()
_READ_CHUNK: Final = 1 << 16

_CHECKOUT: Final = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
"""client/memorizz/client.py -> the checkout's root (when it is one)."""
UNIT_PATHS: tuple[str, ...] = (
    "/etc/systemd/system/memorizzd.service",
    "/usr/lib/systemd/system/memorizzd.service",
    "/lib/systemd/system/memorizzd.service",
)
"""Where an installed memorizzd.service is (scripts/install; a package)."""


def start_hint() -> str:
    """How to start the daemon here: the unit when it is installed, else
    ``scripts/run`` when this client runs from a checkout, else ``memorizzd``."""
    if any(os.path.exists(path) for path in UNIT_PATHS):
        how = "`systemctl start memorizzd` (`systemctl status memorizzd` says why it stopped)"
    elif os.path.exists(run := os.path.join(_CHECKOUT, "scripts", "run")):
        how = f"`{run}` (foreground)"
    else:
        how = "`memorizzd` (foreground), or install the unit (scripts/install)"
    return (
        f"is memorizzd running? start it with {how}, "
        "or point --socket/MEMORIZZ_SOCKET at its socket"
    )


ProgressCallback = Callable[[m.ProgressParams], object]
"""Called with each progress report of a call, in the order the daemon sent them."""
LogCallback = Callable[[m.LogParams], object]
"""Called with each log message of the call's server, in the order sent."""
NoteCallback = Callable[[Notification], object]
AskCallback = Callable[[dict[str, Any]], dict[str, Any]]
"""Given an upstream's request params (MCP's ``elicitation/create`` or
``sampling/createMessage``, as MCP spells them), returns its MCP result
(``{"action": "accept", "content": {...}}``; a ``CreateMessageResult``)."""
ELICIT: Final = "elicitation/create"
SAMPLE: Final = "sampling/createMessage"
TASK_STATUS: Final = "notifications/tasks/status"
MAX_KEPT_UPDATES: Final = 10_000
"""Updates read and not yet taken (``resource_updates``); past it the oldest go."""


class _CallbackError(Exception):
    """The caller's callback raised: its exception, kept apart from the socket's."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class _Envelope(msgspec.Struct, kw_only=True):
    jsonrpc: str
    id: int
    method: str
    params: Any


class Client:
    """``with Client() as c: c.call_tool("mem0", "search_memories", {"query": "x"})``."""

    def __init__(self, socket_path: str | os.PathLike[str] | None = None) -> None:
        self.socket_path = os.fspath(socket_path or default_socket_path())
        self._sock: socket.socket | None = None
        self._buffer = bytearray()
        self._ids = itertools.count(1)
        self._tokens = itertools.count(1)
        self._lock = threading.Lock()
        self._declared: dict[str, Any] | None = None
        """The capabilities this connection declared (``daemon/hello``)."""
        self._updates: collections.deque[m.ResourceUpdatedParams] = collections.deque(
            maxlen=MAX_KEPT_UPDATES
        )
        """Resource updates read off the connection, not yet taken."""

    # --- plumbing -----------------------------------------------------------

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self._buffer.clear()
        self._declared = None

    def _connect(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(self.socket_path)
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            sock.close()
            msg = f"cannot reach memorizzd at {self.socket_path}: {exc.strerror}; {start_hint()}"
            raise DaemonUnreachableError(msg) from None
        except PermissionError:
            sock.close()
            msg = (
                f"permission denied on {self.socket_path}: "
                "ask for the memorizzd operators group, or use your agent socket"
            )
            raise SocketPermissionError(msg) from None
        except OSError as exc:
            sock.close()
            msg = f"cannot reach memorizzd at {self.socket_path}: {exc}"
            raise DaemonUnreachableError(msg) from None
        return sock

    @overload
    def call(
        self,
        method: m.Method[P, R],
        params: P,
        *,
        on_note: NoteCallback | None = None,
        deadline: float | None = None,
        raw: Literal[False] = False,
    ) -> R: ...
    @overload
    def call(
        self,
        method: m.Method[P, R],
        params: P,
        *,
        on_note: NoteCallback | None = None,
        deadline: float | None = None,
        raw: Literal[True],
    ) -> msgspec.Raw: ...
    @overload
    def call(
        self,
        method: m.Method[P, R],
        params: P,
        *,
        on_note: NoteCallback | None = None,
        deadline: float | None = None,
        raw: bool,
    ) -> R | msgspec.Raw: ...
    def call(
        self,
        method: m.Method[P, R],
        params: P,
        *,
        on_note: NoteCallback | None = None,
        deadline: float | None = None,
        raw: bool = False,
    ) -> R | msgspec.Raw:
        """Send one declared method (``memorizz.api.methods``) and return its
        result, decoded as the declaration says (``on_note``, ``deadline``,
        ``raw``: see ``request``)."""
        return self.request(
            method.name,
            params,
            method.result,
            on_note=on_note,
            deadline=deadline,
            raw=raw,
        )

    @overload
    def request(
        self,
        method: str,
        params: m.Params,
        result_type: type[R],
        *,
        on_note: NoteCallback | None = None,
        deadline: float | None = None,
        raw: Literal[False] = False,
    ) -> R: ...
    @overload
    def request(
        self,
        method: str,
        params: m.Params,
        result_type: type[R],
        *,
        on_note: NoteCallback | None = None,
        deadline: float | None = None,
        raw: Literal[True],
    ) -> msgspec.Raw: ...
    @overload
    def request(
        self,
        method: str,
        params: m.Params,
        result_type: type[R],
        *,
        on_note: NoteCallback | None = None,
        deadline: float | None = None,
        raw: bool,
    ) -> R | msgspec.Raw: ...
    def request(
        self,
        method: str,
        params: m.Params,
        result_type: type[R],
        *,
        on_note: NoteCallback | None = None,
        deadline: float | None = None,
        raw: bool = False,
    ) -> R | msgspec.Raw:
        """Send one request and wait for its reply; raise the wire error as an exception.

        Lines the daemon sends unasked before the reply go to ``on_note``
        (skipped without it); if ``on_note`` raises, the connection is closed
        (its reply would be unread) and the exception propagates.

        A connection the daemon closed for being idle is opened again and the
        request sent again: the daemon says so only when it read no request.
        ``deadline`` (``time.monotonic()``): ``DeadlineExceededError``
        (``timeout``) when no reply came by then, the connection closed.

        ``raw``: the result is checked as ``result_type`` all the same, but
        returned as the bytes of the reply's ``result`` (``msgspec.Raw``):
        for an MCP method the daemon relays (``tools/call``), every member
        the upstream server wrote, in its order, the struct's or not."""
        try:
            return self._request(method, params, result_type, on_note, deadline, raw)
        except DeadlineExceededError as exc:
            if exc.reason != "idle_timeout":
                raise
            self.close()
            return self._request(method, params, result_type, on_note, deadline, raw)

    def _request(
        self,
        method: str,
        params: m.Params,
        result_type: type[R],
        on_note: NoteCallback | None = None,
        deadline: float | None = None,
        raw: bool = False,
    ) -> R | msgspec.Raw:
        with self._lock:
            if self._sock is None:
                self._sock = self._connect()
            request_id = next(self._ids)
            line = _encoder.encode(
                _Envelope(jsonrpc=JSONRPC, id=request_id, method=method, params=params)
            )
            try:
                try:
                    self._sock.sendall(line + b"\n")
                except OSError:
                    # A refused connection is answered with one error line and
                    # closed: read it before reporting a broken connection.
                    reply = self._read_line(self._sock)
                else:
                    reply = self._read_reply(self._sock, on_note, deadline)
            except TimeoutError:
                self.close()  # its reply may still come: nobody will read it
                msg = f"memorizzd at {self.socket_path} did not answer {method} in time"
                raise DeadlineExceededError(msg, reason="timeout") from None
            except (OSError, EOFError) as exc:
                self.close()
                msg = f"connection to memorizzd at {self.socket_path} broke: {exc}"
                raise DaemonUnreachableError(msg) from None
            except _CallbackError as failed:
                self.close()  # the reply is still to come: nobody will read it
                raise failed.exc from None
            except BaseException as exc:  # Ctrl-C mid-read: the same
                if isinstance(exc, KeyboardInterrupt):
                    self._cancel(request_id)
                self.close()
                raise
        if raw:
            return raw_result(reply, request_id, result_type)
        return decode_reply(reply, request_id, result_type)

    def _read_reply(
        self,
        sock: socket.socket,
        on_note: NoteCallback | None,
        deadline: float | None = None,
    ) -> bytes:
        """The reply line, past any notification lines before it (a resource
        update among them is kept for ``resource_updates``). A request of the
        daemon's that this call has nothing to answer with (an elicitation
        or sampling request, for capabilities an earlier call on this
        connection declared) is refused at once, never left unanswered: the
        server would wait for it until the call's deadline."""
        while True:
            raw = self._read_line(sock, deadline)
            note = notification(raw)
            if note is None:
                return raw
            if self._kept(note):
                continue
            if on_note is None and note.id is not None:
                self._asked(note.id, note, None)
                continue
            if on_note is not None:
                try:
                    on_note(note)
                except Exception as exc:
                    raise _CallbackError(exc) from exc

    def _kept(self, note: Notification) -> bool:
        """Whether ``note`` is a resource update (kept, in order)."""
        update = decode_update(note)
        if update is None:
            return False
        self._updates.append(update)
        return True

    def _read_line(self, sock: socket.socket, deadline: float | None = None) -> bytes:
        """The next line; ``deadline`` (``time.monotonic()``): ``TimeoutError``
        if no whole line came by then (what came of one is kept)."""
        while True:
            end = self._buffer.find(b"\n")
            if end >= 0:
                line = bytes(self._buffer[:end])
                del self._buffer[: end + 1]
                return line
            if deadline is not None and not _readable(
                sock, max(0.0, deadline - time.monotonic())
            ):
                raise TimeoutError
            chunk = sock.recv(_READ_CHUNK)
            if not chunk:
                raise EOFError("daemon closed the connection")
            self._buffer += chunk

    # --- the daemon ---------------------------------------------------------

    def hello(
        self,
        client: str = "memorizz-python",
        *,
        capabilities: dict[str, Any] | None = None,
    ) -> m.DaemonHelloResult:
        """Check the protocol; ``capabilities``: what this connection's calls
        answer (MCP's spelling: ``{"elicitation": {"form": {}}}``)."""
        result = self.call(
            m.DAEMON_HELLO,
            m.DaemonHelloParams(
                protocol_version=PROTOCOL_VERSION,
                client=client,
                capabilities=capabilities or {},
            ),
        )
        self._declared = capabilities or {}
        return result

    def _cancel(self, request_id: int) -> None:
        """Tell the daemon to stop ``request_id`` (upstream too; best effort)."""
        note = {
            "jsonrpc": JSONRPC,
            "method": "notifications/cancelled",
            "params": {"requestId": request_id, "reason": "interrupted"},
        }
        try:
            if self._sock is not None:
                self._sock.sendall(_encoder.encode(note) + b"\n")
        except OSError:
            pass

    def _answer(self, request_id: int | str, line: dict[str, Any]) -> None:
        """Send the daemon the answer to its request ``request_id``."""
        if self._sock is not None:
            message = {"jsonrpc": JSONRPC, "id": request_id, **line}
            self._sock.sendall(_encoder.encode(message) + b"\n")

    def daemon_status(self, *, timeout_s: float | None = None) -> m.DaemonStatusResult:
        """The daemon's status; with ``timeout_s``, ``DeadlineExceededError``
        (``timeout``) when no answer came in that time (a stuck daemon: what
        a liveness probe must tell from a slow one)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        return self.call(m.DAEMON_STATUS, m.DaemonStatusParams(), deadline=deadline)

    def daemon_reload(self) -> m.DaemonReloadResult:
        """Re-read the daemon's config file and apply what changed."""
        return self.call(m.DAEMON_RELOAD, m.DaemonReloadParams())

    def ping(self, server: str | None = None) -> m.PingResult:
        return self.call(m.PING, m.PingParams(server=server))

    # --- servers ------------------------------------------------------------

    def list_servers(self) -> list[m.ServerInfo]:
        return self.call(m.SERVERS_LIST, m.ServersListParams()).servers

    def list_presets(self) -> list[m.Preset]:
        return self.call(m.PRESETS_LIST, m.PresetsListParams()).presets

    def add_server(self, spec: m.ServerSpec) -> m.ServerInfo:
        return self.call(m.SERVERS_ADD, m.ServersAddParams(server=spec)).server

    def remove_server(self, name: str) -> m.ServersRemoveResult:
        return self.call(m.SERVERS_REMOVE, m.ServersRemoveParams(name=name))

    def server_status(self, name: str | None = None) -> list[m.ServerStatus]:
        return self.call(m.SERVERS_STATUS, m.ServersStatusParams(name=name)).servers

    def test_server(
        self, name: str, timeout_s: float | None = None
    ) -> m.ServersTestResult:
        return self.call(
            m.SERVERS_TEST, m.ServersTestParams(name=name, timeout_s=timeout_s)
        )

    def audit(
        self,
        *,
        server: str | None = None,
        tool: str | None = None,
        outcome: str | None = None,
        since: float | None = None,
        before_id: int | None = None,
        limit: int = 100,
    ) -> m.AuditListResult:
        """Audit records, newest first; page with ``before_id=result.next_before_id``."""
        return self.call(
            m.AUDIT_LIST,
            m.AuditListParams(
                server=server,
                tool=tool,
                outcome=outcome,
                since=since,
                before_id=before_id,
                limit=limit,
            ),
        )

    def rotate_vault(self, *, new_key: bool = False) -> m.VaultRotateResult:
        """Re-encrypt every secret under the primary key (``new_key``: key file only)."""
        return self.call(m.VAULT_ROTATE, m.VaultRotateParams(new_key=new_key))

    def auth_login(
        self, server: str, *, redirect_uri: str | None = None
    ) -> m.AuthLoginResult:
        """Start an OAuth login: open ``authorization_url``, then pass the URL
        the browser lands on to ``auth_complete``."""
        return self.call(
            m.AUTH_LOGIN, m.AuthLoginParams(server=server, redirect_uri=redirect_uri)
        )

    def auth_complete(self, server: str, callback_url: str) -> m.AuthCompleteResult:
        return self.call(
            m.AUTH_COMPLETE,
            m.AuthCompleteParams(server=server, callback_url=callback_url),
        )

    def auth_logout(self, server: str) -> m.AuthLogoutResult:
        return self.call(m.AUTH_LOGOUT, m.AuthLogoutParams(server=server))

    # --- approvals ----------------------------------------------------------

    def list_approvals(
        self,
        *,
        status: m.ProposalStatus | None = None,
        limit: int = 100,
        show_arguments: bool = False,
    ) -> list[m.Proposal]:
        """Proposals, newest first (an agent socket shows its profile's own)."""
        return self.call(
            m.APPROVALS_LIST,
            m.ApprovalsListParams(
                status=status, limit=limit, show_arguments=show_arguments
            ),
        ).proposals

    def approve(self, proposal_id: str, *, approver: str | None = None) -> m.Proposal:
        """Approve as this connection's uid; ``approver`` is only an extra label."""
        return self.call(
            m.APPROVALS_APPROVE,
            m.ApprovalsApproveParams(id=proposal_id, approver=approver),
        ).proposal

    def reject(self, proposal_id: str, *, reason: str | None = None) -> m.Proposal:
        return self.call(
            m.APPROVALS_REJECT, m.ApprovalsRejectParams(id=proposal_id, reason=reason)
        ).proposal

    def cancel_approval(self, proposal_id: str) -> m.Proposal:
        return self.call(
            m.APPROVALS_CANCEL, m.ApprovalsCancelParams(id=proposal_id)
        ).proposal

    @overload
    def resume(
        self,
        proposal_id: str,
        *,
        timeout_s: float | None = None,
        raw: Literal[False] = False,
    ) -> m.ToolsCallResult: ...
    @overload
    def resume(
        self,
        proposal_id: str,
        *,
        timeout_s: float | None = None,
        raw: Literal[True],
    ) -> msgspec.Raw: ...
    def resume(
        self,
        proposal_id: str,
        *,
        timeout_s: float | None = None,
        raw: bool = False,
    ) -> m.ToolsCallResult | msgspec.Raw:
        """Run an approved proposal's stored call (once; a second resume fails).
        ``raw``: the tool's result as the upstream server wrote it, as
        ``call_tool(..., raw=True)`` returns it (the daemon relays it alike)."""
        return self.call(
            m.APPROVALS_RESUME,
            m.ApprovalsResumeParams(id=proposal_id, timeout_s=timeout_s),
            raw=raw,
        )

    def wait_approval(
        self, proposal_id: str, *, timeout_s: float = 30.0
    ) -> m.ApprovalsWaitResult:
        """Block until the proposal is decided, or ``timeout_s`` passes."""
        return self.call(
            m.APPROVALS_WAIT, m.ApprovalsWaitParams(id=proposal_id, timeout_s=timeout_s)
        )

    # --- MCP pass-through ---------------------------------------------------

    def list_tools(self, server: str, *, refresh: bool = False) -> list[m.Tool]:
        return self.call(
            m.TOOLS_LIST, m.ToolsListParams(server=server, refresh=refresh)
        ).tools

    @overload
    def call_tool(
        self,
        server: str,
        name: str,
        arguments: dict[str, Any] | None = None,
        *,
        timeout_s: float | None = None,
        on_progress: ProgressCallback | None = None,
        on_elicit: AskCallback | None = None,
        on_sample: AskCallback | None = None,
        on_log: LogCallback | None = None,
        raw: Literal[False] = False,
    ) -> m.ToolsCallResult: ...
    @overload
    def call_tool(
        self,
        server: str,
        name: str,
        arguments: dict[str, Any] | None = None,
        *,
        timeout_s: float | None = None,
        on_progress: ProgressCallback | None = None,
        on_elicit: AskCallback | None = None,
        on_sample: AskCallback | None = None,
        on_log: LogCallback | None = None,
        raw: Literal[True],
    ) -> msgspec.Raw: ...
    def call_tool(
        self,
        server: str,
        name: str,
        arguments: dict[str, Any] | None = None,
        *,
        timeout_s: float | None = None,
        on_progress: ProgressCallback | None = None,
        on_elicit: AskCallback | None = None,
        on_sample: AskCallback | None = None,
        on_log: LogCallback | None = None,
        raw: bool = False,
    ) -> m.ToolsCallResult | msgspec.Raw:
        """Call a tool; an ``isError`` result is returned, not raised.

        ``on_progress``: ask for the call's progress, and get each report the
        server sends while the call runs (before this returns), in order.
        ``on_elicit`` / ``on_sample``: answer the server's elicitation (form
        and URL) / sampling (with tools) requests of this call; without them
        the server is told this client does not support them.
        ``on_log``: the log messages of the server (any caller's, while this
        call runs on it: MCP's do not say which call they are about), each
        with the server's name, before this returns.
        ``raw``: the result as the upstream server wrote it, a ``msgspec.Raw``
        of MCP's ``CallToolResult`` (members ``ToolsCallResult`` does not
        model kept), checked as a ``ToolsCallResult`` first."""
        token: int | None = None
        on_note: NoteCallback | None = None
        answers = {ELICIT: on_elicit, SAMPLE: on_sample}
        capabilities: dict[str, Any] = {}
        if on_elicit is not None:
            capabilities["elicitation"] = {"form": {}, "url": {}}
        if on_sample is not None:
            capabilities["sampling"] = {"tools": {}}
        if on_log is not None:
            capabilities["logging"] = {}
        if not capabilities.keys() <= (self._declared or {}).keys():
            self.hello(capabilities={**(self._declared or {}), **capabilities})
        if on_progress is not None:
            token = next(self._tokens)
        if on_progress is not None or capabilities:

            def on_note(note: Notification) -> None:
                if note.id is not None:
                    self._asked(note.id, note, answers.get(note.method))
                    return
                if on_log is not None and (logged := decode_log(note)) is not None:
                    on_log(logged)
                    return
                report = decode_progress(note)
                if on_progress and report and report.progress_token == token:
                    on_progress(report)

        params = m.ToolsCallParams(
            server=server,
            name=name,
            arguments=m.arguments(arguments),
            timeout_s=timeout_s,
            progress_token=token,
        )
        return self.call(m.TOOLS_CALL, params, on_note=on_note, raw=raw)

    def _asked(
        self, request_id: int | str, note: Notification, answer: AskCallback | None
    ) -> None:
        """The daemon's request ``note``: the callback's result sent back (an
        error if there is no callback; its exception propagates)."""
        if answer is None:
            error = {"code": -32601, "message": f"{note.method} is not answered here"}
            self._answer(request_id, {"error": error})
            return
        result = answer(msgspec.json.decode(note.params))
        self._answer(request_id, {"result": result})

    def list_resources(self, server: str) -> list[m.Resource]:
        return self.call(
            m.RESOURCES_LIST, m.ResourcesListParams(server=server)
        ).resources

    def list_resource_templates(self, server: str) -> list[m.ResourceTemplate]:
        return self.call(
            m.RESOURCES_TEMPLATES_LIST, m.ResourcesTemplatesListParams(server=server)
        ).resource_templates

    def read_resource(
        self, server: str, uri: str, *, timeout_s: float | None = None
    ) -> m.ResourcesReadResult:
        return self.call(
            m.RESOURCES_READ,
            m.ResourcesReadParams(server=server, uri=uri, timeout_s=timeout_s),
        )

    def subscribe_resource(self, server: str, uri: str) -> None:
        """Hear of ``uri``'s updates on this connection (``resource_updates``)
        until ``unsubscribe_resource`` or ``close``; the daemon lets go of
        the subscription when the connection ends."""
        self.call(
            m.RESOURCES_SUBSCRIBE, m.ResourcesSubscribeParams(server=server, uri=uri)
        )

    def unsubscribe_resource(self, server: str, uri: str) -> None:
        self.call(
            m.RESOURCES_UNSUBSCRIBE,
            m.ResourcesUnsubscribeParams(server=server, uri=uri),
        )

    def resource_updates(
        self, timeout_s: float | None = None
    ) -> Iterator[m.ResourceUpdatedParams]:
        """The updates of the resources this connection subscribed to, in the
        order they came: those already read (while waiting for replies)
        first, then each as it arrives, for ``timeout_s`` seconds in all
        (``None``: until the connection ends; 0: only those already here).
        Between two updates the client is free: the loop's body may call any
        method (the updates that come meanwhile are kept). Without a
        connection there is nothing to wait for: it ends at once. The daemon
        closing the connection raises ``DaemonUnreachableError``."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            update = self._next_update(deadline)
            if update is None:
                return
            yield update

    def _next_update(self, deadline: float | None) -> m.ResourceUpdatedParams | None:
        """The next update (None: the deadline passed, or no connection). The
        lock is held only to read: another thread's request meanwhile keeps
        the updates it reads for this one."""
        while True:
            with self._lock:
                if self._updates:
                    return self._updates.popleft()
                sock = self._sock
                if sock is None:
                    return None
                if b"\n" in self._buffer or _readable(sock, 0.0):
                    try:
                        raw = self._read_line(sock, deadline)
                    except TimeoutError:  # a line begun; the rest comes later
                        return None
                    except (OSError, EOFError) as exc:
                        self.close()
                        msg = f"connection to memorizzd at {self.socket_path} broke: {exc}"
                        raise DaemonUnreachableError(msg) from None
                    note = notification(raw)
                    if note is None:  # a reply to no request: the daemon's last word
                        self.close()
                        decode_reply(raw, 0, m.EmptyResult)  # its error, raised
                        raise ProtocolError("memorizzd sent a reply to no request")
                    self._kept(note)  # anything else unasked is skipped
                    continue
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            _readable(sock, left)  # then look again, under the lock

    def list_prompts(self, server: str) -> list[m.Prompt]:
        return self.call(m.PROMPTS_LIST, m.PromptsListParams(server=server)).prompts

    def get_prompt(
        self,
        server: str,
        name: str,
        arguments: dict[str, str] | None = None,
        *,
        timeout_s: float | None = None,
    ) -> m.PromptsGetResult:
        return self.call(
            m.PROMPTS_GET,
            m.PromptsGetParams(
                server=server, name=name, arguments=arguments or {}, timeout_s=timeout_s
            ),
        )

    def complete(
        self,
        server: str,
        ref: m.CompletionReference | Mapping[str, Any],
        argument: m.CompletionArgument | Mapping[str, str],
        context: m.CompletionContext | Mapping[str, Any] | None = None,
        *,
        timeout_s: float | None = None,
    ) -> m.CompletionCompleteResult:
        """The server's completions of ``argument`` (``{"name": ..., "value":
        what was typed}``) of a prompt (``m.PromptReference(name=...)``, or
        ``{"type": "ref/prompt", "name": ...}``) or a resource template
        (``m.ResourceTemplateReference(uri=TEMPLATE)``, ``{"type":
        "ref/resource", "uri": ...}``); ``context``: ``{"arguments": {...}}``,
        the other arguments' values. ``.completion.values`` holds them."""
        params = m.CompletionCompleteParams(
            server=server,
            ref=_as(ref, m.CompletionReference),
            argument=_as(argument, m.CompletionArgument),
            context=None if context is None else _as(context, m.CompletionContext),
            timeout_s=timeout_s,
        )
        return self.call(m.COMPLETION_COMPLETE, params)

    # --- tasks (MCP 2025-11-25) ---------------------------------------------

    def call_tool_task(
        self,
        server: str,
        name: str,
        arguments: dict[str, Any] | None = None,
        *,
        ttl_ms: int | None = None,
        timeout_s: float | None = None,
    ) -> m.Task:
        """Call a tool as a task (its ``execution.taskSupport`` is ``required``
        or ``optional``): the task, at once; the server runs the tool on, and
        ``task_result`` waits for its result. The server's status
        notifications of the task come to this connection (``task_result``'s
        ``on_status`` gets those that arrive while it waits)."""
        params = m.ToolsCallParams(
            server=server,
            name=name,
            arguments=m.arguments(arguments),
            timeout_s=timeout_s,
            task=m.TaskMetadata(ttl=ttl_ms),
        )
        task = self.call(m.TOOLS_CALL, params).task
        if task is None:
            raise UpstreamError(f"{server}: the call created no task")
        return task

    def get_task(self, task_id: str) -> m.Task:
        return self.call(m.TASKS_GET, m.TasksGetParams(task_id=task_id))

    def task_result(
        self,
        task_id: str,
        *,
        timeout_s: float | None = None,
        on_status: Callable[[m.Task], object] | None = None,
    ) -> m.ToolsCallResult:
        """Wait for the task to end (at most ``timeout_s``, capped by the
        server's): its tool result (``isError`` returned, not raised)."""

        def on_note(note: Notification) -> None:
            if on_status is not None and note.method == TASK_STATUS:
                try:
                    task = msgspec.json.decode(note.params, type=m.Task)
                except (msgspec.DecodeError, msgspec.ValidationError):
                    return
                on_status(task)

        params = m.TasksResultParams(task_id=task_id, timeout_s=timeout_s)
        return self.call(m.TASKS_RESULT, params, on_note=on_note)

    def cancel_task(self, task_id: str) -> m.Task:
        return self.call(m.TASKS_CANCEL, m.TasksCancelParams(task_id=task_id))

    def list_tasks(self) -> list[m.Task]:
        return self.call(m.TASKS_LIST, m.TasksListParams()).tasks


class _RawReply(msgspec.Struct):
    result: msgspec.Raw


_decode_raw_reply: Final = msgspec.json.Decoder(_RawReply).decode


def raw_result(
    reply: bytes, request_id: int, result_type: type[m.Result]
) -> msgspec.Raw:
    """The result of the reply line to ``request_id``, checked as
    ``result_type`` (``decode_reply``: its error raised as a ``RemoteError``,
    a malformed reply as ``ProtocolError``), as the bytes it is in the line:
    for an MCP method the daemon relays, what the upstream server wrote,
    every member in its order, the struct's or not."""
    decode_reply(reply, request_id, result_type)
    return _decode_raw_reply(reply).result


def _readable(sock: socket.socket, timeout_s: float | None) -> bool:
    """Whether ``sock`` has something to read (or was closed) within
    ``timeout_s`` (None: however long it takes)."""
    poller = select.poll()
    try:
        poller.register(sock, select.POLLIN)
    except (OSError, ValueError):  # closed meanwhile (by another thread)
        return True
    return bool(poller.poll(None if timeout_s is None else math.ceil(timeout_s * 1000)))


def _as(value: Any, into: Any) -> Any:
    """``value`` as the struct ``into`` (a mapping spelled as on the wire is
    converted; a bad one is ``ValueError``, before anything is sent)."""
    if not isinstance(value, Mapping):
        return value
    try:
        return msgspec.convert(value, into)
    except msgspec.ValidationError as exc:
        raise ValueError(str(exc)) from None


__all__ = ["Client", "RemoteError"]
