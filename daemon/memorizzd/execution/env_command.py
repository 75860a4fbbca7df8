"""The ``env`` command line, parsed exactly (GNU and BSD options).

Both checks look through ``env``: the allowlist (its target must be allowed
too, and loader variables it sets are refused) and the inline-code check (the
variables it sets are checked, then the program it runs). ``-S``/
``--split-string`` is reported, not parsed: it is a command line in a string.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple


class EnvCall(NamedTuple):
    program: str | None
    args: list[str]
    assignments: dict[str, str]
    cleared: bool
    split_string: bool
    chdir: str | None


def parse_env(args: Sequence[str]) -> EnvCall:
    """GNU/BSD ``env [OPTION]... [NAME=VALUE]... [COMMAND [ARG]...]``."""
    assignments: dict[str, str] = {}
    cleared = split = False
    chdir: str | None = None
    i, n = 0, len(args)
    while i < n:
        arg = args[i]
        i += 1
        if arg == "--":
            break
        if arg == "-":
            cleared = True
        elif arg.startswith("--"):
            name, eq, value = arg.partition("=")
            if name == "--ignore-environment":
                cleared = True
            elif name == "--split-string":
                split = True
                i += 0 if eq else 1
            elif name in ("--unset", "--chdir"):
                if not eq:
                    value = args[i] if i < n else ""
                    i += 1
                if name == "--chdir":
                    chdir = value
        elif arg.startswith("-") and len(arg) > 1:
            cluster = arg[1:]
            for j, ch in enumerate(cluster):
                if ch == "i":
                    cleared = True
                elif ch in "uCSP":
                    value = cluster[j + 1 :]
                    if not value:
                        value = args[i] if i < n else ""
                        i += 1
                    split = split or ch == "S"
                    chdir = value if ch == "C" else chdir
                    break
        else:
            i -= 1
            break
    while i < n and "=" in args[i] and not args[i].startswith("="):
        key, _, value = args[i].partition("=")
        assignments[key] = value
        i += 1
    program = args[i] if i < n else None
    return EnvCall(program, list(args[i + 1 :]), assignments, cleared, split, chdir)
