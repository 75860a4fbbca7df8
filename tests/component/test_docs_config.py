"""docs/configuration.md documents exactly the keys the daemon's loader
takes, with their defaults, and every TOML example in the docs loads as it is.

The loader is what ``memorizzd --check-config`` runs: ``memorizzd.config.load``,
then ``check_config_servers``, ``check_tracing`` and ``check_stores``
(``memorizzd.__main__``). Two things of the host are stood in for: the
groups an example names (``memorizzd-operators``, made by ``scripts/install``)
exist, and a credential store plugin a docs page declares in a
``pyproject.toml`` example is installed (its entry point, a module whose
factory is never called).

A TOML block is a memorizzd configuration unless its first line is a
comment naming another file (``# pyproject.toml of your package``, ``#
~/.codex/config.toml``); such a block must not be one the loader would take
for a memorizzd configuration (it is refused for a key memorizzd does not
have), so that the comment cannot hide a broken example. A configuration
that names its file names the one the daemon reads
(``/etc/memorizzd/memorizzd.toml``).
"""

from __future__ import annotations

import grp
import re
import sys
import tomllib
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from memorizzd.config import (
    DEFAULT_CONFIG_PATH,
    Config,
    ConfigError,
    ConfigServer,
    check_tracing,
    load,
)
from memorizzd.execution import check_config_servers
from memorizzd.vault import VaultKeyError
from memorizzd.vault.stores import check_stores
from tests.doc_blocks import ROOT, Block, all_blocks

CONFIGURATION = ROOT / "docs" / "configuration.md"
TOML_BLOCKS = [b for b in all_blocks() if b.lang == "toml"]
_FILE_COMMENT = re.compile(r"^#\s*(?P<path>\S+\.toml)\b")


def _named_file(block: Block) -> str | None:
    """The file a block's first-line comment names, if it names one."""
    first = block.text.lstrip().splitlines()[0]
    match = _FILE_COMMENT.match(first)
    return match["path"] if match else None


def _is_memorizzd_config(block: Block) -> bool:
    named = _named_file(block)
    return (
        named is None
        or Path(named).name == DEFAULT_CONFIG_PATH.name
        or Path(named).parent == DEFAULT_CONFIG_PATH.parent
    )


# --- the keys -------------------------------------------------------------------


def _struct_of(annotation: Any) -> type[msgspec.Struct] | None:
    """The struct a field holds (itself, or as ``list[...]`` items)."""
    if isinstance(annotation, type) and issubclass(annotation, msgspec.Struct):
        return annotation
    if typing.get_origin(annotation) is list:
        (item,) = typing.get_args(annotation)
        return _struct_of(item)
    return None


def _fields(struct: type[msgspec.Struct]) -> dict[str, Any]:
    hints = typing.get_type_hints(struct)
    fields = {f.name: hints[f.name] for f in msgspec.structs.fields(struct)}
    if struct is Config:
        fields["servers"] = list[ConfigServer]  # decoded as ConfigServer first
        del fields["config_path"]  # set by load(); refused in a file
    return fields


def accepted_keys(struct: type[msgspec.Struct] = Config, prefix: str = "") -> set[str]:
    """Every key the loader takes, dotted (``servers.timeout_s``,
    ``profiles.limits.max_in_flight``), its tables too (``profiles.limits``);
    a table of free keys (``env``) is one key."""
    keys: set[str] = set()
    for name, annotation in _fields(struct).items():
        keys.add(prefix + name)
        if (inner := _struct_of(annotation)) is not None:
            keys |= accepted_keys(inner, f"{prefix}{name}.")
    return keys


def _keys_in(
    value: dict[str, Any], struct: type[msgspec.Struct], prefix: str
) -> Iterator[str]:
    """The dotted keys a TOML document sets, into the tables the loader has
    (a key it does not have is yielded as it is)."""
    fields = _fields(struct)
    for name, item in value.items():
        inner = _struct_of(fields.get(name))
        if inner is None:
            yield prefix + name
            continue
        for table in item if isinstance(item, list) else [item]:
            yield from _keys_in(table, inner, f"{prefix}{name}.")


_TABLES = {
    "### Top-level keys": "",
    "### `[[servers]]` entries": "servers.",
    "### `[operators]`": "operators.",
    "### `[[profiles]]`": "profiles.",
}
"""configuration.md's key tables, by heading: their keys' prefix."""
_ROW = re.compile(
    r"^\| `(?P<key>[a-z_.]+)` \| (?P<type>[^|]+) \| (?P<default>[^|]+) \|", re.MULTILINE
)


def _table_rows() -> dict[str, tuple[str, str]]:
    """Each documented key -> (its type, its default), as the tables say."""
    text = CONFIGURATION.read_text(encoding="utf-8")
    rows: dict[str, tuple[str, str]] = {}
    for heading, prefix in _TABLES.items():
        assert f"\n{heading}\n" in text, heading
        section = text.split(f"\n{heading}\n", 1)[1].split("\n### ", 1)[0]
        found = _ROW.findall(section)
        assert found, f"no key table under {heading}"
        for key, kind, default in found:
            assert prefix + key not in rows, f"{prefix}{key} twice"
            rows[prefix + key] = (kind.strip(), default.strip())
    return rows


def documented_keys() -> set[str]:
    """The key tables' keys, the keys configuration.md's examples set, and
    the tables they are in (``metrics.listen``: ``metrics`` too)."""
    keys = set(_table_rows())
    for block in TOML_BLOCKS:
        if block.path == CONFIGURATION:
            keys |= set(_keys_in(tomllib.loads(block.text), Config, ""))
    return keys | {key.rsplit(".", 1)[0] for key in keys if "." in key}


def test_every_key_the_loader_takes_is_documented_and_no_other() -> None:
    accepted, documented = accepted_keys(), documented_keys()
    assert sorted(documented - accepted) == [], "documented, but the loader refuses it"
    assert sorted(accepted - documented) == [], "the loader takes it: document it"


def _owner(key: str) -> tuple[type[msgspec.Struct], str]:
    """The struct that holds a dotted key, and the key's name in it."""
    struct: type[msgspec.Struct] = Config
    *tables, name = key.split(".")
    for table in tables:
        inner = _struct_of(_fields(struct)[table])
        assert inner is not None, key
        struct = inner
    return struct, name


def _default(key: str) -> Any:
    struct, name = _owner(key)
    (field,) = [f for f in msgspec.structs.fields(struct) if f.name == name]
    if field.default_factory is not msgspec.NODEFAULT:
        return field.default_factory()
    return None if field.default is msgspec.NODEFAULT else field.default


def test_the_documented_defaults_are_the_loaders() -> None:
    """A default written as one TOML value (`` `5.0` ``, `` `"__"` ``,
    `` `["vault", "systemd"]` ``) is the field's default; ``none`` is no value."""
    checked = 0
    accepted = accepted_keys()
    for key, (_, default) in _table_rows().items():
        if key not in accepted:
            continue  # the test above says so
        if default == "none":
            assert _default(key) is None, key
            checked += 1
            continue
        literal = re.fullmatch(r"`([^`]+)`", default)
        if literal is None:
            continue  # prose: "root: ...; others: ...", "required"
        try:
            value = tomllib.loads(f"v = {literal[1]}")["v"]
        except tomllib.TOMLDecodeError:
            continue  # `agents` next to the operator socket
        assert _default(key) == value, f"{key}: documented {literal[1]}"
        checked += 1
    assert checked > 60


def _annotation(key: str) -> Any:
    struct, name = _owner(key)
    return _fields(struct)[name]


_PLURAL = {"group name or gid": "group names or gids"}


def described(annotation: Any, *, inside: bool = False) -> str:
    """A field's type in the words of the key tables ("array of strings")."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        kinds = {described(a) for a in args if a is not type(None)}
        if kinds == {"integer", "string"}:
            return "group name or gid"
        return " or ".join(sorted(kinds, key=("string", "boolean").index))
    if origin is typing.Literal:
        if inside:  # an array of given words
            return ", ".join(f'`"{a}"`' for a in args)
        return "string"
    if origin is list:
        item = described(args[0], inside=True)
        return f"array of {_PLURAL.get(item, item + 's' if item[0] != '`' else item)}"
    if origin is dict:
        return f"table of {described(args[1])}s"
    if isinstance(annotation, type) and issubclass(annotation, msgspec.Struct):
        return "table"
    return {str: "string", float: "float", int: "integer", bool: "boolean"}[annotation]


def test_the_documented_types_are_the_loaders() -> None:
    accepted = accepted_keys()
    wrong = [
        f"{key}: documented {kind!r}, the loader takes {described(_annotation(key))!r}"
        for key, (kind, _) in _table_rows().items()
        if key in accepted and described(_annotation(key)) != kind
    ]
    assert wrong == []
    assert described(list[int | str]) == "array of group names or gids"
    assert described(dict[str, typing.Literal["read", "write"]]) == "table of strings"


def test_config_path_is_no_key(tmp_path: Path) -> None:
    """As the page says: ``config_path`` only appears in ``daemon/status``."""
    path = tmp_path / "memorizzd.toml"
    path.write_text('config_path = "/x"\n')
    with pytest.raises(ConfigError, match="unknown key config_path"):
        load(str(path), environ={})


# --- the examples ---------------------------------------------------------------


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The groups the examples name exist, and the credential store plugins
    the docs' ``pyproject.toml`` examples declare are installed."""
    real = grp.getgrnam

    def getgrnam(name: str) -> Any:
        try:
            return real(name)
        except KeyError:
            return types.SimpleNamespace(gr_name=name, gr_gid=4242, gr_mem=[])

    monkeypatch.setattr(grp, "getgrnam", getgrnam)
    site = tmp_path / "site"
    modules: list[str] = []
    for block in TOML_BLOCKS:
        if _named_file(block) == "pyproject.toml":
            modules += _install(tomllib.loads(block.text), site)
    monkeypatch.syspath_prepend(str(site))
    yield
    for module in modules:
        sys.modules.pop(module, None)


def _install(pyproject: dict[str, Any], site: Path) -> list[str]:
    """A distribution in ``site`` with the project's entry points, and the
    modules they name (a factory that is never called)."""
    groups = pyproject["project"]["entry-points"]
    dist = site / "docs_example-1.0.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: docs-example\nVersion: 1.0\n"
    )
    lines: list[str] = []
    modules: list[str] = []
    for group, points in groups.items():
        lines.append(f"[{group}]")
        for name, target in points.items():
            lines.append(f"{name} = {target}")
            module, _, attr = target.partition(":")
            parts = module.split(".")
            for i in range(1, len(parts)):
                package = site.joinpath(*parts[:i])
                package.mkdir(exist_ok=True)
                (package / "__init__.py").touch()
            site.joinpath(*parts[:-1], f"{parts[-1]}.py").write_text(
                f"def {attr}(config):\n    raise AssertionError('not called')\n"
            )
            modules += [".".join(parts[: i + 1]) for i in range(len(parts))]
    (dist / "entry_points.txt").write_text("\n".join(lines) + "\n")
    return modules


def check_config(text: str, where: Path) -> None:
    """What ``memorizzd --config FILE --check-config`` does with ``text``;
    ``ConfigError`` (or ``VaultKeyError``) if it refuses it."""
    path = where / "memorizzd.toml"
    path.write_text(text, encoding="utf-8")
    config = load(str(path), socket=str(where / "d.sock"), environ={})
    check_config_servers(config)
    check_tracing(config)
    check_stores(config.credentials.stores)


MEMORIZZD_BLOCKS = [b for b in TOML_BLOCKS if _is_memorizzd_config(b)]
OTHER_BLOCKS = [b for b in TOML_BLOCKS if not _is_memorizzd_config(b)]


@pytest.mark.parametrize(
    "block", MEMORIZZD_BLOCKS, ids=[b.where for b in MEMORIZZD_BLOCKS]
)
@pytest.mark.usefixtures("host")
def test_every_toml_example_loads(block: Block, tmp_path: Path) -> None:
    try:
        check_config(block.text, tmp_path)
    except (ConfigError, VaultKeyError) as exc:
        pytest.fail(f"{block.where}: memorizzd --check-config refuses it: {exc}")


@pytest.mark.parametrize("block", OTHER_BLOCKS, ids=[b.where for b in OTHER_BLOCKS])
@pytest.mark.usefixtures("host")
def test_a_block_of_another_file_is_no_memorizzd_config(
    block: Block, tmp_path: Path
) -> None:
    """``# pyproject.toml ...``: refused for its keys, not for what it says."""
    with pytest.raises(ConfigError, match="unknown field"):
        check_config(block.text, tmp_path)


def test_an_example_names_the_file_the_daemon_reads() -> None:
    """A configuration example that says where it goes says where the
    daemon looks: /etc/memorizzd/memorizzd.toml."""
    for block in MEMORIZZD_BLOCKS:
        named = _named_file(block)
        assert named in (None, str(DEFAULT_CONFIG_PATH)), (
            f"{block.where}: memorizzd reads {DEFAULT_CONFIG_PATH}, not {named}"
        )


def test_the_examples_are_found() -> None:
    """The pages the examples are on, and the file comment read."""
    pages = {b.path.name for b in MEMORIZZD_BLOCKS}
    assert {
        "configuration.md",
        "operations.md",
        "presets.md",
        "auth.md",
        "security.md",
    } <= pages
    assert len(MEMORIZZD_BLOCKS) >= 14
    assert {_named_file(b) for b in OTHER_BLOCKS} == {
        "pyproject.toml",
        "~/.codex/config.toml",
    }


@pytest.mark.usefixtures("host")
def test_a_broken_example_is_refused(tmp_path: Path) -> None:
    """The check refuses what --check-config refuses: a misspelled key, a
    wrong type, a server entry that cannot work, a store not installed."""
    for text in (
        "[[servers]]\nname = 'x'\ntransport = 'stdio'\ncommand = '/bin/true'\ntimeout = 5\n",
        "connect_wait_s = 'soon'\n",
        "[[servers]]\nname = 'x'\ntransport = 'streamable_http'\n",
        "[credentials]\nstores = ['vault', 'nowhere']\n",
        "[tracing]\nendpoint = 'ftp://x'\n",
    ):
        with pytest.raises((ConfigError, VaultKeyError)):
            check_config(text, tmp_path)
    assert "servers.timeout" not in accepted_keys()
    assert {"servers.timeout_s", "profiles.limits.max_in_flight", "metrics.listen"} <= (
        accepted_keys()
    )
