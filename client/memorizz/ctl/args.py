"""Turning memorizzctl's command-line words into values.

The argparse ``type=`` converters (an ``ArgumentTypeError`` becomes a usage
error, exit 2) and ``split_trailing``, which takes the words after
``mcp add ... --`` before argparse sees the line.

Standard library and msgspec only, like the rest of the client.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any, Final

import msgspec


def key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def header(text: str) -> tuple[str, str]:
    """``Name: value`` (the value is a secret: never echoed back in errors)."""
    name, sep, value = text.partition(":")
    if not sep or not name.strip() or not value.strip():
        raise argparse.ArgumentTypeError("expected 'Name: value'")
    return name.strip(), value.strip()


def secret_key_value(text: str) -> tuple[str, str]:
    """``KEY=VALUE`` whose value is a secret (not echoed back in errors)."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError("expected KEY=VALUE")
    return key, value


_JSON_KINDS: Final[dict[type, str]] = {
    list: "an array",
    str: "a string",
    int: "a number",
    float: "a number",
    bool: "a boolean",
    type(None): "null",
}


def json_object(text: str) -> dict[str, Any]:
    try:
        value = msgspec.json.decode(text)
    except msgspec.DecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        kind = _JSON_KINDS.get(type(value), type(value).__name__)
        raise argparse.ArgumentTypeError(f"must be a JSON object, got {kind}")
    return value


def json_object_source(text: str) -> dict[str, Any]:
    """``json_object`` of the text itself, of a file (``@FILE``), or of
    standard input (``-``); a file that cannot be read is a usage error."""
    if text == "-":
        return json_object(sys.stdin.read())
    if text.startswith("@"):
        path = text[1:]
        try:
            with open(path, encoding="utf-8") as file:
                return json_object(file.read())
        except (OSError, UnicodeDecodeError) as exc:
            reason = getattr(exc, "strerror", None) or "not UTF-8 text"
            raise argparse.ArgumentTypeError(
                f"cannot read {path!r}: {reason}"
            ) from None
    return json_object(text)


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return value


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
    return value


def split_trailing(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Split ``mcp add ... -- ARG...`` at the ``--``; leave any other command alone.

    argparse cannot give a ``nargs="*"`` positional the words after ``--`` once
    another positional came first, so ``mcp add`` takes them here. Only the
    global options can precede ``add``, and only ``--socket`` takes a value.
    """
    words: list[str] = []
    i = 0
    while i < len(argv) and len(words) < 2:
        word = argv[i]
        if word == "--":
            break
        if word == "--socket":
            i += 2
            continue
        if not word.startswith("-"):
            words.append(word)
        i += 1
    if words == ["mcp", "add"] and "--" in argv:
        cut = list(argv).index("--")
        return list(argv[:cut]), list(argv[cut + 1 :])
    return list(argv), []
