"""A hand-written, pre-2026 MCP server over stdio (no SDK): it answers
``server/discover`` with "method not found", speaks 2025-11-25 after
``initialize``, appends every method it receives to $METHOD_LOG, and lists
its tools in $PAGES pages (cursors "2", "3", ...). With $CALL_LOG, every
tools/call appends its ``tag`` argument there (fsynced): a count of executions.
A tools/call with the argument ``fail`` true answers an ``isError`` result
written as ``json.dumps`` writes it (``{"isError": true, ...}``).

Faults, each off unless its environment variable is set (SECURITY.md 6.2 #17):

* ``NOISE=1``: two junk lines (not JSON, and JSON that is not JSON-RPC) on
  stdout before every reply;
* ``STDERR_FLOOD=1``: a ``flood`` tool whose call starts a thread writing
  ``lines`` lines of ``size`` bytes to stderr, and answers at once;
* ``IGNORE_TERM=1``: SIGTERM is ignored, and the server stays up after stdin
  closes (only SIGKILL ends it), saying so on stderr;
* ``EXIT_AT_ONCE=1``: exits with status 3 before reading anything;
* ``DUPLICATE_TOOL=1``: its first page lists ``hello`` twice."""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterable, Iterator
from typing import Any

import msgspec

LOG = os.environ.get("METHOD_LOG")
PAGES = int(os.environ.get("PAGES", "1"))  # tools/list answers in this many pages
CALLS = os.environ.get("CALL_LOG")
NOISE = os.environ.get("NOISE") == "1"
FLOOD = os.environ.get("STDERR_FLOOD") == "1"
IGNORE_TERM = os.environ.get("IGNORE_TERM") == "1"
EXIT_AT_ONCE = os.environ.get("EXIT_AT_ONCE") == "1"
DUPLICATE_TOOL = os.environ.get("DUPLICATE_TOOL") == "1"


def tool(name: str) -> dict[str, object]:
    return {"name": name, "inputSchema": {"type": "object", "properties": {}}}


def answer(
    message_id: object, result: object = None, error: object = None
) -> dict[str, object]:
    """The JSON-RPC response to ``message_id``: ``error`` if given, else ``result``."""
    body: dict[str, object] = {"jsonrpc": "2.0", "id": message_id}
    if error is not None:
        body["error"] = error
    else:
        body["result"] = result
    return body


def reply(message_id: object, result: object = None, error: object = None) -> None:
    body = answer(message_id, result, error)
    if NOISE:
        sys.stdout.write('noise: this line is not JSON\n{"not": "json-rpc"}\n')
    sys.stdout.write(msgspec.json.encode(body).decode() + "\n")
    sys.stdout.flush()


def messages(lines: Iterable[str | bytes]) -> Iterator[Any]:
    """The messages read from ``lines`` (blank ones skipped), each one's
    method appended to ``$METHOD_LOG`` (if set) before it is handed over."""
    for line in lines:
        if not line.strip():
            continue
        message = msgspec.json.decode(line)
        method = message.get("method")
        if LOG and method:
            with open(LOG, "a", encoding="utf-8") as f:
                f.write(method + "\n")
        yield message


def flood(lines: int, size: int) -> None:
    line = b"e" * (size - 1) + b"\n"
    for _ in range(lines):
        sys.stderr.buffer.write(line)
    sys.stderr.buffer.flush()


def main() -> None:
    if EXIT_AT_ONCE:
        sys.stderr.write("exiting at once\n")
        sys.exit(3)
    if IGNORE_TERM:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    serve()
    if IGNORE_TERM:  # stdin is closed: stay up until SIGKILL
        sys.stderr.write("stdin closed; staying up\n")
        sys.stderr.flush()
    while IGNORE_TERM:
        signal.pause()


def serve() -> None:
    for message in messages(sys.stdin):
        method = message.get("method")
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
            if FLOOD and page == 1:
                result["tools"] = [tool("hello"), tool("flood")]
            if DUPLICATE_TOOL and page == 1:
                result["tools"] = [tool("hello"), tool("hello")]
            if page < PAGES:
                result["nextCursor"] = str(page + 1)
            reply(message["id"], result)
        elif method == "tools/call":
            params = message.get("params") or {}
            if FLOOD and params.get("name") == "flood":
                arguments = params.get("arguments") or {}
                size = int(arguments.get("size", 10_240))
                lines = int(arguments.get("lines", 2000))
                threading.Thread(target=flood, args=(lines, size), daemon=True).start()
            if CALLS:
                arguments = (message.get("params") or {}).get("arguments") or {}
                with open(CALLS, "a", encoding="utf-8") as f:
                    f.write(f"{arguments.get('tag', '')}\n")
                    f.flush()
                    os.fsync(f.fileno())
            if (params.get("arguments") or {}).get("fail"):
                # an isError result written as json.dumps writes it: spaced,
                # isError first (a stdio result is relayed byte for byte)
                message_id = msgspec.json.encode(message["id"]).decode()
                sys.stdout.write(
                    f'{{"jsonrpc": "2.0", "id": {message_id}, "result": {{"isError":'
                    ' true, "content": [{"type": "text", "text": "it failed"}]}}\n'
                )
                sys.stdout.flush()
                continue
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
