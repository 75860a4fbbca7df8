"""Clients under other uids and gids: a forked child drops to them, connects,
runs one function and sends its outcome back through a pipe.

The daemon sees the child's real credentials (SO_PEERCRED, SO_PEERGROUPS):
nothing here is faked. Needs root (``needs_root`` skips otherwise).

And the world the authority batteries (tests/daemon/test_authority_*.py)
share: a daemon with profiles (``profiles_config``), its agent sockets, the
``record`` calls that ran, the optional task server ``tk``.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Callable
from typing import Any

import msgspec
import pytest

from memorizz.api.errors import MemorizzError, RemoteError
from memorizz.api.methods import ServerSpec
from memorizzd.config import Config, Operators, Profile
from tests.harness import daemon_config, stdio_spec, task_spec

NOBODY = 65534
ME = os.getuid()
"""The test process's uid: root in CI (then root on an agent socket is shown to
be an agent); any uid elsewhere, where the forked-client tests skip."""
ME_NAME = pwd.getpwuid(ME).pw_name

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="needs root to run clients under other uids and gids"
)


def as_user(
    work: Callable[[], Any],
    *,
    uid: int = NOBODY,
    gid: int = NOBODY,
    groups: tuple[int, ...] = (),
) -> tuple[Any, ...]:
    """Run ``work`` in a child as ``uid``/``gid``/``groups``. Returns ("ok",
    value), ("remote", reason, code, message) or ("client", class name, text)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        status = 0
        try:
            os.close(read_end)
            os.setgroups(list(groups))
            os.setgid(gid)
            os.setuid(uid)
            outcome: tuple[Any, ...]
            try:
                outcome = ("ok", msgspec.to_builtins(work()))
            except RemoteError as exc:
                outcome = ("remote", exc.reason, exc.code, exc.message)
            except MemorizzError as exc:
                outcome = ("client", type(exc).__name__, str(exc))
            with os.fdopen(write_end, "wb") as f:
                f.write(msgspec.json.encode(outcome))
        except BaseException:  # noqa: BLE001 - report through the exit status
            status = 1
        finally:
            os._exit(status)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the child failed"
    return tuple(msgspec.json.decode(data))


def profiles_config(base: str, **overrides: Any) -> Config:
    """Servers ``t`` (its ``record`` tool logs to <base>/calls.log) and ``u``;
    profile ``alpha`` (this process's uid and nobody, group 4242) reaches ``t``,
    ``beta`` (this process's uid) reaches ``u``; operator uid 4100. The base directory is opened to
    others so that dropped-privilege children can reach the sockets."""
    os.chmod(base, 0o755)  # noqa: S103 - a test directory other uids must traverse
    fields: dict[str, Any] = {
        "servers": [
            stdio_spec("t", env={"CALL_LOG": os.path.join(base, "calls.log")}),
            stdio_spec("u"),
        ],
        "profiles": [
            Profile(name="alpha", servers=["t"], uids=[ME, NOBODY], gids=[4242]),
            Profile(name="beta", servers=["u"], uids=[ME]),
        ],
        "operators": Operators(uids=[4100]),
        "agents_dir": os.path.join(base, "agents"),
    }
    fields.update(overrides)
    return daemon_config(base, **fields)


def agent_socket(base: str, profile: str) -> str:
    return os.path.join(base, "agents", profile, "api.sock")


def calls(base: str) -> list[str]:
    """The tags ``record`` ran with, in order."""
    try:
        with open(os.path.join(base, "calls.log"), encoding="utf-8") as f:
            return f.read().split()
    except FileNotFoundError:
        return []


def optional_task_spec() -> ServerSpec | None:
    """``tk``, tests/node/task_server.mjs (``tests.harness.task_spec``), for a
    module's daemon whose other probes need no node: None where node is not
    installed (``tests.harness.node`` skips), and the task probes skip; under
    CI=true a missing node fails the module instead."""
    try:
        return task_spec("tk")
    except pytest.skip.Exception:
        return None
