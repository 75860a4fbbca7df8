"""Text primitives for memorizzctl's output: tables, ages, sizes, one safe line,
and the progress line a call shows on stderr (``ProgressLine``).

Tables are left-aligned columns two spaces apart. Text that comes from upstream
servers goes through ``one_line``, so control characters never reach the
terminal. ``to_json`` is what ``--json`` prints: a struct under its wire names.

Pure functions, standard library and msgspec only, like the rest of the client.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, TextIO

import msgspec

DESCRIPTION_WIDTH: Final = 60


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns, two spaces apart, header in caps; ends with a newline."""
    header = [h.upper() for h in headers]
    widths = [len(h) for h in header]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    lines = [
        "  ".join(
            cell.ljust(width) for cell, width in zip(line, widths, strict=True)
        ).rstrip()
        for line in (header, *rows)
    ]
    return "\n".join(lines) + "\n"


def format_age(seconds: float) -> str:
    """A short age: ``3s``, ``2m``, ``1h``, ``4d`` (rounded down; never negative)."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h"
    return f"{s // 86400}d"


def format_ms(ms: float) -> str:
    """``0.42 ms``, ``3.1 ms``, ``120 ms``."""
    if ms < 1:
        return f"{ms:.2f} ms"
    if ms < 10:
        return f"{ms:.1f} ms"
    return f"{ms:.0f} ms"


def format_bytes(n: int) -> str:
    """``512 B``, ``1.5 KiB``, ``12.3 MiB``."""
    value, unit = float(n), "B"
    for bigger in ("KiB", "MiB", "GiB", "TiB"):
        if value < 1024:
            break
        value, unit = value / 1024, bigger
    return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"


def one_line(text: str | None, limit: int = DESCRIPTION_WIDTH) -> str:
    """The first line of ``text``, control characters replaced, cut to ``limit``."""
    if not text:
        return ""
    first = text.strip().split("\n", 1)[0].strip()
    clean = "".join(c if c.isprintable() else "?" for c in first)
    if len(clean) > limit:
        return clean[: limit - 3].rstrip() + "..."
    return clean


def dash(value: object) -> str:
    return "-" if value is None else str(value)


def blocks(parts: Sequence[str]) -> str:
    """Concatenate output blocks so each ends with exactly the newline it needs."""
    return "".join(p if p.endswith("\n") else p + "\n" for p in parts)


def to_json(value: object) -> str:
    return msgspec.json.format(msgspec.json.encode(value), indent=2).decode() + "\n"


def format_progress(
    progress: float, total: float | None = None, message: str | None = None
) -> str:
    """``progress: 2/5 (40%) copying``: a server's report, its message made safe."""
    if total:
        shown = f"{progress:g}/{total:g} ({min(progress / total, 1.0):.0%})"
    else:
        shown = f"{progress:g}"
    text = one_line(message)
    return f"progress: {shown}  {text}" if text else f"progress: {shown}"


class ProgressLine:
    """A call's progress on ``stream`` (stderr): one line rewritten in place on
    a terminal, one plain line per report otherwise (a log, a pipe)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._tty = stream.isatty()
        self._shown = False

    def show(
        self, progress: float, total: float | None = None, message: str | None = None
    ) -> None:
        line = format_progress(progress, total, message)
        if self._tty:
            self._stream.write("\r\x1b[K" + line)
        else:
            self._stream.write(line + "\n")
        self._stream.flush()
        self._shown = True

    def clear(self) -> None:
        """Before the result: wipe the terminal's progress line, if one is shown."""
        if self._tty and self._shown:
            self._stream.write("\r\x1b[K")
            self._stream.flush()
        self._shown = False
