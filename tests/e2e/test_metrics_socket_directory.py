"""``[metrics] socket`` in a directory the daemon makes: 0755 when the
operator socket's group (``[operators] socket_group``) must reach the socket,
as the operator socket's directory is, whatever the umask; else 0700. It was
0700 in both cases, and the group could not traverse it to scrape.

The daemon runs unprivileged, with its own gid as the socket's group: as
this test's user, or, when the test runs as root (where the socket is shared
anyway), as a spare uid (``test_unit_user``'s) while a member of its group,
another uid, scrapes."""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.e2e.test_unit_user import GID, UID, _as_the_user, _free_uid
from tests.harness import scraped
from tests.peers import NOBODY, as_user
from tests.process import DaemonProcess, wait_until

ROOT = os.geteuid() == 0

pytestmark = pytest.mark.skipif(
    ROOT and not (shutil.which("unshare") and shutil.which("setpriv") and _free_uid()),
    reason="as root: needs unshare and setpriv (util-linux), and a free uid",
)


def scrape(path: str) -> str:
    """``GET /metrics`` on the Unix socket: the status line."""
    return scraped(path).decode("latin-1").split("\r\n", 1)[0]


class _Unprivileged(DaemonProcess):
    """As root: the daemon as ``UID``/``GID`` (``test_unit_user``'s way)."""

    def __init__(self, base: str, view: Path, *, config: str) -> None:
        env = {**os.environ, "HOME": base}
        super().__init__(base, config=config, log_level="warning", env=env)
        self.view = view

    def argv(self) -> list[str]:
        return _as_the_user(super().argv(), self.view)


@contextmanager
def serving(
    base_dir: str, *, group: bool, umask: int
) -> Iterator[tuple[str, Callable[[], str]]]:
    """A daemon with its metrics socket at ``run/metrics/m.sock`` (neither
    directory there yet), started under ``umask`` (UMask=0077 under systemd),
    with its own gid as ``socket_group`` when ``group``: the socket's path,
    and a scrape by a member of that group."""
    base = Path(base_dir)
    if ROOT:
        base.chmod(0o755)  # the daemon's user and the scraper pass through it
        home = base / "home"
        home.mkdir(mode=0o755)
        os.chown(home, UID, GID)
        (view := base / "view").mkdir()
    else:
        home = base
    path = str(home / "run" / "metrics" / "m.sock")
    gid = GID if ROOT else os.getgid()
    lines = ["[operators]"]
    if ROOT:  # the scraper: another uid, in the daemon's group
        lines += [f"groups = [{GID}]", "allow_root = true"]  # root: the harness
    if group:
        lines.append(f"socket_group = {gid}")
    lines += ["[metrics]", "enabled = true", f'socket = "{path}"']
    config = base / "memorizzd.toml"
    config.write_text("\n".join(lines) + "\n", encoding="utf-8")
    daemon = (
        _Unprivileged(str(home), view, config=str(config))
        if ROOT
        else DaemonProcess(str(home), config=str(config), log_level="warning")
    )
    old = os.umask(umask)  # the daemon inherits it
    try:
        daemon.start()
    finally:
        os.umask(old)

    def scraped() -> str:
        if not ROOT:
            return scrape(path)
        outcome = as_user(lambda: scrape(path), uid=NOBODY, gid=NOBODY, groups=(GID,))
        assert outcome[0] == "ok", outcome
        status: str = outcome[1]
        return status

    try:
        # the operator socket answers first; the metrics socket is bound after it
        wait_until(lambda: os.path.exists(path), what=path, alive=daemon.check)
        yield path, scraped
    finally:
        assert daemon.stop() == 0, daemon.log_tail()


def mode_of(path: str) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.mark.parametrize("umask", [0o022, 0o077], ids=["umask-022", "umask-077"])
def test_with_a_socket_group_its_directory_is_traversable(
    base_dir: str, umask: int
) -> None:
    with serving(base_dir, group=True, umask=umask) as (path, scraped):
        metrics_dir = os.path.dirname(path)
        assert mode_of(metrics_dir) == 0o755
        assert mode_of(os.path.dirname(metrics_dir)) == 0o755
        st = os.lstat(path)
        assert (stat.S_IMODE(st.st_mode), st.st_gid) == (
            0o660,
            GID if ROOT else os.getgid(),
        )
        assert scraped() == "HTTP/1.1 200 OK"


def test_without_a_socket_group_its_directory_stays_private(base_dir: str) -> None:
    with serving(base_dir, group=False, umask=0o022) as (path, _):
        metrics_dir = os.path.dirname(path)
        assert mode_of(metrics_dir) == 0o700
        assert mode_of(os.path.dirname(metrics_dir)) == 0o700
        assert mode_of(path) == 0o600
        if not ROOT:
            assert scrape(path) == "HTTP/1.1 200 OK"
