"""Test harness: a real daemon on a real socket, real MCP servers, the real client.

* ``DaemonHarness.running(config)`` runs ``running_daemon`` in-process on a
  blocking portal (uvloop), so tests drive it from plain sync code with
  ``memorizz.Client`` and ``memorizzctl``'s ``main(argv)``.
* ``DaemonProcess`` (tests/process.py, shared with bench/) runs the installed
  ``memorizzd`` executable as a subprocess, for signals, restarts and
  process-tree checks; never with the host's /etc/memorizzd/memorizzd.toml.
* ``serve_http(kind)`` serves tests/mcp_server.py over Streamable HTTP or SSE on
  127.0.0.1 (a free port, bound first), in a thread.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import msgspec
from anyio.from_thread import BlockingPortal, start_blocking_portal

from memorizz import Client
from memorizz.api.methods import ServerSpec
from memorizz.cli import main as ctl_main
from memorizzd.app import Daemon, running_daemon
from memorizzd.config import Config
from tests.process import (
    DAEMON_EXE,
    READY_TIMEOUT_S,
    DaemonProcess,
    daemon_argv,
    wait_until,
)

__all__ = [  # re-exported: tests import the subprocess helper from here too
    "DAEMON_EXE",
    "DaemonProcess",
    "daemon_argv",
    "wait_until",
]

TESTS = Path(__file__).parent
NODE_DIR = TESTS / "node"
"""The TypeScript SDK servers and clients (``scripts/bootstrap`` installs them)."""


def node(purpose: str) -> str:
    """The node executable with tests/node's packages installed, else skip
    (fail under CI=true: there scripts/bootstrap must have installed them, and
    ``purpose`` says what was to be run)."""
    import pytest  # the harness is also the benchmarks'

    exe = shutil.which("node")
    installed = (NODE_DIR / "node_modules/@modelcontextprotocol/sdk").is_dir()
    if exe is None or not installed:
        why = (
            "node is not installed"
            if exe is None
            else "tests/node has no node_modules (run scripts/bootstrap)"
        )
        if os.environ.get("CI"):
            pytest.fail(f"{why}: CI must run {purpose}")
        pytest.skip(why)
    return exe


@contextlib.contextmanager
def node_http(script: str, purpose: str) -> Iterator[str]:
    """Run a tests/node server in its HTTP mode (``node SCRIPT http``, which
    binds 127.0.0.1 on a free port and prints ``PORT N``); yields its
    Streamable HTTP URL, ``http://127.0.0.1:N/mcp``."""
    proc = subprocess.Popen(
        [node(purpose), script, "http"],
        cwd=NODE_DIR,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline().decode()  # the server says it first
        if not first.startswith("PORT "):
            raise RuntimeError(f"{script} did not start: {first!r}")
        yield f"http://127.0.0.1:{int(first.split()[1])}/mcp"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def node_client(
    script: str, plan: dict[str, Any], *, timeout: float = 60.0
) -> dict[str, Any]:
    """Run the TypeScript SDK client ``script`` (in tests/node) with ``plan``
    (JSON, its one argument): what it says on its last line of stdout, a
    JSON object; its run must have ended with exit 0 (else that line's
    ``error`` and its stderr say why). ``timeout`` bounds a hung client."""
    done = subprocess.run(
        [
            node("the TypeScript SDK client"),
            script,
            msgspec.json.encode(plan).decode(),
        ],
        cwd=NODE_DIR,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    lines = done.stdout.splitlines()
    assert lines, f"no output (exit {done.returncode}): {done.stderr}"
    seen: dict[str, Any] = msgspec.json.decode(lines[-1])
    assert done.returncode == 0, f"{seen.get('error')}: {done.stderr}"
    return seen


MCP_SERVER = str(TESTS / "mcp_server.py")
LEGACY_SERVER = str(TESTS / "legacy_server.py")
NEO4J_SERVER = str(TESTS / "neo4j_memory_server.py")


ZYGOTE = str(TESTS / "zygote.py")
ZYGOTE_LAUNCH = str(TESTS / "zygote_launch.py")
_zygote: tuple[subprocess.Popen[bytes], str] | None = None


def zygote_socket() -> str:
    """This process's test-server zygote (tests/zygote.py), started on first
    use and stopped at exit: SDK test servers forked with the SDK loaded."""
    global _zygote
    if _zygote is None or _zygote[0].poll() is not None:
        path = os.path.join(tempfile.mkdtemp(prefix="mz-zygote-"), "z.sock")
        proc = subprocess.Popen(
            [sys.executable, ZYGOTE, path],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
        )
        assert proc.stdout is not None
        if proc.stdout.readline() != b"ready\n":
            raise RuntimeError("the test-server zygote did not start")
        proc.stdout.close()
        if _zygote is None:
            atexit.register(_stop_zygote)
        _zygote = (proc, path)
    return _zygote[1]


def _stop_zygote() -> None:
    if _zygote is not None:
        proc, path = _zygote
        proc.kill()
        proc.wait()
        shutil.rmtree(os.path.dirname(path), ignore_errors=True)


SDK_SERVERS = frozenset(
    str(TESTS / script)
    for script in (
        "mcp_server.py",
        "features_server.py",
        "asking_server.py",
        "modern_asking_server.py",
        "meta_server.py",
        "neo4j_memory_server.py",
    )
)
"""The test servers written with the SDK (they import ``mcp``: a second of CPU)."""


def launch_args(script: str, *args: str) -> list[str]:
    """The ``args`` of a stdio server that this interpreter runs as ``script
    args...``: forked by this process's zygote (a start of milliseconds, not
    the second ``import mcp`` takes: tests/zygote.py) if it is one of
    ``SDK_SERVERS``. For config files; ``stdio_spec`` uses it too."""
    if script in SDK_SERVERS:
        return [ZYGOTE_LAUNCH, zygote_socket(), script, *args]
    return [script, *args]


def command_options(script: str, *args: str) -> tuple[str, ...]:
    """``memorizzctl mcp add``'s ``--command``/``--arg`` options for a stdio
    server that this interpreter runs as ``script args...`` (``launch_args``:
    an SDK test server is forked by this process's zygote)."""
    options = ["--command", sys.executable]
    for arg in launch_args(script, *args):
        options += ["--arg", arg]
    return tuple(options)


def stdio_spec(name: str = "t", *, spawn: bool = False, **overrides: Any) -> ServerSpec:
    """A stdio test server: tests/mcp_server.py unless ``args`` (or ``command``)
    say otherwise. One of ``SDK_SERVERS`` run by this interpreter is forked by
    this process's zygote (a start that costs milliseconds, not the second
    ``import mcp`` takes: tests/zygote.py) unless ``spawn``."""
    fields: dict[str, Any] = {
        "name": name,
        "transport": "stdio",
        "command": sys.executable,
        "args": [MCP_SERVER, "stdio"],
    }
    fields.update(overrides)
    args = fields["args"]
    if not spawn and fields["command"] == sys.executable and args:
        fields["args"] = launch_args(*map(str, args))
    return ServerSpec(**fields)


def spawned_spec(name: str = "t", **overrides: Any) -> ServerSpec:
    """tests/mcp_server.py (or ``args``) spawned for real, not forked by the
    zygote: for tests that look at its process group or its pid."""
    return stdio_spec(name, spawn=True, **overrides)


FEATURES_SERVER = str(TESTS / "features_server.py")
ASKING_SERVER = str(TESTS / "asking_server.py")

INITIALIZE: dict[str, Any] = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "raw", "version": "0"},
    },
}
"""A raw MCP client's ``initialize`` (id 1, the handshake era, nothing declared)."""


def features_spec(name: str = "feat", **overrides: Any) -> ServerSpec:
    """tests/features_server.py (subscriptions, completions, roots), handshake era."""
    fields = {"args": [FEATURES_SERVER, "stdio"], "protocol": "legacy", **overrides}
    return stdio_spec(name, **fields)


def asking_spec(name: str = "ask", **overrides: Any) -> ServerSpec:
    """tests/asking_server.py (elicitation and sampling), handshake era."""
    fields = {"args": [ASKING_SERVER, "stdio"], "protocol": "legacy", **overrides}
    return stdio_spec(name, **fields)


def light_spec(name: str, **overrides: Any) -> ServerSpec:
    """A stdio server for a test to which the server's kind does not matter
    (audit records, listings, settings): tests/legacy_server.py, which needs no
    SDK and starts in milliseconds, where tests/mcp_server.py takes a second."""
    return stdio_spec(name, **{"args": [LEGACY_SERVER], **overrides})


TASK_SERVER = str(NODE_DIR / "task_server.mjs")
"""A server on the TypeScript SDK with tasks (task-required and -optional tools)."""


def task_spec(name: str = "tasks") -> ServerSpec:
    """``TASK_SERVER`` over stdio, run by ``node`` (skipped without it, failed
    under CI)."""
    exe = node("the TypeScript SDK's task server")
    return stdio_spec(name, command=exe, args=[TASK_SERVER], cwd=str(NODE_DIR))


@contextlib.contextmanager
def task_server(transport: str, name: str = "tasks") -> Iterator[ServerSpec]:
    """``TASK_SERVER`` as the daemon reaches it over ``transport``: ``stdio``
    (``task_spec``) or ``streamable_http`` (served by ``node_http`` meanwhile)."""
    if transport == "stdio":
        yield task_spec(name)
        return
    with node_http(TASK_SERVER, "the TypeScript SDK's task server over HTTP") as url:
        yield http_spec(name, url, "streamable_http")


def http_spec(name: str, url: str, transport: str, **overrides: Any) -> ServerSpec:
    """An HTTP server entry for a loopback test server (``allow_private_network``)."""
    fields: dict[str, Any] = {
        "name": name,
        "transport": transport,
        "url": url,
        "allow_private_network": True,  # a loopback test server
    }
    fields.update(overrides)
    return ServerSpec(**fields)


def short_tempdir(prefix: str = "mz-") -> str:
    """Under /tmp: AF_UNIX paths must stay under 108 bytes."""
    return tempfile.mkdtemp(prefix=prefix, dir="/tmp")


def tempdir_fixture() -> Any:
    """A module-scoped pytest fixture of a ``short_tempdir``, removed after
    the module's tests; a test module names it: ``base = tempdir_fixture()``."""
    import pytest  # the harness is also the benchmarks'

    @pytest.fixture(scope="module")
    def tempdir() -> Iterator[str]:
        path = short_tempdir()
        yield path
        rmtree(path)

    return tempdir


TIMINGS: dict[str, float] = {
    "backoff_initial_s": 0.05,
    "backoff_max_s": 0.5,
    "drain_timeout_s": 5.0,
}
"""A test daemon's reconnect backoff and drain bound: short, tests wait on them."""


def daemon_config(base: str, **overrides: Any) -> Config:
    fields: dict[str, Any] = {
        "socket": os.path.join(base, "d.sock"),
        "state_dir": os.path.join(base, "state"),
        **TIMINGS,
    }
    fields.update(overrides)
    return Config(**fields)


def config_doc(base: str, **fields: Any) -> dict[str, Any]:
    """What ``daemon_config`` sets, as a config file's document
    (``config_toml``), ``fields`` added (``servers``: ``stdio_entry`` each)."""
    return {
        "socket": os.path.join(base, "d.sock"),
        "state_dir": os.path.join(base, "state"),
        **TIMINGS,
        **fields,
    }


def config_toml(doc: dict[str, Any]) -> str:
    """A config file: top-level values, then tables, then arrays of tables."""

    def value_of(v: object) -> str:
        if isinstance(v, dict):  # an inline table
            return "{" + ", ".join(f"{k} = {value_of(x)}" for k, x in v.items()) + "}"
        return msgspec.json.encode(v).decode()  # strings, numbers, lists, booleans

    def table(value: dict[str, Any]) -> list[str]:
        return [f"{k} = {value_of(v)}" for k, v in value.items()]

    def tables(value: object) -> bool:
        return isinstance(value, list) and bool(value) and isinstance(value[0], dict)

    lines = table(
        {k: v for k, v in doc.items() if not isinstance(v, dict) and not tables(v)}
    )
    for key, value in doc.items():
        if isinstance(value, dict):
            lines += [f"[{key}]", *table(value)]
        elif tables(value):
            for item in value:
                lines += [f"[[{key}]]", *table(item)]
    return "\n".join(lines) + "\n"


def stdio_entry(spec: ServerSpec) -> dict[str, Any]:
    """A stdio server's ``[[servers]]`` entry in a config document."""
    entry: dict[str, Any] = {
        "name": spec.name,
        "transport": "stdio",
        "command": spec.command,
        "args": list(spec.args),
        "env": dict(spec.env),
    }
    return entry | ({"cwd": spec.cwd} if spec.cwd else {})


@dataclass
class DaemonHarness:
    config: Config
    portal: BlockingPortal
    daemon: Daemon

    @classmethod
    @contextlib.contextmanager
    def running(cls, config: Config) -> Iterator[DaemonHarness]:
        with (
            start_blocking_portal(
                backend="asyncio", backend_options={"use_uvloop": True}
            ) as portal,
            portal.wrap_async_context_manager(running_daemon(config)) as daemon,
        ):
            yield cls(config, portal, daemon)

    @property
    def socket(self) -> str:
        return self.config.socket

    def client(self) -> Client:
        return Client(self.socket)

    def ctl(self, *argv: str) -> int:
        return ctl_main(["--socket", self.socket, *argv])

    def wait_ready(self, name: str, *, timeout: float = READY_TIMEOUT_S) -> None:
        upstream = self.daemon.pool.get(name)

        async def wait() -> None:
            with anyio.fail_after(timeout):
                await upstream.wait_ready()

        self.portal.call(wait)

    def add(self, spec: ServerSpec) -> None:
        with self.client() as c:
            c.add_server(spec)
        self.wait_ready(spec.name)


@contextlib.contextmanager
def http_bridge(
    api_socket: str, *, token: str | None = None, said: list[str] | None = None
) -> Iterator[tuple[str, str]]:
    """``memorizzctl mcp serve --transport streamable-http`` on a loopback
    port in front of the face beside ``api_socket``; yields its URL and
    bearer token (``token``, else a random one, read from a 0600 token file).
    ``said``, if given, gets all the bridge printed (stderr, then stdout)
    once it stopped (SIGTERM)."""
    token = secrets.token_urlsafe(24) if token is None else token
    token_file = os.path.join(os.path.dirname(api_socket), "bridge-token")
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    with open(os.open(token_file, flags, 0o600), "w", encoding="utf-8") as f:
        f.write(token)
    memorizzctl = str(Path(sys.executable).with_name("memorizzctl"))
    proc = subprocess.Popen(
        [memorizzctl, "--socket", api_socket, "mcp", "serve",
         "--transport", "streamable-http", "--listen", "127.0.0.1:0",
         "--token-file", token_file],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL if said is None else subprocess.PIPE,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    first = ""
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline().decode()
        assert " at http://127.0.0.1:" in first, first
        yield first.rsplit(" ", 1)[1].strip(), token
    finally:
        proc.terminate()
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise
        if said is not None:
            said += [first + err.decode(), out.decode()]


@contextlib.contextmanager
def daemon_process(
    base: str, *extra: str, config: str | None = None
) -> Iterator[DaemonProcess]:
    """A started ``DaemonProcess`` (tests/process.py), stopped at the end."""
    process = DaemonProcess(base, extra, config=config).start()
    try:
        yield process
    finally:
        if process.running:
            process.stop()


@contextlib.contextmanager
def no_errors_logged(process: DaemonProcess) -> Iterator[None]:
    """What runs inside adds no traceback and no ``ERROR`` or ``CRITICAL``
    line to ``process``'s log."""
    before = len(process.log())
    yield
    added = process.log()[before:]
    assert "Traceback" not in added, added
    assert " ERROR " not in added, added
    assert " CRITICAL " not in added, added


@contextlib.contextmanager
def configured_daemon(
    prefix: str, config: Callable[[str], str], *, ready: tuple[str, ...] = ()
) -> Iterator[DaemonProcess]:
    """``daemon_process`` in a short temporary directory of its own (0755:
    agent directories live below it), its config file ``config(base)``,
    once each server in ``ready`` is; the directory removed at the end."""
    base = short_tempdir(prefix)
    os.chmod(base, 0o755)  # noqa: S103 - the agent directory lives below
    path = os.path.join(base, "memorizzd.toml")
    Path(path).write_text(config(base), encoding="utf-8")
    try:
        with daemon_process(base, config=path) as process:
            for name in ready:
                process.wait_ready(name)
            yield process
    finally:
        rmtree(base)


def sigterm_during_a_call(d: DaemonProcess, seconds: float) -> list[str]:
    """Add the stdio test server ``t`` to ``d``, call its ``slow`` tool for
    ``seconds`` and, with the call in flight, stop ``d`` with SIGTERM (exit 0
    asserted); the call's answer, once it came back (empty if not in 10 s)."""
    with d.client() as c:
        c.add_server(stdio_spec("t"))
    d.wait_ready("t")
    answered: list[str] = []

    def slow_call() -> None:
        with d.client() as c:
            result = c.call_tool("t", "slow", {"seconds": seconds})
            answered.append(result.content[0]["text"])

    caller = threading.Thread(target=slow_call)
    caller.start()
    with d.client() as c:
        wait_until(lambda: c.server_status("t")[0].in_flight == 1)
    assert d.stop(signal.SIGTERM) == 0
    caller.join(10)
    return answered


@contextlib.contextmanager
def serve_asgi(
    make_app: Callable[[str], Any],
    port: int = 0,
    *,
    lifespan: str = "on",
    **uvicorn_options: Any,
) -> Iterator[str]:
    """Serve the ASGI app ``make_app(base)`` on 127.0.0.1 in a thread (a free
    port unless given); yields ``base``, its ``http://127.0.0.1:PORT``.
    ``uvicorn_options`` go to ``uvicorn.Config`` (``ssl_certfile``, ...)."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    base = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server = uvicorn.Server(
        uvicorn.Config(
            make_app(base),
            log_level="warning",
            lifespan=lifespan,
            timeout_graceful_shutdown=1,
            **uvicorn_options,
        )
    )
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, daemon=True
    )
    thread.start()
    wait_until(lambda: server.started or not thread.is_alive(), what="uvicorn")
    if not server.started:
        raise RuntimeError("uvicorn did not start")
    try:
        yield base
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


@contextlib.contextmanager
def serve_http(
    kind: str, port: int = 0, wrap: Callable[[Any], Any] | None = None
) -> Iterator[str]:
    """Serve the test MCP server over ``streamable_http`` or ``sse`` on 127.0.0.1
    (a free port unless given); yields its URL. ``wrap`` wraps the ASGI app
    (e.g. a middleware that checks credentials)."""
    from tests.mcp_server import mcp

    def make_app(base: str) -> Any:
        app = mcp.streamable_http_app() if kind == "streamable_http" else mcp.sse_app()
        return wrap(app) if wrap is not None else app

    with serve_asgi(make_app, port) as base:
        yield base + ("/mcp" if kind == "streamable_http" else "/sse")


def scraped(path: str) -> bytes:
    """``GET /metrics`` on the metrics Unix socket ``path``: the whole answer
    (read until the daemon closes the connection)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(path)
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        return answer


def rmtree(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def light_daemon(*names: str, **overrides: Any) -> Iterator[DaemonHarness]:
    """A daemon in a short temporary directory (removed at the end) serving
    the light servers ``names`` (``light_spec``), each ready; ``overrides``
    go to ``daemon_config``."""
    base = short_tempdir()
    try:
        config = daemon_config(
            base, servers=[light_spec(name) for name in names], **overrides
        )
        with DaemonHarness.running(config) as running:
            for name in names:
                running.wait_ready(name)
            yield running
    finally:
        rmtree(base)
