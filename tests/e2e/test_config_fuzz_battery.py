"""memorizzd's config file against seeded mutations, from the outside.

The seeds are the TOML examples of docs/configuration.md and a full config
with servers of each transport, profiles, metrics, tracing, operators and
credentials. Mutations: keys dropped, duplicated, unknown at every level;
values of the wrong type everywhere (strings for numbers, arrays for tables,
huge integers, nan and inf, negative durations, empty and very long strings,
NULs and control characters, dates, deep nesting); duplicate server and
profile names, profiles naming servers nobody declared; odd socket paths
and URLs; and on the bytes: truncation at every ~50th byte, a BOM,
undecodable bytes, a NUL.

``memorizzd --check-config`` must end in 0 or 78, never a traceback, and
78 with one line saying what is wrong (docs/configuration.md). Most cases run
``memorizzd.__main__.main`` in this process (what the console script runs);
a sample runs the installed executable. A running daemon given bad files by
``daemon reload`` keeps its servers and says why in ``daemon status``.

Seeded (``random.Random``): a failure names its seed and the file.
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import io
import math
import os
import random
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from memorizz.api.errors import RemoteError
from memorizzd.__main__ import EX_CONFIG
from memorizzd.__main__ import main as daemon_main
from memorizzd.config import load
from tests.doc_blocks import ROOT, blocks
from tests.harness import DAEMON_EXE, LEGACY_SERVER, DaemonHarness

OK_PREFIX = "memorizzd: configuration ok"
SAID = ("memorizzd: invalid configuration: ", "memorizzd: vault: ")
CASES_PER_SEED = 100
SEEDS = 6
CASES_EXECUTABLE = 16


# --- the seeds ----------------------------------------------------------------------


def _doc_examples() -> list[str]:
    return [
        b.text
        for b in blocks(ROOT / "docs" / "configuration.md")
        if b.lang == "toml" and "[tracing]" not in b.text  # needs memorizzd[otel]
    ]


def _full(base: str) -> str:
    return f"""\
socket = "{base}/d.sock"
state_dir = "{base}/state"
host_allowlist = ["mcp.example.com", "*.example.org", "127.0.0.1"]
stdio_allowlist = ["true", "{sys.executable}"]
stdio_allow_inline_code = false
connect_wait_s = 2.5
backoff_initial_s = 0.1
backoff_max_s = 5.0
health_interval_s = 15
health_timeout_s = 5
max_in_flight_per_server = 10
max_in_flight_per_connection = 8
drain_timeout_s = 3
list_page_limit = 20
approval_ttl_s = 600
mcp_face = true
face_approval_wait_s = 10
upstream_request_wait_s = 60
face_separator = "__"

[decisions]
read = "allow"
write = "ask"
destructive = "deny"

[operators]
uids = [{os.getuid()}]
groups = [0, "root"]
allow_root = true
socket_group = 0

[metrics]
enabled = true
listen = "127.0.0.1:9464"

[tracing]
enabled = false
endpoint = "http://127.0.0.1:4318/v1/traces"
service_name = "mz"

[credentials]
stores = ["vault", "systemd"]

[[servers]]
name = "fs"
transport = "stdio"
command = "/bin/true"
args = ["-y", "x"]
cwd = "/tmp"
env = {{ NODE_ENV = "production" }}
timeout_s = 30
allow_tools = ["read_*"]
risk = {{ write_file = "write" }}

[[servers]]
name = "docs"
transport = "streamable_http"
url = "https://mcp.example.com/mcp"
max_result_bytes = 5000000
headers = {{ "X-Team" = "a" }}

[[servers]]
name = "legacy"
transport = "sse"
url = "http://127.0.0.1:8931/sse"
allow_private_network = true
protocol = "legacy"

[[servers]]
name = "crm"
transport = "streamable_http"
url = "https://mcp.example.com/crm"
auth = "oauth"
oauth_client_id = "CLIENT_ID"
oauth_scopes = ["contacts.read"]

[[profiles]]
name = "bot"
servers = ["fs", "docs"]
uids = [1500]
gids = [0]
face_tools = ["proposals"]
separator = "--"
limits = {{ max_connections = 8, max_in_flight = 8, first_frame_timeout_s = 2 }}

[[profiles]]
name = "notes"
servers = ["legacy"]
socket_group = "root"
"""


# --- TOML out of a tree ---------------------------------------------------------------


def _key(key: str) -> str:
    if key and all(c.isascii() and (c.isalnum() or c in "-_") for c in key):
        return key
    return _string(key)


def _string(text: str) -> str:
    return msgspec.json.encode(text).decode()  # JSON's escapes are TOML's


def _value(value: Any) -> str:
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return (
            "{" + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items()) + "}"
        )
    raise TypeError(type(value).__name__)


def dumps(doc: dict[str, Any], rng: random.Random) -> str:
    """``doc`` as TOML: scalars first, then tables and arrays of tables, or
    (at random) everything inline."""
    if rng.random() < 0.3:
        return "".join(f"{_key(k)} = {_value(v)}\n" for k, v in doc.items())
    lines: list[str] = []
    tail: list[str] = []
    for key, value in doc.items():
        if isinstance(value, dict):
            tail.append(f"[{_key(key)}]")
            tail += [f"{_key(k)} = {_value(v)}" for k, v in value.items()]
        elif (
            isinstance(value, list)
            and value
            and all(isinstance(v, dict) for v in value)
        ):
            for item in value:
                tail.append(f"[[{_key(key)}]]")
                tail += [f"{_key(k)} = {_value(v)}" for k, v in item.items()]
        else:
            lines.append(f"{_key(key)} = {_value(value)}")
    return "\n".join(lines + tail) + "\n"


# --- mutations ----------------------------------------------------------------------


class Raw:
    """TOML text put in as it is (nesting too deep to build as a tree)."""

    def __init__(self, text: str) -> None:
        self.text = text


def _deep_list(depth: int) -> Raw:
    return Raw("[" * depth + "1" + "]" * depth)


def _deep_table(depth: int) -> Raw:
    return Raw("{a = " * depth + "1" + "}" * depth)


URLS = [
    "",
    "http://",
    "https://",
    "http:///path",
    "//mcp.example.com/mcp",
    "mcp.example.com",
    "ftp://mcp.example.com/",
    "file:///etc/passwd",
    "javascript:alert(1)",
    "https://[::1",
    "https://[::1]:99999/",
    "https://h:-1/",
    "https://h:0/",
    "https://h:65536/",
    "https://h:port/",
    "https://user:pw@mcp.example.com/mcp",
    "https://mcp.example.com\\@evil.example/",
    "https://%zz/",
    "https://xn--/",
    "https://日本.example/mcp",
    "https://" + "a" * 300 + ".example/",
    "https://mcp.example.com/" + "p" * 100_000,
    "https://mcp.example.com/\n",
    " https://mcp.example.com/mcp",
    "HTTPS://MCP.EXAMPLE.COM/MCP",
    "http://0x7f.1/",
    "http://127.1/",
    "http://[fe80::1%25eth0]/",
    "http://[::ffff:127.0.0.1]/",
    "http://10.0.0.1/mcp",
    "https://mcp.example.com:443:443/",
    "https://mcp.example.com/#frag",
    "https://mcp.example.com/?q=\x00",
]
PATHS = [
    "",
    "/",
    ".",
    "d.sock",
    "./d.sock",
    "../d.sock",
    "~/d.sock",
    "/nonexistent/dir/d.sock",
    "/tmp/" + "s" * 200 + ".sock",
    "/tmp/a\nb.sock",
    "/tmp/\x1b.sock",
    "/proc/self/mem",
    "/dev/null",
    "/tmp/mcp.sock",
    "/tmp/metrics.sock",
]
NUMBERS: list[Any] = [
    0,
    -1,
    -0.5,
    1,
    2**31,
    2**63,
    2**64,
    -(2**63) - 1,
    10**30,
    float("nan"),
    float("inf"),
    float("-inf"),
    1e308,
    5e-324,
    -0.0,
]
STRINGS: list[Any] = [
    "",
    " ",
    "5",
    "1.5",
    "true",
    "x" * 100_000,
    "a\0b",
    "\x01\x1b[31m",
    "line\nline",
    "\u202etxt",
    "\ufeff",
    "caf\u00e9",
    "日本",
    "*",
    "-",
    ".",
    "..",
    "operator",
    "vault",
    "systemd",
    "credential:",
    "credential:x",
]
OTHERS: list[Any] = [
    True,
    False,
    [],
    {},
    [1, "a"],
    [[]],
    {"a": 1},
    [{"name": "x"}],
    datetime.datetime(1979, 5, 27, 7, 32, tzinfo=datetime.UTC),
    datetime.date(1979, 5, 27),
    datetime.time(7, 32),
]


def _odd_value(rng: random.Random, key: str) -> Any:
    roll = rng.random()
    if key in ("url", "endpoint", "oauth_client_metadata_url", "oauth_idp_issuer") or (
        roll < 0.1
    ):
        return rng.choice(URLS)
    if key in ("socket", "state_dir", "agents_dir", "cwd", "command") or roll < 0.2:
        return rng.choice(PATHS)
    if key == "listen":
        return rng.choice(
            [
                "127.0.0.1",
                ":9464",
                "127.0.0.1:0",
                "[::1]:9464",
                "[::1",
                "h:99999",
                "0.0.0.0:9464",
                "localhost:9464",
                "127.0.0.1:\uff11\uff12",
                "127.0.0.1:+9",
            ]
        )
    if roll < 0.45:
        return rng.choice(NUMBERS)
    if roll < 0.7:
        return rng.choice(STRINGS)
    if roll < 0.75:
        return _deep_list(rng.choice([50, 400]))
    if roll < 0.8:
        return _deep_table(rng.choice([50, 400]))
    return copy.deepcopy(rng.choice(OTHERS))


def _nodes(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every path into the tree (keys and list indexes), the root included."""
    yield path
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _nodes(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _nodes(item, (*path, i))


def _at(doc: Any, path: tuple[Any, ...]) -> Any:
    for step in path:
        doc = doc[step]
    return doc


def mutate_tree(doc: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    doc = copy.deepcopy(doc)
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        paths = [p for p in _nodes(doc) if p]
        if not paths:
            break
        path = rng.choice(paths)
        parent = _at(doc, path[:-1])
        last = path[-1]
        kind = rng.random()
        if kind < 0.15:
            del parent[last]
        elif kind < 0.25:
            where = _at(doc, path[:-1]) if isinstance(parent, dict) else None
            target = where if where is not None else _at(doc, path)
            if isinstance(target, dict):
                target[rng.choice(["frobnicate", "Name", "name ", "", "ü"])] = 1
            else:
                doc["frobnicate"] = {"x": 1}
        elif kind < 0.35 and isinstance(parent, list):
            parent.append(copy.deepcopy(parent[last]))  # a duplicate entry
        elif kind < 0.42:
            for profile in doc.get("profiles", []) or []:
                if isinstance(profile, dict):
                    profile["servers"] = ["nobody", "fs", ""]
            parent[last] = _odd_value(rng, str(last))
        else:
            parent[last] = _odd_value(rng, str(last))
    return doc


INVALID = [b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xc0\xaf", b"\x00"]


def mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    kind = rng.random()
    if kind < 0.3:
        return data[: rng.randrange(0, len(data) + 1, 50) if len(data) > 50 else 0]
    if kind < 0.4:
        return b"\xef\xbb\xbf" + data
    if kind < 0.6:
        at = rng.randrange(len(data) + 1)
        return data[:at] + rng.choice(INVALID) + data[at:]
    if kind < 0.7:
        return data.replace(b"\n", b"\r", rng.randrange(1, 4))
    if kind < 0.8:
        lines = data.splitlines(keepends=True)
        if lines:
            i = rng.randrange(len(lines))
            lines.insert(i, lines[i])  # a key given twice, or a table
        return b"".join(lines)
    if kind < 0.9:
        at = rng.randrange(len(data) + 1)
        return data[:at] + bytes([rng.randrange(256)]) + data[at + 1 :]
    return (
        data + b"\n[servers]\n" if rng.random() < 0.5 else data + b"\n[[decisions]]\n"
    )


def cases(seed: int, base: str) -> Iterator[bytes]:
    rng = random.Random(seed)  # noqa: S311 - seeded on purpose
    texts = [*_doc_examples(), _full(base)]
    seeds = [tomllib.loads(t) for t in texts]
    for _ in range(CASES_PER_SEED):
        if rng.random() < 0.3:
            yield mutate_bytes(rng.choice(texts).encode(), rng)
        else:
            yield dumps(mutate_tree(rng.choice(seeds), rng), rng).encode()


# --- running a check ------------------------------------------------------------------


def check_in_process(path: Path, state_dir: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    argv = ["--config", str(path), "--state-dir", state_dir, "--check-config"]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = daemon_main(argv)
        except SystemExit as exc:  # argparse only: the file is never its business
            raise AssertionError(
                f"SystemExit({exc.code}): {err.getvalue()!r}"
            ) from None
    return status, out.getvalue(), err.getvalue()


def judge(content: bytes, status: int, out: str, err: str) -> None:
    where = f"file={content[:1500]!r} status={status} stderr={err[-800:]!r}"
    assert status in (0, EX_CONFIG), where
    assert "Traceback" not in err, where
    if status == 0:
        assert out.startswith(OK_PREFIX), where
        return
    assert err.endswith("\n"), where
    assert err.count("\n") == 1, where
    assert err.startswith(SAID), where
    said = err.removesuffix("\n").split(": ", 2)[-1]
    assert said.strip(), where


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("MEMORIZZ_"):
            monkeypatch.delenv(name)


@pytest.mark.parametrize("seed", range(SEEDS))
@pytest.mark.usefixtures("env")
def test_mutated_configs_in_process(seed: int, base_dir: str) -> None:
    path = Path(base_dir, "memorizzd.toml")
    state = os.path.join(base_dir, "state")
    accepted = 0
    for content in cases(seed, base_dir):
        path.write_bytes(content)
        status, out, err = check_in_process(path, state)
        judge(content, status, out, err)
        accepted += status == 0
    assert accepted < CASES_PER_SEED  # the mutations do reach the checks


def test_the_seeds_themselves_pass(base_dir: str) -> None:
    """The full config is valid as it stands (the doc examples name groups
    and servers this host may not have: only that they parse)."""
    path = Path(base_dir, "memorizzd.toml")
    path.write_text(_full(base_dir), encoding="utf-8")
    status, out, err = check_in_process(path, os.path.join(base_dir, "state"))
    assert status == 0, (out, err)
    for text in _doc_examples():
        tomllib.loads(text)


def test_mutated_configs_through_the_executable(base_dir: str) -> None:
    path = Path(base_dir, "memorizzd.toml")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMORIZZ_")}
    for i, content in enumerate(cases(99, base_dir)):
        if i == CASES_EXECUTABLE:
            break
        path.write_bytes(content)
        done = subprocess.run(
            [
                DAEMON_EXE,
                "--config",
                str(path),
                "--state-dir",
                os.path.join(base_dir, "state"),
                "--check-config",
            ],
            capture_output=True,
            env=env,
            timeout=30,
            check=False,
        )
        judge(
            content,
            done.returncode,
            done.stdout.decode("utf-8", "backslashreplace"),
            done.stderr.decode("utf-8", "backslashreplace"),
        )


# --- a running daemon given bad files -------------------------------------------------


def _good(base: str) -> str:
    return (
        f'socket = "{base}/d.sock"\nstate_dir = "{base}/state"\n'
        "backoff_initial_s = 0.05\n"
        f'[[servers]]\nname = "one"\ntransport = "stdio"\n'
        f'command = "{sys.executable}"\nargs = ["{LEGACY_SERVER}"]\n'
        '[[profiles]]\nname = "bot"\nservers = ["one"]\n'
    )


def _bad_ones(base: str, count: int) -> list[bytes]:
    """``count`` mutations of the running daemon's own file that
    ``--check-config`` refuses."""
    rng = random.Random(2024)  # noqa: S311 - seeded on purpose
    text = _good(base)
    seed = tomllib.loads(text)
    path = Path(base, "probe.toml")
    found: list[bytes] = []
    while len(found) < count:
        if rng.random() < 0.4:
            content = mutate_bytes(text.encode(), rng)
        else:
            content = dumps(mutate_tree(seed, rng), rng).encode()
        path.write_bytes(content)
        status, _, _ = check_in_process(path, os.path.join(base, "state"))
        if status == EX_CONFIG:
            found.append(content)
    return found


@pytest.mark.usefixtures("env")
def test_a_reload_of_a_bad_file_keeps_the_old_config_and_says_why(
    base_dir: str,
) -> None:
    path = Path(base_dir, "memorizzd.toml")
    path.write_text(_good(base_dir), encoding="utf-8")
    bad = _bad_ones(base_dir, 20)
    with DaemonHarness.running(load(str(path))) as h:
        h.wait_ready("one")
        with h.client() as c:
            (before,) = [(s.name, s.pid) for s in c.server_status()]
            for content in bad:
                path.write_bytes(content)
                where = f"file={content[:800]!r}"
                with pytest.raises(RemoteError) as refused:
                    c.daemon_reload()
                assert refused.value.reason == "invalid_config", (
                    where,
                    refused.value.reason,
                    refused.value.message,
                )
                assert refused.value.message.strip(), where
                last = c.daemon_status().last_reload
                assert last is not None, where
                assert not last.ok, where
                assert last.message.strip(), where
                assert last.message in refused.value.message, where
                assert [(s.name, s.pid) for s in c.server_status()] == [before], where
            result = c.call_tool("one", "hello", {})
            assert result.content[0]["text"] == "hello from legacy"
            assert list(c.daemon_status().agent_sockets) == ["bot"]
