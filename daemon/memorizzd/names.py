"""The tool names the MCP face shows, one function of the listings.

``SERVER<separator>NAME`` (``__`` unless the face's configuration says
otherwise; just ``NAME`` for a scope of one server). A name that is not a
valid tool name of at most 64 characters of ``[A-Za-z0-9_-]`` (the limit
model APIs share), or that another entry took first, is renamed: its valid
prefix, ``_`` and 8 hex digits of a SHA-256 of the full name. Never hidden,
and the same listing always gives the same names; ``face.py`` serves them
and ``servers/status`` reports the renames (``renamed``).
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Iterable
from typing import Final

log = logging.getLogger("memorizzd.face")

SEPARATOR: Final = "__"
NAME_MAX: Final = 64
_NAME_OK: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")
_NAME_BAD_CHARS: Final = re.compile(r"[^A-Za-z0-9_-]")


def wanted_name(server: str, name: str, *, single: bool, separator: str) -> str:
    """The name a tool would be shown under, were it valid and free."""
    return name if single else f"{server}{separator}{name}"


def exposed_names(
    listed: Iterable[tuple[str, str]],
    *,
    single: bool,
    separator: str = SEPARATOR,
    quiet: bool = False,
) -> dict[str, tuple[str, str]]:
    """Each listed (server, name) under the name the face shows, in the
    order given (earlier entries keep the plain name; a pair listed again,
    a server's listing that names a tool twice, is shown once); each rename
    is logged (at info) unless ``quiet``."""
    exposed: dict[str, tuple[str, str]] = {}
    seen: set[tuple[str, str]] = set()
    for server, name in listed:
        if (server, name) in seen:
            continue
        seen.add((server, name))
        wanted = wanted_name(server, name, single=single, separator=separator)
        shown = wanted
        if not _NAME_OK.fullmatch(wanted) or wanted in exposed:
            digest = hashlib.sha256(wanted.encode()).hexdigest()[:8]
            prefix = _NAME_BAD_CHARS.sub("_", wanted)[: NAME_MAX - 9]
            shown = f"{prefix}_{digest}"
            if not quiet:
                log.info(
                    "face: %r is shown as %r (invalid, too long or taken)",
                    wanted,
                    shown,
                )
        exposed[shown] = (server, name)
    return exposed


def renamed(
    names: dict[str, tuple[str, str]], *, single: bool, separator: str
) -> list[tuple[str, str, str]]:
    """The renames among ``exposed_names``' answer: (shown, server, name)
    for each entry not shown under its wanted name."""
    return [
        (shown, server, name)
        for shown, (server, name) in names.items()
        if shown != wanted_name(server, name, single=single, separator=separator)
    ]
