"""A hand-written stdio MCP server that shows what it received, for the relay tests.

    python tests/relay_server.py [legacy|modern]

``tools/call`` of ``show`` answers with the request's params exactly as they
arrived on stdin (their JSON text, unparsed) and a vendor member that no
schema of ours knows (``x-vendor``), written before ``content``: a relay that
rebuilt results would reorder or drop it. ``modern`` speaks 2026-07-28
(``server/discover``; ``initialize`` is refused); ``legacy`` the handshake era.
"""

from __future__ import annotations

import sys
from typing import Any

import msgspec

TOOL = {"name": "show", "inputSchema": {"type": "object"}}


class Message(msgspec.Struct):
    method: str | None = None
    id: int | str | None = None
    params: msgspec.Raw = msgspec.Raw(b"{}")


def main() -> None:
    modern = sys.argv[1:] == ["modern"]
    decode = msgspec.json.Decoder(Message).decode
    encode = msgspec.json.Encoder().encode
    out = sys.stdout.buffer
    for line in sys.stdin.buffer:
        if not line.strip():
            continue
        message = decode(line)
        if message.id is None:
            continue  # a notification
        head = b'{"jsonrpc":"2.0","id":' + encode(message.id)
        result: Any = None
        if message.method == "tools/call":
            shown = encode(bytes(message.params).decode())
            out.write(
                head + b',"result":{"x-vendor":{"kept":true},"content":'
                b'[{"type":"text","text":' + shown + b"}]}}\n"
            )
            out.flush()
            continue
        if message.method == "initialize" and not modern:
            result = {
                "protocolVersion": "2025-11-25",
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "relay", "version": "1"},
            }
        elif message.method == "server/discover" and modern:
            result = {
                "supportedVersions": ["2026-07-28"],
                "capabilities": {"tools": {}},
                "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "relay"}},
            }
        elif message.method == "tools/list":
            result = {"tools": [TOOL]}
        elif message.method == "ping":
            result = {}
        if result is None:
            error = {"code": -32601, "message": "Method not found"}
            out.write(head + b',"error":' + encode(error) + b"}\n")
        else:
            out.write(head + b',"result":' + encode(result) + b"}\n")
        out.flush()


if __name__ == "__main__":
    main()
