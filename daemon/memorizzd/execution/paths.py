"""Finding an executable the way a stdio server's child process would.

Relative ``PATH`` entries (``""``, ``.``) are skipped, so a bare name never
resolves through a working directory; a command with a slash is taken relative
to the given ``cwd``. The path is kept as found, *not* canonicalised: a
virtualenv's ``bin/python`` is a symlink whose own location matters. An
absolute command is returned as is, whether or not it exists (yet).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence


def _absolute_dirs(path: str) -> str:
    return os.pathsep.join(d for d in path.split(os.pathsep) if os.path.isabs(d))


def resolve(command: str, *, path: str, cwd: str | None) -> str | None:
    """The path ``command`` runs as, looked up on ``path``; None: not found."""
    if os.path.isabs(command):
        return command
    if os.sep in command:
        base = os.path.abspath(cwd) if cwd else os.getcwd()
        # Drop "." parts; ".." stays (it would change meaning past a symlink).
        parts = [part for part in command.split(os.sep) if part not in ("", ".")]
        candidate = os.path.join(base, *parts)
        return candidate if _is_executable(candidate) else None
    found = shutil.which(command, path=_absolute_dirs(path))
    return os.path.abspath(found) if found else None


def _is_executable(candidate: str) -> bool:
    return os.path.isfile(candidate) and os.access(candidate, os.X_OK)


def program_names(programs: Sequence[str], *, path: str) -> set[str]:
    """The names a program goes by: as given, as found, and its real file's."""
    names: set[str] = set()
    for program in programs:
        names.add(os.path.basename(program))
        found = resolve(program, path=path, cwd=None)
        if found is not None:
            names.add(os.path.basename(found))
            names.add(os.path.basename(os.path.realpath(found)))
    return names
