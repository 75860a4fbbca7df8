"""memorizzd: the command line of the daemon."""

from __future__ import annotations

import argparse
import logging
import os
import resource
import sys
from functools import partial

import anyio

from memorizzd import __version__, sdk_client_side
from memorizzd.config import ConfigError, check_tracing, load
from memorizzd.execution import check_config_servers, harden_process
from memorizzd.sdnotify import setup_logging
from memorizzd.telemetry.logs import FORMATS, formatter

EX_CONFIG = 78
RELOAD_ENVIRON = frozenset(
    {"MEMORIZZ_SOCKET", "MEMORIZZ_MCP_HOST_ALLOWLIST", "MEMORIZZ_MCP_STDIO_ALLOWLIST"}
)
"""What ``config.load`` reads from the environment."""

log = logging.getLogger("memorizzd")


def main(argv: list[str] | None = None) -> int:
    sdk_client_side.install()  # before anything loads the MCP SDK
    parser = argparse.ArgumentParser(
        prog="memorizzd",
        description="The per-host MCP connection broker daemon. Runs in the foreground.",
    )
    parser.add_argument(
        "--config",
        type=_path,
        help="TOML config (default /etc/memorizzd/memorizzd.toml if present)",
    )
    parser.add_argument(
        "--socket", type=_path, help="operator socket path (config key: socket)"
    )
    parser.add_argument(
        "--state-dir", type=_path, help="state directory (config key: state_dir)"
    )
    parser.add_argument(
        "--check-config",
        action="store_true",
        help="validate the configuration and exit",
    )
    parser.add_argument(
        "--forget-secrets",
        action="store_true",
        help="delete every stored secret (after losing the vault key) and exit;"
        " then re-add the servers' credentials",
    )
    parser.add_argument(
        "--log-level",
        default=os.environ.get("MEMORIZZ_LOG_LEVEL", "info"),
        type=str.lower,
        help="debug, info, warning or error (env: MEMORIZZ_LOG_LEVEL; default info)",
    )
    parser.add_argument(
        "--log-format",
        default=os.environ.get("MEMORIZZ_LOG_FORMAT", "text"),
        type=str.lower,
        help="text, or json: one object per line with the records' fields"
        " (env: MEMORIZZ_LOG_FORMAT; default text; under systemd, logs go to"
        " the journal with the same fields)",
    )
    parser.add_argument(
        "--version", action="version", version=f"memorizzd {__version__}"
    )
    args = parser.parse_args(argv)
    if args.log_level not in ("debug", "info", "warning", "error"):
        parser.error(
            f"invalid log level {args.log_level!r}: use debug, info, warning or error"
        )
    if args.log_format not in FORMATS:
        parser.error(f"invalid log format {args.log_format!r}: use text or json")

    try:
        config = load(args.config, socket=args.socket, state_dir=args.state_dir)
        check_config_servers(config)  # stdio commands: resolvable and allowed
        check_tracing(config)  # [tracing] enabled: the otel extra installed
    except ConfigError as exc:
        print(f"memorizzd: invalid configuration: {exc}", file=sys.stderr)
        return EX_CONFIG
    from memorizzd.vault import VaultKeyError
    from memorizzd.vault.stores import check_stores

    try:  # the plugin stores' factories found (none called): before any key
        check_stores(config.credentials.stores)
    except VaultKeyError as exc:
        print(f"memorizzd: invalid configuration: {exc}", file=sys.stderr)
        return EX_CONFIG
    if args.check_config:
        print(
            f"memorizzd: configuration ok ({config.config_path or 'embedded defaults'}, "
            f"{len(config.servers)} servers)"
        )
        return 0

    setup_logging(args.log_level, formatter(args.log_format))
    if args.forget_secrets:
        return _forget_secrets(config.state_dir)
    from memorizzd.vault import find_keys

    try:  # before harden_process scrubs MEMORIZZ_MCP_ENCRYPTION_KEY
        # A key file still to be generated is made by the daemon (None here),
        # once it owns the socket: a second daemon must not touch anything.
        keys = find_keys(config.state_dir, create=False)
    except VaultKeyError as exc:
        print(f"memorizzd: vault: {exc}", file=sys.stderr)
        return EX_CONFIG
    # A reload reads the same file with the same overrides, and the variables
    # load() reads that harden_process is about to scrub.
    reload_config = partial(
        load,
        config.config_path,
        socket=args.socket,
        state_dir=args.state_dir,
        environ={k: v for k, v in os.environ.items() if k in RELOAD_ENVIRON},
    )
    harden_process()  # MEMORIZZ_* out of os.environ; /proc/<pid>/environ root-only
    raise_open_files_limit()
    from memorizzd.app import run  # the heavy imports (mcp) only when serving
    from memorizzd.rpc.server import ListenError, SocketInUseError
    from memorizzd.store import StorageFullError, StoreError

    try:
        anyio.run(
            run,
            config,
            keys,
            reload_config,
            backend="asyncio",
            backend_options={"use_uvloop": True},
        )
    except BaseException as raised:
        # One failure from inside the daemon's task groups arrives wrapped:
        # said in one line, as the same failure raised before them is.
        failed = _alone(raised)
        if isinstance(failed, VaultKeyError):
            print(f"memorizzd: vault: {failed}", file=sys.stderr)
            return EX_CONFIG
        if isinstance(failed, StorageFullError):
            print(
                f"memorizzd: {failed} (the file system of the state directory"
                f" {config.state_dir} is full: free space there, then start again)",
                file=sys.stderr,
            )
            return 1
        if isinstance(failed, (SocketInUseError, ListenError, StoreError)):
            print(f"memorizzd: {failed}", file=sys.stderr)
            return 1
        if isinstance(failed, ConfigError):
            print(f"memorizzd: invalid configuration: {failed}", file=sys.stderr)
            return EX_CONFIG
        if isinstance(failed, KeyboardInterrupt):
            return 0
        raise
    return 0


def _alone(exc: BaseException) -> BaseException:
    """The one exception a chain of single-member groups holds (or ``exc``)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _path(text: str) -> str:
    """A path option's value: an empty one is a mistake (an unset variable,
    most likely), not a request for the default; a usage error, as
    ``memorizzctl --socket ""`` is."""
    if not text:
        raise argparse.ArgumentTypeError("an empty path")
    return text


def raise_open_files_limit() -> None:
    """Soft ``RLIMIT_NOFILE`` up to the hard limit, before any socket is opened.

    Every connection, upstream and stdio pipe holds a file descriptor; the
    classic soft limit of 1024 is a few hundred connections away, and a local
    user can open that many. The hard limit is what the administrator (or the
    unit's ``LimitNOFILE=``) granted; the soft one is only a default for
    programs that use ``select()``, which the daemon does not.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == hard:
        log.debug("open files limit: %s (soft = hard)", _limit(hard))
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (OSError, ValueError) as exc:  # e.g. an infinite hard limit the kernel caps
        log.warning(
            "open files limit stays at %s (hard %s): %s", soft, _limit(hard), exc
        )
        return
    log.info(
        "raised the soft open files limit from %s to the hard limit, %s",
        soft,
        _limit(hard),
    )


def _limit(value: int) -> str:
    return "unlimited" if value == resource.RLIM_INFINITY else str(value)


def _forget_secrets(state_dir: str) -> int:
    from memorizzd.store import Store, StoreError

    try:
        store = Store(state_dir)
    except StoreError as exc:
        print(f"memorizzd: {exc}", file=sys.stderr)
        return 1
    try:
        count = store.clear_secrets()
    finally:
        store.close()
    print(
        f"memorizzd: deleted {count} stored secrets (the canary included);"
        " re-add the servers' credentials"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
