"""memorizzctl's commands: each is parse -> one ``Client`` call -> render -> exit status.

A ``Command`` takes the connected ``Client`` and the parsed line and returns the
exit status (``memorizz.ctl.exits``). ``--json`` prints the result struct itself
(field names equal the struct's wire names), except ``mcp call``'s and
``mcp resume``'s, which are the tool's result as the upstream server wrote it
(``show_relayed_call``); otherwise a renderer from ``memorizz.ctl.render``
writes text. Errors are not caught here: ``main`` maps them to a message and
an exit status.

Standard library, msgspec and memorizz only.
"""

from __future__ import annotations

import argparse
import os
import queue
import socket
import sys
import time
from collections.abc import Callable

import msgspec

from memorizz.api import methods as m
from memorizz.api.errors import (
    DaemonUnreachableError,
    PermissionDeniedError,
    ProtocolError,
    RemoteError,
    SocketPermissionError,
)
from memorizz.client import Client
from memorizz.ctl.add import build_server_spec
from memorizz.ctl.args import StdinError, read_stdin
from memorizz.ctl.exits import (
    ERROR_PREFIX,
    EXIT_ERROR,
    EXIT_OK,
    EXIT_TEMPFAIL,
    LOGIN_TIMED_OUT,
    UsageError,
    emit,
    report,
)
from memorizz.ctl.render import (
    render_added,
    render_audit,
    render_call,
    render_completion,
    render_contents,
    render_daemon_status,
    render_login_done,
    render_messages,
    render_presets,
    render_prompts,
    render_proposal,
    render_proposals,
    render_reload,
    render_resources,
    render_servers,
    render_status,
    render_task,
    render_tasks,
    render_templates,
    render_test,
    render_tools,
    render_update,
)
from memorizz.ctl.serve import bridge, bridge_for, scope_line
from memorizz.ctl.text import (
    ProgressLine,
    Prompter,
    format_log,
    format_ms,
    printable,
    to_json,
    to_json_line,
)

Command = Callable[[Client, argparse.Namespace], int]


def _show(args: argparse.Namespace, result: m.Result, text: str) -> None:
    emit(to_json(result) if args.json else text)


def cmd_mcp_list(client: Client, args: argparse.Namespace) -> int:
    try:
        servers = client.list_servers()
    except PermissionDeniedError as exc:
        if exc.reason != "permission_denied":
            raise
        # an agent socket: the names of its servers, as daemon/hello gives
        # them (the details are the operator's); a socket that refused this
        # user (and closed) is said as it refused
        try:
            names = client.hello().servers
        except (RemoteError, DaemonUnreachableError):
            raise exc from None
        emit(
            to_json({"servers": names})
            if args.json
            else "".join(f"{n}\n" for n in names)
        )
        return EXIT_OK
    _show(args, m.ServersListResult(servers=servers), render_servers(servers))
    return EXIT_OK


def cmd_mcp_add(client: Client, args: argparse.Namespace) -> int:
    preset = None
    if args.preset is not None:
        known = {p.name: p for p in client.list_presets()}
        preset = known.get(args.preset)
        if preset is None:
            raise UsageError(
                f"unknown preset {args.preset!r} (known: {', '.join(known)})"
            )
    spec = build_server_spec(args, preset)
    info = client.add_server(spec)
    text = f"added {info.name} ({info.transport}, {info.state})\n"
    text += render_added(info, preset)
    _show(args, m.ServersAddResult(server=info), text)
    return EXIT_OK


def cmd_mcp_presets(client: Client, args: argparse.Namespace) -> int:
    presets = client.list_presets()
    _show(args, m.PresetsListResult(presets=presets), render_presets(presets))
    return EXIT_OK


def cmd_mcp_login(client: Client, args: argparse.Namespace) -> int:
    if args.callback_url is not None:
        url = args.callback_url
        if url == "-":
            try:
                url = read_stdin(line=True).strip()
            except StdinError as exc:
                raise UsageError(f"--callback-url -: {exc}") from None
        done = client.auth_complete(args.name, url)
        _show(args, done, render_login_done(done, time.time()))
        return EXIT_OK
    started = client.auth_login(args.name, redirect_uri=args.redirect_uri)
    if args.print_url:
        _show(args, started, started.authorization_url + "\n")
        return EXIT_OK
    from memorizz.ctl.login import open_listener, start_paste_reader  # http.server

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
            report(
                "the login timed out; run the command again",
                reason=LOGIN_TIMED_OUT,
                data={"server": args.name},
                as_json=args.json,
            )
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


def show_call(result: m.ToolsCallResult, *, as_json: bool) -> int:
    """A tool's result: its content on stdout, or on stderr after
    ``memorizzctl: error: `` when the tool reported an error (exit 1);
    ``--json``: the result struct."""
    if as_json:
        emit(to_json(result))
    elif result.is_error:
        text = render_call(result) or "the tool reported an error\n"
        sys.stderr.write(ERROR_PREFIX + text)
    else:
        emit(render_call(result))
    return EXIT_ERROR if result.is_error else EXIT_OK


def show_relayed_call(relayed: msgspec.Raw, *, as_json: bool) -> int:
    """``mcp call``'s result, as the daemon relayed it: what ``show_call``
    shows, but with ``--json`` the MCP ``CallToolResult`` the upstream server
    wrote, every member (``structuredContent``, ``_meta``, ``resultType``, a
    vendor's own) and every value as it came, in its order; only the
    indentation is memorizzctl's. The exit status is ``show_call``'s."""
    result = msgspec.json.decode(relayed, type=m.ToolsCallResult)
    if not as_json:
        return show_call(result, as_json=False)
    emit(to_json(relayed))
    return EXIT_ERROR if result.is_error else EXIT_OK


def cmd_mcp_call(client: Client, args: argparse.Namespace) -> int:
    """The call, its progress (if the server reports any) on stderr as it runs,
    and with ``--verbose`` the server's log messages (``[server] level: text``);
    on a terminal, the server's elicitations are answered by prompting (else
    the server is told this client answers none)."""
    if args.task:  # the task, at once: its result comes with `mcp task result`
        task = client.call_tool_task(
            args.server,
            args.tool,
            args.arguments,
            ttl_ms=args.ttl,
            timeout_s=args.timeout,
        )
        _show(args, task, render_task(task))
        return EXIT_OK
    if args.ttl is not None:
        raise UsageError("--ttl goes with --task")
    line = ProgressLine(sys.stderr)
    prompter = Prompter(sys.stdin, sys.stderr) if sys.stdin.isatty() else None
    try:
        relayed = client.call_tool(
            args.server,
            args.tool,
            args.arguments,
            timeout_s=args.timeout,
            on_progress=lambda p: line.show(p.progress, p.total, p.message),
            on_elicit=None if prompter is None else prompter.answer,
            on_log=(
                (lambda n: line.note(format_log(n.server, n.level, n.data)))
                if args.verbose
                else None
            ),
            raw=True,
        )
    finally:
        line.clear()
    return show_relayed_call(relayed, as_json=args.json)


def cmd_mcp_task_get(client: Client, args: argparse.Namespace) -> int:
    task = client.get_task(args.id)
    _show(args, task, render_task(task))
    return EXIT_OK


def cmd_mcp_task_result(client: Client, args: argparse.Namespace) -> int:
    """Wait for the task to end and show its tool result as ``mcp call`` does
    (but ``--json``: the ``ToolsCallResult``, as the daemon does not relay a
    task's result verbatim: it rewrites its related-task id); the status
    changes the server reports meanwhile, one line each on stderr."""
    line = ProgressLine(sys.stderr)
    try:
        result = client.task_result(
            args.id,
            timeout_s=args.timeout,
            on_status=lambda t: line.note(render_task(t).rstrip("\n")),
        )
    finally:
        line.clear()
    return show_call(result, as_json=args.json)


def cmd_mcp_task_cancel(client: Client, args: argparse.Namespace) -> int:
    task = client.cancel_task(args.id)
    _show(args, task, render_task(task))
    return EXIT_OK


def cmd_mcp_task_list(client: Client, args: argparse.Namespace) -> int:
    tasks = client.list_tasks()
    _show(args, m.TasksListResult(tasks=tasks), render_tasks(tasks))
    return EXIT_OK


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


def cmd_mcp_complete(client: Client, args: argparse.Namespace) -> int:
    """The server's completions of an argument of a prompt (``--prompt``) or
    a resource template (``--resource-template``), one a line."""
    ref: m.CompletionReference = (
        m.PromptReference(name=args.prompt)
        if args.prompt is not None
        else m.ResourceTemplateReference(uri=args.resource_template)
    )
    context = (
        m.CompletionContext(arguments=dict(args.context)) if args.context else None
    )
    result = client.complete(
        args.server,
        ref,
        m.CompletionArgument(name=args.argument, value=args.value),
        context,
        timeout_s=args.timeout,
    )
    _show(args, result, render_completion(result))
    return EXIT_OK


def cmd_mcp_watch(client: Client, args: argparse.Namespace) -> int:
    """Subscribe to each URI, then print one line per update (``SERVER URI``;
    ``--json``: the notification's params, one JSON object a line) as they
    come, until Ctrl-C, which is how a watch ends (exit 0). The daemon
    ending the connection is an error (exit 69), as a refused subscribe is."""
    for uri in dict.fromkeys(args.uris):
        client.subscribe_resource(args.server, uri)
    sys.stderr.write(
        f"watching {printable(args.server)}: {' '.join(map(printable, args.uris))}"
        " (Ctrl-C to stop)\n"
    )
    sys.stderr.flush()
    try:
        for update in client.resource_updates():
            emit(to_json_line(update) if args.json else render_update(update))
    except KeyboardInterrupt:
        pass
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
    """The stored call's result, shown as ``mcp call`` shows it (``--json``:
    as the daemon relayed it from the server)."""
    relayed = client.resume(args.id, timeout_s=args.timeout, raw=True)
    return show_relayed_call(relayed, as_json=args.json)


def cmd_mcp_wait(client: Client, args: argparse.Namespace) -> int:
    result = client.wait_approval(args.id, timeout_s=args.timeout)
    _show(args, result, render_proposal(result.proposal, time.time()))
    return EXIT_OK if result.decided else EXIT_TEMPFAIL


def cmd_mcp_serve(client: Client, args: argparse.Namespace) -> int:
    """The stdio bridge (``memorizz.ctl.serve``), for a line only argparse
    accepted: the ``Client`` is never connected, only its socket path used.
    ``--transport streamable-http`` serves HTTP instead (``memorizz.ctl.serve_http``)."""
    try:
        target = bridge_for(client.socket_path, args.mcp_socket, args.server)
        if args.server is not None:
            scope_line(args.server)  # refuse a bad name before anything starts
    except ValueError as exc:
        raise UsageError(f"--server: {exc}") from None
    if args.transport == "streamable-http":
        from memorizz.ctl import serve_http

        return serve_http.serve(
            target,
            args.listen,
            token_file=args.token_file,
            allow_remote=args.allow_remote,
        )
    if args.listen or args.token_file or args.allow_remote:
        raise UsageError(
            "--listen, --token-file and --allow-remote go with --transport streamable-http"
        )
    return bridge(target)


def cmd_daemon_status(client: Client, args: argparse.Namespace) -> int:
    status = client.daemon_status(timeout_s=args.timeout)
    _show(args, status, render_daemon_status(status))
    return EXIT_OK


METRICS_SOCKET = "metrics.sock"
_METRICS_MAX = 64 << 20
_HTTP = b"HTTP/"


def cmd_daemon_reload(client: Client, args: argparse.Namespace) -> int:
    result = client.daemon_reload()
    _show(args, result, render_reload(result))
    return EXIT_OK


def cmd_daemon_metrics(client: Client, args: argparse.Namespace) -> int:
    """``GET /metrics`` over the daemon's metrics socket (``metrics.sock``
    beside the operator socket, or ``--metrics-socket``): Prometheus text."""
    path = args.metrics_socket or os.path.join(
        os.path.dirname(client.socket_path) or ".", METRICS_SOCKET
    )
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(30.0)
            sock.connect(path)
            sock.sendall(
                b"GET /metrics HTTP/1.1\r\nHost: memorizzd\r\nConnection: close\r\n\r\n"
            )
            reply = bytearray()
            while chunk := sock.recv(65536):
                reply += chunk
                if not _HTTP.startswith(reply[: len(_HTTP)]):
                    # Another socket (the API's answers JSON-RPC and waits
                    # for the next line): say so now, not after the timeout.
                    raise ProtocolError(
                        f"{path} did not answer HTTP: it is not the metrics socket"
                    )
                if len(reply) > _METRICS_MAX:
                    raise ProtocolError(f"{path}: the metrics are too large")
    except PermissionError as exc:
        raise SocketPermissionError(f"may not read the metrics at {path}") from exc
    except OSError as exc:
        raise DaemonUnreachableError(
            f"cannot read the metrics at {path}: {exc.strerror or exc}"
            " (is [metrics] enabled?)"
        ) from exc
    head, _, body = bytes(reply).partition(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0]
    if not status.startswith(b"HTTP/1.1 200"):
        raise ProtocolError(f"{path}: {status.decode('latin-1') or 'no answer'}")
    emit(body.decode())
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
    # --since longer ago than the epoch: everything (the daemon takes no
    # time before 1970)
    since = None if args.since is None else max(0.0, time.time() - args.since)
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
    """The round trip as this command saw it (the daemon's ``latency_ms`` is
    the time inside it: about 0 for the daemon itself), and for a server the
    daemon's round trip to it too. ``--json``: the daemon's result."""
    started = time.perf_counter()
    result = client.ping(args.server)
    round_trip = format_ms((time.perf_counter() - started) * 1000)
    if args.server is None:
        text = f"memorizzd: {round_trip}\n"
    else:
        text = (
            f"{args.server}: {format_ms(result.latency_ms)}"
            f" (through memorizzd: {round_trip})\n"
        )
    _show(args, result, text)
    return EXIT_OK
