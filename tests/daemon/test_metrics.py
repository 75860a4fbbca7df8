"""Prometheus metrics (issue 13, item 4): a real daemon serves ``GET /metrics``
on ``metrics.sock`` (and on a loopback TCP address when asked), in the text
exposition the official parser reads; calls are counted by server, tool,
decision and outcome with bounded label values; ``memorizzctl daemon
metrics`` prints them; the config refuses a non-loopback listener."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from memorizz.api.errors import (
    ApprovalRequiredError,
    PermissionDeniedError,
    RemoteError,
)
from memorizzd.config import ConfigError, Decisions, Metrics, load
from memorizzd.egress.client import hardened_client
from memorizzd.telemetry.metrics import EGRESS_REFUSALS
from tests.harness import DaemonHarness, light_daemon


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def http_get(
    address: str | tuple[str, int], target: str = "/metrics", method: str = "GET"
) -> tuple[str, bytes]:
    family = socket.AF_UNIX if isinstance(address, str) else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(address)
        sock.sendall(f"{method} {target} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    head, _, body = reply.partition(b"\r\n\r\n")
    return head.decode("latin-1"), body


def samples(text: str) -> dict[str, list[Sample]]:
    found: dict[str, list[Sample]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append(sample)
    return found


def value(text: str, name: str, **labels: str) -> float:
    return sum(
        s.value
        for s in samples(text).get(name, [])
        if all(s.labels.get(k) == v for k, v in labels.items())
    )


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def harness() -> Iterator[DaemonHarness]:
    metrics = Metrics(listen=f"127.0.0.1:{free_port()}")
    with light_daemon("lite", metrics=metrics) as running:
        yield running


def metrics_sock(harness: DaemonHarness) -> str:
    return os.path.join(os.path.dirname(harness.socket), "metrics.sock")


def scrape(harness: DaemonHarness) -> str:
    head, body = http_get(metrics_sock(harness))
    assert head.startswith("HTTP/1.1 200"), head
    assert "text/plain; version=0.0.4" in head
    return body.decode()


def test_calls_are_counted_by_server_tool_decision_and_outcome(
    harness: DaemonHarness,
) -> None:
    before = scrape(harness)
    with harness.client() as c:
        c.call_tool("lite", "hello", {})
        c.call_tool("lite", "hello", {"tag": "argument values are never labels"})
        with pytest.raises(RemoteError):
            c.call_tool("made-up-server", "hello", {})
        try:
            c.call_tool("lite", "made-up-tool", {})
        except RemoteError:
            pass
    after = scrape(harness)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    ok = {"server": "lite", "tool": "hello", "decision": "allow", "outcome": "ok"}
    assert delta("memorizz_calls_total", **ok) == 2
    assert delta("memorizz_calls_total", server="other", tool="other") == 1
    assert delta("memorizz_calls_total", server="lite", tool="other") == 1
    assert delta("memorizz_call_duration_seconds_count", server="lite") == 3
    called = samples(after)["memorizz_calls_total"]
    values = {v for s in called for v in s.labels.values()}
    # names an agent made up never appear (listed tools of other tests may)
    assert not {"made-up-server", "made-up-tool"} & values
    assert "argument values" not in after


def test_the_exposition_holds_the_daemons_state_and_parses(
    harness: DaemonHarness,
) -> None:
    text = scrape(harness)
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name, kind in {
        "memorizz_calls": "counter",
        "memorizz_call_duration_seconds": "histogram",
        "memorizz_upstream_state": "gauge",
        "memorizz_upstream_reconnects": "counter",
        "memorizz_calls_in_flight": "gauge",
        "memorizz_connections": "gauge",
        "memorizz_approvals_pending": "gauge",
        "memorizz_build_info": "gauge",
        "process_resident_memory_bytes": "gauge",
        "process_open_fds": "gauge",
    }.items():
        assert families[name].type == kind, name
    assert value(text, "memorizz_upstream_state", server="lite", state="ready") == 1
    assert value(text, "memorizz_upstream_state", server="lite", state="failed") == 0
    assert value(text, "memorizz_approvals_pending") == 0
    with harness.client() as c:
        c.ping()  # an operator connection, open while the scrape runs
        during = scrape(harness)
    assert value(during, "memorizz_connections", profile="operator", socket="api") >= 1


def test_the_tcp_listener_serves_the_same_and_only_get_metrics(
    harness: DaemonHarness,
) -> None:
    host, port = harness.config.metrics.listen.split(":")
    head, body = http_get((host, int(port)))
    assert head.startswith("HTTP/1.1 200")
    assert "memorizz_upstream_state" in body.decode()
    assert http_get((host, int(port)), "/")[0].startswith("HTTP/1.1 404")
    assert http_get((host, int(port)), method="POST")[0].startswith("HTTP/1.1 405")
    head, body = http_get(metrics_sock(harness), method="HEAD")
    assert head.startswith("HTTP/1.1 200")
    assert body == b""


def test_the_metrics_socket_is_the_operators(harness: DaemonHarness) -> None:
    mode = os.stat(metrics_sock(harness)).st_mode & 0o777
    assert mode == (0o660 if os.geteuid() == 0 else 0o600)


def test_memorizzctl_daemon_metrics_prints_the_exposition(
    harness: DaemonHarness, capsys: pytest.CaptureFixture[str]
) -> None:
    assert harness.ctl("daemon", "metrics") == 0
    out = capsys.readouterr().out
    assert "# TYPE memorizz_calls_total counter" in out
    families = [f.name for f in text_string_to_metric_families(out)]
    assert "memorizz_upstream_state" in families
    missing = os.path.join(os.path.dirname(harness.socket), "nowhere.sock")
    assert harness.ctl("daemon", "metrics", "--metrics-socket", missing) == 69
    assert "cannot read the metrics" in capsys.readouterr().err


def test_a_client_that_never_sends_a_head_is_closed_and_the_daemon_serves_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # memorizzctl pointed at metrics.sock sends a JSON line, never an HTTP
    # head: at HEAD_TIMEOUT_S the responder read an unbound ``head`` and the
    # error took the whole daemon down
    monkeypatch.setattr("memorizzd.telemetry.http.HEAD_TIMEOUT_S", 0.2)
    with light_daemon("lite") as harness:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(10)
            sock.connect(metrics_sock(harness))
            sock.sendall(b'{"jsonrpc":"2.0","id":1,"method":"servers/list"}\n')
            assert sock.recv(65536) == b""  # closed unanswered at the timeout
        assert "memorizz_upstream_state" in scrape(harness)
        with harness.client() as c:
            assert [s.name for s in c.list_servers()] == ["lite"]


@pytest.mark.parametrize(
    ("listen", "allowed"),
    [
        ("127.0.0.1:9464", True),
        ("[::1]:9464", True),
        ("localhost:9464", True),
        ("0.0.0.0:9464", False),
        ("192.0.2.7:9464", False),
        ("127.0.0.1", False),
    ],
)
def test_the_tcp_listener_is_loopback_unless_allow_remote(
    tmp_path: Path, listen: str, allowed: bool
) -> None:
    path = tmp_path / "m.toml"
    path.write_text(f'socket = "{tmp_path}/d.sock"\n[metrics]\nlisten = "{listen}"\n')
    if allowed:
        assert load(str(path)).metrics.listen == listen
    else:
        with pytest.raises(ConfigError, match=r"metrics\.listen"):
            load(str(path))
    if not allowed and listen.count(".") == 3 and ":" in listen:
        path.write_text(path.read_text() + "allow_remote = true\n")
        assert load(str(path)).metrics.allow_remote


@pytest.mark.parametrize("port", ["\u00b2", "\u0663", "9" * 5000])
def test_a_port_of_other_digits_is_a_config_error(tmp_path: Path, port: str) -> None:
    # "²" passes str.isdigit and made int() raise; int() reads "٣" as 3
    path = tmp_path / "m.toml"
    path.write_text(
        f'socket = "{tmp_path}/d.sock"\n[metrics]\nlisten = "127.0.0.1:{port}"\n',
        encoding="utf-8",
    )
    with pytest.raises(ConfigError, match=r"metrics\.listen: .* is not host:port"):
        load(str(path))


def test_approvals_are_counted_proposed_pending_and_decided() -> None:
    with light_daemon("held", decisions=Decisions(write="ask")) as harness:
        before = scrape(harness)
        with harness.client() as c:
            with pytest.raises(ApprovalRequiredError) as asked:
                c.call_tool("held", "hello", {})
            pending = scrape(harness)
            c.approve(asked.value.data["proposal_id"])
            c.resume(asked.value.data["proposal_id"])
        after = scrape(harness)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert value(pending, "memorizz_approvals_pending") == 1
    assert value(after, "memorizz_approvals_pending") == 0
    assert delta("memorizz_approvals_proposed_total", server="held") == 1
    assert delta("memorizz_approvals_decided_total", decision="approved") == 1
    assert delta("memorizz_approvals_decided_total", decision="consumed") == 1
    held = {"server": "held", "tool": "hello", "decision": "ask"}
    assert delta("memorizz_calls_total", **held, outcome="approval_required") == 1
    assert delta("memorizz_calls_total", **held, outcome="ok") == 1


@pytest.mark.anyio
async def test_an_egress_refusal_is_counted_by_its_reason() -> None:
    def refused(reason: str) -> float:
        return EGRESS_REFUSALS.counts.get((reason,), 0)

    before = refused("address_not_allowed"), refused("scheme_not_allowed")
    async with hardened_client(
        limit=1 << 20,
        timeout=httpx2.Timeout(5.0),
        allowlist=[],
        allow_private_network=False,
    ) as http:
        with pytest.raises(PermissionDeniedError):
            await http.get("https://127.0.0.1/")
        with pytest.raises(PermissionDeniedError):
            await http.get("http://example.com/")
    after = refused("address_not_allowed"), refused("scheme_not_allowed")
    assert (after[0] - before[0], after[1] - before[1]) == (1, 1)


def test_the_daemon_starts_without_prometheus_client_or_importlib_metadata() -> None:
    """What the daemon imports to start serving holds no prometheus-client
    (loaded at the first scrape: telemetry/exposition.py) and no
    importlib.metadata (loaded for a credential store's entry point only):
    about 3 MB a daemon nobody scrapes does not carry."""
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            (
                "import sys, memorizzd.__main__, memorizzd.app\n"
                "print(sorted(m for m in sys.modules if m.split('.')[0] in"
                " ('prometheus_client', 'email') or m == 'importlib.metadata'))"
            ),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.strip() == "[]"
