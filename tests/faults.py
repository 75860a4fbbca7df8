"""Faults at the edge of the world, between the daemon and a real MCP server
(what Toxiproxy would do, in-process): a slow drip on stdio and over HTTP,
and an HTTP upstream that answers 429/503 with ``Retry-After``.

    python tests/faults.py drip RATE -- CMD ARG...   # stdio: CMD's big lines at RATE bytes/s

``drip`` relays a stdio server's stdout and sends every line longer than
``DRIP_OVER`` bytes at ``RATE`` bytes a second (1 KiB pieces), as a slow link
would: each read makes progress, the message takes minutes. Lines behind it
wait (one pipe). stdin and stderr are the child's own.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import anyio
import msgspec

DRIP_OVER = 16 * 1024
PIECE = 1024

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


def dripping(app: App, *, rate: int = 1024) -> App:
    """ASGI: send every response body part longer than ``DRIP_OVER`` at
    ``rate`` bytes a second (SSE events included); the rest at once."""

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return

        async def slow_send(message: Message) -> None:
            body = message.get("body", b"")
            if message["type"] != "http.response.body" or len(body) <= DRIP_OVER:
                await send(message)
                return
            for start in range(0, len(body), PIECE):
                piece = body[start : start + PIECE]
                await send(
                    {"type": "http.response.body", "body": piece, "more_body": True}
                )
                await anyio.sleep(len(piece) / rate)
            more = message.get("more_body", False)
            await send({"type": "http.response.body", "body": b"", "more_body": more})

        await app(scope, receive, slow_send)

    return wrapped


class _Call(msgspec.Struct):
    method: str = ""
    params: dict[str, Any] = {}


@dataclass
class Busy:
    """ASGI: answer ``status`` with ``Retry-After: retry_after`` to the next
    ``times`` POSTs whose JSON-RPC request ``matches`` (e.g. a tool name);
    everything else reaches the real server. ``seen`` counts the matching
    requests that arrived, answered busy or not."""

    status: int = 429
    retry_after: str | None = "1"
    times: int = 1
    matches: Callable[[str, dict[str, Any]], bool] = lambda method, params: False
    seen: int = 0
    busy_answers: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def tool(self, name: str) -> Busy:
        self.matches = lambda method, params: (
            method == "tools/call" and params.get("name") == name
        )
        return self

    def method(self, name: str) -> Busy:
        self.matches = lambda method, params: method == name
        return self

    def wrap(self, app: App) -> App:
        async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != "http" or scope["method"] != "POST":
                await app(scope, receive, send)
                return
            chunks: list[bytes] = []
            while True:
                message = await receive()
                chunks.append(message.get("body", b""))
                if not message.get("more_body"):
                    break
            body = b"".join(chunks)
            if self._busy_now(body):
                headers = [(b"content-type", b"text/plain")]
                if self.retry_after is not None:
                    headers.append((b"retry-after", self.retry_after.encode()))
                await send(
                    {
                        "type": "http.response.start",
                        "status": self.status,
                        "headers": headers,
                    }
                )
                await send({"type": "http.response.body", "body": b"busy"})
                return
            replayed = False

            async def replay() -> Message:
                nonlocal replayed
                if replayed:
                    return await receive()
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}

            await app(scope, replay, send)

        return wrapped

    def _busy_now(self, body: bytes) -> bool:
        try:
            call = msgspec.json.decode(body, type=_Call)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return False
        if not self.matches(call.method, call.params):
            return False
        with self._lock:
            self.seen += 1
            if self.busy_answers >= self.times:
                return False
            self.busy_answers += 1
            return True


def _drip_main(rate: int, argv: list[str]) -> int:
    child = subprocess.Popen(argv, stdout=subprocess.PIPE)
    assert child.stdout is not None
    out = sys.stdout.buffer
    line = bytearray()
    pause = threading.Event()  # never set: a wait that is a sleep
    while chunk := os.read(child.stdout.fileno(), 65536):
        line += chunk
        while (end := line.find(b"\n")) >= 0:
            message, line = bytes(line[: end + 1]), line[end + 1 :]
            if len(message) <= DRIP_OVER:
                out.write(message)
                out.flush()
                continue
            for start in range(0, len(message), PIECE):
                out.write(message[start : start + PIECE])
                out.flush()
                pause.wait(PIECE / rate)
    return child.wait()


if __name__ == "__main__":
    if len(sys.argv) < 4 or sys.argv[1] != "drip" or sys.argv[3] != "--":
        sys.exit(__doc__)
    sys.exit(_drip_main(int(sys.argv[2]), sys.argv[4:]))
