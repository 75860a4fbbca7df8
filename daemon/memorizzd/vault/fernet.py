"""The default ``CredentialStore``: MultiFernet ciphertexts in the state database.

Each ciphertext binds its record: the plaintext is ``{"ref": ref, "v": secret}``
and a decrypted ref must equal the row's, so a ciphertext copied or swapped
into another row is detected. A canary record (``CANARY_REF``), written with
the first secret, is decrypted at every start: a wrong key is a startup error,
never silent data loss. A vault that holds nothing is not touched at start
(Fernet's first use initializes the OpenSSL bundled with ``cryptography``,
about 1.2 MB of the daemon's memory, which a host without secrets need not pay).
"""

from __future__ import annotations

import threading
from typing import Final

import msgspec
from cryptography.fernet import Fernet, InvalidToken, MultiFernet

from memorizzd.store import Store
from memorizzd.vault.keys import KeySource, VaultKeyError, new_primary
from memorizzd.vault.protocol import SecretNotFoundError, VaultError

CANARY_REF: Final = "__canary__"
_CANARY_VALUE: Final = "memorizzd vault canary"


class _Record(msgspec.Struct, frozen=True):
    ref: str
    v: str


_decoder: Final = msgspec.json.Decoder(_Record)


class FernetCredentialStore:
    """Secrets encrypted with MultiFernet in ``secrets`` of the state database."""

    def __init__(self, store: Store, source: KeySource) -> None:
        self._store = store
        self._source = source
        self._fernet = _multi(source)
        self._lock = threading.Lock()  # rotation against writers

    @property
    def source(self) -> KeySource:
        return self._source

    @classmethod
    def open(cls, store: Store, source: KeySource) -> FernetCredentialStore:
        """Open the vault; check the key against the canary, if there is one yet.

        Raises ``VaultKeyError`` (naming the key source) when the key does not
        decrypt the canary.
        """
        vault = cls(store, source)
        token = store.secret(CANARY_REF)
        if token is None:
            return vault  # empty: the canary is written with the first secret
        try:
            value = vault._decrypt(CANARY_REF, token)
        except VaultError:
            value = None
        if value != _CANARY_VALUE:
            raise VaultKeyError(
                f"the vault key from {source.name} does not decrypt the secrets in"
                f" {store.path} (wrong or missing key; see docs/auth.md)"
            )
        return vault

    def _encrypt(self, ref: str, secret: str) -> bytes:
        return self._fernet.encrypt(msgspec.json.encode(_Record(ref, secret)))

    def _decrypt(self, ref: str, token: bytes) -> str:
        try:
            record = _decoder.decode(self._fernet.decrypt(token))
        except InvalidToken:
            raise VaultError(
                f"secret {ref!r} cannot be decrypted with the vault key"
            ) from None
        except msgspec.DecodeError:
            raise VaultError(f"secret {ref!r} is malformed") from None
        if record.ref != ref:
            raise VaultError(
                f"secret {ref!r} holds a ciphertext of another record (swapped?)"
            )
        return record.v

    # --- CredentialStore ------------------------------------------------------

    def put(self, ref: str, secret: str) -> None:
        self.put_many({ref: secret})

    def put_many(self, secrets: dict[str, str]) -> None:
        with self._lock:
            if self._store.secret(CANARY_REF) is None:
                secrets = {CANARY_REF: _CANARY_VALUE, **secrets}
            tokens = [(ref, self._encrypt(ref, v)) for ref, v in secrets.items()]
            self._store.put_secrets(tokens)

    def get(self, ref: str) -> str:
        token = self._store.secret(ref)
        if token is None:
            raise SecretNotFoundError(f"secret {ref!r} is not in the vault")
        return self._decrypt(ref, token)

    def delete(self, ref: str) -> None:
        self._store.delete_secrets([ref])

    def refs(self) -> list[str]:
        return [r for r in self._store.secret_refs() if r != CANARY_REF]

    # --- rotation -------------------------------------------------------------

    def rotate(self, *, new_key: bool = False) -> int:
        """Re-encrypt every secret (and the canary) under the primary key; with
        ``new_key`` (key file only) generate that primary first. Idempotent."""
        with self._lock:
            if new_key:
                self._source = new_primary(self._source)
                self._fernet = _multi(self._source)
            rows = self._store.all_secrets()
            tokens = [
                (ref, self._encrypt(ref, self._decrypt(ref, token)))
                for ref, token in rows
            ]
            self._store.put_secrets(tokens)
        return len(tokens)


def _multi(source: KeySource) -> MultiFernet:
    return MultiFernet([Fernet(key) for key in source.keys])
