"""The real memorizzd executable: restarts, signals, process trees, config files."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest

from memorizz.api.errors import PermissionDeniedError, TooLargeError, UnavailableError
from memorizz.api.methods import ServerSpec
from tests.harness import (
    DAEMON_EXE,
    LEGACY_SERVER,
    MCP_SERVER,
    DaemonHarness,
    daemon_config,
    daemon_process,
    launch_args,
    sigterm_during_a_call,
    spawned_spec,
    stdio_spec,
    wait_until,
)
from tests.process import empty_config


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_run_time_servers_survive_a_restart(base_dir: str) -> None:
    with daemon_process(base_dir) as d:
        with d.client() as c:
            c.add_server(stdio_spec("kept", env={"GREETING": "hi"}))
        d.wait_ready("kept")
        assert d.stop() == 0
    with daemon_process(base_dir) as d:
        with d.client() as c:
            servers = c.list_servers()
            assert [(s.name, s.source, s.env_keys) for s in servers] == [
                ("kept", "api", ["GREETING"])
            ]
        d.wait_ready("kept")
        with d.client() as c:
            assert (
                c.call_tool("kept", "env", {"name": "GREETING"}).content[0]["text"]
                == "hi"
            )


def test_sigterm_drains_in_flight_calls_and_exits_zero(base_dir: str) -> None:
    with daemon_process(base_dir) as d:
        assert sigterm_during_a_call(d, 1.0) == ["slept 1.0"]
        assert not Path(d.socket).exists()


def test_removing_a_server_or_stopping_the_daemon_leaves_no_process_behind(
    base_dir: str,
) -> None:
    with daemon_process(base_dir) as d:
        with d.client() as c:
            c.add_server(spawned_spec("a"))  # process groups: spawned for real
            c.add_server(spawned_spec("b"))
        d.wait_ready("a")
        d.wait_ready("b")
        with d.client() as c:
            a_pid = c.server_status("a")[0].pid
            a_child = int(c.call_tool("a", "spawn_child").content[0]["text"])
            b_pid = c.server_status("b")[0].pid
            b_child = int(c.call_tool("b", "spawn_child").content[0]["text"])
            assert a_pid
            assert b_pid
            assert not _gone(a_child)
            assert not _gone(b_child)

            c.remove_server("a")
            wait_until(
                lambda: _gone(a_pid) and _gone(a_child), what="server a's tree gone"
            )
            assert not _gone(b_pid)
            assert not _gone(b_child)
        assert d.stop() == 0
    wait_until(lambda: _gone(b_pid) and _gone(b_child), what="server b's tree gone")
    daemon = psutil.Process(os.getpid())
    assert not [p for p in daemon.children() if p.status() == psutil.STATUS_ZOMBIE]


def test_a_crashed_server_leaves_no_orphan(base_dir: str) -> None:
    config = daemon_config(base_dir, servers=[spawned_spec("t")])  # its own group
    with DaemonHarness.running(config) as harness:
        harness.wait_ready("t")
        with harness.client() as c:
            child = int(c.call_tool("t", "spawn_child").content[0]["text"])
            with pytest.raises(UnavailableError):
                c.call_tool("t", "crash")
        wait_until(lambda: _gone(child), what="the crashed server's grandchild to go")


def _wakes(pid: int) -> int:
    """How often the daemon's event loop thread has gone to sleep and woken."""
    status = Path(f"/proc/{pid}/task/{pid}/status").read_text()
    return int(status.split("voluntary_ctxt_switches:")[1].split()[0])


def test_an_idle_daemon_does_not_wake_for_its_stdio_servers(base_dir: str) -> None:
    # A child's exit is waited for on its pidfd: polling each child five
    # times a second woke the daemon 30 times in these 2 seconds.
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError as exc:  # the daemon polls then, as it must
        pytest.skip(f"no pidfd here ({exc})")
    names = ["s0", "s1", "s2"]
    with daemon_process(base_dir) as d:
        with d.client() as c:
            for name in names:
                c.add_server(stdio_spec(name, args=[LEGACY_SERVER]))
        for name in names:
            d.wait_ready(name)
        with d.client() as c:
            assert c.call_tool("s0", "hello").content[0]["text"] == "hello from legacy"
            threading.Event().wait(0.5)  # settled after the call
            before = _wakes(d.pid)
            threading.Event().wait(2.0)
            assert _wakes(d.pid) - before <= 3
            pid = c.server_status("s0")[0].pid
            assert pid is not None
            os.kill(pid, signal.SIGKILL)  # and an exit is still seen at once
            wait_until(
                lambda: c.server_status("s0")[0].pid != pid,
                what="the killed server's exit to be seen",
            )


def test_a_known_legacy_server_never_pays_the_version_probe_again(
    base_dir: str,
) -> None:
    log = Path(base_dir, "methods.log")
    spec = ServerSpec(
        name="old",
        transport="stdio",
        command=sys.executable,
        args=[LEGACY_SERVER],
        env={"METHOD_LOG": str(log)},
    )
    with daemon_process(base_dir) as d:
        with d.client() as c:
            c.add_server(spec)
        d.wait_ready("old")
        with d.client() as c:
            assert c.server_status("old")[0].protocol_version == "2025-11-25"
            assert c.call_tool("old", "hello").content[0]["text"] == "hello from legacy"
    first = log.read_text().split()
    assert first[:2] == ["server/discover", "initialize"]
    log.write_text("")
    with daemon_process(base_dir) as d:
        d.wait_ready("old")
        with d.client() as c:
            assert c.ping("old").latency_ms > 0
    assert "server/discover" not in log.read_text().split()
    assert log.read_text().split()[0] == "initialize"


def test_config_file_servers_are_served_and_read_only(base_dir: str) -> None:
    config = Path(base_dir, "memorizzd.toml")
    config.write_text(
        f"""
[[servers]]
name = "fromfile"
transport = "stdio"
command = {sys.executable!r}
args = {launch_args(MCP_SERVER, "stdio")!r}
timeout_s = 5
"""
    )
    check = subprocess.run(  # noqa: PLW1510 - the exit status is the assertion
        [DAEMON_EXE, "--config", str(config), "--check-config"],
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stderr
    assert "1 servers" in check.stdout
    with daemon_process(base_dir, "--config", str(config)) as d:
        d.wait_ready("fromfile")
        with d.client() as c:
            assert c.list_servers()[0].source == "config"
            with pytest.raises(PermissionDeniedError) as err:
                c.remove_server("fromfile")
            assert err.value.reason == "read_only_server"
            assert "then `memorizzctl daemon reload`" in err.value.message
            assert c.daemon_status().config_path == str(config)


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        (
            '[[servers]]\nname = "x"\ntransport = "carrier-pigeon"\n',
            "$.servers[0].transport",
        ),
        ('sockett = "/tmp/x"\n', "sockett"),
        ("[[servers]]\nname = 'x'\ntransport = 'stdio'\n", "needs a command"),
        ("this is = not toml =\n", "memorizzd.toml"),
    ],
)
def test_bad_config_is_a_clear_error_naming_the_key(
    base_dir: str, toml: str, message: str
) -> None:
    config = Path(base_dir, "memorizzd.toml")
    config.write_text(toml)
    check = subprocess.run(  # noqa: PLW1510 - the exit status is the assertion
        [DAEMON_EXE, "--config", str(config), "--check-config"],
        capture_output=True,
        text=True,
    )
    assert check.returncode == 78
    assert message in check.stderr
    assert "Traceback" not in check.stderr


def test_a_stale_socket_is_replaced_and_a_live_one_is_not_stolen(base_dir: str) -> None:
    config = daemon_config(base_dir)
    os.makedirs(base_dir, exist_ok=True)
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(config.socket)  # bound, never listening: what a crash leaves
    stale.close()
    with daemon_process(base_dir) as d:
        second = subprocess.run(  # noqa: PLW1510 - the exit status is the assertion
            [
                DAEMON_EXE,
                "--config",
                empty_config(base_dir),
                "--socket",
                d.socket,
                "--state-dir",
                base_dir + "/state2",
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert second.returncode == 1
        assert "already listening" in second.stderr
        assert "Traceback" not in second.stderr
        assert not Path(base_dir, "state2").exists()  # failed before starting anything
        with d.client() as c:
            assert c.hello().protocol_version == 1


def test_a_huge_result_does_not_grow_the_daemon(base_dir: str) -> None:
    with daemon_process(base_dir) as d:
        with d.client() as c:
            c.add_server(stdio_spec("t", max_result_bytes=1_000_000))
        d.wait_ready("t")
        daemon = psutil.Process(d.pid)
        with d.client() as c:
            c.call_tool("t", "huge", {"n_bytes": 500_000})  # warm every code path once
            before = daemon.memory_info().rss
            for _ in range(3):
                with pytest.raises(TooLargeError):
                    c.call_tool("t", "huge", {"n_bytes": 20_000_000})
            after = daemon.memory_info().rss
            assert c.call_tool("t", "echo", {"text": "ok"}).content[0]["text"] == "ok"
    # 3 x 40 MB went through the pipe; the daemon kept at most ~1 MB of it at a time.
    assert after - before < 16 * 1024 * 1024, (before, after)


def test_systemd_hears_ready_status_and_stopping(base_dir: str) -> None:
    notify_path = os.path.join(base_dir, "notify.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify:
        notify.bind(notify_path)
        notify.settimeout(30)
        env = {**os.environ, "NOTIFY_SOCKET": notify_path}
        proc = subprocess.Popen(
            [
                DAEMON_EXE,
                "--config",
                empty_config(base_dir),
                "--socket",
                os.path.join(base_dir, "d.sock"),
                "--state-dir",
                os.path.join(base_dir, "state"),
            ],
            env=env,
            stderr=subprocess.DEVNULL,
        )
        try:
            messages = [notify.recv(4096).decode()]
            while "READY=1" not in messages[-1]:
                messages.append(notify.recv(4096).decode())
            assert Path(
                base_dir, "d.sock"
            ).exists()  # READY=1 only once the socket accepts
            assert any(
                m.startswith("STATUS=0/0 servers ready")
                for m in [*messages, notify.recv(4096).decode()]
            )
            proc.send_signal(signal.SIGTERM)
            while "STOPPING=1" not in messages[-1]:
                messages.append(notify.recv(4096).decode())
            assert proc.wait(30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_calls_cut_off_by_the_drain_deadline_hear_why(base_dir: str) -> None:
    config = daemon_config(base_dir, servers=[stdio_spec("t")], drain_timeout_s=0.3)
    outcome: list[BaseException] = []
    with DaemonHarness.running(config) as harness:
        harness.wait_ready("t")

        def slow_call() -> None:
            with harness.client() as c:
                try:
                    c.call_tool("t", "slow", {"seconds": 30})
                except UnavailableError as exc:
                    outcome.append(exc)

        caller = threading.Thread(target=slow_call)
        caller.start()
        with harness.client() as c:
            wait_until(lambda: c.server_status("t")[0].in_flight == 1)
    caller.join(10)
    assert [getattr(e, "reason", None) for e in outcome] == ["shutting_down"]


def test_a_bad_log_level_is_a_usage_error(base_dir: str) -> None:
    done = subprocess.run(  # noqa: PLW1510 - the exit status is the assertion
        [
            DAEMON_EXE,
            "--config",
            empty_config(base_dir),
            "--socket",
            base_dir + "/d.sock",
            "--state-dir",
            base_dir,
        ],
        env={**os.environ, "MEMORIZZ_LOG_LEVEL": "chatty"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2
    assert "invalid log level 'chatty'" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ("connect_wait_s = -1\n", "connect_wait_s must be greater than 0"),
        ("list_page_limit = 0\n", "list_page_limit must be greater than 0"),
        ("drain_timeout_s = -5\n", "drain_timeout_s must not be negative"),
        ('config_path = "/x"\n', "unknown key config_path"),
        (
            '[[servers]]\nname = "x"\ntransport = "stdio"\ncommand = "y"\ntimeout = 5\n',
            "timeout",
        ),
        # taken as given before: a relative metrics socket (bound where the
        # daemon happened to run), any endpoint string, an empty service name
        # (the exporter's ``unknown_service:python``)
        (
            '[metrics]\nsocket = "metrics.sock"\n',
            "metrics.socket: 'metrics.sock' must be an absolute path",
        ),
        (
            '[tracing]\nendpoint = "collector:4318"\n',
            "tracing.endpoint: 'collector:4318' is not an http(s) URL",
        ),
        ('[tracing]\nendpoint = "http://[::1"\n', "is not an http(s) URL"),
        ('[tracing]\nservice_name = " "\n', "tracing.service_name must not be empty"),
    ],
)
def test_config_values_are_checked(base_dir: str, toml: str, message: str) -> None:
    config = Path(base_dir, "memorizzd.toml")
    config.write_text(toml)
    check = subprocess.run(  # noqa: PLW1510 - the exit status is the assertion
        [DAEMON_EXE, "--config", str(config), "--check-config"],
        capture_output=True,
        text=True,
    )
    assert check.returncode == 78, check.stdout
    assert message in check.stderr


def test_the_daemon_honours_memorizz_socket(base_dir: str) -> None:
    path = os.path.join(base_dir, "env.sock")
    proc = subprocess.Popen(
        [
            DAEMON_EXE,
            "--config",
            empty_config(base_dir),
            "--state-dir",
            os.path.join(base_dir, "state"),
        ],
        env={**os.environ, "MEMORIZZ_SOCKET": path},
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(lambda: Path(path).exists(), what="the socket from MEMORIZZ_SOCKET")
    finally:
        proc.terminate()
        assert proc.wait(30) == 0


def test_a_bad_host_allowlist_pattern_is_a_config_error(base_dir: str) -> None:
    config = Path(base_dir, "memorizzd.toml")
    config.write_text('host_allowlist = ["*.", "ok.example.com"]\n')
    check = subprocess.run(  # noqa: PLW1510 - the exit status is the assertion
        [DAEMON_EXE, "--config", str(config), "--check-config"],
        capture_output=True,
        text=True,
    )
    assert check.returncode == 78
    assert "host_allowlist: '*.'" in check.stderr


def test_a_bad_host_allowlist_entry_from_the_environment_names_the_variable(
    base_dir: str,
) -> None:
    """It said ``None: host_allowlist: ...`` without a config file, named the
    file's key for the variable's entry, and left out IP addresses."""
    check = subprocess.run(  # noqa: PLW1510 - the exit status is the assertion
        [DAEMON_EXE, "--socket", os.path.join(base_dir, "d.sock"),
         "--state-dir", os.path.join(base_dir, "state"), "--check-config"],
        capture_output=True,
        text=True,
        env={**os.environ, "MEMORIZZ_MCP_HOST_ALLOWLIST": "ok.example.com,https://x"},
    )  # fmt: skip
    assert check.returncode == 78
    assert check.stderr.splitlines()[-1].endswith(
        "$MEMORIZZ_MCP_HOST_ALLOWLIST: 'https://x' is not a host name,"
        " *.domain or IP address"
    )
    assert "None" not in check.stderr


def test_the_daemon_raises_its_open_files_limit_to_the_hard_limit(
    base_dir: str,
) -> None:
    """Started with a low soft RLIMIT_NOFILE (a login shell's 1024, here 256),
    memorizzd lifts it to the hard limit before it opens a socket, and says so."""
    import resource

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    low = min(256, hard)
    log_path = os.path.join(base_dir, "daemon.log")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [
                DAEMON_EXE,
                "--config",
                empty_config(base_dir),
                "--socket",
                os.path.join(base_dir, "d.sock"),
                "--state-dir",
                os.path.join(base_dir, "state"),
            ],
            stdout=log,
            stderr=log,
            preexec_fn=lambda: resource.setrlimit(  # noqa: PLW1509 - no threads
                resource.RLIMIT_NOFILE, (low, hard)
            ),
        )
    try:
        wait_until(
            lambda: "listening on" in Path(log_path).read_text(),
            what="memorizzd listening",
        )
        limits = Path(f"/proc/{proc.pid}/limits").read_text()
        line = next(x for x in limits.splitlines() if x.startswith("Max open files"))
        assert line.split()[3:5] == [str(hard), str(hard)], line
        assert (
            f"raised the soft open files limit from {low} to the hard limit, {hard}"
            in Path(log_path).read_text()
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0


def test_a_state_directory_left_0755_is_tightened_at_start(base_dir: str) -> None:
    """Made by hand before the first start (mkdir under umask 022): the daemon
    makes it 0700 and says so; everything it writes there is 0600."""
    state = Path(base_dir, "state")
    state.mkdir(mode=0o755)
    os.chmod(state, 0o755)  # noqa: S103 - the hand-made directory under test
    with daemon_process(base_dir) as d:
        with d.client() as c:
            c.add_server(stdio_spec("t"))
            assert c.audit(limit=1).records  # the audit key and trail are written
        assert os.stat(state).st_mode & 0o777 == 0o700
        assert f"state directory {state} was 0755, open to other users" in d.log()
        assert {
            p.name: p.stat().st_mode & 0o777 for p in state.iterdir()
        } == dict.fromkeys(
            (
                "state.db",
                "state.db-wal",
                "state.db-shm",
                "vault.key",
                "audit.key",
                "audit.spool",
            ),
            0o600,
        )


def test_a_state_directory_that_is_not_the_daemons_own_stops_the_start(
    base_dir: str,
) -> None:
    """A link where the state directory should be: exit 1, one clear line, the
    socket it bound removed, nothing written through the link."""
    elsewhere = Path(base_dir, "elsewhere")
    elsewhere.mkdir(mode=0o755)
    os.chmod(elsewhere, 0o755)  # noqa: S103 - must stay as it is: checked below
    Path(base_dir, "state").symlink_to(elsewhere)
    done = subprocess.run(
        [
            DAEMON_EXE,
            "--socket",
            os.path.join(base_dir, "d.sock"),
            "--state-dir",
            os.path.join(base_dir, "state"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"memorizzd: state directory {base_dir}/state is a symbolic link;"
        " set state_dir to the directory itself; refusing to start"
    )
    assert not Path(base_dir, "d.sock").exists()
    assert list(elsewhere.iterdir()) == []
    assert elsewhere.stat().st_mode & 0o777 == 0o755
