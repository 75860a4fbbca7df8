"""Whether a URI could have been expanded from an RFC 6570 URI template.

The MCP face routes a resource URI that no server lists (one a client built
from a template) to the server whose template it matches. The match is
lenient where expansion is: each expression matches what its operator can
expand to (RFC 6570 §3.2: a simple ``{var}`` stops at ``/``, ``?`` and ``#``,
``{+var}`` and ``{#var}`` take reserved characters too, ``{/var}``, ``{.var}``
and ``{;var}`` add segments, ``{?var}`` and ``{&var}`` a query), and the
literal text between expressions must be there as it is. A template this does
not understand (an unclosed brace) matches nothing.

Matching takes one pass over the URI per part of the template, whatever the
template: every place an expansion may end is followed at once, never tried
one by one (as one backtracking regex, ``{.v}`` against a run of dots and
``{a}x{a}x...`` against a run of x's took time exponential in the URI).
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Final

_EXPRESSION: Final = re.compile(r"\{([^{}]*)\}")
_BY_OPERATOR: Final = {
    "": ("", "/?#"),
    "+": ("", "#"),
    "#": ("#", ""),
    ".": (".", "/?#"),
    "/": ("/", "/?#"),
    ";": (";", "/?#"),
    "?": ("?", "#"),
    "&": ("&", "#"),
}
r"""What each operator expands to: the character each of its pieces starts
with (none: a single piece) and the characters a piece stops at. So ``{var}``
is ``[^/?#]*``, ``{+var}`` ``[^#]*``, ``{#var}`` ``(?:#.*)?``, ``{.var}``
``(?:\.[^/?#]*)*``, ``{/var}`` ``(?:/[^/?#]*)*``, ``{?var}`` ``(?:\?[^#]*)?``."""

Part = str | tuple[str, str]
"""Literal text, or an expression (``_BY_OPERATOR``'s pair)."""


def matches(template: str, uri: str) -> bool:
    """Whether ``uri`` could be an expansion of ``template``."""
    parts = _parts(template)
    if parts is None:
        return False
    at = {0}  # where in the uri the parts matched so far may end
    for part in parts:
        if isinstance(part, str):
            at = {p + len(part) for p in at if uri.startswith(part, p)}
        else:
            at = _expanded(uri, at, *part)
        if not at:
            return False
    return len(uri) in at


def _expanded(uri: str, starts: set[int], lead: str, stops: str) -> set[int]:
    """Where an expression's expansion may end, begun at any of ``starts``
    (one pass over the uri)."""
    ends = set(starts)
    last = max(starts)
    inside = False  # within a piece of the expansion
    for at in range(min(starts), len(uri)):
        char = uri[at]
        here = inside or at in starts
        if lead:
            inside = (here and char == lead) or (inside and char not in stops)
        else:
            inside = here and char not in stops
        if inside:
            ends.add(at + 1)
        elif at >= last:
            break
    return ends


@lru_cache(maxsize=256)
def _parts(template: str) -> tuple[Part, ...] | None:
    parts: list[Part] = []
    at = 0
    for found in _EXPRESSION.finditer(template):
        parts.append(template[at : found.start()])
        body = found.group(1)
        operator = body[:1] if body[:1] in _BY_OPERATOR else ""
        parts.append(_BY_OPERATOR[operator])
        at = found.end()
    rest = template[at:]
    if "{" in rest or "}" in rest:
        return None
    parts.append(rest)
    return tuple(part for part in parts if part)
