"""OAuth discovery refusals through the real daemon: a hostile or broken
protected resource / authorization server never gets a login started.

The server is ``https://mcp.example.test`` (an allowlisted public name, fake
DNS, verified TLS, dialled on loopback: ``egress_world``); its metadata
documents are whatever each test serves. The network tripwire and the
loopback-only dial make a refused address impossible to reach even if the
guard were broken.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from memorizz.api.errors import LoginError, PermissionDeniedError
from memorizz.api.methods import ServerSpec
from memorizzd.egress import client as egress_client
from tests.egress_world import (
    PUBLIC_NAME,
    PUBLIC_V4,
    TLS,
    FakeDNS,
    LoopbackDial,
    World,
    serve,
    tls_material,
)
from tests.harness import DaemonHarness, daemon_config

BASE = f"https://{PUBLIC_NAME}"
MCP_URL = f"{BASE}/mcp"
PRM_PATH = "/.well-known/oauth-protected-resource/mcp"
AS_PATH = "/.well-known/oauth-authorization-server"


class Documents:
    """The metadata the fake server answers with, by path (tests set it)."""

    def __init__(self) -> None:
        self.docs: dict[str, Any] = {}
        self.requests: list[str] = []

    def app(self) -> Starlette:
        async def mcp(request: Request) -> Response:
            self.requests.append(f"{request.method} {request.url.path}")
            header = (
                f'Bearer error="invalid_token", resource_metadata="{BASE}{PRM_PATH}"'
            )
            return Response(status_code=401, headers={"WWW-Authenticate": header})

        async def document(request: Request) -> Response:
            self.requests.append(f"GET {request.url.path}")
            doc = self.docs.get(request.url.path)
            if doc is None:
                return Response(status_code=404)
            return JSONResponse(doc)

        return Starlette(
            routes=[
                Route("/mcp", mcp, methods=["POST", "GET"]),
                Route("/{path:path}", document, methods=["GET"]),
            ]
        )


@pytest.fixture(scope="module")
def tls() -> Iterator[TLS]:
    with tls_material() as material:
        yield material


@pytest.fixture(scope="module")
def documents(tls: TLS) -> Iterator[tuple[Documents, int]]:
    docs = Documents()
    with serve(docs.app(), tls, lifespan="off") as port:
        yield docs, port


@pytest.fixture
def daemon(
    base_dir: str,
    tls: TLS,
    documents: tuple[Documents, int],
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[DaemonHarness]:
    dns = FakeDNS(
        {
            PUBLIC_NAME: [PUBLIC_V4],
            "metadata.example.test": ["169.254.169.254"],
            "private.example.test": ["10.0.0.1"],
        }
    )
    world = World(tls, dns, LoopbackDial())
    world.route(PUBLIC_V4, 443, documents[1])
    monkeypatch.setattr(egress_client, "DEFAULT_NETWORK", world.network())
    documents[0].docs.clear()
    config = daemon_config(base_dir, host_allowlist=["*.example.test"])
    with DaemonHarness.running(config) as harness:
        with harness.client() as c:
            c.add_server(
                ServerSpec(
                    name="cal", transport="streamable_http", url=MCP_URL, auth="oauth"
                )
            )
        yield harness


def prm(**fields: Any) -> dict[str, Any]:
    return {"resource": MCP_URL, "authorization_servers": [BASE], **fields}


def as_metadata(**fields: Any) -> dict[str, Any]:
    doc = {
        "issuer": BASE,
        "authorization_endpoint": f"{BASE}/authorize",
        "token_endpoint": f"{BASE}/token",
        "registration_endpoint": f"{BASE}/register",
        "response_types_supported": ["code"],
        "code_challenge_methods_supported": ["S256"],
    }
    doc.update(fields)
    return {k: v for k, v in doc.items() if v is not None}


def login_error(daemon: DaemonHarness) -> LoginError:
    with daemon.client() as c, pytest.raises(LoginError) as refused:
        c.auth_login("cal")
    return refused.value


def serve_docs(documents: tuple[Documents, int], docs: dict[str, Any]) -> None:
    documents[0].docs.update(docs)


def test_an_issuer_that_does_not_match_is_refused(
    daemon: DaemonHarness, documents: tuple[Documents, int]
) -> None:
    serve_docs(
        documents,
        {PRM_PATH: prm(), AS_PATH: as_metadata(issuer=f"{BASE}/someone-else")},
    )
    error = login_error(daemon)
    assert "names issuer" in error.message
    assert "RFC 8414" in error.message


def test_an_authorization_server_without_pkce_s256_is_refused(
    daemon: DaemonHarness, documents: tuple[Documents, int]
) -> None:
    serve_docs(
        documents,
        {
            PRM_PATH: prm(),
            AS_PATH: as_metadata(code_challenge_methods_supported=["plain"]),
        },
    )
    assert "PKCE S256" in login_error(daemon).message
    documents[0].docs[AS_PATH] = as_metadata(code_challenge_methods_supported=None)
    assert "PKCE S256" in login_error(daemon).message


def test_resource_metadata_for_another_resource_is_refused(
    daemon: DaemonHarness, documents: tuple[Documents, int]
) -> None:
    serve_docs(
        documents,
        {
            PRM_PATH: prm(resource=f"{BASE}/elsewhere"),
            AS_PATH: as_metadata(),
        },
    )
    assert "not this server" in login_error(daemon).message


def test_an_authorization_endpoint_that_is_not_https_is_refused(
    daemon: DaemonHarness, documents: tuple[Documents, int]
) -> None:
    serve_docs(
        documents,
        {
            PRM_PATH: prm(),
            AS_PATH: as_metadata(authorization_endpoint="http://login.example.test/a"),
        },
    )
    assert "not an https URL" in login_error(daemon).message


def test_no_registration_and_no_client_id_says_what_to_do(
    daemon: DaemonHarness, documents: tuple[Documents, int]
) -> None:
    serve_docs(
        documents, {PRM_PATH: prm(), AS_PATH: as_metadata(registration_endpoint=None)}
    )
    assert "oauth_client_id" in login_error(daemon).message


@pytest.mark.parametrize(
    ("issuer", "reason"),
    [
        ("https://metadata.example.test", "address_not_allowed"),
        ("https://private.example.test", "address_not_allowed"),
        ("https://as.elsewhere.test", "host_not_allowed"),
        ("http://as.example.test", "scheme_not_allowed"),
    ],
)
def test_the_egress_guard_covers_the_authorization_server(
    daemon: DaemonHarness,
    documents: tuple[Documents, int],
    issuer: str,
    reason: str,
) -> None:
    serve_docs(documents, {PRM_PATH: prm(authorization_servers=[issuer])})
    with daemon.client() as c, pytest.raises(PermissionDeniedError) as refused:
        c.auth_login("cal")
    assert refused.value.reason == reason


def test_a_good_server_gets_a_login_url(
    daemon: DaemonHarness, documents: tuple[Documents, int]
) -> None:
    serve_docs(
        documents,
        {
            PRM_PATH: prm(scopes_supported=["calendar.read"]),
            AS_PATH: as_metadata(registration_endpoint=None),
        },
    )
    with daemon.client() as c:
        c.remove_server("cal")
        c.add_server(
            ServerSpec(
                name="cal",
                transport="streamable_http",
                url=MCP_URL,
                auth="oauth",
                oauth_client_id="pre-registered",
            )
        )
        started = c.auth_login("cal")
    url = started.authorization_url
    assert url.startswith(
        f"{BASE}/authorize?response_type=code&client_id=pre-registered"
    )
    assert "scope=calendar.read" in url
    assert "code_challenge_method=S256" in url
    assert "resource=https%3A%2F%2Fmcp.example.test%2Fmcp" in url
    assert started.issuer.rstrip("/") == BASE
