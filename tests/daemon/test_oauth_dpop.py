"""DPoP-bound tokens (RFC 9449; MCP's ``io.modelcontextprotocol/auth/dpop``
extension) through the real daemon against a real local DPoP authorization
server and MCP server (``tests/dpop_world.py``, which checks every proof
with PyJWT): a proof on the token request, ``Authorization: DPoP`` with a
fresh proof bound to the token on every MCP request, nonce challenges from
both servers answered, the refresh proved with the same key (kept in the
vault), and a server that does not take DPoP left with Bearer tokens."""

from __future__ import annotations

import contextlib

import msgspec
import pytest

from memorizz.api import methods as m
from memorizz.api.errors import AuthRequiredError
from memorizzd.oauth.dpop import dpop_key_ref
from tests.dpop_world import DpopWorld, serve_dpop
from tests.harness import (
    DaemonHarness,
    daemon_config,
    wait_until,
)
from tests.oauth_world import browser


def oauth_spec(url: str) -> m.ServerSpec:
    return m.ServerSpec(
        name="dp",
        transport="streamable_http",
        url=url,
        allow_private_network=True,
        auth="oauth",
        oauth_client_id="dpop-client",
    )


def _login_and_call(d: DaemonHarness, url: str, calls: int = 2) -> list[str]:
    texts = []
    with d.client() as c:
        c.add_server(oauth_spec(url))
        assert c.auth_complete("dp", browser(c.auth_login("dp").authorization_url))
        d.wait_ready("dp")
        for _ in range(calls):
            result = c.call_tool("dp", "whoami", {})
            assert not result.is_error
            texts.append(msgspec.json.encode(result.content).decode())
    return texts


@pytest.mark.parametrize("require_nonce", [False, True], ids=["plain", "nonce"])
def test_a_dpop_bound_token_is_asked_for_and_presented_with_fresh_proofs(
    base_dir: str, require_nonce: bool
) -> None:
    world = DpopWorld(require_nonce=require_nonce)
    with serve_dpop(world) as url, DaemonHarness.running(daemon_config(base_dir)) as d:
        texts = _login_and_call(d, url)
        keeper = d.daemon.pool.get("dp").keeper
        assert keeper is not None
        assert keeper.grant is not None
        assert keeper.grant.dpop
        stored = keeper._vault.get(dpop_key_ref("dp"))  # the key, in the vault
        assert stored.startswith("-----BEGIN PRIVATE KEY-----")
    assert all("dpop-authorized" in text for text in texts)
    refused = [e for e in world.events if e.startswith("refused:")]
    assert refused == []
    assert world.events.count("token:authorization_code") == 1
    assert set(world.schemes) == {"DPoP"}
    assert world.events.count("mcp") >= 3  # the connect, then each call
    if require_nonce:
        # each server asked once; its nonce was used from then on
        assert world.events.count("as-nonce") == 1
        assert world.events.count("rs-nonce") == 1
    else:
        assert "as-nonce" not in world.events
        assert "rs-nonce" not in world.events


def test_a_refused_dpop_token_is_refreshed_with_a_proof_of_the_same_key(
    base_dir: str,
) -> None:
    world = DpopWorld()
    with serve_dpop(world) as url, DaemonHarness.running(daemon_config(base_dir)) as d:
        _login_and_call(d, url, calls=1)
        old = set(world.bound)
        for token in old:  # the server forgets its tokens: a 401, then a refresh
            world.bound[token] = "revoked"
        with d.client() as c:
            with contextlib.suppress(AuthRequiredError):  # this call's 401 stands
                c.call_tool("dp", "whoami", {})
            wait_until(lambda: "token:refresh_token" in world.events, what="refresh")
            result = c.call_tool("dp", "whoami", {})
    assert not result.is_error
    # the refresh was proved with the key the first token is bound to
    assert world.events.count("token:refresh_token") == 1
    assert "refused:refresh with another key" not in world.events
    fresh = set(world.bound) - old
    assert len(fresh) == 1


def test_an_authorization_server_without_dpop_gets_bearer_requests(
    base_dir: str,
) -> None:
    world = DpopWorld(advertise=False)
    with serve_dpop(world) as url, DaemonHarness.running(daemon_config(base_dir)) as d:
        texts = _login_and_call(d, url, calls=1)
    assert "dpop-authorized" in texts[0]
    assert world.events.count("token:bearer") == 1
    assert set(world.schemes) == {"Bearer"}
