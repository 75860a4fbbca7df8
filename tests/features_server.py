"""A real MCP server (SDK 2.3 MCPServer) with what tests/mcp_server.py lacks:
resource subscriptions, completions and roots (handshake-era features).

    python tests/features_server.py stdio

Served over Streamable HTTP in-process by ``tests.harness.serve_asgi`` with
``mcp.streamable_http_app()``. ``$SUB_LOG`` (or ``SUB_LOG`` set on this module
when served in-process): a file that gets one line per ``resources/subscribe``
(``subscribe URI``) and ``resources/unsubscribe`` (``unsubscribe URI``).

* resource ``feat://watched`` (subscribable), template ``feat://colors/{color}``
  (``$FEAT_SCHEME``: another scheme than ``feat``);
* prompt ``pick(color)``; completions of ``color`` (prompt and template), the
  values starting with the typed prefix, each ending in ``@prompt`` or
  ``@template`` (which ref reached the server);
* 2026-07-28 ``subscriptions/listen`` honors a resource subscription to
  ``feat://watched`` only (its acknowledgement leaves the others out, those
  built from its template too);
* tool ``touch(uri)``: sends ``notifications/resources/updated`` for ``uri``;
* tool ``roots()``: asks the client ``roots/list`` and returns the URIs, one a line.
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any

import mcp_types as types
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.subscriptions import ListenHandler
from mcp.shared.exceptions import MCPDeprecationWarning

SCHEME = os.environ.get("FEAT_SCHEME", "feat")
"""The scheme of its resources and template (``$FEAT_SCHEME``; default ``feat``)."""

mcp = MCPServer("memorizz-features-server", version="0.1", log_level="WARNING")
SUB_LOG: str | None = os.environ.get("SUB_LOG")
COLORS = ("red", "green", "blue", "grey")


def _log(line: str) -> None:
    if SUB_LOG is None:
        return
    with open(SUB_LOG, "a", encoding="utf-8") as f:
        f.write(line + "\n")


async def _subscribe(
    ctx: Any, params: types.SubscribeRequestParams
) -> types.EmptyResult:
    _log(f"subscribe {params.uri}")
    return types.EmptyResult()


async def _unsubscribe(
    ctx: Any, params: types.UnsubscribeRequestParams
) -> types.EmptyResult:
    _log(f"unsubscribe {params.uri}")
    return types.EmptyResult()


mcp._lowlevel_server.add_request_handler(
    "resources/subscribe",
    types.SubscribeRequestParams,
    _subscribe,
)
mcp._lowlevel_server.add_request_handler(
    "resources/unsubscribe",
    types.UnsubscribeRequestParams,
    _unsubscribe,
)


_listen = ListenHandler(mcp._subscriptions)


async def _listen_own(
    ctx: Any, params: types.SubscriptionsListenRequestParams
) -> types.SubscriptionsListenResult:
    """The SDK's listen handler, asked only for the resource this server lists
    (not for those built from its template)."""
    wanted = params.notifications
    if wanted.resource_subscriptions:
        own = [u for u in wanted.resource_subscriptions if u == WATCHED]
        wanted = wanted.model_copy(update={"resource_subscriptions": own})
        params = params.model_copy(update={"notifications": wanted})
    return await _listen(ctx, params)


mcp._lowlevel_server.add_request_handler(
    "subscriptions/listen", types.SubscriptionsListenRequestParams, _listen_own
)


WATCHED = f"{SCHEME}://watched"


@mcp.resource(WATCHED, mime_type="text/plain")
def watched() -> str:
    return "watched content"


@mcp.resource(SCHEME + "://colors/{color}", mime_type="text/plain")
def color(color: str) -> str:
    return f"the colour {color}"


@mcp.prompt()
def pick(color: str) -> str:
    """Pick a colour."""
    return f"Paint it {color}"


@mcp.completion()
async def complete(
    ref: types.PromptReference | types.ResourceTemplateReference,
    argument: types.CompletionArgument,
    context: types.CompletionContext | None,
) -> types.Completion | None:
    if argument.name != "color":
        return None
    kind = "prompt" if isinstance(ref, types.PromptReference) else "template"
    values = [f"{c}@{kind}" for c in COLORS if c.startswith(argument.value)]
    return types.Completion(values=values, total=len(values), has_more=False)


@mcp.tool()
async def touch(uri: str, ctx: Context) -> str:
    """Say that ``uri`` changed (notifications/resources/updated; at
    2026-07-28, on the listen streams that hold it)."""
    if ctx.protocol_version and ctx.protocol_version >= "2026":
        await ctx.notify_resource_updated(uri)
    else:
        await ctx.session.send_resource_updated(uri)
    return "touched"


@mcp.tool()
async def roots(ctx: Context) -> str:
    """The client's roots (roots/list), one URI a line."""
    with warnings.catch_warnings():  # the handshake era's way; still ours
        warnings.simplefilter("ignore", MCPDeprecationWarning)
        listed = await ctx.session.list_roots()
    return "\n".join(str(root.uri) for root in listed.roots) or "no roots"


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else "stdio"
    if mode == "stdio":
        mcp.run("stdio")
