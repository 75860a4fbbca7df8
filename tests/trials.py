"""What the batteries that break the daemon on purpose (kills, crashes,
races, a full disk: tests/e2e/test_kill_battery.py, test_race_battery.py,
test_crash_consistency.py, test_full_disk.py) check afterwards, and how they
call it meanwhile: the whole audit trail (``all_records``), a call's
arguments as the audit trail digests them (``digest``), one call on the MCP
face by a raw client (``face_call``, its lines ``call_lines``)."""

from __future__ import annotations

import hashlib
import hmac
import socket
from typing import Any

import msgspec

from memorizz.api import methods as m
from memorizz.client import Client
from tests.harness import INITIALIZE


def all_records(c: Client) -> list[m.AuditRecord]:
    """The whole audit trail, newest first (every page)."""
    records: list[m.AuditRecord] = []
    before: int | None = None
    while True:
        page = c.audit(before_id=before, limit=1000)
        records += page.records
        if page.next_before_id is None:
            return records
        before = page.next_before_id


def digest(key: bytes, arguments: dict[str, Any]) -> str:
    """``arguments`` as a record's ``arguments_hmac`` says them, under the
    audit key ``key`` (``memorizzd.audit.load_key``)."""
    canonical = msgspec.json.Encoder(order="sorted").encode(arguments)
    return hmac.new(key, canonical, hashlib.sha256).hexdigest()


def call_lines(name: str, arguments: dict[str, Any]) -> bytes:
    """What a raw MCP client writes to call tool ``name`` with ``arguments``
    at once: ``initialize``, ``notifications/initialized`` and the
    ``tools/call`` (id 2), a line each."""
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call"}
    call["params"] = {"name": name, "arguments": arguments}
    return (
        msgspec.json.encode(INITIALIZE)
        + b'\n{"jsonrpc":"2.0","method":"notifications/initialized"}\n'
        + msgspec.json.encode(call)
        + b"\n"
    )


def face_call(
    face: str, name: str, arguments: dict[str, Any], *, timeout: float = 20.0
) -> dict[str, Any]:
    """One ``tools/call`` on the MCP face socket ``face`` by a raw client
    (``call_lines``, in one write): its one reply. ``OSError`` if the face
    closes the connection first."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(face)
        sock.sendall(call_lines(name, arguments))
        reader = sock.makefile("rb")
        while line := reader.readline():
            reply: dict[str, Any] = msgspec.json.decode(line)
            if reply.get("id") == 2:
                return reply
    raise OSError("the face closed the connection")
