"""The MCP conformance suite's client under test: memorizzd, driven by ``memorizz.Client``.

The suite (``conformance client --command "PYTHON tests/conformance/adapter.py"``) appends
the scenario's server URL as the last argument and sets ``MCP_CONFORMANCE_SCENARIO`` (and,
for some scenarios, ``MCP_CONFORMANCE_CONTEXT``: JSON with pre-registered credentials).

This script starts a private memorizzd (its own config, socket and state directory under
/tmp), configures the scenario's server with ``allow_private_network`` (the suite serves
plain http on localhost), lists and calls its tools as the scenario needs and, for the
``auth/*`` scenarios, logs in headlessly: it opens the authorization URL with a plain HTTP
client that does not follow redirects and hands the ``Location`` (the final callback URL) to
``auth/complete``. Everything it and the daemon talk to is the suite's localhost servers.

The OAuth surface it relies on is isolated in ``oauth_fields`` and ``login``.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

from memorizz import Client
from memorizz.api import methods as m
from memorizz.api.errors import AuthRequiredError, MemorizzError

SERVER = "conf"
CIMD_URL = "https://conformance-test.local/client-metadata.json"
"""The client ID metadata document URL ``auth/basic-cimd`` expects as ``client_id``."""
MAX_LOGINS = 5
"""The adapter's own bound on headless logins per run. Deliberately above the suite's limit
(3, ``auth/scope-retry-limit``): bounding step-up is the daemon's job, not the adapter's."""
STARTUP_S = 15.0
READY_S = 10.0

# Tool arguments per scenario (the tools the suite's servers offer).
TOOL_ARGS: dict[str, dict[str, Any]] = {
    "add_numbers": {"a": 5, "b": 3},
}
ECHO_TOOL, ECHO_OF = "json_schema_echo", "json_schema_2020_12_tool"
"""``json-schema-2020-12-preservation``: the echo tool gets the focal tool's
``inputSchema`` exactly as memorizzd lists it (what was preserved)."""
LIST_ONLY = ("json-schema-ref-no-deref",)
"""Scenarios whose server only lists its tools (a call is not answered)."""


def pause(seconds: float) -> None:
    threading.Event().wait(seconds)


def log(msg: str) -> None:
    print(f"[adapter] {msg}", file=sys.stderr, flush=True)


# --- the OAuth surface (planned API; adjust here) -----------------------------


MACHINE_SCENARIOS = (
    "auth/client-credentials-basic",
    "auth/client-credentials-jwt",
    "auth/wif-jwt-bearer",
    "auth/enterprise-managed-authorization",
)
"""Scenarios of a machine's grant: no login; the server is added through
``servers/add`` so that its secret or key goes to the vault, not a config file."""


def oauth_fields(scenario: str, context: dict[str, Any]) -> dict[str, Any]:
    """Server-entry keys for an ``auth/*`` scenario ({} for the others)."""
    if not scenario.startswith("auth/"):
        return {}
    fields: dict[str, Any] = {"auth": "oauth"}
    if scenario == "auth/wif-jwt-bearer":  # the workload's JWT from its IdP
        fields["oauth_grant"] = "jwt_bearer"
        fields["oauth_assertion"] = context["valid_jwt"]
    elif scenario == "auth/enterprise-managed-authorization":  # SEP-990
        fields["oauth_grant"] = "token_exchange"
        fields["oauth_subject_token"] = context["idp_id_token"]
        fields["oauth_idp_issuer"] = context["idp_issuer"]
        fields["oauth_idp_client_id"] = context["idp_client_id"]
    elif scenario in MACHINE_SCENARIOS:
        fields["oauth_grant"] = "client_credentials"
        if context.get("private_key_pem"):
            fields["oauth_private_key"] = context["private_key_pem"]
    if context.get("client_id"):
        fields["oauth_client_id"] = context["client_id"]
    if context.get("client_secret"):
        fields["oauth_client_secret"] = context["client_secret"]
    if scenario == "auth/basic-cimd":
        fields["oauth_client_metadata_url"] = CIMD_URL
    return fields


def login(client: Client, server: str) -> None:
    """One headless login: auth/login, follow the authorization URL, auth/complete."""
    started = client.auth_login(server)
    url = started.authorization_url
    log(f"authorization URL: {url}")
    callback = follow_authorization(url)
    log(f"callback URL: {callback}")
    client.auth_complete(server, callback)


def follow_authorization(url: str) -> str:
    """GET the authorization URL without following redirects; return ``Location``.

    Only plain-http loopback URLs are opened (the suite's servers), never anything else."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or parts.hostname not in ("localhost", "127.0.0.1"):
        raise RuntimeError(f"refusing to open a non-loopback authorization URL: {url}")
    conn = http.client.HTTPConnection("127.0.0.1", parts.port or 80, timeout=10)
    try:
        target = parts.path or "/"
        if parts.query:
            target += "?" + parts.query
        conn.request("GET", target, headers={"Host": parts.netloc})
        response = conn.getresponse()
        response.read()
        location = response.getheader("Location")
        if response.status not in (301, 302, 303, 307, 308) or not location:
            raise RuntimeError(
                f"authorization endpoint answered {response.status} without a redirect"
            )
        return urllib.parse.urljoin(url, location)
    finally:
        conn.close()


# --- the daemon -----------------------------------------------------------------


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return msgspec.json.encode(value).decode()  # a valid TOML basic string
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML for {value!r}")


def server_entry(url: str, extra: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": SERVER,
        "transport": "streamable_http",
        "url": url,
        "allow_private_network": True,
        "timeout_s": 20.0,
        **extra,
    }


def write_config(path: Path, server: dict[str, Any] | None) -> None:
    lines = [
        "connect_wait_s = 10.0",
        "backoff_initial_s = 0.1",
        "backoff_max_s = 1.0",
        "drain_timeout_s = 2.0",
    ]
    if server is not None:
        lines += [
            "",
            "[[servers]]",
            *(f"{key} = {toml_value(value)}" for key, value in server.items()),
        ]
    path.write_text("\n".join(lines) + "\n")


@contextlib.contextmanager
def running_daemon(
    base: Path, url: str, extra: dict[str, Any], *, via_api: bool = False
) -> Iterator[Client]:
    config = base / "memorizzd.toml"
    sock = base / "d.sock"
    server = server_entry(url, extra)
    write_config(config, None if via_api else server)
    daemon_log = base / "daemon.log"
    with daemon_log.open("ab") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "memorizzd",
                "--config",
                str(config),
                "--socket",
                str(sock),
                "--state-dir",
                str(base / "state"),
                "--log-level",
                "debug",
            ],
            stdout=out,
            stderr=out,
            stdin=subprocess.DEVNULL,
        )
    client = Client(str(sock))
    try:
        deadline = time.monotonic() + STARTUP_S
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"memorizzd exited with {proc.returncode}")
            try:
                client.hello(client="memorizz-conformance")
                break
            except MemorizzError:
                client.close()
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        "memorizzd did not answer on its socket"
                    ) from None
                pause(0.05)
        if via_api:
            client.add_server(msgspec.convert(server, m.ServerSpec))
        yield client
    finally:
        client.close()
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def wait_settled(client: Client) -> str:
    """Wait until the server leaves ``connecting`` (bounded); return its state."""
    deadline = time.monotonic() + READY_S
    while True:
        status = client.server_status(SERVER)[0]
        if status.state != "connecting" or time.monotonic() > deadline:
            log(f"server state: {status.state} ({status.last_error or 'no error'})")
            return status.state
        pause(0.05)


# --- the scenario ---------------------------------------------------------------


def accept_with_defaults(params: dict[str, Any]) -> dict[str, Any]:
    """An elicitation answered as a user who accepts the form unchanged would:
    each field at its schema's ``default`` (SEP-1034), fields without one left out."""
    schema = params.get("requestedSchema") or {}
    properties = schema.get("properties") or {}
    content = {
        name: prop["default"]
        for name, prop in properties.items()
        if isinstance(prop, dict) and "default" in prop
    }
    log(f"elicitation {params.get('message')!r}: accept {content}")
    return {"action": "accept", "content": content}


def arguments_for(
    name: str, schemas: dict[str, dict[str, Any]], context: dict[str, Any]
) -> dict[str, Any]:
    if name == ECHO_TOOL:  # the schema of the focal tool, as memorizzd lists it
        return {"schema": schemas.get(ECHO_OF, {})}
    for call in context.get("toolCalls") or ():  # the scenario's own arguments
        if isinstance(call, dict) and call.get("name") == name:
            return dict(call.get("arguments") or {})
    return TOOL_ARGS.get(name, {})


def exercise(
    client: Client, scenario: str = "", context: dict[str, Any] | None = None
) -> None:
    """List the tools and call each one (the scenario's checks are on the server side)."""
    tools = client.list_tools(SERVER)
    log(f"tools: {[t.name for t in tools]}")
    if scenario in LIST_ONLY:
        return
    schemas = {tool.name: tool.input_schema for tool in tools}
    for tool in tools:
        result = client.call_tool(
            SERVER,
            tool.name,
            arguments_for(tool.name, schemas, context or {}),
            on_elicit=accept_with_defaults,
        )
        log(f"{tool.name}: isError={result.is_error} {result.content!r:.300}")
        if result.is_error:
            raise RuntimeError(f"tool {tool.name} returned an error")


def wait_ready(client: Client) -> None:
    """A machine grant: wait (bounded) for the daemon to get its token and connect."""
    deadline = time.monotonic() + READY_S
    while True:
        status = client.server_status(SERVER)[0]
        if status.state == "ready" or time.monotonic() > deadline:
            log(f"server state: {status.state} ({status.last_error or 'no error'})")
            return
        pause(0.05)


def drive(client: Client, scenario: str, context: dict[str, Any]) -> None:
    if scenario in MACHINE_SCENARIOS:
        wait_ready(client)
        exercise(client)
        return
    wait_settled(client)
    if not scenario.startswith("auth/"):
        exercise(client, scenario, context)
        return
    logins = 0
    while True:
        try:
            exercise(client)
            return
        except AuthRequiredError as exc:
            log(f"{exc.reason}: {exc}")
            if logins >= MAX_LOGINS:
                raise
            logins += 1
            log(f"login {logins}")
            login(client, SERVER)


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: adapter.py SERVER_URL", file=sys.stderr)
        return 2
    url = argv[-1]
    scenario = os.environ.get("MCP_CONFORMANCE_SCENARIO", "")
    context = msgspec.json.decode(
        os.environ.get("MCP_CONFORMANCE_CONTEXT") or "{}", type=dict[str, Any]
    )
    log(f"scenario {scenario!r}, server {url}")
    base = Path(tempfile.mkdtemp(prefix="mz-conf-", dir="/tmp"))
    ok = False
    try:
        with running_daemon(
            base,
            url,
            oauth_fields(scenario, context),
            via_api=scenario in MACHINE_SCENARIOS,
        ) as client:
            drive(client, scenario, context)
        ok = True
    except (MemorizzError, RuntimeError, OSError, AttributeError) as exc:
        log(f"FAILED: {type(exc).__name__}: {exc}")
    finally:
        daemon_log = base / "daemon.log"
        show = not ok or os.environ.get("MEMORIZZ_CONFORMANCE_LOG")
        if show and daemon_log.exists():
            sys.stderr.write(daemon_log.read_text(errors="replace")[-20000:])
        if os.environ.get("MEMORIZZ_CONFORMANCE_KEEP"):
            log(f"kept {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
