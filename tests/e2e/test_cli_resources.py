"""``memorizzctl mcp complete`` and ``memorizzctl mcp watch`` against a real daemon.

``complete`` prints the server's values, one a line; ``watch`` subscribes
and prints one line per update (``SERVER URI``; ``--json``: the
notification's params) until Ctrl-C, which ends it with exit 0 and lets go
of the subscriptions. Behind the daemon, tests/features_server.py (``feat``:
completions and subscriptions; its ``touch`` tool says a resource changed)
and tests/mcp_server.py in the handshake era (``plain``: neither).
``watch`` runs as the installed executable, interrupted by a real SIGINT.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import msgspec
import pytest

from tests.harness import (
    DaemonHarness,
    daemon_config,
    features_spec,
    stdio_spec,
    tempdir_fixture,
    wait_until,
)
from tests.process import MEMORIZZCTL

WAIT_S = 15.0
WATCHED = "feat://watched"
RED = "feat://colors/red"


base = tempdir_fixture()


@pytest.fixture(scope="module")
def harness(base: str) -> Iterator[DaemonHarness]:
    log = os.path.join(base, "subs.log")
    Path(log).touch()
    servers = [
        features_spec("feat", env={"SUB_LOG": log}),
        stdio_spec("plain", protocol="legacy"),
    ]
    with DaemonHarness.running(daemon_config(base, servers=servers)) as running:
        running.wait_ready("feat")
        running.wait_ready("plain")
        yield running


def _asked(base: str) -> list[str]:
    return Path(base, "subs.log").read_text(encoding="utf-8").splitlines()


def _touch(harness: DaemonHarness, uri: str) -> None:
    with harness.client() as c:
        c.call_tool("feat", "touch", {"uri": uri})


# --- mcp complete ----------------------------------------------------------------


def test_complete_prints_the_servers_values_one_a_line(
    harness: DaemonHarness, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        harness.ctl("mcp", "complete", "feat", "--prompt", "pick", "color", "gr") == 0
    )
    assert capsys.readouterr().out == "green@prompt\ngrey@prompt\n"
    template = ("--resource-template", "feat://colors/{color}")
    assert harness.ctl("mcp", "complete", "feat", *template, "color", "b") == 0
    assert capsys.readouterr().out == "blue@template\n"
    assert harness.ctl("mcp", "complete", "feat", *template, "color", "x") == 0
    assert capsys.readouterr().out == "no completions\n"
    argv = ("--json", "mcp", "complete", "feat", *template, "color", "")
    assert harness.ctl(*argv, "--context", "shade=dark") == 0
    printed = msgspec.json.decode(capsys.readouterr().out)
    assert printed == {
        "completion": {
            "values": [f"{c}@template" for c in ("red", "green", "blue", "grey")],
            "total": 4,
            "hasMore": False,
        }
    }


def test_complete_refusals_and_usage_have_the_documented_exit_statuses(
    harness: DaemonHarness, capsys: pytest.CaptureFixture[str]
) -> None:
    assert harness.ctl("mcp", "complete", "plain", "--prompt", "greet", "name", "") == 1
    assert capsys.readouterr().err == (
        "memorizzctl: error: server 'plain' offers no completions (method_not_found)\n"
    )
    assert harness.ctl("mcp", "complete", "nope", "--prompt", "x", "a", "") == 1
    assert "(unknown_server)" in capsys.readouterr().err
    # neither or both of --prompt and --resource-template: refused before the socket
    assert harness.ctl("mcp", "complete", "feat", "color", "r") == 2
    both = ("--prompt", "pick", "--resource-template", "feat://colors/{color}")
    assert harness.ctl("mcp", "complete", "feat", *both, "color", "r") == 2
    assert "not allowed with argument" in capsys.readouterr().err


# --- mcp watch ---------------------------------------------------------------------


_INTERRUPTIBLE = (
    sys.executable,
    "-c",
    (
        "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL);"
        " os.execv(sys.argv[1], sys.argv[1:])"
    ),
)
"""Runs a command with Ctrl-C as at a terminal: a test run started in the
background (``... &`` from a script, nohup) hands its children SIGINT
ignored, and Python keeps an ignored SIGINT ignored."""


class _Watch:
    """``memorizzctl mcp watch`` running: its output lines as they come."""

    def __init__(self, api_socket: str, *argv: str) -> None:
        self.proc = subprocess.Popen(
            [
                *_INTERRUPTIBLE,
                MEMORIZZCTL,
                "--socket",
                api_socket,
                "mcp",
                "watch",
                *argv,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        assert self.proc.stderr is not None
        self.out: queue.Queue[str] = queue.Queue()
        self.err: queue.Queue[str] = queue.Queue()
        self.pumps = [
            threading.Thread(target=_pump, args=(stream, lines), daemon=True)
            for stream, lines in (
                (self.proc.stdout, self.out),
                (self.proc.stderr, self.err),
            )
        ]
        for pump in self.pumps:
            pump.start()

    def line(self, lines: queue.Queue[str] | None = None) -> str:
        try:
            return (lines or self.out).get(timeout=WAIT_S)
        except queue.Empty:
            self.proc.kill()
            raise AssertionError("memorizzctl mcp watch printed nothing") from None

    def interrupt(self) -> int:
        self.proc.send_signal(signal.SIGINT)
        return self.proc.wait(timeout=WAIT_S)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for pump in self.pumps:
            pump.join(timeout=WAIT_S)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


def _pump(stream: IO[str], lines: queue.Queue[str]) -> None:
    for line in stream:
        lines.put(line)


@contextlib.contextmanager
def _watching(api_socket: str, *argv: str) -> Iterator[_Watch]:
    watch = _Watch(api_socket, *argv)
    try:
        yield watch
    finally:
        watch.close()


def test_watch_prints_a_line_per_update_until_ctrl_c(
    harness: DaemonHarness, base: str
) -> None:
    """Each update of either URI is a line as it comes (and nothing of a URI
    it does not watch); Ctrl-C ends the watch with exit 0, and the server
    hears the unsubscribes when its connection is gone."""
    with _watching(harness.socket, "feat", WATCHED, RED) as watch:
        assert watch.line(watch.err) == (
            f"watching feat: {WATCHED} {RED} (Ctrl-C to stop)\n"
        )
        assert _asked(base)[-2:] == [f"subscribe {WATCHED}", f"subscribe {RED}"]
        _touch(harness, "feat://colors/unwatched")
        _touch(harness, RED)
        assert watch.line() == f"feat {RED}\n"
        _touch(harness, WATCHED)
        assert watch.line() == f"feat {WATCHED}\n"
        assert watch.interrupt() == 0
        watch.close()  # all it printed is read
        assert watch.out.empty()
        assert watch.err.empty()  # no traceback, no error
    wait_until(
        lambda: {f"unsubscribe {WATCHED}", f"unsubscribe {RED}"} <= set(_asked(base)),
        what="the watch's subscriptions let go",
    )


def test_watch_json_prints_the_notifications_params(harness: DaemonHarness) -> None:
    uri = "feat://colors/json"
    with _watching(harness.socket, "--json", "feat", uri) as watch:
        watch.line(watch.err)
        _touch(harness, uri)
        assert msgspec.json.decode(watch.line()) == {"server": "feat", "uri": uri}
        assert watch.interrupt() == 0


def test_watch_of_a_server_that_takes_no_subscriptions_fails_at_once(
    harness: DaemonHarness,
) -> None:
    with _watching(harness.socket, "plain", "test://static") as watch:
        assert watch.proc.wait(timeout=WAIT_S) == 1
        assert watch.line(watch.err) == (
            "memorizzctl: error: server 'plain' takes no resource subscriptions"
            " (method_not_found)\n"
        )


def test_watch_ends_with_69_when_the_daemon_goes_away(base_dir: str) -> None:
    """The daemon stopping closes the watch's connection: said on stderr,
    exit 69 (unreachable), not a silent hang."""
    config = daemon_config(base_dir, servers=[features_spec("feat")])
    with contextlib.ExitStack() as running:
        harness = running.enter_context(DaemonHarness.running(config))
        harness.wait_ready("feat")
        watch = _Watch(harness.socket, "feat", WATCHED)
        try:
            watch.line(watch.err)
            running.close()  # the daemon stops
            assert watch.proc.wait(timeout=WAIT_S) == 69
            assert watch.line(watch.err).startswith("memorizzctl: error: ")
        finally:
            watch.close()
