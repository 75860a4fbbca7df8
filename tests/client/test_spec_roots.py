"""A server's ``roots`` (issue 11): ``file://`` URIs of absolute paths only,
checked once where the CLI and the daemon check every spec."""

from __future__ import annotations

import pytest

from memorizz.api.errors import InvalidParamsError
from memorizz.api.methods import ServerSpec
from memorizz.api.spec import ROOTS_MAX, check_server_spec


def _spec(roots: list[str]) -> ServerSpec:
    return ServerSpec(name="s", transport="stdio", command="/bin/true", roots=roots)


def test_file_uris_of_absolute_paths_are_taken() -> None:
    check_server_spec(_spec(["file:///srv/project", "file:///home/a%20b"]))


@pytest.mark.parametrize(
    "root",
    [
        "/srv/project",  # a path, not a URI
        "https://example.com/x",
        "file://host/srv",  # a host
        "file:relative/path",
        "file:/srv/project",  # not file://
        "file:///srv?x=1",
        "file:///srv#frag",
        "file:///srv/\nproject",
        "",
    ],
)
def test_anything_else_is_refused(root: str) -> None:
    with pytest.raises(InvalidParamsError, match="file:// URI of an absolute path"):
        check_server_spec(_spec([root]))


def test_the_number_of_roots_is_bounded() -> None:
    with pytest.raises(InvalidParamsError, match="roots"):
        check_server_spec(_spec([f"file:///r{i}" for i in range(ROOTS_MAX + 1)]))
