"""Every ``memorizzctl`` command line the docs show is one the real command
line takes, so a reader who copies one gets no usage error.

The lines are read from README.md and docs/*.md (``tests/doc_blocks.py``):
``console`` blocks' ``$ `` lines, ``sh`` blocks' lines, the ``"command":
"memorizzctl", "args": [...]`` of an MCP client's configuration, and the
inline code spans that start ``memorizzctl``. Each is parsed by the parser
``memorizzctl`` itself builds (``memorizz.ctl.parser.build_parser``, after
``split_trailing``, as ``memorizz.ctl.run`` does), and an ``mcp add`` line
is also turned into its ``ServerSpec`` and checked as the daemon checks
``servers/add`` (``build_server_spec``, with the preset the line names).

Not run, but checked all the same:

* a synopsis (``[--ttl MS]``, ``(--prompt NAME | --resource-template URI)``,
  ``get|result|cancel``, an elided ``...``): its command exists and each
  option it names is one of that command's;
* an inline span that names a command in a sentence (`` `memorizzctl mcp
  login` ``) and lacks the arguments the command requires, or gives a
  placeholder where a number goes (``--timeout N``): as a synopsis;
* an ``mcp add`` line with a placeholder (``URL``, ``NAME``): parsed, and its
  spec may fail the daemon's checks (a placeholder is no URL).
"""

from __future__ import annotations

import argparse
import io
import re
from pathlib import Path

import pytest

from memorizz.api.presets import BY_NAME
from memorizz.ctl.add import build_server_spec
from memorizz.ctl.args import split_trailing
from memorizz.ctl.exits import UsageError
from memorizz.ctl.parser import _words, build_parser
from tests.doc_blocks import ROOT, Command, all_commands

COMMANDS = all_commands()
_PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*$|^p_\.\.\.$")
"""A word that stands for a value the reader fills in (``URL``, ``CLIENT_ID``)."""


def _words_by_command() -> dict[str, set[str]]:
    found: dict[str, str] = {}
    _words(build_parser(), "", found)
    return {path: set(words.split()) for path, words in found.items()}


WORDS = _words_by_command()
"""Each command path ("" for the top, "mcp add", ...) -> its subcommands and
options: what the completion script offers."""


def _expanded(value: str) -> str:
    """The shell's expansion of a doc's variables: ``$PWD`` is the checkout
    (the tour runs from it); ``~`` a home; any other variable a value."""
    value = value.replace("$PWD", str(ROOT))
    value = re.sub(r"^~(?=/)", "/home/reader", value)
    return re.sub(r"\$\{?[A-Za-z_][A-Za-z0-9_]*\}?", "value", value)


def _parse(argv: list[str]) -> tuple[argparse.Namespace | None, int | None]:
    """The namespace, or the exit status of a usage error or ``--help``."""
    head, trailing = split_trailing(argv)
    try:
        args = build_parser().parse_args(head)
    except SystemExit as exc:
        return None, exc.code if isinstance(exc.code, int) else 2
    args.trailing = trailing
    return args, None


def _check_as_synopsis(command: Command) -> None:
    """The command the words name exists, and so does each option they name
    there (a synopsis's ``get|result`` is each of them)."""
    paths = [""]
    for word in command.argv:
        if word.startswith("-"):
            break
        names = word.split("|")
        if not all(name in WORDS.get(paths[0], ()) for name in names):
            break  # a positional argument: the command path ends here
        paths = [f"{path} {name}".strip() for path in paths for name in names]
    assert paths != [""] or command.argv[0].startswith("-"), (
        f"{command.where}: `memorizzctl {' '.join(command.argv)}` names no command"
    )
    for path in paths:
        assert path in WORDS, f"{command.where}: no command `memorizzctl {path}`"
        options = {w.split("=")[0] for w in command.argv if w.startswith("--")}
        unknown = sorted(options - WORDS[path] - WORDS[""] - {"--help"})
        assert not unknown, (
            f"{command.where}: `memorizzctl {path}` has no option {', '.join(unknown)}"
        )


def _check_spec(
    command: Command,
    args: argparse.Namespace,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``mcp add``: the spec the line describes passes the daemon's checks.
    A secret read from stdin (``-``) is a value on stdin; a file the line
    names (``--token-file``, ``--private-key-file``) is one of the right
    kind in its place."""
    monkeypatch.setattr("sys.stdin", io.StringIO("a-secret\n"))
    if args.token_file is not None:
        path = tmp_path / "token"
        path.write_text("a-token\n")
        args.token_file = str(path)
    if args.private_key_file is not None:
        path = tmp_path / "key.pem"
        path.write_text(
            "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIA==\n-----END PRIVATE KEY-----\n"
        )
        args.private_key_file = str(path)
    preset = None
    if args.preset is not None:
        preset = BY_NAME.get(args.preset)
        assert preset is not None, f"{command.where}: no preset {args.preset!r}"
    try:
        build_server_spec(args, preset)
    except UsageError as exc:
        if any(_PLACEHOLDER.match(word) for word in command.argv[2:]):
            return  # `--url URL`: a placeholder is no URL
        pytest.fail(f"{command.where}: `{command.source}`: {exc}")


@pytest.mark.parametrize(
    "command", COMMANDS, ids=[f"{c.where}:{' '.join(c.argv)[:40]}" for c in COMMANDS]
)
def test_every_memorizzctl_line_in_the_docs_parses(
    command: Command,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if command.synopsis:
        _check_as_synopsis(command)
        return
    argv = [_expanded(word) for word in command.argv]
    args, status = _parse(argv)
    if status is not None:
        err = capsys.readouterr().err
        if status == 0:  # --help
            return
        missing = "the following arguments are required" in err
        placeholder = any(_PLACEHOLDER.match(word) for word in argv)
        if not command.fenced and (missing or placeholder):
            _check_as_synopsis(command)  # a command named in a sentence
            return
        pytest.fail(f"{command.where}: `{command.source}` is refused:\n{err}")
    assert args is not None
    if argv[:2] == ["mcp", "add"]:
        monkeypatch.chdir(tmp_path)  # a relative --cwd or file is the reader's
        _check_spec(command, args, tmp_path, monkeypatch)


def test_the_docs_show_commands_of_every_kind() -> None:
    """The reader finds what the test checks: a test that found no line
    would pass whatever the docs say."""
    fenced = [c for c in COMMANDS if c.fenced]
    assert len(fenced) >= 70
    assert len(COMMANDS) - len(fenced) > 60  # inline spans
    shown = {" ".join(c.argv[:2]) for c in COMMANDS}
    for command in ("mcp add", "mcp call", "mcp serve", "daemon status", "audit"):
        assert any(s.startswith(command) for s in shown), command
    configured = [c for c in COMMANDS if '"mcp"' in c.source]
    assert len(configured) >= 7  # the MCP clients' configurations
    assert sum(c.synopsis for c in COMMANDS) >= 5


def test_a_wrong_line_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """The check refuses what memorizzctl refuses: an unknown option, a
    misspelled command, an option of another command, a bad value."""
    for argv in (
        ["mcp", "call", "demo", "echo", "--argument", "{}"],
        ["mcp", "lst"],
        ["mcp", "list", "--approver", "x"],
        ["mcp", "call", "demo", "echo", "--arguments", "{not json"],
        ["mcp", "add", "x", "--url", "https://x", "--oauth-grant", "password"],
    ):
        assert _parse(argv)[1] == 2, argv
    capsys.readouterr()
    with pytest.raises(AssertionError, match="no option --ttl-ms"):
        _check_as_synopsis(
            Command("here", ("mcp", "call", "S", "T", "--ttl-ms"), "", synopsis=True)
        )
    with pytest.raises(AssertionError, match="names no command"):
        _check_as_synopsis(Command("here", ("mcpp", "add"), "", synopsis=True))
