"""docs/protocol.md is enough for a client in another language, and cannot
drift from the code: its error table lists exactly the stable reasons
(``memorizz.api.errors.REASONS``) under codes that exist, and it states the
frame size and the default socket paths the client uses. The Node.js client
maps every code to a class, as the Python client does."""

from __future__ import annotations

import re
from pathlib import Path

from memorizz.api.errors import REASONS, ErrorCode
from memorizz.api.paths import SYSTEM_SOCKET
from memorizz.api.protocol import MAX_FRAME

ROOT = Path(__file__).parents[2]
DOC = (ROOT / "docs" / "protocol.md").read_text()


def _error_table() -> dict[str, int]:
    section = DOC.split("\n## Errors\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (-\d+) \| `([a-z_]+)` \|", section, re.MULTILINE)
    table: dict[str, int] = {}
    for code, reason in rows:
        assert reason not in table, f"{reason} twice"
        table[reason] = int(code)
    return table


def test_the_error_table_lists_every_reason_and_no_other() -> None:
    table = _error_table()
    assert set(table) == REASONS


def test_every_reason_has_a_code_that_exists_and_every_code_a_reason() -> None:
    table = _error_table()
    codes = {int(code) for code in ErrorCode}
    assert set(table.values()) == codes


def test_the_frame_size_and_the_socket_paths_are_stated() -> None:
    assert f"{MAX_FRAME:,}" in DOC
    assert SYSTEM_SOCKET in DOC
    for path in (
        "$XDG_RUNTIME_DIR/memorizzd/memorizzd.sock",
        "/tmp/memorizzd-UID/memorizzd.sock",
        "AGENTS_DIR/PROFILE/api.sock",
        "`MEMORIZZ_SOCKET`",
    ):
        assert path in DOC, path


def test_the_node_client_has_a_class_for_every_code() -> None:
    source = (ROOT / "clients" / "node" / "memorizz.mjs").read_text()
    mapped = {
        int(code)
        for code in re.findall(r"^  \[(-\d+)\]: \w+Error,$", source, re.MULTILINE)
    }
    assert mapped == {int(code) for code in ErrorCode}
    assert f"MAX_FRAME = 1 << {MAX_FRAME.bit_length() - 1};" in source
    assert f'SYSTEM_SOCKET = "{SYSTEM_SOCKET}";' in source
