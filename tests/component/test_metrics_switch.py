"""``[metrics] enabled = false`` counts nothing: the call pipeline has no meter.

The broker, the pool and the auditor built in-process (as in
test_broker_pool_approvals.py); the counter is the process-wide one the
exposition reads (``telemetry.metrics.CALLS``)."""

from __future__ import annotations

import os
from typing import Any

import pytest

from memorizzd.config import Metrics
from memorizzd.telemetry.metrics import CALLS
from tests.component.wiring import OPERATOR, components
from tests.harness import daemon_config, rmtree, short_tempdir, stdio_spec

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, Any]]:
    return ("asyncio", {"use_uvloop": True})


def _counted() -> int:
    return sum(count.value for count in CALLS.calls.values())


@pytest.mark.parametrize("enabled", [True, False])
async def test_calls_are_counted_only_when_metrics_are_enabled(enabled: bool) -> None:
    base = short_tempdir()
    try:
        config = daemon_config(
            base,
            servers=[
                stdio_spec("t", env={"CALL_LOG": os.path.join(base, "calls.log")})
            ],
            metrics=Metrics(enabled=enabled),
        )
        async with components(config) as c:
            before = _counted()
            params = {"server": "t", "name": "echo", "arguments": {"text": "x"}}
            await c.call("tools/call", OPERATOR, params)
            assert _counted() - before == (1 if enabled else 0)
    finally:
        rmtree(base)
