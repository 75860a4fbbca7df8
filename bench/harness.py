"""A real memorizzd as a subprocess (tests/process.py's, shared with the tests),
/proc readings, and small statistics helpers.

Only the standard library and the memorizz client: benchmark worker processes
import this module, and they must start fast and stay small.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final

from tests import process

from memorizz.api import methods as m
from memorizz.client import Client

BENCH_DIR: Final = Path(__file__).resolve().parent
ROOT: Final = BENCH_DIR.parent
ECHO_SERVER: Final = str(BENCH_DIR / "echo_server.py")
HTTP_SERVER: Final = str(ROOT / "tests" / "mcp_server.py")
"""The tests' MCP server: ``python tests/mcp_server.py http PORT`` (Streamable HTTP)."""
TEXT: Final = "hello from the memorizz benchmark"
"""The argument of every echo call; the reply is checked against it."""

_CLK_TCK: Final = os.sysconf("SC_CLK_TCK")
_pause_event: Final = threading.Event()  # never set: wait() is an interruptible sleep


def pause(seconds: float) -> None:
    """Sleep in plain synchronous code (time.sleep is banned project-wide)."""
    _pause_event.wait(seconds)


def wait_until(
    predicate: Callable[[], bool],
    *,
    timeout_s: float,
    what: str,
    alive: Callable[[], None] | None = None,
) -> None:
    """Poll ``predicate`` every 50 ms until it holds; ``alive`` raises if waiting is futile."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if alive is not None:
            alive()
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up waiting for {what} after {timeout_s:.0f} s")
        pause(0.05)


# --- /proc ------------------------------------------------------------------


def cpu_ns(pid: int) -> int:
    """User + system CPU time of a process (all its threads), in ns (10 ms ticks)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1_000_000_000 // _CLK_TCK


def task_cpu_ns(pid: int) -> int:
    """CPU time of a process's threads, in ns, to the nanosecond: the sum of
    their ``/proc/PID/task/TID/schedstat`` run times (a thread that ended
    meanwhile drops out: for a daemon whose work is on its event loop's
    thread). ``cpu_ns`` counts 10 ms ticks, too coarse for a difference of
    microseconds per call."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as f:
                total += int(f.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            continue  # the thread ended
    return total


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def is_running(pid: int) -> bool:
    """True if the process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in (b"Z", b"X")


# --- statistics ---------------------------------------------------------------


def median(samples: Sequence[int | float]) -> float:
    return float(statistics.median(samples))


def p99(samples: Sequence[int | float]) -> float:
    ordered = sorted(samples)
    return float(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))])


# --- the daemon ---------------------------------------------------------------


def echo_spec(name: str) -> m.ServerSpec:
    return m.ServerSpec(
        name=name, transport="stdio", command=sys.executable, args=[ECHO_SERVER]
    )


class DaemonProcess(process.DaemonProcess):
    """One ``memorizzd`` in ``workdir/tag``: the tests' helper (tests/process.py:
    its own socket, state directory and empty config file, so a host's
    /etc/memorizzd/memorizzd.toml adds nothing to the benchmark), quiet, in a
    session of its own (a Ctrl-C reaches only the benchmark, which then stops
    the daemon in order), with the echo servers' pids kept for ``orphans()``.
    ``config``: the text of its config file (default: an empty one).
    """

    def __init__(self, workdir: str, tag: str, *, config: str | None = None) -> None:
        base = os.path.join(workdir, tag)
        os.makedirs(base)
        path = None
        if config is not None:
            path = os.path.join(base, "memorizzd.toml")
            with open(path, "w", encoding="utf-8") as f:
                f.write(config)
        super().__init__(
            base,
            config=path,
            log_level="warning",
            log_name="stderr.log",
            new_session=True,
        )
        self.server_pids: set[int] = set()

    def start(self, *, timeout: float = 30.0) -> DaemonProcess:
        super().start(timeout=timeout)
        return self

    def add_servers(
        self, client: Client, names: Sequence[str], *, timeout_s: float
    ) -> None:
        """Add echo servers and wait until every one of them is ``ready``."""
        for name in names:
            client.add_server(echo_spec(name))
        wanted = set(names)

        def all_ready() -> bool:
            states = {s.name: s for s in client.server_status() if s.name in wanted}
            for status in states.values():
                if status.state == "failed":
                    raise RuntimeError(f"{status.name} failed: {status.last_error}")
            ready = [s for s in states.values() if s.state == "ready"]
            self.server_pids.update(s.pid for s in ready if s.pid is not None)
            return len(ready) == len(wanted)

        wait_until(
            all_ready,
            timeout_s=timeout_s,
            what=f"{len(names)} server(s) to be ready",
            alive=self.check,
        )

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        """SIGTERM and wait; SIGKILL only if it does not exit in time (no raise)."""
        if self.proc is None:
            return 0
        if self.returncode is None:
            try:
                super().stop(sig, timeout)
            except subprocess.TimeoutExpired:
                pass  # killed; returncode set
        assert self.returncode is not None
        return self.returncode

    def orphans(self) -> list[int]:
        """Server processes still running after the daemon stopped (should be none)."""
        return sorted(pid for pid in self.server_pids if is_running(pid))
