"""A real memorizzd as a subprocess, /proc readings, and small statistics helpers.

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

from memorizz.api import methods as m
from memorizz.api.errors import DaemonUnreachableError
from memorizz.client import Client

BENCH_DIR: Final = Path(__file__).resolve().parent
ROOT: Final = BENCH_DIR.parent
ECHO_SERVER: Final = str(BENCH_DIR / "echo_server.py")
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


def _daemon_argv() -> list[str]:
    script = Path(sys.executable).with_name("memorizzd")
    return [str(script)] if script.exists() else [sys.executable, "-m", "memorizzd"]


def echo_spec(name: str) -> m.ServerSpec:
    return m.ServerSpec(
        name=name, transport="stdio", command=sys.executable, args=[ECHO_SERVER]
    )


class DaemonProcess:
    """One ``memorizzd`` with its own socket, state dir and (empty) config file.

    It runs in its own session so that a Ctrl-C reaches only the benchmark,
    which then stops the daemon in order (SIGTERM, wait).
    """

    def __init__(self, workdir: str, tag: str) -> None:
        self.dir = os.path.join(workdir, tag)
        os.makedirs(self.dir)
        self.socket = os.path.join(self.dir, "d.sock")
        self.state_dir = os.path.join(self.dir, "state")
        self.config = os.path.join(self.dir, "memorizzd.toml")
        self.log_path = os.path.join(self.dir, "stderr.log")
        self.proc: subprocess.Popen[bytes] | None = None
        self.server_pids: set[int] = set()
        self.returncode: int | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, *, timeout_s: float = 30.0) -> None:
        # An explicit empty config: a host's /etc/memorizzd/memorizzd.toml must not
        # add its servers to the benchmark.
        Path(self.config).write_text("# memorizz benchmark: no servers\n")
        argv = [
            *_daemon_argv(),
            "--config",
            self.config,
            "--socket",
            self.socket,
            "--state-dir",
            self.state_dir,
            "--log-level",
            "warning",
        ]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                cwd=ROOT,
                start_new_session=True,
            )
        wait_until(
            self._answers,
            timeout_s=timeout_s,
            what="the daemon socket",
            alive=self.check,
        )

    def _answers(self) -> bool:
        try:
            with Client(self.socket) as client:
                client.hello("memorizz-bench")
        except DaemonUnreachableError:
            return False
        return True

    def check(self) -> None:
        """Raise if the daemon has exited."""
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(
                f"memorizzd exited with code {self.proc.returncode}:\n{self.log_tail()}"
            )

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = Path(self.log_path).read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

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

    def stop(self, *, timeout_s: float = 30.0) -> None:
        """SIGTERM and wait; SIGKILL only if it does not exit in time."""
        if self.proc is None or self.returncode is not None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.returncode = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            self.returncode = -int(signal.SIGKILL)

    def orphans(self) -> list[int]:
        """Server processes still running after the daemon stopped (should be none)."""
        return sorted(pid for pid in self.server_pids if is_running(pid))
