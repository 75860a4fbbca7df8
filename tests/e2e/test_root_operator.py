"""uid 0 on the operator socket: an operator exactly when ``[operators]
allow_root = true`` (listing 0 in ``uids`` is not needed, and without
``allow_root`` it does not help).

The daemon's own uid is always an operator, so these tests need a daemon that
is not uid 0: the real executable runs with real uid 4200 (what it takes as its
own uid), and this process, root, is the client. The effective uid stays 0
only so that it can read this checkout's interpreter, which lives under /root.
The kernel's peer credentials and the real client do the rest.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from memorizz import Client
from memorizz.api.errors import PermissionDeniedError
from tests.harness import DAEMON_EXE, rmtree, short_tempdir, wait_until
from tests.peers import needs_root

DAEMON_UID = 4200

pytestmark = needs_root


@pytest.fixture
def home() -> Iterator[Path]:
    base = short_tempdir()
    yield Path(base)
    rmtree(base)


Serve = Callable[[str], subprocess.Popen[bytes]]


@pytest.fixture
def serve(home: Path) -> Iterator[Serve]:
    """``serve(operators)``: memorizzd with that ``[operators]`` table, as uid
    4200; stopped (and checked to exit 0) at teardown."""
    running: list[subprocess.Popen[bytes]] = []

    def start(operators: str) -> subprocess.Popen[bytes]:
        config = home / "memorizzd.toml"
        config.write_text(f"[operators]\n{operators}\n")
        log_path = home / "daemon.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [
                    DAEMON_EXE,
                    "--config",
                    str(config),
                    "--socket",
                    str(home / "d.sock"),
                    "--state-dir",
                    str(home / "state"),
                ],
                stdout=log,
                stderr=log,
                preexec_fn=lambda: os.setreuid(DAEMON_UID, 0),  # noqa: PLW1509
            )
        running.append(proc)

        def listening() -> bool:
            text = log_path.read_text()
            assert proc.poll() is None, text
            return "listening on" in text

        wait_until(listening, what="memorizzd as uid 4200")
        return proc

    yield start
    for proc in running:
        proc.terminate()
        assert proc.wait(30) == 0


def _daemon_uid(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    line = next(x for x in status.splitlines() if x.startswith("Uid:"))
    return int(line.split()[1])  # the real uid


def test_allow_root_alone_makes_root_an_operator(home: Path, serve: Serve) -> None:
    """Before, root had to be listed in ``uids`` as well."""
    proc = serve("allow_root = true")
    assert _daemon_uid(proc.pid) == DAEMON_UID
    with Client(str(home / "d.sock")) as c:
        assert c.daemon_status().pid == proc.pid  # an operator-only method
        assert c.list_servers() == []


@pytest.mark.parametrize("operators", ["", "uids = [0]"])
def test_without_allow_root_root_is_refused(
    home: Path, serve: Serve, operators: str
) -> None:
    """Root in a container without user namespaces is uid 0 on the host too:
    listing 0 among the uids does not make it an operator."""
    serve(operators)
    with (
        Client(str(home / "d.sock")) as c,
        pytest.raises(PermissionDeniedError) as refused,
    ):
        c.daemon_status()
    assert refused.value.reason == "permission_denied"
    assert "uid 0 may not use the operator socket" in refused.value.message


def _scrape(path: Path) -> bytes:
    """What ``metrics.sock`` answers a GET (b"": closed unanswered)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(str(path))
        answer = b""
        try:
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: memorizzd\r\n\r\n")
            while chunk := s.recv(65536):
                answer += chunk
        except ConnectionError:  # closed with the request unread (reset, broken pipe)
            pass
    return answer


def test_a_reload_of_the_operators_holds_for_the_metrics_socket_too(
    home: Path, serve: Serve
) -> None:
    """``metrics.sock`` is the operators': a reload that changes who they are
    changes who may scrape it, as it does for the operator socket."""
    proc = serve("")
    metrics = home / "metrics.sock"
    assert _scrape(metrics) == b""  # root is no operator
    (home / "memorizzd.toml").write_text("[operators]\nallow_root = true\n")
    proc.send_signal(signal.SIGHUP)
    wait_until(
        lambda: "reloaded" in (home / "daemon.log").read_text(), what="the reload"
    )
    with Client(str(home / "d.sock")) as c:
        assert c.daemon_status().pid == proc.pid
    assert _scrape(metrics).startswith(b"HTTP/1.1 200 OK")
