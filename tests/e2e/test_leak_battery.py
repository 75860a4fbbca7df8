"""Leak battery: abnormal events repeated a few hundred times against one
daemon, then its counts compared with what they were after a warm-up.

What is counted: descriptors, child processes (and zombies among them),
threads, the event loop's tasks, RSS, and the daemon's own objects by type
(every per-connection, per-caller and per-call book keeps its entries as
objects of ``memorizzd``'s: connections, call lives, sessions, subscriptions,
task entries; a book of plain values holds anyio or asyncio objects, events
and futures). A count may move by a small constant; a leak moves it by about
one per event, which ``N`` makes unmistakable.

Most tests run the daemon in-process (``DaemonHarness``), to count its
objects and tasks; the last runs the real ``memorizzd`` executable and counts
what the kernel sees of it. The daemon's servers are real: tests/mcp_server.py
(forked by the zygote), tests/features_server.py and tests/asking_server.py,
tests/node/task_server.mjs (tasks), tests/mcp_server.py over Streamable HTTP
behind a fault that cuts its answers (tests/faults.py), tests/legacy_server.py.
The clients are raw sockets (the socket API, the MCP face, a bridge's
hand-over of its pipes) and ``memorizz.Client``.

Found by it: a task kept the connection that created it alive (the task
book held the connection's ``send`` until the task was forgotten, which is
at the owner's cap of 1,000: every ``memorizzctl mcp call --task``, each on
a connection of its own, left its closed connection, socket object and
buffers behind). The book now holds the connection weakly.
"""

from __future__ import annotations

import array
import contextlib
import gc
import os
import socket
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

from memorizz.api.errors import RemoteError
from memorizzd.config import load
from memorizzd.listeners import face_socket_path
from tests.faults import Cut
from tests.harness import (
    LEGACY_SERVER,
    NODE_DIR,
    DaemonHarness,
    asking_spec,
    daemon_config,
    daemon_process,
    features_spec,
    http_spec,
    light_spec,
    node,
    rmtree,
    serve_http,
    short_tempdir,
    stdio_spec,
    wait_until,
)

N = 200
"""Repetitions of an event that costs milliseconds."""
SLACK = 12
"""What a count may move by, whatever N: objects of the requests that
measure, a connection not yet collected, a timer."""
READ_S = 10.0
SETTLE_S = 15.0
"""How long the counts may take to come back (under load: a loaded CI host)."""
WATCHED = {"seconds": 30, "tag": "leak"}
"""A read-only call (``watched``) that outlives every test here."""
FACE_INIT = {
    "protocolVersion": "2025-11-25",
    "capabilities": {"elicitation": {"form": {}}, "sampling": {}},
    "clientInfo": {"name": "leak-battery", "version": "0"},
}
THREAD_POOL = (
    "threads",
    "anyio._backends._asyncio.WorkerThread",
    "anyio.lowlevel.EventLoopToken",
)
"""anyio's worker threads (and their tokens): proposals stored at once start
more, which stay idle for reuse; bounded by the limiter, not a leak."""
COUNTED_MODULES = ("memorizzd", "anyio", "asyncio", "_asyncio", "socket", "uvloop")
"""Whose objects are counted by type (gc-tracked ones)."""


# --- the wire ------------------------------------------------------------------


def line(message: dict[str, Any]) -> bytes:
    return msgspec.json.encode(message) + b"\n"


def request(request_id: object, method: str, **params: Any) -> bytes:
    return line(
        {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
    )


def cancelled(request_id: object) -> bytes:
    return line(
        {
            "jsonrpc": "2.0",
            "method": "notifications/cancelled",
            "params": {"requestId": request_id},
        }
    )


class Lines:
    """A raw client: lines in, decoded lines out."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(READ_S)
        self.sock.connect(path)
        self.buffer = b""

    def send(self, *data: bytes) -> None:
        self.sock.sendall(b"".join(data))

    def message(self) -> dict[str, Any]:
        while b"\n" not in self.buffer:
            chunk = self.sock.recv(1 << 16)
            assert chunk, "the daemon closed the connection"
            self.buffer += chunk
        first, self.buffer = self.buffer.split(b"\n", 1)
        decoded: dict[str, Any] = msgspec.json.decode(first)
        return decoded

    def reply(self, request_id: object) -> dict[str, Any]:
        """The answer to ``request_id`` (notifications and others skipped)."""
        while True:
            found = self.message()
            if found.get("id") == request_id and "method" not in found:
                return found

    def close(self) -> None:
        self.sock.close()


def face_session(harness: DaemonHarness) -> Lines:
    """An initialized MCP session on the face (elicitation and sampling declared)."""
    session = Lines(face_socket_path(harness.socket))
    session.send(request(0, "initialize", **FACE_INIT))
    assert "result" in session.reply(0)
    session.send(line({"jsonrpc": "2.0", "method": "notifications/initialized"}))
    return session


# --- counting --------------------------------------------------------------------


def _children(pid: int | str) -> list[str]:
    found: list[str] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):
            found += Path(f"/proc/{pid}/task/{task}/children").read_text().split()
    return found


def _zombies(children: list[str]) -> int:
    def state(child: str) -> str:
        try:
            return Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return "?"

    return sum(state(child) == "Z" for child in children)


def process_counts(pid: int | str) -> Counter[str]:
    """What the kernel sees of a process (``self`` or a pid)."""
    children = _children(pid)
    return Counter(
        {
            "fds": len(os.listdir(f"/proc/{pid}/fd")),
            "children": len(children),
            "zombies": _zombies(children),
            "threads": len(os.listdir(f"/proc/{pid}/task")),
        }
    )


def rss_kib(pid: int | str) -> int:
    for row in Path(f"/proc/{pid}/status").read_text().splitlines():
        if row.startswith("VmRSS:"):
            return int(row.split()[1])
    raise AssertionError("no VmRSS")


async def _running_tasks() -> int:
    return len(anyio.get_running_tasks())


async def _flush_audit_of(harness: DaemonHarness) -> None:
    harness.daemon.book._auditor.flush()  # its batch is not a leak


def census(harness: DaemonHarness) -> Counter[str]:
    """The in-process daemon's counts: the process's, the loop's tasks, and
    gc-tracked objects by type (``COUNTED_MODULES``)."""
    harness.portal.call(_flush_audit_of, harness)
    gc.collect()
    counts = process_counts("self")
    counts["loop tasks"] = harness.portal.call(_running_tasks)
    for obj in gc.get_objects():
        kind = type(obj)
        module = kind.__module__ or ""
        if module.split(".")[0] in COUNTED_MODULES:
            counts[f"{module}.{kind.__qualname__}"] += 1
    return counts


def grown(
    before: Counter[str], after: Counter[str], slack: int = SLACK
) -> dict[str, tuple[int, int]]:
    return {
        key: (before[key], after[key])
        for key in after
        if after[key] - before[key] > slack
    }


def after_settling(
    harness: DaemonHarness,
    before: Counter[str],
    keep: tuple[str, ...] = (),
    slack: int = SLACK,
) -> Counter[str]:
    """The census once nothing grew past the slack (but what ``keep``
    names) and no child is a zombie, or after ``SETTLE_S``: a future that a
    cancelled wait leaves, the loop lets go of within a fraction of a second;
    a server a reload removed is stopped in the background, and between its
    exit and the daemon's reaping it is a zombie (a lag, not a leak)."""
    found = [census(harness)]

    def level() -> bool:
        grew = grown(before, found[0], slack)
        if all(key in keep for key in grew) and found[0]["zombies"] == 0:
            return True
        found[0] = census(harness)
        return False

    with contextlib.suppress(AssertionError):
        wait_until(level, timeout=SETTLE_S, every=0.1)
    return found[0]


def settled(harness: DaemonHarness) -> None:
    """Nothing in flight on any socket nor on any server (bar the asking)."""

    def idle() -> bool:
        with harness.client() as c:
            return c.daemon_status().calls_in_flight == 1 and all(
                s.in_flight == 0 for s in c.server_status()
            )

    wait_until(idle, timeout=30, what="nothing in flight")


def no_leak(
    harness: DaemonHarness,
    event: Callable[[int], None],
    n: int = N,
    *,
    every: int = 50,
    warm: int = 5,
    slack: int = SLACK,
) -> None:
    """``event`` ``warm`` times, the census; ``n`` times more (settled every
    ``every``), the census again: nothing grew past the slack; the daemon
    still answers."""
    for i in range(warm):
        event(i)
    settled(harness)
    before = census(harness)
    for i in range(n):
        event(warm + i)
        if i % every == every - 1:
            settled(harness)
    settled(harness)
    after = after_settling(harness, before, slack=slack)
    assert grown(before, after, slack) == {}
    assert after["zombies"] == 0
    with harness.client() as c:
        assert c.ping().latency_ms >= 0


# --- the daemon and its servers ---------------------------------------------------


@pytest.fixture(scope="module")
def harness() -> Iterator[DaemonHarness]:
    """``t`` (tests/mcp_server.py), ``feat`` (subscriptions) and ``ask``
    (elicitation); a face call decided ``ask`` waits 20 s, an upstream's
    question 60 s: longer than any test here."""
    base = short_tempdir()
    calls_log = os.path.join(base, "calls.log")
    config = daemon_config(
        base,
        servers=[
            stdio_spec("t", env={"CALL_LOG": calls_log}),
            features_spec("feat"),
            asking_spec("ask"),
        ],
        face_approval_wait_s=20.0,
        upstream_request_wait_s=60.0,
    )
    try:
        with DaemonHarness.running(config) as running:
            for name in ("t", "feat", "ask"):
                running.wait_ready(name)
            yield running
    finally:
        rmtree(base)


# --- the socket API ----------------------------------------------------------------


@pytest.mark.parametrize("tool", ["watched", "slow"])
def test_clients_that_leave_mid_call_leave_nothing_behind(
    harness: DaemonHarness, tool: str
) -> None:
    """A read (cancelled with its client) and a write (run to its end)."""
    arguments = WATCHED if tool == "watched" else {"seconds": 0.05}

    def event(i: int) -> None:
        client = Lines(harness.socket)
        client.send(
            request(1, "tools/call", server="t", name=tool, arguments=arguments)
        )
        client.close()

    no_leak(harness, event)


@pytest.mark.parametrize("path", ["relayed", "task"])
def test_cancelled_calls_leave_nothing_behind(
    harness: DaemonHarness, path: str
) -> None:
    """``notifications/cancelled`` for a call in flight: one the warm relay
    runs without a task, and one with a progress token (a task of its own)."""
    client = Lines(harness.socket)
    extra = {} if path == "relayed" else {"progress_token": "p"}

    def event(i: int) -> None:
        client.send(
            request(
                i,
                "tools/call",
                server="t",
                name="slow",
                arguments={"seconds": 30},
                **extra,
            ),
            cancelled(i),
            request(f"ping-{i}", "ping"),
        )
        assert "result" in client.reply(f"ping-{i}")

    try:
        no_leak(harness, event)
    finally:
        client.close()


@pytest.mark.parametrize("path", ["relayed", "task"])
def test_calls_past_their_deadline_leave_nothing_behind(
    harness: DaemonHarness, path: str
) -> None:
    """Calls that each time out (``timeout``), pipelined 50 at a time: four
    events are N calls."""
    client = Lines(harness.socket)
    extra = {} if path == "relayed" else {"progress_token": "p"}
    batch = 50

    def event(i: int) -> None:
        ids = range(i * batch, (i + 1) * batch)
        client.send(
            *(
                request(
                    j,
                    "tools/call",
                    server="t",
                    name="slow",
                    arguments={"seconds": 30},
                    timeout_s=0.05,
                    **extra,
                )
                for j in ids
            )
        )
        replies: dict[object, dict[str, Any]] = {}
        while len(replies) < batch:  # in any order
            reply = client.message()
            replies[reply.get("id")] = reply
        assert set(replies) == set(ids)
        for reply in replies.values():
            assert reply["error"]["data"]["reason"] == "timeout", reply

    try:
        no_leak(harness, event, N // batch, warm=1, every=1)
    finally:
        client.close()


def test_subscribers_that_vanish_leave_nothing_behind(harness: DaemonHarness) -> None:
    def event(i: int) -> None:
        client = Lines(harness.socket)
        uri = f"feat://colors/c{i % 3}"
        client.send(request(1, "resources/subscribe", server="feat", uri=uri))
        assert "result" in client.reply(1)
        client.close()

    no_leak(harness, event)


def test_askers_that_vanish_leave_nothing_behind(harness: DaemonHarness) -> None:
    """An upstream's elicitation reaches the call's client, which leaves
    unanswering (socket API and face in turn; each waited out: one question
    at a time can be tied to its call)."""

    def event(i: int) -> None:
        if i % 2:
            client = face_session(harness)
            client.send(request(1, "tools/call", name="ask__ask_name", arguments={}))
        else:
            client = Lines(harness.socket)
            declared: dict[str, Any] = {"elicitation": {"form": {}}}
            client.send(
                request(
                    0,
                    "daemon/hello",
                    protocol_version=1,
                    client="leak",
                    capabilities=declared,
                ),
                request(1, "tools/call", server="ask", name="ask_name", arguments={}),
            )
        while (asked := client.message()).get("method") != "elicitation/create":
            assert asked.get("id") in (0, None), asked
        client.close()
        settled(harness)

    no_leak(harness, event, 40)


# --- the MCP face ------------------------------------------------------------------


@pytest.mark.parametrize("tool", ["t__watched", "t__slow"])
def test_face_sessions_abandoned_mid_call_leave_nothing_behind(
    harness: DaemonHarness, tool: str
) -> None:
    arguments = WATCHED if tool == "t__watched" else {"seconds": 0.05}

    def event(i: int) -> None:
        session = face_session(harness)
        session.send(request(1, "tools/call", name=tool, arguments=arguments))
        session.close()

    no_leak(harness, event)


def test_face_sessions_abandoned_mid_handshake_leave_nothing_behind(
    harness: DaemonHarness,
) -> None:
    def event(i: int) -> None:
        session = Lines(face_socket_path(harness.socket))
        session.send(request(0, "initialize", **FACE_INIT))
        session.close()

    no_leak(harness, event)


def test_face_cancellations_leave_nothing_behind(harness: DaemonHarness) -> None:
    session = face_session(harness)

    def event(i: int) -> None:
        session.send(
            request(i + 10, "tools/call", name="t__slow", arguments={"seconds": 30}),
            cancelled(i + 10),
            request("p", "ping"),
        )
        assert session.reply("p") == {"jsonrpc": "2.0", "id": "p", "result": {}}

    try:
        no_leak(harness, event)
    finally:
        session.close()


def test_face_subscribers_that_vanish_leave_nothing_behind(
    harness: DaemonHarness,
) -> None:
    def event(i: int) -> None:
        session = face_session(harness)
        session.send(request(1, "resources/subscribe", uri="feat://watched"))
        assert "result" in session.reply(1)
        session.close()

    no_leak(harness, event)


def _pipes_handed_over(harness: DaemonHarness) -> tuple[int, int]:
    """A bridge's hand-over done by hand: the daemon gets the read end of
    one pipe (the client's requests) and the write end of another (its
    replies); ours are returned (write requests, read replies)."""
    requests_r, requests_w = os.pipe()
    replies_r, replies_w = os.pipe()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(READ_S)
        sock.connect(face_socket_path(harness.socket))
        fds = array.array("i", [requests_r, replies_w])
        handoff = b'{"jsonrpc":"2.0","id":"mz-handoff","method":"memorizz/handoff"}\n'
        sock.sendmsg([handoff], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
        os.close(requests_r)
        os.close(replies_w)
        with sock.makefile("rb") as answers:
            assert b"error" not in answers.readline()
        # the bridge waits on its socket; this one leaves with its client
    return requests_w, replies_r


def test_handed_over_pipes_of_clients_that_vanish_are_closed(
    harness: DaemonHarness,
) -> None:
    """``memorizzctl mcp serve`` hands its stdio over; the client goes away
    mid-call (both its pipe ends closed, the bridge's socket too)."""

    def event(i: int) -> None:
        requests_w, replies_r = _pipes_handed_over(harness)
        with (
            open(requests_w, "wb", buffering=0) as out,
            open(replies_r, "rb") as replies,
        ):
            out.write(request(0, "initialize", **FACE_INIT))
            assert b'"id":0' in replies.readline()
            out.write(request(1, "tools/call", name="t__watched", arguments=WATCHED))

    no_leak(harness, event, 100)


def test_face_calls_awaiting_approval_whose_clients_leave_are_released(
    base_dir: str,
) -> None:
    """A face call decided ``ask`` waits for the operator; its client leaves.
    The call ends with it, long before ``face_approval_wait_s``; its proposal
    stays for the operator, and what waits on it until it is decided: then
    nothing is left."""
    config = daemon_config(
        base_dir,
        servers=[stdio_spec("t"), light_spec("l")],
        face_approval_wait_s=30.0,
    )
    with DaemonHarness.running(config) as harness:
        harness.wait_ready("t")
        harness.wait_ready("l")
        proposals: list[str] = []

        def event(i: int) -> None:
            session = face_session(harness)
            session.send(
                request(1, "tools/call", name="t__annotated_destroy", arguments={}),
                request("p", "ping"),
            )
            assert "result" in session.reply("p")
            session.close()

        def decided() -> None:
            settled(harness)
            with harness.client() as c:
                for proposal in c.list_approvals(status="pending", limit=1000):
                    c.cancel_approval(proposal.id)
                    proposals.append(proposal.id)

        for i in range(5):
            event(i)
        decided()
        before = census(harness)
        for i in range(N):
            event(i)
            if i % 20 == 19:  # the operator's cap on open proposals
                decided()
        decided()
        after = after_settling(harness, before, keep=THREAD_POOL)
        assert len(proposals) == N + 5
        assert {
            k: v for k, v in grown(before, after).items() if k not in THREAD_POOL
        } == {}
        # the store's worker threads: as many as ran at once, idle now, reused;
        # bounded by anyio's default limiter (40), never by N
        assert after["anyio._backends._asyncio.WorkerThread"] <= 40
        assert harness.daemon.book._changed == {}


def test_a_held_face_call_whose_client_left_does_not_run_when_approved(
    base_dir: str,
) -> None:
    """A face call held for the operator has sent nothing upstream: when its
    client leaves, it ends (it does not wait out ``face_approval_wait_s`` to
    run, once approved, for nobody, using up the approval). The proposal
    stays; approved, the agent's retry (same tool, same arguments) runs it,
    once."""
    calls_log = os.path.join(base_dir, "calls.log")
    config = daemon_config(
        base_dir,
        servers=[stdio_spec("t", env={"CALL_LOG": calls_log}), light_spec("l")],
        face_approval_wait_s=30.0,
    )
    call = request(1, "tools/call", name="t__record", arguments={"tag": "left"})
    with DaemonHarness.running(config) as harness:
        harness.wait_ready("t")
        session = face_session(harness)
        session.send(call, request("p", "ping"))
        assert "result" in session.reply("p")
        session.close()
        settled(harness)  # the held call ended with its client
        with harness.client() as c:
            (proposal,) = c.list_approvals(status="pending")
            c.approve(proposal.id)
        assert not os.path.exists(calls_log)
        again = face_session(harness)
        again.send(call)
        reply = again.reply(1)
        again.close()
        assert reply["result"].get("isError") is not True, reply
        assert Path(calls_log).read_text().splitlines() == ["left"]


# --- tasks -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tasks_harness() -> Iterator[DaemonHarness]:
    executable = node("the TypeScript SDK's task server")
    script = str(NODE_DIR / "task_server.mjs")
    base = short_tempdir()
    spec = stdio_spec("tasks", command=executable, args=[script], cwd=str(NODE_DIR))
    try:
        with DaemonHarness.running(daemon_config(base, servers=[spec])) as running:
            running.wait_ready("tasks")
            yield running
    finally:
        rmtree(base)


def _connections() -> int:
    gc.collect()
    return sum(
        type(obj).__qualname__ == "_Connection"
        and type(obj).__module__ == "memorizzd.rpc.server"
        for obj in gc.get_objects()
    )


@pytest.mark.parametrize("tool", ["report", "hold"])
def test_tasks_whose_creators_leave_do_not_keep_their_connections(
    tasks_harness: DaemonHarness, tool: str
) -> None:
    """A task outlives the connection that created it (the book keeps it for
    its owner's ``tasks/get``, up to a cap); the closed connection must not
    live on with it. ``hold`` runs until cancelled, and its creator leaves
    while it waits for its result."""
    harness = tasks_harness

    def event(i: int) -> None:
        client = Lines(harness.socket)
        client.send(
            request(
                1,
                "tools/call",
                server="tasks",
                name=tool,
                arguments={} if tool == "hold" else {"topic": "x"},
                task={"ttl": 60000},
            )
        )
        task = client.reply(1)["result"]["task"]
        if tool == "hold":
            client.send(
                request(2, "tasks/result", task_id=task["taskId"], timeout_s=30)
            )
        client.close()

    for i in range(5):
        event(i)
    settled(harness)
    before = census(harness)
    for i in range(N):
        event(i)
    settled(harness)
    kept = ("memorizzd.upstream.tasks.TaskEntry", "memorizzd.caller.Caller")
    after = after_settling(harness, before, kept)
    assert _connections() <= SLACK
    # the book's own entries stay (its owner may still ask), nothing else
    entries = (
        after["memorizzd.upstream.tasks.TaskEntry"]
        - before["memorizzd.upstream.tasks.TaskEntry"]
    )
    assert entries == N
    assert {k: v for k, v in grown(before, after).items() if k not in kept} == {}
    with harness.client() as c:
        assert len(c.list_tasks()) >= N


# --- upstream faults ----------------------------------------------------------------


def test_a_server_that_crashes_mid_call_and_is_restarted_leaves_nothing_behind(
    harness: DaemonHarness,
) -> None:
    """Its process reaped (no zombie), its pipes closed, its tasks ended."""

    def event(i: int) -> None:
        with harness.client() as c, contextlib.suppress(RemoteError):
            c.call_tool("t", "crash", {})
        harness.wait_ready("t")

    no_leak(harness, event, 8, warm=2, slack=3)


def test_an_http_server_that_cuts_its_answers_leaves_nothing_behind(
    harness: DaemonHarness,
) -> None:
    """Each answer cut mid-way: the call fails, the session is replaced."""
    cut = Cut(times=10**6).tool("echo")
    with serve_http("streamable_http", wrap=cut.wrap) as url:
        with harness.client() as c:
            c.add_server(http_spec("h", url, "streamable_http"))
        harness.wait_ready("h")

        def event(i: int) -> None:
            with harness.client() as c:
                with pytest.raises(RemoteError) as failed:
                    c.call_tool("h", "echo", {"text": "cut"}, timeout_s=10)
                assert failed.value.reason == "server_unavailable"
            harness.wait_ready("h")

        try:
            no_leak(harness, event, 40, every=10)
        finally:
            with harness.client() as c:
                c.remove_server("h")
    assert cut.cuts >= 45


# --- reloads ------------------------------------------------------------------------


def _config(base: str, i: int) -> str:
    """A config file with ``keep`` always and ``x{i}`` (in a profile of its
    own, ``p{i}``) every other time; the file's path."""
    uid = os.getuid()
    servers = ["keep"] + ([f"x{i}"] if i % 2 else [])
    text = [f'socket = "{base}/d.sock"', f'state_dir = "{base}/state"']
    for name in servers:
        text += [
            "[[servers]]",
            f'name = "{name}"',
            'transport = "stdio"',
            f'command = "{sys.executable}"',
            f'args = ["{LEGACY_SERVER}"]',
        ]
    text += ["[[profiles]]", 'name = "bot"', 'servers = ["keep"]', f"uids = [{uid}]"]
    if i % 2:
        text += [
            "[[profiles]]",
            f'name = "p{i}"',
            f'servers = ["x{i}"]',
            f"uids = [{uid}]",
        ]
    path = os.path.join(base, "memorizzd.toml")
    Path(path).write_text("\n".join(text) + "\n", encoding="utf-8")
    return path


def test_reloads_that_add_and_remove_servers_and_profiles_leave_nothing_behind() -> (
    None
):
    """Each reload adds a server and a profile (its agent socket and face)
    or takes them away again."""
    base = short_tempdir()
    os.chmod(base, 0o755)  # noqa: S103 - the agent directories live below
    try:
        with DaemonHarness.running(load(_config(base, 0))) as harness:
            harness.wait_ready("keep")

            def event(i: int) -> None:
                _config(base, i)
                with harness.client() as c:
                    c.daemon_reload()

            no_leak(harness, event, 60, every=10)
    finally:
        rmtree(base)


# --- the real process ----------------------------------------------------------------


def test_the_memorizzd_process_keeps_its_descriptors_children_and_memory() -> None:
    """The executable, as the kernel sees it: a mix of the events above,
    repeated; its descriptors, children (none a zombie), threads and RSS
    after a warm-up and after."""
    base = short_tempdir()
    try:
        with daemon_process(base) as d:
            with d.client() as c:
                c.add_server(
                    stdio_spec("t", env={"CALL_LOG": os.path.join(base, "c.log")})
                )
            d.wait_ready("t")

            def idle() -> bool:
                with d.client() as c:
                    return c.daemon_status().calls_in_flight == 1 and all(
                        s.in_flight == 0 for s in c.server_status()
                    )

            def round_of(n: int) -> None:
                for i in range(n):
                    client = Lines(d.socket)
                    call = {"server": "t", "name": "watched", "arguments": WATCHED}
                    client.send(request(1, "tools/call", **call))
                    client.close()
                    session = Lines(face_socket_path(d.socket))
                    session.send(request(0, "initialize", **FACE_INIT))
                    session.reply(0)
                    session.send(
                        request(
                            1, "tools/call", name="t__slow", arguments={"seconds": 30}
                        ),
                        cancelled(1),
                    )
                    session.close()
                    if i % 25 == 24:
                        wait_until(idle, timeout=30, what="nothing in flight")
                wait_until(idle, timeout=30, what="nothing in flight")

            round_of(50)  # the warm-up: the audit's pages, the allocator's arenas
            before, rss_before = process_counts(d.pid), rss_kib(d.pid)
            round_of(N)
            after, rss_after = process_counts(d.pid), rss_kib(d.pid)
            assert grown(before, after, slack=2) == {}
            assert after["zombies"] == 0
            assert rss_after - rss_before < 8 * 1024, (rss_before, rss_after)
            assert d.answers()
    finally:
        rmtree(base)
