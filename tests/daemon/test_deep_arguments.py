"""Arguments nested deeper than the MCP SDK can encode (about 254 levels; the
daemon's own decoder takes up to about 1000) must fail that call alone.

Found by the socket fuzz (tests/daemon/test_fuzz_frames.py): on stdio the SDK's
serialization error ended the session every caller shares, failing each call
in flight on that server (any agent could do it); fixed in
``upstream/stdio.py``. The HTTP transports have the same defect inside the SDK
(Streamable HTTP: the session ends at once; legacy SSE: the SDK's post writer
dies, the call waits for its deadline and the session is then replaced): they
are expected to fail until arguments are bounded before any transport.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from memorizz.api.errors import RemoteError
from memorizz.api.methods import ServerSpec
from tests.harness import DaemonHarness, serve_http, stdio_spec, wait_until

DEPTH = 500


@pytest.fixture(
    params=[
        "stdio",
        "streamable_http",
        "sse",
    ]
)
def server(request: pytest.FixtureRequest, daemon: DaemonHarness) -> Iterator[str]:
    kind: str = request.param
    if kind == "stdio":
        daemon.add(stdio_spec(kind))
        yield kind
        return
    with serve_http(kind) as url:
        spec = ServerSpec(
            name=kind,
            transport=kind,  # type: ignore[arg-type]
            url=url,
            allow_private_network=True,  # a loopback test server
            timeout_s=3.0,  # SSE: the unfixed call waits for its deadline
        )
        daemon.add(spec)
        yield kind
        with daemon.client() as c:  # let go before the HTTP server stops
            c.remove_server(kind)


def test_arguments_too_deep_to_encode_fail_that_call_alone(
    daemon: DaemonHarness, server: str
) -> None:
    deep: Any = []
    for _ in range(DEPTH):
        deep = [deep]
    outcome: list[object] = []

    def slow_call() -> None:  # another caller's call, in flight meanwhile
        try:
            with daemon.client() as c:
                outcome.append(c.call_tool(server, "slow", {"seconds": 1.0}))
        except RemoteError as exc:
            outcome.append(exc)

    other = threading.Thread(target=slow_call)
    other.start()
    try:
        with daemon.client() as c:
            wait_until(lambda: daemon.daemon.in_flight >= 1, what="the slow call")
            with pytest.raises(RemoteError) as err:
                c.call_tool(server, "echo", {"text": "x", "deep": deep})
            assert err.value.reason == "invalid_params"
    finally:
        other.join()
    assert outcome
    assert not isinstance(outcome[0], RemoteError), f"the other call failed: {outcome}"
    with daemon.client() as c:
        assert c.call_tool(server, "echo", {"text": "ok"}).content[0]["text"] == "ok"
        assert c.server_status(server)[0].restarts == 0
