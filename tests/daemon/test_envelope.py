"""The streaming envelope scanner against msgspec decoding the whole message.

Property-style (seeded, so a failure names its seed): random JSON written in
random ways (whitespace, escapes, duplicate keys), split at random chunk
boundaries, must give the envelope that decoding the whole message gives.
"""

from __future__ import annotations

import random

import msgspec
import pytest

from memorizzd.egress.envelope import MAX_ID_CHARS, EnvelopeScanner

Envelope = tuple[object, bool, bool]

KEYS = ["id", "method", "result", "error", "jsonrpc", "params", "x", "idx", "i", ""]
NASTY = ['"', "\\", "/", "\b", "\f", "\n", "\r", "\t", "\x00", "\x1f", "é", "€", "𝄞"]
NASTY += [*"{}[],:", "\u2028"]


def expected(document: bytes) -> Envelope:
    value = msgspec.json.decode(document)
    if not isinstance(value, dict):
        return (None, False, False)
    found = value.get("id")
    usable = (
        isinstance(found, int)
        and not isinstance(found, bool)
        and -(2**63) <= found < 2**64
    ) or (isinstance(found, str) and len(found) <= MAX_ID_CHARS)
    return (
        found if usable else None,
        "method" in value,
        "result" in value or "error" in value,
    )


def scan(chunks: list[bytes]) -> EnvelopeScanner:
    scanner = EnvelopeScanner()
    for chunk in chunks:
        scanner.feed(chunk)
    return scanner


def envelope(scanner: EnvelopeScanner) -> Envelope:
    return (scanner.id, scanner.has_method, scanner.is_response)


class Writer:
    """Random JSON, written with random whitespace and escapes."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def ws(self) -> str:
        return self.rng.choice(["", "", "", " ", "\n", " \t\r\n "])

    def text(self) -> str:
        rng = self.rng
        pool = NASTY + list("abcxyz019 ")
        return "".join(rng.choice(pool) for _ in range(rng.choice([0, 1, 3, 8, 40])))

    def string(self, value: str) -> str:
        rng = self.rng
        if rng.random() < 0.7:
            return msgspec.json.encode(value).decode()
        out = []
        for char in value:  # every character escaped as \uXXXX where possible
            code = ord(char)
            if code > 0xFFFF:
                code -= 0x10000
                out.append(
                    f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04X}"
                )
            elif rng.random() < 0.8:
                out.append(f"\\u{code:04x}")
            else:
                out.append(msgspec.json.encode(char).decode()[1:-1])
        return '"' + "".join(out) + '"'

    def scalar(self) -> str:
        rng = self.rng
        kind = rng.randrange(7)
        if kind == 0:
            return str(rng.choice([0, 1, -1, 7, 2**63 - 1, -(2**63), 2**64 - 1, 2**64]))
        if kind == 1:
            return str(rng.randrange(-(10**25), 10**25))
        if kind == 2:
            return rng.choice(["1.5", "-0.0", "1e3", "2E-2", "0"])
        if kind == 3:
            return rng.choice(["true", "false", "null"])
        if kind == 4:
            return self.string("x" * rng.choice([MAX_ID_CHARS, MAX_ID_CHARS + 1]))
        return self.string(self.text())

    def value(self, depth: int) -> str:
        rng = self.rng
        if depth > 5 or rng.random() < 0.4:
            return self.scalar()
        if rng.random() < 0.5:
            items = [self.value(depth + 1) for _ in range(rng.randrange(5))]
            inner = ",".join(self.ws() + item + self.ws() for item in items)
            return "[" + (inner or self.ws()) + "]"
        return self.obj(depth + 1, rng.randrange(5))

    def obj(self, depth: int, size: int) -> str:
        rng = self.rng
        members = []
        for _ in range(size):
            key = rng.choice(KEYS) if rng.random() < 0.8 else self.text()
            item = self.value(depth)
            members.append(self.ws() + self.string(key) + self.ws() + ":" + self.ws())
            members[-1] += item + self.ws()
        return "{" + (",".join(members) or self.ws()) + "}"

    def message(self) -> bytes:
        rng = self.rng
        if rng.random() < 0.05:
            return (self.ws() + self.value(0) + self.ws()).encode()
        return (self.ws() + self.obj(0, rng.randrange(8)) + self.ws()).encode()


def split(rng: random.Random, data: bytes) -> list[bytes]:
    chunks, pos = [], 0
    while pos < len(data):
        size = rng.choice([1, 1, 2, 3, 5, 16, 100, 4096])
        chunks.append(data[pos : pos + size])
        pos += size
    return chunks


@pytest.mark.parametrize("seed", range(20))
def test_random_messages_split_anywhere_give_the_decoded_envelope(seed: int) -> None:
    rng = random.Random(seed)  # noqa: S311 - seeded test data, not secrets
    writer = Writer(rng)
    for _ in range(100):
        document = writer.message()
        want = expected(document)
        assert envelope(scan([document])) == want, document
        for _ in range(3):
            scanner = scan(split(rng, document))
            assert envelope(scanner) == want, document
            assert scanner.done == document.lstrip().startswith(b"{")


def test_json_rpc_messages_as_servers_write_them() -> None:
    big = "x" * 100_000
    cases: dict[bytes, Envelope] = {
        msgspec.json.encode({"result": {"t": big}, "jsonrpc": "2.0", "id": 3}): (
            3,
            False,
            True,
        ),
        msgspec.json.encode({"jsonrpc": "2.0", "id": 'a"b', "result": {}}): (
            'a"b',
            False,
            True,
        ),
        msgspec.json.encode({"jsonrpc": "2.0", "id": 1, "error": {"code": 1}}): (
            1,
            False,
            True,
        ),
        msgspec.json.encode(
            {"method": "sampling/createMessage", "params": {"t": big}, "id": 0}
        ): (0, True, False),
        msgspec.json.encode({"method": "notifications/message", "params": {}}): (
            None,
            True,
            False,
        ),
        b'{"\\u0069d":5,"r\\u0065sult":[]}': (5, False, True),
        b'{"id":5,"id":[1],"result":1}': (None, False, True),
        b'{"id":"' + b"y" * (MAX_ID_CHARS + 1) + b'","result":1}': (None, False, True),
        b'{"id":123456789012345678901234,"result":1}': (None, False, True),
        b'{"id":1.0,"result":1}': (None, False, True),
        b'[{"id":1,"result":1}]': (None, False, False),
    }
    for document, want in cases.items():
        assert expected(document) == want, document
        for size in (1, 7, 4096):
            chunks = [document[i : i + size] for i in range(0, len(document), size)]
            assert envelope(scan(chunks)) == want, (size, document[:80])


def test_the_envelope_is_known_as_soon_as_its_keys_have_passed() -> None:
    scanner = EnvelopeScanner()
    scanner.feed(b'{"jsonrpc":"2.0","id":42,"result":{"content":[{"text":"')
    assert scanner.answerable
    assert not scanner.done
    scanner.feed(b"x" * 10_000)
    assert (scanner.id, scanner.answerable) == (42, True)

    request = EnvelopeScanner()
    request.feed(b'{"method":"roots/list","jsonrpc":"2.0","id":42')
    assert not request.answerable  # the id may still change: only once it is closed
    request.feed(b"}")
    assert (request.id, request.has_method, request.answerable) == (42, True, False)


def adversarial(name: str, size: int) -> bytes:
    """Large messages built to make a scanner slow, each with the id last."""
    tail = b',"jsonrpc":"2.0","id":77}'
    if name == "backslashes":
        return b'{"result":{"t":"' + b"\\\\" * (size // 2) + b'"}' + tail
    if name == "escaped_quotes":
        return b'{"result":{"t":"' + b'\\"' * (size // 2) + b'"}' + tail
    if name == "deep_arrays":
        depth = size // 2
        return b'{"result":' + b"[" * depth + b"]" * depth + tail
    if name == "tiny_arrays":
        return b'{"result":[' + b"[[]]," * (size // 5) + b"[]]" + tail
    if name == "tiny_strings":
        return b'{"result":[' + b'"",' * (size // 3) + b'""]' + tail
    if name == "brackets_in_strings":
        return b'{"result":[' + b'"]]}}",' * (size // 7) + b'"["]' + tail
    if name == "many_top_level_keys":
        return b'{"result":1' + b',"k":1' * (size // 6) + tail
    if name == "many_top_level_strings":
        return b'{"result":1' + b',"k":"v"' * (size // 8) + tail
    raise AssertionError(name)


ADVERSARIAL = [
    "backslashes",
    "escaped_quotes",
    "deep_arrays",
    "tiny_arrays",
    "tiny_strings",
    "brackets_in_strings",
    "many_top_level_keys",
    "many_top_level_strings",
]


@pytest.mark.parametrize("name", ADVERSARIAL)
def test_adversarial_megabytes_are_scanned_in_bulk(name: str) -> None:
    document = adversarial(name, 4_000_000)
    chunks = [document[i : i + 65536] for i in range(0, len(document), 65536)]
    assert envelope(scan(chunks)) == (77, False, True)


def test_too_many_top_level_members_make_the_scanner_give_up() -> None:
    members = b"".join(b',"k%d":[]' % i for i in range(2000))
    scanner = scan([b'{"result":1' + members + b',"id":5}'])
    assert scanner.abandoned
    assert scanner.id is None


NOT_JSON = [
    b'{"":{\\"}"',  # found by fuzzing: a backslash outside any string
    b'{"result":[\\"]"],"id":1}',
    b'{"result":[1,\\\\"]"]],"id":2}',
    b'{"a":[' + b"\\" * 100 + b'"]"' * 30 + b"]," + b'"id":3,"result":1}',
]


@pytest.mark.parametrize("document", NOT_JSON)
def test_bytes_that_are_not_json_are_scanned_without_a_crash(document: bytes) -> None:
    """A message over the cap may be anything (a server's junk line): a
    backslash outside a string threw ``AssertionError("unreachable")`` out
    of the scanner, and so out of the stdio reader. No JSON has one there:
    the scanner stops reading, the same way whatever the chunking."""
    whole = scan([document])
    assert not whole.done
    for size in (1, 2, 3, 7, 64):
        chunks = [document[i : i + size] for i in range(0, len(document), size)]
        split = scan(chunks)
        assert envelope(split) == envelope(whole), size
        assert split.done == whole.done, size
