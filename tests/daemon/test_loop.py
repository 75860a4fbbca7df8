"""The hot path's primitives of ``memorizzd.loop`` that are ours, not the
loop's: ``Deadlines`` (many deadlines, one loop timer). On a real uvloop
event loop, as the daemon runs."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import anyio
import pytest

from memorizzd.loop import Deadlines, now

SLACK = 0.02
WAIT_S = 10  # a guard against a hang, never a measurement


def _run(main: Callable[[], Awaitable[None]]) -> None:
    anyio.run(main, backend="asyncio", backend_options={"use_uvloop": True})


class _Fired:
    """What fired (label, seconds after ``start``), awaitable by count."""

    def __init__(self) -> None:
        self.start = now()
        self.seen: list[tuple[str, float]] = []
        self._more = anyio.Event()

    def __call__(self, label: str) -> Callable[[], None]:
        def fire() -> None:
            self.seen.append((label, now() - self.start))
            self._more.set()

        return fire

    async def count(self, n: int) -> None:
        with anyio.fail_after(WAIT_S):
            while len(self.seen) < n:
                self._more = anyio.Event()
                await self._more.wait()

    @property
    def labels(self) -> list[str]:
        return [label for label, _ in self.seen]


def test_a_deadline_runs_its_callback_once_when_due_and_not_before() -> None:
    async def main() -> None:
        fired = _Fired()
        Deadlines(slack=SLACK).set("call", 0.1, fired("call"))
        await fired.count(1)
        # due, to the clock's rounding; at most the slack late (and the loop's lag)
        assert 0.1 - 1e-6 <= fired.seen[0][1] < 0.1 + SLACK + 0.15

    _run(main)


def test_a_cleared_deadline_never_runs_and_the_others_do() -> None:
    async def main() -> None:
        deadlines = Deadlines(slack=SLACK)
        fired = _Fired()
        for key in ("a", "b", "c"):
            deadlines.set(key, 0.05, fired(key))
        deadlines.clear("b")
        deadlines.clear("nothing")  # clearing what is not set is no error
        await fired.count(2)  # "b" was due with them: the same firing
        await anyio.sleep(SLACK * 2)  # and more, for a late "b"
        assert sorted(fired.labels) == ["a", "c"]

    _run(main)


def test_a_later_deadline_runs_after_the_earlier_one_it_followed_was_cleared() -> None:
    """The timer stays armed for the first; firing with nothing due, it is
    armed again for the one left."""

    async def main() -> None:
        deadlines = Deadlines(slack=SLACK)
        fired = _Fired()
        deadlines.set("first", 0.1, fired("first"))
        await anyio.sleep(0.05)
        deadlines.set("second", 0.1, fired("second"))  # due at 0.15
        deadlines.clear("first")
        await fired.count(1)
        assert fired.labels == ["second"]
        assert 0.15 - 1e-6 <= fired.seen[0][1] < 0.15 + SLACK + 0.15

    _run(main)


def test_an_earlier_deadline_moves_the_timer() -> None:
    async def main() -> None:
        deadlines = Deadlines(slack=SLACK)
        fired = _Fired()
        deadlines.set("late", WAIT_S * 2, fired("late"))
        deadlines.set("soon", 0.05, fired("soon"))
        await fired.count(1)  # not WAIT_S * 2 later: fail_after(WAIT_S) says so
        assert fired.labels == ["soon"]
        deadlines.clear("late")

    _run(main)


def test_setting_a_key_again_moves_its_deadline() -> None:
    async def main() -> None:
        deadlines = Deadlines(slack=SLACK)
        fired = _Fired()
        deadlines.set("k", 0.05, fired("first"))
        deadlines.set("k", 0.3, fired("second"))
        await fired.count(1)
        assert fired.labels == ["second"]
        assert fired.seen[0][1] >= 0.3 - 1e-6

    _run(main)


def test_a_callback_that_raises_is_logged_and_the_rest_still_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def boom() -> None:
        raise RuntimeError("a bug")

    async def main() -> None:
        deadlines = Deadlines(slack=SLACK)
        fired = _Fired()
        deadlines.set("bad", 0.01, boom)
        deadlines.set("good", 0.01, fired("good"))
        await fired.count(1)
        # set again after they all ran: the timer starts again
        deadlines.set("later", 0.01, fired("later"))
        await fired.count(2)
        assert fired.labels == ["good", "later"]

    with caplog.at_level(logging.ERROR, logger="memorizzd.loop"):
        _run(main)
    assert "a deadline's callback failed" in caplog.text
