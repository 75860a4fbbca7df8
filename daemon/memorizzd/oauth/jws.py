"""Signed JWTs the OAuth client makes: ``private_key_jwt`` client assertions
(RFC 7523 §2.2, OpenID Connect Core §9).

Compact JWS over ``cryptography`` keys: ES256 (P-256), RS256 (RSA) and
EdDSA (Ed25519), chosen by the key. The key is the operator's, read from the
vault just before use; nothing here logs or formats it.
"""

from __future__ import annotations

import base64
import secrets
import time
from typing import Any, Final

import msgspec
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

ASSERTION_TYPE: Final = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
ASSERTION_LIFETIME_S: Final = 60
_encoder: Final = msgspec.json.Encoder()

SigningKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey | ed25519.Ed25519PrivateKey


class KeyError_(ValueError):
    """The private key cannot sign (unreadable, encrypted, or of another kind)."""


def load_key(pem: str) -> SigningKey:
    """A PEM private key (PKCS#8 or traditional), unencrypted."""
    try:
        key = serialization.load_pem_private_key(pem.encode(), password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        raise KeyError_(
            "the private key is not an unencrypted PEM private key"
        ) from None
    if isinstance(key, ec.EllipticCurvePrivateKey):
        if not isinstance(key.curve, ec.SECP256R1):
            raise KeyError_(f"EC keys must be P-256 (ES256), not {key.curve.name}")
        return key
    if isinstance(key, rsa.RSAPrivateKey | ed25519.Ed25519PrivateKey):
        return key
    raise KeyError_("the private key must be EC P-256, RSA or Ed25519")


def algorithm_of(key: SigningKey) -> str:
    if isinstance(key, ec.EllipticCurvePrivateKey):
        return "ES256"
    if isinstance(key, rsa.RSAPrivateKey):
        return "RS256"
    return "EdDSA"


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def sign(key: SigningKey, claims: dict[str, Any], header: dict[str, Any]) -> str:
    """The compact serialization of a JWS over ``claims``."""
    head = {"alg": algorithm_of(key), **header}
    signing_input = (
        b64url(_encoder.encode(head)) + "." + b64url(_encoder.encode(claims))
    ).encode()
    if isinstance(key, ec.EllipticCurvePrivateKey):
        r, s = decode_dss_signature(key.sign(signing_input, ec.ECDSA(hashes.SHA256())))
        signature = r.to_bytes(32, "big") + s.to_bytes(32, "big")
    elif isinstance(key, rsa.RSAPrivateKey):
        signature = key.sign(signing_input, padding.PKCS1v15(), hashes.SHA256())
    else:
        signature = key.sign(signing_input)
    return signing_input.decode() + "." + b64url(signature)


def client_assertion(pem: str, *, client_id: str, audience: str) -> str:
    """RFC 7523 §3: ``iss`` = ``sub`` = the client, ``aud`` = the authorization
    server's issuer, short-lived, a fresh ``jti``."""
    now = int(time.time())
    claims = {
        "iss": client_id,
        "sub": client_id,
        "aud": audience,
        "iat": now,
        "exp": now + ASSERTION_LIFETIME_S,
        "jti": secrets.token_urlsafe(16),
    }
    return sign(load_key(pem), claims, {"typ": "JWT"})
