"""memorizz: the client library and wire contract of the memorizzd daemon.

The names below are imported on first use (PEP 562), so that importing a
submodule, ``memorizz.cli`` above all, does not import the client and msgspec
with it: ``memorizzctl``'s one-shot call needs neither.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from memorizz.api.errors import (
        DaemonUnreachableError,
        MemorizzError,
        RemoteError,
    )
    from memorizz.api.protocol import PROTOCOL_VERSION
    from memorizz.client import Client

__version__ = "0.1.0"

__all__ = [
    "PROTOCOL_VERSION",
    "Client",
    "DaemonUnreachableError",
    "MemorizzError",
    "RemoteError",
    "__version__",
]

_HOMES = {
    "PROTOCOL_VERSION": "memorizz.api.protocol",
    "Client": "memorizz.client",
    "DaemonUnreachableError": "memorizz.api.errors",
    "MemorizzError": "memorizz.api.errors",
    "RemoteError": "memorizz.api.errors",
}


def __getattr__(name: str) -> object:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'memorizz' has no attribute {name!r}")
    value: object = getattr(__import__(home, fromlist=[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])
