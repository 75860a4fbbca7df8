"""What stdio servers may run, and what the daemon process exposes to them.

``resolve_command`` is the execution policy for one stdio server spec:

* **Resolution.** The command is resolved once, to an absolute path, with the
  ``PATH`` the child would get (the server's ``env`` PATH if it sets one, else
  the daemon's). Relative ``PATH`` entries (``""``, ``.``) are skipped, so a
  bare name never resolves through a working directory; a command with a slash
  is taken relative to the server's ``cwd``. The path is kept as found, *not*
  canonicalised: a virtualenv's ``bin/python`` is a symlink whose own location
  matters. The returned spec carries that path; it is what gets stored and what
  runs, so a later PATH cannot swap it. An absolute command that does not exist
  (yet) is accepted as is: it is pinned already, and fails when spawned.
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
* **Inline code** (refused unless ``stdio_allow_inline_code``): an interpreter
  handed its program on the command line rather than in a file. Programs are
  recognised by the name given, the name found and the real file's name (a
  symlink called ``helper`` that points at python is python). Recognised, with
  the option grammar each really has (combined switches like ``bash -lc`` and
  ``python -Ic`` included; options after the script belong to the script):
  python/pypy ``-c``; sh, bash, dash, zsh, ksh, mksh, ash, yash, csh, tcsh
  ``-c``; fish ``-c``/``-C``; node/nodejs and bun ``-e``/``-p``/``--eval``/
  ``--print`` and ``data:`` URLs (``--import data:...``); deno ``eval``,
  ``--eval`` and ``data:`` URLs; perl ``-e``/``-E`` and ``-M`` with code;
  ruby ``-e``; php ``-r``/``-R``/``-B``/``-E``; lua/luajit ``-e``; Rscript/R
  ``-e``; julia ``-e``/``-E``; osascript ``-e``; expect ``-c``; pwsh/
  powershell ``-Command``/``-EncodedCommand``/``-CommandWithArgs`` (and their
  abbreviations); npx/pnpx ``-c``/``--call``, ``npm exec -c``, ``pnpm
  exec|dlx -c``. ``env`` is parsed exactly (options, ``NAME=VALUE``; ``-S``
  is refused: it is a command line in a string). Launchers with their own
  large grammars (uv, uvx, pipx, poetry, timeout, nice, sudo, busybox, xargs
  and the like, see ``_WRAPPERS``) are looked through: any argument naming a
  recognised program is checked with what follows it (this can refuse a
  script whose own arguments read like a one-liner). su, runuser, flock,
  script and capsh ``-c`` run a shell command line. Environment variables that
  carry code are refused too: ``NODE_OPTIONS`` with ``--eval``/``--print``/
  ``data:``, ``BASH_ENV``/``ENV`` with command substitution, ``PERL5OPT`` with
  code, exported bash functions (``BASH_FUNC_*``). Not covered: awk, sed,
  find and other tools whose arguments are programs (keep them off the
  allowlist), and code in files: the allowlist, not this rule, bounds that.

And for the daemon process itself, called once from ``memorizzd.__main__``
(not from the in-process test harness):

* ``scrub_environment`` removes the daemon's own ``MEMORIZZ_*`` variables
  (the encryption key among them) from ``os.environ`` once the configuration
  has been read. Children get an explicit environment anyway
  (``session.child_environment``: a few base keys plus the server's own env;
  never ``MEMORIZZ_*``, ``NOTIFY_SOCKET``, ``LISTEN_*`` or
  ``CREDENTIALS_DIRECTORY``); this makes any accidental inheritance empty too.
* ``set_not_dumpable`` calls ``prctl(PR_SET_DUMPABLE, 0)``: removing a variable
  from ``os.environ`` does not remove it from ``/proc/<pid>/environ``, which
  any process of the same uid could read. Not dumpable, the daemon's
  ``/proc/<pid>/*`` is owned by root and other same-uid processes can neither
  read it nor ptrace the daemon (so no core dumps, and no py-spy/gdb attach
  except as root). Children are unaffected: ``execve`` resets the flag.
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import os
import re
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Final, NamedTuple

import msgspec

from memorizz.api.errors import InvalidParamsError, PermissionDeniedError
from memorizz.api.methods import ServerSpec
from memorizzd.config import Config, ConfigError

log = logging.getLogger("memorizzd.execution")

MAX_DEPTH: Final = 8
"""Nested launchers (``env env timeout nice ...``) deeper than this are refused."""
SCRUBBED_PREFIX: Final = "MEMORIZZ_"
PR_SET_DUMPABLE: Final = 4
_LOADER_ENV: Final = ("LD_PRELOAD", "LD_AUDIT", "LD_LIBRARY_PATH")


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


# --- resolution and the allowlist -------------------------------------------


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
    resolved = _resolve(spec.command, path=child_path, cwd=spec.cwd)
    if resolved is None:
        raise CommandNotFoundError(
            f"server {spec.name!r}: executable {spec.command!r} not found on PATH",
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
        detail = _env_code(spec.env) or _inline(
            [spec.command, resolved], spec.args, path=child_path, depth=0
        )
        if detail is not None:
            raise CommandNotAllowedError(
                spec,
                f"{detail} (inline code; set stdio_allow_inline_code to allow it)",
                command=resolved,
            )
    return msgspec.structs.replace(spec, command=resolved)


def _absolute_dirs(path: str) -> str:
    return os.pathsep.join(d for d in path.split(os.pathsep) if os.path.isabs(d))


def _resolve(command: str, *, path: str, cwd: str | None) -> str | None:
    if os.path.isabs(command):
        return command
    if os.sep in command:
        base = os.path.abspath(cwd) if cwd else os.getcwd()
        # Drop "." parts; ".." stays (it would change meaning past a symlink).
        parts = [part for part in command.split(os.sep) if part not in ("", ".")]
        candidate = os.path.join(base, *parts)
        return candidate if _is_executable(candidate) else None
    found = shutil.which(command, path=_absolute_dirs(path))
    return os.path.abspath(found) if found else None


def _is_executable(candidate: str) -> bool:
    return os.path.isfile(candidate) and os.access(candidate, os.X_OK)


def _matches(resolved: str, entry: str, *, daemon_path: str) -> bool:
    if os.path.isabs(entry):
        target: str | None = entry
    elif os.sep in entry:
        return False  # a relative path means nothing here (the config check says so)
    else:
        target = _resolve(entry, path=daemon_path, cwd=None)
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
    for key in _LOADER_ENV:
        if key in env:
            return f"env {key} is not allowed with a stdio allowlist (it loads code)"
    program, rest, path = resolved, list(args), child_path
    for _ in range(MAX_DEPTH):
        if not any(_matches(program, e, daemon_path=daemon_path) for e in allowlist):
            return f"{program} is not in the stdio allowlist"
        if "env" not in _names([program], path=path):
            return None
        call = _parse_env(rest)
        if call.split_string:
            return "env -S hides the program it runs from the stdio allowlist"
        if call.program is None:
            return None
        for key in _LOADER_ENV:
            if key in call.assignments:
                return (
                    f"env {key}= is not allowed with a stdio allowlist (it loads code)"
                )
        path = call.assignments.get("PATH", os.defpath if call.cleared else child_path)
        base = os.path.join(cwd or os.getcwd(), call.chdir or "")
        target = _resolve(call.program, path=path, cwd=base)
        if target is None:
            return f"env runs {call.program!r}, which is not found"
        program, rest = target, call.args
    return "too many nested env launchers"


# --- inline code ----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Grammar:
    """An interpreter's command line, as much of it as the inline check needs."""

    inline: str = ""
    """Short switches whose value is program text (``c`` for ``python -c``)."""
    values: str = ""
    """Short switches taking a value: the rest of the cluster, else the next argument."""
    attached: str = ""
    """Short switches whose optional value can only be attached (``perl -i.bak``):
    the rest of the cluster, unless ``optional`` gives the value's form."""
    optional: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Attached values of a known form, after which the cluster goes on (``-l0e``)."""
    stop: str = ""
    """Short switches after which the rest belongs to something else (``python -m``)."""
    inline_long: frozenset[str] = frozenset()
    values_long: frozenset[str] = frozenset()
    clustered_values: bool = True
    """False for shells: in ``-oc`` the value of ``-o`` is the next argument."""
    plus: bool = False
    """``+o option`` (shells)."""
    data_urls: bool = False
    """A ``data:`` URL as a value or as the script is program text (node, deno)."""
    script: re.Pattern[str] | None = None
    """When set, an unknown ``--option`` takes the next argument as its value
    unless that argument looks like a script (node's many valued options)."""
    subcommands: frozenset[str] = frozenset()
    """Positionals that do not end option parsing (``bun run``, ``npm exec``)."""
    inline_subcommands: frozenset[str] = frozenset()
    """Positionals that take program text (``deno eval``)."""
    code_values: str = ""
    """Short switches whose value must look like a module name (``perl -M``)."""


_MODULE: Final = re.compile(r"-?[\w:]+(=[\w:,.\-]*)?")
_JS_SCRIPT: Final = re.compile(r".*(/|\.[cm]?[jt]sx?$)")

_PYTHON: Final = _Grammar(
    inline="c",
    values="WX",
    stop="m",
    values_long=frozenset({"--check-hash-based-pycs"}),
)
_SHELL: Final = _Grammar(
    inline="c",
    values="oO",
    clustered_values=False,
    plus=True,
    values_long=frozenset({"--rcfile", "--init-file"}),
)
_FISH: Final = _Grammar(
    inline="cC",
    values="do",
    inline_long=frozenset({"--command", "--init-command"}),
    values_long=frozenset({"--debug", "--debug-output", "--features"}),
)
_NODE: Final = _Grammar(
    inline="ep",
    values="rC",
    inline_long=frozenset({"--eval", "--print"}),
    values_long=frozenset(
        {"--require", "--import", "--loader", "--experimental-loader", "--conditions"}
    ),
    data_urls=True,
    script=_JS_SCRIPT,
)
_BUN: Final = _Grammar(
    inline="ep",
    values="rc",
    inline_long=frozenset({"--eval", "--print"}),
    values_long=frozenset({"--preload", "--config", "--cwd", "--env-file"}),
    data_urls=True,
    script=_JS_SCRIPT,
    subcommands=frozenset({"run"}),
)
_DENO: Final = _Grammar(
    inline_long=frozenset({"--eval"}),
    data_urls=True,
    script=_JS_SCRIPT,
    subcommands=frozenset({"run", "serve", "repl", "task"}),
    inline_subcommands=frozenset({"eval"}),
)
_PERL: Final = _Grammar(
    inline="eE",
    values="I",
    attached="0CdDFilmMxV",
    optional={
        "0": r"x[0-9a-fA-F]*|[0-7]*",
        "l": r"[0-7]*",
        "C": r"[0-9]+|[IOEioSDALa]*",
        "d": r"t?(?::.*)?",
    },
    code_values="mM",
)
_RUBY: Final = _Grammar(
    inline="e",
    values="CEIr",
    attached="0FiKTWx",
    optional={"0": r"[0-7]*", "K": r"[a-zA-Z]?", "T": r"[0-9]*", "W": r"[0-2]|:[\w-]*"},
    values_long=frozenset({"--encoding", "--external-encoding", "--internal-encoding"}),
)
_PHP: Final = _Grammar(
    inline="rRBE",
    values="cdfzt",
    inline_long=frozenset(
        {"--run", "--process-code", "--process-begin", "--process-end"}
    ),
    values_long=frozenset({"--php-ini", "--define", "--file", "--zend-extension"}),
)
_LUA: Final = _Grammar(inline="e", values="ljO", stop="b")
_R: Final = _Grammar(inline="e")
_JULIA: Final = _Grammar(
    inline="eE",
    values="LJCtp",
    attached="O",
    optional={"O": r"[0-3]?"},
    inline_long=frozenset({"--eval", "--print"}),
)
_OSASCRIPT: Final = _Grammar(inline="e", values="ls")
_EXPECT: Final = _Grammar(inline="c", values="fb")
_NPX: Final = _Grammar(
    inline="c",
    values="p",
    inline_long=frozenset({"--call", "--shell-mode"}),
    values_long=frozenset({"--package"}),
)
_NPM: Final = dataclasses.replace(
    _NPX, subcommands=frozenset({"exec", "x", "exe", "dlx"})
)

_BY_NAME: Final[dict[str, _Grammar]] = {
    **dict.fromkeys(
        (
            "sh",
            "bash",
            "rbash",
            "dash",
            "zsh",
            "ksh",
            "ksh93",
            "mksh",
            "pdksh",
            "oksh",
            "ash",
            "yash",
            "posh",
            "csh",
            "tcsh",
        ),
        _SHELL,
    ),
    "fish": _FISH,
    "bun": _BUN,
    "deno": _DENO,
    "php": _PHP,
    "luajit": _LUA,
    "Rscript": _R,
    "R": _R,
    "julia": _JULIA,
    "osascript": _OSASCRIPT,
    "expect": _EXPECT,
    "npx": _NPX,
    "pnpx": _NPX,
    "npm": _NPM,
    "pnpm": _NPM,
}
_BY_PATTERN: Final[tuple[tuple[re.Pattern[str], _Grammar], ...]] = (
    (re.compile(r"(?:python|pypy)(?:\d+(?:\.\d+)*)?[dmtuw]?(?:-dbg)?"), _PYTHON),
    (re.compile(r"(?:node|nodejs)\d*"), _NODE),
    (re.compile(r"perl(?:\d+(?:\.\d+)*)?"), _PERL),
    (re.compile(r"ruby(?:\d+(?:\.\d+)*)?"), _RUBY),
    (re.compile(r"php(?:\d+(?:\.\d+)*)?"), _PHP),
    (re.compile(r"lua(?:\d+(?:\.\d+)*)?"), _LUA),
)
_POWERSHELL: Final = frozenset({"pwsh", "pwsh-preview", "powershell"})
_SHELL_STRING: Final = frozenset({"su", "runuser", "flock", "script", "capsh"})
"""Launchers whose ``-c``/``--command`` is a shell command line."""
_WRAPPERS: Final = frozenset(
    {
        "uv",
        "uvx",
        "pipx",
        "poetry",
        "pdm",
        "hatch",
        "rye",
        "pixi",
        "conda",
        "mamba",
        "micromamba",
        "nice",
        "nohup",
        "timeout",
        "stdbuf",
        "setsid",
        "ionice",
        "taskset",
        "chrt",
        "prlimit",
        "sudo",
        "doas",
        "setpriv",
        "xargs",
        "time",
        "busybox",
        "unshare",
        "nsenter",
        "chroot",
        "firejail",
        "bwrap",
        "systemd-run",
        "dbus-run-session",
        "xvfb-run",
        "strace",
        "ltrace",
        "valgrind",
        "tini",
        "dumb-init",
        "catatonit",
        "gosu",
        "su-exec",
        "chpst",
        "bunx",
    }
)


def _grammar(name: str) -> _Grammar | None:
    if (grammar := _BY_NAME.get(name)) is not None:
        return grammar
    for pattern, grammar in _BY_PATTERN:
        if pattern.fullmatch(name):
            return grammar
    return None


def _known(name: str) -> bool:
    return (
        name == "env"
        or name in _WRAPPERS
        or name in _SHELL_STRING
        or name in _POWERSHELL
        or _grammar(name) is not None
    )


def _names(programs: Sequence[str], *, path: str) -> set[str]:
    """The names a program goes by: as given, as found, and its real file's."""
    names: set[str] = set()
    for program in programs:
        names.add(os.path.basename(program))
        found = _resolve(program, path=path, cwd=None)
        if found is not None:
            names.add(os.path.basename(found))
            names.add(os.path.basename(os.path.realpath(found)))
    return names


def _inline(
    programs: Sequence[str], args: Sequence[str], *, path: str, depth: int
) -> str | None:
    """What makes this invocation inline code, or None."""
    if depth > MAX_DEPTH:
        return "too many nested launchers"
    for name in sorted(_names(programs, path=path)):
        if (
            problem := _inline_as(name, list(args), path=path, depth=depth)
        ) is not None:
            return problem
    return None


def _inline_as(name: str, args: list[str], *, path: str, depth: int) -> str | None:
    if name == "env":
        call = _parse_env(args)
        if call.split_string:
            return "env -S runs a command line from a string"
        if (problem := _env_code(call.assignments)) is not None:
            return problem
        if call.program is None:
            return None
        inner = call.assignments.get("PATH", os.defpath if call.cleared else path)
        return _inline([call.program], call.args, path=inner, depth=depth + 1)
    if name in _POWERSHELL:
        switch = _powershell_inline(args)
        return None if switch is None else f"{name} {switch}"
    if name in _SHELL_STRING and (switch := _shell_string(name, args)) is not None:
        return f"{name} {switch} runs a shell command line"
    if (grammar := _grammar(name)) is not None:
        switch = _scan(args, grammar)
        return None if switch is None else f"{name} {switch}"
    if name in _WRAPPERS or name in _SHELL_STRING:
        for i, arg in enumerate(args):
            if arg.startswith("-") or not _known(os.path.basename(arg)):
                continue
            found = _inline([arg], args[i + 1 :], path=path, depth=depth + 1)
            if found is not None:
                return f"{name} ... {found}"
    return None


def _scan(args: Sequence[str], g: _Grammar) -> str | None:
    """The switch (or form) that carries program text, scanning up to the script."""
    i, n = 0, len(args)

    def take() -> str:
        nonlocal i
        value = args[i] if i < n else ""
        i += 1
        return value

    def data(value: str) -> bool:
        return g.data_urls and value.startswith("data:")

    while i < n:
        arg = take()
        if arg in ("--", "-"):
            return None
        if arg.startswith("--"):
            name, eq, value = arg.partition("=")
            if name in g.inline_long:
                return name
            if name in g.values_long:
                value = value if eq else take()
            elif not eq and g.script is not None and i < n:
                if args[i].startswith("-") or g.script.match(args[i]):
                    continue
                value = take()  # an unknown option's value, not the script
            if data(value):
                return f"{name} data:"
            continue
        if arg.startswith("-") or (g.plus and arg.startswith("+") and len(arg) > 1):
            problem = _cluster(arg, g, take)
            if problem is not None:
                return problem or None
            continue
        if arg in g.inline_subcommands:
            return arg
        if arg in g.subcommands:
            continue
        return "a data: URL" if data(arg) else None
    return None


def _cluster(arg: str, g: _Grammar, take: Callable[[], str]) -> str | None:
    """Scan ``-abc``: a switch carrying code, ``""`` to stop scanning, None to go on."""
    plus = arg.startswith("+")
    cluster = arg[1:]
    j = 0
    while j < len(cluster):
        ch = cluster[j]
        j += 1
        if ch in g.inline and not plus:
            return f"-{ch}"
        if ch in g.stop and not plus:
            return ""
        if ch in g.values:
            if not g.clustered_values:
                take()  # a shell's -o NAME: the value is the next argument
                continue
            value = cluster[j:] or take()
        elif ch in g.attached and g.clustered_values:
            if (pattern := g.optional.get(ch)) is not None:
                # A value of a known form (perl -l012), then more switches (-le).
                match = re.match(pattern, cluster[j:])
                j += match.end() if match else 0
                continue
            value = cluster[j:]
        else:
            continue
        if g.data_urls and value.startswith("data:"):
            return f"-{ch} data:"
        if ch in g.code_values and value and not _MODULE.fullmatch(value):
            return f"-{ch} with code"
        return None
    return None


_PS_VALUE: Final = (
    "executionpolicy",
    "configurationname",
    "configurationfile",
    "custompipename",
    "inputformat",
    "outputformat",
    "settingsfile",
    "windowstyle",
    "workingdirectory",
)
_PS_VALUE_ALIASES: Final = frozenset(
    {"ex", "ep", "config", "inp", "if", "o", "of", "settings", "w", "wd", "wo"}
)


def _powershell_inline(args: Sequence[str]) -> str | None:
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if not arg.startswith("-"):
            return None  # the script file; the rest is its own
        name = arg.lstrip("-").split(":", 1)[0].lower()
        if name in ("c", "e", "ec", "cwa") or (
            len(name) >= 3
            and any(
                full.startswith(name)
                for full in ("command", "commandwithargs", "encodedcommand")
            )
        ):
            return arg
        if name in ("f", "file") or (len(name) >= 2 and "file".startswith(name)):
            return None
        if name in _PS_VALUE_ALIASES or (
            len(name) >= 3 and any(full.startswith(name) for full in _PS_VALUE)
        ):
            i += 1
    return None


def _shell_string(name: str, args: Sequence[str]) -> str | None:
    for arg in args:
        if arg == "--" and name != "capsh":
            return None
        if arg == "-c" or arg.startswith(("--command", "--session-command")):
            return arg.split("=", 1)[0]
        if name != "capsh" and re.fullmatch(r"-[a-zA-Z]*c", arg):
            return arg
    return None


class _EnvCall(NamedTuple):
    program: str | None
    args: list[str]
    assignments: dict[str, str]
    cleared: bool
    split_string: bool
    chdir: str | None


def _parse_env(args: Sequence[str]) -> _EnvCall:
    """GNU/BSD ``env [OPTION]... [NAME=VALUE]... [COMMAND [ARG]...]``."""
    assignments: dict[str, str] = {}
    cleared = split = False
    chdir: str | None = None
    i, n = 0, len(args)
    while i < n:
        arg = args[i]
        i += 1
        if arg == "--":
            break
        if arg == "-":
            cleared = True
        elif arg.startswith("--"):
            name, eq, value = arg.partition("=")
            if name == "--ignore-environment":
                cleared = True
            elif name == "--split-string":
                split = True
                i += 0 if eq else 1
            elif name in ("--unset", "--chdir"):
                if not eq:
                    value = args[i] if i < n else ""
                    i += 1
                if name == "--chdir":
                    chdir = value
        elif arg.startswith("-") and len(arg) > 1:
            cluster = arg[1:]
            for j, ch in enumerate(cluster):
                if ch == "i":
                    cleared = True
                elif ch in "uCSP":
                    value = cluster[j + 1 :]
                    if not value:
                        value = args[i] if i < n else ""
                        i += 1
                    split = split or ch == "S"
                    chdir = value if ch == "C" else chdir
                    break
        else:
            i -= 1
            break
    while i < n and "=" in args[i] and not args[i].startswith("="):
        key, _, value = args[i].partition("=")
        assignments[key] = value
        i += 1
    program = args[i] if i < n else None
    return _EnvCall(program, list(args[i + 1 :]), assignments, cleared, split, chdir)


def _env_code(env: Mapping[str, str]) -> str | None:
    """Environment variables that hand a program code to run."""
    for key, value in env.items():
        if key.startswith("BASH_FUNC_"):
            return f"env {key} defines a bash function"
        if key == "NODE_OPTIONS" and (
            "data:" in value
            or re.search(r"(?:^|\s)(?:-e|-p|-pe|--eval|--print)(?:[\s=]|$)", value)
        ):
            return "env NODE_OPTIONS carries code"
        if key in ("BASH_ENV", "ENV") and ("$(" in value or "`" in value):
            return f"env {key} runs a command substitution"
        if key == "PERL5OPT" and re.search(r"[;{}()`$]|-[a-zA-Z]*[eE]", value):
            return "env PERL5OPT carries code"
    return None


# --- daemon start -----------------------------------------------------------------


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


# --- the daemon process -----------------------------------------------------------


def scrub_environment() -> dict[str, str]:
    """Remove every ``MEMORIZZ_*`` variable from ``os.environ``; return them.

    Call it after the configuration (and any key) has been read from them.
    """
    return {
        key: os.environ.pop(key)
        for key in list(os.environ)
        if key.startswith(SCRUBBED_PREFIX)
    }


def set_not_dumpable() -> bool:
    """``prctl(PR_SET_DUMPABLE, 0)`` (Linux): ``/proc/<pid>/environ`` and ptrace
    become root-only. False where it is not available."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    zero = ctypes.c_ulong(0)
    if libc.prctl(ctypes.c_int(PR_SET_DUMPABLE), zero, zero, zero, zero) != 0:
        log.warning(
            "prctl(PR_SET_DUMPABLE, 0) failed: %s", os.strerror(ctypes.get_errno())
        )
        return False
    return True


def harden_process() -> None:
    """The daemon entry point's first act after reading its configuration."""
    removed = scrub_environment()
    dumpable = not set_not_dumpable()
    log.debug(
        "removed %d MEMORIZZ_* variables from the environment; dumpable=%s",
        len(removed),
        dumpable,
    )
