"""A face session's log level reaches a 2026-07-28 upstream (issue 11, item 6):
such a server logs only to requests that opt in, so a call from a session that
set a level carries it upstream (``_meta`` log level), and the server's message
reaches that session, not one that set none. The official Python SDK client
through ``memorizzctl mcp serve``, a real SDK server over stdio and over
Streamable HTTP."""

from __future__ import annotations

import pytest

from tests.e2e.test_face import _log_sessions
from tests.harness import http_spec, serve_http, stdio_spec


@pytest.mark.filterwarnings(
    "ignore::mcp.shared.exceptions.MCPDeprecationWarning"
)  # the face's own logging/setLevel is the handshake era's way
def test_a_sessions_level_opts_its_calls_in_on_a_2026_07_28_upstream(
    base_dir: str,
) -> None:
    asked, silent = _log_sessions(base_dir, stdio_spec("alpha"))  # auto: 2026-07-28
    assert ("info", "alpha", "set True") in asked
    assert silent == []


@pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning")
def test_the_same_through_a_2026_07_28_streamable_http_upstream(
    base_dir: str,
) -> None:
    with serve_http("streamable_http") as url:
        spec = http_spec("alpha", url, "streamable_http")  # auto: 2026-07-28
        asked, silent = _log_sessions(base_dir, spec)
    assert ("info", "alpha", "set True") in asked
    assert silent == []
