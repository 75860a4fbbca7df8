"""Where the vault's Fernet keys come from, and the key file.

Sources, first found wins:

1. ``$CREDENTIALS_DIRECTORY/memorizzd-key`` (systemd ``LoadCredential=`` /
   ``LoadCredentialEncrypted=``),
2. ``MEMORIZZ_MCP_ENCRYPTION_KEY``,
3. ``<state_dir>/vault.key``, generated 0600 on first start.

A source holds one or more Fernet keys separated by commas or newlines: the
first is the primary (it encrypts), the others still decrypt (rotation).
Messages name the source, never a key.
"""

from __future__ import annotations

import base64
import logging
import os
from collections.abc import Mapping
from typing import Final

import msgspec

from memorizzd.state_dir import create_private_file, fsync_dir, write_private_file

log = logging.getLogger("memorizzd.vault")

CREDENTIAL_NAME: Final = "memorizzd-key"
ENV_KEY: Final = "MEMORIZZ_MCP_ENCRYPTION_KEY"
KEY_FILE: Final = "vault.key"


class VaultKeyError(Exception):
    """No usable key: the message names the source, never key material."""


class KeySource(msgspec.Struct, frozen=True):
    name: str
    """Human-readable: ``credential /run/credentials/.../memorizzd-key``, ..."""
    kind: str
    """``credential``, ``environment`` or ``key_file``."""
    keys: tuple[bytes, ...]
    """Primary first. Never logged or shown (``__repr__`` hides them)."""
    path: str | None = None

    def __repr__(self) -> str:
        return f"KeySource({self.name!r}, {len(self.keys)} keys)"


def new_fernet_key() -> bytes:
    """A fresh Fernet key: 32 random bytes, url-safe base64 (what
    ``cryptography``'s ``Fernet.generate_key`` makes, without loading it)."""
    return base64.urlsafe_b64encode(os.urandom(32))


def fernet_key_ok(key: bytes) -> bool:
    """Whether ``key`` is a Fernet key: 32 bytes in url-safe base64 (the check
    ``Fernet(key)`` makes; ``cryptography`` loads only when a secret is used)."""
    try:
        return len(base64.b64decode(key, altchars=b"-_", validate=True)) == 32
    except (ValueError, TypeError):
        return False


def parse_keys(text: str, source: str) -> tuple[bytes, ...]:
    """The Fernet keys in ``text`` (comma- or newline-separated), checked."""
    parts = [p.strip() for p in text.replace("\n", ",").split(",")]
    keys = tuple(p.encode("ascii", "replace") for p in parts if p)
    if not keys:
        raise VaultKeyError(f"{source}: no key in it")
    for i, key in enumerate(keys):
        if not fernet_key_ok(key):
            raise VaultKeyError(
                f"{source}: key {i + 1} is not a Fernet key"
                " (32 url-safe base64-encoded bytes)"
            ) from None
    return keys


def load_keys(state_dir: str, environ: Mapping[str, str] | None = None) -> KeySource:
    """Read the keys from the first source that exists (see the module docstring);
    generate the key file when it is the source and does not exist yet."""
    source = find_keys(state_dir, environ, create=True)
    assert source is not None  # noqa: S101 - create=True always finds one
    return source


def find_keys(
    state_dir: str, environ: Mapping[str, str] | None = None, *, create: bool
) -> KeySource | None:
    """As ``load_keys``; without ``create``, None when the key file is the
    source and does not exist yet (the daemon makes it once it owns the socket).

    Call before ``harden_process`` scrubs ``MEMORIZZ_*`` from the environment.
    """
    env = os.environ if environ is None else environ
    creds = env.get("CREDENTIALS_DIRECTORY")
    if creds:
        path = os.path.join(creds, CREDENTIAL_NAME)
        if os.path.exists(path):
            name = f"credential {path}"
            return KeySource(name, "credential", _read(path, name), path)
    if env.get(ENV_KEY):
        name = f"environment variable {ENV_KEY}"
        return KeySource(name, "environment", parse_keys(env[ENV_KEY], name))
    path = os.path.join(state_dir, KEY_FILE)
    name = f"key file {path}"
    if not os.path.exists(path):
        if not create:
            return None
        _create_key_file(state_dir, path)
    return KeySource(name, "key_file", _read(path, name), path)


def _read(path: str, name: str) -> tuple[bytes, ...]:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return parse_keys(f.read(), name)
    except OSError as exc:
        raise VaultKeyError(f"{name}: cannot read it: {exc.strerror}") from None


def _create_key_file(state_dir: str, path: str) -> None:
    """A new key file, whole or not at all (``create_private_file``): a
    daemon killed while it wrote one in place left it empty, and every later
    start stopped at it ("no key in it", exit 78)."""
    try:
        os.makedirs(state_dir, mode=0o700, exist_ok=True)
        if not create_private_file(path, new_fernet_key() + b"\n"):
            return  # another start made it first
    except OSError as exc:
        raise VaultKeyError(
            f"key file {path}: cannot create it: {exc.strerror}"
        ) from None
    fsync_dir(state_dir)
    log.warning(
        "generated a new vault key in %s: BACK IT UP. Without it the stored"
        " credentials cannot be decrypted (see docs/auth.md)",
        path,
    )


def write_key_file(path: str, keys: tuple[bytes, ...]) -> None:
    """Replace the key file atomically (0600, fsynced), primary first."""
    tmp = f"{path}.tmp"
    write_private_file(tmp, b",".join(keys) + b"\n")
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(path))


def new_primary(source: KeySource) -> KeySource:
    """Key file only: a new primary key in front of the old ones, written first."""
    if source.kind != "key_file" or source.path is None:
        raise VaultKeyError(
            f"a new key can be generated only for the key file; the keys come from"
            f" {source.name}: put the new key first there and restart"
        )
    keys = (new_fernet_key(), *source.keys)
    write_key_file(source.path, keys)
    log.warning(
        "generated a new primary vault key in %s (the old keys still decrypt):"
        " BACK IT UP",
        source.path,
    )
    return msgspec.structs.replace(source, keys=keys)
