"""Hot reload (``memorizzd.reload``): SIGHUP or ``daemon reload`` re-reads the
config file and applies the difference, keeping what did not change warm.

A real daemon started from a config file, real stdio servers, the real client
and memorizzctl; SIGHUP on a real ``memorizzd`` process.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import msgspec
import pytest

from memorizz import Client
from memorizz.api import methods as m
from memorizz.api.errors import (
    InvalidParamsError,
    NotFoundError,
    PermissionDeniedError,
    RemoteError,
)
from memorizzd.config import load
from tests.harness import (
    LEGACY_SERVER,
    MCP_SERVER,
    DaemonHarness,
    daemon_process,
    launch_args,
    wait_until,
)


def _server(name: str, script: str, **extra: Any) -> dict[str, Any]:
    args = launch_args(script, "stdio") if script == MCP_SERVER else launch_args(script)
    return {
        "name": name,
        "transport": "stdio",
        "command": sys.executable,
        "args": args,
        **extra,
    }


def _write(path: Path, doc: dict[str, Any]) -> None:
    """A TOML file from a dict (strings, numbers, booleans, lists, tables)."""
    lines: list[str] = []
    tables: list[tuple[str, dict[str, Any]]] = []
    arrays: list[tuple[str, dict[str, Any]]] = []
    for key, value in doc.items():
        if isinstance(value, dict):
            tables.append((key, value))
        elif isinstance(value, list) and value and isinstance(value[0], dict):
            arrays += [(key, item) for item in value]
        else:
            lines.append(f"{key} = {_toml(value)}")
    for key, table in tables:
        lines += [f"[{key}]", *(f"{k} = {_toml(v)}" for k, v in table.items())]
    for key, item in arrays:
        lines += [f"[[{key}]]", *(f"{k} = {_toml(v)}" for k, v in item.items())]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _toml(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + "}"
    return msgspec.json.encode(value).decode()  # strings, numbers, lists, bools


def _doc(base_dir: str, **top: Any) -> dict[str, Any]:
    return {
        "socket": os.path.join(base_dir, "d.sock"),
        "state_dir": os.path.join(base_dir, "state"),
        "backoff_initial_s": 0.05,
        "backoff_max_s": 0.5,
        "drain_timeout_s": 10.0,
        **top,
    }


def _pids(c: Client) -> dict[str, int | None]:
    return {s.name: s.pid for s in c.server_status()}


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is gone for our purposes
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def _reload_actions(c: Client) -> list[m.AuditRecord]:
    return [r for r in c.audit(limit=100).records if r.action == "daemon/reload"]


def test_a_reload_applies_the_difference_and_keeps_what_did_not_change(
    base_dir: str,
) -> None:
    config_file = Path(base_dir, "memorizzd.toml")
    gate = os.path.join(base_dir, "gate")
    doc = _doc(
        base_dir,
        servers=[
            _server("keep", MCP_SERVER),
            _server("change", LEGACY_SERVER),
            _server("gone", LEGACY_SERVER),
        ],
        profiles=[
            {"name": "bot", "servers": ["keep", "change"]},
            {"name": "old", "servers": ["keep"]},
        ],
    )
    _write(config_file, doc)
    config = load(str(config_file))
    with DaemonHarness.running(config) as h:
        for name in ("keep", "change", "gone"):
            h.wait_ready(name)
        with h.client() as c:
            old_socket = c.daemon_status().agent_sockets["old"]
            before = _pids(c)
        # a long call on the server that stays, held in flight by the gate
        outcome: dict[str, Any] = {}

        def held_call() -> None:
            with h.client() as held:
                outcome["result"] = held.call_tool("keep", "gate", {"path": gate})

        caller = threading.Thread(target=held_call)
        caller.start()
        keep = h.daemon.pool.get("keep")
        wait_until(lambda: keep.in_flight == 1, what="the held call in flight")

        _write(
            config_file,
            {
                **doc,
                "decisions": {"write": "deny"},
                "mcp_face": False,  # takes a restart
                "servers": [
                    _server("keep", MCP_SERVER),
                    _server("change", LEGACY_SERVER, env={"V": "2"}),
                    _server("new", LEGACY_SERVER),
                ],
                "profiles": [
                    {"name": "bot", "servers": ["keep"]},
                    {"name": "fresh", "servers": ["new"]},
                ],
            },
        )
        with h.client() as c:
            result = c.daemon_reload()
        assert result.servers_unchanged == ["keep"]
        assert result.servers_restarted == ["change"]
        assert result.servers_stopped == ["gone"]
        assert result.servers_started == ["new"]
        assert result.profiles_added == ["fresh"]
        assert result.profiles_removed == ["old"]
        assert result.profiles_changed == ["bot"]
        assert "decisions" in result.settings_changed
        assert result.restart_required == ["mcp_face"]

        # the held call is still in flight on the same session, then completes
        assert caller.is_alive()
        assert keep.in_flight == 1
        assert h.daemon.pool.get("keep") is keep
        Path(gate).touch()
        caller.join(timeout=20)
        assert outcome["result"].content[0]["text"] == "opened"

        h.wait_ready("change")
        h.wait_ready("new")
        with h.client() as c:
            after = _pids(c)
            assert after["keep"] == before["keep"]  # warm, never restarted
            assert after["change"] not in (None, before["change"])
            assert "gone" not in after
            # the policy applies to the next call: write tools are denied now
            with pytest.raises(PermissionDeniedError) as denied:
                c.call_tool("keep", "echo", {"text": "x"})
            assert denied.value.reason == "tool_blocked"
            status = c.daemon_status()
            assert status.last_reload is not None
            assert status.last_reload.ok
            assert status.last_reload.trigger == "api"
            assert set(status.agent_sockets) == {"bot", "fresh"}
            records = _reload_actions(c)
            assert [r.outcome for r in records] == ["ok"]
        gone_pid = before["gone"]
        assert gone_pid is not None
        wait_until(lambda: not _pid_alive(gone_pid), what="the removed server's exit")
        # the removed profile's socket is gone; the new one's works
        assert not os.path.exists(old_socket)
        with Client(status.agent_sockets["fresh"]) as agent:
            assert [t.name for t in agent.list_tools("new")] == ["hello"]
            with pytest.raises(NotFoundError):
                agent.list_tools("keep")  # not in its profile
        # an existing profile's narrowed scope holds at once
        with Client(status.agent_sockets["bot"]) as agent, pytest.raises(NotFoundError):
            agent.list_tools("change")
        # the MCP face stays (mcp_face takes a restart)
        assert os.path.exists(os.path.join(os.path.dirname(h.socket), "mcp.sock"))


def test_an_invalid_file_changes_nothing_and_says_why(
    base_dir: str, capsys: pytest.CaptureFixture[str]
) -> None:
    config_file = Path(base_dir, "memorizzd.toml")
    doc = _doc(base_dir, servers=[_server("one", LEGACY_SERVER)])
    _write(config_file, doc)
    with DaemonHarness.running(load(str(config_file))) as h:
        h.wait_ready("one")
        with h.client() as c:
            pid = _pids(c)["one"]
        config_file.write_text("servers = [ this is not toml\n", encoding="utf-8")
        with h.client() as c:
            with pytest.raises(InvalidParamsError) as refused:
                c.daemon_reload()
            assert refused.value.reason == "invalid_config"
            assert "memorizzd.toml" in refused.value.message
            status = c.daemon_status()
            assert status.last_reload is not None
            assert not status.last_reload.ok
            assert "memorizzd.toml" in status.last_reload.message
            assert _pids(c)["one"] == pid  # untouched
        assert h.ctl("daemon", "status") == 0
        assert "FAILED, nothing changed" in capsys.readouterr().out
        # a server the execution policy refuses: refused the same way
        _write(
            config_file,
            {
                **doc,
                "stdio_allowlist": ["node"],
            },
        )
        assert h.ctl("daemon", "reload") == 1
        assert "invalid configuration, nothing changed" in capsys.readouterr().err
        with h.client() as c:
            assert _pids(c)["one"] == pid
            assert [r.outcome for r in _reload_actions(c)] == ["failed", "failed"]
            assert {r.reason for r in _reload_actions(c)} == {"invalid_config"}
        # a good file again: the error is cleared
        _write(config_file, doc)
        assert h.ctl("daemon", "reload") == 0
        out = capsys.readouterr().out
        assert "servers unchanged: one" in out
        with h.client() as c:
            last = c.daemon_status().last_reload
            assert last is not None
            assert last.ok


def test_sighup_reloads_as_daemon_reload_does(base_dir: str) -> None:
    config_file = Path(base_dir, "memorizzd.toml")
    doc = _doc(base_dir, servers=[_server("one", LEGACY_SERVER)])
    _write(config_file, doc)
    with daemon_process(base_dir, config=str(config_file)) as daemon:
        daemon.wait_ready("one")
        _write(
            config_file,
            {**doc, "servers": [*doc["servers"], _server("two", LEGACY_SERVER)]},
        )
        os.kill(daemon.pid, signal.SIGHUP)
        with Client(daemon.socket) as c:
            wait_until(lambda: _state(c, "two") == "ready", what="two started")
            last = c.daemon_status().last_reload
            assert last is not None
            assert last.ok
            assert last.trigger == "signal"
            (record,) = _reload_actions(c)
            assert record.outcome == "ok"
            assert record.caller_socket == "SIGHUP"
            assert record.caller_pid == daemon.pid


def _state(c: Client, name: str) -> str | None:
    found = [s.state for s in c.server_status() if s.name == name]
    return found[0] if found else None


def test_a_narrowed_host_allowlist_reaches_the_servers_added_through_the_api(
    base_dir: str,
) -> None:
    """A reload that takes a host out of ``host_allowlist`` ended the file's
    sessions to it, but a server added through the API kept its open
    session (and its calls) until it happened to reconnect."""
    from tests.harness import http_spec, serve_http

    path = Path(base_dir, "memorizzd.toml")
    with serve_http("streamable_http") as url:
        _write(path, _doc(base_dir, host_allowlist=["127.0.0.1"]))
        with DaemonHarness.running(load(str(path))) as h, h.client() as c:
            c.add_server(http_spec("web", url, "streamable_http"))
            h.wait_ready("web")
            assert c.call_tool("web", "echo", {"text": "a"}).content[0]["text"] == "a"
            _write(path, _doc(base_dir, host_allowlist=["mcp.example.test"]))
            result = c.daemon_reload()
            assert "web" in result.servers_restarted
            wait_until(lambda: c.server_status("web")[0].state == "failed")
            status = c.server_status("web")[0]
            with pytest.raises(RemoteError) as refused:
                c.call_tool("web", "echo", {"text": "b"})
            # allowed again: it comes back by itself, as at a restart
            _write(path, _doc(base_dir, host_allowlist=["127.0.0.1"]))
            c.daemon_reload()
            h.wait_ready("web")
            assert c.call_tool("web", "echo", {"text": "c"}).content[0]["text"] == "c"
    assert "host_not_allowed" in (status.last_error or ""), status
    assert refused.value.reason == "server_unavailable", refused.value
    assert "host_not_allowed" in refused.value.message
