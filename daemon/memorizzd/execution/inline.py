"""Inline code: an interpreter handed its program on the command line, not in a file.

Refused unless ``stdio_allow_inline_code``. Programs are recognised by the name
given, the name found and the real file's name (a symlink called ``helper``
that points at python is python). Recognised, with the option grammar each
really has (``grammars.py``; combined switches like ``bash -lc`` and
``python -Ic`` included; options after the script belong to the script):
python/pypy ``-c``; sh, bash, dash, zsh, ksh, mksh, ash, yash, csh, tcsh
``-c``; fish ``-c``/``-C``; node/nodejs and bun
``-e``/``-p``/``--eval``/``--print`` and ``data:`` URLs
(``--import data:...``); deno ``eval``, ``--eval`` and ``data:`` URLs; perl
``-e``/``-E`` and ``-M`` with code; ruby ``-e``; php
``-r``/``-R``/``-B``/``-E``; lua/luajit ``-e``; Rscript/R ``-e``; julia
``-e``/``-E``; osascript ``-e``; expect ``-c``; pwsh/powershell
``-Command``/``-EncodedCommand``/``-CommandWithArgs`` (and their
abbreviations); npx/pnpx ``-c``/``--call``, ``npm exec -c``,
``pnpm exec|dlx -c``. ``env`` is parsed exactly (options, ``NAME=VALUE``;
``-S`` is refused: it is a command line in a string), and the variables it sets
are checked like the server's own (``environment.py``). Launchers with their
own large grammars (uv, uvx, pipx, poetry, timeout, nice, sudo, busybox, xargs
and the like, see ``grammars.WRAPPERS``) are looked through: any argument
naming a recognised program is checked with what follows it (this can refuse a
script whose own arguments read like a one-liner). su, runuser, flock, script
and capsh ``-c`` run a shell command line. Not covered: awk, sed, find and
other tools whose arguments are programs (keep them off the allowlist), and
code in files: the allowlist, not this rule, bounds that.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from typing import Final

from memorizzd.execution.env_command import parse_env
from memorizzd.execution.environment import env_code
from memorizzd.execution.grammars import (
    POWERSHELL,
    SHELL_STRING,
    WRAPPERS,
    Grammar,
    grammar_for,
    known,
)
from memorizzd.execution.paths import program_names

MAX_DEPTH: Final = 8
"""Nested launchers (``env env timeout nice ...``) deeper than this are refused."""

_MODULE: Final = re.compile(r"-?[\w:]+(=[\w:,.\-]*)?")


def inline_code(
    programs: Sequence[str], args: Sequence[str], *, path: str, depth: int
) -> str | None:
    """What makes this invocation inline code, or None."""
    if depth > MAX_DEPTH:
        return "too many nested launchers"
    for name in sorted(program_names(programs, path=path)):
        if (
            problem := _inline_as(name, list(args), path=path, depth=depth)
        ) is not None:
            return problem
    return None


def _inline_as(name: str, args: list[str], *, path: str, depth: int) -> str | None:
    if name == "env":
        call = parse_env(args)
        if call.split_string:
            return "env -S runs a command line from a string"
        if (problem := env_code(call.assignments)) is not None:
            return problem
        if call.program is None:
            return None
        inner = call.assignments.get("PATH", os.defpath if call.cleared else path)
        return inline_code([call.program], call.args, path=inner, depth=depth + 1)
    if name in POWERSHELL:
        switch = _powershell_inline(args)
        return None if switch is None else f"{name} {switch}"
    if name in SHELL_STRING and (switch := _shell_string(name, args)) is not None:
        return f"{name} {switch} runs a shell command line"
    if (grammar := grammar_for(name)) is not None:
        switch = _scan(args, grammar)
        return None if switch is None else f"{name} {switch}"
    if name in WRAPPERS or name in SHELL_STRING:
        for i, arg in enumerate(args):
            if arg.startswith("-") or not known(os.path.basename(arg)):
                continue
            found = inline_code([arg], args[i + 1 :], path=path, depth=depth + 1)
            if found is not None:
                return f"{name} ... {found}"
    return None


def _scan(args: Sequence[str], g: Grammar) -> str | None:
    """The switch (or form) that carries program text, scanning up to the script."""
    i, n = 0, len(args)

    def take() -> str:
        nonlocal i
        value = args[i] if i < n else ""
        i += 1
        return value

    def data(value: str) -> bool:
        return g.data_urls and value.startswith("data:")

    while i < n:
        arg = take()
        if arg in ("--", "-"):
            return None
        if arg.startswith("--"):
            name, eq, value = arg.partition("=")
            if name in g.inline_long:
                return name
            if name in g.values_long:
                value = value if eq else take()
            elif not eq and g.script is not None and i < n:
                if args[i].startswith("-") or g.script.match(args[i]):
                    continue
                value = take()  # an unknown option's value, not the script
            if data(value):
                return f"{name} data:"
            continue
        if arg.startswith("-") or (g.plus and arg.startswith("+") and len(arg) > 1):
            problem = _cluster(arg, g, take)
            if problem is not None:
                return problem or None
            continue
        if arg in g.inline_subcommands:
            return arg
        if arg in g.subcommands:
            continue
        return "a data: URL" if data(arg) else None
    return None


def _cluster(arg: str, g: Grammar, take: Callable[[], str]) -> str | None:
    """Scan ``-abc``: a switch carrying code, ``""`` to stop scanning, None to go on."""
    plus = arg.startswith("+")
    cluster = arg[1:]
    j = 0
    while j < len(cluster):
        ch = cluster[j]
        j += 1
        if ch in g.inline and not plus:
            return f"-{ch}"
        if ch in g.stop and not plus:
            return ""
        if ch in g.values:
            if not g.clustered_values:
                take()  # a shell's -o NAME: the value is the next argument
                continue
            value = cluster[j:] or take()
        elif ch in g.attached and g.clustered_values:
            if (pattern := g.optional.get(ch)) is not None:
                # A value of a known form (perl -l012), then more switches (-le).
                match = re.match(pattern, cluster[j:])
                j += match.end() if match else 0
                continue
            value = cluster[j:]
        else:
            continue
        if g.data_urls and value.startswith("data:"):
            return f"-{ch} data:"
        if ch in g.code_values and value and not _MODULE.fullmatch(value):
            return f"-{ch} with code"
        return None
    return None


_PS_VALUE: Final = (
    "executionpolicy",
    "configurationname",
    "configurationfile",
    "custompipename",
    "inputformat",
    "outputformat",
    "settingsfile",
    "windowstyle",
    "workingdirectory",
)
_PS_VALUE_ALIASES: Final = frozenset(
    {"ex", "ep", "config", "inp", "if", "o", "of", "settings", "w", "wd", "wo"}
)


def _powershell_inline(args: Sequence[str]) -> str | None:
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if not arg.startswith("-"):
            return None  # the script file; the rest is its own
        name = arg.lstrip("-").split(":", 1)[0].lower()
        if name in ("c", "e", "ec", "cwa") or (
            len(name) >= 3
            and any(
                full.startswith(name)
                for full in ("command", "commandwithargs", "encodedcommand")
            )
        ):
            return arg
        if name in ("f", "file") or (len(name) >= 2 and "file".startswith(name)):
            return None
        if name in _PS_VALUE_ALIASES or (
            len(name) >= 3 and any(full.startswith(name) for full in _PS_VALUE)
        ):
            i += 1
    return None


def _shell_string(name: str, args: Sequence[str]) -> str | None:
    for arg in args:
        if arg == "--" and name != "capsh":
            return None
        if arg == "-c" or arg.startswith(("--command", "--session-command")):
            return arg.split("=", 1)[0]
        if name != "capsh" and re.fullmatch(r"-[a-zA-Z]*c", arg):
            return arg
    return None
