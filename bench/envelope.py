"""Throughput of the envelope scanner on oversize messages, ordinary and adversarial.

    .venv/bin/python -m bench.envelope [MEGABYTES]

Each message has its id last and is fed in 64 KiB chunks, as the transports
read them; prints MB/s per shape (the scanner runs only on a message over the
result cap).
"""

from __future__ import annotations

import sys
import time

import msgspec

from memorizzd.egress.envelope import EnvelopeScanner

TAIL = b',"jsonrpc":"2.0","id":77}'


def shapes(size: int) -> dict[str, bytes]:
    text = {"type": "text", "text": 'ab"c\\d\n' * 5, "n": [1, 2, {"a": None}]}
    return {
        "one big string": msgspec.json.encode(
            {"result": {"content": [{"type": "text", "text": "x" * size}]}}
        )[:-1]
        + TAIL,
        "many small objects": msgspec.json.encode(
            {"result": {"content": [text] * (size // 70)}}
        )[:-1]
        + TAIL,
        "all backslashes": b'{"result":{"t":"' + b"\\\\" * (size // 2) + b'"}' + TAIL,
        "escaped quotes": b'{"result":{"t":"' + b'\\"' * (size // 2) + b'"}' + TAIL,
        "deep arrays": b'{"result":' + b"[" * (size // 2) + b"]" * (size // 2) + TAIL,
        "tiny arrays": b'{"result":[' + b"[[]]," * (size // 5) + b"[]]" + TAIL,
        "tiny strings": b'{"result":[' + b'"",' * (size // 3) + b'""]' + TAIL,
        "nested 33 deep, repeated": b'{"result":['
        + (b"[" * 33 + b"]" * 33 + b",") * (size // 67)
        + b"1]"
        + TAIL,
        "brackets in strings": b'{"result":['
        + b'"]]}}",' * (size // 7)
        + b'"["]'
        + TAIL,
        "many top-level keys": b'{"result":1' + b',"k":1' * (size // 6) + TAIL,
    }


def main() -> None:
    size = int(float(sys.argv[1]) * 1_000_000) if len(sys.argv) > 1 else 4_000_000
    for name, message in shapes(size).items():
        chunks = [message[i : i + 65536] for i in range(0, len(message), 65536)]
        scanner = EnvelopeScanner()
        started = time.perf_counter()
        for chunk in chunks:
            scanner.feed(chunk)
        elapsed = time.perf_counter() - started
        assert (scanner.id, scanner.is_response) == (77, True), name
        rate = len(message) / 1e6 / elapsed
        print(
            f"{name:26s} {len(message) / 1e6:6.1f} MB {elapsed * 1000:8.1f} ms {rate:7.1f} MB/s"
        )


if __name__ == "__main__":
    main()
