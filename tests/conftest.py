from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.harness import (
    DaemonHarness,
    daemon_config,
    rmtree,
    short_tempdir,
    stdio_spec,
)


@pytest.fixture
def base_dir() -> Iterator[str]:
    path = short_tempdir()
    yield path
    rmtree(path)


@pytest.fixture
def daemon(base_dir: str) -> Iterator[DaemonHarness]:
    """An in-process daemon with no servers."""
    with DaemonHarness.running(daemon_config(base_dir)) as harness:
        yield harness


@pytest.fixture
def stdio_daemon(base_dir: str) -> Iterator[DaemonHarness]:
    """An in-process daemon with one warm stdio test server named ``t``."""
    with DaemonHarness.running(
        daemon_config(base_dir, servers=[stdio_spec("t")])
    ) as harness:
        harness.wait_ready("t")
        yield harness
