"""Our stdio transport: one MCP server subprocess, spoken to over its pipes.

Why not the SDK's ``stdio_client``: it hides the pid, sends stderr to a file
descriptor rather than a log, assembles lines quadratically with no size bound,
and kills the process group only on escalation, so descendants of a server that
exits by itself leak. This one

* spawns the resolved argv directly (no shell), in a process group of its own
  with no controlling terminal, with exactly the environment it is given;
* reads stdout with a linear, bounded line splitter: a line longer than
  ``max_message_bytes`` is discarded as it streams (never buffered) and, as
  soon as it is known to answer one of our requests (its id may come last),
  that request fails with ``result_too_large`` (``limits.OversizeMessage``);
  a UTF-8 byte order mark at the very start of stdout is skipped, as lenient
  clients do (one anywhere else is the line's, and makes it junk);
* logs stderr line by line under the server's name (lines truncated at 4 KiB,
  at most 50 lines a second; the rest are counted, not logged, and the count
  is logged when its second ends, even if the server then falls silent:
  ``LogBudget``, which bounds the session's log of junk on stdout too);
* reports a ``cwd`` it cannot enter as such (``WorkingDirectoryError``), and
  a script whose ``#!`` interpreter is missing (``InterpreterNotFoundError``),
  not as a missing executable;
* on exit closes stdin, waits, then SIGTERMs and SIGKILLs the whole process
  group, and always kills the group at the end, so no descendant survives;
* has the kernel SIGKILL the child when the daemon dies (``PR_SET_PDEATHSIG``):
  a daemon killed with SIGKILL stops nothing, and a server that stays up once
  its stdin closes outlived it for ever, beside the one the next start spawned.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import termios
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager, suppress
from typing import Final

import anyio

from memorizz.api.errors import DeadlineExceededError
from memorizzd.egress.oversize import OversizeMessage
from memorizzd.loop import Inbox, Outbox, call_later, now
from memorizzd.upstream.errors import ConnectionLost

log = logging.getLogger("memorizzd.upstream.stdio")
stderr_log = logging.getLogger("memorizzd.upstream.stderr")

STDERR_LINE_MAX: Final = 4096
STDERR_LINES_PER_S: Final = 50
EXIT_GRACE_S: Final = 2.0
TERM_GRACE_S: Final = 2.0
EXIT_POLL_S: Final = 0.2
"""How often a child's exit is polled for where there is no pidfd."""
STDIO_HANDSHAKE_MIN_S: Final = 5.0
"""A stdio server's start and handshake take at most ``max(timeout_s, this)``..."""
STDIO_HANDSHAKE_MAX_S: Final = 80.0
"""... doubled after each start that ran out of it, up to this: a server that is
merely slow to start (an interpreter importing a large SDK on a loaded host)
comes up on a later try instead of being killed at the same point for ever."""
_CHUNK: Final = 1 << 16
_BOM: Final = b"\xef\xbb\xbf"
"""UTF-8's byte order mark: skipped at the start of a server's stdout."""


def stdio_handshake_budget(budget_s: float, slow_starts: int) -> float:
    """A stdio server's start and handshake budget: ``budget_s`` (its
    ``timeout_s``), at least STDIO_HANDSHAKE_MIN_S, doubled for each start in a
    row that ran out of it, up to STDIO_HANDSHAKE_MAX_S (or ``budget_s``)."""
    base = max(budget_s, STDIO_HANDSHAKE_MIN_S)
    return min(base * 2.0 ** min(slow_starts, 16), max(base, STDIO_HANDSHAKE_MAX_S))


def no_handshake(
    budget_s: float, later_s: float | None = None
) -> DeadlineExceededError:
    """A start cut off at its handshake budget; ``later_s``: the next start's
    (named when it is longer: what an operator waits for next)."""
    said = f"no answer to the handshake within {budget_s:g} s (timed out"
    if later_s is not None and later_s > budget_s:
        said += f"; the next start has {later_s:g} s"
    return DeadlineExceededError(said + ")")


class WorkingDirectoryError(OSError):
    """The server's ``cwd`` could not be entered (``filename``: its path;
    ``errno``: ENOENT, ENOTDIR, EACCES...): the process never started."""


class InterpreterNotFoundError(FileNotFoundError):
    """The executable is there, but the interpreter its ``#!`` line names is
    not (``filename``: the interpreter; ``script``: the executable)."""

    def __init__(self, interpreter: str, script: str) -> None:
        super().__init__(errno.ENOENT, "interpreter not found", interpreter)
        self.script = script


def _interpreter(script: str) -> str | None:
    """The interpreter a ``#!`` line names (None: no such line, or unreadable)."""
    try:
        with open(script, "rb") as f:
            head = f.read(256)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    words = head[2:].split(b"\n", 1)[0].split()
    return words[0].decode("utf-8", "replace") if words else None


class LogBudget:
    """A flood's log lines, bounded: at most ``lines`` in each ``window_s``
    (a window opens with the first line after the last one ended); the rest
    are counted, not logged, and ``said_dropped(count)`` is called once for
    them, when their window ends (a loop timer: even if the source then
    falls silent) or at ``close``, whichever comes first."""

    __slots__ = (
        "_cancel",
        "_dropped",
        "_lines",
        "_opened",
        "_said",
        "_used",
        "_window_s",
    )

    def __init__(
        self, lines: int, window_s: float, said_dropped: Callable[[int], None]
    ) -> None:
        self._lines = lines
        self._window_s = window_s
        self._said = said_dropped
        self._opened = -math.inf
        self._used = 0
        self._dropped = 0
        self._cancel: Callable[[], None] | None = None
        """Cancels the timer that ends the window (set while lines are counted)."""

    def take(self) -> bool:
        """Whether one more line may be logged (False: it was counted instead)."""
        at = now()
        if at - self._opened >= self._window_s:
            self._end()
            self._opened = at
        if self._used < self._lines:
            self._used += 1
            return True
        self._dropped += 1
        if self._cancel is None:
            self._cancel = call_later(self._opened + self._window_s - at, self._end)
        return False

    def close(self) -> None:
        """The source is done: say how many were not logged (if any)."""
        self._end()

    def _end(self) -> None:
        cancel, self._cancel = self._cancel, None
        if cancel is not None:
            cancel()
        dropped, self._dropped = self._dropped, 0
        self._opened, self._used = -math.inf, 0
        if dropped:
            self._said(dropped)


_BASE_ENV_KEYS: Final = (
    "HOME",
    "LOGNAME",
    "PATH",
    "SHELL",
    "TERM",
    "USER",
    "LANG",
    "TZ",
)


def child_environment(
    env: Mapping[str, str], secret_env: Mapping[str, str] | None = None
) -> dict[str, str]:
    """A minimal base environment plus the server's own variables (and its
    secret ones, resolved from the vault); nothing else."""
    base = {k: v for k in _BASE_ENV_KEYS if (v := os.environ.get(k)) is not None}
    return base | dict(env) | dict(secret_env or {})


class StdioProcess:
    """What the upstream actor may know about the running child."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.pid: int | None = None
        self.exited = anyio.Event()
        self.returncode: int | None = None
        self.stdout_closed = anyio.Event()
        """Set when its session read the end of its stdout (``jsonrpc.open_session``)."""


def _line(raw: bytes | bytearray) -> str:
    return raw.decode(errors="replace").rstrip()


class StdioPipes:
    """The child's side of the talk: the lines it writes, and a way to write one.

    ``lines()`` yields each non-blank stdout line (without its newline), read
    in the task that iterates (no hop through another task), and for a line
    over the cap that answers one of our requests, the error reply in its
    place; it ends when stdout closes. ``write_now`` puts one message (its
    bytes end with a newline) whole into the child's stdin without waiting
    (``loop.Outbox``: the rest is written as the pipe takes it), so a call
    may be relayed from a callback; ``send`` also waits until it is written.
    """

    def __init__(
        self, name: str, stdout: int, stdin: int, max_message_bytes: int
    ) -> None:
        self._name = name
        self._stdout = Inbox(stdout)
        self._stdin_fd: int | None = stdin
        self._stdin = Outbox(stdin)
        self._max = max_message_bytes
        self._buffer = bytearray()
        """The line being read (``lines``)."""
        self._oversize: OversizeMessage | None = None
        """The oversize line being dropped (``lines``)."""
        self._head: bytes | None = b""
        """Stdout's first bytes, while it is not known yet whether they start
        with a byte order mark (None: known, and skipped if they did)."""

    def take_answers(self, taken: Callable[[bytes], bool]) -> None:
        """``taken`` may take whole lines in the loop's reader callback (the
        session's answers, which need no task): only when the reading task
        waits with nothing half read, so the order of lines is kept."""

        def take(data: bytes) -> bytes:
            if self._buffer or self._oversize is not None or self._head is not None:
                return data
            if not data.endswith(b"\n") or len(data) > self._max:
                return data
            return b"" if taken(data) else data

        self._stdout.taken = take

    def write_now(self, data: bytes) -> None:
        try:
            self._stdin.put(data)
        except OSError:
            raise ConnectionLost("the server's stdin is closed") from None

    def kept(self) -> int:
        """Bytes written for the child that its stdin has not taken yet."""
        return self._stdin.kept

    def has_room(self) -> bool:
        """Whether the child is keeping up (little is waiting for its stdin)."""
        return self._stdin.kept < _CHUNK

    async def send(self, data: bytes) -> None:
        self.write_now(data)
        try:
            await self._stdin.drained()
        except OSError:
            raise ConnectionLost("the server's stdin is closed") from None

    def close_stdout(self) -> None:
        """Stop reading the child's stdout (``lines`` ends)."""
        self._stdout.close()

    def close_stdin(self) -> None:
        """The child reads EOF (what was not written yet is dropped)."""
        self._stdin.close()
        fd, self._stdin_fd = self._stdin_fd, None
        if fd is not None:
            _close_fd(fd)

    async def lines(self) -> AsyncIterator[bytes]:
        buffer = self._buffer
        limit = self._max
        while chunk := await self._receive():
            if self._head is not None:
                chunk = self._skip_bom(chunk)
                if not chunk:
                    continue
            start = 0
            while True:
                end = chunk.find(b"\n", start)
                piece = chunk[start:] if end < 0 else chunk[start:end]
                if self._oversize is not None:
                    self._oversize.feed(piece)
                else:
                    buffer += piece
                    if len(buffer) > limit:
                        self._oversize = OversizeMessage(limit)
                        self._oversize.feed(bytes(buffer))
                        buffer.clear()
                if self._oversize is not None and (
                    reply := self._oversize.take_reply()
                ):
                    yield reply
                if end < 0:
                    break
                if self._oversize is not None:
                    log.warning("%s: %s", self._name, self._oversize.outcome())
                    self._oversize = None
                elif buffer.strip():
                    line = bytes(buffer)
                    buffer.clear()
                    yield line
                buffer.clear()
                start = end + 1
        log.debug("%s: stdout closed", self._name)

    def _skip_bom(self, chunk: bytes) -> bytes:
        """``chunk`` (stdout's first bytes, after those held back before it)
        without a leading byte order mark; b"" while too few are read to tell."""
        head = self._head + chunk if self._head else chunk
        if len(head) < len(_BOM) and _BOM.startswith(head):
            self._head = head  # the mark's first part: wait for the rest
            return b""
        self._head = None
        if not head.startswith(_BOM):
            return head
        log.info("%s: skipped a byte order mark at the start of stdout", self._name)
        return head[len(_BOM) :]

    async def _receive(self) -> bytes:
        try:
            return await self._stdout.receive()
        except OSError:
            return b""


async def _read_some(fd: int) -> bytes:
    """The pipe's next bytes, once there are any; b"" at EOF or once it is closed."""
    while True:
        try:
            return os.read(fd, _CHUNK)
        except BlockingIOError:
            try:
                await anyio.wait_readable(fd)
            except anyio.ClosedResourceError:
                return b""
        except OSError:
            return b""


_PR_SET_PDEATHSIG: Final = 1


def _child_setup() -> Callable[[], None] | None:
    """A ``preexec_fn`` (Linux): the child is SIGKILLed when the thread that
    forked it, the event loop's, ends: when the daemon dies (it checks its
    parent afterwards, in case the daemon died before the ``prctl``); and it
    gives up the daemon's controlling terminal, if the daemon has one (run
    from a shell), so that neither it nor anything it starts can open
    ``/dev/tty``.

    That is what a session of its own (``setsid``) gave it too, but a new
    session is also a new scheduling group where the kernel groups tasks by
    session (``CONFIG_SCHED_AUTOGROUP``, outside a CPU cgroup): each server
    then weighed as much as the daemon and all the rest of the host, and a
    call's hand-offs between the daemon and its server crossed groups
    (``scripts/bench``: a warm call ~5% slower). In the daemon's session the
    daemon and its servers are one group, as systemd's cgroup makes them."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    option, kill, zero = (
        ctypes.c_int(_PR_SET_PDEATHSIG),
        ctypes.c_ulong(signal.SIGKILL),
        ctypes.c_ulong(0),
    )
    parent = os.getpid()

    def set_up() -> None:
        prctl(option, kill, zero, zero, zero)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            tty = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY)
        except OSError:
            return  # no controlling terminal (under systemd: never one)
        try:
            fcntl.ioctl(tty, termios.TIOCNOTTY)  # not a session leader: only this one
        finally:
            os.close(tty)

    return set_up


def _spawn(
    argv: list[str], env: dict[str, str], cwd: str | None
) -> tuple[subprocess.Popen[bytes], int, int, int]:
    """The child, leading a process group of its own (stopping it signals the
    group), and our ends of its pipes (non-blocking)."""
    process = subprocess.Popen(  # noqa: S603 - argv resolved, no shell
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=cwd,
        process_group=0,
        preexec_fn=_child_setup(),  # noqa: PLW1509 - no lock taken
    )
    pipes = (process.stdin, process.stdout, process.stderr)
    fds = []
    for pipe in pipes:
        assert pipe is not None  # noqa: S101 - asked for above
        fd = os.dup(pipe.fileno())
        pipe.close()
        os.set_blocking(fd, False)
        fds.append(fd)
    process.stdin = process.stdout = process.stderr = None
    return process, fds[0], fds[1], fds[2]


def _close_fd(fd: int) -> None:
    anyio.notify_closing(fd)  # a task waiting on it wakes (ClosedResourceError)
    with suppress(OSError):
        os.close(fd)


@asynccontextmanager
async def stdio_pipes(
    argv: list[str],
    *,
    env: dict[str, str],
    cwd: str | None,
    max_message_bytes: int,
    process_info: StdioProcess,
) -> AsyncIterator[StdioPipes]:
    executable = shutil.which(argv[0], path=env.get("PATH"))
    if executable is None:
        raise FileNotFoundError(errno.ENOENT, "executable not found", argv[0])
    try:
        process, stdin, stdout, stderr = _spawn([executable, *argv[1:]], env, cwd)
    except OSError as exc:
        # Popen names the directory it could not enter as the error's filename.
        if cwd is not None and exc.filename == cwd:
            raise WorkingDirectoryError(exc.errno, exc.strerror, cwd) from exc
        # The kernel says ENOENT for the interpreter of a script it runs.
        if isinstance(exc, FileNotFoundError):
            interpreter = _interpreter(executable)
            if interpreter is not None:
                raise InterpreterNotFoundError(interpreter, executable) from exc
        raise
    process_info.pid = process.pid
    name = process_info.name
    log.info("%s: started pid %d: %s", name, process.pid, argv[0])

    async def read_stderr() -> None:
        buffer = bytearray()
        skipping = False  # inside an overlong line: drop it up to its newline

        def not_logged(dropped: int) -> None:
            stderr_log.warning("%s: %d stderr lines not logged", name, dropped)

        budget = LogBudget(STDERR_LINES_PER_S, 1.0, not_logged)

        def emit(text: str) -> None:
            if budget.take():
                stderr_log.info("%s: %s", name, text, extra={"MEMORIZZ_SERVER": name})

        try:
            while chunk := await _read_some(stderr):
                buffer += chunk
                while True:
                    end = buffer.find(b"\n")
                    if end < 0:
                        if len(buffer) > STDERR_LINE_MAX:
                            if not skipping:
                                emit(_line(buffer[:STDERR_LINE_MAX]) + " [truncated]")
                            skipping = True
                            buffer.clear()
                        break
                    if not skipping:
                        text = _line(buffer[: min(end, STDERR_LINE_MAX)])
                        emit(text + (" [truncated]" if end > STDERR_LINE_MAX else ""))
                    skipping = False
                    del buffer[: end + 1]
        finally:
            budget.close()  # the count of what was not logged, now

    async def watch_exit() -> None:
        # Not by the pipes: a descendant holding them must not delay noticing.
        await _exited(process)
        process_info.returncode = process.returncode
        process_info.exited.set()

    pipes = StdioPipes(name, stdout, stdin, max_message_bytes)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(read_stderr)
            tg.start_soon(watch_exit)
            try:
                yield pipes
            finally:
                with anyio.CancelScope(shield=True):
                    await _stop(process, pipes, name)
                tg.cancel_scope.cancel()
    finally:
        pipes.close_stdin()
        pipes.close_stdout()
        for fd in (stdout, stderr):
            _close_fd(fd)
        process_info.returncode = process.poll()
        process_info.exited.set()


async def _stop(process: subprocess.Popen[bytes], pipes: StdioPipes, name: str) -> None:
    """Close stdin, wait, SIGTERM, wait, SIGKILL; always kill the group last."""
    pgid = process.pid  # process_group=0: the child leads its own group
    pipes.close_stdin()
    if not await _wait_exit(process, EXIT_GRACE_S):
        _killpg(pgid, signal.SIGTERM)
        _killpg(pgid, signal.SIGCONT)  # a stopped process cannot act on SIGTERM
        if not await _wait_exit(process, TERM_GRACE_S):
            log.warning("%s: pid %d ignored SIGTERM; killing", name, process.pid)
    _killpg(pgid, signal.SIGKILL)  # the leader and any descendant left in the group
    if not await _wait_exit(process, TERM_GRACE_S):
        log.error("%s: pid %d survived SIGKILL", name, process.pid)
    log.info("%s: pid %d exited (%s)", name, process.pid, process.returncode)


async def _exited(process: subprocess.Popen[bytes]) -> None:
    """Return once ``process`` has exited (reaped: its ``returncode`` is set).

    Its pidfd becomes readable when it exits, so an idle daemon does not wake
    for its children (with 20 servers, polling woke it 100 times a second).
    Where there is no pidfd (Linux before 5.3, a seccomp filter), it polls."""
    try:
        pidfd = os.pidfd_open(process.pid)
    except OSError as exc:  # ProcessLookupError: it is gone already
        if not isinstance(exc, ProcessLookupError):
            log.debug("pid %d: no pidfd (%s); polling for its exit", process.pid, exc)
        pidfd = None
    if pidfd is not None:
        try:
            if process.poll() is None:
                await anyio.wait_readable(pidfd)
        finally:
            os.close(pidfd)
    while process.poll() is None:  # noqa: ASYNC110 - no pidfd to wait on
        await anyio.sleep(EXIT_POLL_S)


async def _wait_exit(process: subprocess.Popen[bytes], grace_s: float) -> bool:
    with anyio.move_on_after(grace_s):
        while process.poll() is None:  # noqa: ASYNC110 - polled, see watch_exit
            await anyio.sleep(0.01)
    return process.poll() is not None


def _killpg(pgid: int, sig: signal.Signals) -> None:
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
