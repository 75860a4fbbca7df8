"""The walls between the rooms (docs/architecture.md), so that a change cannot
quietly break them.

The direction of imports between packages is import-linter's: the contracts
are in pyproject.toml (``[tool.importlinter]``) and ``lint-imports`` checks
them, indirect imports and ``TYPE_CHECKING`` imports included. What it cannot
say is read here from the AST of every module, imports inside functions too:
which modules may import ``sqlite3`` and the MCP SDK, and that the wire
contract and the policy import only what is pure.
"""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = {
    "memorizz": ROOT / "client" / "memorizz",
    "memorizzd": ROOT / "daemon" / "memorizzd",
}

SDK = frozenset({"mcp", "mcp_types"})
SDK_ADAPTERS = frozenset({"memorizzd.upstream.mcp_sdk", "memorizzd.oauth.mcp_sdk"})
"""One adapter per concern: the MCP sessions, and OAuth's metadata models."""

PURE_STDLIB = frozenset(
    {
        "__future__",
        "collections",
        "dataclasses",
        "enum",
        "fnmatch",
        "functools",
        "itertools",
        "re",
        "types",
        "typing",
        "urllib",
    }
)
"""What the policy may import from the standard library: nothing that does I/O."""


def _modules() -> Iterator[tuple[str, Path]]:
    for package, base in SOURCES.items():
        for path in sorted(base.rglob("*.py")):
            parts = path.relative_to(base).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            yield ".".join((package, *parts)), path


def _imports(module: str, path: Path) -> set[str]:
    """Every module ``path`` imports (absolute names), wherever the import is."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                found.add(".".join([*base, *([node.module] if node.module else [])]))
            else:
                assert node.module is not None
                found.add(node.module)
    return found


@functools.cache
def imports() -> dict[str, set[str]]:
    """Every module's imports, read once where a test asks (not at collection,
    which every pytest worker does)."""
    return {module: _imports(module, path) for module, path in _modules()}


def _top(name: str) -> str:
    return name.partition(".")[0]


def _importers(top_level: frozenset[str]) -> set[str]:
    return {
        module
        for module, imported in imports().items()
        if any(_top(name) in top_level for name in imported)
    }


def test_the_import_contracts_hold() -> None:
    """rpc -> broker -> services -> {egress, store} -> caller; the client never
    imports the daemon; the policy imports nothing that does I/O."""
    lint = Path(sys.executable).with_name("lint-imports")
    assert lint.exists(), "import-linter is missing: scripts/bootstrap installs it"
    run = subprocess.run(
        [str(lint), "--no-cache", str(ROOT / "pyproject.toml")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "0 broken" in run.stdout


def test_only_the_store_imports_sqlite3() -> None:
    """Callers see ``StoreError``, never SQLite's own errors."""
    assert _importers(frozenset({"sqlite3"})) == {"memorizzd.store"}


def test_the_store_imports_nothing_of_the_wire_contract() -> None:
    """Its rows are its own types: a wire change is never a schema change by
    accident (memorizzd.stored converts; tests/daemon/test_store_rows.py)."""
    assert not {n for n in imports()["memorizzd.store"] if _top(n) == "memorizz"}


def test_only_the_two_adapters_import_the_mcp_sdk() -> None:
    assert _importers(SDK) == SDK_ADAPTERS


def test_the_wire_contract_imports_only_the_standard_library_and_msgspec() -> None:
    allowed = sys.stdlib_module_names | {"msgspec", "memorizz"}
    for module, imported in imports().items():
        if module == "memorizz.api" or module.startswith("memorizz.api."):
            outside = {name for name in imported if _top(name) not in allowed}
            assert not outside, f"{module} imports {sorted(outside)}"
            assert all(
                name == "memorizz.api" or name.startswith("memorizz.api.")
                for name in imported
                if _top(name) == "memorizz"
            ), f"{module} imports the client beyond memorizz.api"


def test_the_client_imports_only_the_standard_library_and_msgspec() -> None:
    """What a thin client in a container installs: no daemon dependency.
    ``_typeshed`` is the type checker's (the standard library's stubs), never
    imported at run time: only under ``TYPE_CHECKING``, which this checks."""
    allowed = sys.stdlib_module_names | {"msgspec", "memorizz", TYPESHED}
    for module, imported in imports().items():
        if _top(module) == "memorizz":
            outside = {name for name in imported if _top(name) not in allowed}
            assert not outside, f"{module} imports {sorted(outside)}"
    for module, path in _modules():
        if _top(module) == "memorizz":
            assert TYPESHED not in _run_time_imports(path), (
                f"{module} imports {TYPESHED} at run time"
            )


TYPESHED = "_typeshed"


def _run_time_imports(path: Path) -> set[str]:
    """The absolute imports of ``path`` outside ``if TYPE_CHECKING:`` blocks."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    checking = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If)
        and isinstance(node.test, ast.Name)
        and node.test.id == "TYPE_CHECKING"
        for stmt in node.body
        for inner in ast.walk(stmt)
    }
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in checking:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module)
    return found


@pytest.mark.parametrize("package", ["memorizzd.policy", "memorizzd.presets"])
def test_the_policy_imports_nothing_that_does_io(package: str) -> None:
    allowed = PURE_STDLIB | {"msgspec", "memorizz"}
    for module, imported in imports().items():
        if module == package or module.startswith(package + "."):
            outside = {
                name
                for name in imported
                if _top(name) not in allowed
                and name not in {"memorizzd.policy", "memorizzd.presets"}
                and not name.startswith(("memorizzd.policy.", "memorizzd.presets."))
            }
            assert not outside, f"{module} imports {sorted(outside)}"
