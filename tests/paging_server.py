"""A hand-written stdio MCP server (no SDK, handshake era) whose listings come
in many padded pages, for tests/daemon/test_listing_budget.py: each page fits
under the server's ``max_result_bytes``, all of them together may not.

The listings named in ``$PAGED`` (comma-separated: ``tools``, ``resources``,
``templates``, ``prompts``) come in ``$PAGES`` pages (cursors "2", "3", ...),
each of one item whose description is ``$PAGE_BYTES`` bytes long; the others
are one small page. Its tools answer when called (``hello from NAME``), its
resources when read, its prompts when got. ``Listings`` answers the same way
for an HTTP test server.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import msgspec

INITIALIZE_RESULT: dict[str, object] = {
    "protocolVersion": "2025-11-25",
    "capabilities": {"tools": {}, "resources": {}, "prompts": {}},
    "serverInfo": {"name": "paging-test-server", "version": "1"},
}
_ITEMS: dict[str, tuple[str, str]] = {
    "tools/list": ("tools", "tools"),
    "resources/list": ("resources", "resources"),
    "resources/templates/list": ("templates", "resourceTemplates"),
    "prompts/list": ("prompts", "prompts"),
}
"""A listing's method: its name in ``$PAGED``, and its result's member."""


class Listings:
    """The server's answers: ``paged`` listings in ``pages`` pages of about
    ``page_bytes`` each, the others in one small page."""

    def __init__(self, *, pages: int, page_bytes: int, paged: frozenset[str]) -> None:
        self.pages, self.page_bytes, self.paged = pages, page_bytes, paged

    def answer(self, message_id: object, method: str, params: Any) -> dict[str, object]:
        """The JSON-RPC response to one request."""
        params = params if isinstance(params, dict) else {}
        result: dict[str, object] | None
        if method == "initialize":
            result = INITIALIZE_RESULT
        elif method in _ITEMS:
            result = self._page(method, params.get("cursor"))
        elif method == "tools/call":
            words = f"hello from {params.get('name')}"
            result = {"content": [{"type": "text", "text": words}]}
        elif method == "resources/read":
            uri = params.get("uri")
            result = {"contents": [{"uri": uri, "text": f"contents of {uri}"}]}
        elif method == "prompts/get":
            words = f"prompt {params.get('name')}"
            message = {"role": "user", "content": {"type": "text", "text": words}}
            result = {"messages": [message]}
        elif method == "ping":
            result = {}
        else:
            result = None
        if result is None:
            error = {"code": -32601, "message": "Method not found"}
            return {"jsonrpc": "2.0", "id": message_id, "error": error}
        return {"jsonrpc": "2.0", "id": message_id, "result": result}

    def _page(self, method: str, cursor: object) -> dict[str, object]:
        name, member = _ITEMS[method]
        paged = name in self.paged
        page = int(cursor) if isinstance(cursor, str) and cursor.isdigit() else 1
        result: dict[str, object] = {
            member: [_item(name, page, "x" * self.page_bytes if paged else "")]
        }
        if paged and page < self.pages:
            result["nextCursor"] = str(page + 1)
        return result


def _item(name: str, page: int, padding: str) -> dict[str, object]:
    """The one item of a listing's page ``page``."""
    item: dict[str, object] = {"description": padding}
    if name == "tools":
        item["name"] = "hello" if page == 1 else f"t{page}"
        item["inputSchema"] = {"type": "object", "properties": {}}
    elif name == "resources":
        item["name"] = f"r{page}"
        item["uri"] = f"mem://r{page}"
    elif name == "templates":
        item["name"] = f"rt{page}"
        item["uriTemplate"] = f"mem://rt{page}/{{id}}"
    else:
        item["name"] = f"p{page}"
    return item


def main() -> None:
    listings = Listings(
        pages=int(os.environ.get("PAGES", "1")),
        page_bytes=int(os.environ.get("PAGE_BYTES", "0")),
        paged=frozenset(filter(None, os.environ.get("PAGED", "").split(","))),
    )
    out = sys.stdout.buffer
    for line in sys.stdin.buffer:
        if not line.strip():
            continue
        message = msgspec.json.decode(line)
        if "id" not in message or "method" not in message:
            continue
        reply = listings.answer(message["id"], message["method"], message.get("params"))
        out.write(msgspec.json.encode(reply) + b"\n")
        out.flush()


if __name__ == "__main__":
    main()
