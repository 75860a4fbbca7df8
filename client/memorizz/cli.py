"""memorizzctl: the operator's command line for memorizzd.

Every command is parse -> one ``Client`` call -> render -> exit status. The
renderers (``memorizz._render``) are pure functions of the result structs;
``--json`` prints the result struct itself (field names equal the struct's wire
names). The argparse converters live in ``memorizz._args``.

Commands::

    memorizzctl mcp list | add | remove | status | test | login | logout
    memorizzctl mcp tools | resources | templates | prompts
    memorizzctl mcp call | read | prompt
    memorizzctl mcp approvals | approve | reject | cancel | resume | wait
    memorizzctl daemon status
    memorizzctl vault rotate [--new-key]
    memorizzctl ping [SERVER]

Global options (accepted before or after the command; the later one wins):
``--socket PATH`` (default ``$MEMORIZZ_SOCKET``, else the per-user default) and
``--json``.

Exit status:

    0    success
    1    the daemon returned an error, a tool result has isError, or a test failed
    2    usage error
    69   memorizzd is unreachable (os.EX_UNAVAILABLE)
    75   temporary failure, worth retrying: unavailable or deadline exceeded
         (os.EX_TEMPFAIL)
    77   permission denied (os.EX_NOPERM)
    130  interrupted

Standard library, msgspec and memorizz only: this module must start without an
event loop and without the daemon's dependencies (a test checks).
"""

from __future__ import annotations

import argparse
import os
import queue
import sys
import time
from collections.abc import Callable
from typing import Any, Final, cast, get_args

from memorizz._args import (
    header,
    json_object,
    key_value,
    positive_float,
    positive_int,
    secret_key_value,
    split_trailing,
)
from memorizz._login import open_listener, start_paste_reader
from memorizz._render import (
    format_ms,
    render_audit,
    render_call,
    render_contents,
    render_daemon_status,
    render_login_done,
    render_messages,
    render_prompts,
    render_proposal,
    render_proposals,
    render_resources,
    render_servers,
    render_status,
    render_templates,
    render_test,
    render_tools,
    to_json,
)
from memorizz.api import methods as m
from memorizz.api.errors import (
    DaemonUnreachableError,
    ErrorCode,
    MemorizzError,
    RemoteError,
    SocketPermissionError,
)
from memorizz.api.protocol import default_socket_path
from memorizz.client import Client

PROG: Final = "memorizzctl"

EXIT_OK: Final = 0
EXIT_ERROR: Final = 1
EXIT_USAGE: Final = 2
EXIT_UNAVAILABLE: Final = os.EX_UNAVAILABLE  # 69
EXIT_TEMPFAIL: Final = os.EX_TEMPFAIL  # 75
EXIT_NOPERM: Final = os.EX_NOPERM  # 77
EXIT_INTERRUPTED: Final = 130
EXIT_BROKEN_PIPE: Final = 141  # 128 + SIGPIPE, as a shell pipeline reports it

EPILOG: Final = """\
exit status:
  0    success
  1    the daemon returned an error, a tool result has isError, or a test failed
  2    usage error
  69   memorizzd is unreachable (EX_UNAVAILABLE)
  75   temporary failure, worth retrying: unavailable or deadline exceeded (EX_TEMPFAIL)
  77   permission denied (EX_NOPERM)
  130  interrupted
"""

Command = Callable[[Client, argparse.Namespace], int]


class UsageError(Exception):
    """A command line the daemon need not see: reported with usage, exit 2."""


# --- mcp add: the ServerSpec a command line describes ------------------------


def build_server_spec(args: argparse.Namespace) -> m.ServerSpec:
    """The ``ServerSpec`` for ``mcp add``; raise ``UsageError`` if it cannot work."""
    command: str | None = args.command
    url: str | None = args.url
    server_args: list[str] = [*args.arg, *args.trailing]
    env: dict[str, str] = dict(args.env)
    cwd: str | None = args.cwd
    transport: str | None = args.transport
    if transport is None:
        if command is not None and url is None:
            transport = "stdio"
        elif url is not None and command is None:
            transport = "streamable_http"
        else:
            raise UsageError("give --command (stdio) or --url (streamable_http, sse)")
    if transport == "stdio":
        if command is None:
            raise UsageError("--transport stdio requires --command")
        if url is not None:
            raise UsageError("--url does not apply to --transport stdio")
    else:
        if url is None:
            raise UsageError(f"--transport {transport} requires --url")
        extra = [
            flag
            for flag, given in (
                ("--command", command is not None),
                ("--arg", bool(server_args)),
                ("--env", bool(env)),
                ("--cwd", cwd is not None),
                ("--secret-env", bool(args.secret_env)),
            )
            if given
        ]
        if extra:
            raise UsageError(
                f"--transport {transport} does not take {', '.join(extra)}"
            )
    token = _read_token(args)
    if args.oauth and args.auth not in (None, "oauth"):
        raise UsageError("--oauth and --auth are given with different values")
    auth = (
        "oauth"
        if args.oauth
        else args.auth or ("bearer" if token is not None else "none")
    )
    oauth_given = [
        flag
        for flag, given in (
            ("--client-id", args.client_id is not None),
            ("--client-secret", args.client_secret is not None),
            (
                "--token-endpoint-auth-method",
                args.token_endpoint_auth_method is not None,
            ),
            ("--client-metadata-url", args.client_metadata_url is not None),
            ("--scope", bool(args.scope)),
            ("--redirect-uri", args.redirect_uri is not None),
        )
        if given
    ]
    if oauth_given and auth != "oauth":
        raise UsageError(f"{', '.join(oauth_given)} need --oauth")
    client_secret = args.client_secret
    if client_secret == "-":  # noqa: S105 - "-" means stdin
        client_secret = sys.stdin.read().strip()
    if transport == "stdio" and (auth != "none" or args.header):
        raise UsageError("--auth, --token and --header are for HTTP servers")
    if auth == "bearer" and token is None:
        raise UsageError("--auth bearer needs --token or --token-file")
    if auth == "none" and token is not None:
        raise UsageError("--token needs --auth bearer")
    return m.ServerSpec(
        name=args.name,
        transport=cast(m.Transport, transport),
        command=command,
        args=server_args,
        env=env,
        cwd=os.path.abspath(cwd) if cwd is not None else None,
        url=url,
        timeout_s=m.DEFAULT_TIMEOUT_S if args.timeout is None else args.timeout,
        max_result_bytes=(
            m.DEFAULT_MAX_RESULT_BYTES
            if args.max_result_bytes is None
            else args.max_result_bytes
        ),
        protocol=cast(m.ProtocolMode, args.protocol),
        auth=cast(m.AuthMode, auth),
        token=token,
        headers=dict(args.header),
        secret_env=dict(args.secret_env),
        allow_private_network=args.allow_private_network,
        oauth_client_id=args.client_id,
        oauth_client_secret=client_secret,
        oauth_client_metadata_url=args.client_metadata_url,
        oauth_token_endpoint_auth_method=args.token_endpoint_auth_method,
        oauth_scopes=list(args.scope),
        oauth_redirect_uri=args.redirect_uri,
    )


def _read_token(args: argparse.Namespace) -> str | None:
    """--token VALUE, --token - (stdin) or --token-file PATH; stripped."""
    if args.token is not None and args.token_file is not None:
        raise UsageError("give --token or --token-file, not both")
    if args.token == "-":  # noqa: S105 - "-" means stdin
        return sys.stdin.read().strip()
    if args.token_file is not None:
        try:
            with open(args.token_file, encoding="utf-8") as f:
                return f.read().strip()
        except OSError as exc:
            raise UsageError(
                f"cannot read --token-file {args.token_file}: {exc.strerror}"
            ) from None
    token: str | None = args.token
    return token


# --- commands: (client, args) -> exit status ---------------------------------


def _show(args: argparse.Namespace, result: m.Result, text: str) -> None:
    sys.stdout.write(to_json(result) if args.json else text)


def cmd_mcp_list(client: Client, args: argparse.Namespace) -> int:
    servers = client.list_servers()
    _show(args, m.ServersListResult(servers=servers), render_servers(servers))
    return EXIT_OK


def cmd_mcp_add(client: Client, args: argparse.Namespace) -> int:
    spec = build_server_spec(args)
    info = client.add_server(spec)
    text = f"added {info.name} ({info.transport}, {info.state})\n"
    _show(args, m.ServersAddResult(server=info), text)
    return EXIT_OK


def cmd_mcp_login(client: Client, args: argparse.Namespace) -> int:
    if args.callback_url is not None:
        url = (
            sys.stdin.readline().strip()
            if args.callback_url == "-"
            else args.callback_url
        )
        done = client.auth_complete(args.name, url)
        _show(args, done, render_login_done(done, time.time()))
        return EXIT_OK
    started = client.auth_login(args.name, redirect_uri=args.redirect_uri)
    if args.print_url:
        _show(args, started, started.authorization_url + "\n")
        return EXIT_OK
    found: queue.Queue[str] = queue.Queue()
    listener, note = (
        (None, "--no-listen")
        if args.no_listen
        else open_listener(started.redirect_uri, found)
    )
    try:
        err = sys.stderr
        err.write(
            f"Open this URL in a browser to log in to {args.name} ({started.issuer}):\n\n"
        )
        err.write(f"  {started.authorization_url}\n\n")
        if listener is not None:
            err.write(f"Waiting for the browser at {started.redirect_uri} ...\n")
            err.write(
                "If the browser is on another machine, paste the full address of the page it ends on:\n"
            )
        else:
            err.write(
                f"({note}) Paste the full address of the page the browser ends on:\n"
            )
        err.flush()
        start_paste_reader(found)
        wait = started.expires_at - time.time()
        if args.timeout is not None:
            wait = min(wait, args.timeout)
        try:
            callback = found.get(timeout=max(1.0, wait))
        except queue.Empty:
            err.write("the login timed out; run the command again\n")
            return EXIT_ERROR
    finally:
        if listener is not None:
            listener.close()
    done = client.auth_complete(args.name, callback)
    _show(args, done, render_login_done(done, time.time()))
    return EXIT_OK


def cmd_mcp_logout(client: Client, args: argparse.Namespace) -> int:
    result = client.auth_logout(args.name)
    _show(args, result, f"logged out of {result.server}: {result.message}\n")
    return EXIT_OK


def cmd_mcp_remove(client: Client, args: argparse.Namespace) -> int:
    client.remove_server(args.name)
    _show(args, m.ServersRemoveResult(name=args.name), f"removed {args.name}\n")
    return EXIT_OK


def cmd_mcp_status(client: Client, args: argparse.Namespace) -> int:
    statuses = client.server_status(args.name)
    text = render_status(statuses, time.time())
    _show(args, m.ServersStatusResult(servers=statuses), text)
    return EXIT_OK


def cmd_mcp_test(client: Client, args: argparse.Namespace) -> int:
    result = client.test_server(args.name, timeout_s=args.timeout)
    _show(args, result, render_test(result))
    return EXIT_OK if result.outcome == "ok" else EXIT_ERROR


def cmd_mcp_tools(client: Client, args: argparse.Namespace) -> int:
    tools = client.list_tools(args.server, refresh=args.refresh)
    _show(args, m.ToolsListResult(tools=tools), render_tools(tools))
    return EXIT_OK


def cmd_mcp_resources(client: Client, args: argparse.Namespace) -> int:
    resources = client.list_resources(args.server)
    _show(args, m.ResourcesListResult(resources=resources), render_resources(resources))
    return EXIT_OK


def cmd_mcp_templates(client: Client, args: argparse.Namespace) -> int:
    templates = client.list_resource_templates(args.server)
    result = m.ResourcesTemplatesListResult(resource_templates=templates)
    _show(args, result, render_templates(templates))
    return EXIT_OK


def cmd_mcp_prompts(client: Client, args: argparse.Namespace) -> int:
    prompts = client.list_prompts(args.server)
    _show(args, m.PromptsListResult(prompts=prompts), render_prompts(prompts))
    return EXIT_OK


def cmd_mcp_call(client: Client, args: argparse.Namespace) -> int:
    result = client.call_tool(
        args.server, args.tool, args.arguments, timeout_s=args.timeout
    )
    if args.json:
        sys.stdout.write(to_json(result))
    elif result.is_error:
        text = render_call(result) or "the tool reported an error\n"
        sys.stderr.write("error: " + text)
    else:
        sys.stdout.write(render_call(result))
    return EXIT_ERROR if result.is_error else EXIT_OK


def cmd_mcp_read(client: Client, args: argparse.Namespace) -> int:
    result = client.read_resource(args.server, args.uri, timeout_s=args.timeout)
    _show(args, result, render_contents(result.contents))
    return EXIT_OK


def cmd_mcp_prompt(client: Client, args: argparse.Namespace) -> int:
    result = client.get_prompt(
        args.server, args.prompt, dict(args.arg), timeout_s=args.timeout
    )
    _show(args, result, render_messages(result))
    return EXIT_OK


def cmd_mcp_approvals(client: Client, args: argparse.Namespace) -> int:
    proposals = client.list_approvals(
        status=args.status, limit=args.limit, show_arguments=args.show_arguments
    )
    text = render_proposals(proposals, time.time(), values=args.show_arguments)
    _show(args, m.ApprovalsListResult(proposals=proposals), text)
    return EXIT_OK


def _decided(args: argparse.Namespace, proposal: m.Proposal) -> int:
    result = m.ApprovalsDecisionResult(proposal=proposal)
    _show(args, result, render_proposal(proposal, time.time()))
    return EXIT_OK


def cmd_mcp_approve(client: Client, args: argparse.Namespace) -> int:
    return _decided(args, client.approve(args.id, approver=args.approver))


def cmd_mcp_reject(client: Client, args: argparse.Namespace) -> int:
    return _decided(args, client.reject(args.id, reason=args.reason))


def cmd_mcp_cancel(client: Client, args: argparse.Namespace) -> int:
    return _decided(args, client.cancel_approval(args.id))


def cmd_mcp_resume(client: Client, args: argparse.Namespace) -> int:
    result = client.resume(args.id, timeout_s=args.timeout)
    if args.json:
        sys.stdout.write(to_json(result))
    elif result.is_error:
        text = render_call(result) or "the tool reported an error\n"
        sys.stderr.write("error: " + text)
    else:
        sys.stdout.write(render_call(result))
    return EXIT_ERROR if result.is_error else EXIT_OK


def cmd_mcp_wait(client: Client, args: argparse.Namespace) -> int:
    result = client.wait_approval(args.id, timeout_s=args.timeout)
    _show(args, result, render_proposal(result.proposal, time.time()))
    return EXIT_OK if result.decided else EXIT_TEMPFAIL


def cmd_daemon_status(client: Client, args: argparse.Namespace) -> int:
    status = client.daemon_status()
    _show(args, status, render_daemon_status(status))
    return EXIT_OK


def cmd_vault_rotate(client: Client, args: argparse.Namespace) -> int:
    result = client.rotate_vault(new_key=args.new_key)
    text = (
        f"re-encrypted {result.reencrypted} secrets under the primary key"
        f" from {result.key_source}"
        + (" (a new key was generated: back the key file up)" if result.new_key else "")
        + "\n"
    )
    _show(args, result, text)
    return EXIT_OK


def cmd_audit(client: Client, args: argparse.Namespace) -> int:
    since = None if args.since is None else time.time() - args.since
    result = client.audit(
        server=args.server,
        tool=args.tool,
        outcome=args.outcome,
        since=since,
        before_id=args.before,
        limit=args.limit,
    )
    _show(args, result, render_audit(result.records))
    return EXIT_OK


def cmd_ping(client: Client, args: argparse.Namespace) -> int:
    result = client.ping(args.server)
    target = args.server or "memorizzd"
    _show(args, result, f"{target}: {format_ms(result.latency_ms)}\n")
    return EXIT_OK


# --- the parser --------------------------------------------------------------


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
    add.add_argument("name", metavar="NAME")
    add.add_argument(
        "--transport",
        choices=get_args(m.Transport),
        help="default: stdio with --command, streamable_http with --url",
    )
    add.add_argument(
        "--command", metavar="CMD", help="stdio: the executable (no shell)"
    )
    add.add_argument(
        "--arg",
        metavar="A",
        action="append",
        default=[],
        help="stdio: one argument (repeatable; use --arg=-x for a leading '-')",
    )
    add.add_argument(
        "--env",
        metavar="K=V",
        action="append",
        type=key_value,
        default=[],
        help="stdio: an environment variable (repeatable)",
    )
    add.add_argument(
        "--cwd", metavar="DIR", help="stdio: the working directory (made absolute here)"
    )
    add.add_argument("--url", metavar="URL", help="streamable_http/sse: the endpoint")
    add.add_argument(
        "--timeout",
        metavar="SECONDS",
        type=positive_float,
        help=f"default and maximum deadline of one request (default {m.DEFAULT_TIMEOUT_S:g})",
    )
    add.add_argument(
        "--max-result-bytes",
        metavar="N",
        type=positive_int,
        help=f"largest accepted result (default {m.DEFAULT_MAX_RESULT_BYTES})",
    )
    add.add_argument(
        "--protocol",
        choices=get_args(m.ProtocolMode),
        default="auto",
        help="MCP protocol mode (default auto)",
    )
    add.add_argument(
        "--auth",
        choices=get_args(m.AuthMode),
        help="HTTP: bearer sends the token as 'Authorization: Bearer' (default"
        " bearer with --token, else none)",
    )
    add.add_argument(
        "--token",
        metavar="TOKEN",
        help="HTTP: the bearer token; '-' reads it from stdin (kept out of ps"
        " and shell history); moved into the daemon's vault",
    )
    add.add_argument(
        "--token-file", metavar="PATH", help="HTTP: read the bearer token from PATH"
    )
    add.add_argument(
        "--header",
        metavar="'NAME: VALUE'",
        action="append",
        type=header,
        default=[],
        help="HTTP: a custom header whose value is a secret (repeatable)",
    )
    add.add_argument(
        "--secret-env",
        metavar="K=V",
        action="append",
        type=secret_key_value,
        default=[],
        help="stdio: an environment variable whose value is a secret (repeatable)",
    )
    add.add_argument(
        "--allow-private-network",
        action="store_true",
        help="HTTP: allow http:// and private/loopback addresses for this server"
        " alone (an intentional local service)",
    )
    add.add_argument(
        "--oauth",
        action="store_true",
        help="HTTP: OAuth 2.1 (same as --auth oauth); then `mcp login NAME`",
    )
    add.add_argument(
        "--client-id", metavar="ID", help="OAuth: a pre-registered client's id"
    )
    add.add_argument(
        "--client-secret",
        metavar="SECRET",
        help="OAuth: the pre-registered client's secret; '-' reads it from stdin;"
        " moved into the daemon's vault",
    )
    add.add_argument(
        "--token-endpoint-auth-method",
        choices=get_args(m.TokenEndpointAuthMethod),
        help="OAuth, pre-registered client: how it authenticates at the token"
        " endpoint (default: from the authorization server's metadata)",
    )
    add.add_argument(
        "--client-metadata-url",
        metavar="URL",
        help="OAuth: an https URL of this client's metadata document (CIMD)",
    )
    add.add_argument(
        "--scope",
        metavar="SCOPE",
        action="append",
        default=[],
        help="OAuth: a scope to ask for (repeatable; default: what the server advertises)",
    )
    add.add_argument(
        "--redirect-uri",
        metavar="URI",
        help="OAuth: the redirect URI (default http://127.0.0.1:33418/callback)",
    )
    add.set_defaults(trailing=[])

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


# --- main ----------------------------------------------------------------------


def exit_status(exc: MemorizzError) -> int:
    if isinstance(exc, SocketPermissionError):
        return EXIT_NOPERM
    if isinstance(exc, DaemonUnreachableError):
        return EXIT_UNAVAILABLE
    if isinstance(exc, RemoteError):
        if exc.code == ErrorCode.PERMISSION_DENIED:
            return EXIT_NOPERM
        if exc.code in (ErrorCode.UNAVAILABLE, ErrorCode.DEADLINE_EXCEEDED):
            return EXIT_TEMPFAIL  # UnavailableError, DeadlineExceededError
    return EXIT_ERROR


def _error(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr)


def _run(argv: list[str]) -> int:
    head, trailing = split_trailing(argv)
    parser = build_parser()
    try:
        args = parser.parse_args(head)
    except SystemExit as exc:  # --help (0) or a usage error (2)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    if trailing:
        args.trailing = trailing
    args.json = bool(getattr(args, "json", False))
    socket_path: str = getattr(args, "socket", None) or default_socket_path()
    func: Command = args.func
    try:
        with Client(socket_path) as client:
            status: int = func(client, args)
            return status
    except UsageError as exc:
        sub: argparse.ArgumentParser = args.parser
        sub.print_usage(sys.stderr)
        print(f"{sub.prog}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except RemoteError as exc:
        _error(f"{exc.message} ({exc.reason})")
        if exc.reason == "approval_required" and "proposal_id" in exc.data:
            _error(
                f"an operator approves with `{PROG} mcp approve {exc.data['proposal_id']}`,"
                f" then `{PROG} mcp resume {exc.data['proposal_id']}` runs it"
            )
        return exit_status(exc)
    except MemorizzError as exc:
        _error(str(exc))
        return exit_status(exc)
    except BrokenPipeError:
        raise
    except OSError as exc:  # e.g. a socket path longer than AF_UNIX allows
        _error(f"cannot reach memorizzd at {socket_path}: {exc}")
        return EXIT_UNAVAILABLE


def main(argv: list[str] | None = None) -> int:
    """Run ``memorizzctl`` and return its exit status (see the module docstring)."""
    try:
        return _run(sys.argv[1:] if argv is None else argv)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (``memorizzctl mcp list | head``): stop quietly,
        # and keep the interpreter from complaining while flushing at exit.
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return EXIT_BROKEN_PIPE


if __name__ == "__main__":
    sys.exit(main())
