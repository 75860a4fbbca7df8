"""``memorizzd.uri_templates``: which URIs a template could have expanded to."""

from __future__ import annotations

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
