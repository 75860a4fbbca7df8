"""The wire contract's methods are declared once (``memorizz.api.methods``).

The dispatcher's decoders, the authority table, the thin client and the JSON
Schema are built from that one table; these tests fail when a method is
declared in one place and missing in another.
"""

from __future__ import annotations

import ast
import inspect
from typing import Any

import msgspec
import pytest

from memorizz import client as client_module
from memorizz.api import methods as m
from memorizz.api.schema import generate
from memorizz.client import Client
from memorizzd.caller import Caller
from memorizzd.rpc.authority import AGENT_METHODS, ROLES
from memorizzd.rpc.dispatch import Dispatcher

PASSTHROUGH = {
    "tools/list",
    "tools/call",
    "resources/list",
    "resources/templates/list",
    "resources/read",
    "resources/subscribe",
    "resources/unsubscribe",
    "prompts/list",
    "prompts/get",
    "completion/complete",
    "ping",
}


def declared() -> dict[str, m.Method[Any, Any]]:
    """The module's ``Method`` constants, by constant name."""
    return {k: v for k, v in vars(m).items() if isinstance(v, m.Method)}


def test_every_declared_method_is_in_the_table_once() -> None:
    constants = declared()
    assert sorted(v.name for v in constants.values()) == sorted(m.METHODS)
    for name, method in m.METHODS.items():
        assert method.name == name
        assert issubclass(method.params, m.Params)
        assert issubclass(method.result, m.Result)
        assert method.roles
        assert method.roles <= {"operator", "agent"}
        assert method.doc


def test_the_mcp_passthrough_methods_are_declared_as_such() -> None:
    assert {n for n, spec in m.METHODS.items() if spec.passthrough} == PASSTHROUGH
    for name in PASSTHROUGH:  # an agent's surface, each on one named server
        assert m.METHODS[name].roles == m.AGENTS_TOO
        assert "server" in m.METHODS[name].params.__struct_fields__


def test_the_authority_table_is_the_declaration() -> None:
    assert {name: spec.roles for name, spec in m.METHODS.items()} == ROLES
    assert {n for n, s in m.METHODS.items() if "agent" in s.roles} == AGENT_METHODS


async def _ok(caller: Caller, params: Any) -> m.PingResult:
    return m.PingResult(latency_ms=0.0)


def test_the_dispatcher_wants_a_handler_for_exactly_the_declared_methods() -> None:
    Dispatcher(dict.fromkeys(m.METHODS, _ok))
    some = dict.fromkeys(m.METHODS, _ok)
    del some["resources/templates/list"]
    with pytest.raises(ValueError, match="no handler for"):
        Dispatcher(some)
    with pytest.raises(ValueError, match="undeclared"):
        Dispatcher({**dict.fromkeys(m.METHODS, _ok), "subscriptions/listen": _ok})


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_the_dispatcher_decodes_params_with_the_declared_type() -> None:
    seen: list[tuple[str, Any]] = []

    def recording(name: str) -> Any:
        async def handler(caller: Caller, params: Any) -> m.PingResult:
            seen.append((name, params))
            return m.PingResult(latency_ms=0.0)

        return handler

    dispatcher = Dispatcher({name: recording(name) for name in m.METHODS})
    agent = Caller(pid=1, uid=1, gid=1, socket="/s", role="agent", profile="p")
    for name in PASSTHROUGH:
        line = msgspec.json.encode(
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": name,
                "params": {  # what each needs (unknown members are ignored)
                    "server": "s",
                    "name": "n",
                    "uri": "u",
                    "ref": {"type": "ref/prompt", "name": "n"},
                    "argument": {"name": "a", "value": ""},
                },
            }
        )
        request = dispatcher.parse(line)
        assert not isinstance(request, bytes)
        reply = msgspec.json.decode(await dispatcher.run(agent, request))
        assert "result" in reply, reply
        assert type(seen[-1][1]) is m.METHODS[name].params


def _client_calls() -> dict[str, str]:
    """Client method -> the ``Method`` constant it sends (``self.call(m.X, ...)``)."""
    tree = ast.parse(inspect.getsource(client_module))
    (cls,) = (
        n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Client"
    )
    calls: dict[str, str] = {}
    for func in cls.body:
        if not isinstance(func, ast.FunctionDef):
            continue
        for node in ast.walk(func):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "call"
                and node.args
                and isinstance(node.args[0], ast.Attribute)
                and isinstance(node.args[0].value, ast.Name)
                and node.args[0].value.id == "m"
            ):
                assert func.name not in calls, f"{func.name} sends two methods"
                calls[func.name] = node.args[0].attr
    return calls


def test_the_client_has_a_method_for_every_declared_method() -> None:
    calls = _client_calls()
    constants = declared()
    assert set(calls.values()) <= set(constants), "the client sends undeclared methods"
    missing = {constants[c].name for c in set(constants) - set(calls.values())}
    assert not missing, f"no Client method sends {sorted(missing)}"
    for python_name in calls:
        assert callable(getattr(Client, python_name))


def test_the_client_sends_only_through_the_table() -> None:
    source = inspect.getsource(Client)
    # ``request`` is the one place a method name is a string
    assert source.count("self.request(") == 1
    assert source.count('"daemon/') == 0


def test_the_schema_carries_each_methods_roles() -> None:
    document = msgspec.json.decode(generate())
    assert set(document["methods"]) == set(m.METHODS)
    for name, entry in document["methods"].items():
        assert set(entry["roles"]) == m.METHODS[name].roles
        assert entry["mcp_passthrough"] == (name in PASSTHROUGH)
