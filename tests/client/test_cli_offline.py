"""memorizzctl without a daemon: import boundary, exit codes, usage errors, rendering.

A few tests talk to ``FakeSocket``: a thread that answers each request line with
a canned JSON-RPC reply, so the CLI's request building, error mapping and
``--json`` output are checked against the real ``Client`` without memorizzd.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgspec
import pytest

from memorizz import cli
from memorizz.api import methods as m
from memorizz.api.errors import ErrorCode, ProtocolError, RemoteError
from memorizz.api.paths import default_socket_path
from memorizz.client import Client
from memorizz.ctl import args as _args
from memorizz.ctl import render as _render
from memorizz.ctl import text as _text
from tests.unix_server import UnixServer

DAEMON_ONLY = {"anyio", "uvloop", "mcp", "cryptography", "systemd", "memorizzd"}


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="mz-") as d:  # AF_UNIX paths are short
        yield Path(d)


@pytest.fixture
def missing_socket(socket_dir: Path) -> str:
    return str(socket_dir / "nothing-here.sock")


# --- a canned-reply socket ----------------------------------------------------


class FakeSocket(UnixServer):
    """Answer ``method`` with ``replies[method]`` (a ``result`` or an ``error``)."""

    def __init__(self, path: Path, replies: dict[str, dict[str, Any]]) -> None:
        super().__init__(str(path))
        self.replies = replies
        self.requests: list[dict[str, Any]] = []

    def serve(self, conn: socket.socket) -> None:
        with conn.makefile("rb") as lines:
            for line in lines:
                request = msgspec.json.decode(line)
                self.requests.append(request)
                reply = {"jsonrpc": "2.0", "id": request["id"]}
                reply.update(self.replies[request["method"]])
                conn.sendall(msgspec.json.encode(reply) + b"\n")

    @contextmanager
    def running(self) -> Iterator[FakeSocket]:
        self.start()
        try:
            yield self
        finally:
            self.close()


def error_reply(code: int, message: str, reason: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "data": {"reason": reason}}}


def server_info(**overrides: Any) -> m.ServerInfo:
    fields: dict[str, Any] = {
        "name": "fs",
        "transport": "stdio",
        "source": "api",
        "command": "npx",
        "args": ["-y", "server fs"],
        "env_keys": [],
        "cwd": None,
        "url": None,
        "timeout_s": 60.0,
        "max_result_bytes": 2_000_000,
        "protocol": "auto",
        "state": "ready",
    }
    fields.update(overrides)
    return m.ServerInfo(**fields)


def server_status(**overrides: Any) -> m.ServerStatus:
    fields: dict[str, Any] = {
        "name": "fs",
        "transport": "stdio",
        "state": "ready",
        "since": 1000.0,
        "last_error": None,
        "pid": 4242,
        "protocol_version": "2025-06-18",
        "server_name": "fs",
        "server_version": "1.0",
        "tool_count": 3,
        "in_flight": 0,
        "calls_ok": 10,
        "calls_failed": 1,
        "latency_p50_ms": 12.345,
        "restarts": 0,
    }
    fields.update(overrides)
    return m.ServerStatus(**fields)


def as_result(value: msgspec.Struct) -> dict[str, Any]:
    return {"result": msgspec.to_builtins(value)}


# --- (1) import boundary --------------------------------------------------------


def test_importing_the_cli_loads_none_of_the_daemons_dependencies() -> None:
    code = "import sys, memorizz.cli; print('\\n'.join(sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout
    loaded = {name.partition(".")[0] for name in out.split()}
    assert "memorizz" in loaded
    assert loaded.isdisjoint(DAEMON_ONLY), loaded & DAEMON_ONLY


# --- (2) an unreachable daemon ----------------------------------------------------


def test_unreachable_daemon_exits_69_with_a_hint_naming_memorizzd(
    missing_socket: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["--socket", missing_socket, "mcp", "list"]) == 69
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("memorizzctl: error: ")
    assert "memorizzd" in err
    assert missing_socket in err
    assert "Traceback" not in err
    assert err.count("\n") == 1


def test_global_options_after_the_command_win_over_earlier_ones(
    socket_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first, last = str(socket_dir / "first.sock"), str(socket_dir / "last.sock")
    assert cli.main(["--socket", first, "mcp", "status", "--socket", last]) == 69
    err = capsys.readouterr().err
    assert last in err
    assert first not in err


def test_socket_defaults_to_the_environment(
    missing_socket: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("MEMORIZZ_SOCKET", missing_socket)
    assert cli.main(["daemon", "status"]) == 69
    assert missing_socket in capsys.readouterr().err


def test_interrupt_exits_130_quietly(
    missing_socket: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(Client, "list_servers", interrupted)
    assert cli.main(["--socket", missing_socket, "mcp", "list"]) == 130
    assert capsys.readouterr() == ("", "")


# --- (3) usage errors ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["mcp", "call", "fs", "t", "--arguments", "{nope"], "not valid JSON"),
        (["mcp", "call", "fs", "t", "--arguments", "[1, 2]"], "must be a JSON object"),
        (["mcp", "call", "fs", "t", "--arguments", "null"], "must be a JSON object"),
        (["mcp", "call", "fs", "t", "--timeout", "0"], "positive"),
        (["mcp", "add", "fs", "--command", "npx", "--env", "NOEQUALS"], "KEY=VALUE"),
        (["mcp", "add", "fs", "--command", "npx", "--env", "=v"], "KEY=VALUE"),
        (["mcp", "add", "fs", "--transport", "stdio"], "stdio needs a command"),
        (["mcp", "add", "fs", "--transport", "sse"], "sse needs a url"),
        (
            [
                "mcp",
                "add",
                "fs",
                "--transport",
                "stdio",
                "--command",
                "x",
                "--url",
                "http://h",
            ],
            "takes no url (invalid_params)",
        ),
        (
            ["mcp", "add", "fs", "--url", "http://h/mcp", "--env", "A=1"],
            "env, secret_env",
        ),
        (["mcp", "add", "fs"], "--command"),
        (
            ["mcp", "add", "fs", "--command", "npx", "--arg", "-y"],
            "expected one argument",
        ),
        (["mcp", "prompt", "fs", "p", "--arg", "novalue"], "KEY=VALUE"),
        (["mcp", "frobnicate"], "invalid choice"),
        (["mcp"], "required"),
        ([], "required"),
    ],
)
def test_usage_errors_exit_2_before_touching_the_socket(
    argv: list[str],
    message: str,
    missing_socket: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["--socket", missing_socket, *argv]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "usage:" in err
    assert "cannot reach" not in err


def test_help_exits_0_and_documents_the_exit_codes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for code in ("69", "75", "77"):
        assert f"\n  {code} " in out


@pytest.mark.parametrize(
    ("argv", "shown"),
    [
        # --prompt's metavar was NAME too, beside the server's NAME
        (["mcp", "complete"], ["--prompt PROMPT |", "NAME a server's name"]),
        (["mcp", "tools"], ["NAME a server's name, as `mcp list` shows it"]),
        (["mcp", "status"], ["NAME a server's name, as `mcp list` shows it (none:"]),
        (["ping"], ["SERVER a server's name, as `mcp list` shows it (none:"]),
        (["audit"], ["--server NAME only this server's", "--tool TOOL only this"]),
    ],
)
def test_help_says_what_each_name_names(
    argv: list[str], shown: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main([*argv, "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    for text in shown:
        assert text in out
    assert "--prompt NAME" not in out


@pytest.mark.parametrize("env", ["/tmp/mz-help/d.sock", None])
def test_socket_help_names_the_path_without_it(
    env: str | None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """With $MEMORIZZ_SOCKET set, its value was shown as the fallback after
    it ("default: $MEMORIZZ_SOCKET, else <its own value>")."""
    if env is None:
        monkeypatch.delenv("MEMORIZZ_SOCKET", raising=False)
    else:
        monkeypatch.setenv("MEMORIZZ_SOCKET", env)
    assert cli.main(["mcp", "list", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    if env is None:
        assert f"(default: $MEMORIZZ_SOCKET, else {default_socket_path()})" in out
    else:
        assert f"(default: $MEMORIZZ_SOCKET, set to {env})" in out


@pytest.mark.parametrize(
    ("argv", "head", "tail"),
    [
        (["mcp", "add", "fs", "--command", "npx", "--", "-y", "--", "x"],
         ["mcp", "add", "fs", "--command", "npx"], ["-y", "--", "x"]),
        (["--socket", "add", "mcp", "add", "fs", "--", "-v"],
         ["--socket", "add", "mcp", "add", "fs"], ["-v"]),
        (["--json", "mcp", "--socket=/s", "add", "fs", "--"],
         ["--json", "mcp", "--socket=/s", "add", "fs"], []),
        (["mcp", "call", "fs", "--", "-tool"], ["mcp", "call", "fs", "--", "-tool"], []),
        (["mcp", "add", "fs"], ["mcp", "add", "fs"], []),
    ],
)  # fmt: skip
def test_split_trailing_only_splits_mcp_add(
    argv: list[str], head: list[str], tail: list[str]
) -> None:
    assert _args.split_trailing(argv) == (head, tail)


# --- (4) rendering ------------------------------------------------------------------


def test_format_table_pads_columns_and_upcases_the_header() -> None:
    table = _text.format_table(["name", "x"], [["a", "1"], ["longer", "22"]])
    assert table == "NAME    X\na       1\nlonger  22\n"


@pytest.mark.parametrize(
    ("seconds", "age"),
    [(-5, "0s"), (0, "0s"), (3.9, "3s"), (59, "59s"), (60, "1m"), (150, "2m"),
     (3599, "59m"), (3600, "1h"), (86399, "23h"), (86400, "1d"), (10 * 86400, "10d")],
)  # fmt: skip
def test_format_age(seconds: float, age: str) -> None:
    assert _text.format_age(seconds) == age


def test_one_line_takes_the_first_line_strips_controls_and_truncates() -> None:
    assert _text.one_line("  first\x1b[31m line\nsecond") == "first?[31m line"
    long = _text.one_line("x" * 100)
    assert len(long) == _text.DESCRIPTION_WIDTH
    assert long.endswith("...")
    assert _text.one_line(None) == ""


def test_render_servers_shows_url_or_quoted_command() -> None:
    servers = [
        server_info(),
        server_info(
            name="docs",
            transport="streamable_http",
            source="config",
            command=None,
            args=[],
            url="https://example.com/mcp",
            state="backoff",
        ),
    ]
    assert _render.render_servers(servers).splitlines() == [
        "NAME  TRANSPORT        STATE    SOURCE  TARGET",
        "fs    stdio            ready    api     npx -y 'server fs'",
        "docs  streamable_http  backoff  config  https://example.com/mcp",
    ]
    assert _render.render_servers([]) == "no servers configured\n"


def test_render_status_shows_age_and_dashes_for_unknowns() -> None:
    statuses = [
        server_status(),
        server_status(
            name="web",
            state="failed",
            since=1000.0 - 7200,
            pid=None,
            protocol_version=None,
            tool_count=None,
            latency_p50_ms=None,
            last_error="connect refused\ntraceback follows",
        ),
    ]
    lines = _render.render_status(statuses, now=1003.5).splitlines()
    assert lines[0].split() == [
        "NAME", "STATE", "SINCE", "PID", "PROTOCOL", "TOOLS", "INFLIGHT",
        "OK", "FAILED", "P50(MS)", "LAST_ERROR",
    ]  # fmt: skip
    assert lines[1].split() == [
        "fs", "ready", "3s", "4242", "2025-06-18", "3", "0", "10", "1", "12.3", "-",
    ]  # fmt: skip
    assert lines[2].split() == [
        "web", "failed", "2h", "-", "-", "-", "0", "10", "1", "-", "connect", "refused",
    ]  # fmt: skip
    assert _render.render_status([], now=0) == "no servers configured\n"


def test_render_tools_uses_the_first_line_of_the_description() -> None:
    tools = [
        m.Tool(
            name="search",
            input_schema={},
            description="Search.\nLong details.",
            risk="read",
            decision="allow",
        ),
        m.Tool(name="bare", input_schema={}),
        m.Tool(name="wordy", input_schema={}, description="w" * 200),
    ]
    lines = _render.render_tools(tools).splitlines()
    assert lines[0] == "NAME    RISK  DECISION  DESCRIPTION"
    assert lines[1] == "search  read  allow     Search."
    assert lines[2] == "bare    -     -"
    assert len(lines[3]) == len("wordy   -     -         ") + _text.DESCRIPTION_WIDTH
    assert _render.render_tools([]) == "no tools\n"


def test_render_lists_of_resources_templates_and_prompts() -> None:
    resources = [m.Resource(uri="file:///a", name="a", mime_type="text/plain")]
    assert "file:///a" in _render.render_resources(resources)
    templates = [m.ResourceTemplate(uri_template="file:///{p}", name="files")]
    assert "file:///{p}" in _render.render_templates(templates)
    prompts = [
        m.Prompt(
            name="review",
            arguments=[
                m.PromptArgument(name="code", required=True),
                m.PromptArgument(name="style"),
            ],
        )
    ]
    assert _render.render_prompts(prompts).splitlines()[1].split() == [
        "review",
        "code",
        "[style]",
    ]
    assert _render.render_resources([]) == "no resources\n"
    assert _render.render_templates([]) == "no resource templates\n"
    assert _render.render_prompts([]) == "no prompts\n"


def test_render_call_prints_text_and_summarizes_other_content() -> None:
    result = m.ToolsCallResult(
        content=[
            {"type": "text", "text": "hello"},
            {"type": "image", "mimeType": "image/png", "data": "QUJD" * 10},
            {"type": "resource", "resource": {"uri": "file:///x", "text": "..."}},
            {"type": "resource_link", "uri": "file:///y", "name": "y"},
            {"type": "text", "text": "ends with newline\n"},
        ]
    )
    assert _render.render_call(result) == (
        "hello\n"
        "[image image/png, 40 bytes base64]\n"
        "[resource file:///x]\n"
        "[resource link file:///y]\n"
        "ends with newline\n"
    )
    structured = m.ToolsCallResult(content=[], structured_content={"n": 1})
    assert _render.render_call(structured) == '{\n  "n": 1\n}\n'
    assert _render.render_call(m.ToolsCallResult(content=[])) == ""


def test_render_contents_and_messages() -> None:
    contents = [
        {"uri": "file:///a", "text": "alpha"},
        {"uri": "file:///b", "mimeType": "image/png", "blob": "AAAA"},
    ]
    assert _render.render_contents(contents) == (
        "alpha\n[blob file:///b image/png, 4 bytes base64]\n"
    )
    prompt = m.PromptsGetResult(
        messages=[
            {"role": "user", "content": {"type": "text", "text": "Review this"}},
            {"role": "assistant", "content": {"type": "image", "mimeType": "a/b"}},
        ]
    )
    assert _render.render_messages(prompt) == (
        "user: Review this\nassistant: [image a/b, 0 bytes base64]\n"
    )


def test_render_test_result() -> None:
    ok = m.ServersTestResult(
        name="fs", outcome="ok", message="", tool_count=3, latency_ms=12.4
    )
    assert _render.render_test(ok) == "fs: ok (3 tools, 12 ms)\n"
    bad = m.ServersTestResult(
        name="fs",
        outcome="timeout",
        message="no reply in 5s",
        tool_count=None,
        latency_ms=None,
    )
    assert _render.render_test(bad) == "fs: timeout: no reply in 5s\n"
    gone = m.ServersTestResult(
        name="fs",
        outcome="unreachable",
        message="connection lost: the server closed its stdout",
        tool_count=None,
        latency_ms=None,
    )
    assert _render.render_test(gone) == (
        "fs: unreachable: connection lost: the server closed its stdout; the"
        " daemon's log says why (a stdio server's stderr and exit status; under"
        " systemd: `journalctl -u memorizzd`)\n"
    )


def test_render_daemon_status_is_key_value_lines() -> None:
    status = m.DaemonStatusResult(
        version="0.1.0",
        protocol_version=1,
        pid=7,
        uptime_s=7300,
        socket="/run/memorizzd/memorizzd.sock",
        state_dir="/var/lib/memorizzd",
        config_path=None,
        servers_total=3,
        servers_ready=2,
        connections=1,
        calls_in_flight=0,
        rss_bytes=50 * 1024 * 1024,
    )
    lines = dict(
        line.split(":", 1) for line in _render.render_daemon_status(status).splitlines()
    )
    assert {k: v.strip() for k, v in lines.items()} == {
        "version": "0.1.0",
        "protocol": "1",
        "pid": "7",
        "uptime": "2h",
        "socket": "/run/memorizzd/memorizzd.sock",
        "agent_sockets": "-",
        "state_dir": "/var/lib/memorizzd",
        "config": "-",
        "servers": "2/3 ready",
        "connections": "1",
        "calls_in_flight": "0",
        "rss": "50.0 MiB",
    }


def test_render_daemon_status_lists_each_agent_socket_on_a_line() -> None:
    status = m.DaemonStatusResult(
        version="0.1.0",
        protocol_version=1,
        pid=7,
        uptime_s=1,
        socket="/run/memorizzd/memorizzd.sock",
        state_dir="/var/lib/memorizzd",
        config_path="/etc/memorizzd/memorizzd.toml",
        servers_total=0,
        servers_ready=0,
        connections=1,
        calls_in_flight=1,
        rss_bytes=1,
        agent_sockets={
            "ci-bot": "/run/memorizzd/agents/ci-bot/api.sock",
            "alpha": "/run/memorizzd/agents/alpha/api.sock",
        },
    )
    lines = _render.render_daemon_status(status).splitlines()
    at = lines.index("agent_sockets:   alpha: /run/memorizzd/agents/alpha/api.sock")
    assert lines[at - 1] == "socket:          /run/memorizzd/memorizzd.sock"
    assert (
        lines[at + 1]
        == "                 ci-bot: /run/memorizzd/agents/ci-bot/api.sock"
    )
    assert lines[at + 2].startswith("state_dir:")


# --- the CLI against canned replies ------------------------------------------------------


def test_mcp_add_builds_the_spec_with_trailing_args(
    socket_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = socket_dir / "d.sock"
    replies = {"servers/add": as_result(m.ServersAddResult(server=server_info()))}
    with FakeSocket(path, replies).running() as fake:
        argv = [
            "mcp", "add", "fs", "--command", "npx", "--arg=-y", "--env", "K=a=b",
            "--timeout", "5", "--protocol", "legacy", "--socket", str(path),
            "--", "pkg", "--flag",
        ]  # fmt: skip
        assert cli.main(argv) == 0
    assert capsys.readouterr().out == "added fs (stdio, ready)\n"
    (request,) = fake.requests
    assert request["method"] == "servers/add"
    assert request["params"]["server"] == {
        "name": "fs",
        "transport": "stdio",
        "command": "npx",
        "args": ["-y", "pkg", "--flag"],
        "env": {"K": "a=b"},
        "timeout_s": 5.0,
        "protocol": "legacy",
    }


def test_json_output_is_the_result_struct(
    socket_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = socket_dir / "d.sock"
    listed = m.ServersListResult(servers=[server_info()])
    with FakeSocket(path, {"servers/list": as_result(listed)}).running():
        assert cli.main(["--json", "mcp", "list", "--socket", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith('{\n  "servers": [')
    assert msgspec.json.decode(out, type=m.ServersListResult) == listed


@pytest.mark.parametrize(
    ("code", "reason", "status"),
    [
        (ErrorCode.PERMISSION_DENIED, "permission_denied", 77),
        (ErrorCode.UNAVAILABLE, "server_unavailable", 75),
        (ErrorCode.DEADLINE_EXCEEDED, "timeout", 75),
        (ErrorCode.NOT_FOUND, "unknown_server", 1),
        (ErrorCode.UPSTREAM_ERROR, "upstream_error", 1),
        (-32099, "from_the_future", 1),
    ],
)
def test_daemon_errors_map_to_exit_codes_and_one_line(
    code: int,
    reason: str,
    status: int,
    socket_dir: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = socket_dir / "d.sock"
    replies = {"tools/list": error_reply(code, "nope", reason)}
    with FakeSocket(path, replies).running():
        assert cli.main(["--socket", str(path), "mcp", "tools", "fs"]) == status
    assert capsys.readouterr() == ("", f"memorizzctl: error: nope ({reason})\n")


def test_a_message_that_begins_with_its_reason_is_not_told_it_twice(
    socket_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = socket_dir / "d.sock"
    said = "host_not_allowed: mcp.example.test is not in the host allowlist"
    replies = {
        "tools/list": error_reply(ErrorCode.PERMISSION_DENIED, said, "host_not_allowed")
    }
    with FakeSocket(path, replies).running():
        assert cli.main(["--socket", str(path), "mcp", "tools", "fs"]) == 77
    assert capsys.readouterr() == ("", f"memorizzctl: error: {said}\n")


def test_tool_call_error_result_goes_to_stderr_and_exits_1(
    socket_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = socket_dir / "d.sock"
    result = m.ToolsCallResult(
        content=[{"type": "text", "text": "bad query"}], is_error=True
    )
    with FakeSocket(path, {"tools/call": as_result(result)}).running() as fake:
        argv = ["--socket", str(path), "mcp", "call", "fs", "search"]
        assert cli.main([*argv, "--arguments", '{"q": "x"}', "--timeout", "2"]) == 1
    assert capsys.readouterr() == ("", "memorizzctl: error: bad query\n")
    assert fake.requests[0]["params"] == {
        "server": "fs",
        "name": "search",
        "arguments": {"q": "x"},
        "timeout_s": 2.0,
        "progress_token": 1,  # memorizzctl shows a call's progress
    }


RELAYED_RESULT: dict[str, Any] = {
    "x-vendor": {"kept": True},
    "content": [{"type": "text", "text": "bad query"}],
    "isError": True,
    "resultType": "complete",
    "structuredContent": {"n": 1},
    "_meta": {"io.example/trace": "t-1"},
}
"""A tool's result with members ``ToolsCallResult`` does not model, in an
order it would not write."""


def _call_argv(path: Path, general: bool) -> list[str]:
    """``--json mcp call``, the one-shot way or (``--arguments @FILE``,
    which it declines) the general one."""
    argv = ["--socket", str(path), "--json", "mcp", "call", "fs", "search"]
    if not general:
        return [*argv, "--arguments", '{"q": "x"}']
    arguments = path.with_name("arguments.json")
    arguments.write_text('{"q": "x"}')
    return [*argv, "--arguments", f"@{arguments}"]


@pytest.mark.parametrize("general", [False, True], ids=["one-shot", "general"])
def test_json_call_prints_the_result_the_daemon_relayed(
    general: bool, socket_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every member, in the server's order, not the struct encoded again;
    ``isError`` still exits 1 (and says nothing on stderr)."""
    path = socket_dir / "d.sock"
    with FakeSocket(path, {"tools/call": {"result": RELAYED_RESULT}}).running():
        assert cli.main(_call_argv(path, general)) == 1
    out, err = capsys.readouterr()
    assert err == ""
    relayed = msgspec.json.encode(RELAYED_RESULT)
    assert out == msgspec.json.format(relayed, indent=2).decode() + "\n"


@pytest.mark.parametrize("general", [False, True], ids=["one-shot", "general"])
def test_json_call_still_refuses_a_result_of_the_wrong_shape(
    general: bool, socket_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = socket_dir / "d.sock"
    replies = {"tools/call": {"result": {"content": "not a list"}}}
    with FakeSocket(path, replies).running():
        assert cli.main(_call_argv(path, general)) == 1
    out, err = capsys.readouterr()
    assert err == ""
    error = msgspec.json.decode(out)["error"]
    assert error["reason"] == "malformed_reply"
    assert error["message"].startswith("malformed reply from memorizzd")


def test_call_tool_raw_returns_the_result_as_sent(socket_dir: Path) -> None:
    """``raw=True``: the reply's ``result`` bytes, checked as a
    ``ToolsCallResult`` first; an error reply is raised as ever."""
    path = socket_dir / "d.sock"
    relayed = msgspec.json.encode(RELAYED_RESULT)
    with (
        FakeSocket(path, {"tools/call": {"result": RELAYED_RESULT}}).running(),
        Client(path) as c,
    ):
        raw = c.call_tool("fs", "search", {"q": "x"}, raw=True)
        assert isinstance(raw, msgspec.Raw)
        assert bytes(raw) == relayed
        assert c.call_tool("fs", "search").is_error  # the struct, by default
    path.unlink()
    for reply, raised in (
        ({"result": {"content": "not a list"}}, ProtocolError),
        (error_reply(ErrorCode.NOT_FOUND, "no", "unknown_server"), RemoteError),
    ):
        with (
            FakeSocket(path, {"tools/call": reply}).running(),
            Client(path) as c,
            pytest.raises(raised),
        ):
            c.call_tool("fs", "search", raw=True)
        path.unlink()


def test_resume_prints_the_result_the_daemon_relayed(
    socket_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``mcp resume`` shows the stored call's result as ``mcp call`` does:
    ``--json`` as relayed (every member, its order), text as ever; ``isError``
    exits 1 either way."""
    path = socket_dir / "d.sock"
    with FakeSocket(path, {"approvals/resume": {"result": RELAYED_RESULT}}).running():
        argv = ["--socket", str(path), "mcp", "resume", "p_1"]
        assert cli.main([*argv[:2], "--json", *argv[2:]]) == 1
        out, err = capsys.readouterr()
        assert err == ""
        relayed = msgspec.json.encode(RELAYED_RESULT)
        assert out == msgspec.json.format(relayed, indent=2).decode() + "\n"
        assert cli.main(argv) == 1
        assert capsys.readouterr() == ("", "memorizzctl: error: bad query\n")


def test_client_resume_raw_returns_the_result_as_sent(socket_dir: Path) -> None:
    """``raw=True``: the reply's ``result`` bytes, checked as a
    ``ToolsCallResult`` first; the struct by default."""
    path = socket_dir / "d.sock"
    relayed = msgspec.json.encode(RELAYED_RESULT)
    with (
        FakeSocket(path, {"approvals/resume": {"result": RELAYED_RESULT}}).running(),
        Client(path) as c,
    ):
        raw = c.resume("p_1", raw=True)
        assert isinstance(raw, msgspec.Raw)
        assert bytes(raw) == relayed
        assert c.resume("p_1").is_error
    path.unlink()
    bad = {"approvals/resume": {"result": {"content": "not a list"}}}
    with (
        FakeSocket(path, bad).running(),
        Client(path) as c,
        pytest.raises(ProtocolError),
    ):
        c.resume("p_1", raw=True)


def test_failed_server_test_exits_1(
    socket_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = socket_dir / "d.sock"
    result = m.ServersTestResult(
        name="fs",
        outcome="unreachable",
        message="spawn failed",
        tool_count=None,
        latency_ms=None,
    )
    with FakeSocket(path, {"servers/test": as_result(result)}).running():
        assert cli.main(["--socket", str(path), "mcp", "test", "fs"]) == 1
    assert capsys.readouterr().out.startswith("fs: unreachable: spawn failed; ")


def test_a_reply_of_the_wrong_shape_is_one_line_and_exit_1(
    socket_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = socket_dir / "d.sock"
    with FakeSocket(path, {"ping": {"result": {"latency": "fast"}}}).running():
        assert cli.main(["--socket", str(path), "ping"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("memorizzctl: error: malformed reply from memorizzd")
    assert err.count("\n") == 1
