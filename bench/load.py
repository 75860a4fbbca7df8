"""Throughput: many socket clients, each with one call outstanding at a time.

``connections`` blocking ``memorizz.Client``s are spread over ``procs`` worker
processes (``connections / procs`` threads each). A thread spends nearly all
of its time blocked in ``recv`` (the GIL released), so the GIL costs little;
spreading the threads over processes still removes what is left of it, and the
per-call CPU of the workers is measured and reported so that one can see the
client side is not the bottleneck.

Each batch: every worker passes a cross-process barrier, its threads pass a
local one, then each thread makes ``per_thread`` calls and reports when its
first call started and its last call ended (``perf_counter_ns`` is
CLOCK_MONOTONIC, comparable across processes). A batch's wall time is the
latest end minus the earliest start.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgspec

from bench.harness import TEXT, cpu_ns
from memorizz.client import Client

_WARMUP_CALLS = 5
_TIMEOUT_S = 120.0


class Batch(msgspec.Struct, frozen=True):
    calls: int
    wall_ns: int
    client_cpu_ns: int
    daemon_cpu_ns: int
    server_cpu_ns: int

    @property
    def rate(self) -> float:
        return self.calls / (self.wall_ns / 1e9)


def _echo(client: Client) -> None:
    result = client.call_tool("echo", "echo", {"text": TEXT})
    if result.is_error or result.content[0].get("text") != TEXT:
        raise RuntimeError(f"unexpected echo result: {result!r}")


def _worker(
    socket_path: str,
    threads: int,
    per_thread: int,
    batches: int,
    barrier: Any,
    results: Any,
) -> None:
    """One worker process: ``threads`` connections, ``batches`` timed batches."""
    clients = [Client(socket_path) for _ in range(threads)]
    try:
        for client in clients:
            for _ in range(_WARMUP_CALLS):
                _echo(client)
        with ThreadPoolExecutor(threads) as pool:
            for _ in range(batches):
                start = threading.Barrier(threads)
                barrier.wait(_TIMEOUT_S)
                cpu0 = time.process_time_ns()
                futures = [
                    pool.submit(_timed_calls, client, per_thread, start)
                    for client in clients
                ]
                spans = [future.result() for future in futures]
                results.put(("ok", (spans, time.process_time_ns() - cpu0)))
    except BaseException as exc:
        results.put(("error", repr(exc)))
        barrier.abort()  # nobody waits for this worker any longer
        raise
    finally:
        for client in clients:
            client.close()


def _timed_calls(client: Client, n: int, start: threading.Barrier) -> tuple[int, int]:
    start.wait()
    first = time.perf_counter_ns()
    for _ in range(n):
        _echo(client)
    return first, time.perf_counter_ns()


def run_batches(
    socket_path: str,
    *,
    calls: int,
    connections: int,
    procs: int,
    batches: int,
    daemon_pid: int,
    server_pid: int,
) -> list[Batch]:
    """``batches`` batches of ``calls`` echo calls over ``connections`` connections."""
    if connections % procs:
        raise ValueError("connections must be a multiple of procs")
    threads = connections // procs
    per_thread = max(1, calls // connections)
    ctx = mp.get_context("spawn")  # never fork: the parent may have threads
    barrier = ctx.Barrier(procs + 1)
    results = ctx.Queue()
    workers = [
        ctx.Process(
            target=_worker,
            args=(socket_path, threads, per_thread, batches, barrier, results),
            name=f"bench-load-{i}",
            daemon=True,
        )
        for i in range(procs)
    ]
    out: list[Batch] = []
    try:
        for worker in workers:
            worker.start()
        for _ in range(batches):
            barrier.wait(_TIMEOUT_S)  # all workers connected and warm (or done)
            daemon0, server0 = cpu_ns(daemon_pid), cpu_ns(server_pid)
            spans: list[tuple[int, int]] = []
            client_cpu = 0
            for _ in range(procs):
                try:
                    status, payload = results.get(timeout=_TIMEOUT_S)
                except queue.Empty:
                    raise TimeoutError("a load worker did not report") from None
                if status != "ok":
                    raise RuntimeError(f"a load worker failed: {payload}")
                worker_spans, worker_cpu = payload
                spans += worker_spans
                client_cpu += worker_cpu
            out.append(
                Batch(
                    calls=per_thread * connections,
                    wall_ns=_wall(spans),
                    client_cpu_ns=client_cpu,
                    daemon_cpu_ns=cpu_ns(daemon_pid) - daemon0,
                    server_cpu_ns=cpu_ns(server_pid) - server0,
                )
            )
        for worker in workers:
            worker.join(_TIMEOUT_S)
    finally:
        barrier.abort()
        for worker in workers:
            if worker.is_alive():
                worker.terminate()
                worker.join(5)
        results.close()
    return out


def _wall(spans: Sequence[tuple[int, int]]) -> int:
    return max(end for _, end in spans) - min(start for start, _ in spans)
