"""A stdio <-> Unix socket pump for the face tests: ``python tests/face_pump.py PATH``.

What ``memorizzctl mcp serve`` does, in a few lines, so that the face's tests
need nothing but the daemon and the official MCP SDK client."""

from __future__ import annotations

import os
import socket
import sys
import threading


def main() -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(sys.argv[1])

    def up() -> None:
        while data := os.read(0, 65536):
            sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)

    threading.Thread(target=up, daemon=True).start()
    while data := sock.recv(65536):
        os.write(1, data)


if __name__ == "__main__":
    main()
