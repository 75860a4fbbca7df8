"""memorizzctl's command line: the argparse tree, one leaf per command.

Every leaf carries its ``Command`` (``func``) and its own subparser
(``parser``, for usage errors). The global options ``--socket`` and ``--json``
are accepted before or after the command; the later one wins. ``mcp add``'s
many options are declared in ``memorizz.ctl.add``.

A command's parser is built only when the line names it (``_Lazy``): the
tree has some thirty parsers, and argparse asks gettext (a few ``stat`` calls)
for every title and help string of each, which cost more than the command
itself. The help listings are the same: names and help texts are known up front.

Standard library, msgspec and memorizz only.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, get_args

from memorizz import __version__
from memorizz.api import methods as m
from memorizz.api.paths import default_socket_path
from memorizz.ctl.add import add_options
from memorizz.ctl.args import (
    deadline,
    json_object_source,
    key_value,
    page_limit,
    positive_float,
    positive_int,
    repeatable,
    row_id,
    socket_path,
    wait_seconds,
)
from memorizz.ctl.commands import (
    Command,
    cmd_audit,
    cmd_daemon_metrics,
    cmd_daemon_reload,
    cmd_daemon_status,
    cmd_mcp_add,
    cmd_mcp_approvals,
    cmd_mcp_approve,
    cmd_mcp_call,
    cmd_mcp_cancel,
    cmd_mcp_complete,
    cmd_mcp_list,
    cmd_mcp_login,
    cmd_mcp_logout,
    cmd_mcp_presets,
    cmd_mcp_prompt,
    cmd_mcp_prompts,
    cmd_mcp_read,
    cmd_mcp_reject,
    cmd_mcp_remove,
    cmd_mcp_resources,
    cmd_mcp_resume,
    cmd_mcp_serve,
    cmd_mcp_status,
    cmd_mcp_task_cancel,
    cmd_mcp_task_get,
    cmd_mcp_task_list,
    cmd_mcp_task_result,
    cmd_mcp_templates,
    cmd_mcp_test,
    cmd_mcp_tools,
    cmd_mcp_wait,
    cmd_mcp_watch,
    cmd_ping,
    cmd_vault_rotate,
)
from memorizz.ctl.exits import EPILOG, EXIT_USAGE, PROG, USAGE, emit, report


class Parser(argparse.ArgumentParser):
    """argparse, saying a usage error as memorizzctl says every error: the
    usage line, then ``memorizzctl: error: MSG``, on stderr (exit 2).
    Subcommands' parsers are of the same class (argparse makes them so)."""

    as_json = False
    _unknown: list[str] | None = None
    """Options this parser did not know, in the order seen (``error``)."""

    def _parse_optional(self, arg_string: str) -> Any:
        # Note the options argparse will call unrecognized: a missing command
        # is reported before them ("the following arguments are required:
        # COMMAND" for `memorizzctl --verison`), and would hide the typo.
        found: Any = super()._parse_optional(arg_string)
        # (action, option, value), or from Python 3.12.7 a list of
        # (action, option, separator, value)
        for option in found if isinstance(found, list) else [found]:
            if option is not None and option[0] is None:
                self._unknown = [*(self._unknown or []), arg_string]
                break
        return found

    def error(self, message: str) -> NoReturn:
        if self._unknown and message.startswith("the following arguments are required"):
            message = f"unrecognized arguments: {' '.join(self._unknown)}"
        if not self.as_json:
            self.print_usage(sys.stderr)
        report(message, reason=USAGE, as_json=self.as_json)
        self.exit(EXIT_USAGE)


class _JsonParser(Parser):
    """``--json`` on the line: a usage error is the JSON error on stdout."""

    as_json = True


def _socket_help() -> str:
    """``--socket``'s help, naming the path a command takes without it: the
    variable's value when it is set, never as if it were the fallback."""
    if env := os.environ.get("MEMORIZZ_SOCKET"):
        default = f"$MEMORIZZ_SOCKET, set to {env}"
    else:
        default = f"$MEMORIZZ_SOCKET, else {default_socket_path()}"
    return f"memorizzd's socket (default: {default.replace('%', '%%')})"


def _global_options() -> argparse.ArgumentParser:
    # SUPPRESS defaults: a subparser sets an attribute only when the option is
    # given there, so the option may come before or after the command and the
    # later one wins.
    common = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    common.add_argument(
        "--socket",
        metavar="PATH",
        type=socket_path,
        default=argparse.SUPPRESS,
        help=_socket_help(),
    )
    common.add_argument(
        "--json",
        action="store_true",
        default=argparse.SUPPRESS,
        help="print the result as JSON (field names as on the wire)",
    )
    return common


Fill = Callable[[argparse.ArgumentParser], None]
"""Adds a command's own arguments (and, for a group, its subcommands)."""


if TYPE_CHECKING:
    _SubParsers = argparse._SubParsersAction[argparse.ArgumentParser]
else:  # not subscriptable at run time
    _SubParsers = argparse._SubParsersAction


class _Lazy(_SubParsers):
    """Subcommands whose parsers are built when the line chooses them.

    ``choices`` holds every name (for ``invalid choice`` and the listing);
    ``add_parser`` runs, with the command's ``Fill``, the first time one is
    chosen. ``common`` is the global options' parent parser."""

    common: argparse.ArgumentParser

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._pending: dict[str, tuple[Fill, dict[str, Any]]] = {}
        # argparse only asks whether a name is a choice, and lists the names.
        self.choices = self._pending  # type: ignore[assignment]

    def add_lazy(self, name: str, text: str, fill: Fill, **kwargs: Any) -> None:
        self._choices_actions.append(self._ChoicesPseudoAction(name, (), text))
        self._pending[name] = (fill, kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        name = values[0] if isinstance(values, list) else None  # [name, *rest]
        if name in self._pending and name not in self._name_parser_map:
            fill, kwargs = self._pending[name]
            fill(self.add_parser(name, **kwargs))
        super().__call__(parser, namespace, values, option_string)


def _commands(
    where: argparse.ArgumentParser, dest: str, common: argparse.ArgumentParser
) -> _Lazy:
    lazy = where.add_subparsers(
        metavar="COMMAND", dest=dest, required=True, action=_Lazy
    )
    if not isinstance(lazy, _Lazy):
        raise TypeError(f"argparse made a {type(lazy).__name__}")
    lazy.common = common
    return lazy


def _group(where: _Lazy, name: str, text: str, fill: Callable[[_Lazy], None]) -> None:
    """A command with commands of its own (``mcp``, ``vault``, ``daemon``)."""

    def build(sub: argparse.ArgumentParser) -> None:
        fill(_commands(sub, f"{name}_command", where.common))

    where.add_lazy(
        name, text, build, description=text, parents=[where.common], allow_abbrev=False
    )


def _leaf(
    where: _Lazy,
    name: str,
    func: Command,
    text: str,
    fill: Fill | None = None,
    **kwargs: Any,
) -> None:
    """A command: its ``Command``, its help text, its arguments (``fill``)."""

    def build(sub: argparse.ArgumentParser) -> None:
        sub.set_defaults(func=func, parser=sub)
        if fill is not None:
            fill(sub)

    where.add_lazy(
        name,
        text,
        build,
        description=text,
        parents=[where.common],
        allow_abbrev=False,
        **kwargs,
    )


def build_parser(*, as_json: bool = False) -> argparse.ArgumentParser:
    """The whole tree; ``as_json``: usage errors are said as JSON (``--json``)."""
    common = _global_options()
    parser = (_JsonParser if as_json else Parser)(
        prog=PROG,
        description="Operate memorizzd, the per-host MCP broker.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[common],
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    top = _commands(parser, "command", common)
    _group(top, "mcp", "manage and use upstream MCP servers", _mcp)
    _leaf(
        top,
        "audit",
        cmd_audit,
        "the audit trail, newest first (argument values are never stored)",
        _audit,
    )
    _group(top, "vault", "the daemon's encrypted secrets", _vault)
    _group(top, "daemon", "the daemon itself", _daemon)
    _leaf(top, "ping", cmd_ping, "ping the daemon, or one upstream through it", _ping)
    _leaf(
        top,
        "completion",
        cmd_completion,
        'print a shell completion script: eval "$(memorizzctl completion bash)"',
        _completion,
    )
    return parser


def _completion(p: argparse.ArgumentParser) -> None:
    p.add_argument("shell", choices=SHELLS, help="the shell: bash or zsh")


SHELLS = ("bash", "zsh")


def cmd_completion(client: object, args: argparse.Namespace) -> int:
    """The completion script for ``args.shell`` on stdout (no daemon needed)."""
    emit(completion_script(args.shell))
    return 0


def _words(parser: argparse.ArgumentParser, path: str, found: dict[str, str]) -> None:
    """Each command path's words (its commands and options), every lazy
    parser built on the way."""
    words: list[str] = []
    for action in parser._actions:
        words.extend(o for o in action.option_strings if o.startswith("--"))
        if not action.option_strings and not isinstance(action, _Lazy):
            words.extend(str(c) for c in action.choices or ())
        if isinstance(action, _Lazy):
            for name, (fill, kwargs) in list(action._pending.items()):
                if name not in action._name_parser_map:
                    fill(action.add_parser(name, **kwargs))
                words.append(name)
                _words(action._name_parser_map[name], f"{path} {name}".strip(), found)
    found[path] = " ".join(sorted(set(words), key=lambda w: (w.startswith("-"), w)))


def completion_script(shell: str) -> str:
    """A bash function completing memorizzctl's commands and options, made
    from the parser; for zsh, the same through zsh's bashcompinit."""
    found: dict[str, str] = {}
    _words(build_parser(), "", found)
    cases = "".join(
        f'        "{path}") echo "{words}" ;;\n'
        for path, words in sorted(found.items())
    )
    script = (
        f"# {PROG} completion ({shell}): generated by `{PROG} completion {shell}`\n"
        "_memorizzctl_words() {\n"
        '    case "$1" in\n'
        f"{cases}"
        "    esac\n"
        "}\n"
        "_memorizzctl() {\n"
        '    local cur="${COMP_WORDS[COMP_CWORD]}" path="" i w\n'
        "    for ((i = 1; i < COMP_CWORD; i++)); do\n"
        '        w="${COMP_WORDS[i]}"\n'
        '        case "$w" in -*) continue ;; esac\n'
        '        case " $(_memorizzctl_words "$path") " in\n'
        '            *" $w "*) path="${path:+$path }$w" ;;\n'
        "        esac\n"
        "    done\n"
        '    COMPREPLY=($(compgen -W "$(_memorizzctl_words "$path")" -- "$cur"))\n'
        "}\n"
        f"complete -F _memorizzctl {PROG}\n"
    )
    if shell == "zsh":
        script = (
            f"#compdef {PROG}\nautoload -U +X bashcompinit && bashcompinit\n" + script
        )
    return script


def _vault(vault: _Lazy) -> None:
    _leaf(
        vault,
        "rotate",
        cmd_vault_rotate,
        "re-encrypt every secret under the primary key",
        _rotate,
    )


def _daemon(daemon: _Lazy) -> None:
    _leaf(
        daemon,
        "status",
        cmd_daemon_status,
        "version, uptime and counts",
        _status_deadline,
    )
    _leaf(
        daemon,
        "reload",
        cmd_daemon_reload,
        "re-read the config file and apply what changed (as SIGHUP)",
    )
    _leaf(
        daemon,
        "metrics",
        cmd_daemon_metrics,
        "the daemon's Prometheus metrics, as a scrape reads them",
        _metrics,
    )


def _metrics(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--metrics-socket",
        metavar="PATH",
        type=socket_path,
        help="the metrics socket (default: metrics.sock beside the daemon's socket)",
    )


def _mcp(mcp: _Lazy) -> None:
    _leaf(mcp, "list", cmd_mcp_list, "list configured servers")
    _leaf(
        mcp,
        "presets",
        cmd_mcp_presets,
        "connection presets for `mcp add NAME --preset P` (hosted providers)",
    )
    _leaf(
        mcp,
        "add",
        cmd_mcp_add,
        "add a server at run time (persisted by the daemon)",
        add_options,
        usage=f"{PROG} mcp add NAME [options] [-- ARG...]",
        epilog=(
            "Arguments after -- are appended to the server's arguments; an --arg\n"
            "value that starts with '-' must be written --arg=-x.\n\n"
            "examples:\n"
            f"  {PROG} mcp add fs --command npx -- -y "
            "@modelcontextprotocol/server-filesystem /srv\n"
            f"  {PROG} mcp add docs --transport streamable_http "
            "--url https://example.com/mcp\n"
            f"  {PROG} mcp add mem0 --preset mem0 --token -"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _leaf(
        mcp,
        "login",
        cmd_mcp_login,
        "log in to an OAuth server (the daemon keeps and refreshes the grant)",
        _login,
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
    _leaf(
        mcp,
        "logout",
        cmd_mcp_logout,
        "revoke (where supported) and delete a server's OAuth grant",
        _name,
    )
    _leaf(mcp, "remove", cmd_mcp_remove, "remove a run-time server", _name)
    _leaf(mcp, "status", cmd_mcp_status, "live state and stats per server", _status)
    _leaf(mcp, "test", cmd_mcp_test, "a real round trip to one server", _test)
    _leaf(mcp, "tools", cmd_mcp_tools, "list a server's tools", _tools)
    for name, func, text in (
        ("resources", cmd_mcp_resources, "list a server's resources"),
        ("templates", cmd_mcp_templates, "list a server's resource templates"),
        ("prompts", cmd_mcp_prompts, "list a server's prompts"),
    ):
        _leaf(mcp, name, func, text, _server)
    _leaf(mcp, "call", cmd_mcp_call, "call a tool", _call)
    _group(mcp, "task", "tools called as tasks (mcp call --task)", _task)
    _leaf(mcp, "read", cmd_mcp_read, "read one resource", _read)
    _leaf(
        mcp,
        "watch",
        cmd_mcp_watch,
        "subscribe to resources and print a line per update, until Ctrl-C",
        _watch,
        epilog=(
            "Each update is one line, SERVER URI (--json: the notification's\n"
            "params, one JSON object a line), printed as it comes; read the\n"
            "resource again (mcp read) for what it holds now. Ctrl-C ends the\n"
            "watch (exit 0); the subscriptions end with it.\n\n"
            f"example:\n  {PROG} mcp watch docs file:///srv/notes.md"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _leaf(mcp, "prompt", cmd_mcp_prompt, "get one prompt", _prompt)
    _leaf(
        mcp,
        "complete",
        cmd_mcp_complete,
        "the server's completions of an argument of a prompt or a resource template",
        _complete,
        epilog=(
            "Prints the values, one a line, as the server ordered them.\n\n"
            "examples:\n"
            f"  {PROG} mcp complete docs --prompt greet name A\n"
            f"  {PROG} mcp complete docs --resource-template 'file:///{{path}}' path src/"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _leaf(
        mcp,
        "approvals",
        cmd_mcp_approvals,
        "calls waiting for (or given) an operator's decision, newest first",
        _approvals,
    )
    _leaf(mcp, "approve", cmd_mcp_approve, "approve a pending proposal", _approve)
    _leaf(mcp, "reject", cmd_mcp_reject, "reject a pending proposal", _reject)
    _leaf(
        mcp,
        "cancel",
        cmd_mcp_cancel,
        "withdraw a pending or approved proposal",
        _proposal_id,
    )
    _leaf(
        mcp,
        "resume",
        cmd_mcp_resume,
        "run an approved proposal's call (once)",
        _resume,
    )
    _leaf(
        mcp,
        "wait",
        cmd_mcp_wait,
        "wait until a proposal is decided (exit 75 if still pending at the deadline)",
        _wait,
    )
    _leaf(
        mcp,
        "serve",
        cmd_mcp_serve,
        "bridge an MCP client's stdio to memorizzd's MCP socket",
        _serve,
        epilog=(
            "Speaks MCP's stdio transport on stdin/stdout and relays it, byte for\n"
            "byte, to the daemon's MCP socket: mcp.sock beside the API socket that\n"
            "--socket or MEMORIZZ_SOCKET names (or the default one). Errors go to\n"
            "stderr. In an MCP client's configuration, always with --socket and\n"
            "the API socket's absolute path (clients pass on little of their\n"
            "environment, MEMORIZZ_SOCKET and XDG_RUNTIME_DIR not included):\n\n"
            '  {"command": "memorizzctl", "args": ["mcp", "serve", "--socket", "PATH"]}\n\n'
            "For clients that only speak HTTP, --transport streamable-http serves\n"
            "MCP's Streamable HTTP at http://HOST:PORT/mcp (--listen); every request\n"
            "needs Authorization: Bearer TOKEN (--token-file, or printed at start)."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


# --- each command's own arguments ---------------------------------------------------


SERVER_HELP = "a server's name, as `mcp list` shows it"


def _ping(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "server", metavar="SERVER", nargs="?", help=f"{SERVER_HELP} (none: the daemon)"
    )


def _status(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "name", metavar="NAME", nargs="?", help=f"{SERVER_HELP} (none: every server)"
    )


def _name(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", metavar="NAME", help=SERVER_HELP)


def _server(p: argparse.ArgumentParser) -> None:
    p.add_argument("server", metavar="NAME", help=SERVER_HELP)


def _proposal_id(p: argparse.ArgumentParser) -> None:
    p.add_argument("id", metavar="ID")


STATUS_TIMEOUT_S = 10.0
"""How long ``daemon status`` waits for the answer by default."""


def _status_deadline(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--timeout",
        metavar="SECONDS",
        type=deadline,
        default=STATUS_TIMEOUT_S,
        help=(
            "give up (exit 75) when the daemon has not answered in this time"
            f" (default {STATUS_TIMEOUT_S:g}): a stuck daemon fails a probe"
        ),
    )


def _timeout(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--timeout",
        metavar="SECONDS",
        type=deadline,
        help="the request's deadline (at most 3600)",
    )


def _login(p: argparse.ArgumentParser) -> None:
    _name(p)
    p.add_argument(
        "--no-listen",
        action="store_true",
        help="do not listen on the redirect URI; paste the callback URL instead",
    )
    p.add_argument(
        "--redirect-uri", metavar="URI", help="this login only: another redirect URI"
    )
    p.add_argument(
        "--print-url",
        action="store_true",
        help="start the login, print the authorization URL and exit",
    )
    p.add_argument(
        "--callback-url",
        metavar="URL",
        help="finish a login started with --print-url; '-' reads it from stdin",
    )
    p.add_argument(
        "--timeout",
        metavar="SECONDS",
        type=positive_float,
        help="how long to wait for the callback (default: until the login expires)",
    )


def _test(p: argparse.ArgumentParser) -> None:
    _name(p)
    _timeout(p)


def _tools(p: argparse.ArgumentParser) -> None:
    _server(p)
    p.add_argument(
        "--refresh", action="store_true", help="ask the upstream, not the warm cache"
    )


def _call(p: argparse.ArgumentParser) -> None:
    _server(p)
    p.add_argument("tool", metavar="TOOL")
    p.add_argument(
        "--arguments",
        metavar="JSON",
        type=json_object_source,
        default={},
        help="the tool's arguments as a JSON object; @FILE reads it from FILE, - from stdin",
    )
    _timeout(p)
    p.add_argument(
        "--task",
        action="store_true",
        help="call the tool as a task: print its id and status at once, not the"
        " result (then `mcp task result ID`)",
    )
    p.add_argument(
        "--ttl",
        metavar="MS",
        type=positive_int,
        help="--task: ask the server to keep the task this many milliseconds",
    )
    p.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="show the server's log messages on stderr while the call runs",
    )


def _task(task: _Lazy) -> None:
    _leaf(task, "get", cmd_mcp_task_get, "a task's status", _proposal_id)
    _leaf(
        task,
        "result",
        cmd_mcp_task_result,
        "wait for a task to end and print its result, as mcp call does",
        _task_result,
    )
    _leaf(task, "cancel", cmd_mcp_task_cancel, "cancel a task", _proposal_id)
    _leaf(task, "list", cmd_mcp_task_list, "your tasks their servers still keep")


def _task_result(p: argparse.ArgumentParser) -> None:
    _proposal_id(p)
    p.add_argument(
        "--timeout",
        metavar="SECONDS",
        type=deadline,
        help="wait at most this long (the task runs on; exit 75; at most 3600)",
    )


def _read(p: argparse.ArgumentParser) -> None:
    _server(p)
    p.add_argument("uri", metavar="URI")
    _timeout(p)


def _watch(p: argparse.ArgumentParser) -> None:
    _server(p)
    p.add_argument(
        "uris", metavar="URI", nargs="+", help="a resource to watch (repeatable)"
    )


def _complete(p: argparse.ArgumentParser) -> None:
    _server(p)
    ref = p.add_mutually_exclusive_group(required=True)
    ref.add_argument("--prompt", metavar="PROMPT", help="an argument of this prompt")
    ref.add_argument(
        "--resource-template",
        metavar="URI",
        help="a variable of this resource template (its URI template, as listed)",
    )
    p.add_argument("argument", metavar="ARGUMENT", help="the argument's name")
    p.add_argument(
        "value", metavar="VALUE", help="what is typed so far ('' for every value)"
    )
    repeatable(
        p,
        "--context",
        metavar="K=V",
        type=key_value,
        help="another argument's value, already chosen (repeatable)",
    )
    _timeout(p)


def _prompt(p: argparse.ArgumentParser) -> None:
    _server(p)
    p.add_argument("prompt", metavar="PROMPT")
    repeatable(
        p, "--arg", metavar="K=V", type=key_value, help="a prompt argument (repeatable)"
    )
    _timeout(p)


def _approvals(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--status", choices=get_args(m.ProposalStatus), help="only this status"
    )
    p.add_argument(
        "--show-arguments",
        action="store_true",
        help="also print the argument values (operators only)",
    )
    p.add_argument(
        "--limit",
        metavar="N",
        type=page_limit,
        default=100,
        help="at most N (default 100, at most 1000)",
    )


def _approve(p: argparse.ArgumentParser) -> None:
    _proposal_id(p)
    p.add_argument(
        "--approver",
        metavar="LABEL",
        help="an extra label for the record (the approver is your uid, as the"
        " kernel reports it)",
    )


def _reject(p: argparse.ArgumentParser) -> None:
    _proposal_id(p)
    p.add_argument("--reason", metavar="TEXT", help="why (kept with the record)")


def _resume(p: argparse.ArgumentParser) -> None:
    _proposal_id(p)
    _timeout(p)


def _wait(p: argparse.ArgumentParser) -> None:
    _proposal_id(p)
    p.add_argument(
        "--timeout",
        metavar="SECONDS",
        type=wait_seconds,
        default=30.0,
        help="at most this long (default 30, at most 300)",
    )


def _serve(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--server",
        metavar="NAME",
        help="show only this server of the socket's scope, under its own tool"
        " and prompt names (a transparent proxy)",
    )
    p.add_argument(
        "--mcp-socket",
        metavar="PATH",
        type=socket_path,
        help="the MCP socket itself (default: mcp.sock beside the API socket)",
    )
    p.add_argument(
        "--transport",
        choices=("stdio", "streamable-http"),
        default="stdio",
        help="MCP's transport toward the client (default: stdio)",
    )
    p.add_argument(
        "--listen",
        metavar="HOST:PORT",
        help="streamable-http: the address to listen on (loopback unless --allow-remote)",
    )
    p.add_argument(
        "--token-file",
        metavar="PATH",
        help="streamable-http: the bearer token clients send (default: a new one, printed)",
    )
    p.add_argument(
        "--allow-remote",
        action="store_true",
        help="streamable-http: allow --listen on an address other hosts can reach",
    )


def _audit(p: argparse.ArgumentParser) -> None:
    p.add_argument("--server", metavar="NAME", help="only this server's records")
    p.add_argument("--tool", metavar="TOOL", help="only this tool's records")
    p.add_argument(
        "--outcome",
        metavar="OUTCOME",
        help="ok, tool_error, denied, approval_required, timeout, failed,"
        " result_too_large, client_aborted, task_created, interrupted",
    )
    p.add_argument(
        "--since", metavar="SECONDS", type=positive_float, help="only the last SECONDS"
    )
    p.add_argument(
        "--before", metavar="ID", type=row_id, help="page: records older than ID"
    )
    p.add_argument(
        "--limit",
        metavar="N",
        type=page_limit,
        default=50,
        help="at most N (default 50, at most 1000)",
    )


def _rotate(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--new-key",
        action="store_true",
        help="key file only: generate a new primary key first (old keys still decrypt)",
    )
