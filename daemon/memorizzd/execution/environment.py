"""Environment variables in a stdio server's spec that bring code with them.

* ``LOADER_ENV`` (``LD_PRELOAD``, ``LD_AUDIT``, ``LD_LIBRARY_PATH``) load code
  into the allowed executable: refused with a stdio allowlist.
* ``env_code`` finds variables that hand a program code to run:
  ``NODE_OPTIONS`` with ``--eval``/``--print``/``data:``, ``BASH_ENV``/``ENV``
  with command substitution, ``PERL5OPT`` with code, exported bash functions
  (``BASH_FUNC_*``). Refused unless ``stdio_allow_inline_code``.

Both apply to the server's ``env`` and to assignments made through ``env``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

LOADER_ENV: Final = ("LD_PRELOAD", "LD_AUDIT", "LD_LIBRARY_PATH")
"""Variables that make the dynamic loader run other code in a program."""


def env_code(env: Mapping[str, str]) -> str | None:
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
