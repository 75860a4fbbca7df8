"""memorizzctl's command line: the argparse tree, one leaf per command.

Every leaf carries its ``Command`` (``func``) and its own subparser
(``parser``, for usage errors). The global options ``--socket`` and ``--json``
are accepted before or after the command; the later one wins. ``mcp add``'s
many options are declared in ``memorizz.ctl.add``.

Standard library, msgspec and memorizz only.
"""

from __future__ import annotations

import argparse
from typing import Any, get_args

from memorizz.api import methods as m
from memorizz.api.protocol import default_socket_path
from memorizz.ctl.add import add_options
from memorizz.ctl.args import json_object, key_value, positive_float, positive_int
from memorizz.ctl.commands import (
    Command,
    cmd_audit,
    cmd_daemon_status,
    cmd_mcp_add,
    cmd_mcp_approvals,
    cmd_mcp_approve,
    cmd_mcp_call,
    cmd_mcp_cancel,
    cmd_mcp_list,
    cmd_mcp_login,
    cmd_mcp_logout,
    cmd_mcp_prompt,
    cmd_mcp_prompts,
    cmd_mcp_read,
    cmd_mcp_reject,
    cmd_mcp_remove,
    cmd_mcp_resources,
    cmd_mcp_resume,
    cmd_mcp_status,
    cmd_mcp_templates,
    cmd_mcp_test,
    cmd_mcp_tools,
    cmd_mcp_wait,
    cmd_ping,
    cmd_vault_rotate,
)
from memorizz.ctl.exits import EPILOG, PROG


def _global_options() -> argparse.ArgumentParser:
    # SUPPRESS defaults: a subparser sets an attribute only when the option is
    # given there, so the option may come before or after the command and the
    # later one wins.
    common = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    common.add_argument(
        "--socket",
        metavar="PATH",
        default=argparse.SUPPRESS,
        help=(
            "memorizzd's socket (default: $MEMORIZZ_SOCKET, else "
            f"{default_socket_path().replace('%', '%%')})"
        ),
    )
    common.add_argument(
        "--json",
        action="store_true",
        default=argparse.SUPPRESS,
        help="print the result as JSON (field names as on the wire)",
    )
    return common


def build_parser() -> argparse.ArgumentParser:
    common = _global_options()
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Operate memorizzd, the per-host MCP broker.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[common],
        allow_abbrev=False,
    )
    commands = parser.add_subparsers(metavar="COMMAND", dest="command", required=True)

    def group(
        where: argparse._SubParsersAction[argparse.ArgumentParser], name: str, text: str
    ) -> argparse._SubParsersAction[argparse.ArgumentParser]:
        sub = where.add_parser(
            name, help=text, description=text, parents=[common], allow_abbrev=False
        )
        return sub.add_subparsers(
            metavar="COMMAND", dest=f"{name}_command", required=True
        )

    def leaf(
        where: argparse._SubParsersAction[argparse.ArgumentParser],
        name: str,
        func: Command,
        text: str,
        **kwargs: Any,
    ) -> argparse.ArgumentParser:
        sub = where.add_parser(
            name,
            help=text,
            description=text,
            parents=[common],
            allow_abbrev=False,
            **kwargs,
        )
        sub.set_defaults(func=func, parser=sub)
        return sub

    mcp = group(commands, "mcp", "manage and use upstream MCP servers")

    leaf(mcp, "list", cmd_mcp_list, "list configured servers")

    add = leaf(
        mcp,
        "add",
        cmd_mcp_add,
        "add a server at run time (persisted by the daemon)",
        usage=f"{PROG} mcp add NAME [options] [-- ARG...]",
        epilog=(
            "Arguments after -- are appended to the server's arguments; an --arg\n"
            "value that starts with '-' must be written --arg=-x.\n\n"
            "examples:\n"
            f"  {PROG} mcp add fs --command npx -- -y "
            "@modelcontextprotocol/server-filesystem /srv\n"
            f"  {PROG} mcp add docs --transport streamable_http "
            "--url https://example.com/mcp"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_options(add)

    login = leaf(
        mcp,
        "login",
        cmd_mcp_login,
        "log in to an OAuth server (the daemon keeps and refreshes the grant)",
        epilog=(
            "Open the printed URL in a browser on any machine. If the browser runs\n"
            "on this host, the login finishes by itself (memorizzctl listens on the\n"
            "redirect URI). Otherwise the browser ends on a page that cannot load:\n"
            "copy its full address and paste it here.\n\n"
            "scripted: URL=$(memorizzctl mcp login NAME --print-url); ...;\n"
            '          memorizzctl mcp login NAME --callback-url "$CALLBACK"'
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    login.add_argument("name", metavar="NAME")
    login.add_argument(
        "--no-listen",
        action="store_true",
        help="do not listen on the redirect URI; paste the callback URL instead",
    )
    login.add_argument(
        "--redirect-uri", metavar="URI", help="this login only: another redirect URI"
    )
    login.add_argument(
        "--print-url",
        action="store_true",
        help="start the login, print the authorization URL and exit",
    )
    login.add_argument(
        "--callback-url",
        metavar="URL",
        help="finish a login started with --print-url; '-' reads it from stdin",
    )
    login.add_argument(
        "--timeout",
        metavar="SECONDS",
        type=positive_float,
        help="how long to wait for the callback (default: until the login expires)",
    )

    logout = leaf(
        mcp,
        "logout",
        cmd_mcp_logout,
        "revoke (where supported) and delete a server's OAuth grant",
    )
    logout.add_argument("name", metavar="NAME")

    remove = leaf(mcp, "remove", cmd_mcp_remove, "remove a run-time server")
    remove.add_argument("name", metavar="NAME")

    status = leaf(mcp, "status", cmd_mcp_status, "live state and stats per server")
    status.add_argument("name", metavar="NAME", nargs="?")

    test = leaf(mcp, "test", cmd_mcp_test, "a real round trip to one server")
    test.add_argument("name", metavar="NAME")
    test.add_argument("--timeout", metavar="SECONDS", type=positive_float)

    tools = leaf(mcp, "tools", cmd_mcp_tools, "list a server's tools")
    tools.add_argument("server", metavar="NAME")
    tools.add_argument(
        "--refresh", action="store_true", help="ask the upstream, not the warm cache"
    )

    for name, func, text in (
        ("resources", cmd_mcp_resources, "list a server's resources"),
        ("templates", cmd_mcp_templates, "list a server's resource templates"),
        ("prompts", cmd_mcp_prompts, "list a server's prompts"),
    ):
        leaf(mcp, name, func, text).add_argument("server", metavar="NAME")

    call = leaf(mcp, "call", cmd_mcp_call, "call a tool")
    call.add_argument("server", metavar="NAME")
    call.add_argument("tool", metavar="TOOL")
    call.add_argument(
        "--arguments",
        metavar="JSON",
        type=json_object,
        default={},
        help="the tool's arguments as a JSON object",
    )
    call.add_argument("--timeout", metavar="SECONDS", type=positive_float)

    read = leaf(mcp, "read", cmd_mcp_read, "read one resource")
    read.add_argument("server", metavar="NAME")
    read.add_argument("uri", metavar="URI")
    read.add_argument("--timeout", metavar="SECONDS", type=positive_float)

    prompt = leaf(mcp, "prompt", cmd_mcp_prompt, "get one prompt")
    prompt.add_argument("server", metavar="NAME")
    prompt.add_argument("prompt", metavar="PROMPT")
    prompt.add_argument(
        "--arg",
        metavar="K=V",
        action="append",
        type=key_value,
        default=[],
        help="a prompt argument (repeatable)",
    )
    prompt.add_argument("--timeout", metavar="SECONDS", type=positive_float)

    approvals = leaf(
        mcp,
        "approvals",
        cmd_mcp_approvals,
        "calls waiting for (or given) an operator's decision, newest first",
    )
    approvals.add_argument(
        "--status", choices=get_args(m.ProposalStatus), help="only this status"
    )
    approvals.add_argument(
        "--show-arguments",
        action="store_true",
        help="also print the argument values (operators only)",
    )
    approvals.add_argument(
        "--limit", metavar="N", type=positive_int, default=100, help="default 100"
    )
    approve = leaf(mcp, "approve", cmd_mcp_approve, "approve a pending proposal")
    approve.add_argument("id", metavar="ID")
    approve.add_argument(
        "--approver",
        metavar="LABEL",
        help="an extra label for the record (the approver is your uid, as the"
        " kernel reports it)",
    )
    reject = leaf(mcp, "reject", cmd_mcp_reject, "reject a pending proposal")
    reject.add_argument("id", metavar="ID")
    reject.add_argument("--reason", metavar="TEXT", help="why (kept with the record)")
    cancel = leaf(
        mcp, "cancel", cmd_mcp_cancel, "withdraw a pending or approved proposal"
    )
    cancel.add_argument("id", metavar="ID")
    resume = leaf(
        mcp, "resume", cmd_mcp_resume, "run an approved proposal's call (once)"
    )
    resume.add_argument("id", metavar="ID")
    resume.add_argument("--timeout", metavar="SECONDS", type=positive_float)
    wait = leaf(
        mcp,
        "wait",
        cmd_mcp_wait,
        "wait until a proposal is decided (exit 75 if still pending at the deadline)",
    )
    wait.add_argument("id", metavar="ID")
    wait.add_argument(
        "--timeout",
        metavar="SECONDS",
        type=positive_float,
        default=30.0,
        help="at most this long (default 30, at most 300)",
    )

    audit = leaf(
        commands,
        "audit",
        cmd_audit,
        "the audit trail, newest first (argument values are never stored)",
    )
    audit.add_argument("--server", metavar="NAME")
    audit.add_argument("--tool", metavar="TOOL")
    audit.add_argument(
        "--outcome",
        metavar="OUTCOME",
        help="ok, tool_error, denied, approval_required, timeout, failed, result_too_large",
    )
    audit.add_argument(
        "--since", metavar="SECONDS", type=positive_float, help="only the last SECONDS"
    )
    audit.add_argument(
        "--before", metavar="ID", type=positive_int, help="page: records older than ID"
    )
    audit.add_argument(
        "--limit",
        metavar="N",
        type=positive_int,
        default=50,
        help="at most N (default 50)",
    )

    vault = group(commands, "vault", "the daemon's encrypted secrets")
    rotate = leaf(
        vault,
        "rotate",
        cmd_vault_rotate,
        "re-encrypt every secret under the primary key",
    )
    rotate.add_argument(
        "--new-key",
        action="store_true",
        help="key file only: generate a new primary key first (old keys still decrypt)",
    )

    daemon = group(commands, "daemon", "the daemon itself")
    leaf(daemon, "status", cmd_daemon_status, "version, uptime and counts")

    ping = leaf(
        commands, "ping", cmd_ping, "ping the daemon, or one upstream through it"
    )
    ping.add_argument("server", metavar="SERVER", nargs="?")

    return parser
