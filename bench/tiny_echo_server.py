"""A minimal MCP stdio server with one ``echo`` tool, written without the SDK.

It speaks the 2025-11-25 handshake era with msgspec and costs a few tens of
microseconds per call, so that throughput row (d') measures the daemon rather
than the SDK server behind it (an SDK ``MCPServer`` spends about 1 ms of CPU on
each call, which caps one server process near 1,000 calls/s on this machine).
"""

from __future__ import annotations

import sys
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


class Message(msgspec.Struct):
    method: str | None = None
    id: int | str | None = None
    params: dict[str, Any] = {}


def main() -> None:
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
