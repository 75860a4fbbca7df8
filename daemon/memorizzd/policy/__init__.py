"""Tool policy: which tools exist for callers, each tool's risk class, and the
decision a call gets. Pure functions of their arguments: no I/O, no clock.

Visibility (``tool_visible``): a server's ``allow_tools`` and ``block_tools``
are ``fnmatch`` globs matched case-sensitively against the tool's name. An empty
``allow_tools`` allows every name; ``block_tools`` wins over ``allow_tools``.
A tool that is not visible is left out of ``tools/list`` and a call on it is
refused with ``tool_blocked`` without reaching the server.

Risk (``risk_of``), ``read`` < ``write`` < ``destructive``, in this order of
authority:

1. An operator override (the server's ``risk`` table, by exact tool name) is
   final: the operator has the last word, also against annotations (so a tool
   whose server marks everything ``destructiveHint: true`` can be brought down
   to ``write`` by the one person entitled to).
2. The reviewed catalog (``memorizzd.presets``) gives the class of well-known
   tools; the tool's MCP annotations may raise it, never lower it (a deleting
   tool that claims ``readOnlyHint: true`` stays ``destructive``).
3. Otherwise the annotations alone, when they say anything; else ``write``.

Annotations count only when explicit (MCP's defaults are not applied: an
absent ``destructiveHint`` is unknown, not ``true``): ``destructiveHint: true``
is ``destructive`` (even beside ``readOnlyHint: true``: contradictory hints get
the riskier reading); ``readOnlyHint: true`` is ``read``; an explicit
``readOnlyHint: false`` or ``destructiveHint: false`` is ``write``.

Decision (``decision_for``): ``[decisions]`` in the config gives ``allow``,
``ask`` or ``deny`` per risk class (defaults read allow, write allow,
destructive ask). A server's ``require_approval = true`` turns ``allow`` into
``ask`` for write and destructive tools; it never loosens a ``deny``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from functools import cached_property
from types import MappingProxyType
from typing import Any, Final, Protocol

import msgspec

from memorizz.api import methods as m
from memorizz.api.errors import (
    ApprovalRequiredError,
    PermissionDeniedError,
    RemoteError,
)
from memorizz.api.methods import Decision, Risk
from memorizz.api.presets import BY_NAME as PRESETS
from memorizzd.presets import (
    ProviderCatalog,
    catalog_named,
    catalog_risk,
    higher,
    provider_hint,
    providers_for,
)

__all__ = [
    "DecisionTable",
    "ToolPolicy",
    "ToolVerdict",
    "ToolsView",
    "annotation_risk",
    "decision_for",
    "refusal",
    "risk_of",
    "tool_visible",
]

DECISION_ORDER: Final[Mapping[Decision, int]] = MappingProxyType(
    {"allow": 0, "ask": 1, "deny": 2}
)


class DecisionTable(Protocol):
    """The decision per risk class (``memorizzd.config.Decisions``)."""

    @property
    def read(self) -> Decision: ...
    @property
    def write(self) -> Decision: ...
    @property
    def destructive(self) -> Decision: ...


@dataclass(frozen=True, slots=True)
class ToolVerdict:
    """What the policy says about one tool on one server."""

    risk: Risk
    decision: Decision
    """``deny`` for a blocked tool."""
    blocked: bool = False
    """Hidden by ``allow_tools`` / ``block_tools`` (refused as ``tool_blocked``)."""
    fixed: tuple[tuple[str, str], ...] = ()
    """The server's ``fixed_arguments`` this tool's input schema has: set on
    every call (a caller's value replaced), hidden from the listed schema."""


def tool_visible(
    name: str, allow_tools: Iterable[str], block_tools: Iterable[str]
) -> bool:
    """Whether callers may see and call ``name`` (globs; block wins; empty allow = all)."""
    if any(fnmatchcase(name, pattern) for pattern in block_tools):
        return False
    allow = tuple(allow_tools)
    return not allow or any(fnmatchcase(name, pattern) for pattern in allow)


def annotation_risk(annotations: Mapping[str, Any] | None) -> Risk | None:
    """The class the tool's explicit MCP annotations claim; ``None`` if they say nothing."""
    if not annotations:
        return None
    read_only = annotations.get("readOnlyHint")
    destructive = annotations.get("destructiveHint")
    if destructive is True:
        return "destructive"
    if read_only is True:
        return "read"
    if read_only is False or destructive is False:
        return "write"
    return None


def risk_of(
    annotations: Mapping[str, Any] | None,
    *,
    catalog_risk: Risk | None,
    operator_risk: Risk | None,
) -> Risk:
    """Operator override, else catalog (annotations may only raise it), else
    annotations, else ``write``."""
    if operator_risk is not None:
        return operator_risk
    hinted = annotation_risk(annotations)
    if catalog_risk is not None:
        return catalog_risk if hinted is None else higher(catalog_risk, hinted)
    return hinted if hinted is not None else "write"


def decision_for(
    risk: Risk, *, decisions: DecisionTable, require_approval: bool
) -> Decision:
    """The configured decision for the class; ``require_approval`` makes an
    ``allow`` on write or destructive ``ask`` (never loosens ``deny``)."""
    decision: Decision
    if risk == "read":
        decision = decisions.read
    elif risk == "write":
        decision = decisions.write
    else:
        decision = decisions.destructive
    if require_approval and risk != "read" and decision == "allow":
        return "ask"
    return decision


def _stricter(a: ToolVerdict, b: ToolVerdict) -> ToolVerdict:
    stricter = DECISION_ORDER[a.decision] >= DECISION_ORDER[b.decision]
    decision = a.decision if stricter else b.decision
    return ToolVerdict(higher(a.risk, b.risk), decision, a.blocked or b.blocked)


@dataclass(frozen=True, slots=True)
class _Defaults:
    read: Decision = "allow"
    write: Decision = "allow"
    destructive: Decision = "ask"


_DEFAULT_DECISIONS: Final = _Defaults()


@dataclass(frozen=True)
class ToolPolicy:
    """One server's policy: its spec's tool settings, the daemon's decisions and
    the catalog providers its serverInfo/URL identify."""

    allow_tools: tuple[str, ...] = ()
    block_tools: tuple[str, ...] = ()
    require_approval: bool = False
    operator_risk: Mapping[str, Risk] = field(default_factory=dict)
    decisions: DecisionTable = _DEFAULT_DECISIONS
    providers: tuple[ProviderCatalog, ...] = ()
    fixed_arguments: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def for_server(
        cls,
        spec: m.ServerSpec,
        decisions: DecisionTable,
        *,
        server_name: str | None,
    ) -> ToolPolicy:
        """``server_name`` is the upstream's serverInfo name (None before connect)."""
        return cls(
            allow_tools=tuple(spec.allow_tools),
            block_tools=tuple(spec.block_tools),
            require_approval=spec.require_approval,
            operator_risk=MappingProxyType(dict(spec.risk)),
            decisions=decisions,
            providers=_providers(spec, server_name),
            fixed_arguments=MappingProxyType(dict(spec.fixed_arguments)),
        )

    def verdict(self, name: str, annotations: Mapping[str, Any] | None) -> ToolVerdict:
        risk = risk_of(
            annotations,
            catalog_risk=catalog_risk(name, self.providers),
            operator_risk=self.operator_risk.get(name),
        )
        if not tool_visible(name, self.allow_tools, self.block_tools):
            return ToolVerdict(risk, "deny", blocked=True)
        decision = decision_for(
            risk,
            decisions=self.decisions,
            require_approval=self.require_approval,
        )
        return ToolVerdict(risk, decision)

    def view(self, tools: Sequence[m.Tool]) -> ToolsView:
        """Decide every listed tool once (at cache fill); calls look verdicts up."""
        verdicts: dict[str, ToolVerdict] = {}
        for tool in tools:
            verdict = self.verdict(tool.name, tool.annotations)
            if self.fixed_arguments:
                verdict = dataclasses.replace(verdict, fixed=self._fixed(tool))
            if (seen := verdicts.get(tool.name)) is not None:
                verdict = _stricter(seen, verdict)  # a name listed twice
            verdicts[tool.name] = verdict
        visible = [
            msgspec.structs.replace(
                self._projected(tool) if self.fixed_arguments else tool,
                risk=verdicts[tool.name].risk,
                decision=verdicts[tool.name].decision,
            )
            for tool in tools
            if not verdicts[tool.name].blocked
        ]
        return ToolsView(visible, verdicts, self)

    def _fixed(self, tool: m.Tool) -> tuple[tuple[str, str], ...]:
        """The fixed arguments the tool's input schema has."""
        properties = tool.input_schema.get("properties")
        if not isinstance(properties, dict):
            return ()
        return tuple(
            (name, value)
            for name, value in self.fixed_arguments.items()
            if name in properties
        )

    def _projected(self, tool: m.Tool) -> m.Tool:
        """The tool as callers see it: the fixed arguments' properties gone
        from its input schema (and from ``required``)."""
        hidden = {name for name, _ in self._fixed(tool)}
        if not hidden:
            return tool
        schema = dict(tool.input_schema)
        schema["properties"] = {
            k: v for k, v in schema["properties"].items() if k not in hidden
        }
        required = schema.get("required")
        if isinstance(required, list):
            schema["required"] = [r for r in required if r not in hidden]
        return msgspec.structs.replace(tool, input_schema=schema)


@dataclass(frozen=True)  # (cached_property writes __dict__ directly: allowed)
class ToolsView:
    """A server's listing as callers see it, and every listed tool's verdict."""

    tools: list[m.Tool]
    """Visible tools only, each with ``risk`` and ``decision`` set (whatever
    the upstream sent in those fields is overwritten)."""
    verdicts: Mapping[str, ToolVerdict]
    """Every listed tool, hidden ones too."""
    policy: ToolPolicy

    def tool(self, name: str) -> m.Tool | None:
        """A visible tool as listed (None: not listed, or hidden)."""
        return self._by_name.get(name)

    @cached_property
    def _by_name(self) -> dict[str, m.Tool]:
        return {tool.name: tool for tool in self.tools}

    def verdict(self, name: str) -> ToolVerdict:
        """A listed tool's verdict; a name the listing lacks is decided by name
        alone (no annotations: ``write`` unless the catalog or operator say
        otherwise), and the upstream answers it as an unknown tool."""
        found = self.verdicts.get(name)
        return found if found is not None else self.policy.verdict(name, None)


def _providers(
    spec: m.ServerSpec, server_name: str | None
) -> tuple[ProviderCatalog, ...]:
    """The catalog entries for a server: its preset's provider (whatever the
    server calls itself), and any its serverInfo name or URL host identify."""
    found = providers_for(provider_hint(server_name, spec.url))
    preset = PRESETS.get(spec.preset) if spec.preset is not None else None
    entry = catalog_named(preset.provider) if preset is not None else None
    if entry is not None and entry not in found:
        found = (entry, *found)
    return found


def refusal(verdict: ToolVerdict, *, server: str, tool: str) -> RemoteError:
    """The error a call gets for a verdict other than ``allow`` (blocked or
    ``deny``: ``tool_blocked``; ``ask``: ``approval_required``)."""
    data: dict[str, object] = {
        "server": server,
        "tool": tool,
        "risk": verdict.risk,
        "decision": verdict.decision,
    }
    if verdict.blocked:
        return PermissionDeniedError(
            f"{tool} on {server} is blocked by the server's allow_tools/block_tools",
            reason="tool_blocked",
            data=data,
        )
    if verdict.decision == "deny":
        return PermissionDeniedError(
            f"{tool} on {server} is {verdict.risk}, and [decisions] denies "
            f"{verdict.risk} tools",
            reason="tool_blocked",
            data=data,
        )
    if verdict.decision == "ask":
        return ApprovalRequiredError(
            f"{tool} on {server} is {verdict.risk}; it needs an operator's approval"
            " (the broker stores the call as a proposal: memorizzd.approvals)",
            data=data,
        )
    raise ValueError(f"{tool} on {server} is allowed; there is nothing to refuse")
