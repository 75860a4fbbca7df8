"""A DPoP world on 127.0.0.1 (RFC 9449): an authorization server that issues
DPoP-bound tokens and an MCP server (the SDK's, behind a DPoP gate) on one
origin. Proofs are checked here with PyJWT, never with the daemon's code:
``typ`` ``dpop+jwt``, the ``jwk`` header (public only), the signature,
``htm``, ``htu`` (no query or fragment), ``iat``, a ``jti`` never seen
before, and at the MCP server ``ath`` and the token's bound key thumbprint.

``require_nonce``: both servers first answer ``use_dpop_nonce`` with a
``DPoP-Nonce`` (the authorization server a 400, the MCP server a 401
challenge) and want that nonce in every later proof. ``events`` records what
happened (``as-nonce``, ``rs-nonce``, ``token:<grant_type>``, ``mcp``,
``refused:<why>``).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import secrets
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlencode

import jwt
import msgspec
from mcp.server.mcpserver import MCPServer
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from tests.harness import serve_asgi

AS_NONCE = "as-nonce-3f1"
RS_NONCE = "rs-nonce-9c2"


def thumbprint(jwk: dict[str, Any]) -> str:
    """RFC 7638 for an EC key."""
    canonical = msgspec.json.encode({k: jwk[k] for k in ("crv", "kty", "x", "y")})
    digest = hashlib.sha256(canonical).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


class DpopWorld:
    __test__ = False

    def __init__(self, *, require_nonce: bool = False, advertise: bool = True) -> None:
        self.require_nonce = require_nonce
        self.advertise = advertise
        self.codes: set[str] = set()
        self.bound: dict[str, str] = {}
        """Access token -> the thumbprint of the key it is bound to."""
        self.refresh: dict[str, str] = {}
        self.jtis: set[str] = set()
        self.events: list[str] = []
        self.schemes: list[str] = []
        self.reject_access = False

    def check_proof(
        self, proof: str | None, method: str, url: str
    ) -> tuple[dict[str, Any], str] | str:
        """(claims, thumbprint), or why the proof is refused."""
        if not proof or "," in proof:
            return "missing or multiple proofs"
        try:
            header = jwt.get_unverified_header(proof)
        except jwt.PyJWTError:
            return "not a JWT"
        jwk = header.get("jwk")
        if header.get("typ") != "dpop+jwt" or not isinstance(jwk, dict) or "d" in jwk:
            return "bad header"
        try:
            key = jwt.PyJWK(jwk, algorithm=header.get("alg"))
            claims = jwt.decode(proof, key=key.key, algorithms=["ES256"])
        except jwt.PyJWTError as exc:
            return f"signature: {exc}"
        if claims.get("htm") != method or claims.get("htu") != url:
            return f"htm/htu {claims.get('htm')} {claims.get('htu')}"
        if abs(time.time() - claims.get("iat", 0)) > 60:
            return "iat"
        jti = claims.get("jti")
        if not isinstance(jti, str) or jti in self.jtis:
            return "jti reused"
        self.jtis.add(jti)
        return claims, thumbprint(jwk)

    def app(self, base: str) -> Any:
        mcp = MCPServer("dpop", log_level="WARNING")

        @mcp.tool()
        def whoami() -> str:
            """Who we are."""
            return "dpop-authorized"

        mcp_app = mcp.streamable_http_app()
        resource = base + "/mcp"

        async def prm(request: Request) -> Response:
            return JSONResponse({"resource": resource, "authorization_servers": [base]})

        async def metadata(request: Request) -> Response:
            document: dict[str, Any] = {
                "issuer": base,
                "authorization_endpoint": f"{base}/authorize",
                "token_endpoint": f"{base}/token",
                "response_types_supported": ["code"],
                "code_challenge_methods_supported": ["S256"],
                "token_endpoint_auth_methods_supported": ["none"],
            }
            if self.advertise:
                document["dpop_signing_alg_values_supported"] = ["ES256"]
            return JSONResponse(document)

        async def authorize(request: Request) -> Response:
            q = request.query_params
            code = secrets.token_urlsafe(16)
            self.codes.add(code)
            query = urlencode({"code": code, "state": q["state"]})
            return RedirectResponse(f"{q['redirect_uri']}?{query}", status_code=302)

        async def token(request: Request) -> Response:
            body = (await request.body()).decode()
            form = {k: v[0] for k, v in parse_qs(body).items()}
            grant = form.get("grant_type", "")
            checked = self.check_proof(
                request.headers.get("dpop"), "POST", f"{base}/token"
            )
            if isinstance(checked, str):
                if not self.advertise and "dpop" not in request.headers:
                    return self._bearer_token(form)
                self.events.append(f"refused:{checked}")
                return JSONResponse(
                    {"error": "invalid_dpop_proof", "error_description": checked},
                    status_code=400,
                )
            claims, jkt = checked
            if self.require_nonce and claims.get("nonce") != AS_NONCE:
                self.events.append("as-nonce")
                return JSONResponse(
                    {"error": "use_dpop_nonce"},
                    status_code=400,
                    headers={"DPoP-Nonce": AS_NONCE},
                )
            if grant == "authorization_code":
                if form.get("code") not in self.codes:
                    return JSONResponse({"error": "invalid_grant"}, status_code=400)
                self.codes.discard(form["code"])
            elif grant == "refresh_token":
                if self.refresh.pop(form.get("refresh_token", ""), None) != jkt:
                    self.events.append("refused:refresh with another key")
                    return JSONResponse({"error": "invalid_grant"}, status_code=400)
            else:
                return JSONResponse(
                    {"error": "unsupported_grant_type"}, status_code=400
                )
            self.events.append(f"token:{grant}")
            access, refresh = secrets.token_urlsafe(16), secrets.token_urlsafe(16)
            self.bound[access] = self.refresh[refresh] = jkt
            return JSONResponse(
                {
                    "access_token": access,
                    "token_type": "DPoP",
                    "expires_in": 3600,
                    "refresh_token": refresh,
                }
            )

        oauth = Starlette(
            routes=[
                Route("/.well-known/oauth-protected-resource{rest:path}", prm),
                Route("/.well-known/oauth-authorization-server", metadata),
                Route("/authorize", authorize),
                Route("/token", token, methods=["POST"]),
            ]
        )

        async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
            if scope["type"] == "http" and scope["path"].startswith("/mcp"):
                refusal = self._gate(scope, resource)
                if refusal is not None:
                    await refusal(scope, receive, send)
                    return
            if scope["type"] != "http" or scope["path"].startswith("/mcp"):
                await mcp_app(scope, receive, send)
                return
            await oauth(scope, receive, send)

        return asgi

    def _bearer_token(self, form: dict[str, str]) -> Response:
        if form.get("code") not in self.codes:
            return JSONResponse({"error": "invalid_grant"}, status_code=400)
        access = secrets.token_urlsafe(16)
        self.bound[access] = ""
        self.events.append("token:bearer")
        return JSONResponse(
            {"access_token": access, "token_type": "Bearer", "expires_in": 3600}
        )

    def _gate(self, scope: dict[str, Any], resource: str) -> Response | None:
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        prm = (
            resource.removesuffix("/mcp") + "/.well-known/oauth-protected-resource/mcp"
        )
        challenge = {"WWW-Authenticate": f'DPoP resource_metadata="{prm}"'}
        scheme, _, token = headers.get("authorization", "").partition(" ")
        if token not in self.bound or self.reject_access:
            return Response(status_code=401, headers=challenge)
        self.schemes.append(scheme)
        if self.bound[token] == "":  # a Bearer token (no DPoP advertised)
            return None if scheme == "Bearer" else Response(status_code=401)
        checked = self.check_proof(headers.get("dpop"), scope["method"], resource)
        if isinstance(checked, str):
            self.events.append(f"refused:{checked}")
            return Response(status_code=401, headers=challenge)
        claims, jkt = checked
        ath = hashlib.sha256(token.encode()).digest()
        if (
            scheme != "DPoP"
            or jkt != self.bound[token]
            or claims.get("ath") != base64.urlsafe_b64encode(ath).decode().rstrip("=")
        ):
            self.events.append("refused:binding")
            return Response(status_code=401, headers=challenge)
        if self.require_nonce and claims.get("nonce") != RS_NONCE:
            self.events.append("rs-nonce")
            return Response(
                status_code=401,
                headers={
                    "WWW-Authenticate": 'DPoP error="use_dpop_nonce"',
                    "DPoP-Nonce": RS_NONCE,
                },
            )
        self.events.append("mcp")
        return None


@contextlib.contextmanager
def serve_dpop(world: DpopWorld) -> Iterator[str]:
    """Serve the world; yields the MCP URL."""
    with serve_asgi(world.app) as origin:
        yield origin + "/mcp"
