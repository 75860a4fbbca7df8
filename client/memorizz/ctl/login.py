"""The operator's end of an OAuth login: wait for the browser's callback.

Two ways in, whichever comes first:

* a loopback listener on the redirect URI (``http://127.0.0.1:PORT/PATH``),
  when the browser runs on this host: it answers exactly that path, once,
  only with the redirect URI's own ``Host`` (a DNS-rebinding page cannot
  reach it), then stops;
* a pasted URL on standard input, when the browser is elsewhere (it shows a
  "cannot connect" page whose address holds ``code`` and ``state``).

A redirect URI whose port another program holds is refused
(``CallbackPortError``): that program would receive the browser's callback
while memorizzctl waits for nothing.

Standard library only.
"""

from __future__ import annotations

import errno
import http.server
import queue
import sys
import threading
from typing import Final
from urllib.parse import urlsplit

from memorizz.api.errors import MemorizzError
from memorizz.ctl.exits import CALLBACK_PORT

_PAGE: Final = (
    b"<!doctype html><meta charset=utf-8><title>memorizz login</title>"
    b"<p>memorizzctl received the login. You can close this tab.</p>"
)


READ_TIMEOUT_S: Final = 10.0
"""A connection to the listener silent this long is closed."""


class _Server(http.server.ThreadingHTTPServer):
    """A thread a connection: another local program's connection that says
    nothing (or drips) cannot hold the browser's callback up."""

    daemon_threads = True
    block_on_close = False  # closing does not wait for such a connection


class CallbackPortError(MemorizzError):
    """The redirect URI's port is taken: the callback would go elsewhere."""

    reason = CALLBACK_PORT


class CallbackListener:
    """Serves one callback on a loopback redirect URI (a background thread)."""

    def __init__(self, redirect_uri: str, found: queue.Queue[str]) -> None:
        parts = urlsplit(redirect_uri)
        self._path = parts.path or "/"
        self._host = parts.netloc
        self._base = f"{parts.scheme}://{parts.netloc}"
        self._found = found
        self._lock = threading.Lock()
        self._taken = False
        listener = self

        class Handler(http.server.BaseHTTPRequestHandler):
            timeout = READ_TIMEOUT_S  # a silent peer's thread ends

            def do_GET(self) -> None:
                listener._handle(self)

            def log_message(self, format: str, *args: object) -> None:
                return  # the callback URL holds the code: never printed

        host = parts.hostname or "127.0.0.1"
        self._server = _Server((host, parts.port or 80), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _handle(self, request: http.server.BaseHTTPRequestHandler) -> None:
        target = urlsplit(request.path)
        if request.headers.get("Host") != self._host or target.path != self._path:
            request.send_error(404)
            return
        with self._lock:
            if self._taken:
                request.send_error(410, "this login already received its callback")
                return
            self._taken = True
        request.send_response(200)
        request.send_header("Content-Type", "text/html; charset=utf-8")
        request.send_header("Cache-Control", "no-store")
        request.send_header("Content-Length", str(len(_PAGE)))
        request.end_headers()
        request.wfile.write(_PAGE)
        self._found.put(self._base + request.path)


def read_pasted(found: queue.Queue[str]) -> None:
    """Lines from stdin until one looks like a callback (a background thread).
    A closed or unreadable stdin ends it quietly: the listener, if any, can
    still finish the login, else the wait times out."""
    if sys.stdin is None:  # started with fd 0 closed
        return
    try:
        for line in sys.stdin:
            text = line.strip()
            if "code=" in text or "error=" in text:
                found.put(text)
                return
            if text:
                sys.stderr.write(
                    "that is not the callback URL (it has no code=...); paste the full"
                    " address from the browser\n"
                )
    except (OSError, ValueError):  # not UTF-8 (UnicodeDecodeError), or closed
        sys.stderr.write("cannot read the pasted address: standard input is not text\n")


def open_listener(
    redirect_uri: str, found: queue.Queue[str]
) -> tuple[CallbackListener | None, str | None]:
    """A started listener on a loopback ``http`` redirect URI, or why not;
    raises ``CallbackPortError`` when another program holds the port."""
    parts = urlsplit(redirect_uri)
    if parts.scheme != "http":
        return None, "the redirect URI is not a loopback http address"
    try:
        listener = CallbackListener(redirect_uri, found)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise CallbackPortError(
                f"cannot listen on {parts.netloc}: another program holds that port,"
                " and the browser's callback would go to it; stop it, or run again"
                " with --redirect-uri http://127.0.0.1:PORT/callback (a free port),"
                " or with --no-listen to paste the callback address"
            ) from None
        return None, f"cannot listen on {parts.netloc} ({exc.strerror or exc})"
    listener.start()
    return listener, None


def start_paste_reader(found: queue.Queue[str]) -> None:
    threading.Thread(target=read_pasted, args=(found,), daemon=True).start()
