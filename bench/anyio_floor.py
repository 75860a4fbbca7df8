"""The framework's floor: CPU per request of a bare anyio (uvloop) line server.

    .venv/bin/python -m bench.anyio_floor [--n 20000]

A Unix-socket server that reads a line and writes it back, the way
``memorizzd.rpc.server`` frames requests, with no dispatch, policy, audit or
upstream: ``inline`` answers in the reading task; ``spawn`` runs each request in
a task of its own (what the daemon does, so that a client that leaves can be
noticed while its call runs); ``pool`` hands each request to a reused worker
task. One client sends a request and waits for the answer, ``n`` times; the
server's CPU per request is read from /proc. The daemon pays about one such
hop on each side of a relayed call, before any of its own work: this is the
floor under the "daemon CPU per warm call" row of ``bench.core``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import socket
import sys
import tempfile
import time
from functools import partial
from typing import Final

import anyio
import anyio.abc

from bench.harness import wait_until

KINDS: Final = ("inline", "spawn", "pool", "inline", "spawn", "pool")
_LINE: Final = b'{"jsonrpc":"2.0","id":1,"method":"ping"}\n'


async def _serve(path: str, kind: str) -> None:
    listener = await anyio.create_unix_listener(path)

    async def handle(stream: anyio.abc.SocketStream) -> None:
        async with stream, anyio.create_task_group() as tg:
            idle: list[_Worker] = []

            async def answer(line: bytes) -> None:
                await stream.send(line + b"\n")

            async def work(worker: _Worker) -> None:
                while True:
                    await worker.ready.wait()
                    worker.ready = anyio.Event()
                    await answer(worker.line)
                    idle.append(worker)

            buffer = b""
            while True:
                try:
                    buffer += await stream.receive()
                except anyio.EndOfStream:
                    return
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if kind == "inline":
                        await answer(line)
                    elif kind == "spawn":
                        tg.start_soon(answer, line)
                    else:
                        if idle:
                            worker = idle.pop()
                        else:
                            worker = _Worker()
                            tg.start_soon(work, worker)
                        worker.line = line
                        worker.ready.set()

    await listener.serve(handle)


class _Worker:
    def __init__(self) -> None:
        self.ready = anyio.Event()
        self.line = b""


def _server(path: str, kind: str) -> None:
    anyio.run(
        _serve, path, kind, backend="asyncio", backend_options={"use_uvloop": True}
    )


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=20_000, help="requests per kind")
    n: int = parser.parse_args(argv).n
    for kind in KINDS:
        path = os.path.join(tempfile.mkdtemp(prefix="mzf-", dir="/tmp"), "s.sock")
        server = mp.Process(target=_server, args=(path, kind))
        server.start()
        wait_until(partial(os.path.exists, path), timeout_s=30, what="the line server")
        with socket.socket(socket.AF_UNIX) as client:
            client.connect(path)
            for _ in range(500):  # warm-up
                client.sendall(_LINE)
                client.recv(256)
            cpu0, wall0 = _cpu_s(server.pid or 0), time.perf_counter()
            for _ in range(n):
                client.sendall(_LINE)
                client.recv(256)
            cpu = (_cpu_s(server.pid or 0) - cpu0) / n * 1e6
            wall = (time.perf_counter() - wall0) / n * 1e6
        server.terminate()
        server.join()
        os.unlink(path)
        sys.stdout.write(
            f"{kind:7} server CPU/request {cpu:5.0f} µs   round trip {wall:5.0f} µs\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
