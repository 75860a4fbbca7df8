"""memorizzctl's side of a call's requests (issue 11, item 7): a terminal's
``mcp call`` answers an elicitation by prompting per field (``Prompter``),
and Ctrl-C cancels the call, upstream too (``notifications/cancelled`` on the
socket API), through a real daemon and the real ``Client``."""

from __future__ import annotations

import io
import socket
from collections.abc import Iterator

import msgspec
import pytest

from memorizz.ctl.text import Prompter
from tests.harness import (
    DaemonHarness,
    daemon_config,
    rmtree,
    short_tempdir,
    stdio_spec,
)
from tests.process import wait_until

FORM = {
    "message": "Who are you?",
    "requestedSchema": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "title": "Your name"},
            "age": {"type": "integer"},
            "admin": {"type": "boolean"},
        },
        "required": ["name"],
    },
}


def test_a_terminal_answers_an_elicitation_field_by_field() -> None:
    out = io.StringIO()
    answer = Prompter(io.StringIO("\nAda\nforty\n40\ny\n"), out).answer(FORM)
    assert answer == {
        "action": "accept",
        "content": {"name": "Ada", "age": 40, "admin": True},
    }
    shown = out.getvalue()
    assert "the server asks: Who are you?" in shown
    assert "Your name (string)" in shown
    assert "(required)" in shown
    assert "not a integer" in shown


def test_end_of_input_declines_and_a_url_is_shown_to_open() -> None:
    assert Prompter(io.StringIO(""), io.StringIO()).answer(FORM) == {
        "action": "decline"
    }
    out = io.StringIO()
    url = {"mode": "url", "message": "Log in", "url": "https://example.invalid/x"}
    assert Prompter(io.StringIO("y\n"), out).answer(url) == {"action": "accept"}
    assert "open: https://example.invalid/x" in out.getvalue()


@pytest.fixture(scope="module")
def harness() -> Iterator[DaemonHarness]:
    base = short_tempdir()
    try:
        with DaemonHarness.running(
            daemon_config(base, servers=[stdio_spec("t")])
        ) as running:
            running.wait_ready("t")
            yield running
    finally:
        rmtree(base)


def _last_record(harness: DaemonHarness, tool: str) -> object:
    with harness.client() as c:
        records = c.audit(tool=tool, limit=1).records
    return records[0] if records else None


def test_ctrl_c_during_a_call_cancels_it_upstream_too(harness: DaemonHarness) -> None:
    """The ``Client`` interrupted mid-call (as by Ctrl-C) sends
    ``notifications/cancelled``: the daemon stops the call and its upstream
    request, whatever its effects, and records it as cancelled."""

    def interrupt(report: object) -> None:
        raise KeyboardInterrupt

    with harness.client() as c, pytest.raises(KeyboardInterrupt):
        c.call_tool("t", "progressing", {"steps": 2000}, on_progress=interrupt)

    def recorded() -> bool:
        record = _last_record(harness, "progressing")
        return getattr(record, "outcome", None) == "client_aborted"

    wait_until(recorded, what="the cancelled call's audit record")
    record = _last_record(harness, "progressing")
    assert getattr(record, "reason", None) == "cancelled"


def test_a_socket_client_cancels_its_request_and_the_connection_lives_on(
    harness: DaemonHarness,
) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(harness.socket)
        lines = sock.makefile("rb")
        call = {"server": "t", "name": "slow", "arguments": {"seconds": 30}}
        sock.sendall(
            msgspec.json.encode(
                {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": call}
            )
            + b"\n"
        )
        wait_until(
            lambda: any(u.in_flight for u in [harness.daemon.pool.get("t")]),
            what="the call in flight",
        )
        cancel = {"requestId": 7, "reason": "enough"}
        sock.sendall(
            msgspec.json.encode(
                {
                    "jsonrpc": "2.0",
                    "method": "notifications/cancelled",
                    "params": cancel,
                }
            )
            + b"\n"
        )
        sock.sendall(b'{"jsonrpc":"2.0","id":8,"method":"ping"}\n')
        reply = msgspec.json.decode(lines.readline())
    assert reply["id"] == 8, reply  # no reply to the cancelled call comes first
    wait_until(
        lambda: (
            getattr(_last_record(harness, "slow"), "outcome", None) == "client_aborted"
        ),
        what="the cancelled call's audit record",
    )
