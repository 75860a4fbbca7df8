"""A scrape that fails, or a connection that does something unforeseen, is
that connection's trouble only: the metrics server answers 500 (or closes)
and goes on serving, and nothing reaches the daemon's task group.

A component test: the real ``MetricsServer`` on a Unix listener of its own,
its state (``refresh``, as the daemon's reads the store) failing as a broken
state database would. Before, any exception in a connection's task (a
refresh's ``StoreError``, an unbound name after a silent client's head
timeout) ended the server's task group, and with it the daemon.
"""

from __future__ import annotations

import os

import anyio
import pytest

from memorizzd.telemetry.http import MetricsServer
from memorizzd.telemetry.metrics import Snapshot
from tests.harness import scraped


def test_a_failing_scrape_is_answered_500_and_the_server_serves_on(
    base_dir: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = os.path.join(base_dir, "metrics.sock")
    failing = [True]

    async def refresh() -> None:
        if failing[0]:
            raise RuntimeError("the state database is unreadable")

    async def scenario() -> None:
        server = MetricsServer(Snapshot, "0", refresh=refresh)
        listener = await anyio.create_unix_listener(path)
        async with anyio.create_task_group() as tg:
            await tg.start(server.serve, listener)
            first = await anyio.to_thread.run_sync(scraped, path)
            assert first.startswith(b"HTTP/1.1 500 "), first
            failing[0] = False
            second = await anyio.to_thread.run_sync(scraped, path)
            assert second.startswith(b"HTTP/1.1 200 OK"), second
            tg.cancel_scope.cancel()

    anyio.run(scenario)
    assert "could not answer a scrape" in caplog.text
    assert "the state database is unreadable" in caplog.text
