"""A 2026-07-28 face client asked the way of its era (SEP-2322).

That era has no requests from server to client: a server that needs input
answers the request with an input-required result (``resultType``
``input_required``, the requests in ``inputRequests``, an opaque
``requestState``), and the client retries the request with its answers
(``inputResponses``, keyed alike) and the state echoed. The face's client
declares per request what it can answer (``params._meta``, the
``io.modelcontextprotocol/clientCapabilities`` member).

When an upstream (of any era) asks such a client's call something, the call
is *held*: the client's ``tools/call`` is answered at once with an
input-required result carrying the request(s) and a ``requestState`` of ours
(random, one per round, good only on the face session it was given to),
while the call goes on in that first request's task, its requests waiting.
The retry's answers go to them; the retry gets the call's result, or the
next round. A retry whose state names nothing held for its session (unknown,
another session's, already used, or given up) gets an error
(``input_state_unknown``). Each request waits at most
``upstream_request_wait_s`` for its answer, within the call's deadline
(``upstream/asks.py``), and a finished call's result waits as long for its
retry.
"""

from __future__ import annotations

import itertools
import secrets
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

import anyio
import msgspec

from memorizz.api.errors import InvalidParamsError
from memorizzd.calllife import (
    ASKED,
    INTERNAL_ERROR,
    METHOD_NOT_FOUND,
    Asker,
    AskRefused,
    CallLife,
    current,
)

ANSWERED: Final = object()
"""What the first request's handler returns once its reply went out (the
input-required result): nothing more to send."""
STATE_BYTES: Final = 24
_encode: Final = msgspec.json.encode


class _Ask:
    __slots__ = ("done", "error", "method", "params", "result")

    def __init__(self, method: str, params: bytes) -> None:
        self.method = method
        self.params = params
        self.done = anyio.Event()
        self.result: bytes | None = None
        self.error: str | None = None


class Held:
    """One call of a 2026-07-28 face client, held between its rounds."""

    def __init__(
        self, session: object, life: CallLife, name: str, wait_s: float
    ) -> None:
        self.session = session
        self.life = life
        """The first request's life: the call runs in its task."""
        self.name = name
        self.wait_s = wait_s
        self.queued: dict[str, _Ask] = {}
        """Asked by the upstream, not yet shown to the client."""
        self.shown: dict[str, _Ask] = {}
        """In the client's last input-required result, waiting for its retry."""
        self.changed = anyio.Event()
        self.done = False
        self.gave_up = False
        self.result: Any = None
        self.completed = False
        """The call returned ``result`` (not so when it was cancelled: the
        first request cancelled, or the daemon stopping)."""
        self.error: Exception | None = None
        self.collected = anyio.Event()
        self.ended = anyio.Event()
        """Set when the first request lets it go (taken, or given up)."""
        self.state: str | None = None
        self._keys = itertools.count(1)

    async def ask(self, method: str, params: bytes) -> bytes:
        """An upstream's request: shown in the next input-required result,
        answered by the retry after it."""
        if self.gave_up:
            raise AskRefused(INTERNAL_ERROR, "the caller's client has gone away")
        key = f"mz-{next(self._keys)}"
        ask = self.queued[key] = _Ask(method, params)
        self.changed.set()
        try:
            await ask.done.wait()
        finally:
            self.queued.pop(key, None)
            self.shown.pop(key, None)
        if ask.result is not None:
            return ask.result
        raise AskRefused(
            INTERNAL_ERROR, ask.error or "the caller's client has gone away"
        )

    def give_up(self) -> None:
        """The client went away: what the call asks fails now."""
        self.gave_up = True
        for ask in [*self.queued.values(), *self.shown.values()]:
            ask.done.set()
        self.changed.set()

    async def next_round(self) -> Any:
        """Wait until the call is over (None) or asks something: the
        input-required result to answer the client with."""
        while not self.done and not self.queued:
            self.changed = anyio.Event()
            await self.changed.wait()
        if self.done:
            return None
        requests = {
            key: b'{"method":' + _encode(ask.method) + b',"params":' + ask.params + b"}"
            for key, ask in self.queued.items()
        }
        self.shown.update(self.queued)
        self.queued.clear()
        self.state = secrets.token_urlsafe(STATE_BYTES)
        _held[self.state] = self
        return msgspec.Raw(
            b'{"resultType":"input_required","inputRequests":{'
            + b",".join(_encode(k) + b":" + v for k, v in requests.items())
            + b'},"requestState":'
            + _encode(self.state)
            + b"}"
        )

    def answer(self, responses: Mapping[str, msgspec.Raw]) -> None:
        """The retry's answers to the requests shown last."""
        for key, ask in list(self.shown.items()):
            found = responses.get(key)
            if found is None:
                ask.error = f"the client's retry did not answer {key!r}"
            else:
                ask.result = bytes(found)
            ask.done.set()
        self.shown.clear()

    def forget(self) -> None:
        if self.state is not None:
            _held.pop(self.state, None)
            self.state = None


_held: dict[str, Held] = {}
"""Calls held for a retry, by the ``requestState`` of their last round."""


class RoundAsker(Asker):
    """The ``Asker`` of a 2026-07-28 client's call: what the upstream asks
    waits for the client's retry (``Held``)."""

    __slots__ = ("held",)

    def __init__(
        self, life: CallLife, capabilities: Mapping[str, Any], wait_s: float, held: Held
    ) -> None:
        super().__init__(life, capabilities, wait_s)
        self.held = held

    async def ask(self, method: str, params: bytes) -> bytes:
        why = self.refusal(method, params)
        if why is not None:
            raise AskRefused(METHOD_NOT_FOUND, why)
        return await self.held.ask(method, params)

    def gone(self) -> None:
        self.held.give_up()


def hold(
    session: object, name: str, capabilities: Mapping[str, Any], wait_s: float
) -> Held | None:
    """The running ``tools/call`` of a 2026-07-28 client that can answer
    (``capabilities``: what its request declared) is asked in rounds; None
    when it can answer nothing."""
    life = current.get()
    if life is None or life.send is None:
        return None
    if not any(isinstance(capabilities.get(c), dict) for c in ASKED.values()):
        return None
    held = Held(session, life, name, wait_s)
    life.asker = RoundAsker(life, capabilities, wait_s, held)
    return held


async def first(
    held: Held,
    work: Callable[[], Awaitable[Any]],
    reply: Callable[[Any], Awaitable[None]],
) -> Any:
    """Run the call (``work``): its result, if it asked nothing; else the
    input-required result goes out at once (``reply``), the call goes on
    here, and its result waits (``wait_s``) for the retry that takes it
    (``retried``): then ``ANSWERED``."""

    async def run() -> None:
        try:
            held.result = await work()
            held.completed = True
        except Exception as exc:  # noqa: BLE001 (the retry raises it, as the face would)
            held.error = exc
        finally:
            held.done = True
            held.changed.set()

    replied = False
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            found = await held.next_round()
            if found is not None:
                await reply(found)
                replied = True
        if not replied:
            if held.error is not None:
                raise held.error
            return held.result
        with anyio.move_on_after(held.wait_s):
            await held.collected.wait()
        return ANSWERED
    finally:
        held.forget()
        held.ended.set()


async def retried(
    session: object, name: str, state: str, responses: Mapping[str, msgspec.Raw]
) -> Any:
    """A retry: its answers to the call its state names, then the call's
    result or its next round."""
    held = _held.get(state)
    if held is None or held.session is not session or held.name != name:
        raise _unknown_state()
    held.forget()
    held.answer(responses)
    try:
        found = await held.next_round()
    except BaseException:
        held.life.cancel()  # the retry was cancelled: so is the call
        raise
    if found is not None:
        return found
    held.collected.set()
    if held.error is not None:
        raise held.error
    if not held.completed:  # cancelled meanwhile: it has no result to give
        raise _unknown_state()
    return held.result


def _unknown_state() -> InvalidParamsError:
    return InvalidParamsError(
        "requestState names no call held for this session: unknown, already "
        "answered, another session's, or given up (each round's state is "
        "good once, on its own session); call the tool again",
        reason="input_state_unknown",
    )
