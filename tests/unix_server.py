"""A stand-in daemon for the client's tests (tests/client/: no daemon there):
a Unix socket served from a thread of this process, one connection at a
time. Imports nothing of the daemon."""

from __future__ import annotations

import socket
import threading


class UnixServer:
    """Listens on ``path``; each connection is handed to ``serve`` (closed
    after it returns), until ``close``."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._stop = threading.Event()
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(path)
        self._listener.listen(16)
        self._listener.settimeout(0.05)  # how soon ``close`` is noticed
        self._thread = threading.Thread(target=self._accept, daemon=True)

    def serve(self, conn: socket.socket) -> None:
        raise NotImplementedError

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            with conn:
                self.serve(conn)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._listener.close()
