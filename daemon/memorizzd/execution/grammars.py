"""The command-line grammars of the programs the inline-code check recognises.

``Grammar`` describes an interpreter's options as far as the check needs them
(which switches carry program text, which take a value and how, where option
parsing ends); ``grammar_for`` finds the grammar for a program name. Programs
without one of these grammars but recognised all the same: ``POWERSHELL``
(its own ``-Command`` parsing), ``SHELL_STRING`` (launchers whose ``-c`` is a
shell command line) and ``WRAPPERS`` (launchers looked through, not parsed).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Final


@dataclasses.dataclass(frozen=True)
class Grammar:
    """An interpreter's command line, as much of it as the inline check needs."""

    inline: str = ""
    """Short switches whose value is program text (``c`` for ``python -c``)."""
    values: str = ""
    """Short switches taking a value: the rest of the cluster, else the next argument."""
    attached: str = ""
    """Short switches whose optional value can only be attached (``perl -i.bak``):
    the rest of the cluster, unless ``optional`` gives the value's form."""
    optional: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Attached values of a known form, after which the cluster goes on (``-l0e``)."""
    stop: str = ""
    """Short switches after which the rest belongs to something else (``python -m``)."""
    inline_long: frozenset[str] = frozenset()
    values_long: frozenset[str] = frozenset()
    clustered_values: bool = True
    """False for shells: in ``-oc`` the value of ``-o`` is the next argument."""
    plus: bool = False
    """``+o option`` (shells)."""
    data_urls: bool = False
    """A ``data:`` URL as a value or as the script is program text (node, deno)."""
    script: re.Pattern[str] | None = None
    """When set, an unknown ``--option`` takes the next argument as its value
    unless that argument looks like a script (node's many valued options)."""
    subcommands: frozenset[str] = frozenset()
    """Positionals that do not end option parsing (``bun run``, ``npm exec``)."""
    inline_subcommands: frozenset[str] = frozenset()
    """Positionals that take program text (``deno eval``)."""
    code_values: str = ""
    """Short switches whose value must look like a module name (``perl -M``)."""


_JS_SCRIPT: Final = re.compile(r".*(/|\.[cm]?[jt]sx?$)")

_PYTHON: Final = Grammar(
    inline="c",
    values="WX",
    stop="m",
    values_long=frozenset({"--check-hash-based-pycs"}),
)
_SHELL: Final = Grammar(
    inline="c",
    values="oO",
    clustered_values=False,
    plus=True,
    values_long=frozenset({"--rcfile", "--init-file"}),
)
_FISH: Final = Grammar(
    inline="cC",
    values="do",
    inline_long=frozenset({"--command", "--init-command"}),
    values_long=frozenset({"--debug", "--debug-output", "--features"}),
)
_NODE: Final = Grammar(
    inline="ep",
    values="rC",
    inline_long=frozenset({"--eval", "--print"}),
    values_long=frozenset(
        {"--require", "--import", "--loader", "--experimental-loader", "--conditions"}
    ),
    data_urls=True,
    script=_JS_SCRIPT,
)
_BUN: Final = Grammar(
    inline="ep",
    values="rc",
    inline_long=frozenset({"--eval", "--print"}),
    values_long=frozenset({"--preload", "--config", "--cwd", "--env-file"}),
    data_urls=True,
    script=_JS_SCRIPT,
    subcommands=frozenset({"run"}),
)
_DENO: Final = Grammar(
    inline_long=frozenset({"--eval"}),
    data_urls=True,
    script=_JS_SCRIPT,
    subcommands=frozenset({"run", "serve", "repl", "task"}),
    inline_subcommands=frozenset({"eval"}),
)
_PERL: Final = Grammar(
    inline="eE",
    values="I",
    attached="0CdDFilmMxV",
    optional={
        "0": r"x[0-9a-fA-F]*|[0-7]*",
        "l": r"[0-7]*",
        "C": r"[0-9]+|[IOEioSDALa]*",
        "d": r"t?(?::.*)?",
    },
    code_values="mM",
)
_RUBY: Final = Grammar(
    inline="e",
    values="CEIr",
    attached="0FiKTWx",
    optional={"0": r"[0-7]*", "K": r"[a-zA-Z]?", "T": r"[0-9]*", "W": r"[0-2]|:[\w-]*"},
    values_long=frozenset({"--encoding", "--external-encoding", "--internal-encoding"}),
)
_PHP: Final = Grammar(
    inline="rRBE",
    values="cdfzt",
    inline_long=frozenset(
        {"--run", "--process-code", "--process-begin", "--process-end"}
    ),
    values_long=frozenset({"--php-ini", "--define", "--file", "--zend-extension"}),
)
_LUA: Final = Grammar(inline="e", values="ljO", stop="b")
_R: Final = Grammar(inline="e")
_JULIA: Final = Grammar(
    inline="eE",
    values="LJCtp",
    attached="O",
    optional={"O": r"[0-3]?"},
    inline_long=frozenset({"--eval", "--print"}),
)
_OSASCRIPT: Final = Grammar(inline="e", values="ls")
_EXPECT: Final = Grammar(inline="c", values="fb")
_NPX: Final = Grammar(
    inline="c",
    values="p",
    inline_long=frozenset({"--call", "--shell-mode"}),
    values_long=frozenset({"--package"}),
)
_NPM: Final = dataclasses.replace(
    _NPX, subcommands=frozenset({"exec", "x", "exe", "dlx"})
)

_BY_NAME: Final[dict[str, Grammar]] = {
    **dict.fromkeys(
        (
            "sh",
            "bash",
            "rbash",
            "dash",
            "zsh",
            "ksh",
            "ksh93",
            "mksh",
            "pdksh",
            "oksh",
            "ash",
            "yash",
            "posh",
            "csh",
            "tcsh",
        ),
        _SHELL,
    ),
    "fish": _FISH,
    "bun": _BUN,
    "deno": _DENO,
    "php": _PHP,
    "luajit": _LUA,
    "Rscript": _R,
    "R": _R,
    "julia": _JULIA,
    "osascript": _OSASCRIPT,
    "expect": _EXPECT,
    "npx": _NPX,
    "pnpx": _NPX,
    "npm": _NPM,
    "pnpm": _NPM,
}
_BY_PATTERN: Final[tuple[tuple[re.Pattern[str], Grammar], ...]] = (
    (re.compile(r"(?:python|pypy)(?:\d+(?:\.\d+)*)?[dmtuw]?(?:-dbg)?"), _PYTHON),
    (re.compile(r"(?:node|nodejs)\d*"), _NODE),
    (re.compile(r"perl(?:\d+(?:\.\d+)*)?"), _PERL),
    (re.compile(r"ruby(?:\d+(?:\.\d+)*)?"), _RUBY),
    (re.compile(r"php(?:\d+(?:\.\d+)*)?"), _PHP),
    (re.compile(r"lua(?:\d+(?:\.\d+)*)?"), _LUA),
)
POWERSHELL: Final = frozenset({"pwsh", "pwsh-preview", "powershell"})
SHELL_STRING: Final = frozenset({"su", "runuser", "flock", "script", "capsh"})
"""Launchers whose ``-c``/``--command`` is a shell command line."""
WRAPPERS: Final = frozenset(
    {
        "uv",
        "uvx",
        "pipx",
        "poetry",
        "pdm",
        "hatch",
        "rye",
        "pixi",
        "conda",
        "mamba",
        "micromamba",
        "nice",
        "nohup",
        "timeout",
        "stdbuf",
        "setsid",
        "ionice",
        "taskset",
        "chrt",
        "prlimit",
        "sudo",
        "doas",
        "setpriv",
        "xargs",
        "time",
        "busybox",
        "unshare",
        "nsenter",
        "chroot",
        "firejail",
        "bwrap",
        "systemd-run",
        "dbus-run-session",
        "xvfb-run",
        "strace",
        "ltrace",
        "valgrind",
        "tini",
        "dumb-init",
        "catatonit",
        "gosu",
        "su-exec",
        "chpst",
        "bunx",
    }
)
"""Launchers with grammars of their own, looked through rather than parsed."""


def grammar_for(name: str) -> Grammar | None:
    """The grammar of the program called ``name``, if it has one here."""
    if (grammar := _BY_NAME.get(name)) is not None:
        return grammar
    for pattern, grammar in _BY_PATTERN:
        if pattern.fullmatch(name):
            return grammar
    return None


def known(name: str) -> bool:
    """Whether the inline-code check has a rule for the program called ``name``."""
    return (
        name == "env"
        or name in WRAPPERS
        or name in SHELL_STRING
        or name in POWERSHELL
        or grammar_for(name) is not None
    )
