"""The login's loopback callback listener serves the browser whatever other
local connections do: one that connects and says nothing (or drips its
request) no longer holds the listener's one thread, so the browser's
callback, coming after it, still completes the login.

The real listener (``memorizz.ctl.login``) on a free loopback port; plain
sockets for the silent peer and the browser.
"""

from __future__ import annotations

import queue
import socket

from memorizz.ctl.login import open_listener

WAIT_S = 10.0


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_silent_connection_does_not_hold_the_browsers_callback() -> None:
    port = _free_port()
    redirect = f"http://127.0.0.1:{port}/callback"
    found: queue.Queue[str] = queue.Queue()
    listener, why = open_listener(redirect, found)
    assert listener is not None, why
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as silent:
            silent.sendall(b"GET /call")  # and nothing more, for now
            with socket.create_connection(
                ("127.0.0.1", port), timeout=WAIT_S
            ) as browser:
                browser.sendall(
                    b"GET /callback?code=c0de&state=s7 HTTP/1.1\r\n"
                    + f"Host: 127.0.0.1:{port}\r\n\r\n".encode()
                )
                answer = browser.recv(1 << 16)
            assert answer.startswith(b"HTTP/1.0 200"), answer
            assert found.get(timeout=WAIT_S) == f"{redirect}?code=c0de&state=s7"
    finally:
        listener.close()
