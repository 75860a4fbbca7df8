"""Static credentials end to end through the real daemon: a bearer token and a
custom header to an HTTP MCP server on 127.0.0.1 that answers 401 without
them, secret env for a stdio server; secrets back from the vault after a
restart; and a marker value found in none of the daemon's outputs or files."""

from __future__ import annotations

import io
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from memorizz.api import methods as m
from memorizz.api.errors import AuthRequiredError, InvalidParamsError
from memorizz.api.methods import ServerSpec
from memorizz.api.spec import check_server_spec
from memorizz.ctl.add import build_server_spec
from memorizz.ctl.parser import build_parser
from tests.harness import (
    MCP_SERVER,
    DaemonHarness,
    command_options,
    daemon_config,
    daemon_process,
    serve_http,
    stdio_spec,
    wait_until,
)

TOKEN = "tok-marker-5b1e0c7a9d"  # noqa: S105 - a test marker
HEADER_VALUE = "hdr-marker-2f8d4e6c1a"
ENV_VALUE = "env-marker-9c3a7b5e2d"
MARKERS = (TOKEN, HEADER_VALUE, ENV_VALUE)
HEADER = "X-Api-Key"


def guarded(app: Any) -> Any:
    """401 unless ``Authorization: Bearer TOKEN`` and the custom header match."""

    async def middleware(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            if (
                headers.get(b"authorization") != f"Bearer {TOKEN}".encode()
                or headers.get(HEADER.lower().encode()) != HEADER_VALUE.encode()
            ):
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [(b"www-authenticate", b"Bearer")],
                    }
                )
                await send({"type": "http.response.body", "body": b""})
                return
        await app(scope, receive, send)

    return middleware


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with serve_http("streamable_http", wrap=guarded) as served:
        yield served


def http_spec(name: str, url: str, **overrides: Any) -> ServerSpec:
    fields: dict[str, Any] = {
        "name": name,
        "transport": "streamable_http",
        "url": url,
        "allow_private_network": True,
        "auth": "bearer",
        "token": TOKEN,
        "headers": {HEADER: HEADER_VALUE},
    }
    fields.update(overrides)
    return ServerSpec(**fields)


def assert_no_marker(where: str, data: bytes | str) -> None:
    raw = data.encode() if isinstance(data, str) else data
    for marker in MARKERS:
        assert marker.encode() not in raw, f"a secret in {where}"


def assert_state_clean(state_dir: str) -> None:
    for path in Path(state_dir).iterdir():  # state.db, -wal, -shm, vault.key
        assert_no_marker(str(path), path.read_bytes())


def test_bearer_and_header_reach_the_server_and_nothing_shows_them(
    url: str, base_dir: str, caplog: pytest.LogCaptureFixture, capsys: Any
) -> None:
    caplog.set_level("DEBUG")
    with DaemonHarness.running(daemon_config(base_dir)) as d:
        d.add(http_spec("a", url))
        with d.client() as c:
            result = c.call_tool("a", "echo", {"text": "hi"})
            assert result.content[0]["text"] == "hi"
            (info,) = c.list_servers()
            assert info.auth == "bearer"
            assert info.header_names == [HEADER]
            listed = c.request(
                "servers/list", m.ServersListParams(), m.ServersListResult
            )
            audit = c.audit()
            assert {r.action for r in audit.records} >= {"servers/add", "tools/call"}
        assert_no_marker("servers/list", msgspec.json.encode(listed))
        assert_no_marker("audit/list", msgspec.json.encode(audit))
        capsys.readouterr()
        assert d.ctl("mcp", "list", "--json") == 0
        assert d.ctl("audit", "--json") == 0
        out = capsys.readouterr()
        assert HEADER in out.out
        assert_no_marker("memorizzctl output", out.out + out.err)
        assert_state_clean(d.config.state_dir)
    assert_no_marker("the daemon log", caplog.text)
    assert_state_clean(os.path.join(base_dir, "state"))


def test_a_wrong_token_cannot_connect(url: str, base_dir: str) -> None:
    config = daemon_config(base_dir, connect_wait_s=0.2)
    with DaemonHarness.running(config) as d, d.client() as c:
        c.add_server(http_spec("a", url, token="wrong-" + TOKEN[:3]))

        def failing() -> bool:
            return c.server_status("a")[0].state in ("backoff", "failed")

        wait_until(failing, what="a failed connect")
        with pytest.raises(AuthRequiredError) as caught:
            c.call_tool("a", "echo", {"text": "hi"})
        assert caught.value.reason == "authorization_required"
        status = c.server_status("a")[0]
        assert status.last_error
        assert "the server answered 401" in status.last_error
        assert_no_marker("last_error", status.last_error)


def test_secrets_come_back_from_the_vault_after_a_restart(
    url: str, base_dir: str
) -> None:
    with daemon_process(base_dir) as d:
        with d.client() as c:
            c.add_server(http_spec("a", url))
        d.wait_ready("a")
    with daemon_process(base_dir) as d:
        d.wait_ready("a")
        with d.client() as c:
            assert c.call_tool("a", "echo", {"text": "x"}).content[0]["text"] == "x"
            c.remove_server("a")
        log = d.log()
    assert "vault key from key file" in log
    assert_no_marker("the daemon log", log)
    assert_state_clean(os.path.join(base_dir, "state"))


def test_removing_a_server_deletes_its_secrets(url: str, base_dir: str) -> None:
    with DaemonHarness.running(daemon_config(base_dir)) as d:
        d.add(http_spec("a", url))
        vault = d.daemon.pool.get("a")._vault
        assert sorted(vault.refs()) == [
            "server/a/header/X-Api-Key",
            "server/a/token",
        ]
        with d.client() as c:
            c.remove_server("a")
        assert vault.refs() == []


def test_a_config_file_server_keeps_its_inline_secrets_in_memory(
    url: str, base_dir: str
) -> None:
    config = daemon_config(base_dir, servers=[http_spec("cfg", url)])
    with DaemonHarness.running(config) as d:
        d.wait_ready("cfg")
        with d.client() as c:
            assert c.call_tool("cfg", "echo", {"text": "y"}).content[0]["text"] == "y"
        assert d.daemon.pool.get("cfg")._vault.refs() == []
    assert_state_clean(os.path.join(base_dir, "state"))


def test_a_stdio_child_sees_its_secret_env(base_dir: str, capsys: Any) -> None:
    with DaemonHarness.running(daemon_config(base_dir)) as d:
        d.add(stdio_spec("s", secret_env={"MY_SECRET": ENV_VALUE}))
        assert (
            d.ctl(
                "mcp",
                "add",
                "s2",
                "--secret-env",
                f"OTHER_SECRET={ENV_VALUE}",
                *command_options(MCP_SERVER, "stdio"),
            )
            == 0
        )
        d.wait_ready("s2")
        out = capsys.readouterr()
        assert_no_marker("memorizzctl mcp add", out.out + out.err)
        with d.client() as c:
            seen = c.call_tool("s", "env", {"name": "MY_SECRET"})
            assert seen.content[0]["text"] == ENV_VALUE
            seen = c.call_tool("s2", "env", {"name": "OTHER_SECRET"})
            assert seen.content[0]["text"] == ENV_VALUE
            info = {i.name: i for i in c.list_servers()}
            assert info["s"].secret_env_keys == ["MY_SECRET"]
            assert_no_marker("servers/list", msgspec.json.encode(c.list_servers()))
    assert_state_clean(os.path.join(base_dir, "state"))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"token": None}, "needs a token"),
        ({"auth": "none"}, "needs auth bearer"),
        ({"headers": {"Host": HEADER_VALUE}}, "set by the transport"),
        ({"headers": {"Mcp-Session-Id": HEADER_VALUE}}, "set by the transport"),
        ({"headers": {"Bad Name": HEADER_VALUE}}, "not a valid token"),
        ({"headers": {"authorization": HEADER_VALUE}}, "not also in headers"),
        ({"headers": {HEADER: HEADER_VALUE + "\r\nX: y"}}, "printable"),
        ({"secret_env": {"K": ENV_VALUE}}, "for stdio servers"),
    ],
)
def test_invalid_credentials_are_refused_without_echoing_them(
    overrides: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidParamsError, match=message) as caught:
        check_server_spec(http_spec("a", "http://127.0.0.1:1/mcp", **overrides))
    assert_no_marker("the error", str(caught.value))


def test_stdio_servers_take_no_token_and_no_code_env(daemon: DaemonHarness) -> None:
    with daemon.client() as c:
        for overrides in (
            {"auth": "bearer", "token": TOKEN},
            {"headers": {HEADER: HEADER_VALUE}},
            {"secret_env": {"LD_PRELOAD": ENV_VALUE}},
            {"env": {"K": "1"}, "secret_env": {"K": ENV_VALUE}},
        ):
            with pytest.raises(InvalidParamsError) as caught:
                c.add_server(stdio_spec("x", **overrides))
            assert_no_marker("the error", caught.value.message)


def test_the_cli_reads_the_token_from_stdin_or_a_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    parser = build_parser()
    base = ["mcp", "add", "a", "--url", "https://example.com/mcp"]
    monkeypatch.setattr(sys, "stdin", io.StringIO(TOKEN + "\n"))
    spec = build_server_spec(
        parser.parse_args([*base, "--token", "-", "--header", f"{HEADER}: v"])
    )
    assert (spec.auth, spec.token, spec.headers) == ("bearer", TOKEN, {HEADER: "v"})
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    spec = build_server_spec(
        parser.parse_args([*base, "--auth", "bearer", "--token-file", str(token_file)])
    )
    assert spec.token == TOKEN
