"""Numbers at and past their bounds: every duration and count of the config
file has a maximum (``memorizzd.config.BOUNDS``: a year for a duration, a
million for a count, 1 MiB for a request line). Past it the file is refused
with a ConfigError naming the key and the maximum, by the start,
``--check-config`` and every reload (``daemon reload`` and SIGHUP keep the
config in force and say why); at it, a real daemon serves, on the paths that
use the value.

Found by trying enormous but finite values on a real daemon:
``approval_ttl_s = 1e20`` (or ``2**63``, ``1e300``) was taken, then every call
that made a proposal was an internal error (``time.gmtime`` of its expiry:
OverflowError), the proposal stored all the same; a count of more than 308
digits crashed ``--check-config`` and the start (``OverflowError: int too
large to convert to float``, in the range check itself) and was an internal
error to a reload; so was an integer of more than 4300 digits, whatever its
key (``ValueError`` in ``tomllib``). The other values (1e300 s deadlines,
2**63 connections) were taken and served as deadlines that never come.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest

from memorizz import Client
from memorizz.api.errors import (
    ApprovalRequiredError,
    InvalidParamsError,
    UnavailableError,
)
from memorizz.api.protocol import MAX_FRAME
from memorizzd.__main__ import EX_CONFIG
from memorizzd.__main__ import main as daemon_main
from memorizzd.config import Config, ConfigError, Limits, load
from memorizzd.listeners import face_socket_path
from tests.harness import (
    ASKING_SERVER,
    INITIALIZE,
    LEGACY_SERVER,
    MCP_SERVER,
    DaemonHarness,
    daemon_process,
    launch_args,
    rmtree,
    short_tempdir,
    spawned_spec,
    wait_until,
)
from tests.peers import ME

YEAR_S = 365 * 86400.0
MAXIMA: dict[str, float] = {
    "connect_wait_s": YEAR_S,
    "backoff_initial_s": YEAR_S,
    "backoff_max_s": YEAR_S,
    "health_interval_s": YEAR_S,
    "health_timeout_s": YEAR_S,
    "drain_timeout_s": YEAR_S,
    "approval_ttl_s": YEAR_S,
    "face_approval_wait_s": YEAR_S,
    "upstream_request_wait_s": YEAR_S,
    "max_in_flight_per_server": 1_000_000,
    "max_in_flight_per_connection": 1_000_000,
    "list_page_limit": 1_000_000,
    "limits.max_connections": 1_000_000,
    "limits.max_connections_per_uid": 1_000_000,
    "limits.max_in_flight": 1_000_000,
    "limits.max_request_bytes": MAX_FRAME,
    "limits.max_open_proposals": 1_000_000,
    "limits.first_frame_timeout_s": YEAR_S,
    "limits.write_timeout_s": YEAR_S,
    "limits.idle_timeout_s": YEAR_S,
}
"""The maxima docs/configuration.md gives ("Numeric ranges")."""
KEYS = list(MAXIMA)
_pause = threading.Event()  # never set: wait() is a sleep


def _most(key: str) -> float:
    return MAXIMA[key]


def _at_most(key: str) -> str:
    """How an error says the maximum: ``at most 31536000 s (365 days)``."""
    unit = {YEAR_S: " s (365 days)", MAX_FRAME: " bytes (1 MiB)"}.get(_most(key), "")
    return f"at most {int(_most(key))}{unit}"


def _is_duration(key: str) -> bool:
    return key.endswith("_s")


def _past(key: str) -> list[float]:
    """Values past ``key``'s bound: just past it, and enormous ones (the last
    no float holds: msgspec's "Number out of range" for a duration)."""
    if _is_duration(key):
        return [_most(key) + 1, 1e20, 1e300, 2**63, 10**30, 10**400]
    return [int(_most(key)) + 1, 2**63, 10**30, 10**400]


def _toml(value: float) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def _settings(values: dict[str, float]) -> tuple[str, str]:
    """``values`` by key as the file's top-level lines and as the lines of
    a ``[profiles.limits]`` table."""
    top = "".join(
        f"{key} = {_toml(v)}\n" for key, v in values.items() if "." not in key
    )
    limits = "".join(
        f"{key.split('.', 1)[1]} = {_toml(v)}\n"
        for key, v in values.items()
        if key.startswith("limits.")
    )
    return top, limits


def _label(key: str) -> str:
    """The key as an error names it."""
    return f"profile 'p': {key}" if key.startswith("limits.") else key


def _in_force(h: DaemonHarness, key: str) -> float:
    config = h.daemon.reloader.config
    if key.startswith("limits."):
        (profile,) = config.profiles
        return float(getattr(profile.limits, key.split(".", 1)[1]))
    return float(getattr(config, key))


def _default(key: str) -> float:
    """``key``'s default, of its own type (an int for a count)."""
    if key.startswith("limits."):
        found: float = getattr(Limits(), key.split(".", 1)[1])
    else:
        found = getattr(Config(), key)
    return found


# --- every numeric setting is bounded ------------------------------------------------


def test_every_numeric_setting_of_the_file_has_its_bound_in_one_table() -> None:
    from memorizzd.config import BOUNDS  # the loader's one table

    numeric = {
        prefix + f.name
        for struct, prefix in ((Config, ""), (Limits, "limits."))
        for f in msgspec.structs.fields(struct)
        if f.type in (int, float)
    }
    assert numeric == set(MAXIMA)
    assert {key: bound.most for key, bound in BOUNDS.items()} == MAXIMA
    assert {key for key, bound in BOUNDS.items() if bound.zero} == {
        "drain_timeout_s",
        "face_approval_wait_s",
    }


def _short(text: str) -> str:
    return text if len(text) <= 20 else f"{len(text)}-digits"


def _past_params() -> list[Any]:
    return [
        pytest.param(key, value, id=f"{key}={_short(_toml(value))}")
        for key in KEYS
        for value in _past(key)
    ]


def _write(base: str, text: str) -> Path:
    path = Path(base, "memorizzd.toml")
    path.write_text(
        f'socket = "{base}/d.sock"\nstate_dir = "{base}/state"\n' + text,
        encoding="utf-8",
    )
    return path


def _profile(limits: str) -> str:
    return f'[[profiles]]\nname = "p"\nuids = [{ME}]\n[profiles.limits]\n{limits}'


@pytest.mark.parametrize(("key", "value"), _past_params())
def test_past_its_bound_a_setting_is_refused_naming_the_key_and_the_maximum(
    base_dir: str, key: str, value: float
) -> None:
    top, limits = _settings({key: value})
    path = _write(base_dir, top + _profile(limits))
    with pytest.raises(ConfigError) as refused:
        load(str(path))
    message = str(refused.value)
    assert message.startswith(f"{path}: "), message
    assert key in message
    assert _at_most(key) in message
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        status = daemon_main(["--config", str(path), "--check-config"])
    assert status == EX_CONFIG, err.getvalue()
    assert err.getvalue() == f"memorizzd: invalid configuration: {message}\n"


DURATIONS = [key for key in KEYS if _is_duration(key)]


@pytest.mark.parametrize("value", [0.0009, 1e-9, 5e-324])
@pytest.mark.parametrize("key", DURATIONS)
def test_a_duration_under_a_millisecond_is_refused(
    base_dir: str, key: str, value: float
) -> None:
    """Above 0 but under 1 ms: ``backoff_initial_s = 5e-324`` restarted a
    failing server as fast as it exited, ``health_interval_s`` probed
    without a pause. Those that may be 0 still may."""
    top, limits = _settings({key: value})
    with pytest.raises(ConfigError) as refused:
        load(str(_write(base_dir, top + _profile(limits))))
    assert key in str(refused.value)
    assert "must be at least 0.001 s" in str(refused.value)
    top, limits = _settings({key: 0.001})
    load(str(_write(base_dir, top + _profile(limits))))  # a millisecond is taken


@pytest.mark.parametrize("key", KEYS)
def test_at_its_bound_a_setting_loads(base_dir: str, key: str) -> None:
    top, limits = _settings({key: _most(key)})
    config = load(str(_write(base_dir, top + _profile(limits))))
    (profile,) = config.profiles
    found = getattr(profile.limits if "." in key else config, key.split(".")[-1])
    assert found == _most(key)


@pytest.mark.parametrize(
    ("text", "said"),
    [
        pytest.param(
            f"list_page_limit = 1{'0' * 400}\n",
            "list_page_limit must be at most 1000000, not an integer of about 401"
            " digits",
            id="count-of-401-digits",  # OverflowError in the range check
        ),
        pytest.param(
            f"approval_ttl_s = 1{'0' * 400}\n",
            "Number out of range - at `$.approval_ttl_s`: at most 31536000 s"
            " (365 days)",
            id="duration-of-401-digits",
        ),
        pytest.param(
            f"bogus = 1{'0' * 4400}\n",
            "an integer of more than 4300 digits (no setting takes one)",
            id="integer-of-4401-digits",  # ValueError in tomllib
        ),
        pytest.param(
            f"[operators]\ngroups = [0x{'f' * 4000}]\n",
            "operators.groups: gid an integer of about 4817 digits is out of range",
            id="gid-of-4817-digits",  # str() of it raised ValueError
        ),
    ],
)
def test_an_integer_of_hundreds_of_digits_is_one_config_error(
    base_dir: str, text: str, said: str
) -> None:
    path = _write(base_dir, text)
    with pytest.raises(ConfigError) as refused:
        load(str(path))
    assert str(refused.value).startswith(f"{path}: {said}"), str(refused.value)


# --- a daemon with every setting at its bound ----------------------------------------


@dataclass
class Maxed:
    h: DaemonHarness
    base: str
    path: Path
    text: Callable[[dict[str, float]], str]
    """The file, with these settings changed (``{}``: the maxed one)."""

    @property
    def agent(self) -> str:
        return os.path.join(self.base, "agents", "p", "api.sock")


AT_MOST = {key: _most(key) for key in KEYS if key != "drain_timeout_s"}
"""Every bound at once, but the drain's (a year's drain would hold the
module's end for as long as anything is in flight): its own test below."""


def _zygote_args(script: str) -> str:
    return repr(launch_args(script, "stdio"))


def _maxed_text(base: str, changed: dict[str, float]) -> str:
    top, limits = _settings({**AT_MOST, **changed})
    true = shutil.which("true")
    return (
        f'socket = "{base}/d.sock"\nstate_dir = "{base}/state"\n'
        f'agents_dir = "{base}/agents"\n{top}'
        f'[[servers]]\nname = "t"\ntransport = "stdio"\ncommand = "{sys.executable}"\n'
        f"args = {_zygote_args(MCP_SERVER)}\n"
        f'env = {{ CALL_LOG = "{base}/calls.log" }}\n'
        "max_result_bytes = 8000000\n"  # an echo of 1 MiB, twice (structuredContent)
        f'[[servers]]\nname = "ask"\ntransport = "stdio"\n'
        f'command = "{sys.executable}"\nargs = {_zygote_args(ASKING_SERVER)}\n'
        'protocol = "legacy"\n'
        f'[[servers]]\nname = "paged"\ntransport = "stdio"\n'
        f'command = "{sys.executable}"\nargs = ["{LEGACY_SERVER}"]\n'
        'env = { PAGES = "5" }\n'
        f'[[servers]]\nname = "down"\ntransport = "stdio"\ncommand = "{true}"\n'
        f'[[profiles]]\nname = "p"\nservers = ["t", "ask", "paged", "late"]\n'
        f"uids = [{ME}]\n[profiles.limits]\n{limits}"
    )


@pytest.fixture(scope="module")
def maxed() -> Iterator[Maxed]:
    base = short_tempdir()
    os.chmod(base, 0o755)  # noqa: S103 - the agent directory lives below

    def text(changed: dict[str, float]) -> str:
        return _maxed_text(base, changed)

    path = Path(base, "memorizzd.toml")
    path.write_text(text({}), encoding="utf-8")
    try:
        with DaemonHarness.running(load(str(path))) as h:
            for name in ("t", "ask", "paged"):
                h.wait_ready(name)
            yield Maxed(h, base, path, text)
    finally:
        rmtree(base)


def _serves(m: Maxed) -> None:
    """Health probes a year apart, each given a year: the servers serve."""
    with m.h.client() as c:
        assert c.ping("t").latency_ms >= 0
        assert c.call_tool("t", "echo", {"text": "x"}).content[0]["text"] == "x"
        assert {s.name: s.state for s in c.server_status()}["t"] == "ready"


def _connect_while_connecting(m: Maxed) -> None:
    """A call to a server still connecting (an SDK server spawned: a second
    to start) waits for it, within its own deadline however long
    ``connect_wait_s`` is; so does ``servers/test``."""
    with m.h.client() as c, Client(m.agent) as agent:
        c.add_server(spawned_spec("late"))
        tested: list[str] = []

        def test() -> None:
            with m.h.client() as other:
                tested.append(other.test_server("late", timeout_s=30).outcome)

        tester = threading.Thread(target=test)
        try:
            assert c.server_status("late")[0].state == "connecting"
            tester.start()
            said = agent.call_tool("late", "echo", {"text": "late"}, timeout_s=30)
            assert said.content[0]["text"] == "late"
            tester.join(30)
            assert tested == ["ok"]
        finally:
            c.remove_server("late")


def _backs_off(m: Maxed) -> None:
    """A server that fails waits its backoff (up to a year): calls are told
    when to come back, and the status renders."""
    with m.h.client() as c:
        wait_until(
            lambda: (
                {s.name: s.state for s in c.server_status()}["down"]
                in ("backoff", "failed")
            ),
            what="down backing off",
        )
        with pytest.raises(UnavailableError) as refused:
            c.call_tool("down", "anything", {})
        retry = refused.value.data["retry_after_s"]
        assert YEAR_S / 2 - 60 < retry <= YEAR_S, retry
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert m.h.ctl("mcp", "status") == 0
    assert "down" in out.getvalue()


def _propose(agent: Client, tag: str) -> tuple[str, float, str]:
    with pytest.raises(ApprovalRequiredError) as asked:
        agent.call_tool("t", "record", {"tag": tag})
    data = asked.value.data
    return str(data["proposal_id"]), float(data["expires_at"]), asked.value.message


def _approval_lives_a_year(m: Maxed) -> None:
    """A proposal expires a year on, said as a time of day in the refusal,
    listed by the client and memorizzctl (table and JSON), then approved and
    run once."""
    with Client(m.agent) as agent, m.h.client() as operator:
        before = time.time()
        proposal_id, expires_at, message = _propose(agent, "a-year")
        assert before + YEAR_S - 60 < expires_at <= time.time() + YEAR_S
        day_time = time.strftime("%H:%M:%S UTC", time.gmtime(expires_at))
        assert f"(expires {day_time})" in message
        [listed] = [p for p in operator.list_approvals() if p.id == proposal_id]
        assert listed.expires_at == expires_at
        table, as_json = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(table):
            assert m.h.ctl("mcp", "approvals") == 0
        with contextlib.redirect_stdout(as_json):
            assert m.h.ctl("--json", "mcp", "approvals") == 0
        [row] = [line for line in table.getvalue().splitlines() if proposal_id in line]
        assert re.search(r"\bin 36[45]d\b", row), row
        decoded = msgspec.json.decode(as_json.getvalue())["proposals"]
        assert [p["expires_at"] for p in decoded if p["id"] == proposal_id] == [
            expires_at
        ]
        assert operator.approve(proposal_id).status == "approved"
        assert agent.resume(proposal_id).content[0]["text"] == "recorded a-year"


def _proposals_open(m: Maxed) -> None:
    """Open proposals are counted against a cap of a million."""
    with Client(m.agent) as agent, m.h.client() as operator:
        ids = [_propose(agent, f"open-{i}")[0] for i in range(3)]
        pending = {p.id for p in agent.list_approvals(status="pending")}
        assert set(ids) <= pending
        for proposal_id in ids:
            assert operator.cancel_approval(proposal_id).status == "cancelled"


class _Face:
    """An MCP session on the profile's face, raw lines."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(30)
        self.sock.connect(path)
        self.buffer = b""
        self.notes: list[dict[str, Any]] = []
        self.ask(INITIALIZE)
        self.sock.sendall(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')

    def ask(self, message: dict[str, Any]) -> dict[str, Any]:
        self.sock.sendall(msgspec.json.encode(message) + b"\n")
        while True:
            while b"\n" not in self.buffer:
                chunk = self.sock.recv(65536)
                if not chunk:
                    raise EOFError("the face closed the session")
                self.buffer += chunk
            line, self.buffer = self.buffer.split(b"\n", 1)
            found: dict[str, Any] = msgspec.json.decode(line)
            if "method" not in found:
                return found
            self.notes.append(found)


def _face_waits(m: Maxed) -> None:
    """A face call held for the operator may wait a year: it tells its
    client so, and runs once approved."""
    face = _Face(face_socket_path(m.agent))
    approved = threading.Event()

    def operator() -> None:
        with m.h.client() as c:
            wait_until(lambda: bool(c.list_approvals(status="pending")))
            for proposal in c.list_approvals(status="pending"):
                c.approve(proposal.id)
            approved.set()

    try:
        listed = face.ask(
            {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}
        )
        [name] = [
            t["name"]
            for t in listed["result"]["tools"]
            if re.fullmatch(r"(t__)?record", t["name"])
        ]
        thread = threading.Thread(target=operator)
        thread.start()
        answer = face.ask(
            {
                "jsonrpc": "2.0",
                "id": 3,
                "method": "tools/call",
                "params": {
                    "name": name,
                    "arguments": {"tag": "face"},
                    "_meta": {"progressToken": 1},
                },
            }
        )
        thread.join(30)
    finally:
        face.sock.close()  # a call still held is abandoned with its session
    assert approved.is_set()
    assert answer["result"]["content"][0]["text"] == "recorded face", answer
    left = [
        int(found[1])
        for note in face.notes
        if (found := re.search(r"\((\d+) s left\)", note["params"]["message"]))
    ]
    assert left, face.notes
    assert YEAR_S - 60 < left[0] <= YEAR_S


def _elicits(m: Maxed) -> None:
    """An upstream's request to the caller waits for its answer."""

    def elicit(params: dict[str, Any]) -> dict[str, Any]:
        _pause.wait(0.2)
        return {"action": "accept", "content": {"name": "Ada"}}

    with Client(m.agent) as agent:
        said = agent.call_tool("ask", "ask_name", on_elicit=elicit)
    assert said.content[0]["text"] == "hello Ada"


def _lists(m: Maxed) -> None:
    """Listings follow the upstream's pages (a million allowed)."""
    with Client(m.agent) as agent:
        names = [t.name for t in agent.list_tools("paged", refresh=True)]
    assert names == ["hello", "p2", "p3", "p4", "p5"]


def _many_connections(m: Maxed) -> None:
    clients = [Client(m.agent) for _ in range(12)]
    try:
        for c in clients:
            assert c.call_tool("t", "echo", {"text": "c"}).content[0]["text"] == "c"
    finally:
        for c in clients:
            c.close()


def _slow_connection(m: Maxed) -> None:
    """One connection of the agent socket, slow at each step: its first line
    late, eight calls pipelined (in flight at once on it, on the socket and
    on the server), their replies read late; then idle, then one more."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(30)
        sock.connect(m.agent)
        _pause.wait(0.3)  # the first line: late
        calls = b"".join(
            msgspec.json.encode(
                {
                    "jsonrpc": "2.0",
                    "id": i,
                    "method": "tools/call",
                    "params": {
                        "server": "t",
                        "name": "slow",
                        "arguments": {"seconds": 0.3},
                    },
                }
            )
            + b"\n"
            for i in range(8)
        )
        sock.sendall(calls)
        _pause.wait(0.6)  # the replies: read late
        buffer = b""
        replies: list[dict[str, Any]] = []
        while len(replies) < 8:
            chunk = sock.recv(65536)
            assert chunk, "the daemon closed the connection"
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            replies += [msgspec.json.decode(line) for line in lines]
        assert sorted(r["id"] for r in replies) == list(range(8))
        assert {r["result"]["content"][0]["text"] for r in replies} == {"slept 0.3"}
        _pause.wait(0.3)  # idle
        sock.sendall(b'{"jsonrpc":"2.0","id":9,"method":"daemon/status"}\n')
        while b"\n" not in buffer:
            chunk = sock.recv(65536)
            assert chunk, "the daemon closed the connection"
            buffer += chunk
        assert msgspec.json.decode(buffer.split(b"\n")[0])["id"] == 9


def _large_request(m: Maxed) -> None:
    """A request line of almost 1 MiB is taken."""
    text = "x" * (MAX_FRAME - 4096)
    with Client(m.agent) as agent:
        said = agent.call_tool("t", "echo", {"text": text})
    assert said.content[0]["text"] == text


EXERCISES: dict[str, Callable[[Maxed], None]] = {
    "connect_wait_s": _connect_while_connecting,
    "backoff_initial_s": _backs_off,
    "backoff_max_s": _backs_off,
    "health_interval_s": _serves,
    "health_timeout_s": _serves,
    "approval_ttl_s": _approval_lives_a_year,
    "face_approval_wait_s": _face_waits,
    "upstream_request_wait_s": _elicits,
    "max_in_flight_per_server": _slow_connection,
    "max_in_flight_per_connection": _slow_connection,
    "list_page_limit": _lists,
    "limits.max_connections": _many_connections,
    "limits.max_connections_per_uid": _many_connections,
    "limits.max_in_flight": _slow_connection,
    "limits.max_request_bytes": _large_request,
    "limits.max_open_proposals": _proposals_open,
    "limits.first_frame_timeout_s": _slow_connection,
    "limits.write_timeout_s": _slow_connection,
    "limits.idle_timeout_s": _slow_connection,
}


def test_every_setting_at_its_bound_is_exercised() -> None:
    assert set(EXERCISES) | {"drain_timeout_s"} == set(MAXIMA)


@pytest.mark.parametrize("key", list(EXERCISES))
def test_at_its_bound_a_setting_serves(maxed: Maxed, key: str) -> None:
    assert _in_force(maxed.h, key) == _most(key)
    EXERCISES[key](maxed)


def test_a_drain_of_a_year_waits_for_the_call_in_flight_and_no_longer(
    base_dir: str,
) -> None:
    top, _ = _settings({"drain_timeout_s": YEAR_S})
    path = _write(
        base_dir,
        top
        + f'[[servers]]\nname = "t"\ntransport = "stdio"\ncommand = "{sys.executable}"\n'
        f"args = {_zygote_args(MCP_SERVER)}\n",
    )
    answered: list[str] = []

    def call(h: DaemonHarness) -> None:
        with h.client() as c:
            answered.append(
                c.call_tool("t", "slow", {"seconds": 1.0}).content[0]["text"]
            )

    with DaemonHarness.running(load(str(path))) as h:
        assert h.daemon.reloader.config.drain_timeout_s == YEAR_S
        h.wait_ready("t")
        caller = threading.Thread(target=call, args=(h,))
        caller.start()
        with h.client() as c:
            wait_until(lambda: c.server_status("t")[0].in_flight == 1)
        stopping = time.monotonic()
    took = time.monotonic() - stopping
    caller.join(30)
    assert answered == ["slept 1.0"]
    assert took < 30, took


# --- reloads past a bound: refused, the config in force kept ---------------------------


def _reload(m: Maxed, changed: dict[str, float], extra: str = "") -> tuple[int, str]:
    """Write the file with ``changed``, ``memorizzctl daemon reload``: its
    exit status and what it said."""
    m.path.write_text(m.text(changed) + extra, encoding="utf-8")
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        status = m.h.ctl("daemon", "reload")
    return status, out.getvalue()


@pytest.mark.parametrize("key", KEYS)
def test_a_reload_past_a_bound_is_refused_and_keeps_the_config(
    maxed: Maxed, key: str
) -> None:
    """From the default to past the bound (refused: the default stays, and
    nothing else of the file applies), then to the bound (applied)."""
    default, past = _default(key), _past(key)[1]
    try:
        assert _reload(maxed, {key: default})[0] == 0
        assert _in_force(maxed.h, key) == default
        status, said = _reload(maxed, {key: past}, '[decisions]\nread = "deny"\n')
        assert status == 1, said
        message = f"{_label(key)} must be {_at_most(key)}"
        assert said.startswith("memorizzctl: error: "), said
        assert message in said, said
        assert _in_force(maxed.h, key) == default
        assert maxed.h.daemon.reloader.config.decisions.read == "allow"
        with maxed.h.client() as c:
            last = c.daemon_status().last_reload
            assert last is not None
            assert not last.ok
            assert message in last.message
            with pytest.raises(InvalidParamsError) as refused:
                c.daemon_reload()
            assert refused.value.reason == "invalid_config"
            assert message in refused.value.message
            assert c.call_tool("t", "echo", {"text": "on"}).content[0]["text"] == "on"
        assert _reload(maxed, {key: _most(key)})[0] == 0
        assert _in_force(maxed.h, key) == _most(key)
    finally:
        assert _reload(maxed, {})[0] == 0


@pytest.mark.parametrize(
    ("changed", "extra", "said"),
    [
        pytest.param(
            {"list_page_limit": 10**400},
            "",
            "list_page_limit must be at most 1000000",
            id="count-of-401-digits",
        ),
        pytest.param(
            {},
            f'[[profiles]]\nname = "q"\nlimits = {{ max_in_flight = 1{"0" * 4400} }}\n',
            "an integer of more than 4300 digits",
            id="integer-of-4401-digits",
        ),
    ],
)
def test_a_reload_of_hundreds_of_digits_is_refused_not_an_internal_error(
    maxed: Maxed, changed: dict[str, float], extra: str, said: str
) -> None:
    try:
        maxed.path.write_text(maxed.text(changed) + extra, encoding="utf-8")
        with maxed.h.client() as c:
            with pytest.raises(InvalidParamsError) as refused:
                c.daemon_reload()
            assert refused.value.reason == "invalid_config"
            assert said in refused.value.message
            assert c.call_tool("t", "echo", {"text": "on"}).content[0]["text"] == "on"
    finally:
        assert _reload(maxed, {})[0] == 0


def test_sighup_past_a_bound_keeps_the_config_and_says_why(base_dir: str) -> None:
    """The real executable: SIGHUP with ``approval_ttl_s = 1e20`` (every
    proposal an internal error, when it was taken) and with a count of 401
    digits (a reload's internal error): each refused, said in ``daemon
    status`` and the log, the daemon serving on with its config."""
    path = Path(base_dir, "memorizzd.toml")
    good = "approval_ttl_s = 60.0\n"
    path.write_text(good, encoding="utf-8")
    with daemon_process(base_dir, config=str(path)) as daemon:
        for bad, message in (
            ("approval_ttl_s = 1e20\n", "approval_ttl_s must be at most 31536000 s"),
            (f"max_in_flight_per_server = 1{'0' * 400}\n", "at most 1000000"),
        ):
            path.write_text(bad, encoding="utf-8")
            os.kill(daemon.pid, signal.SIGHUP)
            with Client(daemon.socket) as c:
                wait_until(
                    lambda c=c, message=message: (
                        (last := c.daemon_status().last_reload) is not None
                        and message in last.message
                    ),
                    what="the refused reload",
                )
                last = c.daemon_status().last_reload
                assert last is not None
                assert not last.ok
                assert last.trigger == "signal"
            wait_until(lambda message=message: message in daemon.log())
        path.write_text(good, encoding="utf-8")
        assert daemon.running
        with Client(daemon.socket) as c:
            assert c.daemon_reload().settings_changed == []
            assert c.daemon_status().last_reload.ok  # type: ignore[union-attr]
        assert daemon.stop() == 0
