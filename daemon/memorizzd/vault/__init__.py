"""The vault: secrets (bearer tokens, header values, secret env values) at rest.

``protocol`` (``CredentialStore``: what a secret store offers), ``fernet``
(the default: MultiFernet ciphertexts in the state database, each bound to its
ref, a canary checked at start), ``keys`` (where the key comes from), and
``server_secrets`` (which refs a server's secrets live under, moving inline
secrets out of a spec and resolving them again at connect).
"""

from memorizzd.vault.fernet import CANARY_REF, FernetCredentialStore, keys_for
from memorizzd.vault.keys import KeySource, VaultKeyError, find_keys, load_keys
from memorizzd.vault.protocol import CredentialStore, SecretNotFoundError, VaultError
from memorizzd.vault.server_secrets import (
    ServerSecrets,
    extract_secrets,
    resolve_secrets,
    server_refs,
    stripped,
)

__all__ = [
    "CANARY_REF",
    "CredentialStore",
    "FernetCredentialStore",
    "KeySource",
    "SecretNotFoundError",
    "ServerSecrets",
    "VaultError",
    "VaultKeyError",
    "extract_secrets",
    "find_keys",
    "keys_for",
    "load_keys",
    "resolve_secrets",
    "server_refs",
    "stripped",
]
