"""Who may do what: operator and agent sockets, real peer credentials.

Clients run under other uids and gids in forked children (tests/peers.py), so
the daemon's checks see what the kernel reports, as in production.
"""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator

import anyio
import msgspec
import pytest

from memorizz import Client
from memorizz.api.errors import NotFoundError, PermissionDeniedError, UnavailableError
from memorizz.api.methods import METHODS
from memorizz.cli import main as ctl_main
from memorizzd.caller import Caller
from memorizzd.config import ConfigError, Limits, Profile, load
from memorizzd.listeners import activated_sockets, close_all, open_all
from memorizzd.rpc import authority
from memorizzd.rpc.authority import AGENT_METHODS, ROLES, SocketRule
from memorizzd.rpc.dispatch import Dispatcher
from tests.harness import (
    DAEMON_EXE,
    DaemonHarness,
    stdio_spec,
    tempdir_fixture,
    wait_until,
)
from tests.peers import ME, NOBODY, agent_socket, as_user, needs_root, profiles_config
from tests.process import empty_config

shared_base = tempdir_fixture()


@pytest.fixture(scope="module")
def profiled(shared_base: str) -> Iterator[DaemonHarness]:
    """One daemon for the module: these tests change no state."""
    tight = Profile(
        name="tight",
        servers=["t"],
        uids=[ME],
        limits=Limits(
            max_connections=2, max_request_bytes=1024, first_frame_timeout_s=0.3
        ),
    )
    config = profiles_config(shared_base)
    config.profiles.append(tight)
    with DaemonHarness.running(config) as harness:
        harness.wait_ready("t")
        harness.wait_ready("u")
        yield harness


def test_every_method_has_its_roles() -> None:
    assert set(ROLES) == set(METHODS)
    assert set(AGENT_METHODS) <= set(METHODS)
    agent_only = {name for name, roles in ROLES.items() if "agent" in roles}
    assert agent_only == AGENT_METHODS
    for escalating in (
        "servers/add",
        "servers/remove",
        "servers/list",
        "audit/list",
        "vault/rotate",
        "approvals/approve",
        "approvals/reject",
        "daemon/status",
        "auth/login",
        "auth/complete",
        "auth/logout",
    ):
        assert ROLES[escalating] == {"operator"}


def test_root_is_an_operator_only_where_configured(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(authority.os, "getuid", lambda: 998)  # the daemon's uid
    root = Caller(pid=1, uid=0, gid=0, socket="/s")
    assert not SocketRule(role="operator", uids=frozenset({0})).admits(root)
    assert SocketRule(role="operator", allow_root=True, uids=frozenset({0})).admits(
        root
    )
    daemon_self = Caller(pid=1, uid=998, gid=998, socket="/s")
    assert SocketRule(role="operator").admits(daemon_self)
    grouped = Caller(pid=1, uid=5, gid=5, groups=(77,), socket="/s")
    assert SocketRule(role="operator", gids=frozenset({77})).admits(grouped)
    assert not SocketRule(role="operator", gids=frozenset({78})).admits(grouped)


def test_sockets_get_their_directories_and_modes(
    profiled: DaemonHarness, shared_base: str
) -> None:
    path = agent_socket(shared_base, "alpha")
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o755
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o666  # gated in-process by uids
    expected = 0o660 if os.geteuid() == 0 else 0o600
    assert stat.S_IMODE(os.stat(profiled.socket).st_mode) == expected


def test_root_on_an_agent_socket_is_still_an_agent(
    profiled: DaemonHarness, shared_base: str
) -> None:
    with Client(agent_socket(shared_base, "alpha")) as c:
        c.hello()
        c.ping()
        assert {t.name for t in c.list_tools("t")} >= {"echo", "record"}
        for attempt in (
            c.list_servers,
            c.daemon_status,
            lambda: c.audit(limit=5),
            c.rotate_vault,
            lambda: c.remove_server("t"),
            lambda: c.add_server(stdio_spec("evil")),
            lambda: c.server_status("t"),
            lambda: c.approve("p_0"),
            lambda: c.reject("p_0"),
            lambda: c.auth_login("t"),
            lambda: c.auth_complete("t", "http://127.0.0.1/cb?code=x&state=y"),
            lambda: c.auth_logout("t"),
        ):
            with pytest.raises(PermissionDeniedError) as err:
                attempt()
            assert err.value.reason == "permission_denied"


def test_another_profiles_server_is_not_found_like_a_missing_one(
    profiled: DaemonHarness, shared_base: str
) -> None:
    with Client(agent_socket(shared_base, "alpha")) as c:
        for call in (
            lambda name: c.list_tools(name),
            lambda name: c.call_tool(name, "echo", {"text": "x"}),
            lambda name: c.list_resources(name),
            lambda name: c.list_prompts(name),
            lambda name: c.ping(name),
        ):
            with pytest.raises(NotFoundError) as hidden:
                call("u")
            with pytest.raises(NotFoundError) as missing:
                call("zz")
            assert hidden.value.reason == missing.value.reason == "unknown_server"
            assert hidden.value.message == missing.value.message.replace("zz", "u")
    with profiled.client() as c:  # the operator reaches both
        assert c.call_tool("u", "echo", {"text": "op"}).is_error is False


@needs_root
def test_an_agent_under_its_own_uid_gets_only_the_agent_surface(
    profiled: DaemonHarness, shared_base: str
) -> None:
    path = agent_socket(shared_base, "alpha")

    def agent() -> dict[str, object]:
        with Client(path) as c:
            echoed = c.call_tool("t", "echo", {"text": "hi"})
            try:
                c.list_servers()
            except PermissionDeniedError as exc:
                servers = exc.reason
            try:
                c.list_tools("u")
            except NotFoundError as exc:
                other = exc.reason
            return {"echo": echoed.content[0]["text"], "servers": servers, "u": other}

    assert as_user(agent) == (
        "ok",
        {"echo": "hi", "servers": "permission_denied", "u": "unknown_server"},
    )


@needs_root
def test_a_uid_not_allowed_on_a_profile_is_refused(
    profiled: DaemonHarness, shared_base: str
) -> None:
    path = agent_socket(shared_base, "alpha")

    def hello() -> object:
        with Client(path) as c:
            return c.hello()

    refused = as_user(hello, uid=4001, gid=4001)
    assert refused[:3] == ("remote", "permission_denied", -32001)
    # ... unless one of its groups is allowed (a supplementary one, from the kernel)
    assert as_user(hello, uid=4001, gid=4001, groups=(4242,))[0] == "ok"
    # beta allows only uid 0: nobody is refused there too
    beta = agent_socket(shared_base, "beta")
    assert as_user(lambda: Client(beta).hello(), uid=NOBODY)[1] == "permission_denied"


@needs_root
def test_the_operator_socket_checks_the_peer(
    profiled: DaemonHarness, shared_base: str
) -> None:
    os.chmod(profiled.socket, 0o666)  # noqa: S103 - let the in-process check decide
    path = profiled.socket

    def servers() -> object:
        with Client(path) as c:
            return [s.name for s in c.list_servers()]

    try:
        assert as_user(servers, uid=4100, gid=4100) == ("ok", ["t", "u"])
        assert as_user(servers, uid=4101, gid=4101)[1] == "permission_denied"
    finally:
        os.chmod(path, 0o660)


def test_per_profile_limits(profiled: DaemonHarness, shared_base: str) -> None:
    path = agent_socket(shared_base, "tight")
    # A request line over max_request_bytes closes the connection.
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(path)
        s.sendall(b'{"jsonrpc":"2.0","id":1,"method":"ping","x":"' + b"y" * 2000)
        s.settimeout(5)
        assert b"frame_too_large" in s.recv(4096)
    # A peer that sends no complete line in time is cut off (slowloris).
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(path)
        s.sendall(b'{"jsonrpc":"2.0",')
        s.settimeout(5)
        reply = s.recv(4096)
        assert b'"timeout"' in reply
        assert s.recv(4096) == b""
    # At most max_connections at once.
    with Client(path) as one, Client(path) as two:
        one.hello()
        two.hello()
        with Client(path) as three, pytest.raises(UnavailableError) as err:
            three.hello()
        assert getattr(err.value, "reason", None) == "overloaded"
    wait_until(lambda: _hello_works(path), what="a connection slot to free up")


def _hello_works(path: str) -> bool:
    try:
        with Client(path) as c:
            c.hello()
    except Exception:  # noqa: BLE001 - still full
        return False
    return True


def test_activated_sockets_are_taken_by_name() -> None:
    assert activated_sockets({"LISTEN_PID": "1", "LISTEN_FDS": "1"}) == {}


def test_systemd_socket_activation(base_dir: str) -> None:
    """memorizzd serves the socket systemd passed (fd 3, FileDescriptorName=operator)
    and leaves the socket file alone when it stops."""
    path = os.path.join(base_dir, "activated.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen()
    fd = listener.fileno()
    exec_on_fd3 = (  # what systemd does: the socket at fd 3, LISTEN_* for this pid
        "import os, sys; os.dup2(int(sys.argv[1]), 3); os.environ.update("
        "LISTEN_PID=str(os.getpid()), LISTEN_FDS='1', LISTEN_FDNAMES='operator');"
        " os.execv(sys.argv[2], sys.argv[2:])"
    )
    log_path = os.path.join(base_dir, "daemon.log")
    log = open(log_path, "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            exec_on_fd3,
            str(fd),
            DAEMON_EXE,
            "--config",
            empty_config(base_dir),
            "--socket",
            path,
            "--state-dir",
            os.path.join(base_dir, "state"),
        ],
        pass_fds=[fd],
        stdout=log,
        stderr=log,
    )
    log.close()

    def started() -> bool:
        with open(log_path) as f:
            text = f.read()
        assert proc.poll() is None, text
        return "listening on" in text

    try:
        wait_until(started, what="memorizzd on the activated socket")
        with Client(path) as c:  # answered by the daemon through the passed socket
            c.hello()
            assert c.daemon_status().pid == proc.pid
    finally:
        proc.terminate()
        assert proc.wait(30) == 0
        listener.close()
    assert os.path.exists(path)  # systemd's socket: not unlinked by the daemon


def test_a_caller_without_a_role_is_refused_every_method() -> None:
    """A connection's role comes from its socket's rule; one built without a
    role is refused, never taken for an operator (not even the daemon's uid)."""
    ran: list[str] = []

    async def handler(caller: Caller, params: object) -> object:
        ran.append(type(params).__name__)
        raise AssertionError("unreachable")

    dispatcher = Dispatcher(dict.fromkeys(METHODS, handler))
    nobody = Caller(pid=1, uid=os.getuid(), gid=os.getgid(), socket="/s")
    assert nobody.role is None
    for name in METHODS:
        assert not authority.method_allowed(nobody, name)
        line = msgspec.json.encode(
            {"jsonrpc": "2.0", "id": 1, "method": name, "params": {}}
        )
        request = dispatcher.parse(line)
        assert not isinstance(request, bytes)
        reply = msgspec.json.decode(anyio.run(dispatcher.run, nobody, request))
        assert reply["error"]["data"]["reason"] == "permission_denied", name
    assert ran == []


def test_caller_struct_round_trips() -> None:
    caller = Caller(pid=1, uid=2, gid=3, socket="/s", groups=(4,), profile="p")
    assert msgspec.json.decode(msgspec.json.encode(caller), type=Caller) == caller
    assert caller.all_gids == {3, 4}


def test_profiles_and_operators_load_from_toml(base_dir: str) -> None:
    path = os.path.join(base_dir, "c.toml")
    with open(path, "w", encoding="utf-8") as f:
        f.write(
            """
socket = "/run/x/m.sock"
approval_ttl_s = 60
[operators]
uids = [1000]
groups = ["root", 4242]
[[profiles]]
name = "ci-bot"
servers = ["github"]
uids = [1500]
gids = ["root"]
[profiles.limits]
max_connections = 4
first_frame_timeout_s = 2.5
"""
        )
    config = load(path)
    assert config.agents_dir == "/run/x/agents"
    assert config.operators.groups == ["root", 4242]
    [profile] = config.profiles
    assert (profile.name, profile.servers, profile.uids) == (
        "ci-bot",
        ["github"],
        [1500],
    )
    assert (profile.limits.max_connections, profile.limits.max_in_flight) == (4, 64)
    assert config.approval_ttl_s == 60
    assert authority.agent_rule(profile).gids == {0}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[[profiles]]\nname = "a/b"', "profile name 'a/b'"),
        ('[[profiles]]\nname = "operator"', "reserved"),
        ('[[profiles]]\nname = "x"\n[[profiles]]\nname = "x"', "given twice"),
        ('[operators]\ngroups = ["no-such-group-xyz"]', "unknown group"),
        ('[[profiles]]\nname = "x"\nlimits = { max_connections = 0 }', "must be > 0"),
        (
            '[[profiles]]\nname = "x"\nlimits = { max_open_proposals = 0 }',
            "limits.max_open_proposals must be > 0",
        ),
        ('[[profiles]]\nname = "x"\nbogus = 1', "unknown field"),
        ("approval_ttl_s = 0", "approval_ttl_s must be greater than 0"),
    ],
)
def test_bad_profiles_are_config_errors(base_dir: str, text: str, message: str) -> None:
    path = os.path.join(base_dir, "c.toml")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text + "\n")
    with pytest.raises(ConfigError, match=message):
        load(path, socket=os.path.join(base_dir, "s.sock"))


def test_agent_directories_are_reachable_whatever_the_umask(base_dir: str) -> None:
    config = profiles_config(base_dir)
    old = os.umask(0o077)  # systemd's UMask=0077
    try:
        opened = anyio.run(open_all, config, {})
    finally:
        os.umask(old)
    try:
        assert [item.name for item in opened] == [
            "operator",
            "operator-mcp",
            "alpha",
            "alpha-mcp",
            "beta",
            "beta-mcp",
        ]
        for directory in ("agents", "agents/alpha", "agents/beta"):
            mode = os.stat(os.path.join(base_dir, directory)).st_mode
            assert stat.S_IMODE(mode) == 0o755, directory
        assert stat.S_IMODE(os.stat(agent_socket(base_dir, "alpha")).st_mode) == 0o666
        beta = stat.S_IMODE(os.stat(agent_socket(base_dir, "beta")).st_mode)
        assert beta == 0o666
    finally:
        anyio.run(close_all, opened)
    assert not os.path.exists(agent_socket(base_dir, "alpha"))


def test_hello_names_the_servers_this_socket_serves_its_caller(
    profiled: DaemonHarness, shared_base: str
) -> None:
    """How an agent learns what it may call: the hello names its profile's
    servers (``servers/list`` stays the operator's); the operator's, all."""
    with profiled.client() as operator:
        assert operator.hello().servers == ["t", "u"]
    for profile, expected in (("alpha", ["t"]), ("beta", ["u"]), ("tight", ["t"])):
        with Client(agent_socket(shared_base, profile)) as agent:
            assert agent.hello().servers == expected, profile


def test_mcp_list_on_an_agent_socket_prints_its_servers_names(
    profiled: DaemonHarness, shared_base: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``memorizzctl mcp list`` as an agent: the names, not a refusal."""
    path = agent_socket(shared_base, "beta")
    assert ctl_main(["--socket", path, "mcp", "list"]) == 0
    assert capsys.readouterr().out == "u\n"
    assert ctl_main(["--socket", path, "--json", "mcp", "list"]) == 0
    assert msgspec.json.decode(capsys.readouterr().out) == {"servers": ["u"]}
