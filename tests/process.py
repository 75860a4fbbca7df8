"""The real ``memorizzd`` executable as a subprocess: the one helper that tests
(``tests.harness``) and benchmarks (``bench.harness``) share.

The daemon under test reads nothing of the host's: ``argv()`` always names a
config file of its own (an empty one, written by ``start()``, unless the caller
gives one), a socket and a state directory under ``base``. Without ``--config``
the daemon would read ``/etc/memorizzd/memorizzd.toml`` when it exists (the
packaged default) and serve that host's servers to the test.
``tests/daemon/test_process.py`` holds this.

Only the standard library and the memorizz client: benchmark worker processes
import this module, and they must start fast and stay small.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Final

from memorizz.api.errors import DaemonUnreachableError
from memorizz.client import Client

ROOT: Final = Path(__file__).resolve().parent.parent
DAEMON_EXE: Final = str(Path(sys.executable).with_name("memorizzd"))
MEMORIZZCTL: Final = str(Path(sys.executable).with_name("memorizzctl"))
"""The installed command-line client, beside the interpreter (the venv's)."""
"""The installed ``memorizzd`` entry point of this interpreter's environment."""
READY_TIMEOUT_S: Final = 60.0
"""How long a test waits for a server to be ``ready``: a real start (an SDK
server imports ``mcp``, seconds of CPU) on a host the whole suite loads. Only
a failing test waits it out."""
OWN_CONFIG: Final = "empty-config.toml"
"""The empty config ``start()`` writes in ``base`` when none is given."""
EMPTY_CONFIG: Final = (
    "# written by tests/process.py: no servers, nothing of the host's\n"
)


def empty_config(base: str) -> str:
    """``OWN_CONFIG`` written in ``base``: for a ``memorizzd`` started by hand,
    so that it never reads the host's /etc/memorizzd/memorizzd.toml."""
    path = os.path.join(base, OWN_CONFIG)
    os.makedirs(base, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(EMPTY_CONFIG)
    return path


_pause: Final = threading.Event()  # never set: wait() is an interruptible sleep


def wait_until(
    predicate: Callable[[], bool],
    *,
    timeout: float = 20.0,
    what: str = "",
    alive: Callable[[], None] | None = None,
    every: float = 0.02,
) -> None:
    """Poll a condition another process owns (bounded); ``alive`` raises if
    waiting is futile. Prefer awaiting an event when the code is in-process."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if alive is not None:
            alive()
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout:g} s waiting for {what or predicate}"
            )
        _pause.wait(every)


def daemon_argv(
    base: str, *extra: str, config: str | None = None, log_level: str = "debug"
) -> list[str]:
    """``memorizzd`` with everything under ``base``: its socket ``d.sock``, its
    state ``state/`` and its config (``OWN_CONFIG`` there unless ``config``
    is given)."""
    return [
        DAEMON_EXE,
        "--config",
        config or os.path.join(base, OWN_CONFIG),
        "--socket",
        os.path.join(base, "d.sock"),
        "--state-dir",
        os.path.join(base, "state"),
        "--log-level",
        log_level,
        *extra,
    ]


class DaemonProcess:
    """One ``memorizzd`` with its own socket, state directory and config file.

    ``config``: a TOML file to serve (default: an empty one in ``base``).
    ``env``: the daemon's environment (default: this process's, so a test's
    ``monkeypatch.setenv`` reaches it). ``new_session``: its own session, so a
    Ctrl-C reaches only the benchmark, which then stops the daemon in order.
    """

    def __init__(
        self,
        base: str,
        extra_args: Sequence[str] = (),
        *,
        config: str | None = None,
        log_level: str = "debug",
        log_name: str = "daemon.log",
        env: Mapping[str, str] | None = None,
        new_session: bool = False,
    ) -> None:
        extra = list(extra_args)
        if "--config" in extra:  # the older spelling of config=
            at = extra.index("--config")
            config = extra[at + 1]
            del extra[at : at + 2]
        self.base = base
        self.extra_args = extra
        self.socket = os.path.join(base, "d.sock")
        self.state_dir = os.path.join(base, "state")
        self.config = config or os.path.join(base, OWN_CONFIG)
        self._own_config = config is None
        self.log_level = log_level
        self.log_path = os.path.join(base, log_name)
        self.env = env
        self.new_session = new_session
        self.proc: subprocess.Popen[bytes] | None = None
        self.returncode: int | None = None

    def argv(self) -> list[str]:
        return daemon_argv(
            self.base,
            *self.extra_args,
            config=self.config,
            log_level=self.log_level,
        )

    def start(self, *, timeout: float = 20.0) -> DaemonProcess:
        """Start it and wait until its socket answers ``daemon/hello``."""
        if self._own_config:
            Path(self.config).write_text(EMPTY_CONFIG)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                cwd=ROOT,
                env=dict(os.environ if self.env is None else self.env),
                start_new_session=self.new_session,
            )
        wait_until(
            self.answers, timeout=timeout, what="the daemon socket", alive=self.check
        )
        return self

    def answers(self) -> bool:
        try:
            with Client(self.socket) as c:
                c.hello("memorizz-tests")
        except DaemonUnreachableError:
            return False
        return True

    def check(self) -> None:
        """Raise if the daemon has exited."""
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(
                f"memorizzd exited with {self.proc.returncode}:\n{self.log_tail()}"
            )

    def client(self) -> Client:
        return Client(self.socket)

    def log(self) -> str:
        try:
            return Path(self.log_path).read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 20) -> str:
        return "\n".join(self.log().splitlines()[-lines:])

    def wait_ready(self, name: str, timeout: float = READY_TIMEOUT_S) -> None:
        """Until server ``name`` is ``ready``; past ``timeout``, the failure
        says the server's last status and the daemon's last log lines."""
        seen: list[object] = []

        def ready() -> bool:
            with self.client() as c:
                status = c.server_status(name)[0]
            seen[:] = [status]
            return status.state == "ready"

        try:
            wait_until(
                ready, timeout=timeout, what=f"server {name} ready", alive=self.check
            )
        except AssertionError as exc:
            raise AssertionError(
                f"{exc}; its last status: {seen[0] if seen else None}\n"
                f"{self.log_tail()}"
            ) from None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        """Signal it (SIGTERM) and wait; past ``timeout`` SIGKILL it and raise
        ``subprocess.TimeoutExpired``."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            self.returncode = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.returncode = self.proc.wait()
            raise
        return self.returncode

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid
