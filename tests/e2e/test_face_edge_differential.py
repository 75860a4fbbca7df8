"""A differential battery of protocol edge frames: the same unusual but
possible JSON-RPC/MCP lines sent to a reference MCP server directly over
stdio, and to the MCP face scoped to that same server (``memorizzctl mcp
serve --server NAME``, so names match), and what comes back compared.

The reference servers: npm ``@modelcontextprotocol/server-everything``
(``ev``, the TypeScript SDK) and the Python SDK's own ``tests/mcp_server.py``
(``py``). Each case is one session per side: its lines written at once,
then a ``ping`` (``end``) that must be answered (the session survived), the
replies read until it and any slower reply named are in.

What is compared is each id's answers (``result``, or the error's code; a
side that drops a line answers nothing). Any id whose answers differ must be
listed in the case's ``differs``, with what each side says and why: the face
follows the spec where a reference server does not (MCP 2025-11-25, its
basic protocol, lifecycle and utility pages, and JSON-RPC 2.0), or it
deliberately differs, as docs/mcp-clients.md ("Unusual messages") and
docs/protocol.md ("Errors") say. An undocumented difference fails.

What tests/e2e/test_frame_battery_face.py and test_face_probes.py hold of
the face alone (wrong param types, odd stamps, cursors, lone surrogates) is
not repeated; here each frame is set beside the references' answer.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import pytest

from tests.e2e.test_reference_servers import EVERYTHING, _missing, _node_problem
from tests.harness import (
    MCP_SERVER,
    configured_daemon,
    launch_args,
    no_errors_logged,
)
from tests.process import MEMORIZZCTL, DaemonProcess

READ_S = 10.0
NODE = shutil.which("node") or "node"
KINDS = ["ev", "py"]

INIT_PARAMS = {
    "protocolVersion": "2025-11-25",
    "capabilities": {},
    "clientInfo": {"name": "edge", "version": "0"},
}
INITED = b'{"jsonrpc":"2.0","method":"notifications/initialized"}'
END = b'{"jsonrpc":"2.0","id":"end","method":"ping"}'


def request(request_id: object, method: str, params: object = None) -> bytes:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params is not None:
        message["params"] = params
    return msgspec.json.encode(message)


def init(request_id: object = "init", version: str = "2025-11-25") -> bytes:
    return request(
        request_id, "initialize", {**INIT_PARAMS, "protocolVersion": version}
    )


def k(request_id: object) -> str:
    """An id as it is written on the wire (``1`` is not ``1.0`` nor ``"1"``)."""
    return msgspec.json.encode(request_id).decode()


# --- the daemon and the two sides ----------------------------------------------


@dataclass
class World:
    daemon: DaemonProcess
    missing: dict[str, str]


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    """One daemon serving ``ev`` (when node and server-everything are there)
    and ``py``, each over stdio as the direct side runs it."""
    missing: dict[str, str] = {}
    if problem := _node_problem(EVERYTHING):
        missing["ev"] = problem
    ev = f"""
[[servers]]
name = "ev"
transport = "stdio"
command = "{NODE}"
args = ["{EVERYTHING}", "stdio"]
"""

    def config(base: str) -> str:
        return (
            ("" if "ev" in missing else ev)
            + f"""
[[servers]]
name = "py"
transport = "stdio"
command = "{sys.executable}"
args = {launch_args(MCP_SERVER, "stdio")!r}
"""
        )

    ready = tuple(kind for kind in KINDS if kind not in missing)
    with configured_daemon("mz-edge-", config, ready=ready) as daemon:
        yield World(daemon, missing)


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest, world: World) -> str:
    if request.param in world.missing:
        _missing(world.missing[request.param], "server-everything")
    return str(request.param)


@pytest.fixture(autouse=True)
def clean_log(world: World) -> Iterator[None]:
    """No traceback and no error line in the daemon's log from this case."""
    with no_errors_logged(world.daemon):
        yield


def direct_argv(kind: str) -> list[str]:
    if kind == "ev":
        return [NODE, str(EVERYTHING), "stdio"]
    return [sys.executable, *launch_args(MCP_SERVER, "stdio")]


def face_argv(world: World, kind: str) -> list[str]:
    socket = world.daemon.socket
    return [MEMORIZZCTL, "--socket", socket, "mcp", "serve", "--server", kind]


def exchange(
    argv: list[str], lines: Sequence[bytes], wait_for: Sequence[str] = ()
) -> list[dict[str, Any]]:
    """``lines`` then ``END`` on one stdio session of ``argv``; every message
    it wrote until ``end`` and the ids ``wait_for`` (as ``k`` writes them)
    were answered, or ``READ_S`` passed. Then stdin closes."""
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert proc.stdin is not None
    assert proc.stdout is not None
    messages: list[dict[str, Any]] = []
    pending = {k("end"), *wait_for}
    done = threading.Event()

    def read(stdout: Any) -> None:
        for line in stdout:
            message = msgspec.json.decode(line)
            messages.append(message)
            if "method" not in message:
                pending.discard(k(message.get("id")))
            if not pending:
                done.set()
        done.set()

    reader = threading.Thread(target=read, args=(proc.stdout,), daemon=True)
    reader.start()
    try:
        proc.stdin.write(b"".join(line + b"\n" for line in [*lines, END]))
        proc.stdin.flush()
        done.wait(READ_S)
    finally:
        proc.stdin.close()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        reader.join(5)
        proc.stdout.close()
    assert not pending, f"{argv[-1]}: no answer for {sorted(pending)}: {messages}"
    return messages


Shape = list[object]
"""An id's answers, sorted: ``"result"`` or the error's code, one per answer."""


def shapes(messages: list[dict[str, Any]]) -> dict[str, Shape]:
    found: dict[str, Shape] = {}
    for message in messages:
        if "method" in message:  # a notification of the server's own
            continue
        said = "result" if "result" in message else message["error"]["code"]
        found.setdefault(k(message.get("id")), []).append(said)
    return {key: sorted(said, key=str) for key, said in found.items()}


@dataclass(frozen=True)
class Differs:
    """An id the sides answer differently, and why that is right."""

    direct: Shape | Mapping[str, Shape]
    """The reference's answers (by kind, when ``ev`` and ``py`` differ)."""
    face: Shape
    why: str

    def of(self, kind: str) -> Shape:
        return self.direct[kind] if isinstance(self.direct, Mapping) else self.direct


R: Shape = ["result"]
NONE: Shape = []


@dataclass
class Sides:
    direct: list[dict[str, Any]]
    face: list[dict[str, Any]]

    def face_reply(self, key: str) -> dict[str, Any]:
        (found,) = [m for m in self.face if "method" not in m and k(m.get("id")) == key]
        return found

    def direct_reply(self, key: str) -> dict[str, Any]:
        (found,) = [
            m for m in self.direct if "method" not in m and k(m.get("id")) == key
        ]
        return found


def differential(
    world: World,
    kind: str,
    lines: Sequence[bytes],
    differs: Mapping[str, Differs] | None = None,
    *,
    wait_for: Sequence[object] = (),
) -> Sides:
    """Both sides' answers to ``lines``; every id answered alike but those
    in ``differs``, answered as it says."""
    waited = [k(i) for i in wait_for]
    direct = exchange(direct_argv(kind), lines, waited)
    face = exchange(face_argv(world, kind), lines, waited)
    d, f = shapes(direct), shapes(face)
    differs = differs or {}
    for key in sorted(d.keys() | f.keys() | differs.keys()):
        if key in differs:
            expected = differs[key]
            assert d.get(key, NONE) == expected.of(kind), (key, expected.why, direct)
            assert f.get(key, NONE) == expected.face, (key, expected.why, face)
        else:
            said = f"direct {d.get(key, NONE)}, face {f.get(key, NONE)}"
            assert d.get(key, NONE) == f.get(key, NONE), (
                f"undocumented difference at id {key}: {said}",
                direct,
                face,
            )
    return Sides(direct, face)


# --- the lifecycle --------------------------------------------------------------


def test_every_stage_of_the_lifecycle(world: World, kind: str) -> None:
    """``ping`` before ``initialize``, between it and ``initialized``, after;
    a request before ``initialize`` and one before ``initialized``; a second
    ``initialize`` (at another version). Pings are answered in order."""
    sides = differential(
        world,
        kind,
        [
            request("p0", "ping"),
            request(1, "tools/list", {}),
            init(),
            request("p1", "ping"),
            request(2, "tools/list", {}),
            INITED,
            request("p2", "ping"),
            init("init2", "2025-06-18"),
            request("p3", "ping"),
        ],
        {
            # docs/mcp-clients.md, "Unusual messages": a request before
            # initialize is served. MCP's lifecycle only says the client
            # SHOULD NOT send one; the Python SDK's servers refuse it.
            k(1): Differs({"ev": R, "py": [-32602]}, R, "served before initialize"),
        },
    )
    for side in (sides.direct, sides.face):
        pings = [m["id"] for m in side if str(m.get("id")).startswith("p")]
        assert pings == ["p0", "p1", "p2", "p3"], side
    assert sides.face_reply(k("init2"))["result"]["protocolVersion"] == "2025-06-18"
    assert sides.direct_reply(k("init2"))["result"]["protocolVersion"] == "2025-06-18"


ASKED = ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25", "2026-07-28", "2099-01-01", "x"]  # fmt: skip
FACE_SPEAKS = {"2025-06-18", "2025-11-25"}
REFERENCES_SPEAK = {"2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"}


def test_version_negotiation_answers_a_version_the_server_supports(
    world: World, kind: str
) -> None:
    """MCP lifecycle, "Version Negotiation": a version the server supports is
    answered as asked, any other with another it supports (SHOULD: its
    latest). The face supports fewer (docs/mcp-clients.md, "Protocol
    versions": an older one is answered 2025-11-25); each initialize on one
    session (a second one is answered on every side)."""
    lines = [init(f"v{n}", version) for n, version in enumerate(ASKED)]
    sides = differential(world, kind, lines)
    for n, version in enumerate(ASKED):
        face = sides.face_reply(k(f"v{n}"))["result"]["protocolVersion"]
        direct = sides.direct_reply(k(f"v{n}"))["result"]["protocolVersion"]
        assert face == (version if version in FACE_SPEAKS else "2025-11-25")
        assert direct == (version if version in REFERENCES_SPEAK else "2025-11-25")


def test_initialize_with_members_missing(world: World, kind: str) -> None:
    """The face takes an ``initialize`` without params, capabilities or
    version (docs/mcp-clients.md, "Unusual messages"); the references refuse
    it (server-everything with ``-32603``, an internal error, for what is
    the client's)."""
    taken = "docs/mcp-clients.md: initialize is taken with members missing"
    refused = Differs({"ev": [-32603], "py": [-32602]}, R, taken)
    sides = differential(
        world,
        kind,
        [
            request("i1", "initialize"),
            request("i2", "initialize", {"protocolVersion": "2025-11-25"}),
            request(
                "i3",
                "initialize",
                {"capabilities": {}, "clientInfo": INIT_PARAMS["clientInfo"]},
            ),
        ],
        {k("i1"): refused, k("i2"): refused, k("i3"): refused},
    )
    assert sides.face_reply(k("i1"))["result"]["protocolVersion"] == "2025-11-25"


def test_a_cancelled_initialize_is_still_answered(world: World, kind: str) -> None:
    """MCP cancellation: "The initialize request MUST NOT be cancelled by
    clients", and a receiver MAY ignore a cancellation of a request that
    cannot be cancelled. The face dropped its answer (the client waited for
    it forever); now it ignores the cancellation, as the Python SDK's
    server does. server-everything drops the answer."""
    cancel = b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"init"}}'
    differential(
        world,
        kind,
        [init(), cancel, INITED, request(1, "tools/list", {})],
        {k("init"): Differs({"ev": NONE, "py": R}, R, "initialize is not cancelled")},
    )


# --- ids --------------------------------------------------------------------------

HUGE = [2**63 - 1, 2**63, 2**64, 10**30]


def test_ids_of_every_json_type(world: World, kind: str) -> None:
    """MCP: a request id is a string or an integer, never null. Every
    integer is echoed as written, however large (server-everything drops
    those past 2**53: its client waits forever); a number with no fractional
    part is an integer (JSON Schema's ``integer``, MCP's schema's type):
    answered as one (the face refused ``1.0``, under id null; fixed). What is
    no id at all is ``invalid_request`` under id null (JSON-RPC 2.0: a
    request that is invalid is answered; the references drop it)."""
    ids = [b'"s"', b'""', b"7", b"-5", b"0", *(str(n).encode() for n in HUGE)]
    odd = [b"1.0", b"1e2", b"1.5", b"null", b"true", b'{"a":1}', b"[1]"]
    lines = [b'{"jsonrpc":"2.0","id":%s,"method":"ping"}' % i for i in ids + odd]
    invalid = "docs/mcp-clients.md, docs/protocol.md: -32600 with id null"
    sides = differential(
        world,
        kind,
        [init(), INITED, *lines],
        {
            **{
                k(n): Differs({"ev": NONE, "py": R}, R, "past 2**53: ev drops it")
                for n in HUGE
            },
            k(1): Differs({"ev": R, "py": NONE}, R, "1.0 is the integer 1"),
            k(100): Differs({"ev": R, "py": NONE}, R, "1e2 is the integer 100"),
            k(None): Differs(NONE, [-32600] * 5, invalid),
        },
    )
    for n in HUGE:  # exactly as written, not rounded
        assert str(n).encode() in msgspec.json.encode(sides.face_reply(k(n)))


def test_a_duplicate_id_in_flight(world: World, kind: str) -> None:
    """MCP: a request id MUST NOT have been used before in the session. The
    references run both requests; the face refuses the second at once
    (docs/mcp-clients.md, "Unusual messages"), and answers the first, also a
    ``ping`` sent under the id of the ``initialize`` it has not answered."""
    refused = "docs/mcp-clients.md: an id still in flight is refused"
    differential(
        world,
        kind,
        [
            init(),
            request("init", "ping"),
            INITED,
            request(5, "ping"),
            request(5, "ping"),
        ],
        {
            k(5): Differs([*R, *R], sorted([-32600, "result"], key=str), refused),
            k("init"): Differs([*R, *R], sorted([-32600, "result"], key=str), refused),
        },
    )


# --- envelopes --------------------------------------------------------------------

NOT_A_REQUEST = "JSON-RPC 2.0 -32600; docs/mcp-clients.md: answered, not dropped"


def test_lines_that_are_no_request(world: World, kind: str) -> None:
    """A batch (MCP 2025-06-18 dropped them), an empty one, scalars, a
    ``jsonrpc`` other than ``"2.0"`` or none, no ``method`` or one that is
    not a string: JSON-RPC 2.0's Invalid Request, under the id when it can
    be read. Both references drop them without a word. An unknown member
    beside the envelope's is no error (server-everything drops it), nor is
    a ``result`` beside a ``method`` (a request: server-everything drops it
    too)."""
    sides = differential(
        world,
        kind,
        [
            init(),
            INITED,
            b'[{"jsonrpc":"2.0","id":"b1","method":"ping"},{"jsonrpc":"2.0","id":"b2","method":"ping"}]',
            b"[]",
            b'"hello"',
            b"5",
            b'{"jsonrpc":"1.0","id":"v1","method":"ping"}',
            b'{"id":"v2","method":"ping"}',
            b'{"jsonrpc":2.0,"id":"v3","method":"ping"}',
            b'{"jsonrpc":"2.0","id":"m1"}',
            b'{"jsonrpc":"2.0","id":"m2","method":5}',
            b'{"jsonrpc":"2.0","id":"x1","method":"ping","extra":{"x":1}}',
            b'{"jsonrpc":"2.0","id":"x2","method":"ping","result":{}}',
        ],
        {
            k(None): Differs(NONE, [-32600] * 4, NOT_A_REQUEST),
            **{
                k(i): Differs(NONE, [-32600], NOT_A_REQUEST)
                for i in ("v1", "v2", "v3", "m1", "m2")
            },
            k("x1"): Differs({"ev": NONE, "py": R}, R, "JSON-RPC: members beside"),
            k("x2"): Differs({"ev": NONE, "py": R}, R, "a method: a request"),
        },
    )
    assert "b1" not in str(sides.face)
    assert "b2" not in str(sides.face)


def test_params_that_are_no_object(world: World, kind: str) -> None:
    """MCP's params are an object. A listing's that are not are ``-32602``;
    ``ping``'s are not read (docs/mcp-clients.md: what it does not read is
    not checked). The references drop them (the Python SDK's server takes a
    null as none)."""
    unread = "docs/mcp-clients.md: ping's params are not looked at"
    invalid = "JSON-RPC 2.0 -32602 invalid params: MCP's params are an object"
    differential(
        world,
        kind,
        [
            init(),
            INITED,
            request(1, "ping", []),
            request(2, "ping", "x"),
            request(3, "ping", None)[:-1] + b',"params":null}',
            request(4, "tools/list", [1]),
            request(5, "tools/list", "x"),
            request(6, "tools/list")[:-1] + b',"params":null}',
        ],
        {
            k(1): Differs(NONE, R, unread),
            k(2): Differs(NONE, R, unread),
            k(3): Differs({"ev": NONE, "py": R}, R, unread),
            k(4): Differs(NONE, [-32602], invalid),
            k(5): Differs(NONE, [-32602], invalid),
            k(6): Differs({"ev": NONE, "py": R}, [-32602], invalid),
        },
    )


def test_unknown_methods_and_notifications(world: World, kind: str) -> None:
    """Alike everywhere: an unknown method with an id is ``-32601``, without
    one nothing; a notification's method sent as a request is unknown; a
    request sent as a notification is not answered; a cancellation of an id
    never used, or malformed, is ignored (MCP cancellation: SHOULD be)."""
    differential(
        world,
        kind,
        [
            init(),
            INITED,
            request(1, "nope/nope"),
            b'{"jsonrpc":"2.0","method":"nope/nope"}',
            b'{"jsonrpc":"2.0","method":"notifications/nope","params":{}}',
            request(2, ""),
            request(3, "rpc.discover"),
            request(4, "notifications/initialized"),
            request(5, "notifications/cancelled", {"requestId": 1}),
            b'{"jsonrpc":"2.0","method":"ping"}',
            b'{"jsonrpc":"2.0","method":"tools/list"}',
            b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":999}}',
            b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"zz"}}',
            b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":{}}',
            b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":"x"}',
            request(6, "ping"),
        ],
    )


def test_responses_to_requests_never_made(world: World, kind: str) -> None:
    """A response is never answered, whatever its id: the face answered one
    whose id is no integer nor string with ``-32600`` (fixed); JSON-RPC 2.0
    answers requests only, and the references say nothing."""
    differential(
        world,
        kind,
        [
            init(),
            INITED,
            b'{"jsonrpc":"2.0","id":424242,"result":{}}',
            b'{"jsonrpc":"2.0","id":"zz","error":{"code":1,"message":"m"}}',
            b'{"jsonrpc":"2.0","id":2.5,"result":{}}',
            b'{"jsonrpc":"2.0","id":true,"result":{}}',
            b'{"jsonrpc":"2.0","id":[1],"error":{"code":1,"message":"m"}}',
            b'{"jsonrpc":"2.0","id":null,"result":{}}',
            request(1, "ping"),
        ],
    )


# --- methods' params --------------------------------------------------------------


def test_logging_set_level(world: World, kind: str) -> None:
    """MCP logging: an invalid level is ``-32602`` (server-everything says
    ``-32603``, an internal error). A valid one is taken by a server that
    declares ``logging``: the face always does (docs/mcp-clients.md), the
    Python SDK's test server does not (``-32601``)."""
    spec = "MCP logging, Error Handling: invalid log level -32602"
    sides = differential(
        world,
        kind,
        [
            init(),
            INITED,
            request(1, "logging/setLevel", {"level": "loud"}),
            request(2, "logging/setLevel", {}),
            request(3, "logging/setLevel", {"level": "debug"}),
        ],
        {
            k(1): Differs({"ev": [-32603], "py": [-32602]}, [-32602], spec),
            k(2): Differs({"ev": [-32603], "py": [-32602]}, [-32602], spec),
            k(3): Differs({"ev": R, "py": [-32601]}, R, "the face declares logging"),
        },
    )
    direct_declares = (
        "logging" in sides.direct_reply(k("init"))["result"]["capabilities"]
    )
    assert direct_declares == (kind == "ev")
    assert "logging" in sides.face_reply(k("init"))["result"]["capabilities"]


def test_tool_call_arguments(world: World, kind: str) -> None:
    """``arguments`` missing: the tool's own input error, an ``isError``
    result, passed through. ``arguments`` null or an array, no ``name``:
    not a ``CallToolRequest`` (MCP tools, "Protocol Errors": malformed
    requests), ``-32602``. An unknown tool: a protocol error too (ibid.;
    docs/mcp-clients.md, "The policy": ``-32602``), where both references
    answer an ``isError`` result."""
    malformed = "MCP tools: a malformed request is a protocol error, -32602"
    unknown = "docs/mcp-clients.md: an unknown tool is -32602"
    sides = differential(
        world,
        kind,
        [
            init(),
            INITED,
            request(1, "tools/call", {"name": "echo"}),
            request(2, "tools/call", {"name": "echo"})[:-2] + b',"arguments":null}}',
            request(3, "tools/call", {"name": "echo", "arguments": [1]}),
            request(4, "tools/call", {"name": "nosuchtool", "arguments": {}}),
            request(5, "tools/call", {}),
        ],
        {
            k(2): Differs({"ev": [-32603], "py": R}, [-32602], malformed),
            k(3): Differs({"ev": [-32603], "py": [-32602]}, [-32602], malformed),
            k(4): Differs(R, [-32602], unknown),
            k(5): Differs({"ev": [-32603], "py": [-32602]}, [-32602], malformed),
        },
        wait_for=[1, 4],
    )
    assert sides.face_reply(k(1))["result"]["isError"] is True
    assert sides.direct_reply(k(1))["result"]["isError"] is True


def test_resource_uris_that_name_nothing(world: World, kind: str) -> None:
    """An empty, a relative and an unknown URI: MCP resources, "Error
    Handling": resource not found is ``-32002`` (docs/mcp-clients.md: a URI
    no server lists is ``not_found``). The references say ``-32602`` or
    ``-32603``. No ``uri`` at all is ``-32602`` (server-everything:
    ``-32603``)."""
    spec = "MCP resources: resource not found -32002"
    sides = differential(
        world,
        kind,
        [
            init(),
            INITED,
            request(1, "resources/read", {"uri": ""}),
            request(2, "resources/read", {"uri": "relative/path"}),
            request(3, "resources/read", {"uri": "demo://nope/nowhere"}),
            request(4, "resources/read", {}),
        ],
        {
            k(1): Differs({"ev": [-32603], "py": [-32602]}, [-32002], spec),
            k(2): Differs({"ev": [-32603], "py": [-32602]}, [-32002], spec),
            k(3): Differs([-32602], [-32002], spec),
            k(4): Differs({"ev": [-32603], "py": [-32602]}, [-32602], "invalid params"),
        },
    )
    assert sides.face_reply(k(1))["error"]["data"]["reason"] == "not_found"


def test_progress_tokens_of_odd_types_where_no_progress_is_sent(
    world: World, kind: str
) -> None:
    """A listing's or a ping's ``_meta`` is not read by the face
    (docs/mcp-clients.md: what it does not read is not checked; a
    ``tools/call``'s token is, test_frame_battery_face.py). The Python SDK's
    server refuses a token that is no string nor integer; server-everything
    drops the whole request."""
    unread = "docs/mcp-clients.md: a listing's _meta is not looked at"
    differential(
        world,
        kind,
        [
            init(),
            INITED,
            request(1, "tools/list", {"_meta": {"progressToken": 1.5}}),
            request(2, "tools/list", {"_meta": {"progressToken": None}}),
            request(3, "tools/list", {"_meta": {"progressToken": {"a": 1}}}),
            request(4, "ping", {"_meta": {"progressToken": True}}),
            request(5, "ping", {"_meta": "x"}),
        ],
        {
            **{
                k(i): Differs({"ev": NONE, "py": [-32602]}, R, unread)
                for i in (1, 2, 3, 5)
            },
            k(4): Differs({"ev": NONE, "py": R}, R, unread),
        },
    )


# --- framing ----------------------------------------------------------------------


def test_framing_edges(world: World, kind: str) -> None:
    """Lines as MCP's stdio transport frames them, and lines it does not:
    a trailing ``\\r`` and empty lines change nothing anywhere; invalid
    UTF-8 in a string the server does not read is served everywhere. A line
    that is not UTF-8 JSON (garbage, a byte order mark: RFC 8259 says none
    is sent, and a parser MAY ignore one; two messages on one line; a NUL
    after a message) is JSON-RPC 2.0's Parse error (-32700), under the id
    when a whole request's can be read (docs/protocol.md, "Errors"); the
    references drop them, their client waiting. Nested too deeply (5000
    levels) is ``-32600`` under its id (docs/protocol.md: about 1000);
    server-everything serves it, the Python SDK's server drops it."""
    parse = "JSON-RPC 2.0 -32700; docs/protocol.md, Errors"
    deep = b"[" * 5000 + b"]" * 5000
    shallow = b"[" * 100 + b"]" * 100
    differential(
        world,
        kind,
        [
            init(),
            INITED,
            request(1, "ping") + b"\r",
            b"",
            b"   ",
            b'{"jsonrpc":"2.0","id":2,"method":"ping","params":{"x":"\xff\xfe"}}',
            b"\xff\xfe garbage",
            b'\xef\xbb\xbf{"jsonrpc":"2.0","id":3,"method":"ping"}',
            request(4, "ping") + request(5, "ping"),
            request(6, "ping") + b"\x00",
            b'{"jsonrpc":"2.0","id":7,"method":"ping","params":{"x":' + deep + b"}}",
            b'{"jsonrpc":"2.0","id":8,"method":"ping","params":{"x":' + shallow + b"}}",
        ],
        {
            k(None): Differs(NONE, [-32700] * 2, parse),  # the garbage, the BOM
            k(4): Differs(NONE, [-32700], parse),  # and nothing for 5
            k(6): Differs(NONE, [-32700], parse),
            k(7): Differs(
                {"ev": R, "py": NONE}, [-32600], "docs/protocol.md: too deep"
            ),
        },
    )
