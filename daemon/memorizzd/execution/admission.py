"""Admitting stdio servers at daemon start: each is checked again before it starts.

``admit`` runs ``resolve_command`` on one server with the current
configuration: a server from the state database was checked when it was added,
but the allowlist and ``stdio_allow_inline_code`` may have changed since. A
refused or missing command does not stop the daemon; that server is not
started and shows why. ``check_config_servers`` does the same for the config
file's servers, where a forbidden command is a ``ConfigError`` (and
``memorizzd --check-config`` fails).
"""

from __future__ import annotations

import os
from typing import NamedTuple

from memorizz.api.methods import ServerSpec
from memorizzd.config import Config, ConfigError
from memorizzd.execution.commands import (
    CommandNotAllowedError,
    CommandNotFoundError,
    resolve_command,
)


class Admission(NamedTuple):
    spec: ServerSpec
    """The spec to run: its command resolved (unchanged when it is not admitted)."""
    problem: str | None = None
    """Why it must not start (shown as the server's last_error); None: start it."""
    forbidden: bool = False
    """The problem is the execution policy, not a missing executable."""


def admit(spec: ServerSpec, config: Config) -> Admission:
    """Resolve and check one server at daemon start (the allowlist may have changed)."""
    try:
        resolved = resolve_command(
            spec,
            allowlist=config.stdio_allowlist,
            allow_inline_code=config.stdio_allow_inline_code,
        )
    except CommandNotAllowedError as exc:
        return Admission(spec, f"command not allowed: {exc.detail}", forbidden=True)
    except CommandNotFoundError:
        cwd = spec.cwd
        if cwd and os.sep in (spec.command or "") and not os.path.isdir(cwd):
            return Admission(spec, f"working directory (cwd) not found: {cwd}")
        return Admission(spec, f"executable not found: {spec.command}")
    return Admission(resolved)


def check_config_servers(config: Config) -> list[Admission]:
    """Admit the config file's servers; a forbidden command is a ``ConfigError``.

    A command that is not found does not stop the daemon: that server is shown
    ``failed`` (install it, then restart).
    """
    where = config.config_path or "configuration"
    for entry in config.stdio_allowlist:
        if not os.path.isabs(entry) and os.sep in entry:
            raise ConfigError(
                f"{where}: stdio_allowlist: {entry!r} must be an executable name"
                " or an absolute path"
            )
    admissions = [admit(spec, config) for spec in config.servers]
    for i, admission in enumerate(admissions):
        if admission.forbidden:
            raise ConfigError(
                f"{where}: $.servers[{i}] (server {admission.spec.name!r}):"
                f" {admission.problem}"
            )
    return admissions
