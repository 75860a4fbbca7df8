"""A replica set (``replicas = N``) under failure and load, the real daemon and
real processes (``upstream/replicas.py``): a replica frozen (SIGSTOP) or
killed (SIGKILL) mid-call, all of them killed at once, a reload that changes
``replicas`` with calls in flight, progress reaching the caller whose call
made it. Invariants: each request gets one answer (a result, or an error with
a stable ``data.reason``), no call runs twice, no process is left behind
(the daemon's children, zombies), and the daemon serves on.

Most tests run ``TINY``, a stdlib server started in milliseconds, spawned for
real (its pid is its own: the zygote would hide it), that answers its
requests each in a thread of its own.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from memorizz.api import methods as m
from memorizz.api.errors import RemoteError
from memorizz.api.methods import ServerSpec
from tests.harness import daemon_process, stdio_spec
from tests.process import DaemonProcess, wait_until

TINY = """\
import os, sys, threading, time
import msgspec
CALLS = os.environ["CALL_LOG"]
out = threading.Lock()
def send(body):
    data = msgspec.json.encode(dict(body, jsonrpc="2.0")) + b"\\n"
    with out:
        sys.stdout.buffer.write(data); sys.stdout.buffer.flush()
def log(line):
    with open(CALLS, "a") as f:
        f.write(line + "\\n"); f.flush(); os.fsync(f.fileno())
def text(t):
    return {"content": [{"type": "text", "text": t}]}
def tool(name):
    return {"name": name, "inputSchema": {"type": "object"}}
def call(rid, name, args):
    if name == "pid":
        send({"id": rid, "result": text(str(os.getpid()))}); return
    tag = args.get("tag", "")
    log("start:" + tag)
    if name == "gate":
        while not os.path.exists(args["path"]):
            time.sleep(0.01)
    log("done:" + tag)
    send({"id": rid, "result": text(f"{tag}@{os.getpid()}")})
for line in sys.stdin.buffer:
    msg = msgspec.json.decode(line)
    method, rid = msg.get("method"), msg.get("id")
    if rid is None or method is None:
        continue
    if method == "initialize":
        send({"id": rid, "result": {"protocolVersion": "2025-11-25",
              "capabilities": {"tools": {}},
              "serverInfo": {"name": "tiny", "version": "1"}}})
    elif method == "ping":
        send({"id": rid, "result": {}})
    elif method == "tools/list":
        send({"id": rid, "result": {"tools": [tool(n) for n in ("pid", "gate", "record")]}})
    elif method == "tools/call":
        p = msg.get("params") or {}
        threading.Thread(target=call, args=(rid, p["name"], p.get("arguments") or {}),
                         daemon=True).start()
    else:
        send({"id": rid, "error": {"code": -32601, "message": "Method not found"}})
"""


def _pause(seconds: float) -> None:
    threading.Event().wait(seconds)


@pytest.fixture
def tiny(base_dir: str) -> str:
    script = os.path.join(base_dir, "tiny.py")
    Path(script).write_text(TINY)
    return script


def _spec(script: str, calls: Path, replicas: int, **overrides: Any) -> ServerSpec:
    return ServerSpec(
        name="pool",
        transport="stdio",
        command=sys.executable,
        args=[script],
        env={"CALL_LOG": str(calls)},
        protocol="legacy",
        replicas=replicas,
        **overrides,
    )


def _tiny_toml(script: str, calls: Path, replicas: int) -> str:
    return (
        "backoff_initial_s = 0.05\ndrain_timeout_s = 20.0\n"
        '[[servers]]\nname = "pool"\ntransport = "stdio"\n'
        f'command = "{sys.executable}"\nargs = ["{script}"]\nprotocol = "legacy"\n'
        f"replicas = {replicas}\n"
        f'env = {{ CALL_LOG = "{calls}" }}\n'
    )


@pytest.fixture
def calls(tmp_path: Path) -> Path:
    path = tmp_path / "calls.log"
    path.touch()
    return path


def _lines(calls: Path) -> list[str]:
    return calls.read_text().splitlines()


def _call(
    d: DaemonProcess, tool: str, args: dict[str, Any] | None = None, **kw: Any
) -> str:
    with d.client() as c:
        result = c.call_tool("pool", tool, args or {}, **kw)
    assert not result.is_error, result
    return str(result.content[0]["text"])


def _status(d: DaemonProcess) -> m.ServerStatus:
    with d.client() as c:
        (status,) = c.server_status("pool")
    return status


def _children(pid: int) -> dict[int, str]:
    """The processes whose parent is ``pid``: their state letter (Z: zombie)."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid:
            found[int(entry)] = fields[0]
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _servers_settle(d: DaemonProcess, count: int) -> dict[int, str]:
    """Wait until the daemon has exactly ``count`` children, none a zombie."""
    seen: dict[int, str] = {}

    def settled() -> bool:
        nonlocal seen
        seen = _children(d.pid)
        return len(seen) == count and "Z" not in seen.values()

    wait_until(settled, timeout=15.0, what=f"{count} children, no zombie: {seen}")
    return seen


class _Held:
    """One ``gate`` call held in flight until its file exists."""

    def __init__(self, d: DaemonProcess, gate: Path, tag: str) -> None:
        self.gate, self.tag = gate, tag
        self.outcome: str | RemoteError | None = None
        self.answers = 0
        self._thread = threading.Thread(target=self._run, args=(d,), daemon=True)
        self._thread.start()

    def _run(self, d: DaemonProcess) -> None:
        try:
            self.outcome = _call(d, "gate", {"path": str(self.gate), "tag": self.tag})
        except RemoteError as exc:
            self.outcome = exc
        self.answers += 1

    def join(self) -> str | RemoteError | None:
        self._thread.join(20)
        assert self.answers == 1, self.tag
        return self.outcome


@pytest.fixture
def d(base_dir: str) -> Iterator[DaemonProcess]:
    config = os.path.join(base_dir, "c.toml")
    Path(config).write_text("backoff_initial_s = 0.05\nhealth_timeout_s = 3.0\n")
    with daemon_process(base_dir, config=config) as process:
        yield process


def _held(d: DaemonProcess, gate: Path, calls: Path, tag: str, n: int) -> list[_Held]:
    """``n`` calls held on the set until ``gate`` exists, once each has started."""
    held = [_Held(d, gate, f"{tag}{i}") for i in range(n)]
    wait_until(
        lambda: all(f"start:{tag}{i}" in _lines(calls) for i in range(n)),
        what=f"{n} held",
    )
    return held


def _add(d: DaemonProcess, spec: ServerSpec) -> None:
    with d.client() as c:
        c.add_server(spec)
    d.wait_ready(spec.name)


def _pids(d: DaemonProcess) -> list[int]:
    """The set's server pids (the daemon's children: spawned for real)."""
    return sorted(_children(d.pid))


def test_a_frozen_replica_whose_call_timed_out_does_not_stall_the_set(
    d: DaemonProcess, tiny: str, calls: Path
) -> None:
    """A call on a frozen (SIGSTOP) replica times out; the next calls are
    answered at once by the other replica, and the frozen one is found by the
    probe, stopped (reaped) and started again. Before, every request after
    the timeout waited for the whole health check, which waited
    ``health_timeout_s`` for the frozen replica, while the other sat idle."""
    _add(d, _spec(tiny, calls, 2))
    first = int(_call(d, "pid"))  # an idle set sends to the first replica
    (other,) = set(_pids(d)) - {first}
    os.kill(first, signal.SIGSTOP)
    try:
        with d.client() as c, pytest.raises(RemoteError) as raised:
            c.call_tool("pool", "pid", {}, timeout_s=0.5)
        assert raised.value.reason == "timeout"
        for _ in range(5):
            started = time.monotonic()
            assert int(_call(d, "pid", timeout_s=10.0)) == other
            took = time.monotonic() - started
            assert took < 1.5, f"a call waited {took:.2f} s behind the frozen replica"
        wait_until(lambda: _status(d).restarts == 1, what="the frozen one lost")
        assert "replica 0" in (d.log()), d.log_tail()
        wait_until(lambda: not _alive(first), what="the frozen replica reaped")
    finally:
        if _alive(first):
            os.kill(first, signal.SIGCONT)
    pids = _servers_settle(d, 2)
    assert first not in pids
    assert other in pids
    status = _status(d)
    assert (status.state, status.restarts) == ("ready", 1), status


def test_a_replica_killed_mid_call_fails_that_call_once_and_runs_nothing_twice(
    d: DaemonProcess, tiny: str, calls: Path, tmp_path: Path
) -> None:
    """SIGKILL of the replica running a call: that call gets one error
    (``server_unavailable``, never sent again: it may have run), the call on
    the other replica completes, the killed one is reaped and started again,
    and calls made during and after it each run exactly once."""
    _add(d, _spec(tiny, calls, 2))
    gate = tmp_path / "gate"
    kept = _Held(d, gate, "kept")
    wait_until(lambda: "start:kept" in _lines(calls), what="kept running")
    doomed = _Held(d, tmp_path / "never", "doomed")
    wait_until(lambda: "start:doomed" in _lines(calls), what="doomed running")
    first = int(_call(d, "pid"))  # both busy with one: the first, again
    (second,) = set(_pids(d)) - {first}
    # which replica runs doomed: the second (kept went to the first)
    os.kill(second, signal.SIGKILL)
    lost = doomed.join()
    assert isinstance(lost, RemoteError), lost
    assert lost.reason == "server_unavailable", lost
    assert "may have run" in str(lost)
    # calls while the second starts again: all on the first, each once
    tags = [f"r{i}" for i in range(12)]
    results: dict[str, str | RemoteError] = {}

    def record(tag: str) -> None:
        try:
            results[tag] = _call(d, "record", {"tag": tag})
        except RemoteError as exc:
            results[tag] = exc

    threads = [threading.Thread(target=record, args=(t,)) for t in tags]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert all(isinstance(r, str) for r in results.values()), results
    gate.touch()
    assert kept.join() == f"kept@{first}"
    lines = _lines(calls)
    for tag in [*tags, "kept", "doomed"]:
        assert lines.count(f"start:{tag}") == 1, (tag, lines)
    assert "done:doomed" not in lines
    pids = _servers_settle(d, 2)
    assert second not in pids
    assert first in pids
    wait_until(lambda: _status(d).last_error is None, what="the replica back")
    status = _status(d)
    assert (status.state, status.restarts, status.in_flight) == ("ready", 1, 0)


def test_all_replicas_killed_at_once_with_calls_in_flight(
    d: DaemonProcess, tiny: str, calls: Path, tmp_path: Path
) -> None:
    """Every replica killed while each runs a call: each call gets one error,
    every old process is replaced and reaped, and the new set serves;
    nothing ran twice."""
    _add(d, _spec(tiny, calls, 3))
    held = [_Held(d, tmp_path / "never", f"h{i}") for i in range(3)]
    wait_until(
        lambda: all(f"start:h{i}" in _lines(calls) for i in range(3)),
        what="a call on each replica",
    )
    old = _pids(d)
    assert len(old) == 3
    for pid in old:
        os.kill(pid, signal.SIGKILL)
    for call in held:
        outcome = call.join()
        assert isinstance(outcome, RemoteError), outcome
        assert outcome.reason == "server_unavailable", outcome
    # (the set is lost whole, or, when the kills land apart, replica by replica)

    def replaced() -> bool:  # the new set's three processes, and it says ready
        pids = _children(d.pid)
        fresh = len(pids) == 3 and "Z" not in pids.values() and not set(pids) & set(old)
        return fresh and _status(d).state == "ready"

    wait_until(replaced, timeout=15.0, what="the set replaced and ready")
    assert _call(d, "record", {"tag": "after"}).startswith("after@")
    pids = _servers_settle(d, 3)
    assert not set(pids) & set(old)
    lines = _lines(calls)
    for tag in ("h0", "h1", "h2", "after"):
        assert lines.count(f"start:{tag}") == 1, (tag, lines)
    assert _status(d).state == "ready"


def test_a_reload_changing_replicas_with_calls_in_flight(
    base_dir: str, tiny: str, calls: Path, tmp_path: Path
) -> None:
    """``replicas`` 2 -> 3 -> 1 by reload while calls are held on the set: the
    held calls finish (drained), the new set has as many processes as it
    says, and none of the old is left behind."""
    path = Path(base_dir, "memorizzd.toml")
    path.write_text(_tiny_toml(tiny, calls, 2))
    gate = tmp_path / "gate"
    with daemon_process(base_dir, config=str(path)) as d:
        d.wait_ready("pool")
        two = _servers_settle(d, 2)
        held = _held(d, gate, calls, "a", 2)
        path.write_text(_tiny_toml(tiny, calls, 3))
        with d.client() as c:
            c.daemon_reload()
        wait_until(
            lambda: len(set(_children(d.pid)) - set(two)) == 3,
            what="the three replicas",
        )
        d.wait_ready("pool")
        later = _held(d, gate, calls, "b", 3)
        path.write_text(_tiny_toml(tiny, calls, 1))
        with d.client() as c:
            c.daemon_reload()
        _pause(0.3)
        gate.touch()
        for call in held:
            assert str(call.join()).split("@")[1] in {str(p) for p in two}
        spread = {str(call.join()).split("@")[1] for call in later}
        assert len(spread) == 3, [call.outcome for call in later]
        d.wait_ready("pool")
        (one,) = _servers_settle(d, 1)
        assert one not in two
        assert str(one) not in spread
        assert _call(d, "pid") == str(one)
        lines = _lines(calls)
        for tag in ("a0", "a1", "b0", "b1", "b2"):
            assert lines.count(f"start:{tag}") == 1, (tag, lines)
        assert len(_children(d.pid)) == 1


def test_progress_reaches_the_caller_whose_replica_reports_it(
    d: DaemonProcess,
) -> None:
    """Two calls at once, one on each replica, each reporting its own steps:
    each caller gets its own progress, none of the other's."""
    _add(d, stdio_spec("pool", replicas=2))
    seen: dict[int, list[tuple[float, float | None]]] = {3: [], 40: []}
    answers: dict[int, str] = {}

    def run(steps: int) -> None:
        def on(p: m.ProgressParams) -> None:
            seen[steps].append((p.progress, p.total))

        answers[steps] = _call(d, "progressing", {"steps": steps}, on_progress=on)

    threads = [threading.Thread(target=run, args=(n,)) for n in (40, 3)]
    for thread in threads:
        thread.start()
        _pause(0.05)
    for thread in threads:
        thread.join(20)
    assert answers == {3: "done in 3 steps", 40: "done in 40 steps"}
    for steps, got in seen.items():
        assert got, steps
        assert {total for _, total in got} == {steps}, (steps, got)
        assert max(p for p, _ in got) <= steps
