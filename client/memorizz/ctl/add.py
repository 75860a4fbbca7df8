"""``memorizzctl mcp add``: its options, and the ``ServerSpec`` they describe.

``add_options`` declares the options; ``build_server_spec`` turns the parsed
line into the spec the daemon is sent, or raises ``UsageError`` (exit 2) for a
spec that cannot work (a stdio server with a URL, a token without ``--auth
bearer``, ...), found by the same checks the daemon runs on ``servers/add``
(``memorizz.api.spec``), with the same message and reason. Secrets given as
``-`` are read from standard input so they stay out of ``ps`` and the shell's
history.

Standard library, msgspec and memorizz only.
"""

from __future__ import annotations

import argparse
import os
from typing import cast, get_args

from memorizz.api import methods as m
from memorizz.ctl.args import (
    StdinError,
    header,
    key_value,
    positive_float,
    positive_int,
    read_stdin,
    repeatable,
    secret_key_value,
)
from memorizz.ctl.exits import UsageError
from memorizz.ctl.text import with_reason

_GRANTS: dict[str, m.OAuthGrantType] = {
    "authorization-code": "authorization_code",
    "client-credentials": "client_credentials",
    "jwt-bearer": "jwt_bearer",
    "token-exchange": "token_exchange",
}
"""The command line's spelling to the spec's. The spec's literals, not a
replaced string: a default value is left out of the request only when it is
the very same object (msgspec's omit_defaults)."""


def add_options(add: argparse.ArgumentParser) -> None:
    """Declare ``mcp add``'s arguments on its subparser."""
    add.add_argument("name", metavar="NAME")
    add.add_argument(
        "--preset",
        metavar="PRESET",
        help="start from a connection preset (`mcp presets`); the other options"
        " override it (--url too: a self-hosted or stand-in endpoint)",
    )
    add.add_argument(
        "--workspace",
        metavar="ID",
        help="presets with a workspace (honcho): set on every call, never by callers",
    )
    add.add_argument(
        "--instructions",
        metavar="TEXT",
        help="what agents are told about this server (default: the preset's)",
    )
    add.add_argument(
        "--no-instructions",
        action="store_true",
        help="give agents no connection instructions for this server",
    )
    add.add_argument(
        "--transport",
        choices=get_args(m.Transport),
        help="default: stdio with --command, streamable_http with --url",
    )
    add.add_argument(
        "--command", metavar="CMD", help="stdio: the executable (no shell)"
    )
    repeatable(
        add,
        "--arg",
        metavar="A",
        help="stdio: one argument (repeatable; use --arg=-x for a leading '-')",
    )
    repeatable(
        add,
        "--env",
        metavar="K=V",
        type=key_value,
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
    repeatable(
        add,
        "--allow-tool",
        metavar="NAME",
        help="only tools matching NAME (a glob: 'memory_*') exist for callers"
        " (repeatable; replaces the preset's tool list; '*': every tool)",
    )
    repeatable(
        add,
        "--block-tool",
        metavar="NAME",
        help="hide and refuse tools matching NAME (a glob; repeatable; wins"
        " over --allow-tool)",
    )
    add.add_argument(
        "--replicas",
        metavar="N",
        type=positive_int,
        default=1,
        help="stdio: run N processes behind the name, for a server that keeps no"
        " state between calls (default 1)",
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
    repeatable(
        add,
        "--header",
        metavar="'NAME: VALUE'",
        type=header,
        help="HTTP: a custom header whose value is a secret (repeatable)",
    )
    repeatable(
        add,
        "--secret-env",
        metavar="K=V",
        type=secret_key_value,
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
        "--oauth-grant",
        choices=list(_GRANTS),
        default="authorization-code",
        help="OAuth: client-credentials is a machine's grant (no login; needs"
        " --client-id and --client-secret or --private-key-file); jwt-bearer"
        " presents a workload's JWT (--assertion-file); token-exchange trades an"
        " ID token (--subject-token-file) at the enterprise identity provider"
        " (--idp-issuer or --idp-token-endpoint) for an ID-JAG, then presents it",
    )
    add.add_argument(
        "--assertion-file",
        metavar="PATH",
        help="OAuth, jwt-bearer: the workload's JWT, read again at each token request",
    )
    add.add_argument(
        "--subject-token-file",
        metavar="PATH",
        help="OAuth, token-exchange: the ID token, read again at each exchange",
    )
    add.add_argument(
        "--idp-issuer",
        metavar="URL",
        help="OAuth, token-exchange: the enterprise identity provider's issuer"
        " (its token endpoint is discovered)",
    )
    add.add_argument(
        "--idp-token-endpoint",
        metavar="URL",
        help="OAuth, token-exchange: the identity provider's token endpoint",
    )
    add.add_argument(
        "--idp-client-id",
        metavar="ID",
        help="OAuth, token-exchange: this client's id at the identity provider",
    )
    add.add_argument(
        "--idp-client-secret",
        metavar="SECRET",
        help="OAuth, token-exchange: this client's secret at the identity"
        " provider; '-' reads it from stdin; moved into the daemon's vault",
    )
    add.add_argument(
        "--private-key-file",
        metavar="PATH",
        help="OAuth: the pre-registered client's PEM private key (private_key_jwt);"
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
    repeatable(
        add,
        "--scope",
        metavar="SCOPE",
        help="OAuth: a scope to ask for (repeatable; default: what the server advertises)",
    )
    add.add_argument(
        "--redirect-uri",
        metavar="URI",
        help="OAuth: the redirect URI (default http://127.0.0.1:33418/callback)",
    )
    add.set_defaults(trailing=[])


def _read_private_key(path: str | None) -> str | None:
    if path is None:
        return None
    try:
        with open(path, encoding="ascii") as f:
            return f.read().strip() + "\n"
    except (OSError, UnicodeDecodeError) as exc:
        why = getattr(exc, "strerror", None) or "not a PEM file (not ASCII text)"
        raise UsageError(f"--private-key-file: cannot read {path}: {why}") from None


def _stdin_secret(option: str) -> str:
    """A secret given as ``-``: standard input, stripped."""
    try:
        return read_stdin().strip()
    except StdinError as exc:
        raise UsageError(f"{option} -: {exc}") from None


def build_server_spec(
    args: argparse.Namespace, preset: m.Preset | None = None
) -> m.ServerSpec:
    """The ``ServerSpec`` for ``mcp add``; raise ``UsageError`` if it cannot work.

    The spec is checked here by the same function ``servers/add`` runs
    (``memorizz.api.spec``), so a spec that cannot work is refused before the
    socket is touched, with the daemon's own message and ``reason``. With a
    ``preset`` (the daemon's, from ``presets/list``), the spec sent names it
    and holds only what the command line gave; it is checked as the daemon
    will expand it."""
    from memorizz.api.errors import RemoteError
    from memorizz.api.presets import apply_preset
    from memorizz.api.spec import check_server_spec

    command: str | None = args.command
    url: str | None = args.url
    transport: str | None = args.transport
    if transport is None and preset is not None:
        transport = preset.transport
    if transport is None:  # the one thing only the command line can get wrong
        if command is not None and url is None:
            transport = "stdio"
        elif url is not None and command is None:
            transport = "streamable_http"
        else:
            raise UsageError("give --command (stdio) or --url (streamable_http, sse)")
    token = _read_token(args)
    if args.oauth and args.auth not in (None, "oauth"):
        raise UsageError("--oauth and --auth are given with different values")
    auth = (
        "oauth"
        if args.oauth
        else args.auth or ("bearer" if token is not None else "none")
    )
    if args.instructions is not None and args.no_instructions:
        raise UsageError("give --instructions or --no-instructions, not both")
    client_secret = args.client_secret
    if client_secret == "-":  # noqa: S105 - "-" means stdin
        client_secret = _stdin_secret("--client-secret")
    private_key = _read_private_key(args.private_key_file)
    idp_secret = args.idp_client_secret
    if idp_secret == "-":  # noqa: S105 - "-" means stdin
        if args.client_secret == "-":  # noqa: S105
            raise UsageError("only one of the secrets can be read from stdin")
        idp_secret = _stdin_secret("--idp-client-secret")
    if args.oauth_grant != "authorization-code" and args.auth is None:
        auth = "oauth"
    spec = m.ServerSpec(
        name=args.name,
        transport=cast(m.Transport, transport),
        command=command,
        args=[*args.arg, *args.trailing],
        env=dict(args.env),
        cwd=os.path.abspath(args.cwd) if args.cwd is not None else None,
        url=url,
        timeout_s=m.DEFAULT_TIMEOUT_S if args.timeout is None else args.timeout,
        max_result_bytes=(
            m.DEFAULT_MAX_RESULT_BYTES
            if args.max_result_bytes is None
            else args.max_result_bytes
        ),
        protocol=cast(m.ProtocolMode, args.protocol),
        replicas=args.replicas,
        auth=cast(m.AuthMode, auth),
        token=token,
        headers=dict(args.header),
        secret_env=dict(args.secret_env),
        allow_private_network=args.allow_private_network,
        allow_tools=list(args.allow_tool),
        block_tools=list(args.block_tool),
        oauth_client_id=args.client_id,
        oauth_client_secret=client_secret,
        oauth_private_key=private_key,
        oauth_grant=_GRANTS[args.oauth_grant],
        oauth_assertion_file=_absolute(args.assertion_file),
        oauth_subject_token_file=_absolute(args.subject_token_file),
        oauth_idp_issuer=args.idp_issuer,
        oauth_idp_token_endpoint=args.idp_token_endpoint,
        oauth_idp_client_id=args.idp_client_id,
        oauth_idp_client_secret=idp_secret,
        oauth_client_metadata_url=args.client_metadata_url,
        oauth_token_endpoint_auth_method=args.token_endpoint_auth_method,
        oauth_scopes=list(args.scope),
        oauth_redirect_uri=args.redirect_uri,
        preset=None if preset is None else preset.name,
        workspace=args.workspace,
        instructions=False if args.no_instructions else args.instructions,
    )
    try:
        check_server_spec(spec if preset is None else apply_preset(spec, preset))
    except RemoteError as exc:
        raise UsageError(with_reason(exc.message, exc.reason)) from None
    return spec


def _absolute(path: str | None) -> str | None:
    """A file the daemon reads at each token request: by its absolute path."""
    return None if path is None else os.path.abspath(path)


def _read_token(args: argparse.Namespace) -> str | None:
    """--token VALUE, --token - (stdin) or --token-file PATH; stripped."""
    if args.token is not None and args.token_file is not None:
        raise UsageError("give --token or --token-file, not both")
    if args.token == "-":  # noqa: S105 - "-" means stdin
        return _stdin_secret("--token")
    if args.token_file is not None:
        try:
            with open(args.token_file, encoding="utf-8") as f:
                return f.read().strip()
        except (OSError, UnicodeDecodeError) as exc:
            why = getattr(exc, "strerror", None) or "not UTF-8 text"
            raise UsageError(
                f"cannot read --token-file {args.token_file}: {why}"
            ) from None
    token: str | None = args.token
    return token
