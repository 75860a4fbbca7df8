"""The tests are layered as the code is (issue 10): each test module lives in
the room its subject does, and the client's tests stay offline.

* ``tests/client/``: the thin client and ``memorizzctl`` without a daemon;
  they import nothing of the daemon (``memorizzd``) nor its harness.
* ``tests/component/``: the daemon's parts wired in-process, without a socket.
* ``tests/daemon/``: one daemon, its sockets and its upstreams.
* ``tests/e2e/``: the real executable, third-party servers, the CLI end to end,
  crash trials.

Helpers (servers, worlds, the harness, the test-server zygote) stay in
``tests/``; so do this file and ``test_layers.py``, which check the whole tree,
and ``test_zygote.py``, which checks a helper. A new test module goes in
its room (a few written while the rooms were made still wait at the top).
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOMS = ("client", "component", "daemon", "e2e")


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def test_the_rooms_are_packages_and_nothing_lives_beside_them() -> None:
    for room in ROOMS:
        assert (TESTS / room / "__init__.py").is_file(), room
    others = [
        d
        for d in TESTS.iterdir()
        if d.is_dir() and d.name not in (*ROOMS, "node", "__pycache__")
    ]
    strays = sorted(
        str(p.relative_to(TESTS)) for d in others for p in d.rglob("test_*.py")
    )
    assert strays == [], "test modules go in a room"


def test_the_client_tests_need_no_daemon() -> None:
    found = {
        str(path.relative_to(TESTS)): sorted(
            name
            for name in _imports(path)
            if name.split(".")[0] in ("memorizzd", "mcp", "anyio")
            or name in ("tests.harness", "tests.process", "tests.peers")
        )
        for path in sorted((TESTS / "client").glob("*.py"))
    }
    assert {path: names for path, names in found.items() if names} == {}
    assert found, "tests/client/ holds the client's tests"
