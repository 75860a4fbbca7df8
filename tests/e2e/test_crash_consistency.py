"""Crash consistency (SECURITY.md §6.2 #29): SIGKILL the real daemon at the
points that matter, start it again, and check what it finds.

* Mid audit append, under load: each record is appended to the audit spool
  (one ``write``) before its reply goes out, and the spool is moved into the
  state database in batches; a call that may change something (``echo`` is
  unannotated: ``write``) is spooled as it begins. Every call acknowledged
  before the kill is in the trail, ``ok``; every call in flight at the kill
  is there too, ``interrupted`` (the kill ate its reply); every record is
  whole, ids keep increasing. (tests/daemon/test_audit_spool.py tears the
  spool's last line; tests/daemon/test_store.py checks the journal modes.)
* Around an OAuth refresh: killed after the authorization server rotated the
  refresh token but before the daemon stored the answer, the grant is
  ``login_required`` after the restart; killed once the daemon used the new
  access token, the rotated grant is there. Never a refresh loop.
* The socket file a SIGKILL leaves behind is replaced at the next start (as
  tests/e2e/test_lifecycle.py::test_a_stale_socket_is_replaced_and_a_live_one_is_not_stolen
  shows for a socket bound by someone else).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from mcp.server.auth.provider import AccessToken, RefreshToken
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken

from memorizz.api import methods as m
from memorizz.api.errors import AuthRequiredError, MemorizzError
from memorizzd.audit import load_key
from tests.harness import (
    MCP_SERVER,
    DaemonProcess,
    daemon_process,
    launch_args,
    stdio_spec,
    wait_until,
)
from tests.oauth_world import TestAuthorizationServer, browser, serve_protected
from tests.trials import all_records, digest

CALLERS = 8
ACKNOWLEDGED_BEFORE_THE_KILL = 300


def _kill(d: DaemonProcess) -> None:
    os.kill(d.pid, signal.SIGKILL)
    assert d.proc is not None
    assert d.proc.wait(10) == -signal.SIGKILL


def _dead(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:  # and reaped already
        return True


def test_sigkill_under_audit_load_loses_no_acknowledged_record_and_tears_none(
    base_dir: str,
) -> None:
    state = os.path.join(base_dir, "state")
    acknowledged: list[str] = []
    sent: list[str] = []
    stop = threading.Event()

    def caller(d: DaemonProcess, i: int) -> None:
        with contextlib.suppress(MemorizzError, OSError), d.client() as c:
            for n in range(100_000):
                if stop.is_set():
                    return
                text = f"{i}-{n}"
                sent.append(text)
                c.call_tool("t", "echo", {"text": text})
                acknowledged.append(text)  # the reply came: its record is safe

    with daemon_process(base_dir) as d:
        with d.client() as c:
            c.add_server(stdio_spec("t"))
        d.wait_ready("t")
        callers = [threading.Thread(target=caller, args=(d, i)) for i in range(CALLERS)]
        for t in callers:
            t.start()
        wait_until(
            lambda: len(acknowledged) >= ACKNOWLEDGED_BEFORE_THE_KILL,
            what="calls under load",
        )
        _kill(d)  # CALLERS calls in flight, records queued and being committed
        stop.set()
        for t in callers:
            t.join(10)
        assert Path(d.socket).exists()  # what a SIGKILL leaves behind
    acked = list(acknowledged)

    with contextlib.closing(sqlite3.connect(Path(state, "state.db"))) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)

    with daemon_process(base_dir) as d, d.client() as c:  # the stale socket replaced
        records = all_records(c)
        calls = [r for r in records if r.action == "tools/call"]
        ids = [r.id for r in records]
        assert ids == sorted(set(ids), reverse=True)  # unique, newest first
        for r in calls:  # whole records only
            assert (r.server, r.tool) == ("t", "echo")
            assert r.outcome in ("ok", "interrupted")
            assert r.argument_keys == ["text"]
            assert r.arguments_hmac is not None
            assert r.duration_ms >= 0
            assert r.caller_uid == os.getuid()
        key = load_key(state)
        outcome = {r.arguments_hmac: r.outcome for r in calls}
        assert [t for t in acked if outcome.get(digest(key, {"text": t})) != "ok"] == []
        in_flight = [t for t in sent if t not in set(acked)]  # one per caller at most
        assert 0 < len(in_flight) <= CALLERS
        # each was sent; if it reached the daemon (the kill may have come
        # first), it is audited, "interrupted" unless its record was safe
        # before its reply was lost
        interrupted = {h for h, o in outcome.items() if o == "interrupted"}
        assert interrupted <= {digest(key, {"text": t}) for t in in_flight}
        assert len(calls) == len(acked) + sum(
            digest(key, {"text": t}) in outcome for t in in_flight
        )
        d.wait_ready("t")
        c.call_tool("t", "echo", {"text": "after"})
        (latest,) = c.audit(limit=1).records
        assert latest.arguments_hmac == digest(key, {"text": "after"})
        assert latest.id > ids[0]


class _KillingAuthorizationServer(TestAuthorizationServer):
    """Kills the daemon (``victim``) at one point of a refresh:

    * ``before_commit``: the refresh token is rotated here, the answer is
      never read (the daemon dies before it can store it);
    * ``after_commit``: at the first use of the refreshed access token, which
      the daemon sends only once it has stored the rotated grant.
    """

    __test__ = False

    def __init__(self, point: str) -> None:
        super().__init__(access_ttl=3600)
        self.point = point
        self.victim: DaemonProcess | None = None
        self.refreshed: set[str] = set()
        self.refresh_requests = 0
        """Every refresh request, a spent token's too (the SDK refuses an
        unknown refresh token before ``exchange_refresh_token``)."""

    def _strike(self) -> None:
        victim, self.victim = self.victim, None
        if victim is not None:
            os.kill(victim.pid, signal.SIGKILL)
            wait_until(lambda: _dead(victim.pid), what="the daemon killed")

    async def load_refresh_token(
        self, client: OAuthClientInformationFull, refresh_token: str
    ) -> RefreshToken | None:
        self.refresh_requests += 1
        return await super().load_refresh_token(client, refresh_token)

    async def exchange_refresh_token(
        self,
        client: OAuthClientInformationFull,
        refresh_token: RefreshToken,
        scopes: list[str],
    ) -> OAuthToken:
        token = await super().exchange_refresh_token(client, refresh_token, scopes)
        self.refreshed.add(token.access_token)
        if self.point == "before_commit":
            self._strike()
        return token

    async def load_access_token(self, token: str) -> AccessToken | None:
        if self.point == "after_commit" and token in self.refreshed:
            self._strike()
        return await super().load_access_token(token)


@pytest.mark.parametrize("way", ["relayed", "task"])
def test_a_call_that_may_change_something_killed_in_flight_is_audited_interrupted(
    base_dir: str, way: str
) -> None:
    """A call's record was written when it ended: a daemon killed while a
    call that may change something ran upstream left no trace of it. Such a
    call is spooled as it begins, on both ways a call takes (the warm relay,
    and the task a call asking for progress runs in); the next start writes
    its record, ``interrupted``. A read changes nothing and is not."""
    calls_log = Path(base_dir, "calls.log")
    config = Path(base_dir, "memorizzd.toml")
    server = f"""
transport = "stdio"
command = {sys.executable!r}
args = {launch_args(MCP_SERVER, "stdio")!r}
env = {{ CALL_LOG = {str(calls_log)!r} }}
"""
    config.write_text(
        f'[[servers]]\nname = "w"\n{server}risk = {{ watched = "write" }}\n'
        f'[[servers]]\nname = "r"\n{server}'
    )

    def call(name: str) -> None:
        progress = (lambda _: None) if way == "task" else None
        with contextlib.suppress(MemorizzError, OSError), d.client() as c:
            c.call_tool(
                name, "watched", {"seconds": 60, "tag": name}, on_progress=progress
            )

    with daemon_process(base_dir, "--config", str(config)) as d:
        d.wait_ready("w")
        d.wait_ready("r")
        callers = [threading.Thread(target=call, args=(n,)) for n in ("w", "r")]
        for t in callers:
            t.start()
        wait_until(
            lambda: (
                {"start:w", "start:r"}
                <= set(calls_log.read_text().split() if calls_log.exists() else ())
            ),
            what="both calls running upstream",
        )
        _kill(d)
        for t in callers:
            t.join(10)
    with daemon_process(base_dir, "--config", str(config)) as d, d.client() as c:
        calls = [r for r in all_records(c) if r.action == "tools/call"]
        assert "1 actions were under way when the daemon stopped" in d.log()
    assert [
        (r.server, r.tool, r.risk, r.decision, r.outcome, r.argument_keys)
        for r in calls
    ] == [("w", "watched", "write", "allow", "interrupted", ["seconds", "tag"])]
    key = load_key(os.path.join(base_dir, "state"))
    assert calls[0].arguments_hmac == digest(key, {"seconds": 60, "tag": "w"})


@contextlib.contextmanager
def _logged_in(world: TestAuthorizationServer, base: str) -> Iterator[str]:
    with serve_protected(world) as url:
        with daemon_process(base) as d, d.client() as c:
            c.add_server(
                m.ServerSpec(
                    name="cal",
                    transport="streamable_http",
                    url=url,
                    allow_private_network=True,
                    auth="oauth",
                )
            )
            started = c.auth_login("cal")
            c.auth_complete("cal", browser(started.authorization_url))
            d.wait_ready("cal")
            assert c.call_tool("cal", "whoami", {}).is_error is False
            d.stop()
        yield url


@pytest.mark.parametrize("point", ["before_commit", "after_commit"])
def test_sigkill_around_a_refresh_leaves_the_rotated_grant_or_login_required(
    base_dir: str, point: str
) -> None:
    world = _KillingAuthorizationServer(point)
    with _logged_in(world, base_dir):
        with daemon_process(base_dir) as d:
            d.wait_ready("cal")
            world.victim = d
            world.expire_access_tokens()
            with d.client() as c:
                # The first call gets a 401 and the daemon refreshes (the call
                # fails: a 401 is not retried); the second uses the new token.
                for _ in range(2):
                    with contextlib.suppress(MemorizzError):
                        c.call_tool("cal", "whoami", {})
            assert d.proc is not None
            assert d.proc.wait(10) == -signal.SIGKILL
        assert world.refresh_requests == 1

        with daemon_process(base_dir) as d, d.client() as c:
            if point == "after_commit":
                d.wait_ready("cal")  # the rotated grant, stored before its use
                assert c.call_tool("cal", "whoami", {}).is_error is False
                (status,) = c.server_status("cal")
                assert status.auth is not None
                assert status.auth.state == "ok"
            else:
                # The stored refresh token was rotated away: one refresh finds
                # it spent (invalid_grant), and that is final.
                wait_until(
                    lambda: c.server_status("cal")[0].state == "login_required",
                    what="login required",
                )
                for _ in range(3):
                    with pytest.raises(AuthRequiredError) as refused:
                        c.call_tool("cal", "whoami", {})
                    assert refused.value.reason == "login_required"
            refreshes = world.refresh_requests
            assert c.server_status("cal")[0].state in ("ready", "login_required")
    # One refresh before the kill; after it, one more that finds the token
    # spent, or none (the stored access token is still good). No loop.
    assert world.refresh_requests == refreshes
    assert refreshes == {"before_commit": 2, "after_commit": 1}[point]
    assert world.count("authorization_code") == 1
