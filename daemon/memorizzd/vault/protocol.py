"""The ``CredentialStore`` protocol: what the daemon needs from a secret store."""

from __future__ import annotations

from typing import Protocol


class VaultError(Exception):
    """A secret cannot be read; the message names the ref, never the value."""


class SecretNotFoundError(VaultError):
    """No secret under this ref."""


class CredentialStore(Protocol):
    """Where secrets live. Synchronous: the daemon calls it from worker threads.

    Refs are stable names such as ``server/<name>/token`` (the vault's), or
    references ``PREFIX:NAME`` for a store with a ``prefix`` (``credential:``
    for systemd credentials). Implementations: ``FernetCredentialStore`` (the
    vault, the one written to), ``stores.SystemdCredentialStore`` (read-only),
    a deployment's own (``[credentials] stores``, docs/auth.md), and
    ``stores.CredentialStores``, which routes among them.

    The contract: ``get`` raises ``SecretNotFoundError`` for a ref it does not
    hold and ``VaultError`` when it cannot read one, with messages that name
    the ref and never a value; a read-only store raises ``VaultError`` from
    the writes and lists no refs. A store keeps no secret in its ``repr``.
    """

    def put(self, ref: str, secret: str) -> None: ...

    def put_many(self, secrets: dict[str, str]) -> None:
        """Store several at once (all or none where the store can)."""
        ...

    def get(self, ref: str) -> str:
        """The secret; ``SecretNotFoundError`` when absent, ``VaultError`` when unreadable."""
        ...

    def delete(self, ref: str) -> None:
        """Forget it; no error when absent."""
        ...

    def refs(self) -> list[str]:
        """Every stored ref (never values)."""
        ...
