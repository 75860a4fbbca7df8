"""Whether a URI could have been expanded from an RFC 6570 URI template.

The MCP face routes a resource URI that no server lists (one a client built
from a template) to the server whose template it matches. The match is
lenient where expansion is: each expression matches what its operator can
expand to (RFC 6570 §3.2: a simple ``{var}`` stops at ``/``, ``?`` and ``#``,
``{+var}`` and ``{#var}`` take reserved characters too, ``{/var}``, ``{.var}``
and ``{;var}`` add segments, ``{?var}`` and ``{&var}`` a query), and the
literal text between expressions must be there as it is. A template this does
not understand (an unclosed brace) matches nothing.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Final

_EXPRESSION: Final = re.compile(r"\{([^{}]*)\}")
_BY_OPERATOR: Final = {
    "": r"[^/?#]*",
    "+": r"[^#]*",
    "#": r"(?:#.*)?",
    ".": r"(?:\.[^/?#]*)*",
    "/": r"(?:/[^/?#]*)*",
    ";": r"(?:;[^/?#]*)*",
    "?": r"(?:\?[^#]*)?",
    "&": r"(?:&[^#]*)?",
}


def matches(template: str, uri: str) -> bool:
    """Whether ``uri`` could be an expansion of ``template``."""
    pattern = _pattern(template)
    return pattern is not None and pattern.fullmatch(uri) is not None


@lru_cache(maxsize=256)
def _pattern(template: str) -> re.Pattern[str] | None:
    parts: list[str] = []
    at = 0
    for found in _EXPRESSION.finditer(template):
        parts.append(re.escape(template[at : found.start()]))
        body = found.group(1)
        operator = body[:1] if body[:1] in _BY_OPERATOR else ""
        parts.append(_BY_OPERATOR[operator])
        at = found.end()
    rest = template[at:]
    if "{" in rest or "}" in rest:
        return None
    parts.append(re.escape(rest))
    return re.compile("".join(parts), re.DOTALL)
