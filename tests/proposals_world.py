"""Proposals against a daemon from a config file: the config, a call that
proposes, and what the operator sees (tests/daemon/test_*_removal_proposals.py).

The tool ``record`` (tests/mcp_server.py, destructive, so ``ask`` by default)
appends its tag to <base>/calls.log: the log counts real upstream executions
(``tests.peers.calls``)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import msgspec
import pytest

from memorizz import Client
from memorizz.api.errors import ApprovalRequiredError
from memorizz.api.methods import Proposal, ServerSpec
from tests.harness import DaemonHarness, stdio_spec
from tests.peers import agent_socket


def record_spec(base: str, name: str) -> ServerSpec:
    """Server ``name``: its ``record`` logs to <base>/calls.log."""
    return stdio_spec(name, env={"CALL_LOG": os.path.join(base, "calls.log")})


def write_config(
    base: str,
    servers: Sequence[str],
    profiles: Mapping[str, tuple[Sequence[str], Sequence[int]]],
    *,
    limits: Mapping[str, str] | None = None,
) -> str:
    """The config file: ``servers`` (``record_spec``) and each of ``profiles``
    (name: the servers it reaches, its uids; ``limits``: a profile's
    ``limits`` inline table, as TOML); returns its path."""

    def q(item: object) -> str:
        return msgspec.json.encode(item).decode()  # strings and lists alike

    lines = [
        f"socket = {q(os.path.join(base, 'd.sock'))}",
        f"state_dir = {q(os.path.join(base, 'state'))}",
        f"agents_dir = {q(os.path.join(base, 'agents'))}",
        "backoff_initial_s = 0.05",
        "backoff_max_s = 0.5",
        "drain_timeout_s = 5.0",
    ]
    for name in servers:
        spec = record_spec(base, name)
        lines += [
            "[[servers]]",
            f"name = {q(spec.name)}",
            'transport = "stdio"',
            f"command = {q(spec.command)}",
            f"args = {q(list(spec.args))}",
            "env = {" + ", ".join(f"{k} = {q(v)}" for k, v in spec.env.items()) + "}",
        ]
    for name, (reach, uids) in profiles.items():
        lines += ["[[profiles]]", f"name = {q(name)}", f"servers = {q(list(reach))}"]
        lines.append(f"uids = {q(list(uids))}")
        if limits and name in limits:
            lines.append(f"limits = {limits[name]}")
    path = Path(base, "memorizzd.toml")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def propose(c: Client | str, server: str, tag: str, *, tool: str = "record") -> str:
    """Call ``tool`` on ``server`` (``record``, and tests/legacy_server.py's
    ``hello``, with the tag as ``tag``; any other with it as ``text``), on
    ``c`` or on a connection of its own to the socket ``c``: the id of the
    proposal it makes."""
    if isinstance(c, str):
        with Client(c) as own:
            return propose(own, server, tag, tool=tool)
    arguments = {"tag": tag} if tool in ("record", "hello") else {"text": tag}
    with pytest.raises(ApprovalRequiredError) as asked:
        c.call_tool(server, tool, arguments)
    proposal_id = asked.value.data["proposal_id"]
    assert isinstance(proposal_id, str)
    return proposal_id


def approved(harness: DaemonHarness, c: Client | str, server: str, tag: str) -> str:
    """``propose`` (``record``), then the operator approves it: its id."""
    proposal_id = propose(c, server, tag)
    with harness.client() as operator:
        assert operator.approve(proposal_id).status == "approved"
    return proposal_id


def agent(base: str, profile: str) -> Client:
    return Client(agent_socket(base, profile))


def shown(operator: Client) -> dict[str, Proposal]:
    """Every proposal, as the operator sees it."""
    return {p.id: p for p in operator.list_approvals(limit=1000)}


def status_of(harness: DaemonHarness, proposal_id: str) -> str:
    """A proposal's status, as the operator lists it."""
    with harness.client() as operator:
        return shown(operator)[proposal_id].status


def invalidations(operator: Client) -> set[tuple[str | None, str | None, str]]:
    """The audit's ``approvals/invalidate`` records: proposal, reason, socket."""
    return {
        (r.proposal_id, r.reason, r.caller_socket)
        for r in operator.audit(limit=200).records
        if r.action == "approvals/invalidate"
    }
