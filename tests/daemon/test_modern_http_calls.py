"""A 2026-07-28 HTTP upstream's ``tools/call`` (issue 12, item 5): a result
without ``resultType`` is a complete one (SEP-2322: absent means
``complete``; SDK 2.3's result check refuses it), and the parameters a tool
marks with ``x-mcp-header`` go out as ``Mcp-Param-*`` headers with the
encodings of SEP-2243 (plain ASCII as is, numbers and booleans as text,
anything with controls, non-ASCII or outer whitespace as ``=?base64?...?=``,
null omitted; unmarked parameters never).

The server is a raw 2026-07-28 Streamable HTTP endpoint (``server/discover``,
``tools/list``, ``tools/call``): the SDK's own server always writes
``resultType``, so it cannot show the first.
"""

from __future__ import annotations

import base64
import contextlib
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.harness import (
    DaemonHarness,
    daemon_config,
    http_spec,
    rmtree,
    serve_asgi,
    short_tempdir,
)

MODERN = "2026-07-28"
TOOLS = [
    {
        "name": "bare",
        "description": "answers without resultType",
        "inputSchema": {"type": "object", "properties": {}},
    },
    {
        "name": "headed",
        "description": "x-mcp-header parameters",
        "inputSchema": {
            "type": "object",
            "properties": {
                "region": {"type": "string", "x-mcp-header": "Region"},
                "priority": {"type": "integer", "x-mcp-header": "Priority"},
                "verbose": {"type": "boolean", "x-mcp-header": "Verbose"},
                "label": {"type": "string", "x-mcp-header": "Label"},
                "note": {"type": "string", "x-mcp-header": "Note"},
                "query": {"type": "string"},
            },
        },
    },
]


class World:
    def __init__(self) -> None:
        self.call_headers: list[dict[str, str]] = []

    def app(self, base: str) -> Starlette:
        async def mcp(request: Request) -> Response:
            body = msgspec.json.decode(await request.body())
            method, rid = body.get("method"), body.get("id")
            if rid is None:
                return Response(status_code=202)
            if method == "server/discover":
                result: dict[str, Any] = {
                    "resultType": "complete",
                    "supportedVersions": [MODERN],
                    "capabilities": {"tools": {}},
                    "serverInfo": {"name": "raw-modern", "version": "1"},
                }
            elif method == "tools/list":
                result = {
                    "resultType": "complete",
                    "ttlMs": 0,
                    "cacheScope": "private",
                    "tools": TOOLS,
                }
            elif method == "tools/call":
                self.call_headers.append(
                    {k.lower(): v for k, v in request.headers.items()}
                )
                name = body["params"]["name"]
                result = {"content": [{"type": "text", "text": f"{name} done"}]}
            else:
                return JSONResponse(
                    {
                        "jsonrpc": "2.0",
                        "id": rid,
                        "error": {"code": -32601, "message": method},
                    }
                )
            return JSONResponse({"jsonrpc": "2.0", "id": rid, "result": result})

        return Starlette(routes=[Route("/mcp", mcp, methods=["POST"])])


@pytest.fixture(scope="module")
def world() -> Iterator[tuple[DaemonHarness, World]]:
    base = short_tempdir()
    fake = World()
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(serve_asgi(fake.app))
        spec = http_spec("raw", url + "/mcp", "streamable_http", protocol="auto")
        running = stack.enter_context(
            DaemonHarness.running(daemon_config(base, servers=[spec]))
        )
        running.wait_ready("raw")
        assert running.daemon.pool.get("raw").protocol_version == MODERN
        yield running, fake
    rmtree(base)


def test_a_result_without_result_type_is_complete(
    world: tuple[DaemonHarness, World],
) -> None:
    harness, _ = world
    with harness.client() as client:
        result = client.call_tool("raw", "bare", {})
    assert not result.is_error
    assert result.content == [{"type": "text", "text": "bare done"}]


def _b64(value: str) -> str:
    return "=?base64?" + base64.b64encode(value.encode()).decode() + "?="


def test_x_mcp_header_parameters_go_out_as_mcp_param_headers(
    world: tuple[DaemonHarness, World],
) -> None:
    harness, fake = world
    arguments = {
        "region": "us west 1",
        "priority": 42,
        "verbose": False,
        "label": "Hello, 世界",
        "note": None,
        "query": "SELECT 1",
    }
    with harness.client() as client:
        client.list_tools("raw")
        result = client.call_tool("raw", "headed", arguments)
    assert not result.is_error
    sent = fake.call_headers[-1]
    params = {k: v for k, v in sent.items() if k.startswith("mcp-param-")}
    assert params == {
        "mcp-param-region": "us west 1",
        "mcp-param-priority": "42",
        "mcp-param-verbose": "false",
        "mcp-param-label": _b64("Hello, 世界"),
    }
    assert sent["mcp-method"] == "tools/call"
    assert sent["mcp-name"] == "headed"
