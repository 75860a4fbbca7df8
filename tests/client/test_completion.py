"""``memorizzctl completion bash|zsh`` (issue 13, item 9): a script made from
the argparse tree that the shell accepts and that completes commands, their
subcommands and options, run by a real bash with ``COMP_WORDS`` set."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

MEMORIZZCTL = str(Path(sys.executable).with_name("memorizzctl"))
BASH = shutil.which("bash") or "/bin/bash"


def script(shell: str) -> str:
    done = subprocess.run(
        [MEMORIZZCTL, "--socket", "/nonexistent/d.sock", "completion", shell],
        capture_output=True,
        text=True,
        check=True,  # no daemon needed
    )
    return done.stdout


def complete(*words: str) -> list[str]:
    """What bash offers for the last of ``words`` (the line so far)."""
    line = " ".join(f"'{w}'" for w in ("memorizzctl", *words))
    program = (
        script("bash")
        + f"COMP_WORDS=({line}); COMP_CWORD={len(words)}; _memorizzctl;"
        + ' printf "%s\\n" "${COMPREPLY[@]}"'
    )
    done = subprocess.run(
        [BASH, "--norc", "--noprofile", "-c", program],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.split()


def test_bash_accepts_the_script() -> None:
    subprocess.run([BASH, "-n"], input=script("bash"), text=True, check=True)


def test_zsh_accepts_its_script() -> None:
    text = script("zsh")
    assert text.startswith("#compdef memorizzctl\n")
    zsh = shutil.which("zsh")
    if zsh is None:
        if os.geteuid() == 0 or os.environ.get("CI"):
            pytest.fail("zsh is not installed: scripts/bootstrap installs it as root")
        pytest.skip("zsh is not installed (scripts/bootstrap installs it as root)")
    subprocess.run([zsh, "-n"], input=text, text=True, check=True)


def test_it_completes_commands_subcommands_and_options() -> None:
    assert complete("") == [
        "audit",
        "completion",
        "daemon",
        "mcp",
        "ping",
        "vault",
        "--help",
        "--json",
        "--socket",
        "--version",
    ]
    assert complete("m") == ["mcp"]
    assert complete("mcp", "ca") == ["call", "cancel"]
    assert complete("--socket", "/x.sock", "daemon", "re") == ["reload"]
    assert complete("mcp", "call", "--ti") == ["--timeout"]
    assert complete("completion", "") == ["bash", "zsh", "--help", "--json", "--socket"]
