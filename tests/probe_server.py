"""A hand-written stdio MCP server (no SDK, handshake era) that breaks the
protocol on purpose, for tests/daemon/test_upstream_probes.py.

Its tools misbehave when called, each its own way:

* ``hello``: a plain answer;
* ``neither``: an answer with neither ``result`` nor ``error``;
* ``close_stdout``: answers, then closes its stdout and goes on reading
  stdin (writing nothing); with ``linger: true`` it also ignores SIGTERM
  and stays up after stdin closes (only SIGKILL ends it);
* ``stop_reading``: answers, then never reads its stdin again;
* ``progress_flood``: ``n`` progress notifications of about 1 KB for the
  call's token, then the answer;
* ``ping_flood``: ``n`` ``ping`` requests of its own, written without
  reading a reply, then the answer;
* ``junk``: ``n`` lines on stdout that are not JSON, then the answer;

and ``$PROBE`` (comma-separated) turns on faults of the session itself:

* ``silent_init``: ``initialize`` is never answered;
* ``slow_start``: it reads nothing for ``$START_S`` seconds after it starts
  (an interpreter importing a large SDK on a loaded host);
* ``relist_storm``: every ``tools/list`` answer comes after a
  ``notifications/tools/list_changed`` (a server that announces a change
  whenever it is listed);
* ``neither_list``: ``tools/list`` is answered with neither result nor error;
* ``bad_tool``: ``tools/list`` lists a tool whose ``inputSchema`` is a string;
* ``cursor_loop``: every ``tools/list`` page says ``nextCursor: "again"``;
* ``cursor_empty``: every ``tools/list`` page says ``nextCursor: ""``;
* ``bom``: its first line on stdout starts with a UTF-8 byte order mark;
* ``bom_split``: the same, the mark written in two parts a moment apart
  (the reader gets it in two reads).

Every method received is appended to ``$METHOD_LOG`` (if set).
"""

from __future__ import annotations

import os
import signal
import sys
import threading

import msgspec

from legacy_server import answer, messages

PROBES = frozenset(filter(None, os.environ.get("PROBE", "").split(",")))
TOOLS = (
    "hello",
    "neither",
    "close_stdout",
    "stop_reading",
    "progress_flood",
    "ping_flood",
    "junk",
)
BOM = b"\xef\xbb\xbf"

out = sys.stdout.buffer
first = True


def write(body: object) -> None:
    global first  # the first line is the one that may carry the mark
    if first and "bom_split" in PROBES:
        out.write(BOM[:1])
        out.flush()
        threading.Event().wait(0.2)
        out.write(BOM[1:])
    elif first and "bom" in PROBES:
        out.write(BOM)
    first = False
    out.write(msgspec.json.encode(body) + b"\n")
    out.flush()


def reply(message_id: object, result: object = None, error: object = None) -> None:
    write(answer(message_id, result, error))


def text(words: str) -> dict[str, object]:
    return {"content": [{"type": "text", "text": words}]}


def listing(rid: object) -> None:
    if "neither_list" in PROBES:
        write({"jsonrpc": "2.0", "id": rid})
        return
    if "relist_storm" in PROBES:
        write({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
    tools = [{"name": name, "inputSchema": {"type": "object"}} for name in TOOLS]
    if "bad_tool" in PROBES:
        tools.append({"name": "broken", "inputSchema": "not a schema"})
    result: dict[str, object] = {"tools": tools}
    if "cursor_loop" in PROBES:
        result["nextCursor"] = "again"
    if "cursor_empty" in PROBES:
        result["nextCursor"] = ""
    reply(rid, result)


def call(rid: object, params: dict[str, object]) -> bool:
    """Answer one tools/call; False: stdout is closed from now on."""
    name = params.get("name")
    arguments = params.get("arguments")
    arguments = arguments if isinstance(arguments, dict) else {}
    if name == "neither":
        write({"jsonrpc": "2.0", "id": rid})
    elif name == "close_stdout":
        reply(rid, text("closing stdout"))
        if arguments.get("linger"):
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        out.close()
        os.close(1)
        return False
    elif name == "stop_reading":
        reply(rid, text("no longer reading"))
        threading.Event().wait()
    elif name == "progress_flood":
        meta = params.get("_meta")
        token = meta.get("progressToken") if isinstance(meta, dict) else None
        for i in range(int(arguments.get("n", 1000))):
            note = {"progressToken": token, "progress": i, "message": "m" * 1000}
            write(
                {"jsonrpc": "2.0", "method": "notifications/progress", "params": note}
            )
        reply(rid, text("progressed"))
    elif name == "ping_flood":
        for i in range(int(arguments.get("n", 1000))):
            write({"jsonrpc": "2.0", "id": f"ping-{i}", "method": "ping"})
        reply(rid, text("flooded"))
    elif name == "junk":
        for i in range(int(arguments.get("n", 1000))):
            out.write(b"not JSON, line %d\n" % i)
        reply(rid, text("junked"))
    else:
        reply(rid, text(f"hello from {name}"))
    return True


def main() -> None:
    if "slow_start" in PROBES:
        threading.Event().wait(float(os.environ["START_S"]))
    speaking = True
    for message in messages(sys.stdin.buffer):
        method = message.get("method")
        if "id" not in message or not speaking:
            continue
        rid = message["id"]
        if method == "initialize":
            if "silent_init" in PROBES:
                continue
            reply(
                rid,
                {
                    "protocolVersion": "2025-11-25",
                    "capabilities": {"tools": {"listChanged": True}},
                    "serverInfo": {"name": "probe-server", "version": "1"},
                },
            )
        elif method == "tools/list":
            listing(rid)
        elif method == "tools/call":
            speaking = call(rid, message.get("params") or {})
        elif method == "ping":
            reply(rid, {})
        elif method is not None:
            reply(rid, error={"code": -32601, "message": "Method not found"})
    if signal.getsignal(signal.SIGTERM) == signal.SIG_IGN:
        while True:  # stdin is closed: stay up until SIGKILL
            signal.pause()


if __name__ == "__main__":
    main()
