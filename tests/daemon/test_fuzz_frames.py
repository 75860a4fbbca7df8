"""SECURITY.md 6.2 #1: JSON-RPC fuzz, at the socket, against the real daemon.

A seeded ``random.Random(0)`` mutates a corpus of valid frames (ping,
tools/list, tools/call, audit/list, approvals/list, resources/read) with byte
flips, truncation, ``NaN``/``Infinity``, duplicate keys, lone surrogates,
invalid UTF-8, 200k-deep ``[``, 5000-digit integers (as ids and as params),
a 10k-element batch, wrong types and unknown methods: about 3000 frames, half
on an agent socket and half on the operator socket, pipelined in chunks (one
connection per chunk, half-closed after its last frame, so every reply the
daemon owes arrives before its close).

It runs through the socket only, so it survives any refactoring of the frame
parser or the dispatcher. Every reply must be a result, a standard JSON-RPC
error or one of our domain errors, never ``internal`` nor a traceback; the
daemon logs no error; a control client on another connection is answered
throughout; and the daemon's connections and requests in flight come back
to where they were.
"""

from __future__ import annotations

import random
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Self

import msgspec
import pytest

from memorizz import Client
from memorizz.api.errors import REASONS
from memorizzd.config import Limits, Profile
from tests.harness import DaemonHarness, daemon_config, stdio_spec, wait_until
from tests.peers import ME, agent_socket

SEED = 0
FRAMES_PER_SOCKET = 1500
CHUNK = 100
READ_TIMEOUT_S = 10.0
CONTROL_BOUND_S = 2.0
"""Generous: a control ping takes milliseconds (about 20 ms at worst here)."""
STANDARD_CODES = frozenset({-32700, -32600, -32601, -32602})
OUR_BAND = range(-32099, -31999)

CORPUS: list[tuple[str, dict[str, Any]]] = [
    ("ping", {}),
    ("ping", {"server": "t"}),
    ("tools/list", {"server": "t"}),
    ("tools/call", {"server": "t", "name": "echo", "arguments": {"text": "hi"}}),
    ("tools/call", {"server": "t", "name": "add", "arguments": {"a": 1, "b": 2}}),
    ("audit/list", {"limit": 5}),
    ("approvals/list", {}),
    ("resources/read", {"server": "t", "uri": "test://static"}),
]
UNKNOWN_METHODS = [
    "nope",
    "",
    "tools/call/",
    "TOOLS/LIST",
    "rpc.discover",
    "\u0000",
    "x" * 5000,
    "servers/teleport",
    "daemon/status/extra",
]
WRONG_VALUES: list[object] = [
    None,
    True,
    0,
    -1,
    1.5,
    "",
    "x",
    [],
    [1, "2"],
    {},
    {"a": {"b": []}},
]
BIG_INT = "9" * 5000
PLACEHOLDER = "@@PLACEHOLDER@@"
"""Set as a value, then replaced in the encoded frame by what msgspec would
never encode (a non-finite number, a lone surrogate, a 5000-digit integer)."""
DEEP = b"[" * 200_000


def encode(body: object) -> bytes:
    return msgspec.json.encode(body)


def frame(request_id: object, method: str, params: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}


# --- mutations: each takes the generator and a valid frame, returns bytes ----

Mutation = Callable[[random.Random, dict[str, Any]], bytes]


def byte_flips(rng: random.Random, body: dict[str, Any]) -> bytes:
    data = bytearray(encode(body))
    for _ in range(rng.randint(1, 4)):
        data[rng.randrange(len(data))] ^= rng.randint(1, 255)
    return bytes(data)


def truncation(rng: random.Random, body: dict[str, Any]) -> bytes:
    data = encode(body)
    return data[: rng.randrange(len(data))]


def non_finite(rng: random.Random, body: dict[str, Any]) -> bytes:
    token = rng.choice([b"NaN", b"Infinity", b"-Infinity", b"nan", b"1e400"])
    data = encode(body)
    if rng.random() < 0.5:  # somewhere at random
        at = rng.randrange(len(data))
        return data[:at] + token + data[at:]
    # or as a value where a number belongs
    key = rng.choice(["id", "limit", "a", "timeout_s"])
    replaced = _set_somewhere(rng, body, key, PLACEHOLDER)
    return encode(replaced).replace(encode(PLACEHOLDER), token)


def duplicate_keys(rng: random.Random, body: dict[str, Any]) -> bytes:
    key = rng.choice(["id", "method", "params", "jsonrpc"])
    other: object = rng.choice(
        [
            *WRONG_VALUES,
            "tools/call",
            "servers/list",
            {"server": "t", "name": "echo", "arguments": {"text": "dup"}},
        ]
    )
    extra = encode(key) + b":" + encode(other)
    data = encode(body)
    if rng.random() < 0.5:  # the duplicate first
        return b"{" + extra + b"," + data[1:]
    return data[:-1] + b"," + extra + b"}"


def lone_surrogate(rng: random.Random, body: dict[str, Any]) -> bytes:
    escape = rng.choice(
        [b"\\ud800", b"\\udfff", b"\\ud800\\u0041", b"\\udc00\\ud800", b"\\ud83d"]
    )
    key = rng.choice(["method", "server", "name", "text", "uri", "id"])
    replaced = _set_somewhere(rng, body, key, f"a{PLACEHOLDER}z")
    data = encode(replaced).replace(PLACEHOLDER.encode(), escape)
    if rng.random() < 0.3:  # the surrogate as (invalid) raw UTF-8: CESU-8
        data = data.replace(escape, b"\xed\xa0\x80")
    return data


def invalid_utf8(rng: random.Random, body: dict[str, Any]) -> bytes:
    junk = rng.choice(
        [b"\xff", b"\xc3\x28", b"\xe2\x82", b"\xf0\x28\x8c\xbc", b"\xc0\xaf", b"\x80"]
    )
    data = encode(body)
    at = rng.randrange(len(data))
    return data[:at] + junk + data[at:]


def deep_nesting(rng: random.Random, body: dict[str, Any]) -> bytes:
    choice = rng.randrange(4)
    if choice == 0:
        return DEEP
    if choice == 1:  # deep params
        return encode(body)[:-1] + b',"params":' + DEEP + b"}"
    if choice == 2:  # deep, closed, inside the arguments of a call
        depth = rng.choice([100, 500, 900, 5000])
        nested = b"[" * depth + b"]" * depth
        call = encode(frame(body["id"], "tools/call", {"server": "t", "name": "echo"}))
        return call[:-2] + b',"arguments":{"text":"d","deep":' + nested + b"}}}"
    return b"{" * 200_000


def big_integers(rng: random.Random, body: dict[str, Any]) -> bytes:
    key = rng.choice(["id", "limit", "a", "timeout_s", "b"])
    sign = rng.choice(["", "-"])
    replaced = _set_somewhere(rng, body, key, PLACEHOLDER)
    return encode(replaced).replace(encode(PLACEHOLDER), (sign + BIG_INT).encode())


def wrong_types(rng: random.Random, body: dict[str, Any]) -> bytes:
    key = rng.choice(
        ["id", "method", "params", "jsonrpc", "server", "name", "arguments", "uri"]
    )
    value = rng.choice([*WRONG_VALUES, "1.0", 2.0])
    if key == "params":
        mutated = dict(body, params=value)
    else:
        mutated = _set_somewhere(rng, body, key, value)
    if rng.random() < 0.2:  # the whole envelope of the wrong type
        return encode(rng.choice(WRONG_VALUES))
    return encode(mutated)


def unknown_method(rng: random.Random, body: dict[str, Any]) -> bytes:
    return encode(dict(body, method=rng.choice(UNKNOWN_METHODS)))


def missing_parts(rng: random.Random, body: dict[str, Any]) -> bytes:
    mutated = dict(body)
    mutated.pop(rng.choice(["id", "method", "jsonrpc", "params"]))
    return encode(mutated)


def garbage(rng: random.Random, body: dict[str, Any]) -> bytes:
    return bytes(rng.randrange(256) for _ in range(rng.randint(1, 300)))


MUTATIONS: list[Mutation] = [
    byte_flips,
    byte_flips,
    byte_flips,
    truncation,
    truncation,
    non_finite,
    duplicate_keys,
    lone_surrogate,
    invalid_utf8,
    big_integers,
    wrong_types,
    wrong_types,
    unknown_method,
    missing_parts,
    deep_nesting,
    garbage,
]


def _set_somewhere(
    rng: random.Random, body: dict[str, Any], key: str, value: object
) -> dict[str, Any]:
    """A copy of ``body`` with ``key`` set to ``value`` in the envelope, the
    params or the arguments (wherever the key fits best)."""
    params = dict(body["params"])
    if key in ("id", "method", "jsonrpc"):
        return dict(body, **{key: value})
    if key in ("text", "a", "b"):
        arguments = dict(params.get("arguments") or {})
        arguments[key] = value
        params["arguments"] = arguments
    else:
        params[key] = value
    return dict(body, params=params)


# --- the corpus, mutated: about 3000 frames ------------------------------------


@dataclass
class Chunk:
    lines: list[bytes] = field(default_factory=list)
    expected: dict[str, str] = field(default_factory=dict)
    """Ids of unmutated frames (always answered) -> their method."""


def chunks(rng: random.Random, socket_kind: str) -> Iterator[Chunk]:
    """FRAMES_PER_SOCKET frames in chunks of CHUNK; about one in five is
    left valid (with a string id no mutation makes), to show that the
    connection keeps serving among the garbage."""
    sent, n = 0, 0
    while sent < FRAMES_PER_SOCKET:
        chunk = Chunk()
        for _ in range(min(CHUNK, FRAMES_PER_SOCKET - sent)):
            n += 1
            method, params = rng.choice(CORPUS)
            if rng.random() < 0.2:
                request_id = f"{socket_kind}-ok-{n}"
                chunk.lines.append(encode(frame(request_id, method, params)))
                chunk.expected[request_id] = method
            else:
                mutation = rng.choice(MUTATIONS)
                chunk.lines.append(mutation(rng, frame(n, method, params)))
        sent += len(chunk.lines)
        yield chunk
    # the large ones, once each per socket: a 10k-element batch and the depths
    batch = [frame(i, "ping", {}) for i in range(10_000)]
    big = Chunk(lines=[encode(batch), DEEP, b"{" * 200_000])
    big.lines.append(encode(frame(f"{socket_kind}-ok-last", "ping", {})))
    big.expected[f"{socket_kind}-ok-last"] = "ping"
    yield big


# --- the wire ---------------------------------------------------------------


def exchange(path: str, lines: list[bytes]) -> list[bytes]:
    """Send ``lines`` pipelined on a new connection, half-close, and read every
    reply line until the daemon closes; each wait for data is bounded."""
    data = b"".join(line + b"\n" for line in lines)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    sock.setblocking(False)
    received = bytearray()
    offset, closed_for_writing = 0, False
    try:
        while True:
            want_write = [sock] if offset < len(data) else []
            readable, writable, _ = select.select(
                [sock], want_write, [], READ_TIMEOUT_S
            )
            if not readable and not writable:
                raise AssertionError(
                    f"no reply for {READ_TIMEOUT_S} s ({offset} of {len(data)} bytes sent)"
                )
            if writable:
                try:
                    offset += sock.send(data[offset : offset + 65536])
                except BlockingIOError:
                    pass
                except (BrokenPipeError, ConnectionResetError):
                    offset = len(data)  # the daemon closed the connection: allowed
            if offset >= len(data) and not closed_for_writing:
                closed_for_writing = True
                try:
                    sock.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
            if readable:
                try:
                    chunk = sock.recv(1 << 16)
                except BlockingIOError:
                    continue
                except ConnectionResetError:
                    break
                if not chunk:
                    break
                received += chunk
    finally:
        sock.close()
    assert received.endswith(b"\n") or not received, "a reply was cut short"
    return bytes(received).splitlines()


def check_reply(line: bytes) -> dict[str, Any]:
    """A reply is a result, a standard JSON-RPC error or a domain error that
    is not ``internal``; never a traceback."""
    assert b"Traceback" not in line, line[:500]
    reply = msgspec.json.decode(line)
    assert isinstance(reply, dict), line[:200]
    assert reply.get("jsonrpc") == "2.0", line[:200]
    assert ("result" in reply) != ("error" in reply), line[:200]
    if "error" in reply:
        error = reply["error"]
        code = error["code"]
        reason = (error.get("data") or {}).get("reason")
        assert code in STANDARD_CODES or code in OUR_BAND, line[:300]
        assert reason in REASONS, line[:300]
        assert reason != "internal", line[:300]
    return reply


# --- health ------------------------------------------------------------------


class ControlClient:
    """Pings on a connection of its own, all through the fuzz."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.latencies: list[float] = []
        self.failures: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            with Client(self.path) as c:
                while not self._stop.is_set():
                    started = time.monotonic()
                    c.ping()
                    self.latencies.append(time.monotonic() - started)
                    self._stop.wait(0.02)
        except Exception as exc:  # noqa: BLE001 - reported by the test
            self.failures.append(exc)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(timeout=READ_TIMEOUT_S)


@pytest.fixture
def fuzz_daemon(base_dir: str) -> Iterator[DaemonHarness]:
    config = daemon_config(
        base_dir,
        servers=[stdio_spec("t", timeout_s=5.0)],
        profiles=[
            Profile(
                name="fuzz",
                servers=["t"],
                uids=[ME],
                limits=Limits(max_in_flight=256),
            )
        ],
        agents_dir=f"{base_dir}/agents",
    )
    with DaemonHarness.running(config) as harness:
        harness.wait_ready("t")
        yield harness


def test_fuzzed_frames_get_clean_errors_and_leave_the_daemon_healthy(
    fuzz_daemon: DaemonHarness, base_dir: str, caplog: pytest.LogCaptureFixture
) -> None:
    daemon = fuzz_daemon.daemon
    sockets = {
        "agent": agent_socket(base_dir, "fuzz"),
        "operator": fuzz_daemon.socket,
    }
    rng = random.Random(SEED)  # noqa: S311 - a reproducible fuzz, not cryptography
    baseline = (daemon.connections, daemon.in_flight)
    frames = replies = 0
    codes: dict[object, int] = {}
    with (
        ControlClient(sockets["operator"]) as op,
        ControlClient(sockets["agent"]) as ag,
    ):
        wait_until(lambda: bool(op.latencies and ag.latencies), what="control pings")
        for kind, path in sockets.items():
            for chunk in chunks(rng, kind):
                frames += len(chunk.lines)
                answered: dict[object, int] = {}
                for line in exchange(path, chunk.lines):
                    reply = check_reply(line)
                    replies += 1
                    answered[reply["id"]] = answered.get(reply["id"], 0) + 1
                    error = reply.get("error")
                    code = error["data"]["reason"] if error else "result"
                    codes[code] = codes.get(code, 0) + 1
                for request_id in chunk.expected:  # the valid ones: answered once
                    assert answered.get(request_id) == 1, (request_id, answered)
                assert not op.failures
                assert not ag.failures
    assert not op.failures, op.failures
    assert not ag.failures, ag.failures
    slowest = max(op.latencies + ag.latencies)
    assert slowest < CONTROL_BOUND_S, f"a control ping took {slowest:.2f} s"
    assert frames >= 3000
    assert replies > frames // 2, (frames, replies)  # most frames are answered
    assert {
        "parse_error",
        "invalid_request",
        "method_not_found",
        "invalid_params",
    } <= set(codes), codes
    wait_until(
        lambda: (daemon.connections, daemon.in_flight) == baseline,
        timeout=5,
        what="connections and requests in flight back to baseline",
    )
    with fuzz_daemon.client() as c:  # healthy: the upstream was never disturbed
        assert c.call_tool("t", "echo", {"text": "ok"}).content[0]["text"] == "ok"
        assert c.server_status("t")[0].restarts == 0
    bad = [
        r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL") or r.exc_info
    ]
    assert not bad, [r.getMessage() for r in bad]
