"""``servers/test`` and ``memorizzctl mcp test``: one honest outcome per server.

``ok`` only after a fresh ``tools/list``; otherwise why not: an authentication
challenge (``authorization_required``), nothing listening or no executable
(``unreachable``), the egress or execution policy (``refused_by_policy``), a
certificate that does not verify (``tls_error``). All of it on loopback.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from memorizz.api.errors import AuthRequiredError
from memorizz.api.methods import ServerSpec
from memorizz.ctl.render import render_test
from memorizzd.egress import client as egress_client
from memorizzd.egress.backend import Network
from tests.daemon.test_static_auth import guarded, http_spec
from tests.egress_world import (
    PUBLIC_NAME,
    PUBLIC_V4,
    FakeDNS,
    LoopbackDial,
    mcp_app,
    serve,
    tls_material,
)
from tests.harness import (
    DaemonHarness,
    daemon_config,
    serve_http,
    stdio_spec,
    wait_until,
)


@pytest.fixture(scope="module")
def plain_url() -> Iterator[str]:
    with serve_http("streamable_http") as url:
        yield url


@pytest.fixture(scope="module")
def guarded_url() -> Iterator[str]:
    with serve_http("streamable_http", wrap=guarded) as url:
        yield url


def plain_http(name: str, url: str) -> ServerSpec:
    return ServerSpec(
        name=name, transport="streamable_http", url=url, allow_private_network=True
    )


def settled(d: DaemonHarness, name: str) -> None:
    with d.client() as c:
        wait_until(
            lambda: c.server_status(name)[0].state in ("backoff", "failed"),
            what=f"{name}: a failed connect",
        )


def test_ok_for_stdio_and_http(daemon: DaemonHarness, plain_url: str) -> None:
    daemon.add(stdio_spec("s"))
    daemon.add(plain_http("h", plain_url))
    with daemon.client() as c:
        for name in ("s", "h"):
            result = c.test_server(name)
            assert result.outcome == "ok", result
            assert result.tool_count
            assert result.latency_ms is not None


def test_a_401_is_authorization_required(base_dir: str, guarded_url: str) -> None:
    config = daemon_config(base_dir, connect_wait_s=0.2)
    with DaemonHarness.running(config) as d:
        with d.client() as c:
            c.add_server(plain_http("a", guarded_url))
        settled(d, "a")
        with d.client() as c:
            result = c.test_server("a")
            assert result.outcome == "authorization_required"
            assert (result.auth, result.source) == ("none", "api")  # facts
            assert "memorizzctl" not in result.message  # the hint is the CLI's
            hint = render_test(result)
            assert "memorizzctl mcp remove a" in hint
            assert "--token -" in hint
            assert result.tool_count is None
            status = c.server_status("a")[0]
            assert status.last_error is not None
            assert "authorization required: the server answered 401" in (
                status.last_error
            )
            with pytest.raises(AuthRequiredError) as caught:
                c.call_tool("a", "echo", {"text": "hi"})
            assert caught.value.reason == "authorization_required"


def test_the_right_token_passes_the_same_guard(
    daemon: DaemonHarness, guarded_url: str
) -> None:
    daemon.add(http_spec("a", guarded_url))
    with daemon.client() as c:
        assert c.test_server("a").outcome == "ok"


def test_unreachable_http_and_stdio(base_dir: str) -> None:
    with socket.socket() as sock:  # a port nobody listens on (closed again)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    servers = [
        stdio_spec("missing", command="/nonexistent/memorizz-no-such-server"),
        stdio_spec("exits", args=["/nonexistent/memorizz-no-such-script.py"]),
    ]
    with DaemonHarness.running(daemon_config(base_dir, servers=servers)) as d:
        with d.client() as c:
            c.add_server(plain_http("closed", f"http://127.0.0.1:{port}/mcp"))
        for name in ("missing", "exits", "closed"):
            settled(d, name)
            with d.client() as c:
                result = c.test_server(name)
            assert result.outcome == "unreachable", result
            assert result.message


def test_a_host_off_the_allowlist_is_refused_by_policy(
    base_dir: str, plain_url: str
) -> None:
    config = daemon_config(
        base_dir,
        host_allowlist=["only.example.test"],
        servers=[plain_http("off", plain_url)],
    )
    with DaemonHarness.running(config) as d:
        settled(d, "off")
        with d.client() as c:
            result = c.test_server("off")
    assert result.outcome == "refused_by_policy"
    assert "host_not_allowed" in result.message


def test_a_stored_command_off_the_allowlist_is_refused_by_policy(
    base_dir: str,
) -> None:
    with DaemonHarness.running(daemon_config(base_dir)) as d:
        d.add(stdio_spec("kept"))
    config = daemon_config(base_dir, stdio_allowlist=["/bin/true"])
    with DaemonHarness.running(config) as d, d.client() as c:
        result = c.test_server("kept")
    assert result.outcome == "refused_by_policy"
    assert "command not allowed" in result.message


def test_an_untrusted_certificate_is_a_tls_error(
    base_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with (
        tls_material() as tls,
        tls_material() as other,
        serve(mcp_app("streamable_http"), tls) as port,
    ):
        dial = LoopbackDial()
        dial.routes[(PUBLIC_V4, 443)] = port
        network = Network(
            resolve=FakeDNS({PUBLIC_NAME: [PUBLIC_V4]}),
            dial=dial,
            ssl_context=other.client_context(),  # trusts another CA
        )
        monkeypatch.setattr(egress_client, "DEFAULT_NETWORK", network)
        spec = ServerSpec(
            name="tls",
            transport="streamable_http",
            url=f"https://{PUBLIC_NAME}/mcp",
        )
        config = daemon_config(base_dir, host_allowlist=["*.example.test"])
        with DaemonHarness.running(config) as d:
            with d.client() as c:
                c.add_server(spec)
            settled(d, "tls")
            with d.client() as c:
                result = c.test_server("tls")
    assert result.outcome == "tls_error", result
    assert dial.dialled


def test_the_cli_exits_0_only_for_ok(
    base_dir: str, plain_url: str, guarded_url: str, capsys: Any
) -> None:
    config = daemon_config(base_dir, connect_wait_s=0.2)
    with DaemonHarness.running(config) as d:
        d.add(plain_http("good", plain_url))
        with d.client() as c:
            c.add_server(plain_http("locked", guarded_url))
        settled(d, "locked")
        capsys.readouterr()
        assert d.ctl("mcp", "test", "good") == 0
        assert "good: ok" in capsys.readouterr().out
        assert d.ctl("mcp", "test", "locked") == 1
        out = capsys.readouterr().out
        assert out.startswith("locked: authorization_required: ")
        assert out.count("\n") == 1


def test_a_stdio_child_that_exits_at_once_has_a_reason(base_dir: str) -> None:
    exits = stdio_spec("exits", command=sys.executable, args=["-V"])
    with DaemonHarness.running(daemon_config(base_dir, servers=[exits])) as d:
        settled(d, "exits")
        with d.client() as c:
            assert c.test_server("exits").outcome == "unreachable"
