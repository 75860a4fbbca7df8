"""The component tests' fixtures: one set of components per module."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.component.wiring import Components, components, wired_config
from tests.harness import tempdir_fixture


@pytest.fixture(scope="module")
def anyio_backend() -> tuple[str, dict[str, Any]]:
    return ("asyncio", {"use_uvloop": True})


base = tempdir_fixture()


@pytest.fixture(scope="module")
async def c(base: str) -> AsyncIterator[Components]:
    """One set of components for the module (the server's start is the cost);
    each test uses tools and tags of its own."""
    async with components(wired_config(base)) as wired:
        yield wired
