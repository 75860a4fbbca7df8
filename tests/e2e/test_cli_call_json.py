"""``memorizzctl --json mcp call`` and ``mcp resume``: the tool's result as the
upstream server wrote it.

The daemon relays a tool's result as the bytes the server wrote (tests/daemon/
test_raw_relay.py), for an approved proposal's call (``approvals/resume``) as
for ``tools/call``; ``--json`` prints that object, not the thin client's
``ToolsCallResult`` encoded again, which would drop what the struct does not
model (``resultType``, a vendor's member), leave out ``isError: false`` and
reorder the rest. Each server here writes through ``tee``, so a test reads what
the server wrote for a call and compares it with what the installed
``memorizzctl`` printed: the same members, values and order, only indented.
(``mcp task result`` is not one of them: the daemon rewrites a task's result,
its related-task id the daemon's, so its ``--json`` is the struct.)
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from memorizz.api.errors import ApprovalRequiredError
from memorizz.api.methods import ServerSpec
from tests.harness import (
    MCP_SERVER,
    DaemonHarness,
    daemon_config,
    launch_args,
    rmtree,
    short_tempdir,
    stdio_spec,
)
from tests.process import MEMORIZZCTL, wait_until

"""The installed console script: what users run."""
RELAY_SERVER = str(Path(__file__).parents[1] / "relay_server.py")
"""Hand-written: its result starts with a vendor member (``x-vendor``)."""

GENERAL = ["--verbose"]
"""A line the one-shot path declines: argparse and ``Client.call_tool``."""


class _Written(msgspec.Struct):
    """A line a server wrote: an answer carries ``result``."""

    id: int | str | None = None
    result: msgspec.Raw = msgspec.Raw(b"null")


class Tap:
    """The lines one server wrote to its stdout (``tee -a PATH``)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.taken = 0

    def _tool_results(self) -> list[bytes]:
        if not self.path.exists():
            return []
        found = []
        for line in self.path.read_bytes().splitlines():
            written = msgspec.json.decode(line, type=_Written)
            result = msgspec.json.decode(written.result)
            if (
                written.id is not None
                and isinstance(result, dict)
                and "content" in result
            ):
                found.append(bytes(written.result))
        return found

    def next_result(self) -> bytes:
        """The one tool result the server wrote since the last one taken
        (``tee`` may write its file just after the daemon read the pipe)."""
        wait_until(
            lambda: len(self._tool_results()) > self.taken,
            timeout=10,
            what=f"a tool result in {self.path}",
        )
        results = self._tool_results()
        new, self.taken = results[self.taken :], len(results)
        assert len(new) == 1, new
        return new[0]


def _tapped(
    name: str, base: str, *server: str, protocol: str = "auto", **overrides: Any
) -> tuple[ServerSpec, Tap]:
    """The stdio server ``server`` (an argv), its stdout copied to a file (a
    script, not ``sh -c``: the daemon refuses inline code by default);
    ``overrides``: more of its ``ServerSpec``."""
    path = Path(base) / f"{name}.out"
    script = Path(base) / f"{name}.sh"
    script.write_text(f"{shlex.join(server)} | tee -a {shlex.quote(str(path))}\n")
    spec = stdio_spec(
        name, command="/bin/sh", args=[str(script)], protocol=protocol, **overrides
    )
    return spec, Tap(path)


VENDOR = (sys.executable, RELAY_SERVER, "legacy")


@pytest.fixture(scope="module")
def world() -> Iterator[tuple[DaemonHarness, dict[str, Tap]]]:
    """A daemon with four tapped servers: ``sdk``, tests/mcp_server.py (the
    SDK's results: ``structuredContent``, ``_meta``, ``resultType``,
    ``isError: false``), forked by the test-server zygote, and ``vendor``,
    tests/relay_server.py (a member no schema knows, written first); and,
    for ``mcp resume``, the same two whose calls need approval: ``sdk_ask``
    (``record``, destructive, and ``fail``, made so) and ``vendor_ask``."""
    base = short_tempdir()
    sdk_argv = (sys.executable, *launch_args(MCP_SERVER, "stdio"))
    try:
        sdk, sdk_tap = _tapped("sdk", base, *sdk_argv)
        vendor, vendor_tap = _tapped("vendor", base, *VENDOR, protocol="legacy")
        sdk_ask, sdk_ask_tap = _tapped(
            "sdk_ask",
            base,
            *sdk_argv,
            env={"CALL_LOG": str(Path(base) / "calls.log")},
            risk={"fail": "destructive"},
        )
        vendor_ask, vendor_ask_tap = _tapped(
            "vendor_ask",
            base,
            *VENDOR,
            protocol="legacy",
            risk={"show": "destructive"},
        )
        config = daemon_config(base, servers=[sdk, vendor, sdk_ask, vendor_ask])
        with DaemonHarness.running(config) as harness:
            for name in ("sdk", "vendor", "sdk_ask", "vendor_ask"):
                harness.wait_ready(name)
            yield (
                harness,
                {
                    "sdk": sdk_tap,
                    "vendor": vendor_tap,
                    "sdk_ask": sdk_ask_tap,
                    "vendor_ask": vendor_ask_tap,
                },
            )
    finally:
        rmtree(base)


def _ctl(socket: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [MEMORIZZCTL, "--socket", socket, *argv],
        stdin=subprocess.DEVNULL,  # not a terminal: the one-shot path may take it
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def _assert_printed_as_written(out: str, written: bytes) -> dict[str, object]:
    """``out`` is the server's result: its text, indented, then a newline."""
    assert out == msgspec.json.format(written, indent=2).decode() + "\n"
    printed: dict[str, object] = msgspec.json.decode(out)
    assert printed == msgspec.json.decode(written)
    assert list(printed) == list(msgspec.json.decode(written))  # the order
    return printed


@pytest.mark.parametrize("extra", [[], GENERAL], ids=["one-shot", "general"])
def test_json_prints_the_servers_result_with_every_member(
    world: tuple[DaemonHarness, dict[str, Tap]], extra: list[str]
) -> None:
    harness, taps = world
    done = _ctl(
        harness.socket,
        "--json",
        "mcp",
        "call",
        "sdk",
        "add",
        "--arguments",
        '{"a": 2, "b": 3}',
        *extra,
    )
    written = taps["sdk"].next_result()
    assert (done.returncode, done.stderr) == (0, "")
    printed = _assert_printed_as_written(done.stdout, written)
    # What the thin client's struct dropped or left out before.
    assert printed["structuredContent"] == {"result": 5}
    assert isinstance(printed["_meta"], dict)
    assert printed["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == (
        "memorizz-test-server"
    )
    assert printed["resultType"] == "complete"
    assert printed["isError"] is False


@pytest.mark.parametrize("extra", [[], GENERAL], ids=["one-shot", "general"])
def test_an_error_result_is_printed_as_written_and_exits_1(
    world: tuple[DaemonHarness, dict[str, Tap]], extra: list[str]
) -> None:
    harness, taps = world
    argv = ["--json", "mcp", "call", "sdk", "fail", "--arguments", '{"reason": "no"}']
    done = _ctl(harness.socket, *argv, *extra)
    written = taps["sdk"].next_result()
    assert (done.returncode, done.stderr) == (1, "")  # isError: exit 1, as before
    printed = _assert_printed_as_written(done.stdout, written)
    assert printed["isError"] is True


@pytest.mark.parametrize("extra", [[], GENERAL], ids=["one-shot", "general"])
def test_a_member_no_schema_knows_is_kept_in_its_place(
    world: tuple[DaemonHarness, dict[str, Tap]], extra: list[str]
) -> None:
    harness, taps = world
    argv = ["--json", "mcp", "call", "vendor", "show", "--arguments", '{"a": 1}']
    done = _ctl(harness.socket, *argv, *extra)
    written = taps["vendor"].next_result()
    assert (done.returncode, done.stderr) == (0, "")
    printed = _assert_printed_as_written(done.stdout, written)
    assert list(printed) == ["x-vendor", "content"]
    assert printed["x-vendor"] == {"kept": True}


def test_text_output_is_unchanged(
    world: tuple[DaemonHarness, dict[str, Tap]],
) -> None:
    """Without ``--json``: the content's text, and the error on stderr."""
    harness, taps = world
    for extra in ([], GENERAL):
        done = _ctl(
            harness.socket,
            "mcp",
            "call",
            "sdk",
            "add",
            "--arguments",
            '{"a": 2, "b": 3}',
            *extra,
        )
        taps["sdk"].next_result()
        assert (done.returncode, done.stdout, done.stderr) == (0, "5\n", "")
        argv = ["mcp", "call", "sdk", "fail", "--arguments", '{"reason": "no"}']
        done = _ctl(harness.socket, *argv, *extra)
        taps["sdk"].next_result()
        assert (done.returncode, done.stdout) == (1, "")
        assert done.stderr == "memorizzctl: error: Error executing tool fail: no\n"


def _approved(harness: DaemonHarness, server: str, tool: str, **arguments: Any) -> str:
    """A call of ``tool`` that needs approval, proposed and approved (by an
    operator, the daemon's uid): the proposal's id. The server is not called."""
    with harness.client() as c:
        with pytest.raises(ApprovalRequiredError) as asked:
            c.call_tool(server, tool, arguments)
        proposal_id = asked.value.data["proposal_id"]
        assert isinstance(proposal_id, str)
        assert c.approve(proposal_id).status == "approved"
    return proposal_id


def test_resume_json_prints_the_servers_result_with_every_member(
    world: tuple[DaemonHarness, dict[str, Tap]],
) -> None:
    harness, taps = world
    proposal_id = _approved(harness, "sdk_ask", "record", tag="json")
    done = _ctl(harness.socket, "--json", "mcp", "resume", proposal_id)
    written = taps["sdk_ask"].next_result()
    assert (done.returncode, done.stderr) == (0, "")
    printed = _assert_printed_as_written(done.stdout, written)
    # What the thin client's struct dropped or left out before.
    assert printed["structuredContent"] == {"result": "recorded json"}
    assert printed["resultType"] == "complete"
    assert printed["isError"] is False


def test_resume_json_prints_an_error_result_as_written_and_exits_1(
    world: tuple[DaemonHarness, dict[str, Tap]],
) -> None:
    harness, taps = world
    proposal_id = _approved(harness, "sdk_ask", "fail", reason="no")
    done = _ctl(harness.socket, "--json", "mcp", "resume", proposal_id)
    written = taps["sdk_ask"].next_result()
    assert (done.returncode, done.stderr) == (1, "")  # isError: exit 1, as before
    printed = _assert_printed_as_written(done.stdout, written)
    assert printed["isError"] is True


def test_resume_json_keeps_a_member_no_schema_knows_in_its_place(
    world: tuple[DaemonHarness, dict[str, Tap]],
) -> None:
    harness, taps = world
    proposal_id = _approved(harness, "vendor_ask", "show", a=1)
    done = _ctl(harness.socket, "--json", "mcp", "resume", proposal_id)
    written = taps["vendor_ask"].next_result()
    assert (done.returncode, done.stderr) == (0, "")
    printed = _assert_printed_as_written(done.stdout, written)
    assert list(printed) == ["x-vendor", "content"]
    assert printed["x-vendor"] == {"kept": True}


def test_resume_text_output_is_unchanged(
    world: tuple[DaemonHarness, dict[str, Tap]],
) -> None:
    """Without ``--json``: the content's text, and the error on stderr; a
    second resume is ``not_approved`` (the proposal is consumed)."""
    harness, taps = world
    proposal_id = _approved(harness, "sdk_ask", "record", tag="text")
    done = _ctl(harness.socket, "mcp", "resume", proposal_id)
    taps["sdk_ask"].next_result()
    assert (done.returncode, done.stdout, done.stderr) == (0, "recorded text\n", "")
    again = _ctl(harness.socket, "mcp", "resume", proposal_id)
    assert (again.returncode, again.stdout) == (1, "")
    assert again.stderr.startswith("memorizzctl: error: ")
    assert again.stderr.rstrip("\n").endswith("(not_approved)")
    proposal_id = _approved(harness, "sdk_ask", "fail", reason="no")
    done = _ctl(harness.socket, "mcp", "resume", proposal_id)
    taps["sdk_ask"].next_result()
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == "memorizzctl: error: Error executing tool fail: no\n"
