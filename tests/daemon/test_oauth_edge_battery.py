"""The OAuth edge battery: odd but possible answers from the authorization
server and from the protected MCP server, and what the daemon makes of them.

The real daemon, the real authorization server and MCP server of
``tests/oauth_world.py`` (its own switches), and one more layer outside it,
``Edge``, for what those switches cannot say: the ``Content-Type`` of a token
answer, a BOM before it, a form-encoded body, an answer with headers
(``Retry-After``), and a 401 or 403 from the MCP server to a request that
carries a token (on ``POST`` or on the ``GET`` stream), with any
``WWW-Authenticate``. Every request is counted where it arrives; only the
keeper's clock would ever be replaced.

What is held, throughout: a precise error with a stable ``reason`` where the
operator must act; bounded requests to the token endpoint; no secret in an
error, a status, the log or the audit trail; the stored grant consistent
across a restart; the other servers served meanwhile.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import parse_qs, urlencode

import msgspec
import pytest

from memorizz.api.errors import AuthRequiredError, LoginError, RemoteError
from memorizz.client import Client
from memorizzd.oauth.grant import load_grant
from memorizzd.oauth.keeper import CALLER_RETRY_GAP_S, TokenKeeper
from tests.daemon.test_oauth import login, oauth_spec, wait_state
from tests.faults import captured, read_body, replaying, respond
from tests.harness import DaemonHarness, daemon_config, serve_asgi, stdio_spec
from tests.oauth_world import (
    TestAuthorizationServer,
    browser,
    protected_app,
)

BOM = b"\xef\xbb\xbf"
Answer = tuple[int, list[tuple[bytes, bytes]], bytes]
"""Status, headers, body."""


class Edge:
    """An ASGI layer outside the world: rewrites what the token endpoint
    answers and answers MCP requests that carry a token, when told to."""

    def __init__(self, provider: TestAuthorizationServer) -> None:
        self.provider = provider
        self.token_posts: list[str] = []
        """``grant_type`` of every ``POST /token``, at the outermost layer."""
        self.token_answer: Callable[[dict[str, str]], Answer | None] | None = None
        """Answers a ``POST /token`` instead of the world (None: as usual)."""
        self.token_rewrite: Callable[[str, bytes], tuple[bytes, bytes]] | None = None
        """``(grant_type, body) -> (content type, body)`` of a 200 token answer,
        after the world did its work (rotated, if it rotates)."""
        self.mcp_answer: Callable[[str], tuple[int, str | None] | None] | None = None
        """``method -> (status, WWW-Authenticate)`` for an MCP request that
        carries a token (None: as usual)."""
        self.mcp_refused: list[str] = []
        """The methods of the MCP requests ``mcp_answer`` answered."""
        self.mcp_gets = 0
        """``GET /mcp`` with a token (the server-to-client stream)."""

    def wrap(self, app: Any) -> Any:
        async def layer(scope: dict[str, Any], receive: Any, send: Any) -> None:
            if scope["type"] != "http":
                await app(scope, receive, send)
                return
            path, method = scope["path"], scope["method"]
            if path == "/token" and method == "POST":
                await self._token(app, scope, receive, send)
                return
            headers = dict(scope["headers"])
            if path.startswith("/mcp") and headers.get(b"authorization"):
                self.mcp_gets += method == "GET"
                answer = self.mcp_answer(method) if self.mcp_answer else None
                if answer is not None:
                    self.mcp_refused.append(method)
                    status, challenge = answer
                    extra = (
                        [(b"www-authenticate", challenge.encode())] if challenge else []
                    )
                    await respond(send, status, b"", extra)
                    return
            await app(scope, receive, send)

        return layer

    async def _token(
        self, app: Any, scope: dict[str, Any], receive: Any, send: Any
    ) -> None:
        body = await read_body(receive)
        form = {k: v[0] for k, v in parse_qs(body.decode()).items()}
        grant_type = form.get("grant_type", "")
        self.token_posts.append(grant_type)
        answer = self.token_answer(form) if self.token_answer else None
        if answer is not None:
            self.provider.token_forms.append(form)  # its secrets, for the checks
            status, headers, content = answer
            await respond(send, status, content, headers)
            return
        replay = replaying(body, receive)
        if self.token_rewrite is None:
            await app(scope, replay, send)
            return
        status, content = await captured(app, scope, replay)
        content_type = b"application/json"
        if status == 200:
            content_type, content = self.token_rewrite(grant_type, content)
        await respond(send, status, content, [(b"content-type", content_type)])


@contextlib.contextmanager
def serve_edge(world: TestAuthorizationServer) -> Iterator[tuple[str, Edge]]:
    """The world behind an ``Edge``, on a free port; yields the MCP URL."""
    edge = Edge(world)
    with serve_asgi(lambda base: edge.wrap(protected_app(base, world))) as base:
        yield base + "/mcp", edge


@contextlib.contextmanager
def daemon(base: str) -> Iterator[tuple[DaemonHarness, Client]]:
    """The daemon on ``base``'s state, with ``t`` (stdio) from its config."""
    with (
        DaemonHarness.running(daemon_config(base, servers=[stdio_spec("t")])) as d,
        d.client() as c,
    ):
        yield d, c


def keeper_of(d: DaemonHarness) -> TokenKeeper:
    keeper = d.daemon.pool.get("cal").keeper
    assert keeper is not None
    return keeper


@contextlib.contextmanager
def cal_logged_in(
    world: TestAuthorizationServer, base: str, **spec: Any
) -> Iterator[tuple[Edge, DaemonHarness, Client, TokenKeeper]]:
    """The world, the daemon with ``cal`` (logged in, ready) and ``t`` (stdio)."""
    with serve_edge(world) as (url, edge), daemon(base) as (d, c):
        c.add_server(oauth_spec(url, **spec))
        login(c, "cal")
        d.wait_ready("cal")
        yield edge, d, c, keeper_of(d)


def expire(world: TestAuthorizationServer, keeper: TokenKeeper) -> None:
    """The access token expires, at the server and in the daemon's view."""
    world.expire_access_tokens()
    grant = keeper.grant
    assert grant is not None
    keeper.grant = msgspec.structs.replace(grant, expires_at=grant.obtained_at)


def echo(c: Client, server: str = "cal") -> None:
    assert c.call_tool(server, "echo", {"text": "x"}).is_error is False


def refused_call(c: Client, server: str = "cal") -> RemoteError | None:
    """``echo``, or the refusal it met."""
    try:
        echo(c, server)
    except RemoteError as exc:
        return exc
    return None


def other_served(c: Client) -> None:
    """The stdio server ``t`` answers meanwhile."""
    assert (
        c.call_tool("t", "echo", {"text": "meanwhile"}).content[0]["text"]
        == "meanwhile"
    )


def secrets_of(world: TestAuthorizationServer) -> list[str]:
    """Every token the world issued, every code and verifier it was sent."""
    found = [*world.family]
    for form in world.token_forms:
        found += [
            v
            for k, v in form.items()
            if k in ("code", "code_verifier", "refresh_token", "client_secret")
        ]
    return found


def no_secret_in(world: TestAuthorizationServer, *texts: str) -> None:
    secrets = secrets_of(world)
    assert secrets
    for text in texts:
        for secret in secrets:
            assert secret not in text


def refreshes_edited(edit: Callable[[dict[str, Any]], Any]) -> Any:
    """A world's ``token_edit`` that edits the answers to a refresh."""

    def edited(grant_type: str, answer: dict[str, Any]) -> bytes:
        return msgspec.json.encode(
            edit(answer) if grant_type == "refresh_token" else answer
        )

    return edited


# --- token_type, refresh_token, scope, unknown fields -----------------------------------


def test_token_type_spellings_missing_members_and_extras_are_taken(
    base_dir: str,
) -> None:
    """RFC 6749 §5.1 / §6: refreshes answered with ``token_type`` ``bearer``,
    ``BEARER`` or none, extra members the daemon does not know, no new
    ``refresh_token`` (the old one is kept: the server did not rotate), a
    narrower ``scope``, then none (the last granted is kept): each answer is
    taken, the token used, and the grant the vault holds after a restart is
    the one in memory: it refreshes with the kept refresh token, no login."""
    world = TestAuthorizationServer(rotate=False)
    edits: list[Callable[[dict[str, Any]], Any]] = [
        lambda a: {**a, "token_type": "bearer", "refresh_token": None},
        lambda a: {
            **a,
            "token_type": "BEARER",
            "refresh_token": "",
            "id_token": "x.y.z",
            "x-extra": {"nested": [1, None]},
        },
        lambda a: (
            {k: v for k, v in a.items() if k not in ("token_type", "refresh_token")}
            | {"scope": "mcp"}
        ),
        lambda a: {k: v for k, v in a.items() if k not in ("scope", "refresh_token")},
    ]
    with serve_edge(world) as (url, edge):
        with daemon(base_dir) as (d, c):
            c.add_server(oauth_spec(url, oauth_scopes=["mcp", "admin"]))
            login(c, "cal")
            d.wait_ready("cal")
            keeper = keeper_of(d)
            first = keeper.grant
            assert first is not None
            assert first.scope == "mcp admin"
            for edit in edits:
                world.token_edit = refreshes_edited(edit)
                expire(world, keeper)
                echo(c)
            grant = keeper.grant
            assert grant is not None
            assert grant.refresh_token == first.refresh_token  # never rotated: kept
            assert grant.scope == "mcp"  # narrowed, then left out: the last granted
            assert not grant.dpop
            stored = load_grant(keeper._vault, "cal")
            assert stored is not None
            assert (stored.access_token, stored.refresh_token, stored.scope) == (
                grant.access_token,
                grant.refresh_token,
                "mcp",
            )
            other_served(c)
        assert edge.token_posts.count("refresh_token") == 4
        world.token_edit = None
        with daemon(base_dir) as (d, c):  # the stored grant, after a restart
            d.wait_ready("cal")
            auth = c.server_status("cal")[0].auth
            assert auth is not None
            assert (auth.state, auth.scope, auth.refreshable) == ("ok", "mcp", True)
            expire(world, keeper_of(d))
            echo(c)  # refreshed with the refresh token kept all along
    assert world.count("authorization_code") == 1
    assert world.count("refresh_token") == 5


# --- how a token answer is framed: BOM, Content-Type, a form ------------------------


def framed(
    prefix: bytes, content_type: bytes
) -> Callable[[str, bytes], tuple[bytes, bytes]]:
    def rewritten(_grant_type: str, body: bytes) -> tuple[bytes, bytes]:
        return content_type, prefix + body

    return rewritten


@pytest.mark.parametrize(
    ("prefix", "content_type"),
    [
        (BOM, b"application/json"),
        (b"", b"application/json; charset=utf-8"),
        (b"", b"text/plain"),
        (b"", b"application/x-www-form-urlencoded"),
        (BOM + b" \r\n\t", b"application/json;charset=UTF-8"),
    ],
    ids=["bom", "charset", "text-plain", "form-label", "bom-and-space"],
)
def test_a_json_token_answer_is_taken_whatever_its_framing(
    base_dir: str, prefix: bytes, content_type: bytes
) -> None:
    """RFC 8259 §8.1 (a parser MAY ignore a BOM) and RFC 6749 §5.1: a token
    answer that is JSON, labelled ``text/plain`` or as a form, with a charset,
    or after a UTF-8 BOM, on the code exchange and on refreshes that rotate:
    taken, and the rotated refresh token kept and spent next. (A BOM was
    refused as "not a token response": the login failed, and a refresh the
    server had already rotated was thrown away, so the retry met reuse
    detection and the host was logged out.)"""
    world = TestAuthorizationServer()
    with serve_edge(world) as (url, edge), daemon(base_dir) as (d, c):
        edge.token_rewrite = framed(prefix, content_type)
        c.add_server(oauth_spec(url))
        done = login(c, "cal")
        assert done.auth.state == "ok"
        d.wait_ready("cal")
        keeper = keeper_of(d)
        for _ in range(2):
            expire(world, keeper)
            echo(c)
        assert keeper.state == "ok"
    assert edge.token_posts == ["authorization_code", "refresh_token", "refresh_token"]
    assert world.reuse_detected == 0


def form_encoded(_grant_type: str, body: bytes) -> tuple[bytes, bytes]:
    """The answer as GitHub gives it to a client that does not ask for JSON."""
    answer = msgspec.json.decode(body)
    return b"application/x-www-form-urlencoded", urlencode(answer).encode()


def test_a_form_encoded_token_answer_is_refused_without_its_tokens(
    base_dir: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A token answer form-encoded (GitHub's, to a client that does not send
    ``Accept: application/json``; the daemon does) is not JSON: the login
    fails saying so, with neither the tokens it carried nor the code or the
    verifier in the error, the status or the log; nothing is installed; and
    the next login (JSON again) works."""
    caplog.set_level(logging.DEBUG)
    world = TestAuthorizationServer()
    with serve_edge(world) as (url, edge), daemon(base_dir) as (d, c):
        c.add_server(oauth_spec(url))
        edge.token_rewrite = form_encoded
        started = c.auth_login("cal")
        with pytest.raises(LoginError) as refused:
            c.auth_complete("cal", browser(started.authorization_url))
        assert refused.value.reason == "login_failed"
        assert "not a token response" in refused.value.message
        status = c.server_status("cal")[0]
        assert status.auth is not None
        assert status.auth.state == "logged_out"
        assert status.state == "login_required"
        texts = [refused.value.message, repr(status), repr(c.audit())]
        edge.token_rewrite = None
        login(c, "cal")
        d.wait_ready("cal")
        echo(c)
    assert world.count("authorization_code") == 2
    no_secret_in(world, *texts, caplog.text)


# --- what a refresh may be refused with ---------------------------------------------


def refresh_refused(answer: Answer) -> Callable[[dict[str, str]], Answer | None]:
    def reply(form: dict[str, str]) -> Answer | None:
        return answer if form.get("grant_type") == "refresh_token" else None

    return reply


JSON = (b"content-type", b"application/json")


@pytest.mark.parametrize(
    "answer",
    [
        (400, [JSON], b'{"error":"invalid_client","error_description":"who?"}'),
        (
            401,
            [JSON, (b"www-authenticate", b'Basic realm="token"')],
            b'{"error":"unauthorized_client"}',
        ),
        (400, [JSON], BOM + b'{"error":"invalid_client"}'),
    ],
    ids=["400-invalid_client", "401-unauthorized_client", "bom-invalid_client"],
)
def test_a_dead_client_on_refresh_is_final_and_stays_so_across_a_restart(
    base_dir: str, answer: Answer, caplog: pytest.LogCaptureFixture
) -> None:
    """A refresh refused ``invalid_client`` / ``unauthorized_client`` (the
    client is dead, not just the grant): ``login_required`` at once, with the
    command to run; one request, none more (no loop, no retry after a
    restart: the vault says login required); the other server is served.
    (An error body after a BOM was unreadable, so a passing failure.)"""
    caplog.set_level(logging.DEBUG)
    world = TestAuthorizationServer()
    with serve_edge(world) as (url, edge):
        with daemon(base_dir) as (d, c):
            c.add_server(oauth_spec(url))
            login(c, "cal")
            d.wait_ready("cal")
            edge.token_answer = refresh_refused(answer)
            expire(world, keeper_of(d))
            with pytest.raises(AuthRequiredError) as refused:
                echo(c)
            assert refused.value.reason == "login_required"
            assert "memorizzctl mcp login cal" in refused.value.message
            for _ in range(3):
                with pytest.raises(AuthRequiredError) as again:
                    echo(c)
                assert again.value.reason == "login_required"
            other_served(c)
            wait_state(c, "cal", "login_required")
            auth = c.server_status("cal")[0].auth
            assert auth is not None
            assert auth.state == "login_required"
            error = msgspec.json.decode(answer[2].removeprefix(BOM))["error"]
            assert error in (auth.last_refresh_error or "")
            texts = [refused.value.message, repr(c.server_status()), repr(c.audit())]
        with daemon(base_dir) as (d, c):
            auth = c.server_status("cal")[0].auth
            assert auth is not None
            assert auth.state == "login_required"
            with pytest.raises(AuthRequiredError) as after:
                echo(c)
            assert after.value.reason == "login_required"
            other_served(c)
    assert edge.token_posts.count("refresh_token") == 1
    assert "login required" in caplog.text
    no_secret_in(world, *texts, caplog.text)


@pytest.mark.parametrize(
    "answer",
    [
        (400, [JSON], b'{"error":"temporarily_unavailable"}'),
        (503, [], b"down for maintenance"),
        (429, [JSON, (b"retry-after", b"1")], b'{"error":"slow_down"}'),
        (200, [JSON], b'{"error":"temporarily_unavailable","error_description":"x"}'),
        (500, [JSON], b'{"error_description":"no error member"}'),
    ],
    ids=["400-temporarily", "503", "429-slow_down-1s", "200-error", "500"],
)
def test_a_passing_refusal_of_a_refresh_is_retried_boundedly_then_recovers(
    base_dir: str, answer: Answer
) -> None:
    """A refresh refused for a passing reason: the call is told to retry
    (``server_unavailable``, ``retry_after_s``), the grant stays (in memory
    and in the vault, its refresh token unspent), the refresher backs off on
    its own (at most 3 more requests in 3 s, no caller driving it), the other
    server is served; once the server answers again, the same refresh token
    works (no reuse) and the calls go through. (A longer ``Retry-After`` holds
    the refresher and its callers: tests/daemon/test_oauth_retry_after.py.)"""
    world = TestAuthorizationServer()
    with serve_edge(world) as (url, edge), daemon(base_dir) as (d, c):
        c.add_server(oauth_spec(url))
        login(c, "cal")
        d.wait_ready("cal")
        keeper = keeper_of(d)
        before = keeper.grant
        assert before is not None
        edge.token_answer = refresh_refused(answer)
        expire(world, keeper)
        with pytest.raises(RemoteError) as failed:
            echo(c)
        assert failed.value.reason == "server_unavailable"
        assert "the token refresh failed" in failed.value.message
        assert failed.value.data["retry_after_s"] > 0
        started = len(edge.token_posts)
        threading.Event().wait(3.0)
        assert len(edge.token_posts) <= started + 3, edge.token_posts
        other_served(c)
        assert keeper.state == "ok"
        stored = load_grant(keeper._vault, "cal")
        assert stored is not None
        assert not stored.login_required
        assert stored.refresh_token == before.refresh_token
        edge.token_answer = None
        threading.Event().wait(CALLER_RETRY_GAP_S)  # a caller may ask again now
        refused = refused_call(c)  # else it cut the refresher's backoff short
        if refused is not None:
            # The refresher's own retry was refused just before the answer
            # changed and came back after it (a loaded host): its failure
            # starts a new gap, which the refusal names.
            assert refused.reason == "server_unavailable", refused
            threading.Event().wait(refused.data["retry_after_s"])
            echo(c)
        auth = c.server_status("cal")[0].auth
        assert auth is not None
        assert (auth.state, auth.last_refresh_error) == ("ok", None)
    assert world.reuse_detected == 0
    assert world.count("refresh_token") == 1


# --- what the MCP server may answer a token with -----------------------------------


def well_known_gets(world: TestAuthorizationServer) -> int:
    return sum(1 for r in world.seen if r.startswith("GET /.well-known/"))


@pytest.mark.parametrize(
    "challenge",
    [
        None,
        'Bearer error="invalid_token", error_description="The token expired"',
        (
            'Basic realm="x", DPoP algs="ES256", Bearer error="invalid_token", '
            'resource_metadata="http://127.0.0.1:9/.well-known/oauth-protected-resource"'
        ),
        (
            'Bearer realm="a, error=\\"insufficient_scope\\"", '
            'resource_metadata="{base}/.well-known/oauth-protected-resource/moved"'
        ),
    ],
    ids=["no-header", "invalid_token", "several-moved-elsewhere", "quoted-moved"],
)
def test_a_401_to_a_fresh_token_gets_one_refresh_and_no_new_discovery(
    base_dir: str, challenge: str | None
) -> None:
    """The MCP server answers every request with a token 401, without a
    ``WWW-Authenticate``, with ``invalid_token``, with several challenges in
    one header, with a ``resource_metadata`` that moved (elsewhere, or on
    its own origin) or an ``error`` quoted inside another parameter: one
    forced refresh in all, ``authorization_required`` for every call, no
    metadata fetched (the login's discovery stands until the operator logs
    in again), the other server served; once the server takes tokens again,
    the calls go through on the token refreshed already."""
    world = TestAuthorizationServer()
    with cal_logged_in(world, base_dir) as (edge, _d, c, keeper):
        origin = keeper.grant.resource.removesuffix("/mcp") if keeper.grant else ""
        said = challenge.replace("{base}", origin) if challenge else None
        discovered = well_known_gets(world)
        refreshes = world.count("refresh_token")
        edge.mcp_answer = lambda _method: (401, said)
        for _ in range(4):
            with pytest.raises(AuthRequiredError) as refused:
                echo(c)
            assert refused.value.reason == "authorization_required"
            assert "401" in refused.value.message
            other_served(c)
        assert world.count("refresh_token") == refreshes + 1
        assert well_known_gets(world) == discovered
        assert keeper.state == "ok"
        edge.mcp_answer = None
        echo(c)
        echo(c)
    assert world.count("refresh_token") == refreshes + 1
    assert world.reuse_detected == 0


@pytest.mark.parametrize(
    ("challenge", "scope"),
    [
        (
            (
                'Basic realm="x", Bearer error="insufficient_scope", scope="mcp admin", '
                'resource_metadata="http://127.0.0.1:9/elsewhere"'
            ),
            "mcp admin",
        ),
        (
            'DPoP algs="ES256", Bearer scope="mcp admin" , error=insufficient_scope',
            "mcp admin",
        ),
        ('Bearer error="insufficient_scope"', ""),
    ],
    ids=["several", "token-form", "no-scope"],
)
def test_a_403_insufficient_scope_in_any_spelling_asks_for_a_step_up(
    base_dir: str, challenge: str, scope: str
) -> None:
    """A ``403`` ``insufficient_scope`` among several challenges, written as
    a token rather than quoted, or naming no scope: ``insufficient_scope``
    with ``data.scope``, no refresh (a refresh cannot widen a grant), no
    metadata fetched, and the next login asks for the union of what was
    granted and what the server named."""
    world = TestAuthorizationServer()
    with cal_logged_in(world, base_dir) as (edge, d, c, keeper):
        discovered = well_known_gets(world)
        edge.mcp_answer = lambda method: (403, challenge) if method == "POST" else None
        with pytest.raises(AuthRequiredError) as refused:
            echo(c)
        assert refused.value.reason == "insufficient_scope"
        assert refused.value.data["scope"] == scope
        assert "memorizzctl mcp login cal" in refused.value.message
        other_served(c)
        assert world.count("refresh_token") == 0
        assert well_known_gets(world) == discovered
        edge.mcp_answer = None
        started = c.auth_login("cal")
        asked = parse_qs(started.authorization_url.split("?", 1)[1])["scope"][0]
        assert set(asked.split()) == {"mcp", *scope.split()}
        c.auth_complete("cal", browser(started.authorization_url))
        d.wait_ready("cal")
        echo(c)
        assert keeper.state == "ok"


def test_a_401_on_the_get_stream_only_leaves_the_calls_alone(base_dir: str) -> None:
    """The server would refuse the token on a ``GET`` stream (server to
    client) and takes it on ``POST``. The session the daemon makes (protocol
    2026-07-28, stateless) opens no such stream: no ``GET`` with a token is
    ever sent, no refresh is made for one, and the calls are served; a
    stream reopened on a refusal would show here as ``GET``s and refreshes."""
    world = TestAuthorizationServer()
    with serve_edge(world) as (url, edge), daemon(base_dir) as (d, c):
        edge.mcp_answer = lambda method: (
            (401, 'Bearer error="invalid_token"') if method == "GET" else None
        )
        c.add_server(oauth_spec(url))
        login(c, "cal")
        d.wait_ready("cal")
        for _ in range(5):
            echo(c)
        threading.Event().wait(1.5)  # the SDK's stream reconnects after 1 s
        for _ in range(5):
            echo(c)
        assert c.server_status("cal")[0].state == "ready"
        assert keeper_of(d).state == "ok"
        versions = {request[3] for request in world.mcp_requests if request[2]}
    assert edge.mcp_gets == 0
    assert versions == {"2026-07-28"}
    assert world.count("refresh_token") == 0
