"""An authority battery: what one caller may do to what another made, across
the doors the other probes leave (tests/daemon/test_authority_probes.py has
the method table, the id-bearing paths and the reloads that cut connections).

One daemon for the module, on real sockets: server ``t`` (tests/mcp_server.py;
its ``record`` tool, destructive so decided ``ask``, logs to <base>/calls.log),
shared by profile ``alpha`` (this process's uid and nobody) and profile
``beta`` (this process's uid), and reached by the operator (this process, the
daemon's uid). So the one uid is an operator on one socket and an agent of two
profiles on others: only the socket tells them apart. Requests go out as raw
JSON-RPC lines.
"""

from __future__ import annotations

import contextlib
import io
import os
import secrets
import stat
from collections.abc import Iterator
from functools import partial
from typing import Any

import msgspec
import pytest

from memorizz import Client
from memorizz.api import mcp_meta
from memorizz.cli import main as ctl_main
from memorizzd.config import Profile
from tests import proposals_world as pw
from tests.harness import DaemonHarness, stdio_spec, tempdir_fixture
from tests.peers import (
    ME,
    NOBODY,
    agent_socket,
    as_user,
    calls,
    needs_root,
    profiles_config,
)
from tests.wire import face_of, session, wire

base = tempdir_fixture()


@pytest.fixture(scope="module")
def battery(base: str) -> Iterator[DaemonHarness]:
    config = profiles_config(
        base,
        servers=[
            stdio_spec("t", env={"CALL_LOG": os.path.join(base, "calls.log")}),
            stdio_spec("u"),
        ],
        profiles=[
            Profile(
                name="alpha",
                servers=["t"],
                uids=[ME, NOBODY],
                face_tools=["proposals", "resume"],
            ),
            Profile(name="beta", servers=["t", "u"], uids=[ME]),
        ],
        face_approval_wait_s=0.2,
    )
    with DaemonHarness.running(config) as harness:
        harness.wait_ready("t")
        harness.wait_ready("u")
        yield harness


# --- the face's reuse of an approved proposal ------------------------------------


@pytest.mark.parametrize("face", ["operator", "alpha"])
def test_a_face_call_never_runs_a_proposal_another_profile_made(
    battery: DaemonHarness, base: str, face: str
) -> None:
    """A face runs an approved proposal in place of a new one only if its own
    caller made it (docs: "that this caller already proposed"): the same uid
    on the operator's face or on another profile's face, making the same call,
    gets a proposal of its own; beta's stays approved, and beta runs it, once."""
    tag = f"beta-{secrets.token_hex(4)}"
    theirs = pw.approved(battery, agent_socket(base, "beta"), "t", tag)
    path = face_of(battery.socket if face == "operator" else agent_socket(base, face))
    with contextlib.closing(session(path)) as w:
        tools = w.ask("tools/list", {}, "tools")["result"]["tools"]
        [shown] = [
            t["name"]
            for t in tools
            if t.get("_meta", {}).get("memorizz/server") == "t"
            and t["_meta"]["memorizz/tool"] == "record"
        ]
        answer = w.ask("tools/call", {"name": shown, "arguments": {"tag": tag}})
    result = answer["result"]
    assert result.get("isError") is True, result
    said = result["_meta"]["memorizz/error"]  # record declares an output schema
    assert said["status"] == "pending", result
    assert said["proposal_id"] != theirs
    assert tag not in calls(base)
    assert pw.status_of(battery, theirs) == "approved"
    with Client(agent_socket(base, "beta")) as beta:
        assert beta.resume(theirs).content[0]["text"] == f"recorded {tag}"
    assert calls(base).count(tag) == 1


# --- memorizzctl as a uid that is no operator ---------------------------------------

OPERATOR_COMMANDS: tuple[tuple[str, ...], ...] = (
    ("mcp", "list"),
    ("mcp", "status"),
    ("mcp", "remove", "t"),
    ("mcp", "add", "evil", "--command", "/bin/true"),
    ("mcp", "approve", "p_" + "0" * 24),
    ("mcp", "reject", "p_" + "0" * 24),
    ("audit", "--limit", "1"),
    ("vault", "rotate"),
    ("daemon", "status"),
    ("daemon", "reload"),
    ("daemon", "metrics"),
    ("mcp", "logout", "t"),
)
"""What only an operator may do."""


def _ctl(socket_path: str, argv: tuple[str, ...]) -> tuple[int, str, str]:
    """memorizzctl's ``main``, run here (a child under another uid cannot
    exec this interpreter, which lives in root's home): exit status, stdout,
    stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = ctl_main(["--socket", socket_path, *argv])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    return code, out.getvalue(), err.getvalue()


@needs_root
@pytest.mark.parametrize(
    ("where", "mode"), [("operator", 0o660), ("operator", 0o666), ("agent", 0o666)]
)
def test_memorizzctl_as_no_operator_is_refused_every_operator_command(
    battery: DaemonHarness, base: str, mode: int, where: str
) -> None:
    """nobody (alpha's agent, no operator) runs memorizzctl's operator
    commands: on the operator socket (refused by its file mode, or, opened to
    all, by the daemon's check of the peer) and on alpha's agent socket, every
    one exits 77 (permission denied), says so, never with a traceback, and
    changes nothing."""
    path = battery.socket if where == "operator" else agent_socket(base, "alpha")
    for argv in OPERATOR_COMMANDS:  # every module it loads, loaded here first
        _ctl(os.path.join(base, "none.sock"), argv)
    before = os.stat(path).st_mode
    os.chmod(path, mode)
    try:
        found = {
            argv: as_user(partial(_ctl, path, argv), uid=NOBODY)
            for argv in OPERATOR_COMMANDS
        }
    finally:
        os.chmod(path, stat.S_IMODE(before))
    for argv, outcome in found.items():
        assert outcome[0] == "ok", (argv, outcome)
        code, out, err = outcome[1]
        if where == "agent" and argv == ("daemon", "metrics"):
            assert code == 69, (code, err)  # no metrics socket beside an agent's
            continue
        if where == "agent" and argv == ("mcp", "list"):
            assert (code, out) == (0, "t\n"), err  # its servers' names (hello)
            continue
        assert code == 77, (argv, code, out, err)
        assert "Traceback" not in out + err, (argv, err)
        assert "permission" in (out + err) or "may not" in err, (argv, out, err)
    with battery.client() as operator:
        assert {"t", "u"} <= {s.name for s in operator.list_servers()}
        assert "evil" not in {s.name for s in operator.list_servers()}


# --- the face in the 2026-07-28 era -------------------------------------------------


def _stamp(params: dict[str, Any]) -> dict[str, Any]:
    """``params`` as a 2026-07-28 client sends them (no session: each request
    says its era and what its client answers)."""
    meta = {
        mcp_meta.PROTOCOL_VERSION: "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {"elicitation": {}},
    }
    return {**params, "_meta": meta}


def _hides(hidden: dict[str, Any], absent: dict[str, Any], name: str) -> None:
    """``hidden`` (about ``name``, another profile's) is exactly ``absent``
    (about ``"zz" + name``, nobody's), but for the name."""
    assert "error" in hidden, hidden
    text = msgspec.json.encode(absent["error"]).decode().replace("zz" + name, name)
    assert msgspec.json.encode(hidden["error"]).decode() == text


def test_the_modern_face_hides_another_profiles_server_as_a_missing_one(
    battery: DaemonHarness, base: str
) -> None:
    """A 2026-07-28 client of alpha's face (no initialize) that names what
    only beta reaches (server ``u``) is answered as for a name nobody has,
    and ``server/discover`` says nothing of ``u``."""
    with wire(face_of(agent_socket(base, "alpha"))) as w:
        found = w.ask("server/discover", _stamp({}))["result"]
        assert "u" not in msgspec.json.encode(found).decode().split('"')
        for method, params, name in (
            ("tools/call", {"name": "u__echo", "arguments": {"text": "x"}}, "u__echo"),
            (
                "tools/call",
                {"name": "u__record", "arguments": {"tag": "x"}},
                "u__record",
            ),
            ("prompts/get", {"name": "u__greet", "arguments": {}}, "u__greet"),
            ("memorizz/scope", {"server": "u"}, "u"),
        ):
            if method == "memorizz/scope":  # narrowed to beta's server
                w.note(method, params)
                hidden = w.ask("tools/list", _stamp({}), "h")
                w.note(method, {"server": "zzu"})
                absent = w.ask("tools/list", _stamp({}), "h")
            else:
                swapped = msgspec.json.decode(
                    msgspec.json.encode(params).decode().replace(name, "zz" + name)
                )
                hidden = w.ask(method, _stamp(params), "h")
                absent = w.ask(method, _stamp(swapped), "h")
            _hides(hidden, absent, name)
