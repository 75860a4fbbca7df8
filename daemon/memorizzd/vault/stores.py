"""Credential stores besides the vault, and how the daemon combines them.

``[credentials] stores`` (config) names them, in order:

* ``vault``: the encrypted vault in the state database
  (``fernet.FernetCredentialStore``); always present, and the one every
  write goes to.
* ``systemd``: systemd credentials (``LoadCredential=`` /
  ``LoadCredentialEncrypted=``), read-only: the reference ``credential:NAME``
  is the file ``$CREDENTIALS_DIRECTORY/NAME`` (``SystemdCredentialStore``).
  The vault key has its own credential already (``keys.py``,
  ``memorizzd-key``).
* ``module.path:factory``: a deployment's own store (a cloud secret
  manager), made by calling ``factory(config)``; or the name of an entry
  point in the group ``memorizz.credential_stores`` that names such a
  factory. The store it returns implements ``CredentialStore`` and has a
  ``prefix``: references ``PREFIX:NAME`` go to it.

A secret value (a token, a header value, a secret env value, the Cognee
bridge's key) of the form ``PREFIX:NAME`` for a configured store's prefix is
a reference: it is what the config file, ``servers/add`` and the vault hold,
and it is resolved (``CredentialStores.resolve``) only when the server
connects. The value never reaches the config, the state database, a log
line, a status or an error: messages name the reference.
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Final

from memorizzd.config import Config
from memorizzd.vault.keys import VaultKeyError
from memorizzd.vault.protocol import CredentialStore, SecretNotFoundError, VaultError

ENTRY_POINT_GROUP: Final = "memorizz.credential_stores"
SYSTEMD_PREFIX: Final = "credential"
_NAME: Final = re.compile(r"[A-Za-z0-9_.@-]{1,255}")
_PREFIX: Final = re.compile(r"[a-z][a-z0-9-]{0,31}")
_FACTORY: Final = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")
CREDENTIAL_MAX: Final = 64 * 1024


class ReadOnlyStoreError(VaultError):
    """A write to a store that is only read (systemd credentials)."""


class SystemdCredentialStore:
    """systemd credentials: ``credential:NAME`` is ``$CREDENTIALS_DIRECTORY/NAME``.

    Read-only (systemd decrypts ``LoadCredentialEncrypted=`` ones into a
    private, read-only directory before the daemon starts). The file's
    content, without one trailing newline, is the secret."""

    prefix: str = SYSTEMD_PREFIX

    def __init__(self, directory: str | None) -> None:
        self._directory = directory

    def get(self, ref: str) -> str:
        prefix, _, name = ref.partition(":")
        if prefix != self.prefix or not _NAME.fullmatch(name) or name in (".", ".."):
            raise SecretNotFoundError(f"{ref[:80]!r} is not a systemd credential name")
        if not self._directory:
            raise SecretNotFoundError(
                f"secret {ref!r}: no systemd credentials ($CREDENTIALS_DIRECTORY"
                " is not set: LoadCredential= or LoadCredentialEncrypted= in the unit)"
            )
        path = os.path.join(self._directory, name)
        try:
            with open(path, "rb") as f:
                data = f.read(CREDENTIAL_MAX + 1)
        except FileNotFoundError:
            raise SecretNotFoundError(
                f"secret {ref!r}: no credential {name!r} in $CREDENTIALS_DIRECTORY"
            ) from None
        except OSError as exc:
            raise VaultError(
                f"secret {ref!r}: cannot read it: {exc.strerror}"
            ) from None
        if len(data) > CREDENTIAL_MAX:
            raise VaultError(f"secret {ref!r}: larger than {CREDENTIAL_MAX} bytes")
        try:
            text = data.decode()
        except UnicodeDecodeError:
            raise VaultError(f"secret {ref!r}: not UTF-8 text") from None
        text = text.removesuffix("\n")
        if not text:
            raise VaultError(f"secret {ref!r}: the credential is empty")
        return text

    def put(self, ref: str, secret: str) -> None:
        raise ReadOnlyStoreError("systemd credentials are read-only")

    def put_many(self, secrets: dict[str, str]) -> None:
        raise ReadOnlyStoreError("systemd credentials are read-only")

    def delete(self, ref: str) -> None:
        raise ReadOnlyStoreError("systemd credentials are read-only")

    def refs(self) -> list[str]:
        return []


class CredentialStores:
    """The configured stores as one ``CredentialStore``: references
    (``PREFIX:NAME``) go to their store; every other ref, and every write,
    to the vault (``primary``)."""

    def __init__(
        self, primary: CredentialStore, others: Mapping[str, CredentialStore] = {}
    ) -> None:
        self.primary = primary
        self.by_prefix = dict(others)

    def _store_of(self, ref: str) -> CredentialStore | None:
        prefix, sep, _ = ref.partition(":")
        return self.by_prefix.get(prefix) if sep else None

    def is_reference(self, value: str) -> bool:
        return self._store_of(value) is not None

    def resolve(self, value: str) -> str:
        """``value`` itself, or the secret it refers to (``PREFIX:NAME``).
        A systemd credential reference (``credential:NAME``) without the
        systemd store configured is refused: sent as written, it went to the
        server as the secret itself."""
        store = self._store_of(value)
        if store is None and value.startswith(f"{SYSTEMD_PREFIX}:"):
            raise SecretNotFoundError(
                f"secret {value[:80]!r} is a systemd credential reference, but"
                ' [credentials] stores does not include "systemd"'
            )
        return value if store is None else store.get(value)

    def get(self, ref: str) -> str:
        store = self._store_of(ref)
        return (store or self.primary).get(ref)

    def put(self, ref: str, secret: str) -> None:
        self.primary.put(ref, secret)

    def put_many(self, secrets: dict[str, str]) -> None:
        self.primary.put_many(secrets)

    def delete(self, ref: str) -> None:
        self.primary.delete(ref)

    def refs(self) -> list[str]:
        return self.primary.refs()


def resolve_value(vault: CredentialStore, value: str) -> str:
    """A secret value as the server gets it: a reference resolved."""
    if isinstance(vault, CredentialStores):
        return vault.resolve(value)
    return value


def open_stores(
    names: Sequence[str],
    primary: CredentialStore,
    *,
    config: Config,
    environ: Mapping[str, str] | None = None,
) -> CredentialStores:
    """The stores ``names`` configures, around the opened vault. Raises
    ``VaultKeyError`` (a startup error, naming the store) when one cannot be
    loaded."""
    return CredentialStores(
        primary, build_stores(names, config=config, environ=environ)
    )


def build_stores(
    names: Sequence[str],
    *,
    config: Config,
    environ: Mapping[str, str] | None = None,
) -> dict[str, CredentialStore]:
    """The stores ``names`` configures besides the vault, by prefix: each
    plugin store's factory called. The start builds them before it reads or
    makes the vault key, so that a broken store leaves no key behind.
    Raises ``VaultKeyError`` (a startup error, naming the store) when one
    cannot be loaded."""
    env = os.environ if environ is None else environ
    others: dict[str, CredentialStore] = {}
    for name in names:
        if name == "vault":
            continue
        if name == "systemd":
            store: CredentialStore = SystemdCredentialStore(
                env.get("CREDENTIALS_DIRECTORY")
            )
            prefix: str = SYSTEMD_PREFIX
        else:
            store = _load(name, config)
            declared: object = getattr(store, "prefix", None)
            if not isinstance(declared, str) or not _PREFIX.fullmatch(declared):
                raise VaultKeyError(
                    f"credential store {name!r}: its prefix must be lower-case"
                    " letters, digits and '-' (references are PREFIX:NAME)"
                )
            prefix = declared
        if prefix in others:
            raise VaultKeyError(
                f"credential store {name!r}: prefix {prefix!r} is taken"
            )
        others[prefix] = store
    return others


def check_stores(names: Sequence[str]) -> None:
    """Each plugin store's factory found (its module imported, or its entry
    point), none called: what ``--check-config`` can say without opening a
    store (a factory may reach a secret manager). ``VaultKeyError`` as at
    start."""
    for name in names:
        if name not in ("vault", "systemd"):
            _factory(name)


def _factory(name: str) -> Callable[[Config], CredentialStore]:
    try:
        if ":" in name:
            module, _, attr = name.partition(":")
            found_factory: Callable[[Config], CredentialStore] = getattr(
                importlib.import_module(module), attr
            )
            return found_factory
        # Only here: importlib.metadata brings the email package with it
        # (about 1 MB a daemon without plugins need not carry).
        from importlib.metadata import entry_points

        found = entry_points(group=ENTRY_POINT_GROUP, name=name)
        if not found:
            raise VaultKeyError(
                f"credential store {name!r}: no entry point of that name in"
                f" the group {ENTRY_POINT_GROUP}"
            )
        loaded: Callable[[Config], CredentialStore] = next(iter(found)).load()
        return loaded
    except VaultKeyError:
        raise
    except Exception as exc:  # noqa: BLE001 - a plugin's failure, named
        raise VaultKeyError(
            f"credential store {name!r}: cannot load it: {type(exc).__name__}"
        ) from None


def _load(name: str, config: Config) -> CredentialStore:
    factory = _factory(name)
    try:
        store = factory(config)
    except Exception as exc:  # noqa: BLE001 - a plugin's failure, named, at start
        raise VaultKeyError(
            f"credential store {name!r}: cannot load it: {type(exc).__name__}"
        ) from None
    for method in ("get", "put", "put_many", "delete", "refs"):
        if not callable(getattr(store, method, None)):
            raise VaultKeyError(
                f"credential store {name!r}: {method}() missing (see docs/auth.md,"
                " CredentialStore)"
            )
    return store
