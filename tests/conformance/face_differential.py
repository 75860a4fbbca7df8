"""The conformance suite's SERVER scenarios, direct and through the MCP face (a differential).

Run by scripts/conformance-face (which installs the suite first); not a pytest module.

    face_differential.py --prefix .conformance --run-dir DIR [SCENARIO ...]

It starts, all on loopback:

* the upstream: the suite's reference server (tests/conformance/everything-server.mts,
  copied into PREFIX so that its imports resolve there), on 127.0.0.1:P1;
* a private memorizzd (config, socket and state under a temporary directory) whose only
  server is that upstream (``allow_private_network``; every risk class ``allow``, since
  this measures protocol transparency, not approvals). A scope of one server keeps the
  names unchanged, so the scenarios' tool, prompt and resource names are the upstream's;
* ``memorizzctl mcp serve --transport streamable-http --listen 127.0.0.1:P2
  --token-file F`` (its defaults: bearer token required, loopback, Host/Origin checks);
* tests/conformance/bearer_proxy.mjs on 127.0.0.1:P3, which adds the bearer token (the
  suite's ``server`` mode cannot send a header) and forwards to P2.

Then, per scenario, ``conformance server --url`` twice: ``http://localhost:P1/mcp``
(direct) and ``http://localhost:P3/mcp`` (face). It prints both columns and exits 1 if a
scenario that passes direct fails through the face, unless NOT_APPLICABLE names it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec

from memorizz import Client
from memorizz.api.errors import MemorizzError

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
SERVER = "everything"
STARTUP_S = 20.0

NOT_APPLICABLE: dict[str, str] = {
    # What the face (or its HTTP bridge) cannot carry, each with why. A scenario named
    # here is reported, never gated; one that starts passing is flagged "stale". None
    # now: completion, subscriptions, logging, sampling and elicitation are served by
    # the face, and the bridge streams what the daemon sends during a call (the POST's
    # event stream) and outside one (the session's GET stream).
}

PARTLY: dict[str, str] = {
    # Scenarios that pass through the face on fewer checks than direct: the checks the
    # face does not reach are the suite's informational ones, each said here.
    "server-sse-polling": (
        "SEP-1699's priming event, retry field and resumption by Last-Event-ID are not"
        " checked through the face: the upstream closes its stream mid-call, the daemon"
        " resumes it, and the bridge answers the call as JSON, the answer being the first"
        " thing the call hears (a call's event stream, when it has one, opens with a"
        " priming event and resumes by Last-Event-ID: tests/e2e/test_face_http_streams.py)"
    ),
    "server-sse-multiple-streams": (
        "three concurrent tools/list POSTs are all answered, as JSON (the answer is the"
        " first thing each hears), so whether SSE streams work is not checked"
    ),
}


def log(msg: str) -> None:
    print(f"conformance-face: {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_port(port: int, proc: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + STARTUP_S
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        with (
            contextlib.suppress(OSError),
            socket.create_connection(("127.0.0.1", port), 0.5),
        ):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not listen on 127.0.0.1:{port}")
        threading.Event().wait(0.05)


class Stack:
    """The processes, stopped in reverse order of start."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []

    def start(
        self,
        name: str,
        argv: list[str],
        cwd: str | None = None,
        env: dict[str, str] | None = None,
    ) -> subprocess.Popen[bytes]:
        out = (self.base / f"{name}.log").open("ab")
        proc = subprocess.Popen(
            argv, stdout=out, stderr=out, stdin=subprocess.DEVNULL, cwd=cwd, env=env
        )
        out.close()
        self.procs.append((name, proc))
        return proc

    def stop(self) -> None:
        for _name, proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def write_config(path: Path, upstream_url: str) -> None:
    path.write_text(
        "\n".join(
            [
                "connect_wait_s = 10.0",
                "backoff_initial_s = 0.1",
                "backoff_max_s = 1.0",
                "drain_timeout_s = 2.0",
                "",
                "[decisions]",
                'read = "allow"',
                'write = "allow"',
                'destructive = "allow"',
                "",
                "[[servers]]",
                f'name = "{SERVER}"',
                'transport = "streamable_http"',
                f'url = "{upstream_url}"',
                "allow_private_network = true",
                "timeout_s = 20.0",
                "",
            ]
        )
    )


def wait_ready(sock: Path, daemon: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + STARTUP_S
    client = Client(str(sock))
    try:
        while True:
            if daemon.poll() is not None:
                raise RuntimeError(f"memorizzd exited with {daemon.returncode}")
            try:
                state = client.server_status(SERVER)[0].state
                if state == "ready":
                    return
            except MemorizzError:
                client.close()
                state = "no answer"
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"upstream {SERVER!r} not ready through memorizzd ({state})"
                )
            threading.Event().wait(0.05)
    finally:
        client.close()


@contextlib.contextmanager
def stack(prefix: Path, base: Path) -> Iterator[tuple[str, str]]:
    """Start everything; yield (direct URL, face URL)."""
    prefix = prefix.resolve()
    node = str(prefix / "node_modules" / "node" / "bin" / "node")
    upstream_port, bridge_port, proxy_port = free_port(), free_port(), free_port()
    procs = Stack(base)
    try:
        server_file = prefix / "everything-server.mts"
        shutil.copyfile(HERE / "everything-server.mts", server_file)
        upstream = procs.start(
            "upstream",
            [node, str(server_file)],
            cwd=str(prefix),
            env={**os.environ, "PORT": str(upstream_port)},
        )
        wait_port(upstream_port, upstream, "the upstream (everything-server)")
        upstream_url = f"http://localhost:{upstream_port}/mcp"

        config, sock = base / "memorizzd.toml", base / "d.sock"
        write_config(config, upstream_url)
        daemon = procs.start(
            "memorizzd",
            [sys.executable, "-m", "memorizzd", "--config", str(config), "--socket", str(sock),
             "--state-dir", str(base / "state"), "--log-level", "info"],
        )  # fmt: skip
        wait_ready(sock, daemon)

        token_file = base / "token"
        fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(32) + "\n")
        ctl = str(Path(sys.executable).parent / "memorizzctl")
        bridge = procs.start(
            "bridge",
            [ctl, "mcp", "serve", "--transport", "streamable-http", "--socket", str(sock),
             "--listen", f"127.0.0.1:{bridge_port}", "--token-file", str(token_file)],
        )  # fmt: skip
        wait_port(
            bridge_port, bridge, "memorizzctl mcp serve --transport streamable-http"
        )
        proxy = procs.start(
            "proxy",
            [node, str(HERE / "bearer_proxy.mjs"), str(proxy_port), str(bridge_port),
             str(token_file)],
        )  # fmt: skip
        wait_port(proxy_port, proxy, "bearer_proxy.mjs")
        yield upstream_url, f"http://localhost:{proxy_port}/mcp"
    finally:
        procs.stop()


class Check(msgspec.Struct):
    """One entry of the suite's checks.json (the fields read here)."""

    status: str = ""


CHECKS = msgspec.json.Decoder(list[Check])


def tally(checks_file: Path | None) -> tuple[str, str]:
    """A scenario's result from its checks.json: (PASS or FAIL, "passed/total")."""
    checks = CHECKS.decode(checks_file.read_bytes()) if checks_file else []
    passed = sum(c.status == "SUCCESS" for c in checks)
    failed = sum(c.status == "FAILURE" for c in checks)
    return ("PASS" if checks and not failed else "FAIL"), f"{passed}/{passed + failed}"


RESULT_DIR = re.compile(r"^server-(.*)-\d{4}-\d{2}-\d{2}T[\d-]+Z$")
"""The suite's result directory per scenario: server-<scenario>-<ISO time>."""


def run_column(
    suite: list[str],
    url: str,
    scenarios: list[str],
    batch: bool,
    out: Path,
    timeout_s: float,
) -> dict[str, tuple[str, str]]:
    """``conformance server`` against ``url``: every scenario in one run (``batch``:
    ``--suite all``, one Node.js start) or one run each. Scenario -> result."""
    runs = [["--suite", "all"]] if batch else [["--scenario", s] for s in scenarios]
    budget = timeout_s * (len(scenarios) if batch else 1)
    out.mkdir(parents=True, exist_ok=True)
    timed_out: set[str] = set()
    for extra in runs:
        with (out / "suite.log").open("ab") as log_file:
            try:
                subprocess.run(
                    [*suite, "server", "--url", url, *extra, "-o", str(out)],
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    cwd=str(out),
                    timeout=budget,
                    check=False,
                )
            except subprocess.TimeoutExpired:
                timed_out.update(scenarios if batch else extra[1:])
    results: dict[str, tuple[str, str]] = {}
    for checks_file in sorted(out.glob("server-*/checks.json")):
        match = RESULT_DIR.match(checks_file.parent.name)
        if match:
            results[match.group(1)] = tally(checks_file)
    for name in timed_out:
        results.setdefault(name, ("TIMEOUT", "-"))
    return results


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prefix", type=Path, required=True)
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--timeout-s", type=float, default=60.0)
    parser.add_argument("--list", action="store_true")
    parser.add_argument("scenarios", nargs="*")
    args = parser.parse_args(argv)
    node = str(args.prefix / "node_modules" / "node" / "bin" / "node")
    suite_js = args.prefix / "node_modules" / "@modelcontextprotocol" / "conformance"
    suite = [node, str(suite_js / "dist" / "index.js")]
    listing = subprocess.run(
        [*suite, "list", "--server"], capture_output=True, text=True, check=True
    ).stdout
    known: dict[str, str] = {}
    for line in listing.splitlines():
        if line.startswith("  - ") and line.endswith("]"):
            name, _, versions = line[4:].partition(" [")
            known[name] = versions.rstrip("]")
    if args.list:
        for name, versions in known.items():
            print(f"{name} {versions}")
        return 0
    scenarios = args.scenarios or list(known)
    unknown = [s for s in scenarios if s not in known]
    if unknown:
        log(f"unknown scenario(s) {', '.join(unknown)} (see --list)")
        return 2
    args.run_dir.mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="mz-conf-face-", dir="/tmp"))
    rows: list[tuple[str, str, str, str, str]] = []
    gate_failed = False
    try:
        with stack(args.prefix, base) as (direct_url, face_url):
            log(f"direct {direct_url}, face {face_url} (logs: {base})")
            batch = not args.scenarios
            columns = {
                column: run_column(
                    suite, url, scenarios, batch, args.run_dir / column, args.timeout_s
                )
                for column, url in (("direct", direct_url), ("face", face_url))
            }
            for scenario in scenarios:
                direct, direct_n = columns["direct"].get(
                    scenario, ("FAIL", "no result")
                )
                face, face_n = columns["face"].get(scenario, ("FAIL", "no result"))
                why = NOT_APPLICABLE.get(scenario)
                if direct != "PASS":
                    note = "upstream fails it direct: not compared"
                elif face == "PASS":
                    note = (
                        "stale: passes now, remove from NOT_APPLICABLE"
                        if why
                        else "fewer checks (see below)"
                        if scenario in PARTLY
                        else ""
                    )
                elif why:
                    note = "not applicable through a proxy (see below)"
                else:
                    note = "REGRESSION: passes direct, fails through the face"
                    gate_failed = True
                log(f"{scenario}: direct {direct} {direct_n}, face {face} {face_n}")
                rows.append(
                    (
                        scenario,
                        f"{direct} {direct_n}",
                        f"{face} {face_n}",
                        known[scenario],
                        note,
                    )
                )
    except RuntimeError as exc:
        log(f"FAILED to start: {exc}")
        for name in ("upstream", "memorizzd", "bridge", "proxy"):
            path = base / f"{name}.log"
            if path.exists():
                sys.stderr.write(
                    f"--- {name}.log\n{path.read_text(errors='replace')[-4000:]}"
                )
        return 1
    finally:
        for name in ("upstream", "memorizzd", "bridge", "proxy"):
            path = base / f"{name}.log"
            if path.exists():
                shutil.copyfile(path, args.run_dir / f"{name}.log")
        shutil.rmtree(base, ignore_errors=True)

    header = ("scenario", "direct", "face", "spec versions", "note")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, tuple("-" * w for w in widths), *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    print()
    for name in scenarios:
        if name in NOT_APPLICABLE:
            print(f"not applicable: {name}: {NOT_APPLICABLE[name]}")
        elif name in PARTLY:
            print(f"fewer checks through the face: {name}: {PARTLY[name]}")
    both = sum(r[1].startswith("PASS") and r[2].startswith("PASS") for r in rows)
    direct_ok = sum(r[1].startswith("PASS") for r in rows)
    print(
        f"\n{both}/{direct_ok} scenarios that pass direct also pass through the face"
        f" ({len(rows)} run); details: {args.run_dir}"
    )
    return 1 if gate_failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
