"""``memorizzctl mcp call``'s progress on stderr: one line rewritten in place
on a terminal, plain lines otherwise; a server's message is made safe."""

from __future__ import annotations

import io

from memorizz.ctl.text import ProgressLine, format_progress


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_one_line_rewritten_and_wiped_before_the_result() -> None:
    stream = _Terminal()
    line = ProgressLine(stream)
    line.show(1, 4, "copying")
    line.show(2, 4)
    line.clear()
    assert stream.getvalue() == (
        "\r\x1b[Kprogress: 1/4 (25%)  copying\r\x1b[Kprogress: 2/4 (50%)\r\x1b[K"
    )


def test_anything_else_gets_plain_lines_and_nothing_to_wipe() -> None:
    stream = io.StringIO()
    line = ProgressLine(stream)
    line.show(0.5, None, "half")
    line.clear()
    assert stream.getvalue() == "progress: 0.5  half\n"


def test_nothing_shown_nothing_wiped() -> None:
    stream = _Terminal()
    ProgressLine(stream).clear()
    assert stream.getvalue() == ""


def test_a_servers_message_cannot_move_the_cursor() -> None:
    assert (
        format_progress(7, 5, "\x1b[2Jboom\nsecond") == "progress: 7/5 (100%)  ?[2Jboom"
    )
