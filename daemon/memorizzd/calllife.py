"""How long a request lives when its client goes away.

A client that closes its connection (not one that only half-closes: it still
reads its replies) will never read the answer. A request without effects is
then cancelled at once, which also cancels its upstream request
(``notifications/cancelled``) and frees its task. A request with effects runs
to the end and is audited, since cutting it off would leave its outcome
unknown. The connection opens one :class:`CallLife` per request; the request's
handler says whether it may be abandoned (the broker knows a tool's risk only
once the policy has decided), and may ask whether it was. It lives at the
bottom of the daemon, beside ``memorizzd.caller``, so that the broker can ask
without importing ``rpc``.

A request's life also holds its way back to its client (``Asker``): a front
that knows what its client declared offers it (``offer_asks``), and an
upstream's elicitation or sampling request of that call is sent to the client
on the call's connection, its response line handed back (``answered``).
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Final
from weakref import WeakKeyDictionary

import anyio
import msgspec

ABORTABLE_METHODS: Final = frozenset(
    {
        "daemon/hello",
        "daemon/status",
        "ping",
        "servers/list",
        "servers/status",
        "servers/test",
        "tools/list",
        "resources/list",
        "resources/templates/list",
        "resources/read",
        "prompts/list",
        "prompts/get",
        "completion/complete",
        "audit/list",
        "approvals/list",
        "approvals/wait",
        "subscriptions/listen",
        "tasks/get",
        "tasks/result",
        "tasks/list",
    }
)
"""Methods without effects: abandoned when their client goes away.
``tools/call`` is decided per call (see ``mark_abortable``)."""
UNCANCELLABLE_METHODS: Final = frozenset({"initialize"})
"""Requests a ``notifications/cancelled`` does not stop: MCP's cancellation
utility says "The ``initialize`` request MUST NOT be cancelled by clients",
and a receiver MAY ignore a cancellation of a request that cannot be
cancelled. It is answered, as the Python SDK's servers answer it: a client
that waits for its answer is not left waiting."""


class CallLife:
    """One request's scope: cancelled if its client leaves while it may be."""

    __slots__ = (
        "abortable",
        "aborted",
        "asker",
        "cancellable",
        "gone",
        "log_level",
        "reason",
        "scope",
        "send",
        "session",
    )

    def __init__(
        self,
        method: str,
        send: Callable[[bytes], Awaitable[None]] | None = None,
        session: object | None = None,
    ) -> None:
        self.session = session
        """The connection the request came on (a key for per-session state,
        e.g. the MCP face's log level); None outside a socket."""
        self.send = send
        """Sends a line to the request's client, unasked (the MCP face's
        progress notifications); None where the protocol sends nothing."""
        self.abortable = method in ABORTABLE_METHODS
        self.cancellable = method not in UNCANCELLABLE_METHODS
        self.gone = False
        self.aborted = False
        self.reason = "client_gone"
        """Why it was aborted: ``client_gone`` or ``cancelled`` (asked to stop)."""
        self.scope = anyio.CancelScope()
        self.asker: Asker | None = None
        """How an upstream's request reaches this request's client, when its
        front offers it (``offer_asks``)."""
        self.log_level: str | None = None
        """The lowest level of the server's log messages this request's client
        hears (``want_logs``); a 2026-07-28 upstream is asked for them."""

    def cancel(self) -> None:
        """The client asked to stop (MCP's ``notifications/cancelled``): the
        request is cancelled whatever its effects (its upstream request is
        cancelled too, and decides what that means), and no reply is sent;
        one of ``UNCANCELLABLE_METHODS`` goes on, and is answered."""
        if not self.cancellable:
            return
        self.aborted = True
        self.reason = "cancelled"
        self.scope.cancel()

    def client_gone(self) -> None:
        """The client went away: cancel the request if nothing is lost by it."""
        self.gone = True
        if self.asker is not None:
            self.asker.gone()
        if self.abortable:
            self.aborted = True
            self.scope.cancel()

    def set_abortable(self, abortable: bool) -> None:
        self.abortable = abortable
        if abortable and self.gone:
            self.client_gone()


current: ContextVar[CallLife | None] = ContextVar("memorizz_call_life", default=None)


def mark_abortable(abortable: bool) -> None:
    """Say whether the running request may be abandoned with its client."""
    life = current.get()
    if life is not None:
        life.set_abortable(abortable)


@contextmanager
def abandonable() -> Iterator[None]:
    """Within it, the running request may be abandoned with its client: it
    waits and has done nothing a client's departure would cut short (a call
    held for the operator's approval, an ``approvals/wait``). A client gone
    already ends it at once. On the way out the request is as it was."""
    life = current.get()
    if life is None:
        yield
        return
    before = life.abortable
    life.set_abortable(True)
    try:
        yield
    finally:
        life.abortable = before  # restoring never cancels


def client_aborted() -> bool:
    """Whether the running request is being cancelled because its client left
    or asked to stop (``aborted_reason`` says which)."""
    life = current.get()
    return life is not None and life.aborted


def client_send() -> Callable[[bytes], Awaitable[None]] | None:
    """How to send the running request's client a line unasked, if its protocol can."""
    life = current.get()
    return None if life is None else life.send


def client_session() -> object | None:
    """The running request's connection (see ``CallLife.session``)."""
    life = current.get()
    return None if life is None else life.session


def aborted_reason() -> str:
    """``client_gone`` or ``cancelled`` (for the audit record of an aborted call)."""
    life = current.get()
    return "client_gone" if life is None else life.reason


def want_logs(level: str) -> None:
    """The running request's client hears its server's log messages from
    ``level`` on (MCP's levels): a 2026-07-28 upstream, which logs only to
    requests that opt in, is asked for them (``_meta`` log level)."""
    life = current.get()
    if life is not None:
        life.log_level = level


def client_log_level() -> str | None:
    """The running request's log level (``want_logs``), if its client asked."""
    life = current.get()
    return None if life is None else life.log_level


# --- requests back to the client ----------------------------------------------

ELICIT: Final = "elicitation/create"
SAMPLE: Final = "sampling/createMessage"
ASKED: Final = {ELICIT: "elicitation", SAMPLE: "sampling"}
"""The requests an upstream may make of a call's caller, and the client
capability each needs (MCP's ``ClientCapabilities`` member)."""
METHOD_NOT_FOUND: Final = -32601
INTERNAL_ERROR: Final = -32603


class AskRefused(Exception):
    """A request for the caller's client that it did not answer with a result:
    the JSON-RPC error the upstream gets for it (never a secret: the message
    says why in the daemon's words, or is the client's own)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class _AskShape(msgspec.Struct, rename="camel"):
    """What decides which capability a request needs: URL elicitation,
    sampling with tools."""

    mode: str | None = None
    tools: Any = None
    tool_choice: Any = None


class _AnswerError(msgspec.Struct):
    code: int = INTERNAL_ERROR
    message: str = ""


class _Response(msgspec.Struct):
    id: int | str | None = None
    result: msgspec.Raw = msgspec.Raw(b"")
    error: msgspec.Raw = msgspec.Raw(b"")


_decode_shape: Final = msgspec.json.Decoder(_AskShape).decode
_decode_response: Final = msgspec.json.Decoder(_Response).decode
_decode_error: Final = msgspec.json.Decoder(_AnswerError).decode
_encode: Final = msgspec.json.encode
ANSWER_WAIT_CANCEL_S: Final = 1.0
_SAID: Final = {
    "elicitation.form": "elicitation (form mode)",
    "elicitation.url": "elicitation (URL mode)",
    "sampling.tools": "sampling with tools",
}


class _Answer:
    __slots__ = ("done", "error", "result")

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.result: bytes | None = None
        self.error: _AnswerError | None = None


_asked: dict[tuple[object, int | str], _Answer] = {}
"""Requests sent to clients and not yet answered, by (connection, our id)."""
_ask_ids = itertools.count(1)
_declared: WeakKeyDictionary[object, Mapping[str, Any]] = WeakKeyDictionary()
"""What each socket API connection said its client answers (``daemon/hello``)."""


def needed(method: str, params: bytes) -> str | None:
    """The client capability ``method`` with ``params`` needs, spelt as the
    MCP member path (``elicitation.url``, ``sampling.tools``); None for a
    method that is not ours to relay."""
    base = ASKED.get(method)
    if base is None:
        return None
    try:
        shape = _decode_shape(params)
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
        return base
    if base == "elicitation":
        return "elicitation.url" if shape.mode == "url" else "elicitation.form"
    if shape.tools is not None or shape.tool_choice is not None:
        return "sampling.tools"
    return base


def declares(capabilities: Mapping[str, Any], need: str) -> bool:
    """Whether MCP client ``capabilities`` cover ``need`` (``needed``): an
    empty ``elicitation`` object means form mode (2025-06-18)."""
    base, _, sub = need.partition(".")
    declared = capabilities.get(base)
    if not isinstance(declared, dict):
        return False
    if not sub:
        return True
    if base == "elicitation" and sub == "form" and not declared:
        return True
    return isinstance(declared.get(sub), dict)


class Asker:
    """A running call's way to send its client a request (an upstream's
    ``elicitation/create`` or ``sampling/createMessage``) and get the answer,
    made by the front that knows what the client declared (``offer_asks``).
    The line goes out on the call's own connection, with an id of ours; the
    client's response line comes back through ``answered``."""

    __slots__ = ("_life", "_pending", "capabilities", "deadline", "wait_s")

    def __init__(
        self, life: CallLife, capabilities: Mapping[str, Any], wait_s: float
    ) -> None:
        self._life = life
        self.capabilities = capabilities
        self.wait_s = wait_s
        """How long one request waits for the client's answer."""
        self.deadline = float("inf")
        """The call's deadline (``anyio.current_time()``; the pipeline sets it)."""
        self._pending: set[_Answer] = set()

    def refusal(self, method: str, params: bytes) -> str | None:
        """Why this client cannot be asked this (None: it can)."""
        need = needed(method, params)
        if need is None:
            return f"{method!r} is not relayed to callers"
        if not declares(self.capabilities, need):
            return f"the caller's client does not support {_SAID.get(need, need)}"
        return None

    def when(self) -> float:
        """When a request to the client gives up: ``wait_s`` from now, never
        past the call's deadline."""
        return min(anyio.current_time() + self.wait_s, self.deadline)

    async def ask(self, method: str, params: bytes) -> bytes:
        """Send the request and wait for the client's response: its result's
        JSON; ``AskRefused`` for an error answer, a client that cannot be
        asked or went away. The caller bounds the wait (``when``); when it
        gives up, the client is told ``notifications/cancelled``."""
        why = self.refusal(method, params)
        if why is not None:
            raise AskRefused(METHOD_NOT_FOUND, why)
        life = self._life
        if life.send is None or life.gone:
            raise AskRefused(INTERNAL_ERROR, "the caller's client has gone away")
        rid = f"mz-ask-{next(_ask_ids)}"
        key = (life.session, rid)
        answer = _asked[key] = _Answer()
        self._pending.add(answer)
        answered = False
        try:
            # method before id: a socket client tells a reply by its first bytes
            await life.send(
                b'{"jsonrpc":"2.0","method":'
                + _encode(method)
                + b',"id":'
                + _encode(rid)
                + b',"params":'
                + params
                + b"}\n"
            )
            await answer.done.wait()
            answered = answer.result is not None or answer.error is not None
        finally:
            _asked.pop(key, None)
            self._pending.discard(answer)
            if not answered and not life.gone:
                await _cancel_ask(life, rid)
        if answer.error is not None:
            raise AskRefused(answer.error.code, answer.error.message[:1000])
        if answer.result is None:
            raise AskRefused(INTERNAL_ERROR, "the caller's client has gone away")
        return answer.result

    def gone(self) -> None:
        """The client left: every request to it fails now."""
        for answer in list(self._pending):
            answer.done.set()


async def _cancel_ask(life: CallLife, rid: str) -> None:
    send = life.send
    if send is None:
        return
    note = {
        "jsonrpc": "2.0",
        "method": "notifications/cancelled",
        "params": {"requestId": rid, "reason": "the server stopped waiting"},
    }
    with anyio.move_on_after(ANSWER_WAIT_CANCEL_S, shield=True):
        await send(_encode(note) + b"\n")


def answered(session: object, line: bytes) -> bool:
    """A response line from ``session``'s client: handed to the request of
    ours it answers (False: not a response, or to nothing we wait for)."""
    try:
        response = _decode_response(line)
    except (msgspec.DecodeError, RecursionError, ValueError):
        return False
    if response.id is None:
        return False
    answer = _asked.pop((session, response.id), None)
    if answer is None:
        return False
    answer.result, answer.error = _answer_of(response)
    answer.done.set()
    return True


def _answer_of(response: _Response) -> tuple[bytes | None, _AnswerError | None]:
    """The client's result, or its error: an answer that is neither (a result
    that is not an object, a malformed error) is an error of ours, since the
    upstream must get a valid response (an SDK server left with none waits
    for it until the call's deadline, every other asking call of that server
    refused meanwhile)."""
    error = bytes(response.error).strip()
    if error and error != b"null":
        try:
            return None, _decode_error(error)
        except (msgspec.DecodeError, RecursionError, ValueError):
            return None, _AnswerError(
                INTERNAL_ERROR, "the caller's client answered with a malformed error"
            )
    result = bytes(response.result).strip()
    if result.startswith(b"{"):
        return result, None
    if not result:
        return None, _AnswerError(INTERNAL_ERROR, "an answer with no result")
    return None, _AnswerError(
        INTERNAL_ERROR,
        "the caller's client answered with a result that is not an object",
    )


def offer_asks(capabilities: Mapping[str, Any], wait_s: float) -> Asker | None:
    """The running request's front offers its client's answers to upstream
    requests (``capabilities``: what the client declared, as MCP spells it);
    None where there is no request or nothing to offer."""
    life = current.get()
    if life is None or life.send is None:
        return None
    if not any(isinstance(capabilities.get(c), dict) for c in ASKED.values()):
        return None
    life.asker = Asker(life, capabilities, wait_s)
    return life.asker


def client_asker() -> Asker | None:
    """The running request's ``Asker``, if its front offered one."""
    life = current.get()
    return None if life is None else life.asker


def bound_asks(deadline: float) -> None:
    """The running call's deadline bounds what its client is asked."""
    life = current.get()
    if life is not None and life.asker is not None:
        life.asker.deadline = deadline


def declare(capabilities: Mapping[str, Any]) -> None:
    """The running request's connection's client answers these (socket API)."""
    life = current.get()
    if life is not None and life.session is not None:
        _declared[life.session] = dict(capabilities)


def declared_by(session: object) -> Mapping[str, Any]:
    """What ``session`` (a connection) declared (``declare``); {}: nothing."""
    return _declared.get(session, {})


def declared() -> Mapping[str, Any]:
    """What the running request's connection declared (``declare``)."""
    life = current.get()
    if life is None or life.session is None:
        return {}
    return _declared.get(life.session, {})
