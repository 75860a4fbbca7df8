"""The stdio execution policy: resolution, the allowlist, inline code, PATH swapping."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from memorizz.api.errors import (
    InvalidParamsError,
    PermissionDeniedError,
    UnavailableError,
)
from memorizz.api.methods import ServerSpec
from memorizzd.config import Config, ConfigError
from memorizzd.execution import (
    CommandNotAllowedError,
    CommandNotFoundError,
    check_config_servers,
    resolve_command,
)
from tests.harness import (
    DAEMON_EXE,
    MCP_SERVER,
    DaemonHarness,
    daemon_config,
    stdio_spec,
    wait_until,
)

FAKES = [
    *("python", "python3", "python3.11", "pypy3", "sh", "bash", "dash", "zsh", "fish"),
    *("node", "nodejs", "bun", "deno", "perl", "ruby", "php", "lua", "luajit"),
    *("Rscript", "julia", "osascript", "expect", "pwsh", "powershell", "npx", "npm"),
    *("pnpm", "uv", "uvx", "timeout", "nice", "busybox", "su", "env", "mcp-server"),
]


def _executable(path: Path, text: str = "#!/bin/sh\nexit 0\n") -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


@pytest.fixture
def bin_dir(tmp_path: Path) -> Path:
    """A directory of do-nothing executables named like interpreters."""
    d = tmp_path / "bin"
    d.mkdir()
    for name in FAKES:
        _executable(d / name)
    (d / "helper").symlink_to(d / "python3")  # python under another name
    return d


def _spec(argv: str, **fields: object) -> ServerSpec:
    command, *args = argv.split(" ")
    return ServerSpec(name="s", transport="stdio", command=command, args=args, **fields)


def _resolve(
    argv: str,
    path: Path | str,
    *,
    allowlist: list[str] | None = None,
    inline: bool = False,
    **fields: object,
) -> ServerSpec:
    return resolve_command(
        _spec(argv, **fields),
        allowlist=allowlist or [],
        allow_inline_code=inline,
        path=str(path),
    )


# --- resolution -----------------------------------------------------------------


def test_a_bare_name_is_pinned_to_an_absolute_path(bin_dir: Path) -> None:
    spec = _spec("mcp-server --flag", env={"K": "v"}, timeout_s=7.0)
    resolved = resolve_command(
        spec, allowlist=[], allow_inline_code=False, path=f"/nonexistent:{bin_dir}"
    )
    assert resolved.command == str(bin_dir / "mcp-server")
    assert resolved.args == ["--flag"]
    assert (resolved.env, resolved.timeout_s, resolved.name) == ({"K": "v"}, 7.0, "s")
    assert spec.command == "mcp-server"  # a copy; the input is unchanged


def test_the_servers_own_path_is_the_one_the_child_gets(
    bin_dir: Path, tmp_path: Path
) -> None:
    other = tmp_path / "other"
    other.mkdir()
    _executable(other / "mcp-server")
    resolved = _resolve("mcp-server", bin_dir, env={"PATH": str(other)})
    assert resolved.command == str(other / "mcp-server")


def test_relative_path_entries_are_never_searched(
    bin_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _executable(tmp_path / "only-here")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CommandNotFoundError):
        _resolve("only-here", f":.:{bin_dir}")


def test_a_relative_command_is_taken_from_the_servers_cwd(tmp_path: Path) -> None:
    (tmp_path / "srv").mkdir()
    _executable(tmp_path / "srv" / "run")
    resolved = _resolve("./run", "/nonexistent", cwd=str(tmp_path / "srv"))
    assert resolved.command == str(tmp_path / "srv" / "run")


def test_an_absolute_command_is_kept_as_given(bin_dir: Path) -> None:
    # Already pinned: not looked up, and not canonicalised (a venv's bin/python
    # is a symlink whose own location matters).
    assert _resolve(str(bin_dir / "helper"), "/x").command == str(bin_dir / "helper")
    assert _resolve("/nonexistent/srv", "/x").command == "/nonexistent/srv"


def test_an_unknown_bare_name_is_invalid(bin_dir: Path) -> None:
    with pytest.raises(CommandNotFoundError) as err:
        _resolve("no-such-server", bin_dir)
    assert isinstance(err.value, InvalidParamsError)
    assert err.value.reason == "invalid_params"
    assert "no-such-server" in err.value.message


def test_http_specs_pass_through_unchanged() -> None:
    spec = ServerSpec(name="h", transport="streamable_http", url="https://x.test/mcp")
    assert resolve_command(spec, allowlist=["nothing"], allow_inline_code=False) is spec


# --- the allowlist -------------------------------------------------------------------


def test_allowlist_by_name_means_the_file_on_the_daemons_path(
    bin_dir: Path, tmp_path: Path
) -> None:
    assert _resolve("mcp-server", bin_dir, allowlist=["mcp-server"]).command == str(
        bin_dir / "mcp-server"
    )
    # Same name elsewhere (here through the server's own PATH): not that file.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    _executable(elsewhere / "mcp-server")
    for argv, env in (
        ("mcp-server", {"PATH": str(elsewhere)}),
        (str(elsewhere / "mcp-server"), {}),
    ):
        with pytest.raises(CommandNotAllowedError) as err:
            _resolve(argv, bin_dir, allowlist=["mcp-server"], env=env)
        assert err.value.reason == "command_not_allowed"
        assert err.value.data["command"] == str(elsewhere / "mcp-server")


def test_allowlist_by_absolute_path(bin_dir: Path) -> None:
    target = str(bin_dir / "mcp-server")
    assert _resolve("mcp-server", bin_dir, allowlist=[target]).command == target
    assert _resolve(target, "/x", allowlist=[target]).command == target
    with pytest.raises(CommandNotAllowedError) as err:
        _resolve("node", bin_dir, allowlist=[target])
    assert f"{bin_dir / 'node'} is not in the stdio allowlist" in err.value.message


def test_allowlist_and_symlinks(bin_dir: Path, tmp_path: Path) -> None:
    # An entry may name the real file behind a symlink ...
    assert _resolve(
        "helper", bin_dir, allowlist=[str(bin_dir / "python3")]
    ).command == (str(bin_dir / "helper"))
    # ... and the same name reached through a linked directory is the same program
    # (/bin/sh and /usr/bin/sh on merged-/usr).
    linked = tmp_path / "linked"
    linked.symlink_to(bin_dir)
    entry = str(bin_dir / "node")
    assert _resolve(str(linked / "node"), "/x", allowlist=[entry]).command == str(
        linked / "node"
    )
    # But the same real file under another name is not: multi-call binaries
    # (busybox) act by the name they are run as.
    real = _executable(tmp_path / "multicall")
    (tmp_path / "true").symlink_to(real)
    (tmp_path / "sh").symlink_to(real)
    with pytest.raises(CommandNotAllowedError):
        _resolve(str(tmp_path / "sh"), "/x", allowlist=[str(tmp_path / "true")])


def test_allowlist_looks_through_env(bin_dir: Path) -> None:
    allow = ["env", "mcp-server"]
    assert _resolve("env FOO=1 mcp-server", bin_dir, allowlist=allow).command == str(
        bin_dir / "env"
    )
    with pytest.raises(CommandNotAllowedError) as err:
        _resolve("env FOO=1 node server.js", bin_dir, allowlist=allow)
    assert f"{bin_dir / 'node'} is not in the stdio allowlist" in err.value.message
    with pytest.raises(CommandNotAllowedError):  # env's own PATH= is followed
        _resolve("env PATH=/usr/bin:/bin true", bin_dir, allowlist=allow)
    with pytest.raises(CommandNotAllowedError):
        _resolve("env -S mcp-server", bin_dir, allowlist=allow, inline=True)


def test_allowlist_refuses_loader_variables(bin_dir: Path) -> None:
    for key in ("LD_PRELOAD", "LD_AUDIT", "LD_LIBRARY_PATH"):
        with pytest.raises(CommandNotAllowedError) as err:
            _resolve(
                "mcp-server", bin_dir, allowlist=["mcp-server"], env={key: "/tmp/x.so"}
            )
        assert key in err.value.message
    # Without an allowlist any executable may run anyway.
    _resolve("mcp-server", bin_dir, env={"LD_LIBRARY_PATH": "/opt/lib"})


def test_allowlist_entries_must_be_names_or_absolute_paths() -> None:
    with pytest.raises(ConfigError, match="must be an executable name"):
        check_config_servers(Config(stdio_allowlist=["bin/tool"]))


# --- inline code ------------------------------------------------------------------------

ONE_LINERS = [
    "python -c x",
    "python3 -Ic x",
    "python3.11 -cprint(1)",
    "pypy3 -W ignore -c x",
    "sh -c x",
    "bash -lc x",
    "dash -ec x",
    "zsh -o pipefail -c x",
    "fish --command x",
    "node -e x",
    "node --eval=x",
    "node -pe x",
    "node --import data:text/javascript,x",
    "node --title t -e x",
    "nodejs -p x",
    "bun -e x",
    "bun run --eval x",
    "deno eval x",
    "deno run data:text/javascript,x",
    "perl -e x",
    "perl -wle x",
    "perl -0777ne x",
    "perl -Mstrict;print(1) s.pl",
    "ruby -rjson -e x",
    "php -r x",
    "lua -e x",
    "luajit -e x",
    "Rscript -e x",
    "julia -E x",
    "osascript -e x",
    "expect -c x",
    "pwsh -Command x",
    "pwsh -c x",
    "pwsh -NoProfile -ExecutionPolicy Bypass -Com x",
    "powershell -ec x",
    "env X=1 python -c x",
    "env -i PATH=/usr/bin python3 -c x",
    "env -u HOME -- sh -c x",
    "env env bash -lc x",
    "env -S python",
    "npx -c x",
    "npx --call=x",
    "npm exec -c x",
    "pnpm dlx -c x",
    "uv run python -c x",
    "uv run --with httpx -- python -c x",
    "uvx --from pkg python -c x",
    "timeout 5 sh -c x",
    "nice -n 5 env A=1 timeout 3 bash -xc x",
    "busybox sh -c x",
    "su -c x",
    "helper -c x",
]
SCRIPTS = [
    "python server.py -c config.toml",
    "python -m pkg.server -c x",
    "python3 -W ignore -X dev server.py -c",
    "python -",
    "bash script.sh -c x",
    "sh -o pipefail script.sh -c x",
    "node --no-warnings dist/index.js -p 8080",
    "node server.js -e",
    "bun run server.ts -e",
    "deno run -A server.ts --eval",
    "perl -Mstrict -I lib server.pl -e",
    "perl -ie x",
    "ruby -r json server.rb -e",
    "php server.php -r",
    "pwsh -NoProfile -File server.ps1 -Command x",
    "npx -y @modelcontextprotocol/server-filesystem /srv",
    "uv run server.py",
    "uvx mcp-server-fetch",
    "env X=1 python server.py -c",
    "helper server.py -c",
]


@pytest.mark.parametrize("argv", ONE_LINERS)
def test_interpreter_one_liners_are_refused(bin_dir: Path, argv: str) -> None:
    with pytest.raises(CommandNotAllowedError) as err:
        _resolve(argv, bin_dir)
    assert err.value.reason == "command_not_allowed"
    assert "inline code" in err.value.message
    assert _resolve(argv, bin_dir, inline=True).command.startswith(str(bin_dir))


@pytest.mark.parametrize("argv", SCRIPTS)
def test_interpreters_running_files_are_fine(bin_dir: Path, argv: str) -> None:
    _resolve(argv, bin_dir)


@pytest.mark.parametrize(
    "env",
    [
        {"NODE_OPTIONS": "--import=data:text/javascript,x"},
        {"NODE_OPTIONS": "--max-old-space-size=512 -e x"},
        {"BASH_ENV": "$(touch /tmp/x)"},
        {"BASH_FUNC_ls%%": "() { id; }"},
        {"PERL5OPT": "-Mstrict;system(1)"},
    ],
)
def test_code_in_the_environment_is_refused(bin_dir: Path, env: dict[str, str]) -> None:
    with pytest.raises(CommandNotAllowedError):
        _resolve("node server.js", bin_dir, env=env)
    assignments = [f"{k}={v}" for k, v in env.items()]
    trampoline = ServerSpec(
        name="s", transport="stdio", command="env", args=[*assignments, "sh"]
    )
    with pytest.raises(CommandNotAllowedError):  # also as env's assignments
        resolve_command(
            trampoline, allowlist=[], allow_inline_code=False, path=str(bin_dir)
        )
    _resolve("node server.js", bin_dir, env=env, inline=True)


def test_environment_without_code_is_fine(bin_dir: Path) -> None:
    _resolve(
        "node server.js",
        bin_dir,
        env={"NODE_OPTIONS": "--max-old-space-size=512", "BASH_ENV": "/etc/x.sh"},
    )


# --- through the daemon ---------------------------------------------------------------------


@pytest.fixture
def allowlisted(base_dir: str) -> Iterator[DaemonHarness]:
    """A daemon whose stdio allowlist is this Python (by absolute path)."""
    config = daemon_config(base_dir, stdio_allowlist=[sys.executable])
    with DaemonHarness.running(config) as harness:
        yield harness


def test_the_daemon_runs_an_allowed_interpreter_with_a_script(
    allowlisted: DaemonHarness,
) -> None:
    allowlisted.add(stdio_spec("ok"))
    with allowlisted.client() as c:
        assert c.call_tool("ok", "echo", {"text": "hi"}).content[0]["text"] == "hi"
        assert c.list_servers()[0].command == sys.executable


def test_the_daemon_refuses_other_executables(allowlisted: DaemonHarness) -> None:
    with allowlisted.client() as c:
        with pytest.raises(PermissionDeniedError) as err:
            c.add_server(stdio_spec("no", command="/bin/true", args=[]))
        assert err.value.reason == "command_not_allowed"
        assert err.value.data["server"] == "no"
        assert "stdio allowlist" in err.value.message
        assert c.list_servers() == []
    assert allowlisted.ctl("mcp", "add", "no", "--command", "/bin/true") == 77


def test_the_daemon_refuses_one_liners_unless_allowed(base_dir: str) -> None:
    runner = (
        "import runpy, sys; sys.argv = [sys.argv[1], 'stdio'];"
        " runpy.run_path(sys.argv[0], run_name='__main__')"
    )
    one_liner = stdio_spec("inline", args=["-c", runner, MCP_SERVER])
    with DaemonHarness.running(daemon_config(base_dir)) as daemon:
        with daemon.client() as c:
            with pytest.raises(PermissionDeniedError) as err:
                c.add_server(one_liner)
            assert err.value.reason == "command_not_allowed"
            assert "-c" in err.value.message
            with pytest.raises(PermissionDeniedError):
                c.add_server(
                    stdio_spec("env", command="env", args=["X=1", "python3", "-c", "1"])
                )
        assert (
            daemon.ctl("mcp", "add", "sh", "--command", "sh", "--arg=-c", "--arg=true")
            == 77
        )
    config = daemon_config(os.path.join(base_dir, "2"), stdio_allow_inline_code=True)
    with DaemonHarness.running(config) as daemon:
        daemon.add(one_liner)
        with daemon.client() as c:
            assert (
                c.call_tool("inline", "add", {"a": 1, "b": 2}).content[0]["text"] == "3"
            )


def test_an_unknown_bare_name_is_refused_at_add(daemon: DaemonHarness) -> None:
    with (
        daemon.client() as c,
        pytest.raises(InvalidParamsError, match="not found on PATH"),
    ):
        c.add_server(stdio_spec("x", command="no-such-mcp-server-here"))


def _fake_mcp(directory: Path, mark: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    _executable(
        directory / "fake-mcp",
        f"#!/bin/sh\nMARK={mark}\nexport MARK\nexec {sys.executable} {MCP_SERVER} stdio\n",
    )


def test_path_swapping_cannot_change_what_runs(
    base_dir: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    _fake_mcp(a, "from-a")
    _fake_mcp(b, "from-b")
    original = os.environ["PATH"]
    monkeypatch.setenv("PATH", f"{a}:{original}")
    # By name, on the allowlist by name: resolved once, with the daemon's PATH.
    config = daemon_config(base_dir, stdio_allowlist=["fake-mcp"])

    def mark(daemon: DaemonHarness) -> str:
        with daemon.client() as c:
            text: str = c.call_tool("f", "env", {"name": "MARK"}).content[0]["text"]
            return text

    with DaemonHarness.running(config) as daemon:
        daemon.add(stdio_spec("f", command="fake-mcp", args=[]))
        with daemon.client() as c:
            assert c.list_servers()[0].command == str(a / "fake-mcp")
        assert mark(daemon) == "from-a"
        # Another fake-mcp first on PATH; the child dies and is respawned.
        monkeypatch.setenv("PATH", f"{b}:{a}:{original}")
        with daemon.client() as c:
            pid = c.server_status("f")[0].pid
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
            wait_until(lambda: c.server_status("f")[0].pid not in (None, pid))
        assert mark(daemon) == "from-a"
    # After a restart, from the state database: still a's.
    with DaemonHarness.running(daemon_config(base_dir)) as daemon:
        daemon.wait_ready("f")
        assert mark(daemon) == "from-a"
    # The allowlisted name now means b's fake-mcp, so a's is refused: fail closed.
    with DaemonHarness.running(config) as daemon, daemon.client() as c:
        status = c.server_status("f")[0]
        assert status.state == "failed"
        assert status.last_error == (
            f"command not allowed: {a / 'fake-mcp'} is not in the stdio allowlist"
        )


def test_a_stored_server_no_longer_allowed_is_not_started(base_dir: str) -> None:
    with DaemonHarness.running(daemon_config(base_dir)) as daemon:
        daemon.add(stdio_spec("kept"))
    config = daemon_config(base_dir, stdio_allowlist=["/bin/true"])
    with DaemonHarness.running(config) as daemon, daemon.client() as c:
        status = c.server_status("kept")[0]
        assert status.state == "failed"
        assert status.pid is None
        assert (status.last_error or "").startswith("command not allowed: ")
        assert sys.executable in (status.last_error or "")
        assert c.list_servers()[0].state == "failed"
        with pytest.raises(UnavailableError, match="command not allowed"):
            c.call_tool("kept", "echo", {"text": "x"})
        c.remove_server("kept")  # the operator can still remove it
        assert c.list_servers() == []


def test_a_config_server_not_allowed_stops_the_daemon(base_dir: str) -> None:
    config = daemon_config(
        base_dir, stdio_allowlist=["/bin/true"], servers=[stdio_spec("cfg")]
    )
    with (
        pytest.raises(ConfigError, match=r"server 'cfg'.*command not allowed"),
        DaemonHarness.running(config),
    ):
        pass
    assert not os.path.exists(config.socket)


def test_a_config_server_not_found_is_shown_failed(base_dir: str) -> None:
    config = daemon_config(
        base_dir, servers=[stdio_spec("gone", command="no-such-mcp-server-here")]
    )
    with DaemonHarness.running(config) as daemon, daemon.client() as c:
        status = c.server_status("gone")[0]
        assert status.state == "failed"
        assert status.last_error == "executable not found: no-such-mcp-server-here"


def _config_file(base: str, body: str) -> str:
    path = os.path.join(base, "memorizzd.toml")
    with open(path, "w", encoding="utf-8") as f:
        f.write(body)
    return path


@pytest.mark.parametrize(
    ("body", "env", "expected"),
    [
        (
            (
                f"[[servers]]\nname = 'oneliner'\ntransport = 'stdio'\n"
                f"command = {sys.executable!r}\nargs = ['-c', 'pass']\n"
            ),
            {},
            "server 'oneliner'): command not allowed: ",
        ),
        (
            (
                f"[[servers]]\nname = 'py'\ntransport = 'stdio'\n"
                f"command = {sys.executable!r}\nargs = [{MCP_SERVER!r}, 'stdio']\n"
            ),
            {"MEMORIZZ_MCP_STDIO_ALLOWLIST": "/bin/true,node"},
            "is not in the stdio allowlist",
        ),
    ],
)
def test_the_real_daemon_exits_78_naming_the_server(
    base_dir: str, body: str, env: dict[str, str], expected: str
) -> None:
    config = _config_file(base_dir, body)
    for extra in (["--check-config"], []):
        proc = subprocess.run(
            [
                DAEMON_EXE,
                "--config",
                config,
                "--socket",
                os.path.join(base_dir, "d.sock"),
                "--state-dir",
                os.path.join(base_dir, "state"),
                *extra,
            ],
            env=os.environ | env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert proc.returncode == 78, proc.stderr
        assert proc.stderr.startswith("memorizzd: invalid configuration: ")
        assert expected in proc.stderr
        assert not os.path.exists(os.path.join(base_dir, "d.sock"))
