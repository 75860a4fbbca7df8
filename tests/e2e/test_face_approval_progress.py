"""A face call held for the operator tells its client so (issue 11, item 5):
when the client gave a progress token, ``notifications/progress`` come while
the call waits (at once, then every few seconds), naming the proposal and the
time left, until the operator decides. The official Python SDK client through
``memorizzctl mcp serve``; the operator approves through the real socket once
the client has heard that its call waits."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

from tests.harness import (
    DaemonHarness,
    daemon_config,
    rmtree,
    short_tempdir,
    stdio_spec,
)
from tests.process import MEMORIZZCTL, wait_until


@pytest.fixture(scope="module")
def harness() -> Iterator[DaemonHarness]:
    base = short_tempdir()
    try:
        spec = stdio_spec("alpha", env={"CALL_LOG": os.path.join(base, "calls.log")})
        config = daemon_config(base, servers=[spec], face_approval_wait_s=20.0)
        with DaemonHarness.running(config) as running:
            running.wait_ready("alpha")
            yield running
    finally:
        rmtree(base)


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_a_held_call_tells_its_client_it_waits_for_the_operator(
    harness: DaemonHarness, mode: str
) -> None:
    heard: list[tuple[float, float | None, str | None]] = []
    told = threading.Event()

    async def progressed(
        progress: float, total: float | None, message: str | None
    ) -> None:
        heard.append((progress, total, message))
        told.set()

    def operator() -> None:
        with harness.client() as c:
            assert told.wait(20)  # the client heard it waits, then: approve
            (proposal,) = c.list_approvals(status="pending")
            c.approve(proposal.id)

    async def call() -> Any:
        params = StdioServerParameters(
            command=MEMORIZZCTL, args=["--socket", harness.socket, "mcp", "serve"]
        )
        async with Client(stdio_client(params), mode=mode) as client:
            return await client.call_tool(
                "record", {"tag": f"held-{mode}"}, progress_callback=progressed
            )

    thread = threading.Thread(target=operator)
    thread.start()
    try:
        result = anyio.run(call)
    finally:
        thread.join()
    assert (result.is_error, result.content[0].text) == (False, f"recorded held-{mode}")
    progress, total, message = heard[0]
    assert 0 <= progress < 1  # the seconds waited so far: the first report at once
    assert total == 20.0
    assert message is not None
    assert message.startswith("waiting for operator approval of proposal p_")
    assert message.endswith("(20 s left)")
    with harness.client() as c:
        wait_until(lambda: not c.list_approvals(status="pending"), what="no pending")
