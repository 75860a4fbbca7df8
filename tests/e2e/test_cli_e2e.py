"""memorizzctl against a real daemon: the five-minute tour, as a test."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys

import msgspec
import pytest

from memorizzd.config import Profile
from tests.harness import MCP_SERVER, DaemonHarness, daemon_config

HELLO_LINE = b'{"jsonrpc":"2.0","id":1,"method":"daemon/hello","params":{"protocol_version":1}}\n'
"""The README's first line to socat."""


def test_the_tour(daemon: DaemonHarness, capsys: pytest.CaptureFixture[str]) -> None:
    add = [
        "mcp",
        "add",
        "demo",
        "--command",
        sys.executable,
        "--arg",
        MCP_SERVER,
        "--arg",
        "stdio",
    ]
    assert daemon.ctl(*add) == 0
    # What the README shows: the server starts in the background, and a call
    # made meanwhile waits for it (connect_wait_s).
    assert capsys.readouterr().out == "added demo (stdio, connecting)\n"
    daemon.wait_ready("demo")

    assert daemon.ctl("mcp", "list") == 0
    out = capsys.readouterr().out
    assert "demo" in out
    assert "ready" in out

    assert daemon.ctl("mcp", "tools", "demo") == 0
    assert "Return the text unchanged." in capsys.readouterr().out

    assert (
        daemon.ctl("mcp", "call", "demo", "echo", "--arguments", '{"text": "hello"}')
        == 0
    )
    assert capsys.readouterr().out.strip() == "hello"

    assert (
        daemon.ctl(
            "--json", "mcp", "call", "demo", "add", "--arguments", '{"a": 1, "b": 2}'
        )
        == 0
    )
    assert msgspec.json.decode(capsys.readouterr().out)["structuredContent"] == {
        "result": 3
    }

    assert (
        daemon.ctl("mcp", "call", "demo", "fail", "--arguments", '{"reason": "nope"}')
        == 1
    )
    assert "nope" in capsys.readouterr().err

    assert daemon.ctl("mcp", "read", "demo", "test://static") == 0
    assert capsys.readouterr().out.strip() == "static content"

    assert daemon.ctl("mcp", "prompt", "demo", "greet", "--arg", "name=Ada") == 0
    assert "Say hello to Ada" in capsys.readouterr().out

    for verb in ("resources", "templates", "prompts", "status"):
        assert daemon.ctl("mcp", verb, "demo") == 0
    assert daemon.ctl("mcp", "test", "demo") == 0
    assert "ok" in capsys.readouterr().out

    assert daemon.ctl("--json", "mcp", "status") == 0
    status = msgspec.json.decode(capsys.readouterr().out)
    assert status["servers"][0]["state"] == "ready"

    assert daemon.ctl("daemon", "status") == 0
    assert "1/1 ready" in capsys.readouterr().out

    # ping: the round trip this command saw (the daemon's own time is ~0)
    assert daemon.ctl("ping") == 0
    assert re.fullmatch(
        r"memorizzd: (\d+\.\d+|\d+) ms\n", out := capsys.readouterr().out
    )
    assert _ms(out) > 0
    assert daemon.ctl("ping", "demo") == 0
    out = capsys.readouterr().out
    assert re.fullmatch(r"demo: \S+ ms \(through memorizzd: \S+ ms\)\n", out), out
    inside, through = (float(x) for x in re.findall(r"([\d.]+) ms", out))
    assert 0 < inside <= through

    assert daemon.ctl("mcp", "remove", "demo") == 0
    assert daemon.ctl("mcp", "call", "demo", "echo") == 1
    err = capsys.readouterr().err
    assert err.startswith("memorizzctl: error: unknown server 'demo' (unknown_server)")


def _ms(line: str) -> float:
    return float(line.split(": ", 1)[1].split(" ms", 1)[0])


def test_errors_have_documented_exit_codes(
    daemon: DaemonHarness, capsys: pytest.CaptureFixture[str]
) -> None:
    assert daemon.ctl("mcp", "call", "nope", "echo") == 1
    assert daemon.ctl("mcp", "add", "x", "--transport", "stdio") == 2
    # refused before the socket, with the daemon's own message and reason
    assert daemon.ctl("mcp", "add", "bad name", "--command", "/bin/true") == 2
    assert "invalid_params" in capsys.readouterr().err
    # a message that begins with its reason does not end with it again
    assert daemon.ctl("mcp", "add", "x", "--url", "ftp://127.0.0.1/mcp") == 2
    err = capsys.readouterr().err.splitlines()[-1]  # after the usage line
    assert err.startswith("memorizzctl: error: scheme_not_allowed: "), err
    assert err.count("scheme_not_allowed") == 1, err
    # the daemon's egress refusals name the command line's flag, not only
    # the spec's field (allow_private_network)
    for url in ("http://127.0.0.1:9/mcp", "https://10.0.0.1/mcp"):
        assert daemon.ctl("mcp", "add", "x", "--url", url) == 77
        err = capsys.readouterr().err
        assert "--allow-private-network`)" in err, err


def test_the_installed_entry_point_runs(daemon: DaemonHarness) -> None:
    ctl = str(__import__("pathlib").Path(sys.executable).parent / "memorizzctl")
    done = subprocess.run(  # noqa: PLW1510 - the exit status is the assertion
        [ctl, "--socket", daemon.socket, "--json", "daemon", "status"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    assert msgspec.json.decode(done.stdout)["servers_total"] == 0


def test_daemon_status_prints_the_real_socket_paths(
    base_dir: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The README sends users to `memorizzctl daemon status` for the path to
    give socat: the operator socket and each agent socket, absolute, and each
    answers the README's first request line."""
    config = daemon_config(
        base_dir,
        socket=os.path.relpath(os.path.join(base_dir, "d.sock")),  # as typed
        profiles=[Profile(name="alpha"), Profile(name="beta")],
        agents_dir=os.path.join(base_dir, "agents"),
    )
    with DaemonHarness.running(config) as daemon:
        assert daemon.ctl("daemon", "status") == 0
        lines = capsys.readouterr().out.splitlines()
        shown = {
            key.strip(): value.strip()
            for key, _, value in (line.partition(":") for line in lines)
        }
        assert shown["socket"] == os.path.join(base_dir, "d.sock")
        at = lines.index(f"agent_sockets:   alpha: {base_dir}/agents/alpha/api.sock")
        assert lines[at + 1].split() == ["beta:", f"{base_dir}/agents/beta/api.sock"]
        for path in (
            shown["socket"],
            f"{base_dir}/agents/alpha/api.sock",
            f"{base_dir}/agents/beta/api.sock",
        ):
            with socket.socket(socket.AF_UNIX) as s:  # what socat does
                s.connect(path)
                s.sendall(HELLO_LINE)
                s.settimeout(10)
                reply = msgspec.json.decode(s.makefile("rb").readline())
            assert reply["result"]["protocol_version"] == 1, path
