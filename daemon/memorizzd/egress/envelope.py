"""The envelope of a JSON-RPC message, found while the message streams past.

An upstream message over the size cap is dropped as it streams, never
assembled; to fail the one request it answers, the transport needs that
message's ``id``, and servers write it anywhere: the TypeScript SDK, which most
public servers use, writes it *last* (``{"result":{...},"jsonrpc":"2.0","id":3}``).
:class:`EnvelopeScanner` is fed the message chunk by chunk and keeps only a few
counters and a few short byte strings, whatever the message's size:

* ``id``: the value of the top-level ``"id"`` key, if it is an integer in
  [-2**63, 2**64) or a string of at most :data:`MAX_ID_CHARS` characters
  (anything else, or an absurdly long id, is no id: ``None``);
* ``has_method``: the top-level object has ``"method"`` (a request or a
  notification from the server: its id is the server's, never answer it);
* ``is_response``: it has ``"result"`` or ``"error"``;
* ``done``: the top-level object is closed.

Speed in CPython comes from compiled regular expressions, never a loop per
byte: string bodies (escapes included) are skipped by one match; inside a
top-level member's value only brackets outside strings count, counted over
whole runs at once (strings stripped by ``re.sub``, balanced pairs by
``bytes.replace``), and the point where the value ends is found by bisection; runs of top-level members that cannot matter
(a plain key that is none of the four, a scalar value) are skipped by one
match. A message with more than :data:`MAX_SLOW_MEMBERS` other top-level
members is not a JSON-RPC message a server writes: the scanner stops looking
(``abandoned``), so that no message costs more than a bounded number of steps
per byte.
"""

from __future__ import annotations

import re
from array import array
from itertools import accumulate
from typing import Final

import msgspec

MAX_ID_CHARS: Final = 128
"""Longest string id; a longer one is refused (``id`` stays ``None``)."""
MAX_SLOW_MEMBERS: Final = 1024
"""Top-level members looked at one by one before the scanner gives up."""

_ID_RAW_MAX: Final = 12 * MAX_ID_CHARS  # a character is at most 12 bytes escaped
_KEY_RAW_MAX: Final = 64  # "method", every character escaped, is 36 bytes
_SCALAR_RAW_MAX: Final = 24  # -9223372036854775808 is 20 bytes
_WINDOW_MIN: Final = 256
_WINDOW_MAX: Final = 1 << 16
_FIND_ESCAPES: Final = 8
_LINEAR: Final = 64
_SQUARE: Final = bytes.maketrans(b"{}", b"[]")
_SIGNS: Final = bytes.maketrans(b"[]", b"\x01\xff")  # +1, -1 as signed bytes
_NOT_QUOTES_OR_BRACKETS: Final = bytes(sorted(set(range(256)) - set(b'"[]{}')))
_KEYS: Final = {"id", "method", "result", "error"}

_STR: Final = rb'"[^"\\]*+(?:\\.[^"\\]*+)*+"'
_string: Final = re.compile(_STR, re.DOTALL)
# A string's body up to its closing quote, a lone trailing backslash or the end.
_body: Final = re.compile(rb'[^"\\]*+(?:\\.[^"\\]*+)*+', re.DOTALL)
# Non-string bytes and complete strings: the bulk of a value. A backslash
# outside a string ends it: no JSON has one, and the bracket counts
# (``_brackets``) take every backslash for an escape inside a string.
_run: Final = re.compile(rb'(?:[^"\\]++|' + _STR + rb")*+", re.DOTALL)
_token: Final = re.compile(_STR + rb"|[\[\]{}]", re.DOTALL)
_plain_string: Final = re.compile(rb'"[^"]*+"')  # once escapes are gone
_ws: Final = re.compile(rb"[ \t\r\n]*+")
_scalar: Final = re.compile(rb'[^ \t\r\n,:\[\]{}"]*+')
# Top-level members that cannot matter: a plain key none of ours, a scalar value.
_boring: Final = re.compile(
    rb'(?:[ \t\r\n]*+,[ \t\r\n]*+"(?!(?:id|method|result|error)")[^"\\]*+"'
    rb"[ \t\r\n]*+:[ \t\r\n]*+(?:" + _STR + rb'|[^ \t\r\n,:\[\]{}"]++(?=[ \t\r\n,}]))'
    rb")*+",
    re.DOTALL,
)
_WS: Final = frozenset(b" \t\r\n")
_OPEN: Final = frozenset(b"[{")
_CLOSE: Final = frozenset(b"]}")

# Modes.
_BEFORE, _KEY, _COLON, _VALUE, _AFTER, _DEEP, _STRING, _SCALAR, _DONE, _OFF = range(10)
# What a string or scalar being read is.
_R_KEY, _R_ID, _R_TOP, _R_DEEP = range(4)


class EnvelopeScanner:
    """Feed a JSON-RPC message in chunks; read its envelope as it becomes known."""

    __slots__ = (
        "_capture",
        "_depth",
        "_escape",
        "_key",
        "_mode",
        "_overflow",
        "_role",
        "_slow",
        "_window",
        "abandoned",
        "has_method",
        "id",
        "is_response",
    )

    def __init__(self) -> None:
        self.id: int | str | None = None
        self.has_method = False
        self.is_response = False
        self.abandoned = False
        self._mode = _BEFORE
        self._depth = 0
        self._key: str | None = None
        self._role = _R_TOP
        self._escape = False
        self._capture = bytearray()
        self._overflow = False
        self._slow = 0
        self._window = _WINDOW_MIN

    @property
    def done(self) -> bool:
        """The top-level object is closed (what follows is ignored)."""
        return self._mode == _DONE

    @property
    def answerable(self) -> bool:
        """A response to one of our requests, with a usable id."""
        return self.id is not None and self.is_response and not self.has_method

    def feed(self, chunk: bytes) -> None:
        """Scan the next bytes of the message."""
        pos, end = 0, len(chunk)
        while pos < end:
            mode = self._mode
            if mode == _DEEP:
                pos = self._deep(chunk, pos, end)
            elif mode == _STRING:
                pos = self._string(chunk, pos, end)
            elif mode == _SCALAR:
                pos = self._scalar(chunk, pos, end)
            elif mode >= _DONE:
                return
            else:
                pos = self._top(chunk, pos, end)

    # Depth 1 (and before it): one token at a time, in Python.

    def _top(self, chunk: bytes, pos: int, end: int) -> int:
        mode = self._mode
        if mode == _AFTER:
            pos = _stop(_boring, chunk, pos, end)
            if pos == end:
                return pos
        byte = chunk[pos]
        if byte in _WS:
            pos = _stop(_ws, chunk, pos, end)
            if pos == end:
                return pos
            byte = chunk[pos]
        if mode == _BEFORE:
            if byte == 0x7B:  # {
                self._mode, self._depth = _KEY, 1
            else:
                self._mode = _OFF  # not an object: a batch, or not JSON-RPC at all
            return pos + 1
        if mode == _KEY:
            if byte == 0x22:  # "
                self._slow += 1
                if self._slow > MAX_SLOW_MEMBERS:
                    self._mode, self.abandoned = _OFF, True
                    return end
                self._begin(_STRING, _R_KEY)
            elif byte == 0x7D:  # }
                self._mode = _DONE
            else:
                self._mode = _OFF
            return pos + 1
        if mode == _COLON:
            self._mode = _VALUE if byte == 0x3A else _OFF  # :
            return pos + 1
        if mode == _VALUE:
            key = self._key
            if key == "id":
                self.id = None  # the last "id" counts, as in a decoded object
            if byte == 0x22:
                self._begin(_STRING, _R_ID if key == "id" else _R_TOP)
                return pos + 1
            if byte in _OPEN:
                self._mode, self._depth = _DEEP, 2
                return pos + 1
            self._begin(_SCALAR, _R_ID if key == "id" else _R_TOP)
            return pos
        # _AFTER
        if byte == 0x2C:  # ,
            self._mode = _KEY
        elif byte == 0x7D:
            self._mode = _DONE
        else:
            self._mode = _OFF
        return pos + 1

    def _begin(self, mode: int, role: int) -> None:
        self._mode, self._role = mode, role
        self._capture.clear()
        self._overflow = False

    def _keep(self, data: bytes, limit: int) -> None:
        if not self._overflow:
            self._capture += data
            if len(self._capture) > limit:
                self._overflow = True
                self._capture.clear()

    # Strings and scalars, across chunk boundaries.

    def _string(self, chunk: bytes, pos: int, end: int) -> int:
        start = pos
        if self._escape:  # the character after a backslash that ended a chunk
            self._escape = False
            pos += 1
        stop = _string_stop(chunk, pos, end)
        closed = stop < end and chunk[stop] == 0x22
        if stop < end and not closed:  # a backslash, the chunk's last byte
            self._escape = True
            stop += 1
        role = self._role
        if role == _R_KEY:
            self._keep(chunk[start:stop], _KEY_RAW_MAX)
        elif role == _R_ID:
            self._keep(chunk[start:stop], _ID_RAW_MAX)
        if not closed:
            return stop
        if role == _R_DEEP:
            self._mode = _DEEP
        elif role == _R_KEY:
            self._mode = _COLON
            self._key = None if self._overflow else _key_name(bytes(self._capture))
            if self._key == "method":
                self.has_method = True
            elif self._key in ("result", "error"):
                self.is_response = True
        else:
            if role == _R_ID and not self._overflow:
                self.id = _id_value(b'"' + self._capture + b'"')
            self._mode = _AFTER
        return stop + 1

    def _scalar(self, chunk: bytes, pos: int, end: int) -> int:
        stop = _stop(_scalar, chunk, pos, end)
        if self._role == _R_ID:
            self._keep(chunk[pos:stop], _SCALAR_RAW_MAX)
        if stop < end:
            if self._role == _R_ID and not self._overflow:
                self.id = _id_value(bytes(self._capture))
            self._mode = _AFTER
        return stop

    # Inside a top-level member's value (depth >= 2): whole runs at once.

    def _deep(self, chunk: bytes, pos: int, end: int) -> int:
        while pos < end:
            window_end = min(end, pos + self._window)
            if chunk[pos] == 0x22:  # '"': a string (perhaps a long one) by find
                self._mode, self._role = _STRING, _R_DEEP
                return pos + 1
            if chunk[pos] == 0x5C:  # a backslash outside a string: not JSON
                self._mode = _OFF
                return end
            stop = _stop(_run, chunk, pos, window_end)  # > pos: at neither
            found, self._depth = _search(chunk, pos, stop, self._depth)
            if found is None:  # a long value: take it in larger windows
                pos = stop
                self._window = min(2 * self._window, _WINDOW_MAX)
                continue
            self._window = _WINDOW_MIN
            self._mode = _AFTER
            return found
        return pos


def _stop(pattern: re.Pattern[bytes], chunk: bytes, pos: int, end: int) -> int:
    """Where ``pattern`` (one that also matches nothing) stops, from ``pos``."""
    match = pattern.match(chunk, pos, end)
    return pos if match is None else match.end()


def _string_stop(chunk: bytes, pos: int, end: int) -> int:
    """Where the string body from ``pos`` stops: its closing quote, a lone
    backslash that ends the chunk, or ``end``. ``bytes.find`` skips plain runs
    (a long text costs next to nothing); dense escapes go to the regex."""
    for _ in range(_FIND_ESCAPES):
        quote = chunk.find(b'"', pos, end)
        limit = end if quote < 0 else quote
        slash = chunk.find(b"\\", pos, limit)
        if slash < 0:
            return limit
        if slash + 1 == end:
            return slash
        pos = slash + 2
    return _stop(_body, chunk, pos, end)


def _search(chunk: bytes, start: int, stop: int, depth: int) -> tuple[int | None, int]:
    """Where in [start, stop) (non-string bytes and complete strings) the depth
    first comes back to 1: (just past that closer, 1), else (None, the depth at
    ``stop``). Exact counts over the whole run, then bisection; only a short
    run is walked token by token."""
    closers, openers = _summary(_brackets(chunk[start:stop]), depth)
    if depth - closers > 1:
        return None, depth + openers - closers
    while stop - start > _LINEAR:
        middle = _stop(_run, chunk, start, (start + stop) // 2)
        if middle == start:  # a string from start to beyond the middle
            middle = _stop(_string, chunk, start, stop)
            if middle == start:
                raise AssertionError("unreachable")  # the run has complete strings
        closers, openers = _summary(_brackets(chunk[start:middle]), depth)
        if depth - closers > 1:
            depth += openers - closers
            start = middle
        else:
            stop = middle
    for match in _token.finditer(chunk, start, stop):
        byte = chunk[match.start()]
        if byte in _OPEN:
            depth += 1
        elif byte in _CLOSE:
            depth -= 1
            if depth == 1:
                return match.end(), 1
    raise AssertionError("unreachable")  # the counts said the depth comes back to 1


def _brackets(segment: bytes) -> bytes:
    """The brackets of ``segment`` (non-string bytes and complete strings) that
    are outside its strings, as ``[`` and ``]``."""
    if 92 in segment:  # a backslash: drop escaped backslashes, then escaped quotes
        segment = segment.replace(b"\\\\", b"").replace(b'\\"', b"")
    kept = segment.translate(_SQUARE, _NOT_QUOTES_OR_BRACKETS)
    if 34 in kept:  # '"': strings are now quote pairs around their brackets
        kept = kept.replace(b'""', b"")  # (this also joins adjacent strings)
        if 34 in kept:
            kept = _plain_string.sub(b"", kept)
    return kept


def _summary(brackets: bytes, depth: int) -> tuple[int, int]:
    """(closers, openers) of ``brackets`` once its balanced pairs are gone
    (``]]][[``): the depth falls by at most ``closers`` inside it. Exact
    whenever ``depth - closers <= 1``."""
    closers = brackets.count(b"]")
    if depth - closers > 1:  # it cannot come back to 1, whatever the order
        return closers, len(brackets) - closers
    for _ in range(2):  # shallow nesting: a few C-speed passes settle it
        if b"[]" not in brackets:
            closers = brackets.count(b"]")
            return closers, len(brackets) - closers
        brackets = brackets.replace(b"[]", b"")
    steps = array("b", brackets.translate(_SIGNS))
    closers = -min(0, min(accumulate(steps), default=0))
    return closers, sum(steps) + closers


def _key_name(raw: bytes) -> str | None:
    try:
        key = raw.decode() if 92 not in raw else msgspec.json.decode(b'"' + raw + b'"')
    except (UnicodeDecodeError, msgspec.DecodeError):
        return None
    return key if key in _KEYS else None


def _id_value(raw: bytes) -> int | str | None:
    try:
        value = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return None
    if isinstance(value, str):
        return value if len(value) <= MAX_ID_CHARS else None
    if isinstance(value, int) and not isinstance(value, bool):
        return value if -(2**63) <= value < 2**64 else None
    return None
