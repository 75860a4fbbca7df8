"""Throughput: many socket clients, each with one call outstanding at a time.

``connections`` blocking ``memorizz.Client``s are spread over ``procs`` worker
processes (``connections / procs`` threads each). A thread spends nearly all
of its time blocked in ``recv`` with the GIL released, so threads are honest
here: on the 2-vCPU dev VM, 12 runs of 3 x 3,000 calls with 1, 2 and 4
processes gave the same rates within the noise (850-1,435 calls/s) and
55-70 us of client CPU per call against ~570 us in the daemon; 32 processes
only raised the client CPU (~110 us per call). The default is 2 x 16. The
workers' CPU per call is measured and reported with every run, so one can see
that the client side is not the bottleneck.

Each batch: every worker connects and warms up, its threads wait on one
cross-process event, the parent sets it, then each thread makes ``per_thread``
calls and reports when its first call started and its last call ended
(``perf_counter_ns`` is CLOCK_MONOTONIC, comparable across processes). A
batch's wall time is the latest end minus the earliest start.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import signal
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


def _echo(client: Client, server: str = "echo") -> None:
    result = client.call_tool(server, "echo", {"text": TEXT})
    if result.is_error or result.content[0].get("text") != TEXT:
        raise RuntimeError(f"unexpected echo result: {result!r}")


def _worker(
    socket_path: str,
    server: str,
    threads: int,
    per_thread: int,
    gos: list[Any],
    results: Any,
) -> None:
    """One worker process: ``threads`` connections, one timed batch per ``go`` event."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C: the parent terminates us
    clients = [Client(socket_path) for _ in range(threads)]
    try:
        for client in clients:
            for _ in range(_WARMUP_CALLS):
                _echo(client, server)
        with ThreadPoolExecutor(threads) as pool:
            for go in gos:
                cpu0 = time.process_time_ns()
                futures = [
                    pool.submit(_timed_calls, client, server, per_thread, go)
                    for client in clients
                ]
                results.put(("ready", None))
                spans = [future.result() for future in futures]
                results.put(("ok", (spans, time.process_time_ns() - cpu0)))
    except BaseException as exc:
        results.put(("error", repr(exc)))
        raise
    finally:
        for client in clients:
            client.close()


def _timed_calls(client: Client, server: str, n: int, go: Any) -> tuple[int, int]:
    if not go.wait(_TIMEOUT_S):
        raise TimeoutError("no go from the parent")
    first = time.perf_counter_ns()
    for _ in range(n):
        _echo(client, server)
    return first, time.perf_counter_ns()


def _receive(results: Any, workers: Sequence[Any], expected: str) -> Any:
    """The next message from the workers; raise at once if one of them died."""
    deadline = time.monotonic() + _TIMEOUT_S
    while True:
        try:
            status, payload = results.get(timeout=0.2)
        except queue.Empty:
            for worker in workers:
                if worker.exitcode not in (None, 0):
                    raise RuntimeError(
                        f"load worker {worker.name} exited with code {worker.exitcode}"
                    ) from None
            if time.monotonic() > deadline:
                raise TimeoutError("the load workers stopped reporting") from None
            continue
        if status == "error":
            raise RuntimeError(f"a load worker failed: {payload}")
        if status != expected:
            raise RuntimeError(f"load worker said {status!r}, expected {expected!r}")
        return payload


def run_batches(
    socket_path: str,
    *,
    calls: int,
    connections: int,
    procs: int,
    batches: int,
    daemon_pid: int,
    server_pid: int,
    server: str = "echo",
) -> list[Batch]:
    """``batches`` batches of ``calls`` echo calls over ``connections`` connections."""
    if connections % procs:
        raise ValueError("connections must be a multiple of procs")
    threads = connections // procs
    per_thread = max(1, calls // connections)
    ctx = mp.get_context("spawn")  # never fork: the parent has threads
    gos = [ctx.Event() for _ in range(batches)]
    inboxes = [ctx.Queue() for _ in range(procs)]  # one each: messages stay in order
    workers = [
        ctx.Process(
            target=_worker,
            args=(socket_path, server, threads, per_thread, gos, inbox),
            name=f"bench-load-{i}",
            daemon=True,
        )
        for i, inbox in enumerate(inboxes)
    ]
    out: list[Batch] = []
    try:
        for worker in workers:
            worker.start()
        for go in gos:
            for inbox in inboxes:
                _receive(inbox, workers, "ready")  # connected, warm, waiting
            daemon0, server0 = cpu_ns(daemon_pid), cpu_ns(server_pid)
            go.set()
            spans: list[tuple[int, int]] = []
            client_cpu = 0
            for inbox in inboxes:
                worker_spans, worker_cpu = _receive(inbox, workers, "ok")
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
        for go in gos:
            go.set()  # release any worker still waiting
        for worker in workers:
            if worker.is_alive():
                worker.terminate()
                worker.join(5)
        for inbox in inboxes:
            inbox.close()
            inbox.join_thread()
    return out


def _wall(spans: Sequence[tuple[int, int]]) -> int:
    return max(end for _, end in spans) - min(start for start, _ in spans)
