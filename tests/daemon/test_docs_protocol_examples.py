"""The JSON-RPC examples of docs/protocol.md are what a real daemon does.

Every request line the page shows (a fenced block's line with a
``"method"``: the handshake, the example session, the pipelined one) is
sent to a daemon started here, serving the page's servers (``demo``,
tests/mcp_server.py, added with ``servers/add`` as the README's tour does;
``feat`` and ``ask``), and the reply the page shows next to it must have the
same shape as the real one: the same keys in every object, the same kind of
value (object, list, string, number, boolean, null) under each, lists
compared by their first items. A documented reply cut short (``...``) has
its keys among the real ones. The lines the daemon sends unasked
(progress, log messages, an elicitation request, a resource update) are
made to happen and compared the same way; a member their table says comes
"when" the server gave one may be missing. The error replies of "Errors"
are provoked one by one and compared likewise (all but ``shutting_down``,
which needs a daemon stopping; tests/e2e/test_drain.py has it).
"""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest

from memorizz.api.methods import ServerSpec
from tests.doc_blocks import ROOT, Block, blocks
from tests.harness import (
    DaemonHarness,
    asking_spec,
    daemon_config,
    features_spec,
    rmtree,
    short_tempdir,
    stdio_spec,
)

PROTOCOL = ROOT / "docs" / "protocol.md"
TEXT = PROTOCOL.read_text(encoding="utf-8")
BLOCKS = blocks(PROTOCOL)
CUT = "..."
"""Where the page cut a reply short."""


@pytest.fixture(scope="module")
def harness() -> Iterator[DaemonHarness]:
    base = short_tempdir()
    try:
        # the page's "broken" is a config file's (servers/add refuses a
        # command it cannot find); "demo" is added as the tour adds it
        broken = ServerSpec(
            name="broken", transport="stdio", command="no-such-prog-xyz"
        )
        with DaemonHarness.running(daemon_config(base, servers=[broken])) as running:
            for spec in (stdio_spec("demo"), features_spec("feat"), asking_spec("ask")):
                with running.client() as c:
                    c.add_server(spec)
            for name in ("demo", "feat", "ask"):
                running.wait_ready(name)
            yield running
    finally:
        rmtree(base)


# --- reading the page -----------------------------------------------------------


def _decode(line: str) -> tuple[dict[str, Any], bool]:
    """A documented line as JSON, and whether it was cut short (``...``,
    ``{...}``): the cut is taken out."""
    cut = CUT in line
    text = line.replace("{...}", "{}").replace(f",{CUT}", "")
    value = msgspec.json.decode(text)
    assert isinstance(value, dict), line
    return value, cut


def _section(heading: str) -> list[Block]:
    start = TEXT.index(f"\n{heading}\n")
    end = TEXT.find("\n## ", start + len(heading) + 2)  # the next section
    first = TEXT.count("\n", 0, start) + 1
    last = TEXT.count("\n", 0, end if end != -1 else len(TEXT)) + 1
    found = [b for b in BLOCKS if first < b.line < last]
    assert found, heading
    return found


def _json_lines(block: Block) -> list[str]:
    return [
        line.strip() for line in block.text.splitlines() if line.strip().startswith("{")
    ]


def _optional(block: Block) -> set[str]:
    """The params a block's table says are there only "when" something is."""
    start = TEXT.index(block.text.strip())
    table = TEXT[start:].split("\n\n", 2)[1]
    return set(re.findall(r"^\| `([a-z_]+)` \|[^|]*\| when ", table, re.MULTILINE))


# --- the shape of a reply -------------------------------------------------------


def _kind(value: object) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    return {dict: "object", list: "list", str: "string", type(None): "null"}[
        type(value)
    ]


def same_shape(
    shown: object,
    real: object,
    *,
    at: str = "$",
    cut: bool = False,
    optional: frozenset[str] = frozenset(),
) -> list[str]:
    """Where ``shown`` and ``real`` differ in shape (empty: the same)."""
    if _kind(shown) != _kind(real):
        return [f"{at}: the page shows {_kind(shown)}, the daemon sends {_kind(real)}"]
    if isinstance(shown, dict) and isinstance(real, dict):
        missing = set(shown) - set(real) - optional
        extra = set() if cut else set(real) - set(shown) - optional
        found = [f"{at}: the daemon does not send {k!r}" for k in sorted(missing)]
        found += [f"{at}: the page does not show {k!r}" for k in sorted(extra)]
        for key in set(shown) & set(real):
            found += same_shape(shown[key], real[key], at=f"{at}.{key}", cut=cut)
        return found
    if isinstance(shown, list) and isinstance(real, list) and shown and real:
        return same_shape(shown[0], real[0], at=f"{at}[0]", cut=cut)
    return []


def test_the_shape_check_sees_a_difference() -> None:
    """A key missing or added, at any depth, or a value of another kind."""
    real = {"result": {"servers": [{"name": "demo", "cwd": None, "replicas": 1}]}}
    assert same_shape(real, real) == []
    assert same_shape({"result": {"servers": [{"name": "d", "cwd": None}]}}, real)
    assert same_shape(
        {"result": {"servers": [{"name": "d", "cwd": None, "replicas": 1, "x": 2}]}},
        real,
    )
    assert same_shape(
        {"result": {"servers": [{"name": "d", "cwd": "/", "replicas": 1}]}}, real
    )
    assert (
        same_shape(
            {"result": {"servers": [{"name": "d", "cwd": None}]}}, real, cut=True
        )
        == []
    )


# --- a connection ---------------------------------------------------------------


class Line:
    """One connection to the daemon's socket, a line at a time."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(20)
        self.sock.connect(path)
        self.buffer = b""

    def send(self, *lines: bytes) -> None:
        self.sock.sendall(b"".join(line.rstrip(b"\n") + b"\n" for line in lines))

    def read(self) -> dict[str, Any]:
        while b"\n" not in self.buffer:
            chunk = self.sock.recv(1 << 20)
            assert chunk, f"closed after {self.buffer[:200]!r}"
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        value = msgspec.json.decode(line)
        assert isinstance(value, dict)
        return value

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def line(harness: DaemonHarness) -> Iterator[Line]:
    connection = Line(harness.socket)
    yield connection
    connection.close()


def _encoded(value: dict[str, Any]) -> bytes:
    return msgspec.json.encode(value)


# --- the requests and their replies ---------------------------------------------


def test_the_handshake_is_accepted(line: Line) -> None:
    (block,) = [b for b in _section("## Version handshake") if '"method"' in b.text]
    (request,) = _json_lines(block)
    line.send(request.encode())
    reply = line.read()
    assert "result" in reply, reply
    shown, _ = _decode(_session()[1])  # the session shows hello's reply
    assert same_shape(shown, reply) == []


def _session() -> list[str]:
    (block,) = _section("## An example session")[:1]
    return _json_lines(block)


def test_the_example_session(line: Line) -> None:
    """Typed a line at a time: each request's reply is the next line; the
    notification (no ``id``) gets none."""
    lines = [_decode(text) for text in _session()]
    assert sum("method" in value for value, _ in lines) >= 8
    differences: list[str] = []
    for i, (request, _) in enumerate(lines):
        if "method" not in request:
            continue
        line.send(_encoded(request))
        if "id" not in request:
            assert "method" in lines[i + 1][0], "a notification gets no reply"
            continue
        reply = line.read()
        shown, cut = lines[i + 1]
        assert shown.get("id") == request["id"] == reply["id"]
        differences += [
            f"{request['method']} (id {request['id']}): {d}"
            for d in same_shape(shown, reply, cut=cut)
        ]
    assert differences == []


def test_the_pipelined_example(line: Line) -> None:
    """Sent in one write; the replies, in whatever order they come."""
    (block,) = _section("## An example session")[1:2]
    requests = [msgspec.json.decode(r) for r in re.findall(r"'(\{.*?\})'", block.text)]
    assert len(requests) == 3
    line.send(*(_encoded(r) for r in requests))
    replies = {}
    for _ in requests:
        reply = line.read()
        replies[reply["id"]] = reply
    shown = [_decode(text) for text in _json_lines(block)]
    assert {value["id"] for value, _ in shown} == set(replies)
    differences = [
        f"id {value['id']}: {d}"
        for value, cut in shown
        for d in same_shape(value, replies[value["id"]], cut=cut)
    ]
    assert differences == []


# --- what the daemon sends unasked ----------------------------------------------


def _unasked(method: str) -> tuple[dict[str, Any], bool, frozenset[str]]:
    """The page's line of ``method`` that the daemon sends, whether it is
    cut, and the params that may be missing."""
    for block in BLOCKS:
        for text in _json_lines(block):
            if f'"method":"{method}"' in text:
                value, cut = _decode(text)
                return value, cut, frozenset(_optional(block))
    raise AssertionError(f"no {method} line")


def _compare_unasked(method: str, real: dict[str, Any]) -> None:
    shown, cut, optional = _unasked(method)
    differences = same_shape(
        {k: v for k, v in shown.items() if k != "params"},
        {k: v for k, v in real.items() if k != "params"},
    ) + same_shape(
        shown["params"], real["params"], at="$.params", cut=cut, optional=optional
    )
    assert differences == [], (shown, real)


def _hello(line: Line, capabilities: dict[str, Any]) -> None:
    line.send(
        _encoded(
            {
                "jsonrpc": "2.0",
                "id": 0,
                "method": "daemon/hello",
                "params": {"protocol_version": 1, "capabilities": capabilities},
            }
        )
    )
    assert "result" in line.read()


def _call(
    line: Line, server: str, tool: str, arguments: dict[str, Any], **params: Any
) -> None:
    line.send(
        _encoded(
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "tools/call",
                "params": {
                    "server": server,
                    "name": tool,
                    "arguments": arguments,
                    **params,
                },
            }
        )
    )


def test_a_progress_line(line: Line) -> None:
    _call(line, "demo", "progressing", {"steps": 1}, progress_token="job-7")  # noqa: S106
    notification = line.read()
    assert notification.get("method") == "notifications/progress", notification
    _compare_unasked("notifications/progress", notification)
    assert line.read()["id"] == 1


def test_a_log_line(line: Line) -> None:
    _hello(line, {"logging": {}})
    _call(line, "demo", "logged", {"text": "indexing 3 files"})
    notification = line.read()
    assert notification.get("method") == "notifications/message", notification
    _compare_unasked("notifications/message", notification)
    assert line.read()["id"] == 1


def test_an_elicitation_request(line: Line) -> None:
    _hello(line, {"elicitation": {"form": {}}})
    _call(line, "ask", "ask_name", {})
    request = line.read()
    assert request.get("method") == "elicitation/create", request
    _compare_unasked("elicitation/create", request)
    answer = {"action": "accept", "content": {"name": "Ada"}}
    line.send(_encoded({"jsonrpc": "2.0", "id": request["id"], "result": answer}))
    assert line.read()["id"] == 1


def test_a_resource_update(line: Line, harness: DaemonHarness) -> None:
    line.send(
        _encoded(
            {
                "jsonrpc": "2.0",
                "id": 2,
                "method": "resources/subscribe",
                "params": {"server": "feat", "uri": "feat://watched"},
            }
        )
    )
    assert "result" in line.read()
    with harness.client() as c:
        c.call_tool("feat", "touch", {"uri": "feat://watched"})
    notification = line.read()
    assert notification.get("method") == "notifications/resources/updated"
    _compare_unasked("notifications/resources/updated", notification)


# --- the error replies ----------------------------------------------------------


def _request(id_: int, method: str, **params: Any) -> bytes:
    return _encoded({"jsonrpc": "2.0", "id": id_, "method": method, "params": params})


PROVOKE: dict[str, bytes] = {
    "parse_error": b"\xff{",
    "invalid_request": b'{"id":14,"method":"daemon/status"}',
    "method_not_found": _request(10, "tools/frobnicate"),
    "invalid_params": _request(11, "tools/call", server="demo"),
    "invalid_params/transport": _request(
        21, "servers/add", server={"name": "x", "transport": "http"}
    ),
    "unsupported_protocol": _request(13, "daemon/hello", protocol_version=2),
    "unknown_server": _request(12, "tools/call", server="nope", name="echo"),
    "server_unavailable": _request(
        4, "tools/call", server="broken", name="echo", timeout_s=0.3
    ),
    "timeout": _request(
        16,
        "tools/call",
        server="demo",
        name="slow",
        arguments={"seconds": 5},
        timeout_s=0.3,
    ),
    "upstream_error": _request(1, "resources/read", server="demo", uri="test://nope"),
    "result_too_large": _request(
        17, "tools/call", server="demo", name="huge", arguments={"n_bytes": 2_100_000}
    ),
    "server_exists": _request(
        19,
        "servers/add",
        server={"name": "demo", "transport": "stdio", "command": "/bin/true"},
    ),
    "frame_too_large": b'{"jsonrpc":"2.0","id":9,"method":"ping","params":{"pad":"'
    + b"x" * (1 << 20)
    + b'"}}',
}
"""A request that gets each documented error reply (by its reason; a second
example of one reason by the word its message turns on)."""


def _documented_errors() -> dict[str, tuple[dict[str, Any], bool]]:
    (block,) = [b for b in _section("## Errors") if '"jsonrpc"' in b.text]
    found: dict[str, tuple[dict[str, Any], bool]] = {}
    for text in _json_lines(block):
        value, cut = _decode(text)
        reason = value["error"]["data"]["reason"]
        key = reason if reason not in found else f"{reason}/transport"
        found[key] = (value, cut)
    return found


def test_every_error_example_is_provoked_but_shutting_down() -> None:
    assert set(_documented_errors()) == set(PROVOKE) | {"shutting_down"}


@pytest.mark.parametrize("reason", sorted(PROVOKE))
def test_an_error_reply(reason: str, harness: DaemonHarness) -> None:
    shown, cut = _documented_errors()[reason]
    connection = Line(harness.socket)
    try:
        connection.send(PROVOKE[reason])  # frame_too_large: the rest is read out
        real = connection.read()
    finally:
        connection.close()
    assert real["error"]["data"]["reason"] == reason.split("/")[0], real
    assert same_shape(shown, real, cut=cut) == [], (shown, real)
