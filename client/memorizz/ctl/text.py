"""Text primitives for memorizzctl's output: tables, ages, sizes, one safe line,
and the progress line a call shows on stderr (``ProgressLine``).

Tables are left-aligned columns two spaces apart. Text that comes from upstream
servers goes through ``one_line`` (or ``printable``, uncut), so control
characters never reach the terminal. ``to_json`` is what ``--json`` prints: a
struct under its wire names (``to_json_line``: one a line, for a stream).

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


def to_json_line(value: object) -> str:
    """``value`` as one JSON line: what a stream of ``--json`` records prints
    (``mcp watch``), one record a line."""
    return msgspec.json.encode(value).decode() + "\n"


def with_reason(message: str, reason: str) -> str:
    """An error's message with its stable reason in parentheses, unless the
    message already begins with it (``address_not_allowed: ...``)."""
    if message.startswith(reason + ":"):
        return message
    return f"{message} ({reason})"


def printable(text: str) -> str:
    """``text`` whole, on one line: control characters (newlines too) as ``?``."""
    return "".join(c if c.isprintable() else "?" for c in text)


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


def format_log(server: str, level: str, data: object) -> str:
    """A server's log message as ``mcp call --verbose`` shows it:
    ``[server] level: message`` (a message that is not text, as JSON)."""
    text = data if isinstance(data, str) else msgspec.json.encode(data).decode()
    return f"[{server}] {level}: {text}"


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

    def note(self, text: str) -> None:
        """A line of its own (a log message), above the progress line."""
        self.clear()
        self._stream.write(text + "\n")
        self._stream.flush()

    def clear(self) -> None:
        """Before the result: wipe the terminal's progress line, if one is shown."""
        if self._tty and self._shown:
            self._stream.write("\r\x1b[K")
            self._stream.flush()
        self._shown = False


class Prompter:
    """Answers a server's elicitation on a terminal (``mcp call``): its message,
    then one prompt per field of the requested schema (or the URL to open),
    on ``out``; lines read from ``into``. End of input declines."""

    def __init__(self, into: TextIO, out: TextIO) -> None:
        self._in = into
        self._out = out

    def _ask(self, prompt: str) -> str | None:
        self._out.write(prompt)
        self._out.flush()
        line = self._in.readline()
        if not line:  # Ctrl-D: the terminal echoed no newline; end the prompt's line
            self._out.write("\n")
            self._out.flush()
            return None
        return line.rstrip("\n")

    def answer(self, params: dict[str, object]) -> dict[str, object]:
        """MCP's ``ElicitResult`` for ``params`` (``elicitation/create``)."""
        self._out.write(
            f"the server asks: {one_line(str(params.get('message', '')), 500)}\n"
        )
        if params.get("mode") == "url":
            self._out.write(f"  open: {one_line(str(params.get('url', '')), 2000)}\n")
            said = self._ask("  done there? [y/N] ")
            return {"action": "accept" if said in ("y", "yes") else "decline"}
        schema = params.get("requestedSchema")
        fields = schema.get("properties", {}) if isinstance(schema, dict) else {}
        required = schema.get("required", []) if isinstance(schema, dict) else []
        content: dict[str, object] = {}
        for name, spec in fields.items() if isinstance(fields, dict) else ():
            spec = spec if isinstance(spec, dict) else {}
            while True:
                value = self._field(str(name), spec)
                if value is _EOF:
                    return {"action": "decline"}
                if value is None and name in (required or []):
                    self._out.write("  (required)\n")
                    continue
                break
            if value is not None:
                content[str(name)] = value
        return {"action": "accept", "content": content}

    def _field(self, name: str, spec: dict[str, object]) -> object:
        kind = spec.get("type", "string")
        title = one_line(str(spec.get("title") or spec.get("description") or name))
        choices = spec.get("enum")
        hint = f" [{'/'.join(map(str, choices))}]" if isinstance(choices, list) else ""
        text = self._ask(f"  {title} ({kind}){hint}: ")
        if text is None:
            return _EOF
        if text == "":
            return spec.get("default")
        try:
            if kind == "integer":
                return int(text)
            if kind == "number":
                return float(text)
        except ValueError:
            self._out.write(f"  not a {kind}\n")
            return self._field(name, spec)
        if kind == "boolean":
            return text.lower() in ("y", "yes", "true", "1")
        return text


_EOF: Final = object()
