"""DPoP: proof of possession for OAuth tokens (RFC 9449; MCP's
``io.modelcontextprotocol/auth/dpop`` extension, SEP-1932).

When an authorization server advertises ``ES256`` in
``dpop_signing_alg_values_supported``, the daemon asks it for DPoP-bound
tokens: each token request carries a ``DPoP`` proof (a JWS of type
``dpop+jwt`` with the public key in its header, over ``htm``, ``htu``,
``iat`` and a fresh ``jti``), and each request to the MCP server presents
``Authorization: DPoP <token>`` with a fresh proof that also binds the token
(``ath``, the SHA-256 of the token). A server that wants a nonce answers
``use_dpop_nonce`` with a ``DPoP-Nonce`` header (the authorization server
with a 400, the MCP server with a 401 challenge); the request is made once
more with the nonce in the proof, and the nonce is kept per origin for the
next requests (a newer one replaces it).

One key per server: EC P-256, made on first use and kept in the vault
(``server/<name>/oauth/dpop_key``, PEM), so a restart keeps the tokens
bound to it usable; it goes with the server.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from typing import Final

import anyio
import httpx2
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from memorizzd.oauth import jws
from memorizzd.vault import CredentialStore, SecretNotFoundError

ALGORITHM: Final = "ES256"


def dpop_key_ref(server: str) -> str:
    return f"server/{server}/oauth/dpop_key"


def wanted(algorithms: list[str] | tuple[str, ...] | None) -> bool:
    """The authorization server takes DPoP proofs we can make."""
    return bool(algorithms) and ALGORITHM in (algorithms or ())


def htu_of(url: str) -> str:
    """RFC 9449 §4.2: the request URI without query and fragment."""
    parsed = httpx2.URL(url)
    return str(parsed.copy_with(query=None, fragment=None))


def _origin(url: str) -> str:
    parsed = httpx2.URL(url)
    return f"{parsed.scheme}://{parsed.netloc.decode('ascii')}"


def _public_jwk(key: ec.EllipticCurvePrivateKey) -> dict[str, str]:
    numbers = key.public_key().public_numbers()
    return {
        "kty": "EC",
        "crv": "P-256",
        "x": jws.b64url(numbers.x.to_bytes(32, "big")),
        "y": jws.b64url(numbers.y.to_bytes(32, "big")),
    }


class Dpop:
    """One server's DPoP key and the nonces its servers gave."""

    def __init__(self, server: str, vault: CredentialStore) -> None:
        self._server = server
        self._vault = vault
        self._key: ec.EllipticCurvePrivateKey | None = None
        self._nonces: dict[str, str] = {}

    def __repr__(self) -> str:
        return f"Dpop(server={self._server!r})"

    async def proof(
        self, method: str, url: str, *, access_token: str | None = None
    ) -> str:
        """A fresh proof for one request (``ath`` when presenting a token)."""
        key = self._key
        if key is None:
            key = self._key = await anyio.to_thread.run_sync(self._load)
        claims: dict[str, object] = {
            "jti": secrets.token_urlsafe(16),
            "htm": method.upper(),
            "htu": htu_of(url),
            "iat": int(time.time()),
        }
        if access_token is not None:
            digest = hashlib.sha256(access_token.encode("ascii")).digest()
            claims["ath"] = jws.b64url(digest)
        nonce = self._nonces.get(_origin(url))
        if nonce is not None:
            claims["nonce"] = nonce
        header = {"typ": "dpop+jwt", "jwk": _public_jwk(key)}
        return jws.sign(key, claims, header)

    def nonce(self, url: str, value: str) -> bool:
        """Keep a ``DPoP-Nonce`` the server at ``url`` supplied; True if new."""
        origin = _origin(url)
        value = value.strip()[:512]
        if not value or self._nonces.get(origin) == value:
            return False
        self._nonces[origin] = value
        return True

    def _load(self) -> ec.EllipticCurvePrivateKey:
        """The server's key from the vault; made and stored on first use."""
        ref = dpop_key_ref(self._server)
        try:
            loaded = jws.load_key(self._vault.get(ref))
        except SecretNotFoundError:
            loaded = None
        except jws.KeyError_:
            loaded = None  # damaged: a new key (tokens bound to the old one die)
        if isinstance(loaded, ec.EllipticCurvePrivateKey):
            return loaded
        key = ec.generate_private_key(ec.SECP256R1())
        pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ).decode()
        self._vault.put(ref, pem)
        return key
