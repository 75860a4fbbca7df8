"""A listing's pages together stay within the server's ``max_result_bytes``.

Each page was capped alone, and the daemon followed up to ``list_page_limit``
of them: a server that answered every page near the cap, with a fresh cursor,
had the daemon decode a hundred times ``max_result_bytes`` (hundreds of MB)
for one listing. Now the bytes read for a listing's pages are counted as they
come, and past the cap the listing fails as a too-large result does
(``result_too_large``, the server named), while the daemon and the server's
session go on serving. Against the real daemon and the real client; the stdio
servers are tests/paging_server.py, the HTTP one the same server behind a raw
Streamable HTTP endpoint (the SDK client's path).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Awaitable, Callable, Iterator

import msgspec
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from memorizz.api.errors import TooLargeError
from memorizz.api.methods import ServerSpec
from tests.harness import (
    TESTS,
    DaemonHarness,
    daemon_config,
    http_spec,
    light_spec,
    serve_asgi,
)
from tests.paging_server import Listings

PAGING_SERVER = str(TESTS / "paging_server.py")
CAP = 100_000
"""The servers' ``max_result_bytes``."""
PAGE_BYTES = 30_000
"""A page's padding: each page fits under ``CAP`` by far."""
OVER = 8
"""Pages that together exceed ``CAP`` (about 240 kB)."""
UNDER = 3
"""Pages that together stay under it (about 90 kB)."""


def paging(name: str, *, pages: int, paged: str) -> ServerSpec:
    return ServerSpec(
        name=name,
        transport="stdio",
        command=sys.executable,
        args=[PAGING_SERVER],
        env={"PAGES": str(pages), "PAGE_BYTES": str(PAGE_BYTES), "PAGED": paged},
        max_result_bytes=CAP,
        protocol="legacy",
    )


def _over_budget(
    err: pytest.ExceptionInfo[TooLargeError], server: str, method: str
) -> None:
    """The listing's failure: as a too-large result's, naming the listing."""
    exc = err.value
    assert exc.reason == "result_too_large"
    assert exc.data == {"server": server}
    assert exc.message == (
        f"{server}: {method}: the listing's pages together exceed "
        f"max_result_bytes ({CAP})"
    )


@pytest.fixture
def harness(base_dir: str) -> Iterator[DaemonHarness]:
    servers = [
        paging("tools", pages=OVER, paged="tools"),
        paging("others", pages=OVER, paged="resources,templates,prompts"),
        paging("fits", pages=UNDER, paged="tools,resources,templates,prompts"),
        light_spec("plain"),
    ]
    with DaemonHarness.running(daemon_config(base_dir, servers=servers)) as running:
        for spec in servers:
            running.wait_ready(spec.name)
        yield running


def test_a_stdio_tools_listing_over_the_cap_fails_and_nothing_else_does(
    harness: DaemonHarness,
) -> None:
    with harness.client() as c:
        with pytest.raises(TooLargeError) as err:
            c.list_tools("tools", refresh=True)
        _over_budget(err, "tools", "tools/list")
        # No listing, so no verdict: a call fails the same way, at once.
        with pytest.raises(TooLargeError) as err:
            c.call_tool("tools", "hello")
        _over_budget(err, "tools", "tools/list")
        # The session lives: what needs no tool listing is served.
        assert [p.name for p in c.list_prompts("tools")] == ["p1"]
        read = c.read_resource("tools", "mem://r1")
        assert read.contents[0]["text"] == "contents of mem://r1"
        (status,) = c.server_status("tools")
        assert (status.state, status.restarts) == ("ready", 0)
        # A listing of several pages under the cap together is whole.
        names = [t.name for t in c.list_tools("fits", refresh=True)]
        assert names == ["hello", "t2", "t3"]
        # The daemon serves the others.
        assert c.call_tool("plain", "hello").content[0]["text"] == "hello from legacy"
        assert c.call_tool("fits", "t3").content[0]["text"] == "hello from t3"
        assert c.daemon_status() is not None


def test_stdio_resource_and_prompt_listings_over_the_cap_fail_and_calls_go_on(
    harness: DaemonHarness,
) -> None:
    with harness.client() as c:
        with pytest.raises(TooLargeError) as err:
            c.list_resources("others")
        _over_budget(err, "others", "resources/list")
        with pytest.raises(TooLargeError) as err:
            c.list_resource_templates("others")
        _over_budget(err, "others", "resources/templates/list")
        with pytest.raises(TooLargeError) as err:
            c.list_prompts("others")
        _over_budget(err, "others", "prompts/list")
        # The warm session still serves its calls (its tool listing is small).
        assert c.call_tool("others", "hello").content[0]["text"] == "hello from hello"
        assert [r.name for r in c.list_resources("fits")] == ["r1", "r2", "r3"]
        assert [p.name for p in c.list_prompts("fits")] == ["p1", "p2", "p3"]
        templates = c.list_resource_templates("fits")
        assert [t.name for t in templates] == ["rt1", "rt2", "rt3"]


# --- HTTP: the SDK's client ------------------------------------------------------


def _endpoint(
    listings: Listings, *, events: bool
) -> Callable[[Request], Awaitable[Response]]:
    """A raw Streamable HTTP endpoint (no session id, so no GET stream) that
    answers as ``listings`` does: in JSON bodies, or each answer as one
    server-sent event (``events``)."""

    async def mcp(request: Request) -> Response:
        body = msgspec.json.decode(await request.body())
        if "id" not in body or "method" not in body:
            return Response(status_code=202)
        answer = msgspec.json.encode(
            listings.answer(body["id"], body["method"], body.get("params"))
        )
        if events:
            stream = b"event: message\ndata: " + answer + b"\n\n"
            return Response(stream, media_type="text/event-stream")
        return Response(answer, media_type="application/json")

    return mcp


def _app(events: bool) -> Callable[[str], Starlette]:
    def make(base: str) -> Starlette:
        over = Listings(pages=OVER, page_bytes=PAGE_BYTES, paged=frozenset({"tools"}))
        under = Listings(
            pages=UNDER, page_bytes=PAGE_BYTES, paged=frozenset({"tools", "prompts"})
        )
        return Starlette(
            routes=[
                Route("/over/mcp", _endpoint(over, events=events), methods=["POST"]),
                Route("/under/mcp", _endpoint(under, events=events), methods=["POST"]),
            ]
        )

    return make


@pytest.mark.parametrize("events", [False, True], ids=["json", "event-stream"])
def test_an_http_tools_listing_over_the_cap_fails_and_the_session_serves_on(
    base_dir: str, events: bool
) -> None:
    with contextlib.ExitStack() as stack:
        base = stack.enter_context(serve_asgi(_app(events)))
        servers = [
            http_spec(
                name,
                f"{base}/{name}/mcp",
                "streamable_http",
                protocol="legacy",
                max_result_bytes=CAP,
            )
            for name in ("over", "under")
        ]
        running = stack.enter_context(
            DaemonHarness.running(daemon_config(base_dir, servers=servers))
        )
        for spec in servers:
            running.wait_ready(spec.name)
        with running.client() as c:
            with pytest.raises(TooLargeError) as err:
                c.list_tools("over", refresh=True)
            _over_budget(err, "over", "tools/list")
            assert [p.name for p in c.list_prompts("over")] == ["p1"]
            read = c.read_resource("over", "mem://r1")
            assert read.contents[0]["text"] == "contents of mem://r1"
            assert [t.name for t in c.list_tools("under", refresh=True)] == [
                "hello",
                "t2",
                "t3",
            ]
            assert [p.name for p in c.list_prompts("under")] == ["p1", "p2", "p3"]
            assert c.call_tool("under", "t2").content[0]["text"] == "hello from t2"
