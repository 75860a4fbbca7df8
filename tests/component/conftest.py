"""The component tests' fixtures: one set of components per module."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from tests.component.wiring import Components, components, wired_config
from tests.harness import rmtree, short_tempdir


@pytest.fixture(scope="module")
def anyio_backend() -> tuple[str, dict[str, Any]]:
    return ("asyncio", {"use_uvloop": True})


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    path = short_tempdir()
    yield path
    rmtree(path)


@pytest.fixture(scope="module")
async def c(base: str) -> AsyncIterator[Components]:
    """One set of components for the module (the server's start is the cost);
    each test uses tools and tags of its own."""
    async with components(wired_config(base)) as wired:
        yield wired
