"""The MCP SDK's client side, without its server side, in the daemon's process.

The daemon is an MCP *client* of its HTTP upstreams (``upstream/mcp_sdk.py``,
``oauth/mcp_sdk.py``). But ``import mcp`` runs the package's ``__init__``,
which imports the SDK's server (``mcp.server``: Starlette, uvicorn, click,
the server's pydantic models), and ``mcp.client.client`` names
``mcp.server.Server`` and ``MCPServer`` for its in-process transport (a
server object in the same process, for tests). Measured on the dev VM: the
two adapters cost the daemon 38 MB of RSS with the server side, 23 MB
without it.

``install()`` is called by the daemon's entry point (``__main__``), once,
before anything imports the SDK. From then on, in this process:

- ``mcp`` is the package without its ``__init__``'s re-exports: the adapters
  import every name from the module that defines it;
- ``mcp.server`` and everything below it are placeholder modules: any name
  imported from them is an inert class that refuses to be made or called.
  ``mcp.client.client`` only tests a server argument against them
  (``isinstance``); the daemon never passes one.

Nothing else changes: the client modules are the SDK's own, unmodified.
Tests that build the daemon's parts in their own process (tests/component)
keep the whole SDK, since they also run SDK servers. If the SDK's layout is
not what this expects, ``install`` changes nothing and the SDK loads whole.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import sys
from types import ModuleType
from typing import Any

log = logging.getLogger("memorizzd.sdk")

SERVER_SIDE = "mcp.server"


class ServerSideNotLoaded(RuntimeError):
    """Something in the daemon reached for the SDK's server side."""


def _placeholder(module: str, name: str) -> type:
    def refuse(*_args: object, **_kwargs: object) -> Any:
        raise ServerSideNotLoaded(
            f"{module}.{name} is part of the MCP SDK's server side, which the"
            " daemon does not load (memorizzd/sdk_client_side.py)"
        )

    return type(name, (), {"__module__": module, "__new__": refuse})


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``mcp`` without its ``__init__``; ``mcp.server*`` as placeholders."""

    def __init__(self, locations: list[str]) -> None:
        self._locations = locations

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname == "mcp":
            spec = importlib.machinery.ModuleSpec(fullname, self, is_package=True)
            spec.submodule_search_locations = list(self._locations)
            return spec
        if fullname == SERVER_SIDE or fullname.startswith(SERVER_SIDE + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None  # the default module

    def exec_module(self, module: ModuleType) -> None:
        name = module.__name__
        if name == "mcp":
            return  # its submodules load as usual; its __init__ does not run

        def placeholder(attribute: str) -> type:
            if attribute.startswith("__"):
                raise AttributeError(attribute)
            made = _placeholder(name, attribute)
            setattr(module, attribute, made)
            return made

        module.__getattr__ = placeholder  # type: ignore[method-assign]


def install() -> bool:
    """Load only the SDK's client side from now on (False: left as it was,
    because the SDK is already loaded or not installed)."""
    if "mcp" in sys.modules or any(
        isinstance(finder, _Finder) for finder in sys.meta_path
    ):
        return False
    spec = importlib.machinery.PathFinder.find_spec("mcp")
    if spec is None or not spec.submodule_search_locations:
        return False
    sys.meta_path.insert(0, _Finder(list(spec.submodule_search_locations)))
    return True
