"""The warm relay: a plain ``tools/call`` relayed with no task of its own.

Most calls are plain: the caller asked for nothing but the result (no
progress, no task, no log messages, no upstream requests to answer: nothing
declared in ``daemon/hello``), to a stdio server whose session and tool
listing are warm, for a tool the policy allows. Such a call needs no task and
no awaiting: the pipeline's steps (``calls.py``) run in the two callbacks that
already happen for it. The socket's reader admits the line and, in the same
turn of the loop, finds the server in the caller's scope, takes the verdict
and the tool from the one warm listing, reads and keys the arguments once
(``Auditor.call_arguments``), spools the call as it begins unless it is a
read (``Calls.intent``), and puts the request in the server's stdin
(``JsonRpcSession.start_call``; the arguments are the caller's bytes). The
session's reader gets the answer and, in its turn, splices the result into
the reply (``msgspec.Raw``, its size the bytes read), puts the reply in the
caller's outbox, and writes the one audit record. The caller's deadline is a
timer; a read whose client goes away is cancelled upstream and audited
``client_aborted``; anything else runs to the end. Measured: this is most of
the difference between the daemon's CPU per call and its framework's floor.

Anything else takes ``Calls.call``'s async way from the start: a cold cache, a
decision other than ``allow``, fixed arguments, a session being replaced or
checked, an HTTP server, tracing on. A 2026-07-28 server that answers by
asking its caller first continues in a task (``_rounds``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Final, Protocol

import msgspec

from memorizz.api import methods as m
from memorizz.api.errors import RemoteError, UnavailableError
from memorizz.api.protocol import (
    ErrorObject,
    Request,
    RequestId,
    error_line,
    result_line,
)
from memorizzd.audit import CallArguments, outcome_for
from memorizzd.caller import Caller
from memorizzd.calllife import declared_by
from memorizzd.calls import Calls
from memorizzd.loop import Deadlines, TaskSet, deadline_at, now
from memorizzd.telemetry import tracing
from memorizzd.upstream.actor import Upstream
from memorizzd.upstream.asks import Call, InputRequired
from memorizzd.upstream.connection import Connection, ToolResult
from memorizzd.upstream.errors import ConnectionLost
from memorizzd.upstream.jsonrpc import AsksFirst, JsonRpcSession, Message

_decode_params: Final = msgspec.json.Decoder(m.ToolsCallParams).decode
_SHUTTING_DOWN: Final = UnavailableError(
    "memorizzd is shutting down", reason="shutting_down"
)


class Session(Protocol):
    """The connection a relayed call came on (``rpc.server``'s)."""

    caller: Caller

    def finish(self, request_id: RequestId, line: bytes | None) -> None: ...


class WarmRelay:
    """``Dispatcher``'s relay (``rpc.dispatch.Relay``) for ``tools/call``."""

    def __init__(self, calls: Calls) -> None:
        self._calls = calls
        self._deadlines = Deadlines()
        """The calls' deadlines (one loop timer for all of them)."""
        self._rounds = TaskSet()
        """Calls whose server asked its caller first (rare: they go on in a task)."""

    def __call__(self, session: Session, request: Request) -> _Relayed | None:
        """The socket API's ``tools/call`` (``rpc.dispatch.Relay``)."""
        if request.id is None or tracing.enabled or declared_by(session):
            return None
        try:
            p = _decode_params(request.params)
        except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
            return None  # the task's way says what is wrong
        if p.task is not None or p.progress_token is not None:
            return None
        return self.start(
            session, request.id, p.server, p.name, p.arguments, p.timeout_s
        )

    def start(
        self,
        session: Session,
        request_id: RequestId,
        server: str,
        tool: str,
        arguments: msgspec.Raw,
        timeout_s: float | None,
        shown: Callable[[msgspec.Raw], object] | None = None,
        error_shown: Callable[[RemoteError], ErrorObject] | None = None,
    ) -> _Relayed | None:
        """Relay one call of a front that found it plain (the socket API's
        above, the MCP face's ``FaceDispatcher.relay``); None: it cannot be
        relayed now. ``shown``: the result as the front's protocol shows it
        (default: the server's bytes, as they are); ``error_shown``: an
        error, as the front answers it when it runs the call in a task
        (default: the socket API's ``to_wire``)."""
        if tracing.enabled:
            return None
        calls = self._calls
        caller = session.caller
        try:
            upstream = calls.scoped(caller, server)
        except RemoteError:
            return None
        view = upstream.tools_view
        if view is None:
            return None
        decided = view.verdict(tool)
        if decided.decision != "allow" or decided.blocked or decided.fixed:
            return None
        taken = upstream.warm_session()
        if taken is None:
            return None
        client, release, connection = taken
        started = time.time()
        try:
            read = calls.auditor.call_arguments(bytes(arguments))
        except RemoteError:
            release()
            return None
        relayed = _Relayed(
            self,
            session,
            request_id,
            upstream,
            client,
            tool,
            read,
            decided.risk,
            started,
            upstream.timeout_for(timeout_s),
            shown,
            error_shown,
        )
        # spooled before it is sent, unless a read (Calls.intent)
        relayed.intent = calls.intent(
            caller,
            started,
            upstream.name,
            tool,
            read,
            risk=decided.risk,
            decision="allow",
        )
        begun = client.start_call(tool, read.raw, relayed)
        if begun is None:
            release()
            if relayed.intent is not None:  # not sent: the task's way begins it again
                calls.auditor.abandon(relayed.intent)
            return None
        relayed.began(begun, release, connection)
        return relayed


class _Relayed:
    """One relayed call, from its request to its reply (``deliver``, or its
    deadline, or its client leaving, whichever is first)."""

    __slots__ = (
        "_call",
        "_connection",
        "_key",
        "_release",
        "_rid",
        "_sent",
        "client",
        "error_shown",
        "intent",
        "over",
        "read",
        "relay",
        "request_id",
        "risk",
        "session",
        "shown",
        "started",
        "timeout_s",
        "tool",
        "upstream",
    )

    def __init__(
        self,
        relay: WarmRelay,
        session: Session,
        request_id: RequestId,
        upstream: Upstream,
        client: JsonRpcSession,
        tool: str,
        read: CallArguments,
        risk: m.Risk,
        started: float,
        timeout_s: float,
        shown: Callable[[msgspec.Raw], object] | None,
        error_shown: Callable[[RemoteError], ErrorObject] | None = None,
    ) -> None:
        self.relay = relay
        self.shown = shown
        self.error_shown = error_shown
        self.session = session
        self.request_id = request_id
        self.upstream = upstream
        self.client = client
        self.tool = tool
        self.read = read
        self.risk = risk
        self.started = started
        self.timeout_s = timeout_s
        self.over = False
        self.intent: str | None = None
        """The token of its spooled intent (``Calls.intent``), settled by its record."""

    def began(
        self,
        begun: tuple[int, int, Call],
        release: Callable[[], None],
        connection: Connection,
    ) -> None:
        self._rid, self._key, self._call = begun
        self._release = release
        self._connection = connection
        self._sent = self.upstream.request_began()
        self.relay._calls.began()
        self.relay._deadlines.set(self, self.timeout_s, self._expire)

    # --- how it ends -----------------------------------------------------------

    def deliver(self, message: Message | None) -> None:
        """The server's answer (None: the session ended first)."""
        if self.over:
            return
        try:
            result = self.client.result_of(message)
        except AsksFirst as exc:
            self.relay._deadlines.clear(self)
            self.relay._rounds.spawn(self._rounds, exc.asked, name="tools/call")
            return
        except ConnectionLost as exc:
            self._end(error=self.upstream.lost(self._connection, str(exc)))
            return
        except RemoteError as exc:
            self._end(error=self.upstream.scrubbed(exc))
            return
        self._end(result=result)

    async def _rounds(self, asked: InputRequired) -> None:
        """The server asks its caller first: that goes on in a task, within the
        call's deadline (this caller declared no answers: each is refused)."""
        try:
            remaining = self.timeout_s - (time.time() - self.started)
            async with deadline_at(now() + max(0.0, remaining)):
                result = await self.client.input_rounds(
                    self.tool, self.read.raw, self._call, asked
                )
        except TimeoutError:
            self._end(error=self.upstream.no_answer(self.timeout_s))
        except ConnectionLost as exc:
            self._end(error=self.upstream.lost(self._connection, str(exc)))
        except RemoteError as exc:
            self._end(error=self.upstream.scrubbed(exc))
        except BaseException:  # cancelled: only a shutdown cancels this task
            # (a caller's cancel or departure ends the call first): audited
            # as shut_down() audits it, failed, and the caller told why
            self._end(aborted="cancelled", told=_SHUTTING_DOWN)
            raise
        else:
            self._end(result=result)

    def _expire(self) -> None:
        if self.over:
            return
        self.client.forget(self._rid)
        self._end(error=self.upstream.no_answer(self.timeout_s))

    def client_gone(self) -> None:
        """A read is abandoned with its client (cancelled upstream); anything
        else runs to the end, its reply dropped."""
        if self.risk == "read" and not self.over:
            self.client.forget(self._rid)
            self._end(aborted="client_gone")

    def cancel(self) -> None:
        if not self.over:
            self.client.forget(self._rid)
            self._end(aborted="cancelled")

    def shut_down(self) -> None:
        """The drain ran out before the answer came (as a task is cancelled)."""
        if not self.over:
            self.client.forget(self._rid)
            self._end(aborted="cancelled", told=_SHUTTING_DOWN)

    def _end(
        self,
        *,
        result: ToolResult | None = None,
        error: RemoteError | None = None,
        aborted: str | None = None,
        told: RemoteError | None = None,
    ) -> None:
        """Account, audit, reply: the pipeline's last steps (``Calls._relay``'s).
        Once: a call whose client left while its server asked first (``_rounds``)
        ends then, and its task's own end later is nothing."""
        if self.over:
            return
        self.over = True
        self.relay._deadlines.clear(self)
        self._release()
        self.client.end_call(self._key)
        upstream = self.upstream
        ok = result is not None and not result.is_error
        upstream.request_ended(self._sent, ok=ok)
        if result is not None:
            upstream.answered()
        calls = self.relay._calls
        calls.ended()
        fields: dict[str, Any] = {"risk": self.risk, "decision": "allow"}
        line: bytes | None = None
        if result is not None:
            fields["outcome"] = "tool_error" if result.is_error else "ok"
            fields["result_bytes"] = len(result.raw)
            shown = self.shown
            line = result_line(
                self.request_id,
                result.raw if shown is None else shown(result.raw),
            )
        elif error is not None:
            fields["outcome"] = outcome_for(error.reason)
            fields["reason"] = error.reason
            wire = (
                error.to_wire() if self.error_shown is None else self.error_shown(error)
            )
            line = error_line(self.request_id, wire)
        elif told is not None:  # cut off: failed, and the caller told why
            fields["outcome"], fields["reason"] = "failed", aborted
            line = error_line(self.request_id, told.to_wire())
        else:
            fields["outcome"], fields["reason"] = "client_aborted", aborted
        calls.audit(
            self.session.caller,
            "tools/call",
            self.started,
            upstream.name,
            self.tool,
            self.read,
            settles=self.intent,
            **fields,
        )
        self.session.finish(self.request_id, line)
