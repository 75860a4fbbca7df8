"""A 2026-07-28 upstream's list-change stream is held again when it ends.

At 2026-07-28 a server tells of list changes only on a ``subscriptions/listen``
stream, which it may end (gracefully: a restart of its event bus). The daemon
then listens again after a pause and lists the tools again, since a stream has
no replay: a change in the gap is found by that listing, and later changes by
the new stream. The server is the real test server (tests/mcp_server.py over
stdio, 2026-07-28); ``end_listens`` ends its streams.
"""

from __future__ import annotations

from tests.harness import DaemonHarness, daemon_config, stdio_spec, wait_until


def _added(harness: DaemonHarness) -> list[str]:
    """The tools the daemon's warm listing shows that change_tools added."""
    with harness.client() as c:
        return sorted(
            t.name for t in c.list_tools("alpha") if t.name.startswith("dyn_")
        )


def test_a_stream_the_server_ended_is_held_again_and_the_gap_is_listed(
    base_dir: str,
) -> None:
    config = daemon_config(base_dir, servers=[stdio_spec("alpha")])
    with DaemonHarness.running(config) as harness:
        harness.wait_ready("alpha")
        with harness.client() as c:
            assert c.server_status("alpha")[0].protocol_version == "2026-07-28"
            assert _added(harness) == []
            c.call_tool("alpha", "end_listens", {})
            c.call_tool("alpha", "change_tools", {})  # in the gap: nobody hears it
        # listened again, and listed again: the gap's change is seen
        wait_until(lambda: len(_added(harness)) == 1, timeout=15)
        with harness.client() as c:
            c.call_tool("alpha", "change_tools", {})  # heard on the new stream
        wait_until(lambda: len(_added(harness)) == 2, timeout=15)
