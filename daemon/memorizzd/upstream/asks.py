"""An upstream session's requests of a caller: elicitation and sampling.

While it serves a call, an MCP server may ask the client for something
(``elicitation/create``, ``sampling/createMessage``). The daemon's upstream
sessions are shared by every caller of a server, so such a request is routed
to a caller only when it can be tied to one call unambiguously:

(a) it names the call: its ``params._meta.progressToken`` is the token the
    daemon gave that call (``mz-N``, stdio calls that asked for progress), or
(b) exactly one call is in flight on the session.

Otherwise, or when that call's client did not declare the capability the
request needs, the server gets an MCP error at once. Nothing is ever routed
to another caller. Each session keeps its calls in flight in an ``InFlight``
(a replica is a session of its own: with replicas, fewer calls share one).
"""

from __future__ import annotations

import itertools
import logging
from typing import Any, Final

import anyio
import msgspec

from memorizzd.calllife import (
    INTERNAL_ERROR,
    METHOD_NOT_FOUND,
    Asker,
    AskRefused,
    current,
)

log = logging.getLogger("memorizzd.upstream.asks")


class _Meta(msgspec.Struct, rename="camel"):
    progress_token: int | str | None = None


class _Named(msgspec.Struct):
    meta: _Meta | None = msgspec.field(default=None, name="_meta")


_decode_named: Final = msgspec.json.Decoder(_Named).decode


class Call:
    """One call in flight: its caller's ``Asker`` (None: its client answers
    nothing), and what it waits for from that client."""

    __slots__ = ("asker", "log_level", "scopes", "token")

    def __init__(self, asker: Asker | None, log_level: str | None = None) -> None:
        self.asker = asker
        self.log_level = log_level
        """The caller hears the server's log messages from this level on: a
        2026-07-28 server is asked for them (``calllife.want_logs``)."""
        self.token: str | None = None
        self.scopes: set[anyio.CancelScope] = set()


class InFlight:
    """A session's calls in flight, for routing the server's requests."""

    def __init__(self, server: str) -> None:
        self._server = server
        self._calls: dict[int, Call] = {}
        self._keys = itertools.count()

    def enter(self) -> tuple[int, Call]:
        """A call begins (in its caller's task: its ``Asker`` and log level
        are read here)."""
        key = next(self._keys)
        life = current.get()
        call = self._calls[key] = (
            Call(None) if life is None else Call(life.asker, life.log_level)
        )
        return key, call

    def leave(self, key: int) -> None:
        """The call is over: whatever it still asks its client is given up."""
        call = self._calls.pop(key, None)
        if call is not None:
            for scope in call.scopes:
                scope.cancel()

    def _tied(self, token: int | str | None) -> Call:
        if token is not None:
            for call in self._calls.values():
                if call.token is not None and call.token == token:
                    return call
        if len(self._calls) != 1:
            raise AskRefused(
                INTERNAL_ERROR,
                f"no caller can answer: {len(self._calls)} calls in flight on "
                "memorizzd's shared session, and the request names none of them",
            )
        return next(iter(self._calls.values()))

    async def answer(self, method: str, params: bytes) -> bytes:
        """The caller's answer to the server's request: the result's JSON, or
        ``AskRefused`` (the error the server gets)."""
        try:
            named = _decode_named(params).meta
        except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
            named = None
        call = self._tied(None if named is None else named.progress_token)
        try:
            return await ask_caller(call, method, params)
        except _Late:
            if call not in self._calls.values():
                raise AskRefused(
                    INTERNAL_ERROR, "the call ended before its caller answered"
                ) from None
            raise


class _Late(AskRefused):
    """The caller did not answer in time (or its call ended first)."""


async def ask_caller(call: Call, method: str, params: bytes) -> bytes:
    """Ask ``call``'s caller (its ``Asker``), within the asker's wait: the
    result's JSON, or ``AskRefused`` (the error the server gets)."""
    asker = call.asker
    if asker is None:
        raise AskRefused(
            METHOD_NOT_FOUND,
            f"the caller's client does not support {method.split('/')[0]}",
        )
    with anyio.CancelScope(deadline=asker.when()) as scope:
        call.scopes.add(scope)
        try:
            return await asker.ask(method, params)
        finally:
            call.scopes.discard(scope)
    raise _Late(
        INTERNAL_ERROR,
        f"the caller did not answer in time (at most {asker.wait_s:g} s, "
        "within the call's deadline)",
    )


# --- the 2026-07-28 way: an input-required result, a retry with the answers ---

INPUT_ROUNDS_MAX: Final = 8
"""How many input-required results one call may answer before it gives up."""


class InputRequest(msgspec.Struct):
    """One of an input-required result's requests: a request as the server
    would have sent it (``elicitation/create``, ``sampling/createMessage``)."""

    method: str
    params: msgspec.Raw = msgspec.field(default_factory=lambda: msgspec.Raw(b"{}"))


class InputRequired(msgspec.Struct, rename="camel"):
    """A result that asks for input (SEP-2322), or not (``result_type``)."""

    result_type: str | None = None
    input_requests: dict[str, InputRequest] | None = None
    request_state: str | None = None


_decode_input_required: Final = msgspec.json.Decoder(InputRequired).decode


def input_required(raw: bytes) -> InputRequired | None:
    """``raw`` as an input-required result, if it is one (None: it is not)."""
    try:
        found = _decode_input_required(raw)
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
        return None
    return found if found.result_type == "input_required" else None


async def fulfil(call: Call, asked: InputRequired) -> dict[str, msgspec.Raw]:
    """The caller's answers to an input-required result's requests (asked
    at once, each as ``ask_caller`` asks), by the server's keys; the first
    ``AskRefused`` stops the rest and is raised."""
    answers: dict[str, msgspec.Raw] = {}
    refused: list[AskRefused] = []

    async def one(scope: anyio.CancelScope, key: str, request: InputRequest) -> None:
        try:
            result = await ask_caller(call, request.method, bytes(request.params))
        except AskRefused as exc:
            refused.append(exc)
            scope.cancel()
            return
        answers[key] = msgspec.Raw(result)

    async with anyio.create_task_group() as tg:
        for key, request in (asked.input_requests or {}).items():
            tg.start_soon(one, tg.cancel_scope, key, request)
    if refused:
        raise refused[0]
    return answers


DAEMONS_ERROR: Final = "memorizz/error"
"""The ``_meta`` key of an ``isError`` result the daemon made (not the
server): its facts, as in ``structuredContent``, which the MCP face leaves out
for a tool that declares an ``outputSchema`` (face.py ``_fitted``)."""


def daemons_error(text: str, facts: dict[str, Any]) -> dict[str, Any]:
    """An ``isError`` tool result the daemon makes: ``text`` for the model,
    ``facts`` (``reason`` and the rest) in ``structuredContent`` and under
    ``DAEMONS_ERROR`` in ``_meta``."""
    return {
        "content": [{"type": "text", "text": text}],
        "structuredContent": facts,
        "isError": True,
        "_meta": {DAEMONS_ERROR: facts},
    }


def unanswered(server: str, why: str) -> bytes:
    """The tool result of a call whose server asked for input that its caller
    did not give (an ``isError`` result, with the reason)."""
    text = f"{server} asked for input that the caller did not give: {why}"
    facts = {"reason": "input_unanswered", "server": server, "message": why}
    return msgspec.json.encode(daemons_error(text, facts))
