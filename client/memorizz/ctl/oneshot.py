"""The one-shot ``memorizzctl mcp call``: one tool call, from built-in modules only.

A script that runs ``memorizzctl mcp call NAME TOOL`` pays for an interpreter,
its imports and one round trip. The general path (``memorizz.ctl.run``)
imports argparse, the whole command tree and msgspec, whose own import pulls in
``typing``, ``inspect``, ``uuid``, ``decimal`` and ``datetime``: three times
what the call itself costs. This module does the plain case with what the
interpreter has already loaded (``os``, ``sys``) and two of its C modules:

    _socket   the AF_UNIX stream socket (``socket.py`` adds enums: 5 ms)
    _json     the C scanner and encoder that ``json`` wraps (``json`` compiles
              regular expressions at import: ``re``, ``enum``, ``functools``)

``parse`` reads the line by hand. It accepts exactly what argparse accepts for
``mcp call`` with ``--socket``, ``--json``, ``--arguments`` and ``--timeout``
(spelled ``--opt VALUE`` or ``--opt=VALUE``, where argparse allows them, the
later one winning) and returns ``None`` for anything else: ``--help``, a usage
error, a value that starts with ``-``, JSON that msgspec would read otherwise
(``NaN``, out-of-range numbers, surrogate escapes). The general path then
parses the line again and says what is wrong, so every usage message has one
source. ``exchange`` returns ``None`` when it cannot connect, before anything is
sent, for the same reason. Once the request is sent there is no way back: the
reply line goes to ``show``, which prints a result whose content is text only
and returns ``None`` for anything else (an error reply, ``--json``, images,
an empty content list, a reply msgspec would reject); the caller decodes that
line as the ``Client`` does and renders it with the general renderer (with
``--json``, the tool's result as the daemon relayed it:
``memorizz.ctl.commands.show_relayed_call``).

The request is the one ``Client.call_tool`` sends, field for field, with
``on_progress`` (token 1): the server's progress reports, if it sends any,
come before the reply and are shown on stderr (``memorizz.ctl.text.ProgressLine``,
imported only then). ``--arguments @FILE`` and ``--arguments -`` (stdin) are
declined. A test (tests/e2e/test_cli_startup.py) holds the import set, and that
this path is taken.
"""

from __future__ import annotations

import os
import sys

from memorizz.api.paths import default_socket_path
from memorizz.ctl.exits import ERROR_PREFIX, EXIT_ERROR, EXIT_OK, emit

TYPE_CHECKING = False  # typing itself costs more than this whole module
if TYPE_CHECKING:
    from typing import Any

try:
    import _json
    import _socket
except ImportError:  # not CPython: the general path does everything
    AVAILABLE = False
else:
    AVAILABLE = True

REQUEST_ID = 1
"""The id of the one request a one-shot connection sends."""
PROGRESS_TOKEN = 1
"""Its progress token (``Client``'s first)."""
_NOTIFICATION = b'{"jsonrpc":"2.0","method":'
"""How a line the daemon sends unasked starts (``ProgressNotification``)."""

_OPTIONS = ("--socket", "--arguments", "--timeout")
_JSON_SPACE = " \t\n\r"
_READ_CHUNK = 1 << 16


class Decline(Exception):
    """Not the plain case: the general path handles this line or this reply."""


class Call:
    """A parsed one-shot call: where to send it, what to send, how to print it."""

    __slots__ = ("as_json", "line", "socket_path")

    def __init__(self, socket_path: str, line: bytes, as_json: bool) -> None:
        self.socket_path = socket_path
        self.line = line
        self.as_json = as_json


# --- the line -------------------------------------------------------------------


def parse(argv: list[str]) -> Call | None:
    """``mcp call NAME TOOL [--arguments JSON] [--timeout S]``, or ``None``."""
    if not AVAILABLE:
        return None
    try:
        return _parse(argv)
    except Decline:
        return None


def _parse(argv: list[str]) -> Call:
    words: list[str] = []
    socket_path = ""
    arguments = "{}"
    timeout: float | None = None
    as_json = False
    i = 0
    while i < len(argv):
        word = argv[i]
        i += 1
        if not word.startswith("-"):
            words.append(word)
            continue
        name, eq, value = word.partition("=")
        if word == "--json":
            as_json = True
            continue
        # --arguments and --timeout are call's own: argparse refuses them earlier.
        if name not in _OPTIONS or (
            name != "--socket" and words[:2] != ["mcp", "call"]
        ):
            raise Decline
        if not eq:
            if i == len(argv) or argv[i].startswith("-"):
                raise Decline  # argparse reads a leading '-' as an option, or fails
            value = argv[i]
            i += 1
        # Each value is converted where argparse converts it: an invalid one
        # is a usage error even when a later one would be valid.
        if name == "--socket":
            if not value:
                raise Decline  # an empty path: argparse says so
            socket_path = value
        elif name == "--arguments":
            if value == "-" or value.startswith("@"):
                raise Decline  # stdin or a file: argparse reads them
            arguments = _arguments(value)
        else:
            timeout = _timeout(value)
    if len(words) != 4 or words[:2] != ["mcp", "call"]:
        raise Decline
    if os.isatty(0):
        raise Decline  # on a terminal the general path answers elicitations
    server, tool = words[2], words[3]
    text = (
        f'{{"jsonrpc":"2.0","id":{REQUEST_ID},"method":"tools/call","params":'
        f'{{"server":{_json.encode_basestring(server)},'
        f'"name":{_json.encode_basestring(tool)},"arguments":{arguments},'
        f'"timeout_s":{"null" if timeout is None else repr(timeout)},'
        f'"progress_token":{PROGRESS_TOKEN}}}}}\n'
    )
    try:
        line = text.encode()  # a lone surrogate (undecodable argv bytes) fails here
    except UnicodeError:
        raise Decline from None
    return Call(socket_path or default_socket_path(), line, as_json)


MAX_DEADLINE_S = 3600.0
"""``memorizz.ctl.args.MAX_DEADLINE_S``: the daemon's longest deadline."""


def _timeout(text: str) -> float:
    """``memorizz.ctl.args.deadline``'s rule: a positive float, at most
    ``MAX_DEADLINE_S``."""
    try:
        value = float(text)
    except ValueError:
        raise Decline from None
    if not 0 < value <= MAX_DEADLINE_S:
        raise Decline
    return value


def _arguments(text: str) -> str:
    """The ``--arguments`` object, re-encoded on one line."""
    value = _decode(text)
    if type(value) is not dict:
        raise Decline  # the general path says "must be a JSON object"
    try:
        encoded: str = "".join(_encoder()(value, 0))
    except (ValueError, TypeError, RecursionError):
        raise Decline from None
    return encoded


# --- JSON with the C scanner, read as msgspec reads it ---------------------------


def _no_constant(name: str) -> Any:
    raise Decline  # NaN, Infinity: not JSON, and msgspec refuses them


def _finite(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise Decline  # msgspec: "Number out of range"
    return value


class _Context:
    """What ``_json.make_scanner`` reads: ``json.decoder.JSONDecoder``'s settings."""

    strict = True  # control characters inside strings are an error, as in msgspec
    object_hook = None
    object_pairs_hook = None
    array_hook = None  # read from Python 3.15 on
    parse_float = staticmethod(_finite)
    parse_int = int
    parse_constant = staticmethod(_no_constant)


def _decode(text: str) -> Any:
    """One JSON value filling ``text``; ``Decline`` where msgspec might differ."""
    body = text.strip(_JSON_SPACE)
    if "\\ud" in body or "\\uD" in body:
        raise Decline  # surrogate escapes: msgspec refuses a lone one
    try:
        # typeshed types the context as a scanner; json.decoder passes itself.
        value, end = _json.make_scanner(_Context)(body, 0)  # type: ignore[arg-type]
    except (StopIteration, ValueError, SystemError, RecursionError):
        # No value, or a malformed one: a JSONDecodeError (a ValueError) if
        # json.decoder is loaded, else a SystemError (the C scanner takes its
        # error class from there).
        raise Decline from None
    if end != len(body):
        raise Decline
    return value


def _no_default(value: object) -> object:
    raise TypeError(type(value).__name__)


def _encoder() -> _json.make_encoder:
    return _json.make_encoder(
        None, _no_default, _json.encode_basestring, None, ":", ",", False, False, False
    )


# --- the socket -----------------------------------------------------------------


def exchange(call: Call) -> bytes | None:
    """Send the request and return the reply line; ``None`` if it could not connect.

    A connection that breaks after the request went out raises
    ``DaemonUnreachableError``, as the ``Client`` does: the call may have run."""
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        try:
            sock.connect(call.socket_path)
        except OSError:
            return None  # the general path connects again and says why
        try:
            try:
                sock.sendall(call.line)
            except OSError:
                # A refused connection is answered with one error line and
                # closed: read it before reporting a broken connection.
                return _read_reply(sock)
            try:
                return _read_reply(sock)
            except KeyboardInterrupt:  # Ctrl-C: the daemon stops the call too
                _cancel(sock)
                raise
        except (OSError, EOFError) as exc:
            from memorizz.api.errors import DaemonUnreachableError

            msg = f"connection to memorizzd at {call.socket_path} broke: {exc}"
            raise DaemonUnreachableError(msg) from None
    finally:
        sock.close()


def _cancel(sock: _socket.socket) -> None:
    note = (
        '{"jsonrpc":"2.0","method":"notifications/cancelled","params":'
        f'{{"requestId":{REQUEST_ID},"reason":"interrupted"}}}}\n'
    )
    try:
        sock.sendall(note.encode())
    except OSError:
        pass


def _read_reply(sock: _socket.socket) -> bytes:
    """The reply line; the progress lines before it are shown on stderr."""
    buffer = bytearray()
    start = 0
    shown: Any = None  # the ProgressLine, once a report came
    while True:
        end = buffer.find(b"\n", start)
        if end < 0:
            chunk = sock.recv(_READ_CHUNK)
            if not chunk:
                raise EOFError("daemon closed the connection")
            start = len(buffer)
            buffer += chunk
            continue
        line = bytes(buffer[:end])
        del buffer[: end + 1]
        start = 0
        if line.startswith(_NOTIFICATION):
            shown = _progressed(line, shown)
            continue
        if shown is not None:
            shown.clear()
        return line


def _progressed(line: bytes, shown: Any) -> Any:
    """Show one progress report (anything else unasked is skipped)."""
    try:
        note = _decode(line.decode())
    except (Decline, UnicodeError):
        return shown
    params = note.get("params") if type(note) is dict else None
    if (
        type(params) is not dict
        or note.get("method") != "notifications/progress"
        or params.get("progress_token") != PROGRESS_TOKEN
    ):
        return shown
    progress, total, message = (params.get(k) for k in ("progress", "total", "message"))
    if type(progress) not in (int, float) or type(total) not in (
        int,
        float,
        type(None),
    ):
        return shown
    if shown is None:
        from memorizz.ctl.text import ProgressLine

        shown = ProgressLine(sys.stderr)
    shown.show(progress, total, message if type(message) is str else None)
    return shown


# --- the reply ------------------------------------------------------------------


def show(call: Call, raw: bytes) -> int | None:
    """Print a text-only tool result and return the exit status, else ``None``.

    What it prints is what ``memorizz.ctl.commands.show_call`` prints for the
    same reply: the texts, each ending with one newline; on stdout, or after
    ``memorizzctl: error: `` on stderr when the result has ``isError``."""
    if call.as_json or b"\\ud" in raw or b"\\uD" in raw:
        return None
    try:
        reply = _decode(raw.decode())
    except (Decline, UnicodeError):
        return None
    texts = _texts(reply)
    if texts is None:
        return None
    text = "".join(t if t.endswith("\n") else t + "\n" for t in texts)
    if reply["result"].get("isError") is True:
        sys.stderr.write(ERROR_PREFIX + text)
        return EXIT_ERROR
    emit(text)
    return EXIT_OK


def _texts(reply: object) -> list[str] | None:
    """The texts of a well-formed ``ToolsCallResult`` reply whose content is
    only text items; ``None`` for any other reply (as msgspec would type it)."""
    if type(reply) is not dict or reply.get("jsonrpc") != "2.0":
        return None
    request_id = reply.get("id")
    if type(request_id) is not int or request_id != REQUEST_ID:
        return None
    result = reply.get("result")
    if reply.get("error") is not None or type(result) is not dict:
        return None
    for key in ("structuredContent", "_meta"):
        if result.get(key) is not None and type(result[key]) is not dict:
            return None
    if type(result.get("isError", False)) is not bool:
        return None
    content = result.get("content")
    if type(content) is not list or not content:
        return None
    texts: list[str] = []
    for item in content:
        if type(item) is not dict or item.get("type") != "text":
            return None
        text = item.get("text")
        if type(text) is not str:
            return None
        texts.append(text)
    return texts
