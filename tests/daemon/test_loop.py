"""The hot path's primitives of ``memorizzd.loop`` that are ours, not the
loop's: ``Deadlines`` (many deadlines, one loop timer). On a real uvloop
event loop, as the daemon runs."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import anyio
import pytest

from memorizzd.loop import Deadlines, now

TICK = 0.02


def _run(main: Callable[[], Awaitable[None]]) -> None:
    anyio.run(main, backend="asyncio", backend_options={"use_uvloop": True})


def test_a_deadline_runs_its_callback_once_when_due_and_not_before() -> None:
    async def main() -> None:
        deadlines = Deadlines(tick=TICK)
        fired: list[float] = []
        start = now()
        deadlines.set("call", 0.1, lambda: fired.append(now() - start))
        await anyio.sleep(0.3)
        assert len(fired) == 1
        # due, to the clock's rounding; at most a tick late (and the loop's lag)
        assert 0.1 - 1e-6 <= fired[0] < 0.1 + TICK + 0.15

    _run(main)


def test_a_cleared_deadline_never_runs_and_the_others_do() -> None:
    async def main() -> None:
        deadlines = Deadlines(tick=TICK)
        fired: list[str] = []
        for key in ("a", "b", "c"):
            deadlines.set(key, 0.05, lambda key=key: fired.append(key))
        deadlines.clear("b")
        deadlines.clear("nothing")  # clearing what is not set is no error
        await anyio.sleep(0.2)
        assert sorted(fired) == ["a", "c"]

    _run(main)


def test_setting_a_key_again_moves_its_deadline() -> None:
    async def main() -> None:
        deadlines = Deadlines(tick=TICK)
        fired: list[tuple[str, float]] = []
        start = now()
        deadlines.set("k", 0.05, lambda: fired.append(("first", now() - start)))
        deadlines.set("k", 0.3, lambda: fired.append(("second", now() - start)))
        await anyio.sleep(0.6)
        assert [label for label, _ in fired] == ["second"]
        assert fired[0][1] >= 0.3 - 1e-6

    _run(main)


def test_a_callback_that_raises_is_logged_and_the_rest_still_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def boom() -> None:
        raise RuntimeError("a bug")

    async def main() -> None:
        deadlines = Deadlines(tick=TICK)
        fired: list[str] = []
        deadlines.set("bad", 0.01, boom)
        deadlines.set("good", 0.01, lambda: fired.append("good"))
        await anyio.sleep(0.15)
        assert fired == ["good"]
        # set again after they all ran: the timer starts again
        deadlines.set("later", 0.01, lambda: fired.append("later"))
        await anyio.sleep(0.15)
        assert fired == ["good", "later"]

    with caplog.at_level(logging.ERROR, logger="memorizzd.loop"):
        _run(main)
    assert "a deadline's callback failed" in caplog.text
