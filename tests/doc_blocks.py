"""The documentation as the "docs cannot drift" tests read it: README.md and
docs/*.md, their fenced code blocks and their inline code spans, and the
``memorizzctl`` command lines in both.

Standard library only: the client's tests (tests/client/) use it too.
"""

from __future__ import annotations

import re
import shlex
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parents[1]
DOCS: Final = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
"""Every page a user reads: the README and docs/."""

_FENCE: Final = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")


@dataclass(frozen=True)
class Block:
    """A fenced code block."""

    path: Path
    line: int
    """The opening fence's line (1-based)."""
    info: str
    """The info string: the language, and anything after it."""
    text: str
    """The body, without the fences, dedented by the fence's indentation."""

    @property
    def lang(self) -> str:
        return self.info.split()[0] if self.info.split() else ""

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks(path: Path) -> list[Block]:
    """The page's fenced code blocks, in order."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        indent, fence = opening["indent"], opening["fence"]
        closing = re.compile(rf"^ *{re.escape(fence[0])}{{{len(fence)},}}\s*$")
        end = i + 1
        while end < len(lines) and not closing.match(lines[end]):
            end += 1
        body = [line.removeprefix(indent) for line in lines[i + 1 : end]]
        found.append(
            Block(
                path=path,
                line=i + 1,
                info=opening["info"].strip(),
                text=textwrap.dedent("\n".join(body) + "\n"),
            )
        )
        i = end + 1
    return found


def all_blocks() -> Iterator[Block]:
    for path in DOCS:
        yield from blocks(path)


_SPAN: Final = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.DOTALL)


def spans(path: Path) -> list[tuple[int, str]]:
    """The page's inline code spans outside fenced blocks, as (line, text):
    a span may run over a line break (it is then one line of text), and
    ``\\|`` (a pipe in a table cell) is ``|``."""
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    for block in blocks(path):
        end = block.line + block.text.count("\n")
        for n in range(block.line - 1, min(end + 1, len(lines))):
            lines[n] = ""  # keep the line numbers
    prose = "\n".join(lines)
    found: list[tuple[int, str]] = []
    for match in _SPAN.finditer(prose):
        body = match[2]
        if "\n\n" in body:  # a span never crosses a paragraph
            continue
        line = prose.count("\n", 0, match.start()) + 1
        found.append((line, " ".join(body.replace("\\|", "|").split())))
    return found


@dataclass(frozen=True)
class Command:
    """One ``memorizzctl`` command line of the docs."""

    where: str
    argv: tuple[str, ...]
    """The words after ``memorizzctl``, as the shell would pass them (of a
    synopsis: as written, brackets and parentheses taken off)."""
    source: str
    """The line as written."""
    synopsis: bool = False
    """A synopsis, not a line to run: ``[optional]``, ``(a | b)``,
    ``get|result``, ``...``."""
    fenced: bool = True
    """In a fenced block (a line to copy), not an inline code span."""


def _strip_comment(line: str) -> str:
    """The line up to a shell comment (``#`` starting a word, outside quotes)."""
    quote = ""
    escaped = False
    for i, char in enumerate(line):
        if escaped:
            escaped = False
        elif char == "\\" and quote != "'":
            escaped = True
        elif quote:
            if char == quote:
                quote = ""
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


_QUOTED: Final = re.compile(r"'[^']*'|\"[^\"]*\"")
_SYNOPSIS: Final = re.compile(
    r"\[[^\]]*\]|\([^)]*\|[^)]*\)|\w\|\w|(?:^|\s)(?:\.\.\.|\u2026)(?:\s|$)"
)
"""What only a synopsis has (outside quotes): ``[--ttl MS]``, ``(--prompt
NAME | --resource-template URI)``, ``get|result|cancel``, an elided ``...``."""


def _synopsis(line: str, where: str, fenced: bool) -> Command | None:
    """The line as a synopsis, if it is one (None otherwise)."""
    if not _SYNOPSIS.search(_QUOTED.sub("", line)):
        return None
    words = line.split()
    if "memorizzctl" not in words:
        return None
    shown = [
        w.strip("[](){}")
        for w in words[words.index("memorizzctl") + 1 :]
        if w.strip("[](){}") not in ("", "|", "...", "\u2026")
    ]
    return Command(where, tuple(shown), line.strip(), synopsis=True, fenced=fenced)


_SUBSTITUTION: Final = re.compile(r"\$\(([^()]*)\)")
_SEPARATORS: Final = frozenset({";", "&&", "||", "|", "&"})
_REDIRECTS: Final = frozenset({">", ">>", "<", "<<", "&>", ">&"})


def shell_commands(line: str, where: str, *, fenced: bool = True) -> list[Command]:
    """The ``memorizzctl`` commands of one shell line (continuations joined):
    each word after the word ``memorizzctl`` (or a path ending in it) up to
    the end of its simple command (``;``, ``|``, ``&&``, a redirection).
    ``$(...)`` is a command of its own; ``$(command -v memorizzctl)`` is
    ``memorizzctl``."""
    if (synopsis := _synopsis(_strip_comment(line), where, fenced)) is not None:
        return [synopsis]
    found: list[Command] = []

    def substitute(match: re.Match[str]) -> str:
        inner = match[1].strip()
        if inner == "command -v memorizzctl":
            return "memorizzctl"
        found.extend(shell_commands(inner, where, fenced=fenced))
        return "SUBSTITUTED"

    text = _SUBSTITUTION.sub(substitute, _strip_comment(line))
    lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|<>")
    lexer.whitespace_split = True
    lexer.commenters = ""
    segment: list[str] = []
    segments = [segment]
    words = iter(list(lexer))
    for word in words:
        if word in _SEPARATORS:
            segment = []
            segments.append(segment)
        elif word in _REDIRECTS:
            next(words, None)  # its target
        else:
            segment.append(word)
    for words_of in segments:
        for i, word in enumerate(words_of):
            if word == "memorizzctl" or word.endswith("/memorizzctl"):
                argv = tuple(words_of[i + 1 :])
                if any("inspector-cli" in w for w in words_of[:i]):
                    argv = _without_inspector_options(argv)
                found.append(Command(where, argv, line.strip(), fenced=fenced))
                break
    return found


_INSPECTOR_OPTIONS: Final = frozenset(
    {
        "--method",
        "--tool-name",
        "--tool-arg",
        "--uri",
        "--prompt-name",
        "--prompt-args",
        "--log-level",
        "--header",
        "--transport",
        "--server",
        "--config",
    }
)
"""The MCP Inspector CLI's options, each with a value: given after the
server's command, they are the Inspector's (docs/mcp-clients.md), not the
command's, unless a ``--`` comes first."""


def _without_inspector_options(argv: tuple[str, ...]) -> tuple[str, ...]:
    """The server command's own words of an Inspector CLI line."""
    if "--" in argv:
        return argv[argv.index("--") + 1 :]
    kept: list[str] = []
    words = iter(argv)
    for word in words:
        if word in _INSPECTOR_OPTIONS:
            next(words, None)
        else:
            kept.append(word)
    return tuple(kept)


def _joined(text: str) -> list[tuple[int, str]]:
    """Lines with their ``\\`` continuations joined, with the first line's offset."""
    joined: list[tuple[int, str]] = []
    pending = ""
    start = 0
    for n, line in enumerate(text.splitlines()):
        if not pending:
            start = n
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        joined.append((start, pending + line))
        pending = ""
    if pending:
        joined.append((start, pending))
    return joined


SHELL_LANGS: Final = frozenset({"sh", "shell", "bash", "console", ""})
"""Blocks whose lines are shell: in ``console`` blocks (and those of no
language) the commands start ``$ `` and the other lines are output; ``sh``
blocks are all commands."""
_PROMPTED: Final = frozenset({"console", ""})

_CONFIGURED: Final = (
    # "command": "memorizzctl", "args": [...] (JSON, TOML, Python, JavaScript)
    re.compile(
        r"""["']memorizzctl["']\s*,?\s*["']?args["']?\s*[:=]\s*\[(?P<words>[^\]]*)\]"""
    ),
    # ..., "memorizzctl", "mcp", "serve", ...] (another command's arguments)
    re.compile(
        r"""["']memorizzctl["']\s*,\s*(?P<words>(?:["'][^"'\n]*["']\s*,?\s*)+)\]"""
    ),
)


def block_commands(block: Block) -> list[Command]:
    """The ``memorizzctl`` commands a fenced block shows: shell lines, and
    an MCP client's configuration that runs it (``"command": "memorizzctl",
    "args": [...]``, or ``"memorizzctl", "mcp", ...`` in another command's
    arguments)."""
    found: list[Command] = []
    if "memorizzctl" not in block.text:
        return found
    if block.lang in SHELL_LANGS:
        for offset, line in _joined(block.text):
            where = f"{block.path.relative_to(ROOT)}:{block.line + 1 + offset}"
            stripped = line.lstrip()
            if block.lang in _PROMPTED:
                if not stripped.startswith("$ "):
                    continue  # output
                stripped = stripped[2:]
            found.extend(shell_commands(stripped, where))
    # an MCP client's configuration (also in a comment of a shell block)
    for pattern in _CONFIGURED:
        for match in pattern.finditer(block.text):
            at = block.line + 1 + block.text.count("\n", 0, match.start())
            words = re.findall(r"""["']([^"'\n]*)["']""", match["words"])
            found.append(
                Command(
                    f"{block.path.relative_to(ROOT)}:{at}",
                    tuple(words),
                    " ".join(match[0].split()),
                )
            )
    return found


def span_commands(path: Path) -> list[Command]:
    """The inline code spans that are ``memorizzctl`` command lines."""
    found: list[Command] = []
    for line, text in spans(path):
        where = f"{path.relative_to(ROOT)}:{line}"
        for pattern in _CONFIGURED:  # `"args": ["host", "memorizzctl", ...]`
            for match in pattern.finditer(text):
                words = tuple(re.findall(r"""["']([^"'\n]*)["']""", match["words"]))
                found.append(Command(where, words, text, fenced=False))
        if not (text.startswith("memorizzctl ") or "$(memorizzctl " in text):
            continue  # `memorizzctl` alone, `memorizzctl: error: ...`
        found.extend(shell_commands(text, where, fenced=False))
    return found


def all_commands() -> list[Command]:
    """Every ``memorizzctl`` command line shown in the docs."""
    found: list[Command] = []
    for path in DOCS:
        for block in blocks(path):
            found.extend(block_commands(block))
        found.extend(span_commands(path))
    return found
