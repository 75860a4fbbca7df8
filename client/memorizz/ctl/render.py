"""Pure renderers for memorizzctl: result structs in, terminal text out.

One function per result: tables of servers, tools, resources, prompts,
approvals and audit records; a tool's content; the daemon's status. No I/O and
no clock here (the caller passes ``now``); the text primitives (tables, ages,
``one_line``, ``to_json``) are in ``memorizz.ctl.text``.

Standard library and msgspec only, like the rest of the client.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from memorizz.api import methods as m
from memorizz.ctl.exits import PROG
from memorizz.ctl.text import (
    blocks,
    dash,
    format_age,
    format_bytes,
    format_ms,
    format_table,
    one_line,
    printable,
    to_json,
)


def server_target(server: m.ServerInfo) -> str:
    if server.url:
        return server.url
    if server.command:
        return shlex.join([server.command, *server.args])
    return "-"


def render_servers(servers: Sequence[m.ServerInfo]) -> str:
    if not servers:
        return "no servers configured\n"
    rows = [
        [s.name, s.transport, s.state, s.source, one_line(server_target(s), 200)]
        for s in servers
    ]
    return format_table(["name", "transport", "state", "source", "target"], rows)


def render_presets(presets: Sequence[m.Preset]) -> str:
    """Each preset: its endpoint and auth, setup, and its tools' risks."""
    if not presets:
        return "no presets\n"
    out: list[str] = []
    for p in presets:
        auth = "/".join([p.auth, *p.auth_alternatives])
        if p.oauth_registration is not None:
            auth += f" ({p.oauth_registration.replace('_', '-')} client)"
        if p.transport == "builtin":
            target = "(the daemon's own bridge: give --url)"
        else:
            target = p.url or p.command or "(your command)"
        out.append(f"{p.name}: {p.title}\n  {p.transport} {target}  auth: {auth}\n")
        if p.oauth_scopes:
            out.append(f"  scopes: {' '.join(p.oauth_scopes)}\n")
        if p.workspace_arguments:
            out.append(
                f"  workspace: required (--workspace; into {', '.join(p.workspace_arguments)})\n"
            )
        if p.setup:
            out.append(f"  setup: {p.setup}\n")
        kept = set(p.only) if p.only else None
        if kept is not None:
            out.append(
                f"  tools: kept to these {len(kept)} of the provider's"
                f" {len(p.tools)} (allow_tools; --allow-tool to change)\n"
            )
        by_risk: dict[str, list[str]] = {}
        for tool, risk in sorted(p.tools.items()):
            if kept is None or tool in kept:
                by_risk.setdefault(risk, []).append(tool)
        out.extend(
            f"  {risk}: {', '.join(by_risk[risk])}\n"
            for risk in ("read", "write", "destructive")
            if risk in by_risk
        )
    return "".join(out)


def render_added(info: m.ServerInfo, preset: m.Preset | None) -> str:
    """What to do next after ``mcp add``: log in, and for a pre-registered
    OAuth client the exact redirect URI to register with it."""
    lines: list[str] = []
    if info.auth == "oauth" and info.oauth_grant != "authorization_code":
        # a machine grant: no one logs in; the daemon gets the token itself
        lines.append(
            f"no login: the daemon gets a token with the {info.oauth_grant} grant;"
            f" see {PROG} mcp status {info.name}\n"
        )
    elif info.auth == "oauth":
        if preset is not None and preset.oauth_registration == "pre_registered":
            uri = info.oauth_redirect_uri or m.DEFAULT_REDIRECT_URI
            lines.append(f"register this redirect URI with the OAuth client: {uri}\n")
        lines.append(f"next: {PROG} mcp login {info.name}\n")
    return "".join(lines)


def render_status(statuses: Sequence[m.ServerStatus], now: float) -> str:
    if not statuses:
        return "no servers configured\n"
    headers = [
        "name", "state", "since", "pid", "protocol", "tools",
        "inflight", "ok", "failed", "p50(ms)", "last_error",
    ]  # fmt: skip
    rows = [
        [
            s.name,
            s.state,
            format_age(now - s.since),
            dash(s.pid),
            dash(s.protocol_version),
            dash(s.tool_count),
            str(s.in_flight),
            str(s.calls_ok),
            str(s.calls_failed),
            "-" if s.latency_p50_ms is None else f"{s.latency_p50_ms:.1f}",
            one_line(s.last_error) or "-",
        ]
        for s in statuses
    ]
    table = format_table(headers, rows)
    logins = [f"{s.name}: {render_auth(s.auth, now)}\n" for s in statuses if s.auth]
    return table + ("\noauth:\n" + "".join(logins) if logins else "")


def render_auth(auth: m.AuthStatus, now: float) -> str:
    """One line about an OAuth grant (never a token). A machine grant has
    no login: its line never says to log in, only how the token stands."""
    machine = auth.grant != "authorization_code"
    if auth.state == "logged_out":
        if machine:
            return f"no token yet ({auth.grant} grant: the daemon gets one, no login)"
        return "not logged in"
    parts: list[str] = [auth.state]
    if machine:
        if auth.state == "login_required":  # refused: the credentials are at fault
            parts = ["no usable token"]
        parts.append(f"{auth.grant} grant (no login)")
    if auth.issuer:
        parts.append(f"issuer {auth.issuer}")
    if auth.scope:
        parts.append(f"scope {one_line(auth.scope, 80)}")
    if auth.expires_at is not None:
        left = auth.expires_at - now
        parts.append(
            f"token expires in {format_age(left)}" if left > 0 else "token expired"
        )
    if auth.last_refresh is not None:
        noun = "refresh" if auth.refreshes == 1 else "refreshes"
        parts.append(
            f"refreshed {format_age(now - auth.last_refresh)} ago"
            f" ({auth.refreshes} {noun} since start)"
        )
    if auth.last_refresh_error:
        parts.append(f"last refresh failed: {one_line(auth.last_refresh_error)}")
    return ", ".join(parts)


def render_login_done(result: m.AuthCompleteResult, now: float) -> str:
    return f"logged in to {result.server}: {render_auth(result.auth, now)}\n"


def _credentials_hint(result: m.ServersTestResult) -> str:
    name = result.name
    if result.auth == "oauth":
        return f"the server refused the OAuth grant: log in again (`{PROG} mcp login {name}`)"
    if result.source == "config":
        return (
            'the server asks for credentials: set `token` (or auth = "oauth")'
            " in its [[servers]] entry in the config file"
        )
    return (
        "the server asks for credentials: remove it and add it again with a"
        f" token or OAuth (`{PROG} mcp remove {name}`, then"
        f" `{PROG} mcp add {name} ... --token -` or `... --oauth`)"
    )


def _tls_hint(result: m.ServersTestResult) -> str:
    return "the TLS handshake failed: check the server's certificate and host name"


def _unreachable_hint(result: m.ServersTestResult) -> str:
    # "the server closed its stdout" alone: why it did (a traceback, an exit
    # status) is only in the daemon's log
    return (
        "the daemon's log says why (a stdio server's stderr and exit status;"
        " under systemd: `journalctl -u memorizzd`)"
    )


TEST_HINTS: Final[dict[str, Callable[[m.ServersTestResult], str]]] = {
    "authorization_required": _credentials_hint,
    "tls_error": _tls_hint,
    "unreachable": _unreachable_hint,
}
"""``servers/test`` outcome -> what to do about it. The daemon answers with
facts only (``outcome``, ``reason``, ``message``, the server's ``auth`` and
``source``); the words naming the next command live here, beside that command.
No entry: the message says it all."""


def servers_test_hint(result: m.ServersTestResult) -> str | None:
    """The hint for a failed ``servers/test``, or None."""
    hint = TEST_HINTS.get(result.outcome)
    return None if hint is None else hint(result)


def render_test(result: m.ServersTestResult) -> str:
    if result.outcome == "ok":
        detail = []
        if result.tool_count is not None:
            noun = "tool" if result.tool_count == 1 else "tools"
            detail.append(f"{result.tool_count} {noun}")
        if result.latency_ms is not None:
            detail.append(format_ms(result.latency_ms))
        suffix = f" ({', '.join(detail)})" if detail else ""
        return f"{result.name}: ok{suffix}\n"
    hint = servers_test_hint(result)
    suffix = f"; {hint}" if hint else ""
    return f"{result.name}: {result.outcome}: {one_line(result.message, 500)}{suffix}\n"


def render_tools(tools: Sequence[m.Tool]) -> str:
    if not tools:
        return "no tools\n"
    rows = [
        [
            one_line(t.name, 200),
            dash(t.risk),
            dash(t.decision),
            one_line(t.description or t.title),
        ]
        for t in tools
    ]
    return format_table(["name", "risk", "decision", "description"], rows)


def render_resources(resources: Sequence[m.Resource]) -> str:
    if not resources:
        return "no resources\n"
    rows = [
        [
            one_line(r.name, 200),
            one_line(r.uri, 200),
            one_line(r.mime_type) or "-",
            one_line(r.description or r.title),
        ]
        for r in resources
    ]
    return format_table(["name", "uri", "mime_type", "description"], rows)


def render_templates(templates: Sequence[m.ResourceTemplate]) -> str:
    if not templates:
        return "no resource templates\n"
    rows = [
        [
            one_line(t.name, 200),
            one_line(t.uri_template, 200),
            one_line(t.mime_type) or "-",
            one_line(t.description or t.title),
        ]
        for t in templates
    ]
    return format_table(["name", "uri_template", "mime_type", "description"], rows)


def render_prompts(prompts: Sequence[m.Prompt]) -> str:
    if not prompts:
        return "no prompts\n"
    rows = [
        [
            one_line(p.name, 200),
            " ".join(a.name if a.required else f"[{a.name}]" for a in p.arguments)
            or "-",
            one_line(p.description or p.title),
        ]
        for p in prompts
    ]
    return format_table(["name", "arguments", "description"], rows)


def _base64_size(data: object) -> int:
    return len(data) if isinstance(data, str) else 0


def render_content(item: Mapping[str, Any]) -> str:
    """One MCP content item: text as is, anything else as a one-line summary."""
    kind = item.get("type")
    if kind == "text":
        return str(item.get("text", ""))
    if kind in ("image", "audio"):
        mime = one_line(str(item.get("mimeType") or "unknown"))
        return f"[{kind} {mime}, {_base64_size(item.get('data'))} bytes base64]"
    if kind == "resource_link":
        return f"[resource link {one_line(str(item.get('uri', '?')), 200)}]"
    if kind == "resource":
        resource = item.get("resource")
        uri = resource.get("uri") if isinstance(resource, dict) else None
        return f"[resource {one_line(str(uri or '?'), 200)}]"
    return f"[{one_line(str(kind or 'unknown'))} content]"


def render_call(result: m.ToolsCallResult) -> str:
    """The result's content; its structuredContent only when there is no content."""
    if result.content:
        return blocks([render_content(item) for item in result.content])
    if result.structured_content is not None:
        return to_json(result.structured_content)
    return ""


def render_contents(contents: Sequence[Mapping[str, Any]]) -> str:
    parts = []
    for c in contents:
        if "text" in c:
            parts.append(str(c["text"]))
        else:
            uri = one_line(str(c.get("uri", "?")), 200)
            mime = one_line(str(c.get("mimeType") or "application/octet-stream"))
            parts.append(
                f"[blob {uri} {mime}, {_base64_size(c.get('blob'))} bytes base64]"
            )
    return blocks(parts)


def render_messages(result: m.PromptsGetResult) -> str:
    parts = []
    for message in result.messages:
        role = one_line(str(message.get("role", "?")))
        content = message.get("content")
        items = content if isinstance(content, list) else [content]
        text = "\n".join(
            render_content(item) if isinstance(item, dict) else "[no content]"
            for item in items
        )
        parts.append(f"{role}: {text}")
    return blocks(parts)


def render_completion(result: m.CompletionCompleteResult) -> str:
    """The server's values, one a line, as it ordered them."""
    values = result.completion.values
    if not values:
        return "no completions\n"
    return "".join(printable(value) + "\n" for value in values)


def render_update(update: m.ResourceUpdatedParams) -> str:
    """One resource update as ``mcp watch`` prints it: ``SERVER URI``."""
    return f"{printable(update.server)} {printable(update.uri)}\n"


def render_daemon_status(status: m.DaemonStatusResult) -> str:
    agents = [
        f"{name}: {path}" for name, path in sorted(status.agent_sockets.items())
    ] or ["-"]
    pairs = [
        ("version", status.version),
        ("protocol", str(status.protocol_version)),
        ("pid", str(status.pid)),
        ("uptime", format_age(status.uptime_s)),
        ("socket", status.socket),
        ("agent_sockets", agents[0]),
        *(("", more) for more in agents[1:]),  # one line per profile
        ("state_dir", status.state_dir),
        ("config", status.config_path or "-"),
        ("servers", f"{status.servers_ready}/{status.servers_total} ready"),
        ("connections", str(status.connections)),
        ("calls_in_flight", str(status.calls_in_flight)),
        ("rss", format_bytes(status.rss_bytes)),
    ]
    if (last := status.last_reload) is not None:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(last.time))
        outcome = "ok" if last.ok else "FAILED, nothing changed"
        pairs.append(
            (
                "last_reload",
                f"{when} {outcome} ({last.trigger}): {one_line(last.message, 500)}",
            )
        )
    width = max(len(key) for key, _ in pairs) + 1
    return "".join(
        f"{key + ':' if key else '':<{width}} {value}\n" for key, value in pairs
    )


def render_reload(result: m.DaemonReloadResult) -> str:
    """What ``daemon reload`` changed, a line per kind (``-``: nothing)."""
    pairs = [
        ("config", [result.config_path]),
        ("servers started", result.servers_started),
        ("servers restarted", result.servers_restarted),
        ("servers updated", result.servers_updated),
        ("servers stopped", result.servers_stopped),
        ("servers unchanged", result.servers_unchanged),
        ("profiles added", result.profiles_added),
        ("profiles removed", result.profiles_removed),
        ("profiles changed", result.profiles_changed),
        ("settings applied", result.settings_changed),
        ("restart required", result.restart_required),
    ]
    width = max(len(key) for key, _ in pairs) + 1
    text = "".join(
        f"{key + ':':<{width}} {', '.join(names) or '-'}\n" for key, names in pairs
    )
    if result.restart_required:
        text += (
            f"{PROG}: not applied until the daemon restarts:"
            f" {', '.join(result.restart_required)}\n"
        )
    return text


def render_audit(records: Sequence[m.AuditRecord]) -> str:
    if not records:
        return "no audit records\n"
    headers = [
        "id", "time", "action", "server", "tool", "risk", "decision",
        "outcome", "reason", "ms", "uid", "pid", "profile", "proposal", "args",
    ]  # fmt: skip
    rows = [
        [
            str(r.id),
            time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.time)),
            r.action,
            dash(r.server),
            dash(r.tool),
            dash(r.risk),
            dash(r.decision),
            r.outcome,
            dash(r.reason),
            f"{r.duration_ms:.1f}",
            str(r.caller_uid),
            str(r.caller_pid),
            dash(r.caller_profile),
            dash(r.proposal_id),
            ",".join(r.argument_keys) or "-",
        ]
        for r in records
    ]
    return format_table(headers, rows)


def _asked_by(p: m.Proposal) -> str:
    who = f"{p.caller_user or '?'}({p.caller_uid})"
    return f"{who}@{p.caller_profile}" if p.caller_profile else who


def _expiry(p: m.Proposal, now: float) -> str:
    if p.status not in ("pending", "approved"):
        return "-"
    left = p.expires_at - now
    return f"in {format_age(left)}" if left > 0 else "due"


def render_proposals(
    proposals: Sequence[m.Proposal], now: float, *, values: bool = False
) -> str:
    """The approvals table; with ``values``, each proposal's arguments below it."""
    if not proposals:
        return "no proposals\n"
    headers = [
        "id", "status", "server", "tool", "risk", "args", "asked_by", "age", "expires",
    ]  # fmt: skip
    rows = [
        [
            p.id,
            p.status,
            one_line(p.server, 200),
            one_line(p.tool, 200),
            dash(p.risk),
            one_line(",".join(p.argument_keys), 200) or "-",
            _asked_by(p),
            format_age(now - p.created),
            _expiry(p, now),
        ]
        for p in proposals
    ]
    text = format_table(headers, rows)
    if values:
        for p in proposals:
            shown = "(gone)" if p.arguments is None else to_json(p.arguments).rstrip()
            text += f"\n{p.id} arguments:\n{shown}\n"
    return text


def render_proposal(p: m.Proposal, now: float) -> str:
    """One proposal after a decision: a line saying what it is now."""
    by = ""
    if p.decided_by_uid is not None:
        by = f" by {p.decided_by_user or '?'}({p.decided_by_uid})"
        if p.approver_label:
            by += f" [{one_line(p.approver_label)}]"
    extra = f": {one_line(p.reason, 200)}" if p.reason else ""
    expiry = _expiry(p, now)
    until = f", expires {expiry}" if expiry != "-" else ""
    return f"{p.id} {p.status}{by}{extra} ({p.server}/{one_line(p.tool)}{until})\n"


def _task_source(task: m.Task) -> str:
    meta = task.meta or {}
    server, tool = meta.get("memorizz/server"), meta.get("memorizz/tool")
    if isinstance(server, str) and isinstance(tool, str):
        return one_line(f"{server}/{tool}", 200)
    return "-"


def render_task(task: m.Task) -> str:
    """One task: its id and status (``mcp call --task``, ``mcp task get|cancel``),
    and the server's status message if it gave one."""
    text = f"{task.task_id} {task.status}"
    if task.status_message:
        text += f": {one_line(task.status_message, 200)}"
    return text + "\n"


def render_tasks(tasks: Sequence[m.Task]) -> str:
    if not tasks:
        return "no tasks\n"
    rows = [
        [t.task_id, t.status, _task_source(t), dash(t.created_at), dash(t.ttl)]
        for t in tasks
    ]
    return format_table(["id", "status", "tool", "created", "ttl_ms"], rows)
