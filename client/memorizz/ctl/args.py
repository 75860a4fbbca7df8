"""Turning memorizzctl's command-line words into values.

The argparse ``type=`` converters (an ``ArgumentTypeError`` becomes a usage
error, exit 2; numbers are held to the bounds the wire contract puts on
them, so the daemon never sees one it would refuse), ``read_stdin`` for the
values given as ``-``, ``repeatable`` for an option given any number of
times, and ``split_trailing``, which takes the words after ``mcp add ...
--`` before argparse sees the line.

Standard library, msgspec and the wire contract only, like the rest of the
client.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any, Final, TypeVar, get_args

import msgspec

from memorizz.api import methods as m

_N = TypeVar("_N", int, float)


def _most(kind: object) -> Any:
    """The upper bound (``le``) the wire contract puts on ``kind``."""
    return next(a.le for a in get_args(kind) if isinstance(a, msgspec.Meta))


# What the daemon accepts: a larger value would come back as its
# invalid_params, naming a wire field, not the option.
MAX_DEADLINE_S: Final[float] = _most(m.Deadline)
"""The longest deadline a request may carry (3600 s)."""
MAX_WAIT_S: Final[float] = _most(m.WaitSeconds)
"""The longest long-poll (300 s)."""
MAX_PAGE: Final[int] = _most(m.PageLimit)
"""The most items one page may ask for (1000)."""
MAX_ROW_ID: Final[int] = _most(m.RowId)
"""The largest record id."""


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


class StdinError(ValueError):
    """Standard input could not be read as text; the message says why."""


def read_stdin(*, line: bool = False) -> str:
    """All of standard input (``line``: its first line), as text; raise
    ``StdinError`` when it is closed or not UTF-8."""
    if sys.stdin is None:  # started with fd 0 closed (``<&-``)
        raise StdinError("standard input is closed")
    try:
        return sys.stdin.readline() if line else sys.stdin.read()
    except UnicodeDecodeError:
        raise StdinError("standard input is not UTF-8 text") from None
    except OSError as exc:
        raise StdinError(f"cannot read standard input: {exc.strerror or exc}") from None


def json_object(text: str) -> dict[str, Any]:
    if not text.strip(" \t\n\r\ufeff"):
        raise argparse.ArgumentTypeError("not valid JSON: it is empty")
    try:
        value = msgspec.json.decode(text.removeprefix("\ufeff"))  # a BOM: not JSON's
    except msgspec.DecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON: {exc}") from None
    except UnicodeError:  # undecodable bytes on the command line (surrogates)
        raise argparse.ArgumentTypeError("not UTF-8 text") from None
    except RecursionError:
        raise argparse.ArgumentTypeError("not valid JSON: nested too deeply") from None
    if not isinstance(value, dict):
        kind = _JSON_KINDS.get(type(value), type(value).__name__)
        raise argparse.ArgumentTypeError(f"must be a JSON object, got {kind}")
    return value


def json_object_source(text: str) -> dict[str, Any]:
    """``json_object`` of the text itself, of a file (``@FILE``), or of
    standard input (``-``); a file that cannot be read is a usage error."""
    if text == "-":
        try:
            return json_object(read_stdin())
        except StdinError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
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


def _at_most(value: float, limit: float, text: str) -> None:
    if value > limit:
        most = str(int(limit)) if limit == int(limit) else f"{limit:g}"
        raise argparse.ArgumentTypeError(f"must be at most {most}, got {text!r}")


def bounded(parse: Callable[[str], _N], limit: float) -> Callable[[str], _N]:
    """``parse``, then held to at most ``limit`` (a usage error beyond it)."""

    def convert(text: str) -> _N:
        value = parse(text)
        _at_most(value, limit, text)
        return value

    return convert


deadline: Final = bounded(positive_float, MAX_DEADLINE_S)
"""Seconds a request may take: positive, at most ``MAX_DEADLINE_S``."""
wait_seconds: Final = bounded(positive_float, MAX_WAIT_S)
"""Seconds a long-poll may wait: positive, at most ``MAX_WAIT_S``."""
page_limit: Final = bounded(positive_int, MAX_PAGE)
"""Items per page: 1 to ``MAX_PAGE``."""
row_id: Final = bounded(positive_int, MAX_ROW_ID)
"""A record id: positive, at most ``MAX_ROW_ID``."""


def repeatable(
    parser: argparse.ArgumentParser,
    flag: str,
    *,
    metavar: str,
    help: str,
    type: Callable[[str], Any] | None = None,
) -> None:
    """Declare ``flag`` as given any number of times: its values (through
    ``type``) in a list, empty when it is not given."""
    converts: dict[str, Any] = {} if type is None else {"type": type}
    parser.add_argument(
        flag, metavar=metavar, action="append", default=[], help=help, **converts
    )


def socket_path(text: str) -> str:
    """A socket's path: an empty one is a mistake (an unset variable, most
    likely), not a request for the default."""
    if not text:
        raise argparse.ArgumentTypeError("an empty path")
    return text


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
