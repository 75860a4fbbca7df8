"""What a stdio server may run: its command resolved, then checked.

``resolve_command`` is the execution policy for one stdio server spec:

* **Resolution.** The command is resolved once, to an absolute path, with the
  ``PATH`` the child would get (the server's ``env`` PATH if it sets one, else
  the daemon's), as ``paths.py`` finds executables: a bare name never through
  a working directory, a command with a slash relative to the server's
  ``cwd``, the path kept as found (not canonicalised). The returned spec
  carries that path; it is what gets stored and what runs, so a later PATH
  cannot swap it. An absolute command that does not exist (yet) is accepted as
  is: it is pinned already, and fails when spawned.
* **Allowlist** (``stdio_allowlist`` / ``MEMORIZZ_MCP_STDIO_ALLOWLIST``; empty:
  any executable). An entry is an absolute path or a bare name; a name stands
  for the file of that name on the *daemon's* PATH (never on a PATH the server
  spec sets). The resolved command matches an entry when it is that path, when
  its real path is that path (an entry may name the real file behind a
  symlink), or when it has the same name *and* the same real file (``/bin/sh``
  and ``/usr/bin/sh`` on merged-/usr). Same real file under a different name is
  not enough: multi-call binaries (busybox) act by name. Listing a multi-call
  binary's real path allows every applet. With an allowlist, ``env`` is looked
  through (its target must be allowed too) and ``LD_PRELOAD``, ``LD_AUDIT`` and
  ``LD_LIBRARY_PATH`` in a server's env are refused: they load code into the
  allowed executable.
* **Inline code** (refused unless ``stdio_allow_inline_code``): interpreter
  one-liners (``inline.py``) and environment variables that carry code
  (``environment.py``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import msgspec

from memorizz.api.errors import InvalidParamsError, PermissionDeniedError
from memorizz.api.methods import ServerSpec
from memorizzd.execution.env_command import parse_env
from memorizzd.execution.environment import LOADER_ENV, env_code
from memorizzd.execution.inline import MAX_DEPTH, inline_code
from memorizzd.execution.paths import program_names, resolve


class CommandNotAllowedError(PermissionDeniedError):
    """The execution policy refuses a stdio server's command (``command_not_allowed``)."""

    default_reason = "command_not_allowed"

    def __init__(self, spec: ServerSpec, detail: str, *, command: str) -> None:
        super().__init__(
            f"server {spec.name!r}: {detail}",
            data={"server": spec.name, "command": command},
        )
        self.detail = detail


class CommandNotFoundError(InvalidParamsError):
    """A bare command name that is not on the PATH the child would get."""


def resolve_command(
    spec: ServerSpec,
    *,
    allowlist: Sequence[str],
    allow_inline_code: bool,
    path: str | None = None,
) -> ServerSpec:
    """The spec with its command resolved to an absolute path, if policy allows it.

    ``path`` is the daemon's PATH (default: ``os.environ["PATH"]``); the command
    itself is looked up with the server's own ``env`` PATH when it sets one.
    Other specs than stdio are returned unchanged. Raises
    ``CommandNotAllowedError`` (reason ``command_not_allowed``) or
    ``CommandNotFoundError`` (``invalid_params``). Reads the filesystem only.
    """
    if spec.transport != "stdio" or not spec.command:
        return spec
    daemon_path = os.environ.get("PATH", os.defpath) if path is None else path
    child_path = spec.env.get("PATH", daemon_path)
    resolved = resolve(spec.command, path=child_path, cwd=spec.cwd)
    if resolved is None:
        where = "on PATH"
        if os.sep in spec.command:  # a path: relative to cwd, never looked up
            base = spec.cwd or os.getcwd()
            where = f"(relative to {base!r})"
            if spec.cwd and not os.path.isdir(spec.cwd):
                where = f"(its working directory, cwd {spec.cwd!r}, does not exist)"
        raise CommandNotFoundError(
            f"server {spec.name!r}: executable {spec.command!r} not found {where}",
            data={"server": spec.name, "command": spec.command},
        )
    if allowlist:
        detail = _allowlist_problem(
            resolved,
            spec.args,
            env=spec.env,
            allowlist=allowlist,
            daemon_path=daemon_path,
            child_path=child_path,
            cwd=spec.cwd,
        )
        if detail is not None:
            raise CommandNotAllowedError(spec, detail, command=resolved)
    if not allow_inline_code:
        detail = env_code(spec.env) or inline_code(
            [spec.command, resolved], spec.args, path=child_path, depth=0
        )
        if detail is not None:
            raise CommandNotAllowedError(
                spec,
                f"{detail} (inline code; set stdio_allow_inline_code to allow it)",
                command=resolved,
            )
    return msgspec.structs.replace(spec, command=resolved)


def _matches(resolved: str, entry: str, *, daemon_path: str) -> bool:
    if os.path.isabs(entry):
        target: str | None = entry
    elif os.sep in entry:
        return False  # a relative path means nothing here (the config check says so)
    else:
        target = resolve(entry, path=daemon_path, cwd=None)
    if target is None:
        return False
    real = os.path.realpath(resolved)
    return (
        resolved == target
        or real == target
        or (
            os.path.basename(resolved) == os.path.basename(target)
            and real == os.path.realpath(target)
        )
    )


def _allowlist_problem(
    resolved: str,
    args: Sequence[str],
    *,
    env: Mapping[str, str],
    allowlist: Sequence[str],
    daemon_path: str,
    child_path: str,
    cwd: str | None,
) -> str | None:
    for key in LOADER_ENV:
        if key in env:
            return f"env {key} is not allowed with a stdio allowlist (it loads code)"
    program, rest, path = resolved, list(args), child_path
    for _ in range(MAX_DEPTH):
        if not any(_matches(program, e, daemon_path=daemon_path) for e in allowlist):
            return f"{program} is not in the stdio allowlist"
        if "env" not in program_names([program], path=path):
            return None
        call = parse_env(rest)
        if call.split_string:
            return "env -S hides the program it runs from the stdio allowlist"
        if call.program is None:
            return None
        for key in LOADER_ENV:
            if key in call.assignments:
                return (
                    f"env {key}= is not allowed with a stdio allowlist (it loads code)"
                )
        path = call.assignments.get("PATH", os.defpath if call.cleared else child_path)
        base = os.path.join(cwd or os.getcwd(), call.chdir or "")
        target = resolve(call.program, path=path, cwd=base)
        if target is None:
            return f"env runs {call.program!r}, which is not found"
        program, rest = target, call.args
    return "too many nested env launchers"
