"""A server spec is validated once (``memorizz.api.spec``), by the CLI and the daemon.

``memorizzctl mcp add`` refuses a spec that cannot work before it touches the
socket, and ``servers/add`` refuses the same spec with the same ``reason`` and
message; what needs the daemon's state (the host allowlist, the address
checks, the stdio allowlist) stays in the daemon. And ``servers/test``
answers facts; the hints saying what to do live in the CLI's renderer.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from memorizz import cli
from memorizz.api import methods as m
from memorizz.api.errors import RemoteError
from memorizz.api.spec import check_server_spec
from memorizz.ctl.render import render_test
from tests.harness import DaemonHarness, daemon_config, rmtree, short_tempdir

URL = "https://mcp.example.test/mcp"

# (mcp add's arguments after NAME, the ServerSpec they describe, reason, a
# fragment of the message)
CASES: list[tuple[str, list[str], dict[str, Any], str, str]] = [
    (
        "bad name",
        ["--command", "/bin/true"],
        {"transport": "stdio", "command": "/bin/true"},
        "invalid_params",
        "may contain only letters",
    ),
    (
        "s",
        ["--transport", "stdio", "--command", "/bin/true", "--url", URL],
        {"transport": "stdio", "command": "/bin/true", "url": URL},
        "invalid_params",
        "transport stdio takes no url",
    ),
    (
        "s",
        ["--transport", "sse"],
        {"transport": "sse"},
        "invalid_params",
        "transport sse needs a url",
    ),
    (
        "h",
        ["--url", URL, "--env", "A=1"],
        {"transport": "streamable_http", "url": URL, "env": {"A": "1"}},
        "invalid_params",
        "are for stdio servers",
    ),
    (
        "h",
        ["--url", URL, "--auth", "bearer"],
        {"transport": "streamable_http", "url": URL, "auth": "bearer"},
        "invalid_params",
        "auth bearer needs a token",
    ),
    (
        "h",
        ["--url", URL, "--header", "Host: evil.example.test"],
        {
            "transport": "streamable_http",
            "url": URL,
            "headers": {"Host": "evil.example.test"},
        },
        "invalid_params",
        "is set by the transport",
    ),
    (
        "h",
        ["--url", URL, "--client-id", "app"],
        {"transport": "streamable_http", "url": URL, "oauth_client_id": "app"},
        "invalid_params",
        'the oauth_* settings need auth = "oauth"',
    ),
    (
        "s",
        ["--command", "/bin/true", "--secret-env", "LD_PRELOAD=/tmp/x.so"],
        {
            "transport": "stdio",
            "command": "/bin/true",
            "secret_env": {"LD_PRELOAD": "/tmp/x.so"},
        },
        "invalid_params",
        "belongs in env, not secret_env",
    ),
    (
        "s",
        ["--command", "/bin/true", "--max-result-bytes", "10"],
        {"transport": "stdio", "command": "/bin/true", "max_result_bytes": 10},
        "invalid_params",
        "max_result_bytes must be in",
    ),
    (
        "s",
        ["--command", "/bin/true", "--timeout", "5000"],
        {"transport": "stdio", "command": "/bin/true", "timeout_s": 5000.0},
        "invalid_params",
        "timeout_s must be in",
    ),
    (
        "f",
        ["--url", "ftp://mcp.example.test/mcp"],
        {"transport": "streamable_http", "url": "ftp://mcp.example.test/mcp"},
        "scheme_not_allowed",
        "scheme_not_allowed",
    ),
]


@pytest.fixture(scope="module")
def daemon() -> Iterator[DaemonHarness]:
    base = short_tempdir()
    try:
        with DaemonHarness.running(daemon_config(base)) as harness:
            yield harness
    finally:
        rmtree(base)


@pytest.mark.parametrize(
    ("name", "argv", "spec", "reason", "fragment"),
    CASES,
    ids=[case[4] for case in CASES],
)
def test_the_cli_and_the_daemon_refuse_a_spec_alike(
    daemon: DaemonHarness,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Any,
    name: str,
    argv: list[str],
    spec: dict[str, Any],
    reason: str,
    fragment: str,
) -> None:
    with daemon.client() as c, pytest.raises(RemoteError) as refused:
        c.add_server(m.ServerSpec(name=name, **spec))
    assert refused.value.reason == reason
    assert fragment in refused.value.message

    missing = os.path.join(tmp_path, "none.sock")  # offline: never reached
    capsys.readouterr()
    assert cli.main(["--socket", missing, "mcp", "add", name, *argv]) == 2
    err = capsys.readouterr().err
    said = refused.value.message  # with its reason, unless it begins with it
    if not said.startswith(f"{reason}:"):
        said += f" ({reason})"
    assert f"error: {said}\n" in err
    assert "cannot reach" not in err

    with pytest.raises(RemoteError) as checked:  # the one function both run
        check_server_spec(m.ServerSpec(name=name, **spec))
    assert (checked.value.reason, checked.value.message) == (
        reason,
        refused.value.message,
    )


def test_what_needs_the_daemons_state_stays_in_the_daemon(
    daemon: DaemonHarness,
) -> None:
    """A well-formed spec passes the shared checks; the egress policy (here:
    no loopback address without allow_private_network) is the daemon's alone."""
    spec = m.ServerSpec(
        name="h", transport="streamable_http", url="https://127.0.0.1/mcp"
    )
    check_server_spec(spec)
    with daemon.client() as c, pytest.raises(RemoteError) as refused:
        c.add_server(spec)
    assert refused.value.reason == "address_not_allowed"


# --- servers/test: facts from the daemon, hints from the CLI --------------------


def _failed(outcome: str, **facts: Any) -> m.ServersTestResult:
    return m.ServersTestResult(
        name="a",
        outcome=outcome,  # type: ignore[arg-type]  # each outcome, as a str
        message="authorization required: the server answered 401",
        tool_count=None,
        latency_ms=None,
        **facts,
    )


@pytest.mark.parametrize(
    ("facts", "hint"),
    [
        ({"auth": "oauth"}, "log in again (`memorizzctl mcp login a`)"),
        ({"source": "config"}, "in its [[servers]] entry in the config file"),
        ({"source": "api"}, "`memorizzctl mcp remove a`, then `memorizzctl mcp add"),
    ],
)
def test_an_authorization_hint_is_keyed_by_outcome_and_facts(
    facts: dict[str, Any], hint: str
) -> None:
    line = render_test(_failed("authorization_required", **facts))
    assert line.startswith(
        "a: authorization_required: authorization required: the server answered 401; "
    )
    assert hint in line
    assert line.count("\n") == 1


def test_outcomes_without_a_hint_show_the_message_alone() -> None:
    line = render_test(_failed("timeout"))
    assert line == "a: timeout: authorization required: the server answered 401\n"
    assert "TLS handshake failed" in render_test(_failed("tls_error"))


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        (
            {"oauth_grant": "client_credentials", "oauth_private_key": ""},
            "oauth_private_key must be a PEM private key",
        ),
        (
            {"oauth_grant": "jwt_bearer", "oauth_assertion": ""},
            "oauth_assertion must be a JWT",
        ),
        (
            {
                "oauth_grant": "token_exchange",
                "oauth_subject_token": "",
                "oauth_idp_issuer": "https://idp.example.test",
            },
            "oauth_subject_token must be an ID token",
        ),
        (
            {
                "oauth_grant": "token_exchange",
                "oauth_subject_token_file": "/run/id.jwt",
                "oauth_idp_issuer": "https://idp.example.test",
                "oauth_idp_client_id": "idp",
                "oauth_idp_client_secret": "",
            },
            "oauth_idp_client_secret must be non-empty",
        ),
    ],
)
def test_an_empty_oauth_secret_is_refused_as_given(
    fields: dict[str, Any], says: str
) -> None:
    """An empty secret passed (a config file, servers/add), was then read as
    "in the vault", and failed at the first token request."""
    spec = m.ServerSpec(
        name="robot",
        transport="streamable_http",
        url=URL,
        auth="oauth",
        oauth_client_id="machine",
        **fields,
    )
    with pytest.raises(RemoteError, match=says) as refused:
        check_server_spec(spec)
    assert refused.value.reason == "invalid_params"
