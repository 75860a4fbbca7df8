"""Secrets never come back out: a leak battery against the real daemon.

The real ``memorizzd`` executable (debug log, metrics on a loopback port), the
real ``memorizzctl`` in subprocesses (plain and ``--json``), and upstreams
that misbehave on purpose: each secret is a distinctive canary, and every
output is searched for it, as written, %-encoded and base64-encoded.

* An HTTP server (tests/mcp_server.py behind a hostile middleware) that quotes
  the request's ``Authorization`` and secret header back: in a 401's or 403's
  ``WWW-Authenticate`` and body, a 500's body, a JSON-RPC error's message and
  ``data`` (to ``initialize`` and to ``tools/call``), a redirect's
  ``Location``; at connect and at call time. It used to reach ``last_error``,
  ``servers/test``, every ``server_unavailable`` and upstream error, and the
  log (JSON-RPC errors, a redirect's path): they are now cut out
  (``memorizzd.upstream.redact``).
* A stdio server that prints its environment (its secret env among it) to
  stderr and dies with the secret in its last words, and one that answers
  ``server/discover`` and ``tools/call`` with JSON-RPC errors quoting it. The
  stderr line went to the log as it was.
* Config errors and ``mcp add`` refusals with the secret in a misspelled key,
  a wrong type, a header value with a newline, a URL's user information (a
  malformed URL's was said back whole).
* The HTTP bridge's token file; a vault key that is not one; ``memorizzctl
  audit``, the metrics scrape, ``daemon metrics``, the daemon's log, the
  state directory (the audit and vault keys never leave it).

A tool's *result* is the server's to say: a server that returns its own secret
in a result (``env``) gets it to its caller (tests/daemon/test_static_auth.py
counts on that), and is not searched here.
"""

from __future__ import annotations

import base64
import contextlib
import io
import os
import secrets
import socket
import subprocess
import sys
import threading
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import msgspec
import pytest

from memorizz.api.methods import ServerSpec
from memorizz.cli import main as ctl_main
from tests.faults import read_body, replaying
from tests.harness import (
    DaemonProcess,
    http_bridge,
    rmtree,
    serve_http,
    short_tempdir,
    wait_until,
)
from tests.process import daemon_argv

TOKEN = "SECRET-canary-tok-" + secrets.token_hex(8)
HEADER_VALUE = "SECRET-canary-hdr-" + secrets.token_hex(8)
ENV_VALUE = "SECRET-canary-env-" + secrets.token_hex(8)
BRIDGE_TOKEN = "SECRET-canary-bridge-" + secrets.token_hex(8)
CONFIG_SECRET = "SECRET-canary-cfg-" + secrets.token_hex(8)
CANARIES = (TOKEN, HEADER_VALUE, ENV_VALUE, BRIDGE_TOKEN, CONFIG_SECRET)
HEADER = "X-Api-Key"
REDACTED = "[redacted]"


# --- searching -----------------------------------------------------------------


def _forms(secret: bytes) -> set[bytes]:
    """``secret`` as written, %-encoded, and base64 (standard and URL-safe) at
    each of the three alignments it may have inside a longer encoded text:
    the characters that do not depend on its neighbours."""
    found = {
        secret,
        urllib.parse.quote(secret, safe="").encode(),
        urllib.parse.quote_plus(secret).encode(),
    }
    for shift in range(3):
        for encode in (base64.b64encode, base64.urlsafe_b64encode):
            encoded = encode(b"\0" * shift + secret + b"\0\0")
            found.add(encoded[4 if shift else 0 : -4])
    return found


FORMS = {canary: _forms(canary.encode()) for canary in CANARIES}


def assert_clean(where: str, data: str | bytes, *extra: str | bytes) -> None:
    """No canary (nor ``extra``) in ``data``, in any form."""
    raw = data.encode() if isinstance(data, str) else data
    for canary, forms in FORMS.items():
        for form in forms:
            at = raw.find(form)
            assert at < 0, (
                f"{canary[:22]} leaked into {where}: "
                f"{raw[max(0, at - 200) : at + 60]!r}"
            )
    for secret in extra:
        value = secret.encode() if isinstance(secret, str) else secret
        for form in _forms(value):
            assert form not in raw, f"a secret leaked into {where}"


# --- the hostile upstream ------------------------------------------------------


def _headers_said(scope: Any) -> str:
    return "; ".join(
        f"{k.decode('latin-1')}={v.decode('latin-1')}" for k, v in scope["headers"]
    )


def hostile(app: Any) -> Any:
    """The MCP app at ``/MODE/mcp``, answering as MODE says with every header
    it was sent quoted back. ``late-MODE``: the handshake and listings are
    served, and only ``tools/call`` gets MODE."""

    async def asgi(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        parts = scope["path"].split("/")
        mode = parts[1] if len(parts) > 2 else "ok"
        scope = dict(scope, path="/mcp", raw_path=b"/mcp")
        said = _headers_said(scope)
        auth = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
        body = await read_body(receive) if scope["method"] == "POST" else b""
        try:
            request = msgspec.json.decode(body) if body else {}
        except msgspec.DecodeError:
            request = {}
        if not isinstance(request, dict):
            request = {}
        late = mode.startswith("late-")
        kind = mode.removeprefix("late-")
        if kind != "ok" and (not late or request.get("method") == "tools/call"):
            await _misbehave(send, kind, said, auth, request.get("id"))
            return
        if scope["method"] == "POST":
            receive = replaying(body, receive)
        await app(scope, receive, send)

    return asgi


async def _misbehave(send: Any, kind: str, said: str, auth: str, rid: Any) -> None:
    async def reply(
        status: int,
        body: bytes,
        headers: list[tuple[bytes, bytes]],
        ctype: bytes = b"text/plain",
    ) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", ctype), *headers],
            }
        )
        await send({"type": "http.response.body", "body": body})

    quoted = auth.encode("latin-1")
    if kind in ("401", "403"):
        challenge = b'Bearer error="invalid_token", error_description="' + quoted + b'"'
        await reply(int(kind), said.encode(), [(b"www-authenticate", challenge)])
    elif kind in ("403plain", "404", "500", "502"):
        await reply(int(kind[:3]), said.encode(), [(b"x-echo", quoted)])
    elif kind in ("rpcerr", "500json"):
        error = {
            "jsonrpc": "2.0",
            "id": rid,
            "error": {
                "code": -32603,
                "message": "refused: " + said,
                "data": {"authorization": auth, "headers": said.split("; ")},
            },
        }
        status = 500 if kind == "500json" else 200
        await reply(status, msgspec.json.encode(error), [], b"application/json")
    elif kind == "redirect":
        where = urllib.parse.quote(auth)
        location = f"/{where}/mcp?token={where}#{where}".encode()
        await reply(307, b"", [(b"location", location)])
    else:
        raise AssertionError(f"unknown mode {kind}")


# --- stdio servers that talk too much ------------------------------------------

LEAKY_STDIO = """\
import json, os, sys
secret = os.environ.get("API_KEY", "")
sys.stderr.write(f"starting with API_KEY={secret}\\n")
sys.stderr.write(repr(dict(os.environ)) + "\\n")
sys.stderr.flush()
if sys.argv[1] == "crash":
    print(f"not JSON-RPC: {secret}", flush=True)
    raise SystemExit(f"fatal: the key {secret} was refused")
def reply(rid, result=None, error=None):
    out = {"jsonrpc": "2.0", "id": rid}
    out.update({"error": error} if error else {"result": result})
    sys.stdout.write(json.dumps(out) + "\\n")
    sys.stdout.flush()
while line := sys.stdin.readline():
    msg = json.loads(line)
    rid, method = msg.get("id"), msg.get("method")
    if rid is None:
        continue
    quoted = {"code": -32603, "message": f"bad key {secret}", "data": {"k": secret}}
    if method == "server/discover":
        reply(rid, error=quoted)
    elif method == "initialize":
        reply(rid, {"protocolVersion": "2025-11-25", "capabilities": {"tools": {}},
                    "serverInfo": {"name": "leaky", "version": "1"}})
    elif method == "tools/list":
        reply(rid, {"tools": [{"name": "whoami", "inputSchema": {"type": "object"}}]})
    elif method == "tools/call":
        reply(rid, error=quoted)
    else:
        reply(rid, {})
"""


# --- the daemon ------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class World:
    def __init__(self, daemon: DaemonProcess, root: str, metrics: int) -> None:
        self.daemon = daemon
        self.root = root  # the hostile upstream's http://127.0.0.1:PORT
        self.metrics = metrics
        self.script = os.path.join(daemon.base, "leaky_stdio.py")
        Path(self.script).write_text(LEAKY_STDIO, encoding="utf-8")

    def ctl(self, *argv: str) -> str:
        """``memorizzctl --socket ... ARGV``: its stdout and stderr. Run in
        this process (``memorizz.cli.main``, the console script's own
        function): a battery of hundreds of commands would spend most of its
        time starting interpreters."""
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            ctl_main(["--socket", self.daemon.socket, *argv])
        return out.getvalue() + err.getvalue()

    def both(self, *argv: str) -> str:
        """``ARGV`` plain and with ``--json``."""
        return self.ctl(*argv) + "\n" + self.ctl("--json", *argv)

    def add_http(self, name: str, mode: str) -> None:
        spec = ServerSpec(
            name=name,
            transport="streamable_http",
            url=f"{self.root}/{mode}/mcp",
            allow_private_network=True,
            auth="bearer",
            token=TOKEN,
            headers={HEADER: HEADER_VALUE},
            timeout_s=5.0,
        )
        with self.daemon.client() as c:
            c.add_server(spec)

    def add_stdio(self, name: str, mode: str) -> None:
        spec = ServerSpec(
            name=name,
            transport="stdio",
            command=sys.executable,
            args=[self.script, mode],
            secret_env={"API_KEY": ENV_VALUE},
            protocol="auto",
            timeout_s=5.0,
        )
        with self.daemon.client() as c:
            c.add_server(spec)

    def status(self, name: str) -> Any:
        with self.daemon.client() as c:
            return c.server_status(name)[0]

    def wait_failed(self, name: str) -> str:
        """The server's ``last_error`` once a connect failed."""

        def failed() -> bool:
            status = self.status(name)
            return status.state in ("backoff", "failed") and bool(status.last_error)

        wait_until(failed, what=f"{name} failing", alive=self.daemon.check)
        last_error: str = self.status(name).last_error
        return last_error

    def sweep(self) -> None:
        """The daemon's log, audit, metrics and state directory: no canary."""
        assert_clean("memorizzctl audit", self.both("audit", "--limit", "1000"))
        assert_clean("memorizzctl mcp status", self.both("mcp", "status"))
        assert_clean("memorizzctl mcp list", self.both("mcp", "list"))
        assert_clean("memorizzctl daemon metrics", self.ctl("daemon", "metrics"))
        url = f"http://127.0.0.1:{self.metrics}/metrics"
        with urllib.request.urlopen(url, timeout=10) as scraped:
            assert_clean("the metrics scrape", scraped.read())
        assert_clean("the daemon's log", self.daemon.log())
        state = Path(self.daemon.state_dir)
        keys = [
            (state / name).read_bytes()
            for name in ("vault.key", "audit.key")
            if (state / name).exists()
        ]
        assert_clean("the daemon's log and outputs", self.daemon.log(), *keys)
        for path in state.iterdir():  # state.db (its vault rows are ciphertext)
            if path.name not in ("vault.key", "audit.key"):
                assert_clean(str(path), path.read_bytes())


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    base = short_tempdir("mz-leak-")
    metrics = free_port()
    config = os.path.join(base, "memorizzd.toml")
    Path(config).write_text(
        f'[metrics]\nlisten = "127.0.0.1:{metrics}"\n', encoding="utf-8"
    )
    try:
        with serve_http("streamable_http", wrap=hostile) as url:
            daemon = DaemonProcess(base, config=config).start()
            try:
                yield World(daemon, url.rsplit("/", 1)[0], metrics)
            finally:
                if daemon.running:
                    assert daemon.stop() == 0
    finally:
        rmtree(base)


def _call_outputs(w: World, name: str, tool: str = "echo") -> str:
    arguments = '{"text": "hi"}' if tool == "echo" else "{}"
    out = [w.both("mcp", "call", name, tool, "--arguments", arguments)]
    out.append(w.both("mcp", "test", name))
    out.append(w.both("ping", name))
    out.append(w.both("mcp", "tools", name))
    return "\n".join(out)


# --- HTTP: credentials quoted back ---------------------------------------------


@pytest.mark.parametrize(
    ("mode", "redacted"),
    [
        ("401", False),
        ("403", False),
        ("403plain", False),
        ("500", False),
        ("500json", True),
        ("rpcerr", True),
        ("redirect", True),
    ],
)
def test_credentials_quoted_back_at_connect_are_shown_nowhere(
    world: World, mode: str, redacted: bool
) -> None:
    name = f"c-{mode}"
    world.add_http(name, mode)
    last_error = world.wait_failed(name)
    assert_clean("last_error", last_error)
    if redacted:  # the server's text is shown, the secrets cut out of it
        assert REDACTED in last_error, last_error
    with world.daemon.client() as c:
        status = c.server_status(name)[0]
        assert_clean("servers/status", msgspec.json.encode(status))
    assert_clean("memorizzctl", _call_outputs(world, name))
    world.sweep()


@pytest.mark.parametrize(
    ("mode", "said"),
    [
        ("late-401", "authorization required"),
        ("late-403", "authorization required"),
        ("late-403plain", ""),
        ("late-500", ""),
        ("late-500json", REDACTED),
        ("late-rpcerr", REDACTED),
        ("late-redirect", REDACTED),
    ],
)
def test_credentials_quoted_back_to_a_call_are_shown_nowhere(
    world: World, mode: str, said: str
) -> None:
    name = f"k-{mode}"
    world.add_http(name, mode)
    world.daemon.wait_ready(name)
    with world.daemon.client() as c, pytest.raises(Exception) as caught:  # noqa: PT011
        c.call_tool(name, "echo", {"text": "hi"})
    error = caught.value
    shown = f"{error} {getattr(error, 'data', '')!r}"
    assert_clean("the call's error", shown)
    assert said in shown, shown
    calls = world.both("mcp", "call", name, "echo", "--arguments", '{"text": "x"}')
    assert_clean("memorizzctl mcp call", calls)
    assert_clean("memorizzctl", _call_outputs(world, name))
    world.sweep()


# --- stdio: a secret env printed and quoted ------------------------------------


def test_a_stdio_server_that_prints_its_secret_env_and_dies(world: World) -> None:
    world.add_stdio("s-crash", "crash")
    last_error = world.wait_failed("s-crash")
    assert_clean("last_error", last_error)

    def said_on_stderr() -> bool:
        return "s-crash: starting with API_KEY=" in world.daemon.log()

    wait_until(said_on_stderr, what="its stderr in the log")
    assert f"s-crash: starting with API_KEY={REDACTED}" in world.daemon.log()
    assert_clean("memorizzctl", _call_outputs(world, "s-crash"))
    world.sweep()


def test_a_stdio_server_that_quotes_its_secret_env_in_errors(world: World) -> None:
    world.add_stdio("s-rpc", "rpc")
    world.daemon.wait_ready("s-rpc")
    with world.daemon.client() as c, pytest.raises(Exception) as caught:  # noqa: PT011
        c.call_tool("s-rpc", "whoami", {})
    shown = f"{caught.value} {getattr(caught.value, 'data', '')!r}"
    assert_clean("the call's error", shown)
    assert f"bad key {REDACTED}" in shown, shown
    assert_clean("memorizzctl", _call_outputs(world, "s-rpc", "whoami"))
    assert "no answer to server/discover" in world.daemon.log()
    world.sweep()


# --- the MCP face, through the HTTP bridge and its token file -------------------


def test_the_bridge_and_the_face_say_no_secret(world: World) -> None:
    world.add_http("f-rpc", "late-rpcerr")
    world.daemon.wait_ready("f-rpc")
    bad_file = os.path.join(world.daemon.base, "bad-token")
    Path(bad_file).write_text(f"{BRIDGE_TOKEN} two words\n", encoding="utf-8")
    refused = world.ctl(
        "mcp", "serve", "--transport", "streamable-http",
        "--listen", "127.0.0.1:0", "--token-file", bad_file,
    )  # fmt: skip
    assert "--token-file" in refused
    assert_clean("the bridge's refusal of a token file", refused)
    seen: list[str] = []
    with (
        http_bridge(world.daemon.socket, token=BRIDGE_TOKEN, said=seen) as (url, _),
        httpx2.Client(timeout=30) as http,
    ):
        refusal = http.post(
            url,
            headers={"Authorization": f"Bearer {BRIDGE_TOKEN}x"},
            content=b"{}",
        )
        assert refusal.status_code == 401
        seen.append(refusal.text + repr(refusal.headers))
        face = _face_session(http, url)
        listed = face("tools/list", {})
        names = [t["name"] for t in listed["result"]["tools"]]
        (tool,) = [n for n in names if "f-rpc" in n and "echo" in n]
        called = face("tools/call", {"name": tool, "arguments": {"text": "x"}})
        seen.append(msgspec.json.encode(called).decode())
        assert REDACTED in seen[-1], seen[-1]
    assert " at http://127.0.0.1:" in seen[-2], seen  # what the bridge printed
    for said in seen:
        assert_clean("the bridge and the face", said)
    world.sweep()


def _face_session(http: httpx2.Client, url: str) -> Any:
    headers = {
        "Authorization": f"Bearer {BRIDGE_TOKEN}",
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
    }
    ids = iter(range(1, 1000))

    def send(method: str, params: dict[str, Any]) -> Any:
        body = {"jsonrpc": "2.0", "id": next(ids), "method": method, "params": params}
        answer = http.post(url, headers=headers, content=msgspec.json.encode(body))
        assert answer.status_code == 200, answer.text
        if "mcp-session-id" in answer.headers:
            headers["Mcp-Session-Id"] = answer.headers["mcp-session-id"]
        text = answer.text
        if answer.headers.get("content-type", "").startswith("text/event-stream"):
            data = [
                ln[5:].strip() for ln in text.splitlines() if ln.startswith("data:")
            ]
            text = data[-1]
        return msgspec.json.decode(text)

    init = send(
        "initialize",
        {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "leak-battery", "version": "1"},
        },
    )
    assert "result" in init, init
    notice = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    http.post(url, headers=headers, content=msgspec.json.encode(notice))
    return send


# --- refusals: config file and memorizzctl mcp add --------------------------------

SERVER = """
[[servers]]
name = "x"
transport = "streamable_http"
allow_private_network = true
"""


@pytest.mark.parametrize(
    "entry",
    [
        'url = "http://127.0.0.1:1/mcp"\nauth = "bearer"\ntokn = "SECRET"',
        'url = "http://127.0.0.1:1/mcp"\nheaders = {X = ["SECRET"]}',
        'url = "http://127.0.0.1:1/mcp"\nauth = "bearer"\ntoken = "SECRET\\n"',
        'url = "http://127.0.0.1:1/mcp"\nheaders = {X = "SECRET\\r\\nY: z"}',
        'url = "http://127.0.0.1:1/mcp"\nsecret_env = {K = "SECRET"}',
        'url = "SECRET@127.0.0.1/mcp"',
        'url = "http://127.0.0.1:1/mcp"\nauth = "bearer"\ntoken = {v = "SECRET"}',
        'url = "http://127.0.0.1:1/mcp"\nauth = "oauth"\noauth_client_secret = "SECRET"',
    ],
)
def test_a_config_error_never_says_the_secret(base_dir: str, entry: str) -> None:
    config = os.path.join(base_dir, "memorizzd.toml")
    entry = entry.replace("SECRET", CONFIG_SECRET)
    Path(config).write_text(SERVER + entry + "\n", encoding="utf-8")
    for extra in (["--check-config"], []):  # a check, and a start (debug log)
        done = subprocess.run(
            daemon_argv(base_dir, *extra, config=config),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 78, done.stdout + done.stderr
        assert_clean("memorizzd's refusal", done.stdout + done.stderr)


def test_a_config_file_url_with_credentials_is_refused_at_connect_unsaid() -> None:
    """A URL's user information is checked when the server connects (the
    file passes ``--check-config``): ``last_error`` and the log say why,
    without it."""
    base = short_tempdir("mz-leak-")
    servers = {
        "userinfo": f"http://u:{CONFIG_SECRET}@127.0.0.1:1/mcp",
        "noslashes": f"https:u:{CONFIG_SECRET}@127.0.0.1/mcp",
    }
    config = os.path.join(base, "memorizzd.toml")
    Path(config).write_text(
        "".join(
            f'[[servers]]\nname = "{name}"\ntransport = "streamable_http"\n'
            f'url = "{url}"\nallow_private_network = true\n'
            for name, url in servers.items()
        ),
        encoding="utf-8",
    )
    daemon = DaemonProcess(base, config=config)
    try:
        daemon.start()
        w = World(daemon, "http://127.0.0.1:1", 0)
        for name in servers:
            assert_clean("last_error", w.wait_failed(name))
            assert_clean("memorizzctl", w.both("mcp", "test", name))
        assert_clean("memorizzctl mcp list", w.both("mcp", "list"))
        assert_clean("memorizzctl mcp status", w.both("mcp", "status"))
        assert daemon.stop() == 0
        assert_clean("the daemon's log", daemon.log())
    finally:
        if daemon.running:
            daemon.stop()
        rmtree(base)


@pytest.mark.parametrize(
    "argv",
    [
        ["--url", "http://u:SECRET@127.0.0.1:1/mcp"],
        ["--url", "https:u:SECRET@127.0.0.1/mcp"],
        ["--url", "SECRET@127.0.0.1/mcp"],
        [
            "--url",
            "http://127.0.0.1:1/mcp",
            "--header",
            "X-K: SECRET\r\nY: 1",
        ],
        ["--url", "http://127.0.0.1:1/mcp", "--header", "Host: SECRET"],
        ["--url", "http://127.0.0.1:1/mcp", "--token", "SECRET\n"],
        ["--url", "http://127.0.0.1:1/mcp", "--secret-env", "K=SECRET"],
        ["--command", sys.executable, "--token", "SECRET"],
        ["--command", sys.executable, "--secret-env", "LD_PRELOAD=SECRET"],
    ],
)
def test_mcp_add_refusals_never_say_the_secret(world: World, argv: list[str]) -> None:
    name = "r-" + secrets.token_hex(3)
    flags = [arg.replace("SECRET", CONFIG_SECRET) for arg in argv]
    if "--url" in flags:
        flags.append("--allow-private-network")
    said = world.both("mcp", "add", name, *flags)
    assert "error" in said, said
    assert_clean("memorizzctl mcp add", said)
    with world.daemon.client() as c:
        assert name not in {s.name for s in c.list_servers()}
    world.sweep()


# --- the keys ------------------------------------------------------------------


def test_a_vault_key_that_is_not_one_is_not_said(base_dir: str) -> None:
    config = os.path.join(base_dir, "memorizzd.toml")
    Path(config).write_text("", encoding="utf-8")
    for key in (CONFIG_SECRET, base64.urlsafe_b64encode(os.urandom(31)).decode()):
        env = dict(os.environ, MEMORIZZ_MCP_ENCRYPTION_KEY=key)
        done = subprocess.run(
            daemon_argv(base_dir, config=config),
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            check=False,
        )
        assert done.returncode == 78, done.stdout + done.stderr
        assert_clean("memorizzd's refusal of the key", done.stdout + done.stderr, key)


def test_a_started_daemon_never_shows_its_own_keys(world: World) -> None:
    """The vault and audit keys (in the state directory) are in no output:
    ``vault rotate``, ``daemon status``, a reload, the log (``sweep``)."""
    world.add_http("v-ok", "ok")
    world.daemon.wait_ready("v-ok")
    out = world.both("vault", "rotate") + world.both("daemon", "status")
    out += world.both("daemon", "reload")
    threading.Event().wait(0.2)
    world.daemon.wait_ready("v-ok")
    called = world.both(
        "mcp", "call", "v-ok", "echo", "--arguments", '{"text": "v-ok"}'
    )
    assert "v-ok" in called
    world.sweep()
    assert_clean("memorizzctl vault/daemon", out)
