"""Authority probes: an outside battery that tries to make a caller do or see
what its socket's role and scope must not allow (SECURITY.md §4).

One daemon for the module, on real sockets: servers ``t`` (tests/mcp_server.py,
its ``record`` tool logging to <base>/calls.log), ``u`` (the same server,
handshake era, so its log messages reach the face), ``feat``
(tests/features_server.py: a resource, a template, a prompt with completions),
``u__t`` (the face's separator in a server's name) and, where node is
installed, ``tk`` (tests/node/task_server.mjs: tasks). Profile ``alpha``
(this process's uid and nobody, group 4242; built-in face tools on) reaches
``t`` and ``tk``; ``beta`` (this process's uid) reaches ``u``, ``feat``,
``u__t`` and ``tk``; the operator is this process (the daemon's uid). The
reload probes run a daemon of their own, from a config file.
Clients under other uids run in forked children (tests/peers.py, so those
probes need root, as in CI), and every check sees what the kernel reports. Requests go out as raw JSON-RPC lines, so
that what is probed is the wire, not what the client would send.

Each probe asserts the documented answer: allowed, or refused with the stable
reason, never ``internal`` and never a hang; and anything that belongs to
another profile (a server, a proposal, a task, a resource, a prompt) answers
exactly as a missing one does, message and data included.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import msgspec
import pytest

from memorizz import Client
from memorizz.api import methods as m
from memorizz.api.methods import METHODS
from memorizz.api.protocol import PROTOCOL_VERSION
from memorizzd.config import Profile, load
from memorizzd.rpc.authority import ROLES
from tests import proposals_world as pw
from tests.harness import (
    INITIALIZE,
    DaemonHarness,
    config_doc,
    config_toml,
    features_spec,
    light_spec,
    stdio_entry,
    stdio_spec,
    tempdir_fixture,
    wait_until,
)
from tests.peers import (
    ME,
    NOBODY,
    agent_socket,
    as_user,
    calls,
    needs_root,
    optional_task_spec,
    profiles_config,
)
from tests.wire import (
    READ_S,
    Wire,
    connected,
    face_of,
    is_face,
    reason,
    request,
    session,
    wire,
)

MISSING_SERVER = "zz-missing"
MISSING_PROPOSAL = "p_" + "0" * 24
MISSING_TASK = "t_" + "0" * 24
CALLBACK = "http://127.0.0.1/cb?code=x&state=y"
STRANGER = 4001
"""A uid no socket admits."""

AGENT_UID = pytest.param("agent_uid", marks=needs_root)
"""The profile's own (unprivileged) uid, in a forked child."""

# --- the method table's probes ----------------------------------------------

API_PARAMS: dict[str, dict[str, Any]] = {
    "daemon/hello": {"protocol_version": PROTOCOL_VERSION},
    "daemon/status": {},
    "daemon/reload": {},
    "servers/list": {},
    "presets/list": {},
    # an operator's request that would change something is made invalid: the
    # probe is whether the role may call it at all
    "servers/add": {
        "server": {"name": "bad name", "transport": "stdio", "command": "/bin/true"}
    },
    "servers/remove": {"name": MISSING_SERVER},
    "servers/status": {"name": MISSING_SERVER},
    "servers/test": {"name": MISSING_SERVER},
    "tools/list": {"server": MISSING_SERVER},
    "tools/call": {"server": MISSING_SERVER, "name": "echo", "arguments": {}},
    "resources/list": {"server": MISSING_SERVER},
    "resources/templates/list": {"server": MISSING_SERVER},
    "resources/read": {"server": MISSING_SERVER, "uri": "test://static"},
    "resources/subscribe": {"server": MISSING_SERVER, "uri": "test://static"},
    "resources/unsubscribe": {"server": MISSING_SERVER, "uri": "test://static"},
    "prompts/list": {"server": MISSING_SERVER},
    "prompts/get": {"server": MISSING_SERVER, "name": "greet"},
    "completion/complete": {
        "server": MISSING_SERVER,
        "ref": {"type": "ref/prompt", "name": "greet"},
        "argument": {"name": "name", "value": ""},
    },
    "ping": {},
    "audit/list": {"limit": 1},
    "vault/rotate": {"new_key": "not a boolean"},
    "auth/login": {"server": MISSING_SERVER},
    "auth/complete": {"server": MISSING_SERVER, "callback_url": CALLBACK},
    "auth/logout": {"server": MISSING_SERVER},
    "approvals/list": {"limit": 5},
    "approvals/approve": {"id": MISSING_PROPOSAL},
    "approvals/reject": {"id": MISSING_PROPOSAL},
    "approvals/cancel": {"id": MISSING_PROPOSAL},
    "approvals/resume": {"id": MISSING_PROPOSAL},
    "approvals/wait": {"id": MISSING_PROPOSAL, "timeout_s": 0},
    "tasks/get": {"task_id": MISSING_TASK},
    "tasks/result": {"task_id": MISSING_TASK, "timeout_s": 1},
    "tasks/cancel": {"task_id": MISSING_TASK},
    "tasks/list": {},
}
"""One request per method of the table, naming only things that do not exist."""

EXPECTED: dict[str, str | None] = {
    "daemon/hello": None,
    "daemon/status": None,
    "daemon/reload": "no_config_file",
    "servers/list": None,
    "presets/list": None,
    "servers/add": "invalid_params",
    "servers/remove": "unknown_server",
    "servers/status": "unknown_server",
    "servers/test": "unknown_server",
    "tools/list": "unknown_server",
    "tools/call": "unknown_server",
    "resources/list": "unknown_server",
    "resources/templates/list": "unknown_server",
    "resources/read": "unknown_server",
    "resources/subscribe": "unknown_server",
    "resources/unsubscribe": "unknown_server",
    "prompts/list": "unknown_server",
    "prompts/get": "unknown_server",
    "completion/complete": "unknown_server",
    "ping": None,
    "audit/list": None,
    "vault/rotate": "invalid_params",
    "auth/login": "unknown_server",
    "auth/complete": "unknown_server",
    "auth/logout": "unknown_server",
    "approvals/list": None,
    "approvals/approve": "not_found",
    "approvals/reject": "not_found",
    "approvals/cancel": "not_found",
    "approvals/resume": "not_found",
    "approvals/wait": "not_found",
    "tasks/get": "invalid_params",
    "tasks/result": "invalid_params",
    "tasks/cancel": "invalid_params",
    "tasks/list": None,
}
"""What each probe gets from a role that may call it (None: a result)."""

FACE_PARAMS: dict[str, dict[str, Any]] = {
    "initialize": INITIALIZE["params"],
    "server/discover": {},
    "ping": {},
    "logging/setLevel": {"level": "emergency"},
    "tools/list": {},
    "tools/call": {"name": f"{MISSING_SERVER}__echo", "arguments": {}},
    "resources/list": {},
    "resources/templates/list": {},
    "resources/read": {"uri": "zz://missing"},
    "resources/subscribe": {"uri": "zz://missing"},
    "resources/unsubscribe": {"uri": "zz://missing"},
    "prompts/list": {},
    "prompts/get": {"name": f"{MISSING_SERVER}__greet"},
    "completion/complete": {
        "ref": {"type": "ref/prompt", "name": f"{MISSING_SERVER}__pick"},
        "argument": {"name": "color", "value": ""},
    },
    "tasks/get": {"taskId": MISSING_TASK},
    "tasks/result": {"taskId": MISSING_TASK},
    "tasks/cancel": {"taskId": MISSING_TASK},
    "tasks/list": {},
}
"""The face's methods (``subscriptions/listen``, a stream, is probed apart)."""

FACE_EXPECTED: dict[str, str | None] = {
    "tools/call": "invalid_params",
    "resources/read": "not_found",
    "resources/subscribe": "not_found",
    "prompts/get": "invalid_params",
    "completion/complete": "invalid_params",
    "tasks/get": "invalid_params",
    "tasks/result": "invalid_params",
    "tasks/cancel": "invalid_params",
}
"""What the face answers its probes (a result where not named)."""


# --- answers ----------------------------------------------------------------


def sweep(path: str, probes: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Every probe on one connection, in turn: the answers by method."""
    with contextlib.closing(connected(path)) as w:
        return {
            method: w.ask(method, params, i)
            for i, (method, params) in enumerate(probes.items())
        }


def _drain(w: Wire) -> list[dict[str, Any]]:
    """What ``w`` was sent unasked so far (a ping's answer marks the end)."""
    w.ask("ping", {}, "drain")
    return w.notes


def same_answer(
    hidden: dict[str, Any], missing: dict[str, Any], name: str, other: str
) -> None:
    """``hidden`` (about ``name``, which exists for someone else) is exactly
    ``missing`` (about ``other``, which exists for nobody), but for the name."""
    said = "error" if "error" in missing else "result"  # a tool's isError result
    assert said in hidden, hidden
    text = msgspec.json.encode(missing[said]).decode().replace(other, name)
    assert msgspec.json.encode(hidden[said]).decode() == text


# --- the daemon ----------------------------------------------------------------


base = tempdir_fixture()


@pytest.fixture(scope="module")
def probed(base: str) -> Iterator[DaemonHarness]:
    tasks = optional_task_spec()
    extra = [] if tasks is None else ["tk"]
    config = profiles_config(
        base,
        servers=[
            stdio_spec("t", env={"CALL_LOG": os.path.join(base, "calls.log")}),
            stdio_spec(
                "u", protocol="legacy", env={"CALL_LOG": os.path.join(base, "u.log")}
            ),
            features_spec("feat"),
            light_spec("u__t"),  # the face's separator inside a server's name
            *([] if tasks is None else [tasks]),
        ],
        profiles=[
            Profile(
                name="alpha",
                servers=["t", *extra],
                uids=[ME, NOBODY],
                gids=[4242],
                face_tools=["proposals", "resume"],
            ),
            Profile(name="beta", servers=["u", "feat", "u__t", *extra], uids=[ME]),
        ],
    )
    with DaemonHarness.running(config) as harness:
        for name in ("t", "u", "feat", "u__t", *extra):
            harness.wait_ready(name)
        yield harness


def needs_tasks(harness: DaemonHarness) -> None:
    """Skip without ``tk`` (no node here; under CI ``optional_task_spec`` failed)."""
    if "tk" not in harness.daemon.pool:
        pytest.skip("node or tests/node's SDK is not installed")


def every_socket(probed: DaemonHarness, base: str) -> tuple[str, ...]:
    """An agent socket (alpha's), the operator socket, and the face of each."""
    alpha = agent_socket(base, "alpha")
    return (alpha, probed.socket, face_of(alpha), face_of(probed.socket))


# --- 1. every method x every socket kind ----------------------------------------


def test_the_probe_table_covers_the_method_table() -> None:
    assert set(API_PARAMS) == set(METHODS) == set(EXPECTED)


@pytest.mark.parametrize("who", ["operator", "agent_root", AGENT_UID])
def test_every_method_on_every_api_socket(
    probed: DaemonHarness, base: str, who: str
) -> None:
    """Allowed (the documented answer of the method itself), or refused with
    ``permission_denied`` and the one message; never internal, never a hang."""
    if who == "operator":
        role, answers = "operator", sweep(probed.socket, API_PARAMS)
    elif who == "agent_root":  # root on an agent socket is an agent
        role, answers = "agent", sweep(agent_socket(base, "alpha"), API_PARAMS)
    else:  # the profile's own (unprivileged) uid
        path = agent_socket(base, "alpha")
        outcome = as_user(lambda: sweep(path, API_PARAMS), uid=NOBODY)
        assert outcome[0] == "ok", outcome
        role, answers = "agent", outcome[1]
    for method, answer in answers.items():
        if role in ROLES[method]:
            assert reason(answer) == EXPECTED[method], (method, answer)
        else:
            assert answer["error"] == {
                "code": -32001,
                "message": f"{method} is not available on this socket: it is"
                " for operators, on the operator socket; this agent socket"
                " (profile 'alpha') serves its servers' tools, resources and"
                " prompts, and its own proposals",
                "data": {"reason": "permission_denied"},
            }, (method, answer)


@pytest.mark.parametrize("who", ["operator", "agent_root", AGENT_UID])
def test_every_method_on_every_face(probed: DaemonHarness, base: str, who: str) -> None:
    """The face's own methods answer as documented for every caller; a name of
    the socket API's table that the face does not serve is method_not_found
    (the face has no operator surface to reach)."""
    probes = {**{name: API_PARAMS[name] for name in METHODS}, **FACE_PARAMS}
    if who == "operator":
        answers = sweep(face_of(probed.socket), probes)
    elif who == "agent_root":
        answers = sweep(face_of(agent_socket(base, "alpha")), probes)
    else:
        path = face_of(agent_socket(base, "alpha"))
        outcome = as_user(lambda: sweep(path, probes), uid=NOBODY)
        assert outcome[0] == "ok", outcome
        answers = outcome[1]
    for method, answer in answers.items():
        if method in FACE_PARAMS:
            assert reason(answer) == FACE_EXPECTED.get(method), (method, answer)
        else:
            assert answer["error"]["code"] == -32601, (method, answer)
            assert reason(answer) == "method_not_found"


def test_an_operator_method_is_refused_alike_whatever_it_names(
    probed: DaemonHarness, base: str
) -> None:
    """On an agent socket an operator's method is refused before its params
    are read: a real server, proposal or audit row and a missing one, valid
    params and garbage, all get the one answer."""
    real = pw.propose(agent_socket(base, "beta"), "u", f"real-{secrets.token_hex(4)}")
    with probed.client() as operator:
        row = operator.audit(limit=1).records[0].id
    variants: dict[str, list[Any]] = {
        "approvals/approve": [{"id": real}, {"id": MISSING_PROPOSAL}, {"id": 7}, []],
        "approvals/reject": [{"id": real}, {"id": MISSING_PROPOSAL}, None],
        "servers/remove": [{"name": "u"}, {"name": "t"}, {"name": MISSING_SERVER}],
        "servers/test": [{"name": "feat"}, {"name": MISSING_SERVER}, "x"],
        "audit/list": [
            {"before_id": row + 1, "limit": 1},
            {"before_id": 0},
            {"limit": -1},
        ],
        "auth/login": [{"server": "u"}, {"server": MISSING_SERVER}, {}],
    }
    for path in (agent_socket(base, "alpha"), agent_socket(base, "beta")):
        with wire(path) as w:
            for method, params in variants.items():
                answers = {msgspec.json.encode(w.ask(method, p)) for p in params}
                assert len(answers) == 1, (method, answers)
                assert reason(msgspec.json.decode(answers.pop())) == "permission_denied"
    with probed.client() as operator:  # and nothing was decided
        [left] = [p for p in operator.list_approvals() if p.id == real]
        assert left.status == "pending"
        assert operator.reject(real).status == "rejected"


@needs_root
def test_the_metrics_socket_serves_operators_only_and_no_json_rpc(
    probed: DaemonHarness,
) -> None:
    """``metrics.sock`` has the operator socket's rule, checked in-process on
    the peer (an agent's uid is closed unanswered), and speaks only HTTP."""
    path = os.path.join(os.path.dirname(probed.socket), "metrics.sock")

    def scrape(line: bytes) -> bytes:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(READ_S)
            s.connect(path)
            got = b""
            with contextlib.suppress(ConnectionResetError, BrokenPipeError):
                s.sendall(line)
                while chunk := s.recv(1 << 16):
                    got += chunk
            return got

    os.chmod(path, 0o666)  # noqa: S103 - let the in-process check decide
    try:
        assert as_user(
            lambda: scrape(b"GET /metrics HTTP/1.1\r\n\r\n").decode(), uid=NOBODY
        ) == ("ok", "")
    finally:
        os.chmod(path, 0o660 if os.geteuid() == 0 else 0o600)
    assert scrape(b"GET /metrics HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 200")
    rpc = request("servers/list", {}) + b"\r\n\r\n"
    assert scrape(rpc).startswith(b"HTTP/1.1 400")


# --- 2. cross-profile reach through every id-bearing path -------------------------

SERVER_PROBES: dict[str, Callable[[str], dict[str, Any]]] = {
    "tools/list": lambda s: {"server": s},
    "tools/call": lambda s: {"server": s, "name": "echo", "arguments": {"text": "x"}},
    "tools/call (task)": lambda s: {
        "server": s,
        "name": "hold",
        "arguments": {},
        "task": {"ttl": 60000},
    },
    "resources/list": lambda s: {"server": s},
    "resources/templates/list": lambda s: {"server": s},
    "resources/read": lambda s: {"server": s, "uri": "feat://watched"},
    "prompts/list": lambda s: {"server": s},
    "prompts/get": lambda s: {"server": s, "name": "pick", "arguments": {"color": "r"}},
    "completion/complete": lambda s: {
        "server": s,
        "ref": {"type": "ref/prompt", "name": "pick"},
        "argument": {"name": "color", "value": "r"},
    },
    "resources/subscribe": lambda s: {"server": s, "uri": "feat://watched"},
    "resources/unsubscribe": lambda s: {"server": s, "uri": "feat://watched"},
    "ping": lambda s: {"server": s},
}


def _server_answers(path: str, names: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    found = {}
    with wire(path) as w:
        for probe, params in SERVER_PROBES.items():
            method = probe.split(" ")[0]
            for name in names:
                found[f"{probe} {name!r}"] = w.ask(method, params(name))
    return found


@pytest.mark.parametrize("who", ["agent_root", AGENT_UID])
def test_another_profiles_server_is_a_missing_one_on_every_path(
    probed: DaemonHarness, base: str, who: str
) -> None:
    """``feat`` and ``u`` are beta's: to alpha every method that names a server
    answers for them exactly as for a name nobody has (and so do the case and
    whitespace variants of its own ``t``)."""
    path = agent_socket(base, "alpha")
    names = ("feat", "u", "T", "t ", " t", MISSING_SERVER)
    if who == "agent_root":
        answers = _server_answers(path, names)
    else:
        outcome = as_user(lambda: _server_answers(path, names), uid=NOBODY)
        assert outcome[0] == "ok", outcome
        answers = outcome[1]
    for probe in SERVER_PROBES:
        missing = answers[f"{probe} {MISSING_SERVER!r}"]
        assert reason(missing) == "unknown_server", (probe, missing)
        for name in names[:-1]:
            same_answer(answers[f"{probe} {name!r}"], missing, name, MISSING_SERVER)
    # the operator reaches them (the probes were about scope, not the servers)
    with wire(probed.socket) as w:
        for probe in ("resources/read", "completion/complete", "resources/subscribe"):
            assert "result" in w.ask(probe, SERVER_PROBES[probe]("feat")), probe
        assert reason(w.ask("tools/list", {"server": "t "})) == "unknown_server"


def _face_call(w: Wire, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return w.ask("tools/call", {"name": name, "arguments": arguments}, "call")


def _proposal_answers(base: str, theirs: str, missing: str) -> dict[str, Any]:
    """What alpha gets for beta's proposal and for one that never was, on its
    socket (every approvals method it may call) and its face (the built-in
    tools)."""
    found: dict[str, Any] = {}
    with wire(agent_socket(base, "alpha")) as w:
        for proposal_id in (theirs, missing):
            for method, params in (
                ("approvals/wait", {"id": proposal_id, "timeout_s": 0}),
                ("approvals/resume", {"id": proposal_id}),
                ("approvals/cancel", {"id": proposal_id}),
            ):
                found[f"{method} {proposal_id}"] = w.ask(method, params)
        listed = w.ask("approvals/list", {"limit": 1000})["result"]["proposals"]
        found["listed"] = [p["id"] for p in listed]
    with wire(face_of(agent_socket(base, "alpha"))) as w:
        w.ask("initialize", INITIALIZE["params"], "init")
        for proposal_id in (theirs, missing):
            found[f"resume {proposal_id}"] = _face_call(
                w, "memorizz__resume", {"id": proposal_id}
            )
        shown = _face_call(w, "memorizz__proposals", {})["result"]
        found["shown"] = [p["id"] for p in shown["structuredContent"]["proposals"]]
    return found


@needs_root
def test_another_profiles_proposal_is_a_missing_one(
    probed: DaemonHarness, base: str
) -> None:
    """beta's proposal, pending and then approved: alpha (root or its own uid,
    on its socket or its face's built-in tools) can neither see, wait for,
    cancel nor run it, and is answered as for an id never made."""
    tag = f"theirs-{secrets.token_hex(4)}"
    theirs = pw.propose(agent_socket(base, "beta"), "u", tag)
    missing = "p_" + secrets.token_hex(12)
    for state in ("pending", "approved"):
        if state == "approved":
            with probed.client() as operator:
                assert operator.approve(theirs).status == "approved"
        as_root = _proposal_answers(base, theirs, missing)
        as_uid = as_user(lambda: _proposal_answers(base, theirs, missing), uid=NOBODY)
        assert as_uid[0] == "ok", as_uid
        for found in (as_root, as_uid[1]):
            assert theirs not in found["listed"]
            assert theirs not in found["shown"]
            for key in (
                "approvals/wait",
                "approvals/resume",
                "approvals/cancel",
                "resume",
            ):
                hidden, absent = found[f"{key} {theirs}"], found[f"{key} {missing}"]
                assert reason(absent) == "not_found", (key, absent)
                same_answer(hidden, absent, theirs, missing)
    with probed.client() as operator:  # untouched by all of that
        [mine] = [p for p in operator.list_approvals() if p.id == theirs]
        assert mine.status == "approved"
    with Client(agent_socket(base, "beta")) as beta:  # its owner runs it, once
        assert beta.resume(theirs).content[0]["text"] == f"recorded {tag}"
    assert Path(base, "u.log").read_text(encoding="utf-8").split().count(tag) == 1


def _task_answers(path: str, theirs: str, missing: str) -> dict[str, Any]:
    """Every tasks method with ``theirs`` and ``missing``, on a socket or a face."""
    face = is_face(path)
    found: dict[str, Any] = {}
    with contextlib.closing(connected(path)) as w:
        for task_id in (theirs, missing):
            for method in ("tasks/get", "tasks/result", "tasks/cancel"):
                params = {"taskId": task_id} if face else {"task_id": task_id}
                found[f"{method} {task_id}"] = w.ask(method, params)
        listed = w.ask("tasks/list", {})["result"]["tasks"]
        found["listed"] = [t["taskId"] for t in listed]
    return found


@needs_root
def test_another_callers_task_is_a_missing_one(
    probed: DaemonHarness, base: str
) -> None:
    """A task is its creator's (socket role, profile and uid): another
    profile, another uid of the same profile, or the operator, on a socket or
    a face, is answered as for an id never made, and cannot cancel it."""
    needs_tasks(probed)
    with (
        Client(agent_socket(base, "beta")) as beta,
        Client(agent_socket(base, "alpha")) as alpha,
    ):
        theirs = beta.call_tool_task("tk", "hold", ttl_ms=60000).task_id
        alphas = alpha.call_tool_task("tk", "hold", ttl_ms=60000).task_id
        missing = "t_" + secrets.token_hex(12)
        alpha_api, alpha_face = (
            agent_socket(base, "alpha"),
            face_of(agent_socket(base, "alpha")),
        )
        probes: list[tuple[str, dict[str, Any]]] = [
            ("beta's, alpha root", _task_answers(alpha_api, theirs, missing)),
            ("beta's, alpha face", _task_answers(alpha_face, theirs, missing)),
            ("beta's, operator", _task_answers(probed.socket, theirs, missing)),
            (
                "beta's, operator face",
                _task_answers(face_of(probed.socket), theirs, missing),
            ),
        ]
        for path in (alpha_api, alpha_face):  # alpha root's, another uid of alpha
            outcome = as_user(partial(_task_answers, path, alphas, missing), uid=NOBODY)
            assert outcome[0] == "ok", outcome
            probes.append((f"alpha's, nobody on {path}", outcome[1]))
        for who, found in probes:
            owned = theirs if who.startswith("beta") else alphas
            assert owned not in found["listed"], who
            for method in ("tasks/get", "tasks/result", "tasks/cancel"):
                absent = found[f"{method} {missing}"]
                assert reason(absent) == "invalid_params", (who, method, absent)
                same_answer(found[f"{method} {owned}"], absent, owned, missing)
        # nobody else's cancel reached the server: both still run, for their owners
        assert beta.get_task(theirs).status == "working"
        assert alpha.get_task(alphas).status == "working"
        # the owner's face is the owner too (same uid, role and profile)
        with wire(face_of(agent_socket(base, "beta"))) as w:
            w.ask("initialize", INITIALIZE["params"], "init")
            seen = w.ask("tasks/get", {"taskId": theirs})
            assert seen["result"]["taskId"] == theirs
        assert beta.cancel_task(theirs).status == "cancelled"
        assert alpha.cancel_task(alphas).status == "cancelled"


def _swapped(params: dict[str, Any], name: str, other: str) -> dict[str, Any]:
    """``params`` with ``other`` wherever ``name`` was."""
    text = msgspec.json.encode(params).decode().replace(name, other)
    swapped: dict[str, Any] = msgspec.json.decode(text)
    return swapped


COLOR = {"name": "color", "value": "r"}
FACE_FOREIGN: list[tuple[str, dict[str, Any], str]] = [
    ("resources/read", {"uri": "feat://watched"}, "feat"),
    ("resources/read", {"uri": "feat://colors/red"}, "feat"),  # beta's template's
    ("resources/subscribe", {"uri": "feat://watched"}, "feat"),
    ("prompts/get", {"name": "feat__pick", "arguments": {"color": "r"}}, "feat"),
    ("prompts/get", {"name": "pick", "arguments": {"color": "r"}}, "pick"),
    (
        "completion/complete",
        {"ref": {"type": "ref/prompt", "name": "feat__pick"}, "argument": COLOR},
        "feat",
    ),
    (
        "completion/complete",
        {"ref": {"type": "ref/prompt", "name": "pick"}, "argument": COLOR},
        "pick",
    ),
    (
        "completion/complete",
        {
            "ref": {"type": "ref/resource", "uri": "feat://colors/{color}"},
            "argument": COLOR,
        },
        "feat",
    ),
    *(
        ("tools/call", {"name": tool, "arguments": {"text": "x", "tag": "x"}}, tool)
        for tool in ("u__echo", "feat__touch", "u__record", "echo__u", "u_echo")
    ),
]
"""What alpha's face is asked of beta's servers, and the name it holds: each
is asked again with that name changed to one nobody has."""


@needs_root
def test_another_profiles_resources_prompts_and_completions_are_missing_ones(
    probed: DaemonHarness, base: str
) -> None:
    """On alpha's face, what only beta's servers list (a resource, a resource
    template, a prompt, a tool under any spelling of its face name) is routed
    nowhere and answered as a name nobody lists; a listen stream does not take
    it; and ``memorizz/scope`` naming beta's server narrows to nothing."""
    alpha_face = face_of(agent_socket(base, "alpha"))

    def probe() -> list[tuple[dict[str, Any], dict[str, Any]]]:
        with contextlib.closing(session(alpha_face)) as w:
            return [
                (
                    w.ask(method, params),
                    w.ask(method, _swapped(params, name, "zz" + name)),
                )
                for method, params, name in FACE_FOREIGN
            ]

    as_uid = as_user(probe, uid=NOBODY)
    assert as_uid[0] == "ok", as_uid
    for answers in (probe(), as_uid[1]):
        for (method, _, name), (hidden, absent) in zip(
            FACE_FOREIGN, answers, strict=True
        ):
            assert reason(absent) in ("not_found", "invalid_params"), (method, absent)
            same_answer(hidden, absent, name, "zz" + name)
    # beta's own face reaches them (the probes were about scope)
    with contextlib.closing(session(face_of(agent_socket(base, "beta")))) as w:
        for method, params, _ in FACE_FOREIGN[:4]:
            assert "result" in w.ask(method, params), (method, params)
    # a listen stream honors none of it, as for a URI nobody lists
    with contextlib.closing(session(alpha_face)) as w:
        wanted = {"resourceSubscriptions": ["feat://watched", "zz://watched"]}
        w.send(request("subscriptions/listen", {"notifications": wanted}, "listen"))
        honored = msgspec.json.decode(w.line())["params"]["notifications"]
        assert honored["resourceSubscriptions"] == []
        w.note("notifications/cancelled", {"requestId": "listen"})
        assert "result" in w.ask("ping", {}, "after")
    # memorizz/scope narrows; naming another profile's server is answered
    # exactly as naming a server nobody has: unknown_server, for everything
    echo = {"name": "echo", "arguments": {"text": "x"}}
    asked = [
        ("tools/list", {}),
        ("tools/call", echo),
        ("resources/read", {"uri": "feat://watched"}),
    ]
    narrowed: dict[str, list[dict[str, Any]]] = {}
    for server in ("u", "zzu"):
        with contextlib.closing(session(alpha_face)) as w:
            w.note("memorizz/scope", {"server": server})
            narrowed[server] = [w.ask(method, params) for method, params in asked]
    for hidden, absent in zip(narrowed["u"], narrowed["zzu"], strict=True):
        assert reason(absent) == "unknown_server", absent
        same_answer(hidden, absent, "u", "zzu")


def test_log_messages_and_resource_updates_stay_in_scope(
    probed: DaemonHarness, base: str
) -> None:
    """``logging/setLevel`` and ``resources/subscribe`` on alpha's face never
    bring it beta's servers' messages: alpha's session is asked first, beta's
    hears them (so alpha's turn had passed), alpha's hears nothing."""
    secret = f"beta-only-{secrets.token_hex(4)}"
    alpha = session(face_of(agent_socket(base, "alpha")))
    beta = session(face_of(agent_socket(base, "beta")))
    try:
        for w in (alpha, beta):
            assert "result" in w.ask("logging/setLevel", {"level": "debug"})
        assert (
            reason(alpha.ask("resources/subscribe", {"uri": "feat://watched"}))
            == "not_found"
        )
        assert "result" in beta.ask("resources/subscribe", {"uri": "feat://watched"})
        with Client(agent_socket(base, "beta")) as c:
            c.call_tool("u", "logged", {"text": secret})
            c.call_tool("feat", "touch", {"uri": "feat://watched"})
        wait_until(
            lambda: (
                {"notifications/message", "notifications/resources/updated"}
                <= {n["method"] for n in _drain(beta)}
            ),
            what="beta's face hearing its servers",
        )
        assert "result" in alpha.ask("ping", {}, "after")
        heard = {n["method"] for n in alpha.notes}
        assert not heard & {"notifications/message", "notifications/resources/updated"}
    finally:
        alpha.close()
        beta.close()


def test_a_cancel_naming_another_connections_request_cancels_nothing(
    probed: DaemonHarness, base: str
) -> None:
    """``notifications/cancelled`` names a request of the sender's own
    connection: another session's request of that id runs on (socket API and
    face alike)."""
    for kind in ("api", "face"):
        path = agent_socket(base, "alpha")
        if kind == "face":
            path = face_of(path)
        victim = session(path) if kind == "face" else Wire.to(path)
        other = session(path) if kind == "face" else Wire.to(path)
        try:
            if kind == "face":
                tools = victim.ask("tools/list", {}, "tools")["result"]["tools"]
                [slow] = [
                    t["name"]
                    for t in tools
                    if t.get("_meta", {}).get("memorizz/tool") == "slow"
                ]
                victim.send(
                    request(
                        "tools/call", {"name": slow, "arguments": {"seconds": 0.5}}, 7
                    )
                )
            else:
                params = {"server": "t", "name": "slow", "arguments": {"seconds": 0.5}}
                victim.send(request("tools/call", params, 7))
            other.note("notifications/cancelled", {"requestId": 7})
            assert "result" in other.ask("ping", {}, "after")  # the cancel was read
            answer = victim.reply()
            assert answer["id"] == 7
            assert answer["result"]["content"][0]["text"] == "slept 0.5", answer
        finally:
            victim.close()
            other.close()


# --- 3. method-name and envelope tricks --------------------------------------------

NAME_TRICKS = (
    "Servers/List",
    "SERVERS/LIST",
    " servers/list",
    "servers/list ",
    "servers/list\t",
    "servers/list\u0000",
    "servers/list\u0000tools/list",
    "servers//list",
    "/servers/list",
    "servers/list/",
    "servers\\list",
    "servers/list\u200b",
    "\uff53ervers/list",
    "Tools/List",
    "tools/list\u0000",
    "approvals/Approve",
    "memorizz/answer",
)
"""Names that are not a method: none may be taken for one."""


def test_method_name_tricks_are_unknown_methods(
    probed: DaemonHarness, base: str
) -> None:
    """Case, whitespace, NUL, doubled or escaped separators: an unknown method
    on every socket (no name is normalised into a method, least of all an
    operator's on an agent socket). What JSON itself unescapes is that
    method, refused or run as such; a raw NUL byte is not JSON at all."""
    for path in every_socket(probed, base):
        with wire(path) as w:
            for name in NAME_TRICKS:
                answer = w.ask(name, {"server": "t"})
                assert answer["error"]["code"] == -32601, (path, name, answer)
                assert reason(answer) == "method_not_found"
            if path.endswith("api.sock"):  # escaped in JSON: exactly the method
                for line in (
                    b'{"jsonrpc":"2.0","id":1,"method":"servers\\/list","params":{}}',
                    b'{"jsonrpc":"2.0","id":1,"method":"servers\\u002flist","params":{}}',
                    b'{"jsonrpc":"2.0","id":1,"method":"ping","method":"servers/list"}',
                ):
                    w.send(line)
                    assert reason(w.reply()) == "permission_denied", line
            w.send(b'{"jsonrpc":"2.0","id":1,"method":"servers/list\x00","params":{}}')
            assert reason(w.reply()) == "parse_error"
            assert "result" in w.ask("ping", {}, "still")


def test_batches_are_refused_whole_and_run_nothing(
    probed: DaemonHarness, base: str
) -> None:
    """A JSON array is not a request (protocol.md): refused as one, nothing in
    it runs, on an agent socket, the operator socket and the faces."""
    sneaky = {
        "name": "batched",
        "transport": "stdio",
        "command": "/bin/true",
    }
    for path in every_socket(probed, base):
        with wire(path) as w:
            for batch in (
                [
                    {
                        "jsonrpc": "2.0",
                        "id": 1,
                        "method": "servers/add",
                        "params": {"server": sneaky},
                    }
                ],
                [{"jsonrpc": "2.0", "id": 2, "method": "ping"}] * 2,
                [],
            ):
                w.send(msgspec.json.encode(batch))
                answer = w.reply()
                assert answer["id"] is None, (path, answer)
                assert reason(answer) in ("invalid_request", "parse_error"), answer
            assert "result" in w.ask("ping", {}, "still")
    with probed.client() as c:
        assert "batched" not in {s.name for s in c.list_servers()}


def test_an_id_in_flight_cannot_be_reused(probed: DaemonHarness, base: str) -> None:
    """A second request under an id still in flight on the connection is
    refused (its id named) and the first runs on to its own answer."""
    api = agent_socket(base, "alpha")
    for path in (api, face_of(api)):
        with contextlib.closing(connected(path)) as w:
            if is_face(path):
                tools = w.ask("tools/list", {}, "tools")["result"]["tools"]
                [slow] = [
                    t["name"]
                    for t in tools
                    if t.get("_meta", {}).get("memorizz/tool") == "slow"
                ]
                first = request(
                    "tools/call", {"name": slow, "arguments": {"seconds": 0.3}}, 5
                )
                second = request("tools/list", {}, 5)
            else:
                first = request(
                    "tools/call",
                    {"server": "t", "name": "slow", "arguments": {"seconds": 0.3}},
                    5,
                )
                second = request("tools/list", {"server": "t"}, 5)
            w.send(first, second)
            refused, answered = w.reply(), w.reply()
            assert refused["id"] == answered["id"] == 5
            assert reason(refused) == "invalid_request"
            assert "already in flight" in refused["error"]["message"]
            assert answered["result"]["content"][0]["text"] == "slept 0.3"


LONG = 300_000


def _bounded(answer_line: bytes, why: str) -> dict[str, Any]:
    assert len(answer_line) < 4096, (why, len(answer_line))
    decoded: dict[str, Any] = msgspec.json.decode(answer_line)
    return decoded


@pytest.mark.parametrize("where", ["agent", "operator"])
def test_very_long_names_get_short_answers(
    probed: DaemonHarness, base: str, where: str
) -> None:
    """A name the caller made up (a method, a server, a proposal or task id) is
    said back at most in part: an answer is never the size of the request,
    and never internal."""
    path = agent_socket(base, "alpha") if where == "agent" else probed.socket
    long = "x" * LONG
    odd = "\u0085" * (LONG // 2)  # what repr() spells four times longer
    with wire(path) as w:
        for method, params, expected in (
            (long, {}, "method_not_found"),
            (odd, {}, "method_not_found"),
            ("tools/list", {"server": long}, "unknown_server"),
            ("tools/call", {"server": odd, "name": long}, "unknown_server"),
            ("prompts/get", {"server": long, "name": long}, "unknown_server"),
            ("approvals/wait", {"id": long, "timeout_s": 0}, "not_found"),
            ("approvals/resume", {"id": odd}, "not_found"),
            ("tasks/get", {"task_id": long}, "invalid_params"),
        ):
            w.send(request(method, params))
            answer = _bounded(w.line(), f"{method[:20]} {str(params)[:40]}")
            assert reason(answer) == expected, answer


def test_very_long_names_on_the_face_get_short_answers(
    probed: DaemonHarness, base: str
) -> None:
    long = "x" * LONG
    with contextlib.closing(session(face_of(agent_socket(base, "alpha")))) as w:
        for method, params in (
            (long, {}),
            ("tools/call", {"name": long, "arguments": {}}),
            ("resources/read", {"uri": long}),
            ("prompts/get", {"name": long}),
            (
                "completion/complete",
                {"ref": {"type": long}, "argument": {"name": "a", "value": ""}},
            ),
            ("tasks/get", {"taskId": long}),
        ):
            w.send(request(method, params))
            answer = _bounded(w.line(), method[:20])
            assert reason(answer) not in (None, "internal"), answer


# --- 4. a connection changing hands ----------------------------------------------


def _echo_on(sock: socket.socket, text: str) -> dict[str, Any]:
    w = Wire(sock)
    try:
        w.send(
            request(
                "tools/call",
                {"server": "t", "name": "echo", "arguments": {"text": text}},
            )
        )
        found = w.reply()
        w.send(request("servers/list", {}, 2))
        return {"echo": found, "servers": w.reply()}
    finally:
        w.close()


def _last_echo(harness: DaemonHarness, path: str) -> m.AuditRecord:
    with harness.client() as c:
        return next(
            r
            for r in c.audit(limit=50, server="t").records
            if r.action == "tools/call" and r.tool == "echo" and r.caller_socket == path
        )


@needs_root
def test_a_passed_descriptor_keeps_the_identity_it_connected_with(
    probed: DaemonHarness, base: str
) -> None:
    """SO_PEERCRED is the connecting process's, taken at connect(): a
    connection handed to another process (SCM_RIGHTS) keeps that identity for
    its whole life, both ways. Root's connection to alpha's socket, in the hands
    of a uid that alpha refuses, is root's alpha connection (and no more than
    an agent's); nobody's connection, in root's hands, is nobody's."""
    path = agent_socket(base, "alpha")
    # the stranger on its own is refused at connect
    refused = as_user(lambda: Client(path).hello(), uid=STRANGER, gid=STRANGER)
    assert refused[1] == "permission_denied", refused
    # root connects and hands the connection to the stranger
    here, there = socket.socketpair()
    with here, there:
        mine = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        mine.connect(path)
        socket.send_fds(here, [b"x"], [mine.fileno()])
        mine.close()

        def use_it() -> dict[str, Any]:
            _, [fd], _, _ = socket.recv_fds(there, 1, 1)
            return _echo_on(socket.socket(fileno=fd), "passed on")

        used = as_user(use_it, uid=STRANGER, gid=STRANGER)
    assert used[0] == "ok", used
    assert used[1]["echo"]["result"]["content"][0]["text"] == "passed on"
    assert reason(used[1]["servers"]) == "permission_denied"
    record = _last_echo(probed, path)
    assert (record.caller_uid, record.caller_pid) == (ME, os.getpid())
    assert record.caller_profile == "alpha"
    # nobody connects and hands its connection to root
    here, there = socket.socketpair()
    with here, there:

        def connect_and_pass() -> int:
            theirs = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            theirs.connect(path)
            socket.send_fds(there, [b"x"], [theirs.fileno()])
            return os.getpid()

        child = as_user(connect_and_pass, uid=NOBODY)
        assert child[0] == "ok", child
        _, [fd], _, _ = socket.recv_fds(here, 1, 1)
    found = _echo_on(socket.socket(fileno=fd), "handed back")
    assert found["echo"]["result"]["content"][0]["text"] == "handed back"
    record = _last_echo(probed, path)
    assert (record.caller_uid, record.caller_pid) == (NOBODY, child[1])


def _handed(path: str, uid: int) -> Wire:
    """A connection ``uid`` made to ``path`` (an MCP face's initialized),
    handed to this process: the daemon knows it as ``uid``'s."""
    here, there = socket.socketpair()
    with here, there:

        def connect() -> bool:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(path)
            w = Wire(sock)
            if is_face(path):
                w.ask("initialize", INITIALIZE["params"], "init")
            else:
                w.ask("ping", {})
            socket.send_fds(there, [b"x"], [sock.fileno()])
            return True

        outcome = as_user(connect, uid=uid, gid=uid)
        assert outcome == ("ok", True), outcome
        _, [fd], _, _ = socket.recv_fds(here, 1, 1)
    return Wire(socket.socket(fileno=fd))


@needs_root
def test_a_reload_takes_away_what_it_takes_away(base_dir: str) -> None:
    """A reload that removes a profile cuts its connections (API and face) and
    unlinks its sockets; one that drops a uid from a profile, or from the
    operators, cuts that uid's open connections too (its authority is gone,
    whatever it connected with); one that narrows a profile's servers stops
    an approved proposal on a dropped server from running. Connections still
    admitted keep working, with the new scope."""
    os.chmod(base_dir, 0o755)  # noqa: S103 - children under other uids traverse it
    config_file = Path(base_dir, "memorizzd.toml")
    log = os.path.join(base_dir, "calls.log")
    servers = [stdio_entry(stdio_spec(n, env={"CALL_LOG": log})) for n in ("s1", "s2")]
    servers.append(stdio_entry(features_spec("s3")) | {"protocol": "legacy"})
    doc = config_doc(
        base_dir,
        agents_dir=os.path.join(base_dir, "agents"),
        operators={"uids": [4100]},
        servers=servers,
        profiles=[
            {"name": "gamma", "servers": ["s1"], "uids": [ME]},
            {"name": "delta", "servers": ["s1", "s2", "s3"], "uids": [ME, NOBODY]},
        ],
    )
    config_file.write_text(config_toml(doc), encoding="utf-8")
    with DaemonHarness.running(load(str(config_file))) as h:
        for name in ("s1", "s2", "s3"):
            h.wait_ready(name)
        gamma, delta = agent_socket(base_dir, "gamma"), agent_socket(base_dir, "delta")
        os.chmod(h.socket, 0o666)  # noqa: S103 - let the in-process check decide
        held = {
            "gamma api": Wire.to(gamma),
            "gamma face": session(face_of(gamma)),
            "delta api, nobody": _handed(delta, NOBODY),
            "delta face, nobody": _handed(face_of(delta), NOBODY),
            "operator, uid 4100": _handed(h.socket, 4100),
        }
        os.chmod(h.socket, 0o660)
        assert "result" in held["gamma api"].ask("ping", {})
        assert "result" in held["operator, uid 4100"].ask("servers/list", {})
        staying = Wire.to(delta)
        # delta's face subscribes to s3's resource first, the operator's after
        subscribed, watching = session(face_of(delta)), session(face_of(h.socket))
        for w in (subscribed, watching):
            assert "result" in w.ask("resources/subscribe", {"uri": "feat://watched"})
        proposal = pw.propose(delta, "s2", "narrowed")
        with h.client() as operator:
            assert operator.approve(proposal).status == "approved"
        try:
            doc["operators"] = {"uids": []}
            doc["profiles"] = [{"name": "delta", "servers": ["s1"], "uids": [ME]}]
            config_file.write_text(config_toml(doc), encoding="utf-8")
            with h.client() as operator:
                done = operator.daemon_reload()
            assert (done.profiles_removed, done.profiles_changed) == (
                ["gamma"],
                ["delta"],
            )
            # the removed profile's sockets are gone, and nobody gets in
            for path in (gamma, face_of(gamma)):
                assert not os.path.exists(path)
                with (
                    pytest.raises(FileNotFoundError),
                    socket.socket(socket.AF_UNIX) as s,
                ):
                    s.connect(path)
            # every connection whose authority the reload took is cut
            for w in held.values():
                with contextlib.suppress(OSError):
                    w.send(request("ping", {}, "late"))
            cut = {what: w.closed(within=3.0) for what, w in held.items()}
            assert cut == dict.fromkeys(held, True)
            refused = as_user(lambda: Client(delta).hello(), uid=NOBODY)
            assert refused[1] == "permission_denied", refused
            # root's delta connection stays, with the narrowed scope at once
            assert "result" in staying.ask("ping", {})
            assert (
                reason(staying.ask("tools/list", {"server": "s2"})) == "unknown_server"
            )
            # and its approved proposal on s2 runs no more, as if s2 were gone
            resumed = staying.ask("approvals/resume", {"id": proposal})
            assert reason(resumed) == "not_approved", resumed
            assert resumed["error"]["data"]["status"] == "invalidated"
            assert "narrowed" not in calls(base_dir)
            # s3 is out of delta's scope: its updates no longer reach delta's face
            with h.client() as operator:
                operator.call_tool("s3", "touch", {"uri": "feat://watched"})
            wait_until(
                lambda: (
                    "notifications/resources/updated"
                    in {n["method"] for n in _drain(watching)}
                ),
                what="the operator's face hearing the update",
            )
            heard = {n["method"] for n in _drain(subscribed)}
            assert "notifications/resources/updated" not in heard
        finally:
            subscribed.close()
            watching.close()
            staying.close()
            for w in held.values():
                w.close()


def test_every_name_another_face_shows_is_unknown_on_this_one(
    probed: DaemonHarness, base: str
) -> None:
    """Each tool name the operator's face and beta's face show for a server
    alpha does not reach (``u__t``'s names carry the separator twice) is, on
    alpha's face, an unknown tool, as that name with a prefix nobody has."""
    foreign: set[str] = set()
    for path in (face_of(probed.socket), face_of(agent_socket(base, "beta"))):
        with contextlib.closing(session(path)) as w:
            for tool in w.ask("tools/list", {}, "tools")["result"]["tools"]:
                if tool.get("_meta", {}).get("memorizz/server") not in ("t", "tk"):
                    foreign.add(tool["name"])
    assert {"u__echo", "feat__touch", "u__t__hello"} <= foreign
    forged = {*foreign, "u__t__echo", "t__u__echo", "u__t__u__echo", "__u__echo"}
    with contextlib.closing(session(face_of(agent_socket(base, "alpha")))) as w:
        for name in sorted(forged):
            hidden = w.ask("tools/call", {"name": name, "arguments": {}})
            absent = w.ask("tools/call", {"name": "zz" + name, "arguments": {}})
            assert reason(absent) == "invalid_params", absent
            same_answer(hidden, absent, name, "zz" + name)
