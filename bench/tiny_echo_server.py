"""A minimal MCP stdio server with one ``echo`` tool, written without the SDK.

It speaks the 2025-11-25 handshake era with msgspec and costs a few tens of
microseconds per call, so that throughput row (d') measures the daemon rather
than the SDK server behind it (an SDK ``MCPServer`` spends about 1 ms of CPU on
each call, which caps one server process near 1,000 calls/s on this machine).

``--delay-ms N``: sleep N ms before answering each ``tools/call`` (bench/core.py
(h)'s context row: the daemon's CPU per call when its upstream answers as
slowly as an SDK server does, for the same work of its own).
"""

from __future__ import annotations

import sys
import threading
from typing import Any

import msgspec

TOOL = {
    "name": "echo",
    "inputSchema": {
        "type": "object",
        "properties": {"text": {"type": "string"}},
        "required": ["text"],
    },
}


_pause = threading.Event().wait


class Message(msgspec.Struct):
    method: str | None = None
    id: int | str | None = None
    params: dict[str, Any] = {}


def main() -> None:
    delay_s = 0.0
    if sys.argv[1:2] == ["--delay-ms"]:
        delay_s = float(sys.argv[2]) / 1000
    decode = msgspec.json.Decoder(Message).decode
    encode = msgspec.json.Encoder().encode
    out = sys.stdout.buffer
    for line in sys.stdin.buffer:
        if not line.strip():
            continue
        message = decode(line)
        if message.id is None:
            continue  # a notification
        reply: dict[str, Any] = {"jsonrpc": "2.0", "id": message.id}
        if message.method == "tools/call":
            text = message.params.get("arguments", {}).get("text", "")
            reply["result"] = {"content": [{"type": "text", "text": text}]}
            if delay_s:
                _pause(delay_s)  # idle, as time.sleep (banned project-wide)
        elif message.method == "initialize":
            reply["result"] = {
                "protocolVersion": "2025-11-25",
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "tiny-echo", "version": "1"},
            }
        elif message.method == "tools/list":
            reply["result"] = {"tools": [TOOL]}
        elif message.method == "ping":
            reply["result"] = {}
        else:
            reply["error"] = {"code": -32601, "message": "Method not found"}
        out.write(encode(reply) + b"\n")
        out.flush()


if __name__ == "__main__":
    main()
