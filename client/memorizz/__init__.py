"""memorizz: the client library and wire contract of the memorizzd daemon."""

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
