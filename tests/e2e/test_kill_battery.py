"""A kill battery: SIGKILL (and SIGSTOP) the real daemon, its stdio servers,
the bridge and clients, at chosen points and at random ones, and check what
is left once the daemon starts again on the same state directory.

What the other crash tests (test_kill_trials, test_crash_consistency,
test_approvals_crash, test_full_disk) do not reach:

* the daemon's stdio servers must die with it: one that stays up after its
  stdin closes (and ignores SIGTERM) outlived a SIGKILLed daemon, for ever,
  and the next start spawned another beside it;
* random kills while several clients call over the socket API and the MCP
  face, proposals are made, approved, rejected and resumed, servers are
  added and removed, the config is reloaded and the vault rotated: every
  acknowledged call has exactly one whole audit record, no approved call
  runs twice nor a rejected one at all, every acknowledged ``servers/add``
  is there with its secret, and the daemon starts each time;
* a stdio server killed or stopped (SIGSTOP) mid-call, the bridge
  (``memorizzctl mcp serve``) and a client killed mid-call: each call still
  has exactly one audit record.

A longer randomized soak lives outside the suite; these keep under a minute.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
import psutil
import pytest

from memorizz.api import methods as m
from memorizz.api.errors import (
    ApprovalRequiredError,
    DeadlineExceededError,
    MemorizzError,
    UnavailableError,
)
from memorizzd.audit import load_key
from tests.harness import (
    LEGACY_SERVER,
    DaemonProcess,
    light_spec,
    scraped,
    spawned_spec,
    wait_until,
)
from tests.process import MEMORIZZCTL
from tests.trials import all_records, call_lines, digest, face_call

_pause = threading.Event()  # never set: an interruptible wait


def _kill(d: DaemonProcess) -> None:
    os.kill(d.pid, signal.SIGKILL)
    assert d.proc is not None
    assert d.proc.wait(10) == -signal.SIGKILL


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _config(base: str, body: str) -> str:
    path = os.path.join(base, "memorizzd.toml")
    Path(path).write_text("backoff_initial_s = 0.05\nbackoff_max_s = 0.5\n" + body)
    return path


def _legacy(name: str, *, env: str = "", extra: str = "") -> str:
    """A config entry for tests/legacy_server.py (no SDK, spawned for real)."""
    return f"""
[[servers]]
name = "{name}"
transport = "stdio"
command = "{sys.executable}"
args = ["{LEGACY_SERVER}"]
env = {{ {env} }}
{extra}
"""


def _server_pids(d: DaemonProcess) -> list[int]:
    return [p.pid for p in psutil.Process(d.pid).children(recursive=True)]


# --- the daemon's children die with it ------------------------------------------


def test_the_stdio_servers_of_a_sigkilled_daemon_die_with_it(base_dir: str) -> None:
    """A server that stays up once its stdin closes (and ignores SIGTERM), as
    a set of two replicas and alone: SIGKILL the daemon. Nothing is left to
    stop them, so they outlived it, for ever; the next start spawned new ones
    beside them. They must die with the daemon."""
    config = _config(
        base_dir,
        _legacy("stubborn", env='IGNORE_TERM = "1"')
        + _legacy("set", env='IGNORE_TERM = "1"', extra="replicas = 2"),
    )
    d = DaemonProcess(base_dir, config=config).start()
    pids: list[int] = []
    try:
        d.wait_ready("stubborn")
        d.wait_ready("set")
        pids = _server_pids(d)
        assert len(pids) == 3
        _kill(d)
        wait_until(
            lambda: all(_gone(pid) for pid in pids),
            timeout=5,
            what="the killed daemon's stdio servers to die with it",
        )
        d.start()  # and the next start serves them again, as its own
        d.wait_ready("stubborn")
        d.wait_ready("set")
        pids = _server_pids(d)
        assert len(pids) == 3
        _kill(d)  # a clean stop waits 4 s for each: stdin, SIGTERM
        wait_until(lambda: all(_gone(pid) for pid in pids), timeout=5)
    finally:
        if d.running:
            d.stop(signal.SIGKILL)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)


# --- mid-call kills: each call keeps exactly one whole record ---------------------


def _one_record(d: DaemonProcess, tool: str, tag: str) -> m.AuditRecord:
    """The one audit record of the call of ``tool`` whose arguments held ``tag``."""
    key = load_key(d.state_dir)
    with d.client() as c:
        mine = [
            r
            for r in all_records(c)
            if r.action == "tools/call"
            and r.tool == tool
            and r.arguments_hmac
            in {
                digest(key, {"seconds": 1.0, "tag": tag}),
                digest(key, {"tag": tag}),
            }
        ]
    assert len(mine) == 1, mine
    (record,) = mine
    assert record.server == "t"
    assert record.argument_keys
    assert record.duration_ms >= 0
    return record


def _in_flight(d: DaemonProcess, n: int) -> None:
    def there() -> bool:
        with d.client() as c:
            return c.server_status("t")[0].in_flight == n

    wait_until(there, what=f"{n} calls in flight on t", alive=d.check)


@pytest.fixture
def served(base_dir: str, tmp_path: Path) -> Any:
    """A daemon with tests/mcp_server.py as ``t`` (spawned: a pid of its own)."""
    d = DaemonProcess(base_dir).start()
    try:
        with d.client() as c:
            c.add_server(
                spawned_spec(
                    "t",
                    env={"CALL_LOG": str(tmp_path / "calls")},
                    risk={"slow_record": "write", "record": "write"},  # no approval
                )
            )
        d.wait_ready("t")
        yield d
    finally:
        if d.running:
            d.stop(signal.SIGKILL)


def test_a_client_killed_mid_call_leaves_one_whole_record(
    served: DaemonProcess,
) -> None:
    """A client process SIGKILLed while its destructive call runs: the call
    runs to the end (and is recorded once, ``ok``)."""
    code = (
        "import sys; from memorizz.client import Client\n"
        "with Client(sys.argv[1]) as c:\n"
        "    c.call_tool('t', 'slow_record', {'seconds': 1.0, 'tag': 'killed'})\n"
    )
    client = subprocess.Popen([sys.executable, "-c", code, served.socket])
    try:
        _in_flight(served, 1)
        client.kill()
    finally:
        client.wait(10)
    _in_flight(served, 0)
    record = _one_record(served, "slow_record", "killed")
    assert record.outcome == "ok"


def test_the_bridge_killed_mid_call_leaves_one_whole_record(
    served: DaemonProcess,
) -> None:
    """``memorizzctl mcp serve`` SIGKILLed while a call it relayed runs."""
    bridge = subprocess.Popen(
        [MEMORIZZCTL, "--socket", served.socket, "mcp", "serve"],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
    )
    assert bridge.stdin is not None
    # the face's one server: its names bare
    lines = call_lines("slow_record", {"seconds": 1.0, "tag": "bridged"})
    try:
        bridge.stdin.write(lines)
        bridge.stdin.flush()
        _in_flight(served, 1)
        bridge.kill()
    finally:
        bridge.wait(10)
        bridge.stdin.close()
    _in_flight(served, 0)
    assert _one_record(served, "slow_record", "bridged").outcome == "ok"


def test_a_server_killed_or_stopped_mid_call_fails_that_call_once(
    served: DaemonProcess,
) -> None:
    """The server SIGKILLed mid-call: the call fails (``server_unavailable``),
    one record; the server is spawned again. Then SIGSTOPped: the next call
    times out, one record; SIGCONT, and calls succeed again."""
    with served.client() as c:
        pid = c.server_status("t")[0].pid
    assert pid is not None
    failed: list[BaseException] = []

    def call() -> None:
        with served.client() as c:
            try:
                c.call_tool("t", "slow_record", {"seconds": 1.0, "tag": "crashed"})
            except MemorizzError as exc:
                failed.append(exc)

    caller = threading.Thread(target=call)
    caller.start()
    _in_flight(served, 1)
    os.kill(pid, signal.SIGKILL)
    caller.join(10)
    assert [type(e) for e in failed] == [UnavailableError]
    assert _one_record(served, "slow_record", "crashed").outcome == "failed"

    killed = pid

    def spawned_again() -> bool:
        nonlocal pid
        with served.client() as c:
            (status,) = c.server_status("t")
        pid = status.pid
        return status.state == "ready" and pid not in (None, killed)

    wait_until(spawned_again, what="t spawned again")
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        with served.client() as c, pytest.raises(DeadlineExceededError):
            c.call_tool("t", "record", {"tag": "stopped"}, timeout_s=0.5)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert _one_record(served, "record", "stopped").outcome == "timeout"
    with served.client() as c:
        assert c.call_tool("t", "record", {"tag": "after"}).is_error is False
    assert _one_record(served, "record", "after").outcome == "ok"


# --- random kills under mixed load --------------------------------------------

TRIALS = 8
KILL_AFTER_S = (0.0, 0.8)


class _Book:
    """What the clients were told, across every daemon of a test."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.next = 0
        self.acked: list[tuple[str, str]] = []
        """(server, tag) of each call answered ``ok``, over the socket or the face."""
        self.proposed: dict[str, str] = {}  # proposal id -> tag
        self.rejected: set[str] = set()  # tags
        self.added: set[str] = set()
        self.removing: set[str] = set()  # asked to remove: gone or not
        self.removed: set[str] = set()

    def tag(self, prefix: str) -> str:
        with self.lock:
            self.next += 1
            return f"{prefix}{self.next}"


def _load(d: DaemonProcess, book: _Book, rng: random.Random) -> None:
    """Clients of every kind until the daemon is SIGKILLed at a random point."""
    stop = threading.Event()
    face = os.path.join(d.base, "mcp.sock")

    def calls(server: str) -> None:
        with contextlib.suppress(MemorizzError, OSError), d.client() as c:
            while not stop.is_set():
                tag = book.tag(server)
                c.call_tool(server, "hello", {"tag": tag})
                with book.lock:
                    book.acked.append((server, tag))

    def face_calls() -> None:
        with contextlib.suppress(OSError, msgspec.DecodeError):
            while not stop.is_set():
                tag = book.tag("f")
                reply = face_call(face, "t__hello", {"tag": tag}, timeout=10)
                if "result" in reply and not reply["result"].get("isError"):
                    with book.lock:
                        book.acked.append(("t", tag))

    def proposals() -> None:
        with contextlib.suppress(MemorizzError, OSError), d.client() as c:
            while not stop.is_set():
                tag = book.tag("a")
                with pytest.raises(ApprovalRequiredError) as asked:
                    c.call_tool("a", "hello", {"tag": tag})
                proposal = str(asked.value.data["proposal_id"])
                with book.lock:
                    book.proposed[proposal] = tag
                if rng.random() < 0.4:
                    with book.lock:
                        book.rejected.add(tag)
                    c.reject(proposal)
                else:
                    c.approve(proposal)
                    c.resume(proposal)

    def operator() -> None:
        with contextlib.suppress(MemorizzError, OSError), d.client() as c:
            while not stop.is_set():
                roll = rng.random()
                if roll < 0.3:
                    name = book.tag("x")
                    c.add_server(light_spec(name, secret_env={"API_KEY": name}))
                    with book.lock:
                        book.added.add(name)
                elif roll < 0.5 and book.added - book.removing:
                    name = min(book.added - book.removing)
                    with book.lock:
                        book.removing.add(name)
                    c.remove_server(name)
                    with book.lock:
                        book.removed.add(name)
                elif roll < 0.7:
                    c.rotate_vault(new_key=rng.random() < 0.5)
                elif roll < 0.85:
                    os.kill(d.pid, signal.SIGHUP)
                else:
                    c.daemon_reload()
                _pause.wait(rng.uniform(0, 0.05))

    failures: list[BaseException] = []

    def failing(work: Any, *args: Any) -> None:
        try:
            work(*args)
        except BaseException as exc:  # noqa: BLE001 - raised by the test
            failures.append(exc)

    threads = [
        threading.Thread(target=failing, args=(calls, "t")),
        threading.Thread(target=failing, args=(calls, "r")),
        threading.Thread(target=failing, args=(face_calls,)),
        threading.Thread(target=failing, args=(proposals,)),
        threading.Thread(target=failing, args=(operator,)),
    ]
    for t in threads:
        t.start()
    _pause.wait(rng.uniform(*KILL_AFTER_S))
    children = _server_pids(d)
    _kill(d)
    stop.set()
    for t in threads:
        t.join(20)
        assert not t.is_alive()
    if failures:
        raise failures[0]
    wait_until(
        lambda: all(_gone(pid) for pid in children),
        timeout=5,
        what="the killed daemon's servers gone",
    )


def _metrics(d: DaemonProcess) -> bytes:
    """A scrape of ``metrics.sock`` (bound after the operator socket answers)."""
    said = b""

    def answered() -> bool:
        nonlocal said
        try:
            said = scraped(os.path.join(d.base, "metrics.sock"))
        except (FileNotFoundError, ConnectionRefusedError):
            return False
        return True

    wait_until(answered, timeout=10, what="metrics.sock", alive=d.check)
    return said


def _check(d: DaemonProcess, book: _Book) -> None:
    """The invariants a restart must find."""
    key = load_key(d.state_dir)
    assert _metrics(d).startswith(b"HTTP/1.1 200")  # its stale socket replaced
    with d.client() as c:
        records = all_records(c)
        ids = [r.id for r in records]
        assert ids == sorted(set(ids), reverse=True)
        recorded = Counter(
            (r.server, r.arguments_hmac) for r in records if r.action == "tools/call"
        )
        for r in records:  # whole
            assert r.outcome
            assert r.caller_uid == os.getuid()
        for server, tag in book.acked:
            assert recorded[(server, digest(key, {"tag": tag}))] == 1, (server, tag)
        ran = Counter(Path(d.base, "a.log").read_text().split())
        assert max(ran.values(), default=0) <= 1
        assert not {tag for tag in book.rejected if ran[tag]}
        proposals = {p.id: p for p in c.list_approvals(limit=1000)}
        for proposal, tag in book.proposed.items():
            if proposal in proposals and proposals[proposal].status == "rejected":
                assert not ran[tag]
        names = {s.name for s in c.list_servers()}
        assert book.added - book.removing <= names
        assert not book.removed & names
    for name in names:  # whole, and their secrets decrypt
        d.wait_ready(name)


def test_random_sigkills_under_mixed_load_keep_every_invariant(base_dir: str) -> None:
    """TRIALS daemons on one state directory, each SIGKILLed at a random
    point while clients call over the socket API and the MCP face, propose,
    approve, reject and resume, add and remove servers with secrets, reload
    the config and rotate the vault; each start checks what the last left."""
    config = _config(
        base_dir,
        _legacy("t", env=f'CALL_LOG = "{base_dir}/t.log"')
        + _legacy(
            "a", env=f'CALL_LOG = "{base_dir}/a.log"', extra="require_approval = true"
        )
        + _legacy("r", env=f'CALL_LOG = "{base_dir}/r.log"', extra="replicas = 2"),
    )
    Path(base_dir, "a.log").touch()
    rng = random.Random(os.environ.get("KILL_BATTERY_SEED", "0"))  # noqa: S311
    book = _Book()
    for _ in range(TRIALS):
        d = DaemonProcess(base_dir, config=config, log_level="info").start()
        try:
            _check(d, book)
            _load(d, book, rng)
        finally:
            if d.running:
                d.stop(signal.SIGKILL)
    d = DaemonProcess(base_dir, config=config, log_level="info").start()
    try:
        _check(d, book)
        done = subprocess.run(
            [MEMORIZZCTL, "--socket", d.socket, "audit", "--limit", "1000"],
            capture_output=True,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        done = subprocess.run(
            [MEMORIZZCTL, "--socket", d.socket, "mcp", "approvals", "--limit", "1000"],
            capture_output=True,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert d.stop() == 0
    finally:
        if d.running:
            d.stop(signal.SIGKILL)
    assert "Traceback" not in d.log()
