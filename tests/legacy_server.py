"""A hand-written, pre-2026 MCP server over stdio (no SDK): it answers
``server/discover`` with "method not found", speaks 2025-11-25 after
``initialize``, appends every method it receives to $METHOD_LOG, and lists
its tools in $PAGES pages (cursors "2", "3", ...). With $CALL_LOG, every
tools/call appends its ``tag`` argument there (fsynced): a count of executions."""

from __future__ import annotations

import os
import sys

import msgspec

LOG = os.environ.get("METHOD_LOG")
PAGES = int(os.environ.get("PAGES", "1"))  # tools/list answers in this many pages
CALLS = os.environ.get("CALL_LOG")


def tool(name: str) -> dict[str, object]:
    return {"name": name, "inputSchema": {"type": "object", "properties": {}}}


def reply(message_id: object, result: object = None, error: object = None) -> None:
    body: dict[str, object] = {"jsonrpc": "2.0", "id": message_id}
    if error is not None:
        body["error"] = error
    else:
        body["result"] = result
    sys.stdout.write(msgspec.json.encode(body).decode() + "\n")
    sys.stdout.flush()


def main() -> None:
    for line in sys.stdin:
        if not line.strip():
            continue
        message = msgspec.json.decode(line)
        method = message.get("method")
        if LOG and method:
            with open(LOG, "a", encoding="utf-8") as f:
                f.write(method + "\n")
        if "id" not in message:
            continue
        if method == "initialize":
            reply(
                message["id"],
                {
                    "protocolVersion": "2025-11-25",
                    "capabilities": {"tools": {}},
                    "serverInfo": {"name": "legacy-test-server", "version": "0.9"},
                },
            )
        elif method == "tools/list":
            page = int((message.get("params") or {}).get("cursor") or 1)
            result: dict[str, object] = {
                "tools": [tool("hello" if page == 1 else f"p{page}")]
            }
            if page < PAGES:
                result["nextCursor"] = str(page + 1)
            reply(message["id"], result)
        elif method == "tools/call":
            if CALLS:
                arguments = (message.get("params") or {}).get("arguments") or {}
                with open(CALLS, "a", encoding="utf-8") as f:
                    f.write(f"{arguments.get('tag', '')}\n")
                    f.flush()
                    os.fsync(f.fileno())
            reply(
                message["id"],
                {"content": [{"type": "text", "text": "hello from legacy"}]},
            )
        elif method == "ping":
            reply(message["id"], {})
        else:
            reply(message["id"], error={"code": -32601, "message": "Method not found"})


if __name__ == "__main__":
    main()
