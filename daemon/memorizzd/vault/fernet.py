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

import base64
import os
import threading
from typing import TYPE_CHECKING, Final

import msgspec

from memorizzd.store import Store
from memorizzd.vault.keys import (
    KEY_FILE,
    KeySource,
    VaultKeyError,
    find_keys,
    load_keys,
    new_primary,
)
from memorizzd.vault.protocol import SecretNotFoundError, VaultError

CANARY_REF: Final = "__canary__"
_CANARY_VALUE: Final = "memorizzd vault canary"
_FERNET_OVERHEAD: Final = 1 + 8 + 16 + 32
"""Version, timestamp, IV and HMAC around a Fernet token's ciphertext."""
_AES_BLOCK: Final = 16


class _Record(msgspec.Struct, frozen=True):
    ref: str
    v: str


_decoder: Final = msgspec.json.Decoder(_Record)

if TYPE_CHECKING:
    from cryptography.fernet import MultiFernet


class FernetCredentialStore:
    """Secrets encrypted with MultiFernet in ``secrets`` of the state database."""

    def __init__(self, store: Store, source: KeySource) -> None:
        self._store = store
        self._source = source
        self._multi: MultiFernet | None = None
        """Made at first use: ``cryptography`` (about 9 MB) loads only when a
        secret is written or read."""
        self._lock = threading.Lock()
        """Every write and delete against a rotation: none lands between the
        rotation's read and its rewrite."""

    @property
    def _fernet(self) -> MultiFernet:
        if self._multi is None:
            self._multi = _multi(self._source)
        return self._multi

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
        from cryptography.fernet import InvalidToken

        try:
            record = _decoder.decode(self._fernet.decrypt(token))
        except InvalidToken:
            if not _whole_token(token):
                raise VaultError(
                    f"secret {ref!r} is damaged (truncated or not a Fernet token):"
                    " set it again"
                ) from None
            raise VaultError(
                f"secret {ref!r} cannot be decrypted with the vault key"
                " (written under another key, or altered)"
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
        with self._lock:
            self._store.delete_secrets([ref])

    def refs(self) -> list[str]:
        return [r for r in self._store.secret_refs() if r != CANARY_REF]

    # --- rotation -------------------------------------------------------------

    def rotate(self, *, new_key: bool = False) -> int:
        """Re-encrypt every secret (and the canary) under the primary key; with
        ``new_key`` (key file only) generate that primary first. Idempotent.

        A row is rewritten only if it still holds the ciphertext read: one
        deleted meanwhile (by another process: ``--forget-secrets``) stays
        deleted, one rewritten stays as written. The rows re-encrypted."""
        with self._lock:
            if new_key:
                self._source = new_primary(self._source)
                self._multi = _multi(self._source)
            rows = self._store.all_secrets()
            tokens = [
                (ref, token, self._encrypt(ref, self._decrypt(ref, token)))
                for ref, token in rows
            ]
            return self._store.rewrite_secrets(tokens)


def keys_for(store: Store, state_dir: str) -> KeySource:
    """``load_keys``, except that a key file is generated only for a vault that
    holds nothing yet.

    A missing key file in front of stored secrets is a lost (or misplaced)
    key, not a first start: a fresh key would not decrypt them, and its "back
    it up" note would mislead whoever restores the old one.
    """
    source = find_keys(state_dir, create=False)
    if source is not None:
        return source
    if store.secret_refs():
        raise VaultKeyError(
            f"key file {os.path.join(state_dir, KEY_FILE)} is missing, and"
            f" {store.path} holds secrets encrypted with it: restore it from your"
            " backup (or set the key that encrypted them), or run"
            " memorizzd --forget-secrets and re-add the credentials"
            " (see docs/auth.md)"
        )
    return load_keys(state_dir)


def _whole_token(token: bytes) -> bool:
    """Whether ``token`` has a Fernet token's shape: version byte, timestamp,
    IV, whole AES blocks and the HMAC (a cut-off one has not, mostly)."""
    try:
        data = base64.urlsafe_b64decode(token)
    except (ValueError, TypeError):
        return False
    body = len(data) - _FERNET_OVERHEAD
    return data[:1] == b"\x80" and body >= _AES_BLOCK and body % _AES_BLOCK == 0


def _multi(source: KeySource) -> MultiFernet:
    from cryptography.fernet import Fernet, MultiFernet

    return MultiFernet([Fernet(key) for key in source.keys])
