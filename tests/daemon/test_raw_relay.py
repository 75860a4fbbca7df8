"""The raw relay: a warm stdio ``tools/call`` needs no model objects.

The arguments reach the server as the bytes the caller sent (after policy and
the HMAC), the result reaches the caller as the bytes the server wrote
(spliced into the reply), and a daemon that serves only stdio servers never
loads the MCP SDK (nor pydantic under it): only an HTTP server does.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import msgspec
import pytest

from memorizz.api.methods import ServerSpec
from tests.harness import (
    DaemonHarness,
    daemon_process,
    http_spec,
    serve_http,
    short_tempdir,
)

RELAY_SERVER = str(Path(__file__).parents[1] / "relay_server.py")


def relay_spec(name: str, era: str) -> ServerSpec:
    return ServerSpec(
        name=name,
        transport="stdio",
        command=sys.executable,
        args=[RELAY_SERVER, era],
        protocol="auto",
    )


def raw_call(socket_path: str, line: bytes) -> bytes:
    """One request line on a fresh connection; the reply line as sent."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(20)
        sock.connect(socket_path)
        sock.sendall(line)
        reply = b""
        while not reply.endswith(b"\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            reply += chunk
    return reply


@pytest.mark.parametrize("era", ["legacy", "modern"])
def test_arguments_and_result_are_relayed_as_bytes(
    daemon: DaemonHarness, era: str
) -> None:
    daemon.add(relay_spec("relay", era))
    # Key order and spacing no encoder of ours would produce.
    arguments = b'{ "zeta": 1,  "alpha": [1, 2.50, "\\u00e9"] }'
    request = (
        b'{"jsonrpc":"2.0","id":7,"method":"tools/call","params":'
        b'{"server":"relay","name":"show","arguments":' + arguments + b"}}\n"
    )
    reply = raw_call(daemon.socket, request)
    # The result as the server wrote it, member order and unknown members kept.
    assert reply.startswith(
        b'{"jsonrpc":"2.0","id":7,"result":{"x-vendor":{"kept":true},'
    )
    result = msgspec.json.decode(reply)["result"]
    received = msgspec.json.decode(
        result["content"][0]["text"]
    )  # the params the server read
    assert received["name"] == "show"
    shown = result["content"][0]["text"]
    assert '"arguments":' + arguments.decode() in shown  # the caller's bytes
    if era == "modern":  # 2026-07-28: every request carries the era's _meta
        assert received["_meta"]["io.modelcontextprotocol/protocolVersion"] == (
            "2026-07-28"
        )
    else:
        assert "_meta" not in received
    with daemon.client() as c:
        record = c.audit(limit=1).records[0]
    assert record.outcome == "ok"
    assert record.argument_keys == ["alpha", "zeta"]
    assert record.result_bytes == len(msgspec.json.encode(result))


def test_arguments_that_are_not_an_object_are_invalid_params(
    daemon: DaemonHarness,
) -> None:
    daemon.add(relay_spec("relay", "legacy"))
    for arguments in (b"[1]", b'"text"', b"null", b"3"):
        request = (
            b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":'
            b'{"server":"relay","name":"show","arguments":' + arguments + b"}}\n"
        )
        error = msgspec.json.decode(raw_call(daemon.socket, request))["error"]
        assert error["data"]["reason"] == "invalid_params", arguments


def _maps(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


def test_a_daemon_with_only_stdio_servers_never_loads_the_sdk() -> None:
    """Nor cryptography before a secret is used: what a host does not use,
    the daemon does not load (docs/architecture.md)."""
    base = short_tempdir()
    config = os.path.join(base, "memorizzd.toml")
    Path(config).write_text(
        "[[servers]]\n"
        'name = "relay"\n'
        'transport = "stdio"\n'
        f"command = {msgspec.json.encode(sys.executable).decode()}\n"
        f'args = [{msgspec.json.encode(RELAY_SERVER).decode()}, "legacy"]\n'
    )
    with daemon_process(base, config=config) as process:
        process.wait_ready("relay")
        with process.client() as c:
            result = c.call_tool("relay", "show", {"a": 1})
        assert not result.is_error
        maps = _maps(process.pid)
        assert "pydantic_core" not in maps  # no SDK, no pydantic
        assert "cryptography" not in maps  # no secret used yet
        # The check can fail: an HTTP server loads the SDK (and pydantic).
        with serve_http("streamable_http") as url, process.client() as c:
            c.add_server(http_spec("web", url, "streamable_http"))
            process.wait_ready("web")
            assert "pydantic_core" in _maps(process.pid)
            c.remove_server("web")
