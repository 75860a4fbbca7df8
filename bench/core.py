"""The core benchmark: memorizzd against the bare MCP SDK, one trivial stdio tool.

    .venv/bin/python -m bench.core [--n 2000] [--cold 10] [--quick]

(a) the floor: ``echo`` on a warm in-process SDK session (bench/floor.py);
(b) the same call through memorizz.Client -> Unix socket -> memorizzd -> warm session;
(c) a cold call without the daemon: a fresh interpreter that imports mcp, spawns
    the server, initializes, calls once and exits, timed from outside;
(d) throughput of 32 socket connections, each with one call outstanding, and
    the same with the echo server run as 2 replicas (``replicas = 2``);
(d') the same against a minimal non-SDK echo server (bench/tiny_echo_server.py):
    an SDK server spends ~1 ms of CPU per call, which caps (d) near 1,000/s on
    2 cores whatever the daemon does; (d') shows the daemon's own capacity;
(e) the daemon's RSS with 20 warm stdio servers (their own processes not counted),
    then with one Streamable HTTP server more (which loads the MCP SDK);
(f) the MCP face (bench/face.py): the official SDK ``Client`` (mode "legacy",
    the handshake era, and the default "auto") over ``stdio_client`` running
    ``memorizzctl --socket S mcp serve`` -> the daemon's face -> the warm echo
    server of (b), against the same client over ``stdio_client`` spawning the
    echo server itself; ABBA blocks as (a)/(b), right after them. In the
    legacy mode's face blocks, for context, the same client through the face
    scoped (``--server``) to an echo server the daemon speaks 2025-11-25 to:
    the daemon speaks 2026-07-28 to the warm one, and an SDK server does more
    per request in that era (each carries the client's stamp), which the
    direct legacy client does not ask of it;
(g) a fresh daemon's RSS with 100 raw sessions (``initialize``, held open) on
    the operator's face (its mcp.sock has the operator socket's fixed cap, 128
    per uid; an agent face has its profile's limits, 32 per uid by default);
(h) the metrics' cost on the hot path: warm sequential calls as (b), on two
    daemons started alike but for ``[metrics] enabled`` (true: calls counted
    and metrics.sock served; false: neither), tracing off in both, each with the minimal echo
    server of (d') (an SDK server's ~1 ms of CPU and its jitter per call would
    bury a difference of microseconds; the minimal one leaves the daemon's own
    cost in the round trip); ABBA blocks as (a)/(b), four times as many (a
    call is shorter). The daemons' CPU is read to the nanosecond
    (``/proc/PID/task/*/schedstat``). After the blocks, the "on" daemon's
    scrape must count every call, and the "off" one must serve no metrics.
    Context: bench/metrics.py's per-call numbers, with a small n: the
    counting's own cost, which (h) cannot resolve from the noise of a round
    trip. And, on the "off" daemon, ABBA blocks of the same calls to the
    minimal server and to one answering after ``LATE_MS`` (a ``time.sleep``,
    as long as an SDK server's work): the daemon does the same work for both,
    so any difference in its CPU per call is the cost of waking after a
    long idle on this machine, which (b) pays and (h) does not.

Bridge start-up: the installed ``memorizzctl mcp serve``, from process start
until it has connected to an MCP socket (a listener of this process stands in
for the daemon's ``mcp.sock``: the bridge's own start-up is the subject).

One-shot CLI: the installed ``memorizzctl mcp call echo echo`` (the console
script of pyproject's [project.scripts], as users run it), timed from outside,
process start to exit, against the warm echo server of (b). Its bytecode is
cached as an installed package's is (in the run's temporary directory, since
PYTHONDONTWRITEBYTECODE may be set here); a few unmeasured runs write it.

Context rows, no targets: a cold thin client that goes through the daemon
(start, import memorizz, one call); the floor's own throughput (one SDK
session, 32 calls in flight); the CPU per call of client, daemon and server,
read from /proc (10 ms ticks), and the CPU-bound ceilings they imply.

(a) and (b) run in alternating blocks (ABBA order) so that drift in a noisy
machine hits both alike; medians and p99 are over all samples. Progress goes
to stderr, the table to stdout. It is a benchmark, not a test: it prints
PASS/MISS per target and exits 0 unless something crashed (130 on Ctrl-C,
after stopping every daemon and removing the temporary directory).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.metadata
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from types import FrameType
from typing import Final

import msgspec

from bench import load
from bench.harness import (
    ECHO_SERVER,
    HTTP_SERVER,
    ROOT,
    TEXT,
    DaemonProcess,
    cpu_ns,
    echo_spec,
    median,
    p99,
    pause,
    rss_bytes,
    task_cpu_ns,
    wait_until,
)
from memorizz.api import methods as m
from memorizz.client import Client

TINY_ECHO_SERVER: Final = os.path.join(
    os.path.dirname(ECHO_SERVER), "tiny_echo_server.py"
)

# Targets: b/a and b-a at the median, c/b at the median, calls/s, bytes.
MAX_RATIO_B_A: Final = 1.0
MAX_DAEMON_CPU_US: Final = 150.0
MIN_RATIO_C_B: Final = 50.0
MIN_THROUGHPUT: Final = 5000.0
"""(d'): against the minimal server, the daemon's own capacity."""
MAX_RSS: Final = 40_000_000
"""(e): with ``rss_servers`` warm stdio servers and no HTTP server."""
MAX_RSS_HTTP: Final = 80_000_000
"""(e): the same plus one Streamable HTTP server (the SDK loaded)."""
REPLICAS: Final = 2
MAX_ONE_SHOT_MS: Final = 40.0
MAX_BRIDGE_START_MS: Final = 100.0
ONE_SHOT_WARMUP: Final = 3
MEMORIZZCTL: Final = os.path.join(os.path.dirname(sys.executable), "memorizzctl")

MAX_RATIO_FACE: Final = 1.2
"""(f): SDK client through the face / the same client direct, at the median."""
FACE_MODES: Final = ("legacy", "auto")
"""(f): the SDK Client's modes: the handshake era, and its default (discover first)."""
HELD_SERVER: Final = "echo-held"
"""(f) context: an echo server the daemon speaks 2025-11-25 to (``protocol = "legacy"``)."""
FACE_SESSIONS: Final = 100
MAX_FACE_SESSIONS_RSS: Final = 15_000_000
"""(g): the daemon's RSS growth with ``FACE_SESSIONS`` face sessions open."""
MAX_METRICS_US: Final = 5.0
"""(h): metrics on - off, per warm call, at the median (the issue's budget)."""
METRICS_CONFIGS: Final = {
    "on": "[metrics]\nenabled = true\n\n[tracing]\nenabled = false\n",
    "off": "[metrics]\nenabled = false\n\n[tracing]\nenabled = false\n",
}
"""(h): the two daemons' config files; nothing else differs."""
METRICS_SCALE: Final = 4
LATE_MS: Final = 2
"""(h) context: the minimal server's delay before each answer, in the late
blocks (about an SDK echo server's time per call here)."""
LATE_BLOCKS: Final = 4
"""(h) context: ABBA blocks of each, at once and late."""
"""(h): calls and blocks per daemon, as a multiple of (a)/(b)'s."""
MICRO_N: Final = 20_000
"""(h) context: bench/metrics.py's calls per block (its own default: 200,000)."""
READY_TIMEOUT_S: Final = 120.0
COLD_TIMEOUT_S: Final = 60.0


class Options(msgspec.Struct, kw_only=True):
    n: int
    cold: int
    blocks: int
    calls: int
    batches: int
    connections: int
    procs: int
    rss_servers: int
    one_shot: int


class Sequential(msgspec.Struct, kw_only=True):
    """Latency samples (ns) and CPU spent per call (ns) by each process involved."""

    samples: list[int] = []
    block_medians: list[float] = []
    client_cpu_ns: int = 0
    daemon_cpu_ns: int | None = None
    server_cpu_ns: int | None = None
    protocol: str | None = None
    """The MCP protocol version the session negotiated."""


class FaceRun(msgspec.Struct, kw_only=True):
    """(f) in one SDK Client mode: through the face, and direct."""

    mode: str
    tool: str
    """The name the face listed the echo tool under."""
    face: Sequential
    direct: Sequential
    bridge_cpu_ns: int | None = None
    held: Sequential | None = None
    """(legacy, context) through the face to an echo server the daemon holds at
    2025-11-25, in the same blocks: the face's cost without the one of the
    upstream's protocol era (a 2026-07-28 SDK server does more per request)."""


class FaceRss(msgspec.Struct, kw_only=True):
    """(g): the daemon's RSS with 0, 1 and ``sessions`` face sessions open."""

    sessions: int
    before: int
    one: int
    after: int
    socket: str
    """Which face, and the cap that lets ``sessions`` in."""


class MetricsCost(msgspec.Struct, kw_only=True):
    """(h): the same warm call on a daemon with metrics on and one with them off."""

    on: Sequential
    off: Sequential
    counted: int | None
    """The "on" daemon's ``memorizz_calls_total`` for the calls, from a scrape."""
    calls: int
    """The calls made on each daemon, warm-up included."""
    off_served: bool
    """Whether the "off" daemon served metrics anyway (it must not)."""
    micro: dict[str, float] = {}
    """bench/metrics.py's per-call ns by hook (context)."""
    micro_n: int = 0
    micro_off: str = ""
    """The key of ``micro``'s baseline (an empty hook)."""
    at_once: Sequential | None = None
    late: Sequential | None = None
    """(context) the "off" daemon's calls to the minimal server, and to one
    answering after ``LATE_MS``, in ABBA blocks of their own."""


class Results(msgspec.Struct, kw_only=True):
    a: Sequential
    b: Sequential
    cold_direct: list[int]
    cold_via_daemon: list[int]
    one_shot: list[int]
    """The installed ``memorizzctl mcp call``, process start to exit (ns)."""
    interpreter: list[int]
    """``python -c pass`` from the same venv, alternating with ``one_shot``."""
    bridge_start: list[int] = []
    """The installed ``memorizzctl mcp serve``, process start to connected (ns)."""
    floor_rates: list[float]
    batches: list[load.Batch]
    tiny_batches: list[load.Batch]
    """(d') the same load against a minimal non-SDK echo server."""
    replica_batches: list[load.Batch]
    """(d) against the echo server with ``REPLICAS`` processes behind its name."""
    rss_after_load: int
    rss: dict[int, int]
    rss_http: int
    """(e): after the ``rss_servers`` stdio servers, one HTTP server more."""
    exit_codes: list[int | None]
    orphans: list[int]
    daemon_log: list[str]
    load: tuple[float, float]
    """The 1-minute load average before and after: other work on the machine skews all."""
    face: list[FaceRun] = []
    face_rss: FaceRss | None = None
    metrics: MetricsCost | None = None


def parse_args(argv: Sequence[str] | None) -> Options:
    parser = argparse.ArgumentParser(
        prog="python -m bench.core",
        description="memorizzd core benchmark (see the module docstring)",
    )
    parser.add_argument(
        "--n", type=int, help="sequential calls for (a) and for (b) (2000; --quick 200)"
    )
    parser.add_argument("--cold", type=int, help="cold runs for (c) (10; --quick 3)")
    parser.add_argument(
        "--blocks",
        type=int,
        default=4,
        help="blocks each of (a) and (b), interleaved ABBA (4)",
    )
    parser.add_argument(
        "--calls", type=int, help="calls per throughput batch (4000; --quick 1000)"
    )
    parser.add_argument("--batches", type=int, default=3, help="throughput batches (3)")
    parser.add_argument(
        "--procs",
        type=int,
        default=2,
        help="client processes sharing the 32 connections of (d) (2)",
    )
    parser.add_argument(
        "--rss-servers", type=int, help="warm servers for (e) (20; --quick 5)"
    )
    parser.add_argument(
        "--one-shot",
        type=int,
        help="runs of the one-shot memorizzctl mcp call (50; --quick 10)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: n=200, cold=3, 1000 throughput calls, 5 RSS servers",
    )
    args = parser.parse_args(argv)
    quick = args.quick
    options = Options(
        n=args.n or (200 if quick else 2000),
        cold=args.cold or (3 if quick else 10),
        blocks=args.blocks,
        calls=args.calls or (1000 if quick else 4000),
        batches=args.batches,
        connections=32,
        procs=args.procs,
        rss_servers=args.rss_servers or (5 if quick else 20),
        one_shot=args.one_shot or (10 if quick else 50),
    )
    if not 1 <= options.blocks <= options.n:
        parser.error("--blocks must be between 1 and --n")
    if options.cold < 1 or options.batches < 1:
        parser.error("--cold and --batches must be at least 1")
    if options.connections % options.procs:
        parser.error(f"--procs must divide {options.connections}")
    return options


def progress(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


# --- the measurements -----------------------------------------------------------


def _server_pid(client: Client, name: str) -> int:
    pid = client.server_status(name)[0].pid
    if pid is None:
        raise RuntimeError(f"server {name} has no pid")
    return pid


def _child_pid(needle: str) -> int | None:
    """A child of this process whose command line contains ``needle``."""
    me = str(os.getpid())
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                ppid = f.read().rsplit(b")", 1)[1].split()[1]
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if ppid.decode() == me and needle.encode() in cmdline:
            return int(entry)
    return None


def _socket_calls(client: Client, n: int, server: str = "echo") -> list[int]:
    samples: list[int] = []
    arguments = {"text": TEXT}
    for _ in range(n):
        started = time.perf_counter_ns()
        result = client.call_tool(server, "echo", arguments)
        samples.append(time.perf_counter_ns() - started)
        if result.is_error or result.content[0].get("text") != TEXT:
            raise RuntimeError(f"unexpected echo result: {result!r}")
    return samples


def _timed_block(
    into: Sequential,
    run: Callable[[], list[int]],
    *,
    daemon_pid: int | None,
    server_pid: int | None,
    cpu: Callable[[int], int] = cpu_ns,
) -> None:
    client0 = time.process_time_ns()
    daemon0 = cpu(daemon_pid) if daemon_pid else 0
    server0 = cpu(server_pid) if server_pid else 0
    samples = run()
    into.samples += samples
    into.block_medians.append(median(samples))
    into.client_cpu_ns += time.process_time_ns() - client0
    if daemon_pid:
        into.daemon_cpu_ns = (into.daemon_cpu_ns or 0) + cpu(daemon_pid) - daemon0
    if server_pid:
        into.server_cpu_ns = (into.server_cpu_ns or 0) + cpu(server_pid) - server0


def sequential(
    options: Options, daemon: DaemonProcess, client: Client
) -> tuple[Sequential, Sequential, list[float]]:
    """(a) and (b) in ABBA blocks; then the floor's own throughput, for context."""
    from bench.floor import floor_session  # imports mcp: keep it out of workers

    a, b = Sequential(), Sequential()
    per_block = options.n // options.blocks
    warmup = min(200, max(20, options.n // 10))
    daemon_server = _server_pid(client, "echo")
    b.protocol = client.server_status("echo")[0].protocol_version
    with floor_session() as floor:
        a.protocol = floor.protocol_version
        floor_server = _child_pid(ECHO_SERVER)
        progress(f"(a)/(b): {warmup} warm-up calls each")
        floor.sequential(warmup)
        _socket_calls(client, warmup)
        order = ("abba" * options.blocks)[: 2 * options.blocks]  # abbaabba...
        for step, which in enumerate(order, 1):
            if which == "a":
                _timed_block(
                    a,
                    lambda: floor.sequential(per_block),
                    daemon_pid=None,
                    server_pid=floor_server,
                )
            else:
                _timed_block(
                    b,
                    lambda: _socket_calls(client, per_block),
                    daemon_pid=daemon.pid,
                    server_pid=daemon_server,
                )
            progress(f"(a)/(b): block {step}/{len(order)} ({which}) done")
        progress(f"(d) context: floor throughput, {options.batches} batches")
        floor.throughput(min(options.calls, 500), options.connections)  # warm-up
        rates = [
            floor.throughput(options.calls, options.connections)
            for _ in range(options.batches)
        ]
    return a, b, rates


def face_sequential(
    options: Options, daemon: DaemonProcess, client: Client, workdir: str
) -> list[FaceRun]:
    """(f): per SDK Client mode, a warm ``tools/call`` through the installed
    bridge (``memorizzctl --socket S mcp serve``) and the daemon's face to its
    warm echo server, against the same client straight to an echo server of
    its own; ABBA blocks, as (a)/(b)."""
    from bench.face import face_and_direct  # imports mcp: keep it out of workers

    per_block = options.n // options.blocks
    warmup = min(200, max(20, options.n // 10))
    daemon_server = _server_pid(client, "echo")
    client.add_server(
        msgspec.structs.replace(echo_spec(HELD_SERVER), protocol="legacy")
    )
    wait_until(
        lambda: client.server_status(HELD_SERVER)[0].state == "ready",
        timeout_s=READY_TIMEOUT_S,
        what=f"{HELD_SERVER} to be ready",
    )
    held_server = _server_pid(client, HELD_SERVER)
    runs: list[FaceRun] = []
    with open(os.path.join(workdir, "face-stderr.log"), "a") as errlog:
        for mode in FACE_MODES:
            held_name = HELD_SERVER if mode == "legacy" else None
            with face_and_direct(daemon.socket, mode, errlog, held_name) as (
                pair,
                bridge,
                own,
            ):
                face = Sequential(protocol=pair.face.protocol_version)
                direct = Sequential(protocol=pair.direct.protocol_version)
                run = FaceRun(mode=mode, tool=pair.face.tool, face=face, direct=direct)
                held = pair.held
                if held is not None:
                    run.held = Sequential(
                        protocol=client.server_status(HELD_SERVER)[0].protocol_version
                    )
                progress(f"(f) {mode}: {warmup} warm-up calls each")
                pair.face.sequential(warmup)
                pair.direct.sequential(warmup)
                if held is not None:
                    held.sequential(warmup)
                bridge0 = cpu_ns(bridge) if bridge else 0
                order = ("abba" * options.blocks)[: 2 * options.blocks]
                for step, which in enumerate(order, 1):
                    if which == "a":
                        _timed_block(
                            direct,
                            lambda: pair.direct.sequential(per_block),
                            daemon_pid=None,
                            server_pid=own,
                        )
                    else:
                        _timed_block(
                            face,
                            lambda: pair.face.sequential(per_block),
                            daemon_pid=daemon.pid,
                            server_pid=daemon_server,
                        )
                        if held is not None and run.held is not None:
                            _timed_block(
                                run.held,
                                functools.partial(held.sequential, per_block),
                                daemon_pid=daemon.pid,
                                server_pid=held_server,
                            )
                    progress(f"(f) {mode}: block {step}/{len(order)} ({which}) done")
                if bridge:
                    run.bridge_cpu_ns = cpu_ns(bridge) - bridge0
                runs.append(run)
    client.remove_server(HELD_SERVER)
    return runs


def face_sessions_rss(daemon: DaemonProcess) -> FaceRss:
    """(g): a fresh daemon with the echo server warm; its RSS before, with one,
    and with ``FACE_SESSIONS`` raw sessions open on the operator's face (its
    mcp.sock has the operator socket's fixed caps, 128 connections in all and
    per uid; an agent face has its profile's ``limits``, 64 and 32 by default)."""
    from bench.face import open_session
    from memorizzd.listeners import face_socket_path
    from memorizzd.rpc.server import OPERATOR_MAX_CONNECTIONS

    daemon.start()
    path = face_socket_path(daemon.socket)
    with Client(daemon.socket) as client:
        client.hello("memorizz-bench")
        daemon.add_servers(client, ["echo"], timeout_s=READY_TIMEOUT_S)
    pause(0.2)
    before = rss_bytes(daemon.pid)
    with contextlib.ExitStack() as held:
        held.enter_context(open_session(path))
        pause(0.2)
        one = rss_bytes(daemon.pid)
        for _ in range(FACE_SESSIONS - 1):
            held.enter_context(open_session(path))
        pause(0.2)
        after = rss_bytes(daemon.pid)
        progress(f"(g): {FACE_SESSIONS} face sessions open")
    return FaceRss(
        sessions=FACE_SESSIONS,
        before=before,
        one=one,
        after=after,
        socket=f"operator face mcp.sock (cap {OPERATOR_MAX_CONNECTIONS} per uid)",
    )


def _tiny_spec(name: str, delay_ms: int = 0) -> m.ServerSpec:
    """The minimal non-SDK echo server of (d') and (h) (``delay_ms``: it
    sleeps that long before each answer)."""
    delay = ["--delay-ms", str(delay_ms)] if delay_ms else []
    return m.ServerSpec(
        name=name,
        transport="stdio",
        command=sys.executable,
        args=[TINY_ECHO_SERVER, *delay],
        protocol="legacy",
    )


def _add_tiny(client: Client, name: str, delay_ms: int = 0) -> int:
    """Add the minimal echo server, wait until it is ready; its pid."""
    client.add_server(_tiny_spec(name, delay_ms))
    wait_until(
        lambda: client.server_status(name)[0].state == "ready",
        timeout_s=READY_TIMEOUT_S,
        what="the tiny echo server",
    )
    return _server_pid(client, name)


def _scraped_calls(socket_path: str, server: str) -> int | None:
    """``server``'s calls in the daemon's ``memorizz_calls_total``, as the
    installed ``memorizzctl daemon metrics`` reads it; None if it cannot
    (no metrics served)."""
    done = subprocess.run(
        [MEMORIZZCTL, "--socket", socket_path, "daemon", "metrics"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=COLD_TIMEOUT_S,
        check=False,
    )
    if done.returncode != 0:
        return None
    label = f'server="{server}"'.encode()
    return sum(
        int(float(line.rsplit(b" ", 1)[1]))
        for line in done.stdout.splitlines()
        if line.startswith(b"memorizz_calls_total{") and label in line
    )


def metrics_cost(
    options: Options, daemons: dict[str, DaemonProcess], stack: contextlib.ExitStack
) -> MetricsCost:
    """(h): warm sequential calls to the minimal echo server on the daemon with
    metrics on and the one with them off (``METRICS_CONFIGS``), in ABBA blocks;
    then a scrape of each, and bench/metrics.py's per-call numbers."""
    from bench.metrics import OFF, measure  # prometheus_client, daemon metrics

    clients: dict[str, Client] = {}
    servers: dict[str, int] = {}
    for which, daemon in daemons.items():
        daemon.start()
        clients[which] = stack.enter_context(Client(daemon.socket))
        clients[which].hello("memorizz-bench")
        servers[which] = _add_tiny(clients[which], "tiny")
        daemon.server_pids.add(servers[which])
    runs = {which: Sequential() for which in daemons}
    blocks = options.blocks * METRICS_SCALE
    per_block = options.n // options.blocks
    warmup = min(200, max(20, options.n // 10))
    progress(f"(h): {warmup} warm-up calls each, metrics on and off")
    for client in clients.values():
        _socket_calls(client, warmup, "tiny")
    order = ("abba" * blocks)[: 2 * blocks]
    for step, letter in enumerate(order, 1):
        which = "off" if letter == "a" else "on"
        _timed_block(
            runs[which],
            functools.partial(_socket_calls, clients[which], per_block, "tiny"),
            daemon_pid=daemons[which].pid,
            server_pid=servers[which],
            cpu=task_cpu_ns,
        )
        if step % 8 == 0 or step == len(order):
            progress(f"(h): block {step}/{len(order)} done")
    at_once, late = _late_blocks(
        daemons["off"], clients["off"], servers["off"], per_block, warmup
    )
    counted = _scraped_calls(daemons["on"].socket, "tiny")
    off_served = _scraped_calls(daemons["off"].socket, "tiny") is not None
    for which, daemon in daemons.items():
        clients[which].close()
        daemon.stop()
    progress(f"(h) context: bench/metrics.py, 3 blocks of {MICRO_N:,} calls")
    return MetricsCost(
        on=runs["on"],
        off=runs["off"],
        counted=counted,
        calls=warmup + len(runs["on"].samples),
        off_served=off_served,
        micro=measure(MICRO_N, 3),
        micro_n=MICRO_N,
        micro_off=OFF,
        at_once=at_once,
        late=late,
    )


def _late_blocks(
    daemon: DaemonProcess, client: Client, server_pid: int, per_block: int, warmup: int
) -> tuple[Sequential, Sequential]:
    """(h) context: the same calls to the minimal server and to one that
    answers after ``LATE_MS``, in ABBA blocks on one daemon."""
    late_pid = _add_tiny(client, "tiny-late", LATE_MS)
    daemon.server_pids.add(late_pid)
    _socket_calls(client, warmup // 4, "tiny-late")
    runs = {"tiny": Sequential(), "tiny-late": Sequential()}
    pids = {"tiny": server_pid, "tiny-late": late_pid}
    progress(f"(h) context: {LATE_BLOCKS} blocks each, answers at once and late")
    for letter in ("abba" * LATE_BLOCKS)[: 2 * LATE_BLOCKS]:
        which = "tiny" if letter == "a" else "tiny-late"
        _timed_block(
            runs[which],
            functools.partial(_socket_calls, client, per_block, which),
            daemon_pid=daemon.pid,
            server_pid=pids[which],
            cpu=task_cpu_ns,
        )
    return runs["tiny"], runs["tiny-late"]


def cold(options: Options, socket_path: str) -> tuple[list[int], list[int]]:
    """(c), alternating with a cold thin client that goes through the daemon."""
    from bench.floor import COLD_DIRECT, COLD_VIA_DAEMON

    direct: list[int] = []
    via_daemon: list[int] = []
    for i in range(options.cold):
        for code, target, into in (
            (COLD_DIRECT, ECHO_SERVER, direct),
            (COLD_VIA_DAEMON, socket_path, via_daemon),
        ):
            started = time.perf_counter_ns()
            done = subprocess.run(
                [sys.executable, "-c", code, target, TEXT],
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=COLD_TIMEOUT_S,
                check=False,
            )
            into.append(time.perf_counter_ns() - started)
            if done.returncode != 0:
                tail = done.stderr.decode(errors="replace").strip().splitlines()[-5:]
                raise RuntimeError(
                    f"a cold run failed with code {done.returncode}: " + "\n".join(tail)
                )
        progress(f"(c): cold run {i + 1}/{options.cold} done")
    return direct, via_daemon


def one_shot_cli(
    options: Options, socket_path: str, workdir: str
) -> tuple[list[int], list[int]]:
    """The installed ``memorizzctl mcp call``, timed from outside (start to exit),
    alternating with the bare interpreter (``python -c pass``) for context."""
    argv = [MEMORIZZCTL, "--socket", socket_path, "mcp", "call", "echo", "echo"]
    argv += ["--arguments", msgspec.json.encode({"text": TEXT}).decode()]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = os.path.join(workdir, "pycache")
    one_shot: list[int] = []
    interpreter: list[int] = []
    for i in range(ONE_SHOT_WARMUP + options.one_shot):
        for command, expected, into in (
            (argv, TEXT.encode() + b"\n", one_shot),
            ([sys.executable, "-c", "pass"], b"", interpreter),
        ):
            started = time.perf_counter_ns()
            done = subprocess.run(
                command,
                env=env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=COLD_TIMEOUT_S,
                check=False,
            )
            elapsed = time.perf_counter_ns() - started
            if done.returncode != 0 or done.stdout != expected:
                tail = done.stderr.decode(errors="replace").strip().splitlines()[-5:]
                raise RuntimeError(
                    f"{command[0]} failed with code {done.returncode}: "
                    + "\n".join(tail)
                )
            if i >= ONE_SHOT_WARMUP:
                into.append(elapsed)
    return one_shot, interpreter


def bridge_startup(options: Options, workdir: str) -> list[int]:
    """The installed ``memorizzctl mcp serve``, timed from process start until
    its connection reaches a listener standing in for the daemon's mcp.sock;
    the listener then hangs up, which ends the bridge (checked: status 0)."""
    path = os.path.join(workdir, "mcp.sock")
    argv = [MEMORIZZCTL, "mcp", "serve", "--mcp-socket", path]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = os.path.join(workdir, "pycache")
    samples: list[int] = []
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(path)
        listener.listen()
        listener.settimeout(COLD_TIMEOUT_S)
        for i in range(ONE_SHOT_WARMUP + options.one_shot):
            started = time.perf_counter_ns()
            with subprocess.Popen(
                argv,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            ) as proc:
                try:
                    conn, _ = listener.accept()
                except TimeoutError:
                    proc.kill()
                    raise
                elapsed = time.perf_counter_ns() - started
                conn.close()
                _, err = proc.communicate(timeout=COLD_TIMEOUT_S)
            if proc.returncode != 0:
                tail = err.decode(errors="replace").strip().splitlines()[-5:]
                raise RuntimeError(
                    f"memorizzctl mcp serve failed with code {proc.returncode}: "
                    + "\n".join(tail)
                )
            if i >= ONE_SHOT_WARMUP:
                samples.append(elapsed)
    return samples


def resident(options: Options, daemon: DaemonProcess) -> tuple[dict[int, int], int]:
    """(e): a fresh daemon's RSS with 0, 1 and ``rss_servers`` warm stdio echo
    servers; then with one Streamable HTTP server more (the SDK loaded)."""
    daemon.start()
    rss: dict[int, int] = {}
    names = [f"echo{i}" for i in range(options.rss_servers)]
    with Client(daemon.socket) as client:
        client.hello("memorizz-bench")
        rss[0] = rss_bytes(daemon.pid)
        added = 0
        for count in sorted({1, options.rss_servers}):
            daemon.add_servers(client, names[added:count], timeout_s=READY_TIMEOUT_S)
            added = count
            progress(f"(e): {count} server(s) ready")
            rss[count] = rss_bytes(daemon.pid)
        with _http_server() as url:
            client.add_server(
                m.ServerSpec(
                    name="web",
                    transport="streamable_http",
                    url=url,
                    allow_private_network=True,  # a loopback server
                )
            )
            wait_until(
                lambda: client.server_status("web")[0].state == "ready",
                timeout_s=READY_TIMEOUT_S,
                what="the HTTP server",
            )
            progress("(e): an HTTP server ready")
            rss_http = rss_bytes(daemon.pid)
            client.remove_server("web")
    return rss, rss_http


@contextlib.contextmanager
def _http_server() -> Iterator[str]:
    """The test MCP server over Streamable HTTP on a free loopback port; its URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, HTTP_SERVER, "http", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}/mcp"

        def listening() -> bool:
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", port)) == 0

        wait_until(listening, timeout_s=READY_TIMEOUT_S, what="the HTTP server")
        yield url
    finally:
        server.terminate()
        server.wait(timeout=10)


def run(options: Options, workdir: str, stack: contextlib.ExitStack) -> Results:
    load_before = os.getloadavg()[0]
    daemon = DaemonProcess(workdir, "main")
    stack.callback(daemon.stop)
    progress("starting memorizzd and the echo server")
    daemon.start()
    client = stack.enter_context(Client(daemon.socket))
    client.hello("memorizz-bench")
    daemon.add_servers(client, ["echo"], timeout_s=READY_TIMEOUT_S)

    a, b, floor_rates = sequential(options, daemon, client)
    face = face_sequential(options, daemon, client, workdir)
    progress(
        f"(d): {options.batches} x {options.calls} calls over "
        f"{options.connections} connections ({options.procs} processes)"
    )

    def load_on(server: str) -> list[load.Batch]:
        return load.run_batches(
            daemon.socket,
            calls=options.calls,
            connections=options.connections,
            procs=options.procs,
            batches=options.batches,
            daemon_pid=daemon.pid,
            server_pid=_server_pid(client, server),
            server=server,
        )

    batches = load_on("echo")
    progress("(d'): the same against a minimal (non-SDK) echo server")
    _add_tiny(client, "tiny")
    tiny_batches = load_on("tiny")
    progress(f"(d) with {REPLICAS} replicas of the echo server")
    client.add_server(
        m.ServerSpec(
            name="echo-replicas",
            transport="stdio",
            command=sys.executable,
            args=[ECHO_SERVER],
            replicas=REPLICAS,
        )
    )
    wait_until(
        lambda: client.server_status("echo-replicas")[0].state == "ready",
        timeout_s=READY_TIMEOUT_S,
        what="the replicated echo server",
    )
    replica_batches = load_on("echo-replicas")
    rss_after_load = rss_bytes(daemon.pid)
    cold_direct, cold_via_daemon = cold(options, daemon.socket)
    progress(f"one-shot CLI: {options.one_shot} runs of memorizzctl mcp call")
    one_shot, interpreter = one_shot_cli(options, daemon.socket, workdir)
    progress(f"bridge start-up: {options.one_shot} runs of memorizzctl mcp serve")
    bridge_start = bridge_startup(options, workdir)
    client.close()
    daemon.stop()

    metrics_daemons = {
        which: DaemonProcess(workdir, f"metrics-{which}", config=config)
        for which, config in METRICS_CONFIGS.items()
    }
    for metrics_daemon in metrics_daemons.values():
        stack.callback(metrics_daemon.stop)
    metrics = metrics_cost(options, metrics_daemons, stack)
    rss_daemon = DaemonProcess(workdir, "rss")
    stack.callback(rss_daemon.stop)
    rss, rss_http = resident(options, rss_daemon)
    rss_daemon.stop()
    face_daemon = DaemonProcess(workdir, "face")
    stack.callback(face_daemon.stop)
    progress(f"(g): daemon RSS with {FACE_SESSIONS} face sessions")
    face_rss = face_sessions_rss(face_daemon)
    face_daemon.stop()
    daemons = [daemon, *metrics_daemons.values(), rss_daemon, face_daemon]
    return Results(
        a=a,
        b=b,
        cold_direct=cold_direct,
        cold_via_daemon=cold_via_daemon,
        one_shot=one_shot,
        interpreter=interpreter,
        bridge_start=bridge_start,
        floor_rates=floor_rates,
        batches=batches,
        tiny_batches=tiny_batches,
        replica_batches=replica_batches,
        rss_after_load=rss_after_load,
        rss=rss,
        rss_http=rss_http,
        exit_codes=[d.returncode for d in daemons],
        orphans=[pid for d in daemons for pid in d.orphans()],
        daemon_log=[line for d in daemons for line in d.log_tail(5).splitlines()],
        load=(load_before, os.getloadavg()[0]),
        face=face,
        face_rss=face_rss,
        metrics=metrics,
    )


# --- the report -------------------------------------------------------------------


def _us(ns: float) -> str:
    return f"{ns / 1000:,.0f} µs"


def _ms(ns: float) -> str:
    return f"{ns / 1e6:,.1f} ms"


def _mb(n: float) -> str:
    return f"{n / 1e6:.1f} MB"


def _cpu(total_ns: int | None, calls: int) -> str:
    return "-" if total_ns is None else f"{total_ns / calls / 1000:.0f}"


def header(options: Options) -> str:
    versions = ", ".join(
        f"{name} {importlib.metadata.version(name)}" for name in ("mcp", "msgspec")
    )
    return (
        f"memorizzd core benchmark: nproc {len(os.sched_getaffinity(0))}, "
        f"Python {platform.python_version()}, {versions}\n"
        f"N={options.n} sequential calls ({options.blocks} ABBA blocks each), "
        f"cold runs {options.cold}, throughput {options.batches} x {options.calls} "
        f"calls over {options.connections} connections "
        f"({options.procs} processes x {options.connections // options.procs} threads), "
        f"RSS with {options.rss_servers} servers"
    )


def _rates(rates: Sequence[float]) -> str:
    listed = ", ".join(f"{x:,.0f}" for x in rates)
    return f"{median(rates):,.0f} calls/s (median of {len(rates)}: {listed})"


def _latency_rows(r: Results) -> list[str]:
    lines = [
        f"{'':54}{'median':>11}{'p99':>11}{'n':>6}   CPU/call µs: client daemon server"
    ]
    for label, seq in (
        ("(a) floor: in-process SDK session -> stdio", r.a),
        ("(b) memorizz.Client -> socket -> daemon -> stdio", r.b),
    ):
        n = len(seq.samples)
        cpu = "".join(
            f"{_cpu(x, n):>7}"
            for x in (seq.client_cpu_ns, seq.daemon_cpu_ns, seq.server_cpu_ns)
        )
        lines.append(
            f"{label:54}{_us(median(seq.samples)):>11}{_us(p99(seq.samples)):>11}"
            f"{n:>6}   {cpu:>32}"
        )
    for label, samples in (
        ("(c) cold: python -c, import mcp, spawn, init, 1 call", r.cold_direct),
        ("    context: cold thin client through the daemon", r.cold_via_daemon),
        ("one-shot memorizzctl mcp call (start to exit)", r.one_shot),
        ("    context: the interpreter alone (python -c pass)", r.interpreter),
        ("memorizzctl mcp serve start-up (start to connected)", r.bridge_start),
    ):
        lines.append(
            f"{label:54}{_ms(median(samples)):>11}{_ms(p99(samples)):>11}"
            f"{len(samples):>6}"
        )
    return lines


def _face_rows(r: Results) -> list[str]:
    """(f) and (g), with the latency table's columns."""
    lines: list[str] = []
    for run in r.face:
        rows = (
            (f"(f) {run.mode}: SDK -> memorizzctl mcp serve -> face", run.face),
            (f"    {run.mode}: the same SDK client -> stdio, direct", run.direct),
        )
        for label, seq in rows:
            n = len(seq.samples)
            cpu = "".join(
                f"{_cpu(x, n):>7}"
                for x in (seq.client_cpu_ns, seq.daemon_cpu_ns, seq.server_cpu_ns)
            )
            lines.append(
                f"{label:54}{_us(median(seq.samples)):>11}{_us(p99(seq.samples)):>11}"
                f"{n:>6}   {cpu:>32}"
            )
        if run.held is not None:
            seq = run.held
            n = len(seq.samples)
            cpu = "".join(
                f"{_cpu(x, n):>7}"
                for x in (seq.client_cpu_ns, seq.daemon_cpu_ns, seq.server_cpu_ns)
            )
            label = f"    {run.mode}: ... face -> upstream held at {seq.protocol}"
            lines.append(
                f"{label:54}{_us(median(seq.samples)):>11}{_us(p99(seq.samples)):>11}"
                f"{n:>6}   {cpu:>32}"
            )
        lines.append(
            f"    {run.mode}: tool {run.tool!r}; protocol face {run.face.protocol}, "
            f"direct {run.direct.protocol}; bridge CPU/call "
            f"{_cpu(run.bridge_cpu_ns, len(run.face.samples))} µs"
        )
    if r.face_rss is not None:
        g = r.face_rss
        lines.append(
            f"(g) daemon RSS, {g.sessions} face sessions (initialize, held open; "
            f"{g.socket}): before {_mb(g.before)}, with 1 {_mb(g.one)}, "
            f"with {g.sessions} {_mb(g.after)}"
        )
    return lines


def _metrics_difference(h: MetricsCost) -> tuple[float, list[float], float]:
    """(h): on - off per call at the median (µs), per block pair (µs), and
    the daemon's CPU on - off per call (µs)."""
    diff = (median(h.on.samples) - median(h.off.samples)) / 1000
    pairs = [
        (on - off) / 1000
        for off, on in zip(h.off.block_medians, h.on.block_medians, strict=True)
    ]
    cpu = (
        (h.on.daemon_cpu_ns or 0) / len(h.on.samples)
        - (h.off.daemon_cpu_ns or 0) / len(h.off.samples)
    ) / 1000
    return diff, pairs, cpu


def _metrics_rows(r: Results) -> list[str]:
    """(h), with the latency table's columns (CPU from schedstat, to the ns)."""
    h = r.metrics
    if h is None:
        return []
    lines: list[str] = []
    rows = [
        ("(h) metrics on, tracing off: socket -> daemon -> tiny", h.on),
        ("    metrics off, tracing off: the same", h.off),
    ]
    if h.at_once is not None and h.late is not None:
        rows += [
            ("    context, metrics off: the same, other blocks", h.at_once),
            (f"    ... tiny answering after {LATE_MS} ms (sleeps)", h.late),
        ]
    for label, seq in rows:
        n = len(seq.samples)
        cpu = "".join(
            f"{_cpu(x, n):>7}"
            for x in (seq.client_cpu_ns, seq.daemon_cpu_ns, seq.server_cpu_ns)
        )
        lines.append(
            f"{label:54}{_us(median(seq.samples)):>11}{_us(p99(seq.samples)):>11}"
            f"{n:>6}   {cpu:>32}"
        )
    diff, pairs, cpu_diff = _metrics_difference(h)
    listed = ", ".join(f"{x:+.1f}" for x in pairs)
    daemon_cpu = ", ".join(
        f"{which} {(seq.daemon_cpu_ns or 0) / len(seq.samples) / 1000:.1f}"
        for which, seq in (("on", h.on), ("off", h.off))
    )
    counted = "none served" if h.counted is None else f"{h.counted:,}"
    spread = max(pairs) - min(pairs)
    if spread > MAX_METRICS_US:
        listed += (
            f" (spread {spread:,.1f} µs, more than the {MAX_METRICS_US:.0f} µs budget:"
            " this run resolves the difference only to about that)"
        )
    lines += [
        f"    on - off per call: {diff:+.1f} µs at the median; daemon CPU/call µs "
        + f"{daemon_cpu} (on - off {cpu_diff:+.1f})",
        "    on - off per block pair (block medians, µs; their spread is noise): "
        + listed,
        f"    metrics on: the scrape counted {counted} of {h.calls:,} calls; "
        + f"metrics off: metrics served: {'yes' if h.off_served else 'no'}",
    ]
    if h.micro:
        off = h.micro[h.micro_off]
        micro = ", ".join(
            f"{name} {ns:,.0f} ns (+{ns - off:,.0f})" for name, ns in h.micro.items()
        )
        lines.append(
            f"    context, bench/metrics.py per call (median of 3 blocks of "
            f"{h.micro_n:,}): {micro}"
        )
    return lines


def _late_targets(r: Results) -> list[tuple[str, str, str, bool | None]]:
    """(b)'s context: the daemon's CPU per call for the same work, its
    upstream answering at once and after ``LATE_MS`` ((h)'s late blocks)."""
    h = r.metrics
    if h is None or h.at_once is None or h.late is None:
        return []
    at_once, late = (
        (seq.daemon_cpu_ns or 0) / len(seq.samples) / 1000
        for seq in (h.at_once, h.late)
    )
    return [
        (
            f"    (h) at once / after {LATE_MS} ms (context)",
            f"{at_once:,.0f} / {late:,.0f} µs",
            "",
            None,
        )
    ]


def _metrics_targets(r: Results) -> list[tuple[str, str, str, bool | None]]:
    h = r.metrics
    if h is None:
        return []
    diff, pairs, cpu_diff = _metrics_difference(h)
    return [
        (
            "(h) metrics on - off per call",
            f"{diff:+.1f} µs",
            f"<= {MAX_METRICS_US:.0f} µs",
            diff <= MAX_METRICS_US,
        ),
        (
            "    block pairs, min..max (noise)",
            f"{min(pairs):+.0f}..{max(pairs):+.0f}",
            "",
            None,
        ),
        ("    daemon CPU on - off (context)", f"{cpu_diff:+.1f} µs", "", None),
    ]


def _face_targets(r: Results) -> list[tuple[str, str, str, bool | None]]:
    targets: list[tuple[str, str, str, bool | None]] = []
    for run in r.face:
        ratio = median(run.face.samples) / median(run.direct.samples)
        targets.append(
            (
                f"(f) {run.mode}: face/direct, median",
                f"{ratio:.2f}",
                f"<= {MAX_RATIO_FACE}",
                ratio <= MAX_RATIO_FACE,
            )
        )
        ratio99 = p99(run.face.samples) / p99(run.direct.samples)
        targets.append(("    face/direct at p99 (context)", f"{ratio99:.2f}", "", None))
        if run.held is not None:
            held = median(run.held.samples) / median(run.direct.samples)
            targets.append(
                (
                    f"    ... upstream held at {run.held.protocol} (context)",
                    f"{held:.2f}",
                    "",
                    None,
                )
            )
    if r.face_rss is not None:
        grown = r.face_rss.after - r.face_rss.before
        targets.append(
            (
                f"(g) RSS, {r.face_rss.sessions} face sessions",
                f"+{_mb(grown)}",
                f"+<= {_mb(MAX_FACE_SESSIONS_RSS)}",
                grown <= MAX_FACE_SESSIONS_RSS,
            )
        )
    return targets


def _cpu_per_call(batches: Sequence[load.Batch]) -> dict[str, float]:
    calls = sum(batch.calls for batch in batches)
    return {
        who: sum(getattr(b, f"{who}_cpu_ns") for b in batches) / calls
        for who in ("client", "daemon", "server")
    }


def _load_rows(options: Options, r: Results) -> list[str]:
    cpu = _cpu_per_call(r.batches)
    cores = len(os.sched_getaffinity(0))
    rss = ", ".join(
        f"{k} server{'s' if k != 1 else ''} {_mb(v)}" for k, v in r.rss.items()
    )
    ceilings = (
        f"daemon {1e9 / cpu['daemon']:,.0f}/s (one event loop), "
        f"echo server {1e9 / cpu['server']:,.0f}/s (one process), "
        f"all three on {cores} cores {cores * 1e9 / sum(cpu.values()):,.0f}/s"
    )
    return [
        f"(d) throughput, {options.connections} socket connections: "
        + _rates([batch.rate for batch in r.batches]),
        "    CPU/call µs: " + ", ".join(f"{k} {v / 1000:.0f}" for k, v in cpu.items()),
        f"    CPU-bound ceilings from these: {ceilings}",
        f"    context: floor, one in-process SDK session, {options.connections} in "
        + f"flight: {_rates(r.floor_rates)}",
        f"    with {REPLICAS} replicas (replicas = {REPLICAS}): "
        + _rates([batch.rate for batch in r.replica_batches])
        + " (server CPU: the first replica only)",
        f"(d') throughput, {options.connections} socket connections, minimal non-SDK "
        + "echo server: "
        + _rates([batch.rate for batch in r.tiny_batches]),
        "    CPU/call µs: "
        + ", ".join(
            f"{k} {v / 1000:.0f}" for k, v in _cpu_per_call(r.tiny_batches).items()
        ),
        f"(e) daemon RSS: {rss}; and one HTTP server more {_mb(r.rss_http)}",
        f"    context: the main daemon after (d): {_mb(r.rss_after_load)}",
    ]


def _target_rows(options: Options, r: Results) -> list[str]:
    a, b = median(r.a.samples), median(r.b.samples)
    a99, b99 = p99(r.a.samples), p99(r.b.samples)
    c = median(r.cold_direct)
    tiny_rate = median([batch.rate for batch in r.tiny_batches])
    daemon_us = (r.b.daemon_cpu_ns or 0) / len(r.b.samples) / 1000
    rss = r.rss[options.rss_servers]
    targets = [
        (
            "b/a at the median",
            f"{b / a:.2f}",
            f"<= {MAX_RATIO_B_A}",
            b / a <= MAX_RATIO_B_A,
        ),
        ("    b/a at p99 (context)", f"{b99 / a99:.2f}", "", None),
        (
            "daemon CPU per warm call (b)",
            f"{daemon_us:,.0f} µs",
            f"<= {MAX_DAEMON_CPU_US:.0f} µs",
            daemon_us <= MAX_DAEMON_CPU_US,
        ),
        *_late_targets(r),
        (
            "c/b at the median",
            f"{c / b:,.0f}",
            f">= {MIN_RATIO_C_B:.0f}",
            c / b >= MIN_RATIO_C_B,
        ),
        (
            "throughput (d'), minimal server",
            f"{tiny_rate:,.0f}/s",
            f">= {MIN_THROUGHPUT:,.0f}/s",
            tiny_rate >= MIN_THROUGHPUT,
        ),
        (
            f"    (d) {REPLICAS} replicas / 1 (context)",
            f"{median([x.rate for x in r.replica_batches]) / median([x.rate for x in r.batches]):.2f}",
            "",
            None,
        ),
        (
            "one-shot memorizzctl mcp call",
            _ms(median(r.one_shot)),
            f"<= {MAX_ONE_SHOT_MS:.0f} ms",
            median(r.one_shot) / 1e6 <= MAX_ONE_SHOT_MS,
        ),
        (
            "memorizzctl mcp serve start-up",
            _ms(median(r.bridge_start)),
            f"<= {MAX_BRIDGE_START_MS:.0f} ms",
            median(r.bridge_start) / 1e6 <= MAX_BRIDGE_START_MS,
        ),
        (
            f"daemon RSS, {options.rss_servers} stdio servers",
            _mb(rss),
            f"<= {_mb(MAX_RSS)}",
            rss <= MAX_RSS,
        ),
        (
            "    ... and an HTTP server",
            _mb(r.rss_http),
            f"<= {_mb(MAX_RSS_HTTP)}",
            r.rss_http <= MAX_RSS_HTTP,
        ),
    ]
    targets += _face_targets(r)
    targets += _metrics_targets(r)
    lines = [f"{'target':34}{'value':>12}{'goal':>14}"]
    lines += [
        f"{name:34}{value:>12}{goal:>14}  {'' if ok is None else 'PASS' if ok else 'MISS'}"
        for name, value, goal, ok in targets
    ]
    return lines


def report(options: Options, r: Results) -> str:
    b = median(r.b.samples)
    lines = [header(options), ""]
    lines += _latency_rows(r)
    lines.append("")
    lines += _load_rows(options, r)
    lines.append("")
    lines += _face_rows(r)
    lines.append("")
    if r.metrics is not None:
        lines += _metrics_rows(r)
        lines.append("")
    lines += _target_rows(options, r)
    lines.append("")
    pairs = ", ".join(
        f"{(b_block - a_block) / 1000:.0f}"
        for a_block, b_block in zip(r.a.block_medians, r.b.block_medians, strict=True)
    )
    codes = ", ".join(str(code) for code in r.exit_codes)
    context = (
        f"context: cold thin client through the daemon / b = "
        f"{median(r.cold_via_daemon) / b:,.0f}; one-shot memorizzctl / cold thin "
        f"client = {median(r.one_shot) / median(r.cold_via_daemon):.2f}; "
        f"MCP protocol (a) {r.a.protocol}, "
        f"(b) {r.b.protocol}; 1-min load average before/after "
        f"{r.load[0]:.2f}/{r.load[1]:.2f}"
    )
    cleanup = (
        f"cleanup: daemon exit codes {codes}; "
        f"server processes left behind: {len(r.orphans)}"
    )
    lines += [
        f"b - a per block pair (block medians, µs; their spread is noise): {pairs}",
        context,
        cleanup,
    ]
    if r.daemon_log:
        lines.append("daemon stderr (warning level and up), last lines:")
        lines += [f"  {line}" for line in r.daemon_log]
    return "\n".join(lines)


_interrupted: list[int] = []


def _interrupt(signum: int, frame: FrameType | None) -> None:
    """Ctrl-C and SIGTERM: raise once; while cleaning up, further signals are ignored."""
    if not _interrupted:
        _interrupted.append(signum)
        raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _interrupt)
    workdir = tempfile.mkdtemp(prefix="mzb-")  # short: AF_UNIX paths are <= 107 bytes
    try:
        with contextlib.ExitStack() as stack:
            results = run(options, workdir, stack)
    except BaseException:
        # The interrupt may surface wrapped (an ExceptionGroup from the portal,
        # a RuntimeError from an import it hit); the flag says what happened.
        if not _interrupted:
            raise
        progress("interrupted; daemons stopped, temporary files removed")
        return 130
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(report(options, results), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
