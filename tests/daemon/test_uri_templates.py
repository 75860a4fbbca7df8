"""``memorizzd.uri_templates``: which URIs a template could have expanded to."""

from __future__ import annotations

import random
import re
import time

import pytest

from memorizzd.uri_templates import matches


@pytest.mark.parametrize(
    ("template", "uri", "expected"),
    [
        ("feat://colors/{color}", "feat://colors/red", True),
        ("feat://colors/{color}", "feat://colors/", True),
        ("feat://colors/{color}", "paint://colors/red", False),
        ("feat://colors/{color}", "feat://colors/red/more", False),
        ("feat://colors/{color}", "feat://colours/red", False),
        ("file:///{+path}", "file:///a/b/c.txt", True),
        ("file:///{path}", "file:///a/b/c.txt", False),
        ("repo://{owner}/{repo}/issues{?state,page}", "repo://o/r/issues", True),
        (
            "repo://{owner}/{repo}/issues{?state,page}",
            "repo://o/r/issues?state=x",
            True,
        ),
        ("db://t{/segments*}", "db://t/a/b", True),
        ("doc://x{#section}", "doc://x#intro", True),
        ("a.b://{x}", "aXb://y", False),  # literal text is literal, dots too
        ("feat://{unclosed", "feat://{unclosed", False),
        ("plain://no/expressions", "plain://no/expressions", True),
        ("plain://no/expressions", "plain://no/expressions/", False),
    ],
)
def test_a_uri_matches_the_templates_it_could_come_from(
    template: str, uri: str, expected: bool
) -> None:
    assert matches(template, uri) is expected


_REGEX_OF = {
    "": r"[^/?#]*",
    "+": r"[^#]*",
    "#": r"(?:#.*)?",
    ".": r"(?:\.[^/?#]*)*",
    "/": r"(?:/[^/?#]*)*",
    ";": r"(?:;[^/?#]*)*",
    "?": r"(?:\?[^#]*)?",
    "&": r"(?:&[^#]*)?",
}


def _by_regex(template: str, uri: str) -> bool:
    """The matcher as a backtracking regex (its first form): the meaning of
    each operator, for small inputs only."""
    parts, at = [], 0
    for found in re.finditer(r"\{([^{}]*)\}", template):
        parts.append(re.escape(template[at : found.start()]))
        body = found.group(1)
        parts.append(_REGEX_OF[body[:1] if body[:1] in _REGEX_OF else ""])
        at = found.end()
    rest = template[at:]
    if "{" in rest or "}" in rest:
        return False
    parts.append(re.escape(rest))
    return re.fullmatch("".join(parts), uri, re.DOTALL) is not None


@pytest.mark.parametrize("seed", range(5))
def test_random_templates_match_what_their_regular_expression_matches(
    seed: int,
) -> None:
    rng = random.Random(seed)  # noqa: S311 - seeded test data, not secrets
    pieces = ["a", "b", ".", "/", "?", "#", ";", "&", "=", "\n", "{", "}"]
    pieces += [f"{{{op}v}}" for op in ("", "+", "#", ".", "/", ";", "?", "&", "=")]
    chars = "ab./?#;&=\n{}"
    for _ in range(2000):
        template = "".join(rng.choice(pieces) for _ in range(rng.randrange(6)))
        uri = "".join(rng.choice(chars) for _ in range(rng.randrange(8)))
        assert matches(template, uri) is _by_regex(template, uri), (template, uri)


@pytest.mark.parametrize(
    ("template", "uri"),
    [
        ("{.v}", "." * 4000 + "?"),  # (\.[^/?#]*)*: 2**n ways to cut the dots
        ("{;v}", ";" * 4000 + "?"),
        ("{a}x" * 30, "x" * 4000 + "/"),  # n**30 ways to place the x's
        ("{a}" * 50 + "/", "a" * 4000),
        ("{+a}{#b}{.c}{/d}{;e}{?f}{&g}" * 10, "./;?&" * 800 + "#"),
    ],
)
def test_no_template_makes_matching_take_more_than_linear_time(
    template: str, uri: str
) -> None:
    """Found by fuzzing: as one backtracking regex, ``{.v}`` against 24 dots
    and a ``?`` took 0.7 s (doubling with each dot), and ``{a}x`` twelve times
    against 40 x's did not end in a minute. A server lists the templates; a
    caller picks the URI."""
    started = time.perf_counter()
    matches(template, uri)
    assert time.perf_counter() - started < 0.5
