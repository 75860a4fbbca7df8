"""What a login leaves behind: the grant and the client registration, in the vault.

Both are JSON under the server's refs (``server/<name>/oauth/...``), so they
are encrypted, bound to their record, removed with the server and rotated with
the vault key. ``expires_at`` is wall-clock time: it must survive a restart.
"""

from __future__ import annotations

from typing import Final, TypeVar

import msgspec

from memorizzd.vault import CredentialStore, SecretNotFoundError

_encoder: Final = msgspec.json.Encoder()
T = TypeVar("T")


class Grant(msgspec.Struct, kw_only=True, frozen=True):
    """An OAuth grant for one server: tokens plus everything a refresh needs."""

    access_token: str
    refresh_token: str | None = None
    expires_at: float | None = None
    """Unix time the access token expires (None: the server did not say)."""
    obtained_at: float
    scope: str | None = None
    issuer: str
    token_endpoint: str
    revocation_endpoint: str | None = None
    resource: str
    client_id: str
    client_secret: str | None = None
    auth_method: str = "none"
    dpop: bool = False
    """The token is DPoP-bound (``token_type`` ``DPoP``, RFC 9449): bound to
    the server's DPoP key (``oauth.dpop``), presented with a proof on every
    request."""
    grant_type: str = "authorization_code"
    """``client_credentials``: renewed by asking again, with the client's
    credentials from the vault (never stored here), not by a refresh token."""
    login_required: bool = False
    """The authorization server refused the refresh token (``invalid_grant``):
    only a new login helps. Kept so that a restart does not try again."""

    def __repr__(self) -> str:  # never the tokens
        return (
            f"Grant(issuer={self.issuer!r}, client_id={self.client_id!r}, "
            f"expires_at={self.expires_at!r}, scope={self.scope!r})"
        )


class Registration(msgspec.Struct, kw_only=True, frozen=True):
    """A client identity obtained from one authorization server (RFC 7591)."""

    issuer: str
    client_id: str
    client_secret: str | None = None
    auth_method: str = "none"
    redirect_uri: str

    def __repr__(self) -> str:
        return f"Registration(issuer={self.issuer!r}, client_id={self.client_id!r})"


def grant_ref(server: str) -> str:
    return f"server/{server}/oauth/grant"


def registration_ref(server: str) -> str:
    return f"server/{server}/oauth/client"


def load_grant(vault: CredentialStore, server: str) -> Grant | None:
    return _load(vault, grant_ref(server), Grant)


def save_grant(vault: CredentialStore, server: str, grant: Grant) -> None:
    """Durable when this returns (the vault writes with synchronous=FULL)."""
    vault.put(grant_ref(server), _encoder.encode(grant).decode())


def delete_grant(vault: CredentialStore, server: str) -> None:
    vault.delete(grant_ref(server))


def load_registration(vault: CredentialStore, server: str) -> Registration | None:
    return _load(vault, registration_ref(server), Registration)


def save_registration(
    vault: CredentialStore, server: str, registration: Registration
) -> None:
    vault.put(registration_ref(server), _encoder.encode(registration).decode())


def _load(vault: CredentialStore, ref: str, kind: type[T]) -> T | None:
    try:
        raw = vault.get(ref)
    except SecretNotFoundError:
        return None
    try:
        return msgspec.json.decode(raw, type=kind)
    except msgspec.DecodeError:
        return None  # an older or damaged record: as good as none
