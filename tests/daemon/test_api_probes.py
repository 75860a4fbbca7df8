"""The socket API probed from the outside: an agent socket asked for what only
operators may do (under every spelling and with params of every shape), odd
request ids on the relayed and the tasked paths, and ``memorizzctl --socket``
pointed at what is not a listening daemon.

Found by outside testing: ``memorizzctl --socket`` at a regular file, a
directory or a FIFO said "Connection refused; is memorizzd running?" (the
kernel's word for a file that is not a socket), and ``mcp serve`` said the
daemon "may predate the MCP face" whenever something existed at the API
socket's path; a ``servers/add`` spec with a NUL in its command or a malformed
URL in ``roots`` is an internal error (not fixed here: ``memorizz.api.spec``).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest

from memorizz import cli
from memorizz.api.errors import RemoteError
from memorizz.api.methods import ServerSpec
from memorizzd.config import Profile
from tests.harness import DaemonHarness, light_daemon, rmtree, short_tempdir


@pytest.fixture(scope="module")
def harness() -> Iterator[DaemonHarness]:
    """One daemon for the module: server ``one``, profile ``bot`` reaching it."""
    with light_daemon("one", profiles=[Profile(name="bot", servers=["one"])]) as h:
        yield h


def _agent(h: DaemonHarness) -> str:
    with h.client() as c:
        return c.daemon_status().agent_sockets["bot"]


def _exchange(
    path: str, requests: list[dict[str, Any]], replies: int | None = None
) -> list[dict[str, Any]]:
    """Pipeline ``requests`` on one connection; the replies (one each, unless
    told how many), in any order."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(path)
        s.sendall(b"".join(msgspec.json.encode(r) + b"\n" for r in requests))
        buffer = b""
        while buffer.count(b"\n") < (len(requests) if replies is None else replies):
            chunk = s.recv(65536)
            assert chunk, f"closed after {buffer!r}"
            buffer += chunk
    return [msgspec.json.decode(line) for line in buffer.splitlines()]


def _reason(reply: dict[str, Any]) -> str:
    return str(reply["error"]["data"]["reason"])


_SPEC = {"name": "sneaky", "transport": "stdio", "command": "/bin/true"}


def test_an_agent_gets_no_operator_method_by_any_spelling_or_params(
    harness: DaemonHarness,
) -> None:
    """Refused before its params are read (an array or a string is not a
    hint that the method exists), and no lookalike of a name is that name."""
    cases: list[tuple[str, object, str]] = []
    for method, params in (
        ("servers/add", {"server": _SPEC}),
        ("servers/remove", {"name": "one"}),
        ("daemon/reload", {}),
        ("daemon/status", {"extra": [1, 2]}),
        ("audit/list", {"limit": 1}),
        ("vault/rotate", {}),
        ("approvals/approve", {"id": "p_x"}),
    ):
        cases += [
            (method, params, "permission_denied"),
            (method, [params], "permission_denied"),
            (method, "x", "permission_denied"),
        ]
    for lookalike in (
        "Servers/Add",
        " servers/add",
        "servers/add ",
        "servers/add\u0000",
        "servers\u2215add",  # DIVISION SLASH
        "servers/add/",
        "servers//add",
        "ＳＥＲＶＥＲＳ/add",  # fullwidth  # noqa: RUF001
    ):
        cases.append((lookalike, {"server": _SPEC}, "method_not_found"))
    cases += [
        ("ping", [], "invalid_params"),
        ("tools/call", ["one", "hello"], "invalid_params"),
    ]
    requests = [
        {"jsonrpc": "2.0", "id": i, "method": method, "params": params}
        for i, (method, params, _) in enumerate(cases)
    ]
    replies = {r["id"]: r for r in _exchange(_agent(harness), requests)}
    assert {i: _reason(replies[i]) for i in range(len(cases))} == {
        i: want for i, (_, _, want) in enumerate(cases)
    }
    with harness.client() as c:
        assert [s.name for s in c.list_servers()] == ["one"]  # nothing ran


@pytest.mark.parametrize(
    "request_id",
    [10**30, -(10**30), 2**63, -(2**63) - 1, 0, "", "é\u0000\u2028x", "i" * 4096],
)
def test_an_odd_id_comes_back_exactly_on_every_path(
    harness: DaemonHarness, request_id: int | str
) -> None:
    """The relayed ``tools/call``, a tasked method and a refusal, on the agent
    socket, each answered under the id it was asked with."""
    requests = [
        {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
        for method, params in (
            ("tools/call", {"server": "one", "name": "hello"}),
            ("ping", {"server": "one"}),
            ("servers/list", {}),
        )
    ]
    for request in requests:
        (reply,) = _exchange(_agent(harness), [request])
        assert reply["id"] == request_id
        assert type(reply["id"]) is type(request_id)
        assert ("error" in reply) == (request["method"] == "servers/list")


@pytest.mark.parametrize("request_id", [1.5, True, [1], {"id": 1}], ids=repr)
def test_an_id_of_another_type_is_refused_under_a_null_id(
    harness: DaemonHarness, request_id: object
) -> None:
    request = {"jsonrpc": "2.0", "id": request_id, "method": "servers/add"}
    (reply,) = _exchange(_agent(harness), [{**request, "params": {"server": _SPEC}}])
    assert (reply["id"], _reason(reply)) == (None, "invalid_request")


@pytest.mark.parametrize("on", ["operator", "agent"])
def test_a_null_id_is_an_invalid_request_and_a_missing_one_a_notification(
    harness: DaemonHarness, on: str
) -> None:
    """``"id": null`` was a notification here as on the MCP face: not run and
    never answered. JSON-RPC 2.0's notification has no ``id`` member, so it
    is now ``invalid_request`` under a null id (not run either), as the face
    answers it; a request with no ``id`` is still dropped unanswered."""
    path = harness.socket if on == "operator" else _agent(harness)
    spec = {**_SPEC, "name": "nullid"}
    requests: list[dict[str, Any]] = [
        {
            "jsonrpc": "2.0",
            "id": None,
            "method": "servers/add",
            "params": {"server": spec},
        },
        {"jsonrpc": "2.0", "method": "servers/add", "params": {"server": spec}},
        {"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {}},
    ]
    replies = {r["id"]: r for r in _exchange(path, requests, replies=2)}
    refused, pong = replies[None], replies[1]
    assert (refused["id"], refused["error"]["code"]) == (None, -32600), refused
    assert _reason(refused) == "invalid_request"
    assert "null" in refused["error"]["message"]
    assert (pong["id"], "result" in pong) == (1, True)
    with harness.client() as c:
        assert [s.name for s in c.list_servers()] == ["one"]  # neither ran


@pytest.fixture
def paths() -> Iterator[dict[str, str]]:
    """A regular file, a directory, a FIFO, a dangling link and a socket
    nobody listens on."""
    base = short_tempdir()
    found = {
        "file": os.path.join(base, "file"),
        "directory": os.path.join(base, "dir"),
        "fifo": os.path.join(base, "fifo"),
        "dangling": os.path.join(base, "dangling"),
        "dead": os.path.join(base, "dead.sock"),
    }
    with open(found["file"], "w", encoding="utf-8"):
        pass
    os.mkdir(found["directory"])
    os.mkfifo(found["fifo"])
    os.symlink(os.path.join(base, "nothing"), found["dangling"])
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as dead:
        dead.bind(found["dead"])  # bound, never listening, then closed
    try:
        yield found
    finally:
        rmtree(base)


@pytest.mark.parametrize(
    ("kind", "said"),
    [
        ("file", "is a regular file, not a socket"),
        ("directory", "is a directory, not a socket"),
        ("fifo", "is a FIFO, not a socket"),
        ("dangling", "No such file or directory; is memorizzd running?"),
        ("dead", "Connection refused; is memorizzd running?"),
    ],
)
def test_memorizzctl_at_what_is_not_a_daemon_says_which_in_one_line(
    paths: dict[str, str],
    kind: str,
    said: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = paths[kind]
    for argv in (["daemon", "status"], ["mcp", "call", "one", "hello"]):
        assert cli.main(["--socket", path, *argv]) == 69
        out, err = capsys.readouterr()
        assert out == ""
        assert err.startswith("memorizzctl: error: cannot reach memorizzd"), err
        assert f"{path}{' ' if 'not a socket' in said else ': '}{said}" in err, err
        assert err.count("\n") == 1, err
        assert cli.main(["--json", "--socket", path, *argv]) == 69
        out, err = capsys.readouterr()
        assert err == ""
        error = msgspec.json.decode(out)["error"]
        assert (error["reason"], error["data"]) == (
            "daemon_unreachable",
            {"socket": path},
        )
        assert said in error["message"]
    # the MCP bridge says the same, and no guess about the daemon's age
    assert cli.main(["--socket", path, "mcp", "serve"]) == 69
    _, err = capsys.readouterr()
    assert err.count("\n") == 1, err
    assert "predate" not in err
    assert ("not a socket" in err) == ("not a socket" in said), err


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        ({"command": "/bin/\u0000true"}, "command: a NUL character"),
        ({"command": "/bin/true", "env": {"K": "v\u0000secret"}}, "env.K: a NUL"),
        ({"command": "/bin/true", "roots": ["file://[::1/x"]}, "a root must be"),
        (
            {"transport": "streamable_http", "url": "https://[x/mcp", "auth": "oauth"},
            "url",
        ),
        (
            {
                "transport": "streamable_http",
                "url": "https://example.invalid/mcp",
                "auth": "oauth",
                "oauth_redirect_uri": "http://[::1/callback",
            },
            "oauth_redirect_uri must be",
        ),
    ],
    ids=[
        "nul-command",
        "nul-env",
        "malformed-root",
        "malformed-url",
        "malformed-redirect",
    ],
)
def test_servers_add_refuses_a_hostile_spec_as_invalid_params(
    harness: DaemonHarness, fields: dict[str, Any], said: str
) -> None:
    """A spec urllib or the OS would choke on is the caller's error, said
    precisely (never ``internal``), and the daemon serves on."""
    spec = ServerSpec(**{"name": "hostile", "transport": "stdio", **fields})
    with harness.client() as c:
        with pytest.raises(RemoteError) as refused:
            c.add_server(spec)
        assert refused.value.reason in ("invalid_params", "scheme_not_allowed")
        assert said in refused.value.message
        assert "secret" not in refused.value.message
        assert "hostile" not in [s.name for s in c.list_servers()]


@pytest.mark.parametrize(
    ("arguments", "said"),
    [
        (b"[1]", "arguments must be an object"),
        (b'{"n":1e400}', "arguments: Number out of range - at `$.arguments"),
        (b'{"s":"\xff"}', "arguments are not valid JSON (Invalid UTF-8"),
    ],
    ids=["not-an-object", "number-out-of-range", "invalid-utf8"],
)
def test_arguments_that_cannot_be_read_are_said_as_they_are(
    harness: DaemonHarness, arguments: bytes, said: str
) -> None:
    """Each way arguments can be unreadable gets its own message (invalid
    UTF-8 was "nested deeper than 64 levels", a number out of range "must
    be an object"), and the connection serves on."""
    line = (
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":'
        b'{"server":"one","name":"echo","arguments":' + arguments + b"}}\n"
    )
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(harness.socket)
        s.sendall(line + b'{"jsonrpc":"2.0","id":2,"method":"ping"}\n')
        buffer = b""
        while buffer.count(b"\n") < 2:
            chunk = s.recv(65536)
            assert chunk, f"closed after {buffer!r}"
            buffer += chunk
    first, second = (msgspec.json.decode(x) for x in buffer.splitlines())
    assert (first["id"], _reason(first)) == (1, "invalid_params")
    assert said in first["error"]["message"], first
    assert (second["id"], "result" in second) == (2, True)
