"""A tiny HTTP/1.1 responder for ``GET /metrics``, on our own listeners.

Prometheus scrapes with one plain GET and reads the body to the end, so the
responder reads one bounded request head (``HEAD_MAX`` bytes, within
``HEAD_TIMEOUT_S``), answers it with ``Connection: close`` and closes: no
keep-alive, no chunking, no body. It closes as RFC 9112 9.6 asks: its side
first, then what the client sent past the request is read and dropped
(``_linger``) until the client closes too, so that those bytes, unread at the
close, do not make the client's socket report a reset after its answer. A Unix socket (``metrics.sock``) and a
loopback TCP address are served alike. At most ``CONNECTIONS_MAX`` at once
on each listener (so that local processes holding the TCP listener's slots do
not shut the operators out of ``metrics.sock``); past that a connection is
closed unanswered.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable
from typing import Final

import anyio
import anyio.abc

from memorizzd.telemetry.metrics import Snapshot

log = logging.getLogger("memorizzd.metrics")

HEAD_MAX: Final = 8192
HEAD_TIMEOUT_S: Final = 10.0
WRITE_TIMEOUT_S: Final = 30.0
CONNECTIONS_MAX: Final = 16
LINGER_S: Final = 2.0
"""At most this long reading what a client sent past its request (``_linger``)."""
LINGER_IDLE_S: Final = 0.5
"""... and at most this long for each more piece of it."""
LINGER_MAX: Final = 1 << 20
"""... and at most this many bytes of it."""
PATH: Final = "/metrics"
ALLOW: Final = "GET, HEAD"

Admits = Callable[[anyio.abc.SocketStream], bool]
"""Whether the peer of a connection may read the metrics (a Unix socket's
peer credentials against the operator socket's rule)."""


class MetricsServer:
    """Serves the daemon's metrics as Prometheus text on any number of listeners.

    ``snapshot``: the daemon's state at each scrape; ``refresh``: awaited
    before each exposition (what cannot be read on the loop cheaply, e.g. the
    pending approvals' count from the store). The exposition (and with it
    prometheus-client) is loaded at the first scrape."""

    def __init__(
        self,
        snapshot: Callable[[], Snapshot],
        version: str,
        *,
        refresh: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._snapshot = snapshot
        self._version = version
        self._refresh = refresh
        self._expose: Callable[[], bytes] | None = None

    async def serve(
        self,
        listener: anyio.abc.SocketListener,
        admits: Admits | None = None,
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        answering = _Answering()  # this listener's own: the cap is per listener
        async with listener, anyio.create_task_group() as tg:
            task_status.started()
            while True:
                try:
                    stream = await listener.accept()
                except OSError as exc:  # EMFILE and the like: keep serving
                    log.warning("metrics: accept failed: %s", exc)
                    await anyio.sleep(0.1)
                    continue
                if answering.count >= CONNECTIONS_MAX or (
                    admits is not None and not admits(stream)
                ):
                    await _close(stream)
                    continue
                answering.count += 1
                tg.start_soon(self._answer, stream, answering)

    async def _answer(
        self, stream: anyio.abc.SocketStream, answering: _Answering
    ) -> None:
        try:
            head = None  # a client that never sends its head gets closed
            with anyio.move_on_after(HEAD_TIMEOUT_S):
                head = await _read_head(stream)
            if head is None:
                return
            try:
                status, body, content_type = await self._respond(head)
            except Exception:  # a scrape's failure is this scrape's alone
                log.exception("metrics: could not answer a scrape")
                status, body = "500 Internal Server Error", b"see the daemon's log\n"
                content_type = "text/plain; charset=utf-8"
            lines = [
                f"HTTP/1.1 {status}",
                f"Content-Type: {content_type}",
                f"Content-Length: {len(body)}",
                "Connection: close",
            ]
            if status.startswith("405 "):  # RFC 9110 15.5.6: it MUST say
                lines.append(f"Allow: {ALLOW}")
            data = ("\r\n".join(lines) + "\r\n\r\n").encode()
            if not head.startswith(b"HEAD "):
                data += body
            with anyio.move_on_after(WRITE_TIMEOUT_S):
                await stream.send(data)
                await _linger(stream)
        except (OSError, anyio.BrokenResourceError, anyio.EndOfStream):
            pass  # the scraper went away
        except Exception:  # a connection must never take the daemon down
            log.exception("metrics: a connection failed")
        finally:
            answering.count -= 1
            await _close(stream)

    async def _respond(self, head: bytes) -> tuple[str, bytes, str]:
        request_line = head.split(b"\r\n", 1)[0].decode("latin-1")
        parts = request_line.split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            return "400 Bad Request", b"bad request\n", "text/plain; charset=utf-8"
        method, target, _ = parts
        if method not in ("GET", "HEAD"):
            return (
                "405 Method Not Allowed",
                b"only GET /metrics\n",
                "text/plain; charset=utf-8",
            )
        if _origin_form(target).split("?", 1)[0] != PATH:
            return "404 Not Found", b"try /metrics\n", "text/plain; charset=utf-8"
        if self._refresh is not None:
            await self._refresh()
        if self._expose is None:
            self._expose = _exposition(self._snapshot, self._version)
        return "200 OK", self._expose(), CONTENT_TYPE


@dataclasses.dataclass
class _Answering:
    """A listener's connections being answered now."""

    count: int = 0


def _origin_form(target: str) -> str:
    """``target`` as a path (and query): an absolute-form one
    (``http://127.0.0.1:9464/metrics``, which a server MUST accept: RFC 9112
    3.2.2) without its scheme and authority."""
    scheme, sep, rest = target.partition("://")
    if not sep or scheme.lower() not in ("http", "https"):
        return target
    ends = [i for i in map(rest.find, "/?#") if i >= 0]
    return rest[min(ends) :] if ends else ""


CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
"""prometheus-client's ``CONTENT_TYPE_PLAIN_0_0_4`` (the text format 0.0.4)."""


def _exposition(snapshot: Callable[[], Snapshot], version: str) -> Callable[[], bytes]:
    """The daemon's text exposition, built on first use: this is where
    prometheus-client is imported (``telemetry/exposition.py``)."""
    from prometheus_client.exposition import generate_latest

    from memorizzd.telemetry.exposition import registry

    built = registry(snapshot, version)
    return lambda: generate_latest(built)


async def _read_head(stream: anyio.abc.SocketStream) -> bytes | None:
    """The request head up to its blank line; None when it is too long or cut."""
    head = b""
    while b"\r\n\r\n" not in head:
        if len(head) > HEAD_MAX:
            return None
        try:
            head += await stream.receive(HEAD_MAX)
        except anyio.EndOfStream:
            return None
    return head


async def _linger(stream: anyio.abc.SocketStream) -> None:
    """Half-close, then read and drop what the client still sends (a request
    pipelined behind the first, a body) until it closes, bounded by
    ``LINGER_S``, ``LINGER_IDLE_S`` and ``LINGER_MAX``. A well-behaved
    scraper closes as soon as it has read the answer: this ends at once."""
    try:
        await stream.send_eof()
    except RuntimeError:  # uvloop's word for a transport the peer reset: gone
        return
    dropped = 0
    with anyio.move_on_after(LINGER_S):
        while dropped <= LINGER_MAX:
            with anyio.move_on_after(LINGER_IDLE_S) as idle:
                try:
                    dropped += len(await stream.receive(HEAD_MAX))
                except anyio.EndOfStream:
                    return
            if idle.cancelled_caught:
                return


async def _close(stream: anyio.abc.SocketStream) -> None:
    with anyio.CancelScope(shield=True):
        try:
            await stream.aclose()
        except (OSError, anyio.BrokenResourceError):
            pass
