"""Escalation probes: an outside "authority prober" looking for any way a
caller gets more than its role and profile allow, through the doors the
other authority batteries leave (tests/daemon/test_authority_probes.py has
the method table on every socket, the id-bearing paths and the reloads that
cut connections; test_authority_battery.py a face's reuse of another
profile's proposal).

One daemon for the module, on real sockets: ``t`` (tests/mcp_server.py; its
``record`` tool is destructive, so decided ``ask``, and logs its tag to
<base>/calls.log), ``t2`` and ``x`` (tests/legacy_server.py, tool ``hello``)
and, where node is installed, ``tk`` (tests/node/task_server.mjs: tasks).
Profile ``alpha`` (this process's uid and nobody; its face has the built-in
tools) reaches ``t``, ``t2`` and ``tk``; ``beta`` (this process's uid) reaches
``x`` and ``tk``; the operator is this process (the daemon's uid). The reload
probe runs a daemon of its own, from a config file. Requests go out as raw
JSON-RPC lines (what is probed is the wire), clients under other uids run in
forked children (tests/peers.py: those probes need root, as in CI).

Each refusal is checked to be the documented one (a stable reason; what
belongs to someone else answered exactly as what does not exist), and the
daemon to serve on after it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import select
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from memorizz.api import mcp_meta
from memorizz.api.protocol import PROTOCOL_VERSION
from memorizzd.config import Profile, load
from memorizzd.rpc.handoff import HANDOFF_ACK, HANDOFF_LINE
from tests import proposals_world as pw
from tests.harness import (
    INITIALIZE,
    DaemonHarness,
    config_doc,
    config_toml,
    light_spec,
    stdio_entry,
    stdio_spec,
    task_spec,
    tempdir_fixture,
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
from tests.wire import READ_S, Wire, face_of, reason, request, rights, session

STRANGER = 4001
"""A uid no socket admits."""


# --- answers ------------------------------------------------------------------


def _unzz(value: Any) -> Any:
    """``value`` with the first ``zz`` of each string taken out."""
    if isinstance(value, str):
        return value.replace("zz", "", 1)
    if isinstance(value, dict):
        return {k: _unzz(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unzz(v) for v in value]
    return value


def same_answer(hidden: dict[str, Any], missing: dict[str, Any]) -> None:
    """``hidden`` (about a name that exists for someone else, or a spelling
    of one) is exactly ``missing`` (about ``"zz"`` + that name, which exists
    for nobody), but for the ``zz``: code, message and data alike."""
    said = "error" if "error" in missing else "result"
    assert said in hidden, (hidden, missing)
    assert hidden[said] == _unzz(missing[said]), (hidden, missing)


def names(answer: dict[str, Any]) -> list[str]:
    return sorted(t["name"] for t in answer["result"]["tools"])


def eof_within(read_end: int, seconds: float = 5.0) -> bool:
    """Whether every write end of the pipe ``read_end`` was closed within
    ``seconds``: a descriptor the daemon installed and kept would hold one
    open (the daemon runs in this process, so its descriptors are ours)."""
    ready, _, _ = select.select([read_end], [], [], seconds)
    return bool(ready) and os.read(read_end, 1) == b""


# --- the daemon ------------------------------------------------------------------


base = tempdir_fixture()


@pytest.fixture(scope="module")
def world(base: str) -> Iterator[DaemonHarness]:
    tasks = optional_task_spec()
    extra = [] if tasks is None else ["tk"]
    config = profiles_config(
        base,
        servers=[
            stdio_spec("t", env={"CALL_LOG": os.path.join(base, "calls.log")}),
            light_spec("t2", env={"CALL_LOG": os.path.join(base, "t2.log")}),
            light_spec("x", env={"CALL_LOG": os.path.join(base, "x.log")}),
            *([] if tasks is None else [tasks]),
        ],
        profiles=[
            Profile(
                name="alpha",
                servers=["t", "t2", *extra],
                uids=[ME, NOBODY],
                face_tools=["proposals", "resume"],
            ),
            Profile(name="beta", servers=["x", *extra], uids=[ME]),
        ],
        face_approval_wait_s=0.2,
    )
    with DaemonHarness.running(config) as harness:
        for name in ("t", "t2", "x", *extra):
            harness.wait_ready(name)
        yield harness


def _ran(base: str, log: str) -> list[str]:
    try:
        return Path(base, log).read_text(encoding="utf-8").split()
    except FileNotFoundError:
        return []


# --- 1. memorizz/scope: only ever narrowed -----------------------------------------


@pytest.mark.parametrize("via", ["socket", "handoff"])
@pytest.mark.parametrize("who", ["alpha", "operator"])
def test_a_scope_once_chosen_is_never_widened(
    world: DaemonHarness, base: str, who: str, via: str
) -> None:
    """``mcp serve --server t2`` narrows a session to ``t2``; its client may
    send ``memorizz/scope`` lines of its own (through the handed-over pipes
    as well), and none of them moves the session to another server: naming
    another leaves it nothing (``unknown_server`` for every listing and
    call, on the operator's face as on an agent's), naming ``t2`` again
    changes nothing. Nothing reaches ``t``."""
    path = face_of(agent_socket(base, "alpha") if who == "alpha" else world.socket)
    tag = f"widened-{secrets.token_hex(4)}"
    with contextlib.closing(session(path, via=via, scope="t2")) as w:
        assert names(w.ask("tools/list", {}, "l1")) == (
            ["hello", "memorizz__proposals", "memorizz__resume"]
            if who == "alpha"
            else ["hello"]
        )
        w.note("memorizz/scope", {"server": "t"})  # the client's own line
        refused = {
            "tools/list": w.ask("tools/list", {}, "l2"),
            "tools/call": w.ask(
                "tools/call", {"name": "record", "arguments": {"tag": tag}}, "c1"
            ),
            "tools/call hello": w.ask("tools/call", {"name": "hello"}, "c2"),
            "prompts/list": w.ask("prompts/list", {}, "p1"),
            "resources/list": w.ask("resources/list", {}, "r1"),
        }
        for what, answer in refused.items():
            assert reason(answer) == "unknown_server", (what, answer)
        w.note("memorizz/scope", {"server": "t2"})  # and back: still nothing
        assert reason(w.ask("tools/list", {}, "l3")) == "unknown_server"
        assert "result" in w.ask("ping", {}, "still")
    with contextlib.closing(session(path, via=via, scope="t2")) as w:
        w.note("memorizz/scope", {"server": "t2"})  # the same name: unchanged
        called = w.ask("tools/call", {"name": "hello", "arguments": {"tag": tag}})
        assert called["result"]["content"][0]["text"] == "hello from legacy"
    assert tag not in calls(base)
    assert _ran(base, "t2.log").count(tag) == 1
    with world.client() as operator:  # nothing was proposed either
        assert tag not in str(operator.list_approvals(show_arguments=True))


def test_a_scope_line_cannot_undo_a_narrowing_by_any_spelling(
    world: DaemonHarness, base: str
) -> None:
    """Lines that are not a scope (malformed, an id, other members, the
    method spelled otherwise) leave a narrowed session as it was; none
    reaches ``t``."""
    path = face_of(agent_socket(base, "alpha"))
    with contextlib.closing(session(path, via="socket", scope="t2")) as w:
        for params in (
            {},
            {"server": None},
            {"server": ["t", "t2"]},
            {"servers": ["t"]},
            "t",
        ):
            w.note("memorizz/scope", params)
        for method in ("Memorizz/Scope", "memorizz/scope ", "memorizz/unscope"):
            w.note(method, {"server": "t"})
        asked = w.ask(
            "memorizz/scope", {"server": "t"}, "with-id"
        )  # not a notification
        assert reason(asked) == "method_not_found", asked
        assert names(w.ask("tools/list", {}, "l")) == [
            "hello",
            "memorizz__proposals",
            "memorizz__resume",
        ]
        echo = w.ask("tools/call", {"name": "echo", "arguments": {"text": "x"}})
        assert reason(echo) == "invalid_params", echo  # an unknown tool here


# --- 2. identity is the socket's, whatever the payload says ---------------------------

CLAIMS: dict[str, Any] = {
    "profile": "beta",
    "role": "operator",
    "uid": 0,
    "caller": {"role": "operator", "profile": None, "uid": 0},
    "socket": "/run/memorizzd/memorizzd.sock",
}
"""What a caller may claim to be; nothing reads it."""


def test_what_a_caller_claims_to_be_changes_nothing(
    world: DaemonHarness, base: str
) -> None:
    """``daemon/hello`` (twice, the second claiming to be the operator or
    beta), a second ``initialize`` and ``_meta`` claims on the face: the
    connection keeps its socket's role and profile. alpha still may not call
    an operator's method, nor name beta's ``x``, which is answered as a
    server nobody has."""
    alpha = agent_socket(base, "alpha")
    mine = ["t", "t2"]
    with contextlib.closing(Wire.to(alpha)) as w:
        for i in range(2):
            hello = w.ask(
                "daemon/hello",
                {
                    "protocol_version": PROTOCOL_VERSION,
                    "client": "memorizzctl",
                    **CLAIMS,
                },
                f"hello{i}",
            )
            assert set(mine) <= set(hello["result"]["servers"])
            assert "x" not in hello["result"]["servers"]
        assert reason(w.ask("servers/list", CLAIMS, "sl")) == "permission_denied"
        assert reason(w.ask("audit/list", CLAIMS, "al")) == "permission_denied"
        for method, params in (
            ("tools/list", {"server": "x", **CLAIMS}),
            ("tools/call", {"server": "x", "name": "hello", **CLAIMS}),
        ):
            hidden = w.ask(method, params, "h")
            missing = w.ask(method, {**params, "server": "zzx"}, "m")
            assert reason(missing) == "unknown_server"
            same_answer(hidden, missing)
    face = face_of(alpha)
    meta = {
        "memorizz/server": "x",
        "memorizz/tool": "hello",
        "memorizz/profile": "beta",
    }
    with contextlib.closing(session(face, via="socket")) as w:
        again = {
            **INITIALIZE["params"],
            "clientInfo": {"name": "memorizzctl", "version": "0"},
        }
        w.ask("initialize", {**again, "_meta": meta, **CLAIMS}, "init2")
        shown = names(w.ask("tools/list", {"_meta": meta, **CLAIMS}, "l"))
        assert "x__hello" not in shown
        assert not {n for n in shown if n.startswith("x")}
        for name in ("hello", "x__hello"):
            params = {"name": name, "arguments": {}, "server": "x", "_meta": meta}
            hidden = w.ask("tools/call", params, "c")
            missing = w.ask("tools/call", {**params, "name": "zz" + name}, "m")
            assert reason(missing) == "invalid_params"
            same_answer(hidden, missing)
        modern = {
            **meta,
            mcp_meta.PROTOCOL_VERSION: "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
        }
        hidden = w.ask("tools/call", {"name": "x__hello", "_meta": modern}, "mc")
        missing = w.ask("tools/call", {"name": "zzx__hello", "_meta": modern}, "mm")
        same_answer(hidden, missing)
    assert _ran(base, "x.log") == []


# --- 3. spellings of another profile's names ------------------------------------------


def _renamed(name: str) -> str:
    """The face's rename of ``name`` (its valid prefix, ``_``, 8 hex digits)."""
    return f"{name}_{hashlib.sha256(name.encode()).hexdigest()[:8]}"


FACE_SPOOFS = (
    "x__hello",
    "X__hello",
    "x__HELLO",
    "x__hello\u0000",
    "x__hello\n",
    "x\u200b__hello",
    "\uff58__hello",
    "x\uff3f\uff3fhello",
    "x__hel\u200blo",
    " x__hello",
    "x___hello",
    "x_hello",
    "x-hello",
    "x.hello",
    "x/hello",
    "t2__x__hello",
    "x__t2__hello",
    _renamed("x__hello"),
    "x__hello" + "\u0301" * 50,
    "x" * 150 + "__hello",  # said back whole (at most 200 characters are)
)
"""Names for beta's ``x``'s ``hello`` on alpha's face, under every spelling."""

SERVER_SPOOFS = (
    "x",
    "X",
    "x\u0000",
    "x\n",
    "\uff58",
    "x\u200b",
    "x/",
    "./x",
    "x\u0301",
    "t/../x",
    "t2,x",
    "*",
    "",
)
"""Names for beta's ``x`` on alpha's socket."""


def test_no_spelling_of_another_profiles_name_reaches_it(
    world: DaemonHarness, base: str
) -> None:
    """Case, NUL and control characters, zero-width and full-width look-alikes,
    combining marks, the separator doubled or moved, the face's renamed form,
    a path, a list, a wildcard: on alpha's face and socket each is answered
    exactly as a name nobody has, and ``x`` never hears a call."""
    with contextlib.closing(
        session(face_of(agent_socket(base, "alpha")), via="socket")
    ) as w:
        for name in FACE_SPOOFS:
            for method, params in (
                ("tools/call", {"name": name, "arguments": {"tag": "spoof"}}),
                ("prompts/get", {"name": name}),
                (
                    "completion/complete",
                    {
                        "ref": {"type": "ref/prompt", "name": name},
                        "argument": {"name": "a", "value": ""},
                    },
                ),
            ):
                hidden = w.ask(method, params, "h")
                missing = w.ask(method, {**params, **_zz(params)}, "m")
                assert reason(missing) == "invalid_params", (method, missing)
                same_answer(hidden, missing)
        assert "result" in w.ask("ping", {}, "still")
    with contextlib.closing(Wire.to(agent_socket(base, "alpha"))) as w:
        for server in SERVER_SPOOFS:
            for method, params in (
                ("tools/call", {"server": server, "name": "hello", "arguments": {}}),
                ("tools/list", {"server": server}),
                ("ping", {"server": server}),
            ):
                hidden = w.ask(method, params, "h")
                missing = w.ask(method, {**params, "server": "zz" + server}, "m")
                assert reason(missing) == "unknown_server", (method, missing)
                same_answer(hidden, missing)
        assert "result" in w.ask("ping", {}, "still")
    assert _ran(base, "x.log") == []


def _zz(params: dict[str, Any]) -> dict[str, Any]:
    """``params`` with ``zz`` before the name it carries."""
    if "ref" in params:
        return {"ref": {**params["ref"], "name": "zz" + params["ref"]["name"]}}
    return {"name": "zz" + params["name"]}


# --- 4. a proposal runs only as it was approved -----------------------------------------


def _face_record(w: Wire, tag: str) -> dict[str, Any]:
    result: dict[str, Any] = w.ask(
        "tools/call", {"name": "t__record", "arguments": {"tag": tag}}, "rec"
    )["result"]
    return result


def test_a_proposal_runs_only_with_the_arguments_approved(
    world: DaemonHarness, base: str
) -> None:
    """alpha's approved ``record(A)``: a face call with other arguments
    proposes anew (and runs nothing); a resume that smuggles arguments, a
    server or a tool runs the stored call, on its server, once; the built-in
    ``memorizz__resume`` takes only the id; a pending proposal is run by
    nobody's resume, and an approval is nothing an agent can give."""
    alpha = agent_socket(base, "alpha")
    first, second = (f"approved-{secrets.token_hex(4)}" for _ in range(2))
    theirs = pw.approved(world, alpha, "t", first)
    with contextlib.closing(session(face_of(alpha), via="socket")) as w:
        other = _face_record(w, first + "-other")
        said = other["_meta"]["memorizz/error"]
        assert (said["status"], said["reason"]) == ("pending", "approval_required")
        assert said["proposal_id"] != theirs
        # an agent cannot decide: the face has no such tool, the socket refuses
        for tool in ("memorizz__approve", "memorizz__approvals", "memorizz__reject"):
            hidden = w.ask("tools/call", {"name": tool, "arguments": {"id": theirs}})
            missing = w.ask(
                "tools/call", {"name": "zz" + tool, "arguments": {"id": theirs}}
            )
            same_answer(hidden, missing)
        # the pending one stays pending, whoever asks to run it
        pending = w.ask(
            "tools/call",
            {"name": "memorizz__resume", "arguments": {"id": said["proposal_id"]}},
            "pend",
        )["result"]
        assert pending["_meta"]["memorizz/error"]["status"] == "pending", pending
        listed = w.ask(
            "tools/call",
            {"name": "memorizz__proposals", "arguments": {"show_arguments": True}},
            "list",
        )["result"]
        assert first not in msgspec.json.encode(listed).decode()  # no values shown
    with contextlib.closing(Wire.to(alpha)) as w:
        assert reason(w.ask("approvals/approve", {"id": said["proposal_id"]})) == (
            "permission_denied"
        )
        shown = w.ask("approvals/list", {"show_arguments": True}, "sa")
        assert reason(shown) == "permission_denied"
        smuggled = {
            "id": theirs,
            "arguments": {"tag": "smuggled"},
            "server": "x",
            "name": "hello",
            "tool": "echo",
        }
        ran = w.ask("approvals/resume", smuggled, "res")
        assert ran["result"]["content"][0]["text"] == f"recorded {first}", ran
        again = w.ask("approvals/resume", {"id": theirs}, "res2")
        assert reason(again) == "not_approved"
        assert again["error"]["data"]["status"] == "consumed"
    # through the face's built-in tool, extra arguments are not read either
    built_in = pw.approved(world, alpha, "t", second)
    with contextlib.closing(session(face_of(alpha), via="socket")) as w:
        ran = w.ask(
            "tools/call",
            {
                "name": "memorizz__resume",
                "arguments": {"id": built_in, "tag": "smuggled", "server": "x"},
            },
        )
        assert ran["result"]["content"][0]["text"] == f"recorded {second}", ran
    assert (calls(base).count(first), calls(base).count(second)) == (1, 1)
    assert "smuggled" not in calls(base)
    assert _ran(base, "x.log") == []
    assert pw.status_of(world, said["proposal_id"]) == "pending"


def test_built_in_tools_keep_to_a_narrowed_scope(
    world: DaemonHarness, base: str
) -> None:
    """A session narrowed to ``t2`` sees and resumes its own proposals on
    ``t2`` only: alpha's approved ``record`` on ``t`` is not listed there,
    and ``memorizz__resume`` of it is answered as an id nobody has; the
    session of alpha's whole scope runs it, once."""
    alpha = agent_socket(base, "alpha")
    tag = f"narrowed-{secrets.token_hex(4)}"
    theirs = pw.approved(world, alpha, "t", tag)
    missing = "p_" + secrets.token_hex(12)
    with contextlib.closing(session(face_of(alpha), via="socket", scope="t2")) as w:
        listed = w.ask("tools/call", {"name": "memorizz__proposals"}, "list")
        assert theirs not in msgspec.json.encode(listed).decode(), listed
        hidden = w.ask(
            "tools/call", {"name": "memorizz__resume", "arguments": {"id": theirs}}
        )
        absent = w.ask(
            "tools/call", {"name": "memorizz__resume", "arguments": {"id": missing}}
        )
        assert msgspec.json.encode(hidden).decode().replace(theirs, missing) == (
            msgspec.json.encode(absent).decode()
        )
    assert tag not in calls(base)
    with contextlib.closing(session(face_of(alpha), via="socket")) as w:
        ran = w.ask(
            "tools/call", {"name": "memorizz__resume", "arguments": {"id": theirs}}
        )
        assert ran["result"]["content"][0]["text"] == f"recorded {tag}", ran
    assert calls(base).count(tag) == 1


@needs_root
def test_a_face_reruns_an_approved_call_only_for_the_uid_that_made_it(
    world: DaemonHarness, base: str
) -> None:
    """Root's approved ``record(A)`` on alpha: nobody, also alpha's, making
    exactly that call on alpha's face is given a proposal of its own, and
    root's stays approved (a face reruns only its own caller's); root's own
    face call then runs it, once."""
    alpha = agent_socket(base, "alpha")
    tag = f"uid-{secrets.token_hex(4)}"
    theirs = pw.approved(world, alpha, "t", tag)
    face = face_of(alpha)

    def call_it() -> dict[str, Any]:
        with contextlib.closing(session(face, via="socket")) as w:
            return _face_record(w, tag)

    outcome = as_user(call_it, uid=NOBODY)
    assert outcome[0] == "ok", outcome
    said = outcome[1]["_meta"]["memorizz/error"]
    assert said["status"] == "pending", said
    assert said["proposal_id"] != theirs
    assert tag not in calls(base)
    assert pw.status_of(world, theirs) == "approved"
    assert call_it()["content"][0]["text"] == f"recorded {tag}"
    assert calls(base).count(tag) == 1
    with world.client() as operator:
        operator.reject(said["proposal_id"])


def test_built_in_tools_exist_only_where_the_profile_names_them(
    world: DaemonHarness, base: str
) -> None:
    """beta names no ``face_tools`` and the operator's face has none:
    ``memorizz__proposals`` and ``memorizz__resume`` there are unknown tools,
    answered as names nobody has, and never run alpha's proposal."""
    tag = f"builtin-{secrets.token_hex(4)}"
    theirs = pw.approved(world, agent_socket(base, "alpha"), "t", tag)
    for path in (face_of(agent_socket(base, "beta")), face_of(world.socket)):
        with contextlib.closing(session(path, via="socket")) as w:
            assert not {n for n in names(w.ask("tools/list", {})) if "memorizz" in n}
            for tool in ("memorizz__proposals", "memorizz__resume"):
                params = {"name": tool, "arguments": {"id": theirs}}
                hidden = w.ask("tools/call", params, "h")
                missing = w.ask("tools/call", {**params, "name": "zz" + tool}, "m")
                same_answer(hidden, missing)
    assert tag not in calls(base)
    assert pw.status_of(world, theirs) == "approved"
    with world.client() as operator:
        operator.cancel_approval(theirs)


# --- 5. descriptors and the identity of a handed-over session ------------------------


def _offer_on(path: str, first: bytes, fds: list[int]) -> dict[str, Any]:
    """On a new connection to ``path``: ``first`` (a line, or nothing), then
    the hand-over line with ``fds`` attached; the answer to the hand-over."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(READ_S)
        sock.connect(path)
        w = Wire(sock)
        if first:
            w.write(first)
            w.reply()
        sock.sendmsg([HANDOFF_LINE + b"\n"], rights(fds))
        found = w.reply()
        w.write(request("ping", {}, "after") + b"\n")  # and it goes on serving
        assert w.reply()["id"] == "after"
        return found


def test_descriptors_are_taken_only_by_a_faces_first_hand_over(
    world: DaemonHarness, base: str
) -> None:
    """Descriptors sent on an API socket (agent or operator), sent to a face
    after its first request, or more than two of them, are never kept: the
    pipe's write end they carried is closed at once (its reader sees the end
    of the file), the answer is a plain refusal, and the connection serves
    on as the plain connection it was."""
    alpha = agent_socket(base, "alpha")
    init = request("initialize", INITIALIZE["params"], "init") + b"\n"
    cases: list[tuple[str, bytes, int, str | None]] = [
        (alpha, b"", 1, "method_not_found"),
        (world.socket, b"", 2, "method_not_found"),
        (face_of(alpha), init, 2, "method_not_found"),
        (face_of(alpha), b"", 3, "invalid_request"),
        (face_of(alpha), b"", 1, "invalid_request"),
    ]
    for path, first, count, expected in cases:
        pipes = [os.pipe() for _ in range(count)]
        try:
            answer = _offer_on(path, first, [w for _, w in pipes])
            assert answer["id"] == "mz-handoff", answer
            assert reason(answer) == expected, (path, count, answer)
            for r, w in pipes:
                os.close(w)
                assert eof_within(r), (path, count, "a descriptor was kept")
        finally:
            for r, _ in pipes:
                os.close(r)


@needs_root
def test_a_refused_peers_descriptors_are_never_taken(
    world: DaemonHarness, base: str
) -> None:
    """A uid that is no operator, on the operator's face opened to all: one
    ``permission_denied`` line, the connection closed, and the descriptors
    it sent with its hand-over closed unread."""
    face = face_of(world.socket)

    def offer() -> tuple[str | None, bool]:
        r, w = os.pipe()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(READ_S)
        sock.connect(face)
        with contextlib.suppress(OSError):  # refused: perhaps closed already
            sock.sendmsg([HANDOFF_LINE + b"\n"], rights([w, w]))
        got = b""
        with contextlib.suppress(OSError):
            while chunk := sock.recv(1 << 10):
                got += chunk
        sock.close()
        os.close(w)
        said = msgspec.json.decode(got.split(b"\n")[0]) if got else None
        return None if said is None else said["error"]["data"]["reason"], eof_within(r)

    before = os.stat(face).st_mode
    os.chmod(face, 0o666)  # noqa: S103 - let the in-process check decide
    try:
        outcome = as_user(offer, uid=STRANGER, gid=STRANGER)
    finally:
        os.chmod(face, before & 0o7777)
    assert outcome == ("ok", ["permission_denied", True]), outcome
    with contextlib.closing(
        session(face, via="socket")
    ) as w:  # the operator is served on
        assert "result" in w.ask("ping", {}, "p")


@needs_root
def test_a_handed_over_socket_lends_its_creator_no_identity(
    world: DaemonHarness, base: str
) -> None:
    """A socket pair a stranger made (its ``SO_PEERCRED`` names the stranger)
    handed over on root's alpha face connection: the session is root's alpha
    session, as the kernel said at accept, and is audited so; the stranger's
    credentials are never read (it would be refused)."""
    here, there = socket.socketpair()
    with here, there:

        def make_pair() -> bool:
            a, b = socket.socketpair()
            socket.send_fds(there, [b"x"], [a.fileno(), b.fileno()])
            return True

        assert as_user(make_pair, uid=STRANGER, gid=STRANGER) == ("ok", True)
        _, fds, _, _ = socket.recv_fds(here, 1, 2)
    daemon_end, client_end = (socket.socket(fileno=fd) for fd in fds)
    with daemon_end, client_end:
        creds = client_end.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
        assert int.from_bytes(creds[4:8], "little") == STRANGER
        face = face_of(agent_socket(base, "alpha"))
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(READ_S)
        sock.connect(face)
        sock.sendmsg(
            [HANDOFF_LINE + b"\n"], rights([daemon_end.fileno(), daemon_end.fileno()])
        )
        assert sock.recv(1 << 10) == HANDOFF_ACK
        daemon_end.close()
        w = Wire(client_end)
        text = f"lent-{secrets.token_hex(4)}"
        w.ask("initialize", INITIALIZE["params"], "init")
        echoed = w.ask("tools/call", {"name": "t__echo", "arguments": {"text": text}})
        assert echoed["result"]["content"][0]["text"] == text
        sock.close()
    with world.client() as operator:
        record = next(
            r
            for r in operator.audit(limit=50, server="t").records
            if r.action == "tools/call" and r.tool == "echo" and r.caller_socket == face
        )
    assert (record.caller_uid, record.caller_pid, record.caller_profile) == (
        ME,
        os.getpid(),
        "alpha",
    )


# --- 6. a reload that narrows a profile, on the connections it had ---------------------


def _hold(api: Wire) -> str:
    """The id of a task of ``tk``'s ``hold`` (it runs until cancelled)."""
    params = {"server": "tk", "name": "hold", "arguments": {}, "task": {"ttl": 60000}}
    task_id: str = api.ask("tools/call", params)["result"]["task"]["taskId"]
    return task_id


def test_a_narrowing_reload_takes_tasks_and_built_in_tools_from_open_connections(
    base_dir: str,
) -> None:
    """gamma's open API connection and face session hold a task on ``tk``
    and the built-in tools; a reload takes ``tk`` and the built-ins out of
    gamma. On the same connections, at once: the task is answered as one
    never made (get, result, cancel), is not listed, and its cancel never
    reaches the server; ``tk``'s tools and the built-ins are unknown tools.
    A reload that gives ``tk`` back shows the task still working. A reload
    that removes gamma, and one that adds a gamma again (the same uid): the
    new profile never reaches the old one's tasks."""
    os.chmod(base_dir, 0o755)  # noqa: S103 - the agents directory lives below
    config_file = Path(base_dir, "memorizzd.toml")
    doc = config_doc(
        base_dir,
        agents_dir=os.path.join(base_dir, "agents"),
        servers=[stdio_entry(light_spec("s1")), stdio_entry(task_spec("tk"))],
        profiles=[
            {
                "name": "gamma",
                "servers": ["s1", "tk"],
                "uids": [ME],
                "face_tools": ["proposals", "resume"],
            }
        ],
    )
    config_file.write_text(config_toml(doc), encoding="utf-8")

    def reload(servers: list[str], face_tools: list[str]) -> None:
        doc["profiles"][0] |= {"servers": servers, "face_tools": face_tools}
        config_file.write_text(config_toml(doc), encoding="utf-8")
        with h.client() as operator:
            assert operator.daemon_reload().profiles_changed == ["gamma"]

    with DaemonHarness.running(load(str(config_file))) as h:
        h.wait_ready("s1")
        h.wait_ready("tk")
        gamma = agent_socket(base_dir, "gamma")
        api, face = Wire.to(gamma), session(face_of(gamma), via="socket")
        try:
            task_id = _hold(api)
            missing = "t_" + secrets.token_hex(12)
            assert "tk__hold" in names(face.ask("tools/list", {}, "l0"))
            reload(["s1"], [])
            for method in ("tasks/get", "tasks/result", "tasks/cancel"):
                hidden = api.ask(method, {"task_id": task_id}, "h")
                absent = api.ask(method, {"task_id": missing}, "m")
                assert reason(absent) == "invalid_params", absent
                assert hidden["error"] == {
                    **absent["error"],
                    "message": absent["error"]["message"].replace(missing, task_id),
                    "data": {**absent["error"]["data"], "task_id": task_id},
                }
                hidden = face.ask(method, {"taskId": task_id}, "fh")
                assert reason(hidden) == "invalid_params", hidden
            assert api.ask("tasks/list", {}, "tl")["result"]["tasks"] == []
            assert face.ask("tasks/list", {}, "ftl")["result"]["tasks"] == []
            assert names(face.ask("tools/list", {}, "l1")) == ["hello"]
            for tool in ("tk__hold", "hold", "memorizz__proposals", "memorizz__resume"):
                hidden = face.ask("tools/call", {"name": tool, "arguments": {}}, "c")
                absent = face.ask("tools/call", {"name": "zz" + tool}, "m")
                assert reason(absent) == "invalid_params"
                same_answer(hidden, absent)
            assert reason(api.ask("tools/list", {"server": "tk"}, "tk")) == (
                "unknown_server"
            )
            reload(["s1", "tk"], ["proposals", "resume"])
            got = api.ask("tasks/get", {"task_id": task_id}, "back")
            assert got["result"]["status"] == "working", got  # no cancel reached it
            cancelled = api.ask("tasks/cancel", {"task_id": task_id}, "end")
            assert cancelled["result"]["status"] == "cancelled"
            assert "result" in face.ask("ping", {}, "alive")
            again = _hold(api)
        finally:
            api.close()
            face.close()
        # A profile removed, then one of the same name added: another profile,
        # which never reaches the old one's tasks (nor its proposals).
        profile = doc.pop("profiles")
        config_file.write_text(config_toml(doc), encoding="utf-8")
        with h.client() as operator:
            assert operator.daemon_reload().profiles_removed == ["gamma"]
        doc["profiles"] = profile
        config_file.write_text(config_toml(doc), encoding="utf-8")
        with h.client() as operator:
            assert operator.daemon_reload().profiles_added == ["gamma"]
        api = Wire.to(gamma)
        try:
            for method in ("tasks/get", "tasks/result", "tasks/cancel"):
                unknown = api.ask(method, {"task_id": again}, "new")
                assert reason(unknown) == "invalid_params", unknown
            assert api.ask("tasks/list", {}, "tl")["result"]["tasks"] == []
        finally:
            api.close()
