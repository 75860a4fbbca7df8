"""Hostile config files and reloads, from the outside: every bad file is one
``invalid configuration`` that says where (never a traceback, never "internal
error"), a reload of one keeps the config in force, and a SIGHUP storm with
calls in flight loses nothing.

Each case here was a defect found by outside testing: a file that is not
UTF-8 or nests too deeply crashed ``--check-config`` and the start and was an
"internal error" to ``daemon reload``; ``nan`` and ``inf`` passed the range
checks (a ``nan`` drain crashed the daemon at SIGTERM, an ``inf`` approval TTL
broke every proposal); a NUL in a command, a malformed URL in ``roots`` or a
socket path too long for AF_UNIX crashed the start; ``servers = {}`` and a
duplicate name did not say where; and a reload that changed ``[metrics]`` or
``[tracing]`` said it applied what takes a restart.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from memorizz import Client
from memorizz.api.errors import InvalidParamsError
from memorizzd.config import ConfigError, load
from tests.harness import (
    DAEMON_EXE,
    LEGACY_SERVER,
    MCP_SERVER,
    DaemonHarness,
    daemon_config,
    daemon_process,
    launch_args,
    wait_until,
)

_ONE = f"""
[[servers]]
name = "one"
transport = "stdio"
command = "{sys.executable}"
args = ["{LEGACY_SERVER}"]
"""


def _head(base: str) -> str:
    return (
        f'socket = "{base}/d.sock"\nstate_dir = "{base}/state"\n'
        "backoff_initial_s = 0.05\n"
    )


def _stdio(name: str, command: str = "/bin/true", extra: str = "") -> str:
    return (
        f'[[servers]]\nname = "{name}"\ntransport = "stdio"\n'
        f'command = "{command}"\n{extra}'
    )


@pytest.mark.parametrize(
    ("content", "message"),
    [
        pytest.param(
            b'backoff_max_s = 1.0\nstdio_allowlist = ["caf\xe9"]\n',
            r": not UTF-8 text: byte 0xe9 \(at line 2, column 24\)$",
            id="not-utf8",
        ),
        pytest.param(
            b"a = " + b"[" * 3000 + b"]" * 3000 + b"\n",
            r": arrays or inline tables nested too deeply$",
            id="nested",
        ),
        pytest.param(
            b"servers = {}\n",
            r": Expected `array`, got `object` - at `\$\.servers`$",
            id="servers-table",
        ),
        pytest.param(
            b"drain_timeout_s = nan\n",
            r": drain_timeout_s must be a finite number, not nan$",
            id="nan",
        ),
        pytest.param(
            b"approval_ttl_s = inf\n",
            r": approval_ttl_s must be a finite number, not inf$",
            id="inf",
        ),
        pytest.param(
            b'[[profiles]]\nname = "a"\nuids = [1000]\n'
            b"[profiles.limits]\nwrite_timeout_s = inf\n",
            r": profile 'a': limits\.write_timeout_s must be a finite number, not inf$",
            id="profile-inf",
        ),
        pytest.param(
            b"face_approval_wait_s = -1.0\n",
            r": face_approval_wait_s must not be negative$",
            id="negative-wait",
        ),
        pytest.param(
            (_stdio("h") + _stdio("h")).encode(),
            r": \$\.servers\[1\]: duplicate server name 'h' \(also \$\.servers\[0\]\)$",
            id="duplicate",
        ),
        pytest.param(
            _stdio("h", "/bin/\\u0000true").encode(),
            r": \$\.servers\[0\]\.command: a NUL character is not allowed$",
            id="nul-command",
        ),
        pytest.param(
            _stdio("h", extra='roots = ["file://[::1/x"]\n').encode(),
            r": \$\.servers\[0\]: server 'h': a root must be a file:// URI",
            id="malformed-root",
        ),
        pytest.param(
            b"[operators]\nsocket_group = 4294967296\n",
            r": operators\.socket_group: gid 4294967296 is out of range",
            id="gid-out-of-range",
        ),
        pytest.param(
            ('socket = "/tmp/' + "s" * 120 + '.sock"\n').encode(),
            r": socket: '/tmp/s+\.sock' is 130 bytes long; a Unix socket's path"
            r" may be at most 107$",
            id="socket-too-long",
        ),
        pytest.param(
            b'socket = "/tmp/mz-probe/mcp.sock"\n',
            r": socket and mcp_face would both be bound at '/tmp/mz-probe/mcp\.sock';"
            r" give each a path of its own \(the daemon binds mcp\.sock and"
            r" metrics\.sock beside the socket\)$",
            id="socket-named-as-its-face",  # "another memorizzd is listening"
        ),
        pytest.param(
            b'socket = "/tmp/mz-probe/d.sock"\n'
            b'[metrics]\nsocket = "/tmp/mz-probe/d.sock"\n',
            r": socket and metrics\.socket would both be bound at",
            id="metrics-on-the-socket",
        ),
    ],
)
def test_a_hostile_file_is_one_config_error_that_says_where(
    base_dir: str, content: bytes, message: str
) -> None:
    path = Path(base_dir, "memorizzd.toml")
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=message) as refused:
        load(str(path), state_dir=os.path.join(base_dir, "state"))
    assert str(refused.value).startswith(f"{path}: ")


def test_check_config_refuses_an_unreadable_file_in_one_line(base_dir: str) -> None:
    path = Path(base_dir, "memorizzd.toml")
    for content in (
        b'socket = "/run/m/\xff.sock"\n',
        _stdio("h", "/bin/\\u0000true").encode(),
    ):
        path.write_bytes(content)
        check = subprocess.run(  # noqa: PLW1510 - the exit status is the assertion
            [DAEMON_EXE, "--config", str(path), "--check-config"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert check.returncode == 78, check.stderr
        assert check.stderr.startswith("memorizzd: invalid configuration: "), (
            check.stderr
        )
        assert check.stderr.count("\n") == 1, check.stderr


def test_a_reload_of_a_file_that_does_not_parse_keeps_the_config_and_says_where(
    base_dir: str,
) -> None:
    with _running_one(base_dir) as (path, good, c):
        (before,) = [s.pid for s in c.server_status()]
        for content, where in (
            (good.encode() + b"# caf\xe9\n", "not UTF-8 text: byte 0xe9 (at line"),
            (b"x = " + b"[" * 3000 + b"]" * 3000, "nested too deeply"),
        ):
            path.write_bytes(content)
            _reload_refused(c, "invalid_config", where)
            assert [s.pid for s in c.server_status()] == [before]
        records = [r for r in c.audit(limit=10).records if r.action == "daemon/reload"]
        assert [(r.outcome, r.reason) for r in records] == [
            ("failed", "invalid_config")
        ] * 2


def test_a_reload_that_fails_half_way_is_refused_whole(base_dir: str) -> None:
    """A changed profile's socket_group out of range (chown's OverflowError,
    once mid-reload): refused as invalid_config, and nothing of the file is
    in force, its [decisions] neither."""
    path = Path(base_dir, "memorizzd.toml")
    head = _head(base_dir) + _ONE
    path.write_text(head + '[[profiles]]\nname = "p"\n', encoding="utf-8")
    with DaemonHarness.running(load(str(path))) as h:
        h.wait_ready("one")
        path.write_text(
            head
            + '[decisions]\nwrite = "deny"\n'
            + '[[profiles]]\nname = "p"\nsocket_group = -5\n',
            encoding="utf-8",
        )
        with h.client() as c:
            with pytest.raises(InvalidParamsError) as refused:
                c.daemon_reload()
            assert refused.value.reason == "invalid_config"
            assert "profile 'p': socket_group: gid -5 is out of range" in (
                refused.value.message
            )
            # the legacy server's one tool is a write: still allowed
            assert c.call_tool("one", "hello", {}).content[0]["text"] == (
                "hello from legacy"
            )


def test_a_reload_lists_metrics_tracing_and_credentials_as_taking_a_restart(
    base_dir: str,
) -> None:
    path = Path(base_dir, "memorizzd.toml")
    head = _head(base_dir)
    path.write_text(head, encoding="utf-8")
    with DaemonHarness.running(load(str(path))) as h, h.client() as c:
        path.write_text(
            head
            + "connect_wait_s = 2.0\n"
            + '[metrics]\nlisten = "127.0.0.1:9"\n'
            + '[tracing]\nservice_name = "other"\n'
            + '[credentials]\nstores = ["vault"]\n',
            encoding="utf-8",
        )
        result = c.daemon_reload()
        assert result.settings_changed == ["connect_wait_s"]
        assert sorted(result.restart_required) == [
            "credentials.stores",
            "metrics",
            "tracing",
        ]
        # nothing of them was applied: the metrics socket is the start's
        assert not os.path.exists(os.path.join(base_dir, "9"))
        assert h.daemon.reloader.config.metrics.listen == ""


def test_a_sighup_storm_with_calls_in_flight_loses_nothing(base_dir: str) -> None:
    """40 SIGHUPs while calls are held in flight, over files replaced whole
    (rename) that add and remove one server and change another: every reload
    is ok, the held calls on the server that stays and on the one the last
    file removes all finish, and the servers are the last file's."""
    path = Path(base_dir, "memorizzd.toml")
    gate = os.path.join(base_dir, "gate")
    launch = repr(launch_args(MCP_SERVER, "stdio"))
    head = "backoff_initial_s = 0.05\ndrain_timeout_s = 20.0\n"
    stays = _stdio("stays", sys.executable, f"args = {launch}\n")
    goes = _stdio("goes", sys.executable, f"args = {launch}\n")

    def changes(n: int) -> str:
        return _stdio("changes", sys.executable, f'args = ["{LEGACY_SERVER}"]\n') + (
            f'env = {{ N = "{n}" }}\n'
        )

    def replace(text: str) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)

    replace(head + stays + goes + changes(0))
    with daemon_process(base_dir, config=str(path)) as daemon:
        for name in ("stays", "goes", "changes"):
            daemon.wait_ready(name)
        outcomes: dict[str, Any] = {}

        def held(key: str, server: str) -> None:
            try:
                with Client(daemon.socket) as c:
                    outcomes[key] = c.call_tool(server, "gate", {"path": gate})
            except Exception as exc:  # noqa: BLE001 - the assertion says which
                outcomes[key] = exc

        callers = [
            threading.Thread(target=held, args=(f"{server}{i}", server))
            for server in ("stays", "goes")
            for i in range(2)
        ]
        for caller in callers:
            caller.start()
        with Client(daemon.socket) as c:
            wait_until(
                lambda: sum(s.in_flight for s in c.server_status()) == 4,
                what="four calls in flight",
            )
            for i in range(1, 41):
                replace(head + stays + (goes if i % 2 else "") + changes(i))
                os.kill(daemon.pid, signal.SIGHUP)
            replace(head + stays + changes(41))  # the last word: "goes" is gone
            os.kill(daemon.pid, signal.SIGHUP)
            wait_until(
                lambda: (
                    "goes" not in {s.name for s in c.server_status()}
                    and _last_reload_ok(c)
                ),
                what="the last reload",
            )
            Path(gate).touch()
            for caller in callers:
                caller.join(timeout=30)
            assert {k: _text(v) for k, v in outcomes.items()} == dict.fromkeys(
                ("stays0", "stays1", "goes0", "goes1"), "opened"
            )
            reloads = [
                r for r in c.audit(limit=1000).records if r.action == "daemon/reload"
            ]
            assert reloads  # signals merge: as many reloads as the kernel kept
            assert {r.outcome for r in reloads} == {"ok"}
            wait_until(
                lambda: (
                    {s.name: s.state for s in c.server_status()}
                    == {"stays": "ready", "changes": "ready"}
                ),
                what="the last file's servers, ready",
            )
            assert c.call_tool("changes", "hello", {}).content[0]["text"] == (
                "hello from legacy"
            )
        assert daemon.running


def test_a_reload_without_a_config_file_says_there_is_none(
    base_dir: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A daemon started without a config file has nothing to re-read. The
    reload was refused as ``invalid_config`` ("invalid configuration"), as if
    a file were at fault; now its reason is ``no_config_file``, and
    ``memorizzctl daemon reload`` says so, on stderr and with ``--json``."""
    with DaemonHarness.running(daemon_config(base_dir)) as h:
        assert h.ctl("daemon", "reload") == 1
        out, err = capsys.readouterr()
        assert out == ""
        assert err.startswith("memorizzctl: error: "), err
        assert "no config file" in err, err
        assert err.endswith(" (no_config_file)\n"), err
        assert "invalid" not in err, err
        assert h.ctl("--json", "daemon", "reload") == 1
        out, err = capsys.readouterr()
        assert err == ""
        assert msgspec.json.decode(out)["error"]["reason"] == "no_config_file"
        with h.client() as c:
            _reload_refused(c, "no_config_file", "no config file")
            records = [
                r for r in c.audit(limit=10).records if r.action == "daemon/reload"
            ]
            assert {(r.outcome, r.reason) for r in records} == {
                ("failed", "no_config_file")
            }


@pytest.mark.parametrize("kind", ["fifo", "name_too_long", "directory"])
def test_a_config_path_that_is_not_a_readable_file_is_refused_where_it_is(
    base_dir: str, kind: str
) -> None:
    """The config file replaced by a FIFO: a reload blocked for ever on it,
    holding the reload lock (every later reload waited behind it). By a link
    whose target's name is too long for the kernel: ``load`` let the
    ``OSError`` out, and the reload ended as an internal error. Now each is
    ``invalid_config`` saying what the path is, kept for ``daemon/status``,
    and the config in force is unchanged; the file put back reloads."""
    with _running_one(base_dir) as (path, good, c):
        path.unlink()
        if kind == "fifo":
            os.mkfifo(path)
            said = "not a regular file"
        elif kind == "directory":
            path.mkdir()
            said = "not a regular file"
        else:
            path.symlink_to(os.path.join(base_dir, "s" * 300))
            said = "File name too long"
        _reload_refused(c, "invalid_config", said)
        assert c.call_tool("one", "hello", {}).content[0]["text"] == (
            "hello from legacy"
        )
        if kind == "directory":
            path.rmdir()
        else:
            path.unlink()
        path.write_text(good, encoding="utf-8")
        c.daemon_reload()
        again = c.daemon_status().last_reload
        assert again is not None
        assert again.ok


@pytest.mark.parametrize("option", ["--socket", "--state-dir", "--config"])
@pytest.mark.parametrize("spelling", ["apart", "joined"])
def test_memorizzd_refuses_an_empty_path_as_a_usage_error(
    base_dir: str, option: str, spelling: str
) -> None:
    """``memorizzd --socket ""`` (an unset variable, most likely) served on
    the default socket, as if no option were given; an empty ``--state-dir``
    used the default state directory, an empty ``--config`` read ".". Now
    each is a usage error (exit 2), as ``memorizzctl --socket ""`` is."""
    path = Path(base_dir, "memorizzd.toml")
    path.write_text(_head(base_dir), encoding="utf-8")
    given = {
        "--config": str(path),
        "--socket": os.path.join(base_dir, "d.sock"),
        "--state-dir": os.path.join(base_dir, "state"),
    }
    argv: list[str] = []
    for name, value in given.items():
        if name != option:
            argv += [name, value]
        elif spelling == "apart":
            argv += [name, ""]
        else:
            argv.append(f"{name}=")
    check = subprocess.run(  # noqa: PLW1510 - the exit status is the assertion
        [DAEMON_EXE, *argv, "--check-config"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert check.returncode == 2, (check.stdout, check.stderr)
    assert check.stdout == ""
    assert check.stderr.startswith("usage: memorizzd"), check.stderr
    assert check.stderr.endswith(
        f"memorizzd: error: argument {option}: an empty path\n"
    ), check.stderr


@contextlib.contextmanager
def _running_one(base_dir: str) -> Iterator[tuple[Path, str, Client]]:
    """A daemon on a config file serving ``one`` (ready), and a client of it:
    the file's path, its text and the client."""
    path = Path(base_dir, "memorizzd.toml")
    good = _head(base_dir) + _ONE
    path.write_text(good, encoding="utf-8")
    with DaemonHarness.running(load(str(path))) as h:
        h.wait_ready("one")
        with h.client() as c:
            yield path, good, c


def _reload_refused(c: Client, reason: str, said: str) -> None:
    """``daemon/reload`` is refused for ``reason``, saying ``said``, and
    ``daemon/status`` keeps the failure."""
    with pytest.raises(InvalidParamsError) as refused:
        c.daemon_reload()
    assert refused.value.reason == reason
    assert said in refused.value.message, refused.value.message
    last = c.daemon_status().last_reload
    assert last is not None
    assert not last.ok
    assert said in last.message, last.message


def _last_reload_ok(c: Client) -> bool:
    last = c.daemon_status().last_reload
    return last is not None and last.ok


def _text(outcome: object) -> object:
    content = getattr(outcome, "content", None)
    return content[0]["text"] if content else repr(outcome)
