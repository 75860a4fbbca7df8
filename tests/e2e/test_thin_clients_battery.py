"""Every thin client says every error the daemon gives the same way.

One real daemon (servers: tests/mcp_server.py as ``t``, the same with a
1 KiB ``max_result_bytes`` as ``tiny``, and ``broken``, whose command does not
exist; agent profiles ``bot`` (``max_in_flight`` 1), ``small``
(``max_request_bytes`` 1 KiB) and ``locked`` (another uid's)). Each error case
is driven through the Python client (the exception class, ``.reason``,
``.data``), ``memorizzctl`` in-process (exit status, the stderr line, and
``--json``), the Node.js client (clients/node, from a small script) and
``clients/sh/mz`` (exit status and stderr); then compared: the reason, the
data the daemon gave (the proposal id of ``approval_required``, the retry hint
``retry_after_s``), retryable or not (docs/protocol.md's table), and the exit
statuses of memorizzctl and mz (69 unreachable, 75 retry, 77 permission, 1
else). The daemon going away mid-call (SIGTERM, drain cut short) is the one
case that needs a daemon of its own, the real executable.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pytest

from memorizz import Client, cli
from memorizz.api import errors
from memorizzd.config import Limits, Profile
from tests.harness import (
    MCP_SERVER,
    DaemonHarness,
    configured_daemon,
    daemon_config,
    launch_args,
    node,
    rmtree,
    short_tempdir,
    stdio_spec,
)
from tests.process import MEMORIZZCTL, wait_until

ROOT = Path(__file__).parents[2]
MZ = str(ROOT / "clients" / "sh" / "mz")
NODE_CLIENT = str(ROOT / "clients" / "node" / "memorizz.mjs")

RETRYABLE = frozenset(
    {
        "server_unavailable",
        "overloaded",
        "upstream_busy",
        "shutting_down",
        "storage_full",
        "timeout",
        "idle_timeout",
    }
)
"""docs/protocol.md, "Errors": the reasons whose retry? column says yes."""

DRIVER = """\
// argv: the client module, then a JSON list of {socket, method, params}: each
// request on a new Client; prints one JSON line, what each one gave.
import { pathToFileURL } from "node:url";
const mz = await import(pathToFileURL(process.argv[2]).href);
const requests = JSON.parse(process.argv[3]);
const seen = await Promise.all(requests.map(async ({ socket, method, params }) => {
  const client = new mz.Client(socket);
  try {
    return { result: await client.call(method, params) };
  } catch (err) {
    return { error: {
      name: err.name, code: err.code, reason: err.reason, data: err.data,
      message: err.message,
      remote: err instanceof mz.RemoteError,
      unreachable: err instanceof mz.DaemonUnreachableError,
      retryable: err instanceof mz.UnavailableError || err instanceof mz.DeadlineExceededError,
    } };
  } finally {
    client.close();
  }
}));
process.stdout.write(JSON.stringify(seen) + "\\n");
"""


@dataclass
class World:
    base: str
    operator: str
    bot: str
    small: str
    locked: str
    missing: str
    proposal: str
    driver: str
    gate: str

    def socket(self, key: str) -> str:
        path: str = getattr(self, key)
        return path


@pytest.fixture(scope="module", autouse=True)
def _tools() -> None:
    if shutil.which("socat") is None:
        if os.geteuid() == 0 or os.environ.get("CI"):
            pytest.fail("socat is not installed: scripts/bootstrap installs it as root")
        pytest.skip("socat is not installed (scripts/bootstrap installs it as root)")


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    base = short_tempdir()
    os.chmod(base, 0o755)  # noqa: S103 - the agent directories live below
    uid = os.getuid()
    agents = os.path.join(base, "agents")
    config = daemon_config(
        base,
        agents_dir=agents,
        backoff_initial_s=1.0,
        backoff_max_s=2.0,
        servers=[
            stdio_spec("t"),
            stdio_spec("tiny", max_result_bytes=1024),
            stdio_spec("broken", command="/nonexistent/no-such-prog", args=[]),
        ],
        profiles=[
            Profile(
                name="bot", servers=["t"], uids=[uid], limits=Limits(max_in_flight=1)
            ),
            Profile(
                name="small",
                servers=["t"],
                uids=[uid],
                limits=Limits(max_request_bytes=1024),
            ),
            Profile(name="locked", servers=["t"], uids=[uid + 4242]),
        ],
    )
    driver = os.path.join(base, "driver.mjs")
    Path(driver).write_text(DRIVER, encoding="utf-8")
    try:
        with DaemonHarness.running(config) as running:
            running.wait_ready("t")
            running.wait_ready("tiny")
            with running.client() as c:
                wait_until(
                    lambda: c.server_status("broken")[0].state in ("failed", "backoff"),
                    what="broken to fail",
                )
                try:
                    c.call_tool("t", "record", {"tag": "pending"})
                except errors.ApprovalRequiredError as exc:
                    proposal = str(exc.data["proposal_id"])
                else:
                    raise AssertionError("record was not decided ask")
            yield World(
                base=base,
                operator=running.socket,
                bot=os.path.join(agents, "bot", "api.sock"),
                small=os.path.join(agents, "small", "api.sock"),
                locked=os.path.join(agents, "locked", "api.sock"),
                missing=os.path.join(base, "none.sock"),
                proposal=proposal,
                driver=driver,
                gate=os.path.join(base, "gate"),
            )
    finally:
        rmtree(base)


# --- the clients ---------------------------------------------------------------


@dataclass
class Seen:
    """What one client made of one error."""

    client: str
    reason: str | None
    data: dict[str, Any]
    retryable: bool
    exit: int | None = None
    text: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def by_python(socket: str, method: str, params: dict[str, Any]) -> Seen:
    try:
        with Client(socket) as c:
            result = c.request(method, params, dict)
    except errors.RemoteError as exc:
        return Seen(
            "python",
            exc.reason,
            dict(exc.data),
            isinstance(exc, errors.UnavailableError | errors.DeadlineExceededError),
            text=exc.message,
            extra={"code": exc.code, "class": type(exc).__name__},
        )
    except errors.DaemonUnreachableError as exc:
        return Seen(
            "python",
            exc.reason,
            {},
            False,
            text=str(exc),
            extra={"code": None, "class": type(exc).__name__},
        )
    raise AssertionError(f"python: no error, {result!r}")


def ctl(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = cli.main(list(argv))
    return status, out.getvalue(), err.getvalue()


def own_lines(err: str) -> list[str]:
    """memorizzctl's lines of ``err``: its error line and the indented ones
    after it (the in-process daemon's log lines may land there too)."""
    lines: list[str] = []
    for line in err.splitlines():
        if line.startswith("memorizzctl: ") or (lines and line.startswith("  ")):
            lines.append(line)
    return lines


def by_ctl(socket: str, argv: list[str]) -> tuple[Seen, Seen]:
    """memorizzctl plain (the stderr line) and with --json (the error line)."""
    status, out, err = ctl("--socket", socket, *argv)
    assert out == "", out
    lines = own_lines(err)
    assert lines, err
    assert lines[0].startswith("memorizzctl: error: "), err
    found = re.search(r" \(([a-z_]+)\)$", lines[0])
    plain = Seen(
        "memorizzctl",
        found.group(1) if found else None,
        {},
        status == 75,
        exit=status,
        text="\n".join(lines),
    )
    status_json, out, err = ctl("--json", "--socket", socket, *argv)
    assert own_lines(err) == [], err
    assert out.count("\n") == 1, out
    body = msgspec.json.decode(out)["error"]
    assert set(body) == {"message", "reason", "data"}
    as_json = Seen(
        "memorizzctl --json",
        body["reason"],
        body["data"],
        status_json == 75,
        exit=status_json,
        text=body["message"],
    )
    return plain, as_json


def node_requests(world: World, requests: list[dict[str, Any]]) -> list[Any]:
    done = subprocess.run(
        [
            node("the thin clients' battery"),
            world.driver,
            NODE_CLIENT,
            msgspec.json.encode(requests).decode(),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    seen: list[Any] = msgspec.json.decode(done.stdout)
    return seen


def node_seen(answer: dict[str, Any]) -> Seen:
    assert "error" in answer, answer
    error = answer["error"]
    return Seen(
        "node",
        error["reason"],
        error["data"],
        error["retryable"],
        text=error["message"],
        extra={"code": error["code"], "class": error["name"]},
    )


def by_node(world: World, socket: str, method: str, params: dict[str, Any]) -> Seen:
    (answer,) = node_requests(
        world, [{"socket": socket, "method": method, "params": params}]
    )
    return node_seen(answer)


def mz_run(socket: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["/bin/sh", MZ, "-s", socket, *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def mz_seen(done: subprocess.CompletedProcess[str]) -> Seen:
    assert done.stdout == "", done
    lines = done.stderr.splitlines()
    assert lines, done
    assert lines[0].startswith("mz: "), done
    found = re.search(r" \(([a-z_]+)\)$", lines[0])
    data: dict[str, Any] = {}
    for line in lines[1:]:
        hint = re.fullmatch(r"mz: retry after ([0-9.]+) s", line)
        assert hint is not None, done.stderr
        data["retry_after_s"] = float(hint.group(1))
    return Seen(
        "mz",
        found.group(1) if found else None,
        data,
        done.returncode == 75,
        exit=done.returncode,
        text=lines[0],
    )


def by_mz(socket: str, *argv: str) -> Seen:
    return mz_seen(mz_run(socket, *argv))


# --- the cases -----------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    socket: str  # a World attribute
    method: str
    params: dict[str, Any]
    ctl: list[str]
    mz: list[str]
    code: int | None
    reason: str
    exit: int
    data: dict[str, Any]  # what the daemon's data holds (None: any value)
    python_class: str


BIG = {"text": "x" * 3000}
CASES: dict[str, Case] = {
    "unknown_server": Case(
        "operator",
        "tools/call",
        {"server": "nope", "name": "echo", "arguments": {}},
        ["mcp", "call", "nope", "echo"],
        ["call", "nope", "echo", "{}"],
        -32002,
        "unknown_server",
        1,
        {"server": "nope"},
        "NotFoundError",
    ),
    "invalid_params": Case(
        "operator",
        "tasks/result",
        {"task_id": "bogus"},
        ["mcp", "task", "result", "bogus"],
        ["raw", "tasks/result", '{"task_id": "bogus"}'],
        -32602,
        "invalid_params",
        1,
        {"task_id": "bogus"},
        "InvalidParamsError",
    ),
    "permission_denied_socket": Case(
        "locked",
        "daemon/hello",
        {"protocol_version": 1},
        ["mcp", "tools", "t"],
        ["hello"],
        -32001,
        "permission_denied",
        77,
        {},
        "PermissionDeniedError",
    ),
    "permission_denied_method": Case(
        "bot",
        "servers/status",
        {},
        ["mcp", "status"],
        ["raw", "servers/status"],
        -32001,
        "permission_denied",
        77,
        {},
        "PermissionDeniedError",
    ),
    "approval_required": Case(
        "operator",
        "tools/call",
        {"server": "t", "name": "record", "arguments": {"tag": "x"}},
        ["mcp", "call", "t", "record", "--arguments", '{"tag": "x"}'],
        ["call", "t", "record", '{"tag": "x"}'],
        -32009,
        "approval_required",
        1,
        {
            "server": "t",
            "tool": "record",
            "risk": "destructive",
            "decision": "ask",
            "proposal_id": None,
            "expires_at": None,
        },
        "ApprovalRequiredError",
    ),
    "not_approved": Case(
        "operator",
        "approvals/resume",
        {"id": "PROPOSAL"},
        ["mcp", "resume", "PROPOSAL"],
        ["raw", "approvals/resume", '{"id": "PROPOSAL"}'],
        -32008,
        "not_approved",
        1,
        {"id": "PROPOSAL", "status": "pending"},
        "ConflictError",
    ),
    "timeout": Case(
        "operator",
        "tools/call",
        {"server": "t", "name": "slow", "arguments": {"seconds": 2}, "timeout_s": 0.2},
        [
            "mcp",
            "call",
            "t",
            "slow",
            "--arguments",
            '{"seconds": 2}',
            "--timeout",
            "0.2",
        ],
        [
            "raw",
            "tools/call",
            (
                '{"server": "t", "name": "slow", "arguments": {"seconds": 2},'
                ' "timeout_s": 0.2}'
            ),
        ],
        -32005,
        "timeout",
        75,
        {"server": "t", "timeout_s": 0.2},
        "DeadlineExceededError",
    ),
    "result_too_large": Case(
        "operator",
        "tools/call",
        {"server": "tiny", "name": "huge", "arguments": {"n_bytes": 5000}},
        ["mcp", "call", "tiny", "huge", "--arguments", '{"n_bytes": 5000}'],
        ["call", "tiny", "huge", '{"n_bytes": 5000}'],
        -32007,
        "result_too_large",
        1,
        {"server": "tiny"},
        "TooLargeError",
    ),
    "server_unavailable": Case(
        "operator",
        "tools/call",
        {"server": "broken", "name": "x", "arguments": {}},
        ["mcp", "call", "broken", "x"],
        ["call", "broken", "x", "{}"],
        -32003,
        "server_unavailable",
        75,
        {"server": "broken", "state": None, "retry_after_s": None},
        "UnavailableError",
    ),
    "upstream_error": Case(
        "operator",
        "resources/read",
        {"server": "t", "uri": "test://nope"},
        ["mcp", "read", "t", "test://nope"],
        ["raw", "resources/read", '{"server": "t", "uri": "test://nope"}'],
        -32006,
        "upstream_error",
        1,
        {
            "server": "t",
            "upstream_code": -32602,
            "upstream_data": {"uri": "test://nope"},
        },
        "UpstreamError",
    ),
    "frame_too_large": Case(
        "small",
        "tools/call",
        {"server": "t", "name": "echo", "arguments": BIG},
        ["mcp", "call", "t", "echo", "--arguments", msgspec.json.encode(BIG).decode()],
        ["call", "t", "echo", msgspec.json.encode(BIG).decode()],
        -32600,
        "frame_too_large",
        1,
        {},
        "InvalidRequestError",
    ),
    "daemon_unreachable": Case(
        "missing",
        "daemon/hello",
        {"protocol_version": 1},
        ["mcp", "list"],
        ["hello"],
        None,
        "daemon_unreachable",
        69,
        {},
        "DaemonUnreachableError",
    ),
}


def _fill(value: Any, proposal: str) -> Any:
    """``value`` with PROPOSAL replaced by the pending proposal's id."""
    if isinstance(value, str):
        return value.replace("PROPOSAL", proposal)
    if isinstance(value, list):
        return [_fill(v, proposal) for v in value]
    if isinstance(value, dict):
        return {k: _fill(v, proposal) for k, v in value.items()}
    return value


def check_daemon_data(case: Case, seen: Seen) -> None:
    """The daemon's data, as ``seen`` carries it: every key, each stable value."""
    assert set(seen.data) == set(case.data), (seen.client, seen.data)
    for key, value in case.data.items():
        if isinstance(value, float):  # a deadline the CLI counts down as it goes
            assert abs(seen.data[key] - value) <= 0.05, (seen.client, key, seen.data)
        elif value is not None:
            assert seen.data[key] == value, (seen.client, key, seen.data)


def check_all(case: Case, seen: list[Seen], *, proposal: str = "") -> None:
    """Every client: the reason, retryable as the table says, the exit
    statuses of the CLIs, and the data (each that carries it)."""
    retryable = case.reason in RETRYABLE
    for s in seen:
        if case.code is None and s.client in ("memorizzctl", "mz"):
            # the client's own error: no "(reason)" on the line (the daemon's
            # errors only, docs/protocol.md); the exit status says it
            assert s.reason is None, s
        else:
            assert s.reason == case.reason, s
        assert s.retryable is retryable, s  # for the CLIs: exit 75
        if s.client in ("python", "node"):
            assert s.extra["code"] == case.code, s
            assert s.extra["class"] == case.python_class, s
        else:  # the CLIs: their documented exit statuses
            assert s.exit == case.exit, s
        carries_data = s.client in ("python", "node", "memorizzctl --json")
        if carries_data and case.code is not None:
            check_daemon_data(case, s)
        # the retry hint reaches every client but plain memorizzctl (--json's)
        if "retry_after_s" in case.data and s.client != "memorizzctl":
            assert isinstance(s.data["retry_after_s"], int | float), s
            assert s.data["retry_after_s"] >= 0, s
        if case.reason == "approval_required":
            # the proposal to approve: in the data, or said in the text
            if s.client in ("python", "node", "memorizzctl --json"):
                assert re.fullmatch(r"p_[0-9a-f]+", s.data["proposal_id"]), s
                assert s.data["proposal_id"] in s.text
            else:
                assert re.search(r"\bproposal p_[0-9a-f]+\b", s.text), s
            if s.client == "memorizzctl":
                found = re.search(r"proposal (p_[0-9a-f]+)", s.text)
                assert found is not None
                assert f"memorizzctl mcp approve {found.group(1)}" in s.text, s


@pytest.mark.parametrize("name", list(CASES))
def test_every_client_says_the_error_the_same_way(world: World, name: str) -> None:
    case = CASES[name]
    case = Case(**{k: _fill(v, world.proposal) for k, v in vars(case).items()})
    socket = world.socket(case.socket)
    seen = [
        by_python(socket, case.method, case.params),
        *by_ctl(socket, case.ctl),
        by_node(world, socket, case.method, case.params),
        by_mz(socket, *case.mz),
    ]
    check_all(case, seen)
    if name == "daemon_unreachable":  # the client's own: where it looked
        _, _, as_json, by_js, _ = seen
        assert as_json.data == {"socket": socket}
        assert by_js.data["socket"] == socket
        assert by_js.data["errno"] == "ENOENT"
        assert all(socket in s.text for s in seen), seen


def test_a_tools_own_failure_is_a_result_in_every_client(world: World) -> None:
    """An unknown tool of an SDK server is its isError result, not an error."""
    with Client(world.operator) as c:
        assert c.call_tool("t", "nosuchtool", {}).is_error is True
    status, out, err = ctl("--socket", world.operator, "mcp", "call", "t", "nosuchtool")
    assert (status, out) == (1, "")
    assert own_lines(err) == ["memorizzctl: error: Unknown tool: nosuchtool"]
    status, out, err = ctl(
        "--json", "--socket", world.operator, "mcp", "call", "t", "nosuchtool"
    )
    assert status == 1
    assert msgspec.json.decode(out)["isError"] is True
    (answer,) = node_requests(
        world,
        [
            {
                "socket": world.operator,
                "method": "tools/call",
                "params": {"server": "t", "name": "nosuchtool", "arguments": {}},
            }
        ],
    )
    assert answer["result"]["isError"] is True
    done = mz_run(world.operator, "call", "t", "nosuchtool")
    assert (done.returncode, done.stderr) == (1, "")
    assert msgspec.json.decode(done.stdout)["isError"] is True


def test_an_agent_socket_at_its_max_in_flight_is_overloaded_everywhere(
    world: World,
) -> None:
    """``bot`` takes one request at a time: with a call held there, each
    client's request is refused ``overloaded``, worth retrying, with a hint."""
    case = Case(
        "bot",
        "tools/call",
        {"server": "t", "name": "echo", "arguments": {"text": "x"}},
        ["mcp", "call", "t", "echo", "--arguments", '{"text": "x"}'],
        ["call", "t", "echo", '{"text": "x"}'],
        -32003,
        "overloaded",
        75,
        {"retry_after_s": None},
        "UnavailableError",
    )
    held: list[object] = []

    def hold() -> None:
        with Client(world.bot) as c:
            held.append(c.call_tool("t", "gate", {"path": world.gate}))

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        with Client(world.operator) as c:
            wait_until(
                lambda: c.server_status("t")[0].in_flight >= 1,
                what="the held call",
            )
        seen = [
            by_python(world.bot, case.method, case.params),
            *by_ctl(world.bot, case.ctl),
            by_node(world, world.bot, case.method, case.params),
            by_mz(world.bot, *case.mz),
        ]
    finally:
        Path(world.gate).touch()
        holder.join(20)
    assert held, "the held call did not answer"
    for s in seen:  # data: retry_after_s, and whatever else the daemon says
        s.data = {k: v for k, v in s.data.items() if k == "retry_after_s"} or s.data
    check_all(case, seen)


def _drain_config(base: str) -> str:
    args = launch_args(MCP_SERVER, "stdio")
    return (
        "drain_timeout_s = 0.5\n"
        "[[servers]]\n"
        'name = "t"\n'
        'transport = "stdio"\n'
        f"command = {msgspec.json.encode(sys.executable).decode()}\n"
        f"args = {msgspec.json.encode(args).decode()}\n"
    )


def test_the_daemon_going_away_mid_call_is_shutting_down_everywhere() -> None:
    """SIGTERM with a slow call of each client in flight: the drain runs out
    (0.5 s) and each gets ``shutting_down``, worth retrying (memorizzctl, the
    executable, and mz exit 75)."""
    exe = node("the thin clients' battery")
    with configured_daemon("mz-drain-", _drain_config, ready=("t",)) as d:
        driver = os.path.join(d.base, "driver.mjs")
        Path(driver).write_text(DRIVER, encoding="utf-8")
        params = {"server": "t", "name": "slow", "arguments": {"seconds": 30}}
        from_python: list[Seen] = []
        caller = threading.Thread(
            target=lambda: from_python.append(by_python(d.socket, "tools/call", params))
        )
        caller.start()
        argv = ["mcp", "call", "t", "slow", "--arguments", '{"seconds": 30}']
        procs = {
            "memorizzctl": subprocess.Popen(
                [MEMORIZZCTL, "--socket", d.socket, *argv],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            ),
            "memorizzctl --json": subprocess.Popen(
                [MEMORIZZCTL, "--json", "--socket", d.socket, *argv],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            ),
            "node": subprocess.Popen(
                [
                    exe,
                    driver,
                    NODE_CLIENT,
                    msgspec.json.encode(
                        [{"socket": d.socket, "method": "tools/call", "params": params}]
                    ).decode(),
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            ),
            "mz": subprocess.Popen(
                [
                    "/bin/sh",
                    MZ,
                    "-s",
                    d.socket,
                    "call",
                    "t",
                    "slow",
                    '{"seconds": 30}',
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            ),
        }
        try:
            with d.client() as c:
                wait_until(
                    lambda: c.server_status("t")[0].in_flight >= 5,
                    what="five slow calls in flight",
                )
            assert d.stop(signal.SIGTERM) == 0
            outputs = {name: p.communicate(timeout=30) for name, p in procs.items()}
        finally:
            for p in procs.values():
                if p.poll() is None:
                    p.kill()
                    p.communicate()
            caller.join(30)
    seen = list(from_python)
    out, err = outputs["memorizzctl"]
    lines = own_lines(err)
    found = re.search(r" \(([a-z_]+)\)$", lines[0]) if lines else None
    seen.append(
        Seen(
            "memorizzctl",
            found.group(1) if found else err,
            {},
            procs["memorizzctl"].returncode == 75,
            exit=procs["memorizzctl"].returncode,
        )
    )
    out, err = outputs["memorizzctl --json"]
    body = msgspec.json.decode(out)["error"]
    seen.append(
        Seen(
            "memorizzctl --json",
            body["reason"],
            body["data"],
            procs["memorizzctl --json"].returncode == 75,
            exit=procs["memorizzctl --json"].returncode,
        )
    )
    out, _ = outputs["node"]
    (answer,) = msgspec.json.decode(out)
    seen.append(node_seen(answer))
    out, err = outputs["mz"]
    seen.append(
        mz_seen(subprocess.CompletedProcess([], procs["mz"].returncode, out, err))
    )
    case = Case(
        "operator",
        "tools/call",
        params,
        argv,
        [],
        -32003,
        "shutting_down",
        75,
        {},
        "UnavailableError",
    )
    assert len(seen) == 5, seen
    check_all(case, seen)
