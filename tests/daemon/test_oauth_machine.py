"""The client credentials grant (a machine's OAuth, RFC 6749 §4.4) end to end:
the real daemon, the real local authorization server and protected MCP server
(``tests/oauth_world.py``) with a client credentials token endpoint in front
of it, ``client_secret_basic``, ``client_secret_post`` and ``private_key_jwt``
(the assertion verified here with PyJWT, not with our code). No one logs in;
the daemon gets its token, renews it in the background and after a 401, and
its secret or key is found nowhere but the vault."""

from __future__ import annotations

import base64
import contextlib
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote

import jwt
import msgspec
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from mcp.server.auth.provider import AccessToken

from memorizz.api import methods as m
from memorizz.api.errors import AuthRequiredError, InvalidParamsError
from memorizz.client import Client
from memorizz.ctl.render import render_auth
from tests.harness import (
    DaemonHarness,
    daemon_config,
    daemon_process,
    serve_asgi,
    wait_until,
)
from tests.oauth_world import TestAuthorizationServer, protected_app

CLIENT_ID = "machine-7"
SECRET = "cc-secret-marker-5d1f0a"  # noqa: S105 - a test marker
WRONG = "not-the-secret"


class Machines:
    """The authorization server's client credentials side: registered clients
    (a secret or a public key each) and every client credentials request."""

    def __init__(self, world: TestAuthorizationServer) -> None:
        self.world = world
        self.secrets: dict[str, str] = {CLIENT_ID: SECRET}
        self.public_keys: dict[str, Any] = {}
        self.requests: list[dict[str, Any]] = []
        """Each request: ``method`` (how the client authenticated), ``ok``,
        ``form`` (the body), ``claims`` (a verified assertion's)."""
        self.access_ttl = 3600

    def token(self, form: dict[str, str], authorization: str) -> tuple[int, bytes]:
        seen: dict[str, Any] = {"form": form, "ok": False}
        self.requests.append(seen)
        client_id = self._authenticate(form, authorization, seen)
        if client_id is None:
            return 401, b'{"error":"invalid_client"}'
        seen["ok"] = True
        token = secrets.token_urlsafe(24)
        scopes = form.get("scope", "mcp").split()
        self.world.access[token] = AccessToken(
            token=token,
            client_id=client_id,
            scopes=scopes,
            expires_at=int(time.time()) + self.access_ttl,
            resource=form.get("resource"),
        )
        body = {
            "access_token": token,
            "token_type": "Bearer",
            "expires_in": self.access_ttl,
            "scope": " ".join(scopes),
        }
        return 200, msgspec.json.encode(body)

    def _authenticate(
        self, form: dict[str, str], authorization: str, seen: dict[str, Any]
    ) -> str | None:
        if authorization.startswith("Basic "):
            seen["method"] = "client_secret_basic"
            pair = base64.b64decode(authorization[6:]).decode()
            client_id, _, secret = (unquote(part) for part in pair.partition(":"))
            return client_id if self.secrets.get(client_id) == secret else None
        if "client_assertion" in form:
            seen["method"] = "private_key_jwt"
            client_id = form.get("client_id", "")
            key = self.public_keys.get(client_id)
            if key is None or form.get("client_assertion_type") != (
                "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
            ):
                return None
            try:
                claims = jwt.decode(
                    form["client_assertion"],
                    key,
                    algorithms=["ES256"],
                    audience=self.world.issuer,
                    options={"require": ["exp", "iat", "jti"]},
                )
            except jwt.PyJWTError:
                return None
            seen["claims"] = claims
            ok = claims["iss"] == claims["sub"] == client_id
            return client_id if ok else None
        seen["method"] = "client_secret_post"
        client_id = form.get("client_id", "")
        secret = form.get("client_secret")
        return client_id if secret and self.secrets.get(client_id) == secret else None

    def count(self, *, ok: bool = True) -> int:
        return sum(1 for r in self.requests if r["ok"] == ok)


def machine_app(origin: str, machines: Machines) -> Any:
    """The oauth world, with ``POST /token`` ``grant_type=client_credentials``
    answered by ``machines`` (the SDK's token route knows only user grants)."""
    app = protected_app(origin, machines.world)

    async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/token":
            body = b""
            while True:
                message = await receive()
                body += message.get("body", b"")
                if not message.get("more_body"):
                    break
            form = {k: v[0] for k, v in parse_qs(body.decode()).items()}
            if form.get("grant_type") == "client_credentials":
                headers = dict(scope["headers"])
                status, answer = machines.token(
                    form, headers.get(b"authorization", b"").decode()
                )
                await send(
                    {
                        "type": "http.response.start",
                        "status": status,
                        "headers": [(b"content-type", b"application/json")],
                    }
                )
                await send({"type": "http.response.body", "body": answer})
                return
            sent = False

            async def replay() -> dict[str, Any]:
                nonlocal sent
                if sent:
                    return {"type": "http.disconnect"}
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}

            await app(scope, replay, send)
            return
        await app(scope, receive, send)

    return asgi


@contextlib.contextmanager
def serve_machines(machines: Machines) -> Iterator[str]:
    with serve_asgi(lambda origin: machine_app(origin, machines)) as origin:
        yield origin + "/mcp"


def machine_spec(url: str, **fields: Any) -> m.ServerSpec:
    return m.ServerSpec(
        **{
            "name": "robot",
            "transport": "streamable_http",
            "url": url,
            "allow_private_network": True,
            "auth": "oauth",
            "oauth_grant": "client_credentials",
            "oauth_client_id": CLIENT_ID,
            **fields,
        }
    )


PEM = (
    "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQg\n"
    "-----END PRIVATE KEY-----\n"
)
"""Shaped like a PEM private key (the spec check reads no further)."""


def ec_key() -> tuple[str, Any]:
    key = ec.generate_private_key(ec.SECP256R1())
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    return pem, key.public_key()


@contextlib.contextmanager
def machine_world(
    base_dir: str, machines: Machines
) -> Iterator[tuple[str, DaemonHarness, Client]]:
    with (
        serve_machines(machines) as url,
        DaemonHarness.running(daemon_config(base_dir)) as d,
        d.client() as c,
    ):
        yield url, d, c


def call_whoami(client: Client) -> str:
    result = client.call_tool("robot", "whoami", {})
    assert not result.is_error
    return msgspec.json.encode(result.content).decode()


@pytest.mark.parametrize("method", ["client_secret_basic", "client_secret_post"])
def test_a_client_secret_gets_a_token_without_a_login(
    base_dir: str, method: str
) -> None:
    machines = Machines(TestAuthorizationServer())
    with machine_world(base_dir, machines) as (url, d, c):
        c.add_server(
            machine_spec(
                url,
                oauth_client_secret=SECRET,
                oauth_token_endpoint_auth_method=method,
            )
        )
        d.wait_ready("robot")
        assert "authorized" in call_whoami(c)
        status = c.server_status("robot")[0]
    assert [r["method"] for r in machines.requests] == [method]
    assert machines.count() == 1
    form = machines.requests[0]["form"]
    assert form["grant_type"] == "client_credentials"
    assert form["resource"] == url  # RFC 8707, as for a user's grant
    assert status.auth is not None
    assert status.auth.state == "ok"


def test_private_key_jwt_signs_a_fresh_assertion_with_the_vaults_key(
    base_dir: str,
) -> None:
    machines = Machines(TestAuthorizationServer())
    pem, public = ec_key()
    machines.public_keys[CLIENT_ID] = public
    with machine_world(base_dir, machines) as (url, d, c):
        c.add_server(machine_spec(url, oauth_private_key=pem))
        d.wait_ready("robot")
        assert "authorized" in call_whoami(c)
        machines.world.expire_access_tokens()
        # The call that meets the 401 fails (as with a user's grant); the 401
        # makes the keeper ask for a new token, with a new assertion.
        with contextlib.suppress(AuthRequiredError):
            c.call_tool("robot", "whoami", {})
        wait_until(lambda: machines.count() == 2, what="a new token after the 401")
        assert "authorized" in call_whoami(c)
    assert [r["method"] for r in machines.requests] == ["private_key_jwt"] * 2
    assert machines.count() == 2
    first, second = (r["claims"] for r in machines.requests)
    assert first["aud"] == machines.world.issuer
    assert first["iss"] == first["sub"] == CLIENT_ID
    assert first["jti"] != second["jti"]


def test_the_token_is_renewed_in_the_background_before_it_expires(
    base_dir: str,
) -> None:
    machines = Machines(TestAuthorizationServer())
    machines.access_ttl = 2  # renewed about a second before it expires
    with machine_world(base_dir, machines) as (url, d, c):
        c.add_server(machine_spec(url, oauth_client_secret=SECRET))
        d.wait_ready("robot")

        def renewed() -> int:
            auth = c.server_status("robot")[0].auth
            return 0 if auth is None else auth.refreshes

        # the daemon's count, not the server's: a request the server counted
        # may not be answered yet (this raced on a loaded machine)
        wait_until(lambda: renewed() >= 2, what="two renewals, no caller")
        assert machines.count() >= 3  # the first token and two renewals
        assert "authorized" in call_whoami(c)


def refusal(status: m.ServerStatus) -> str | None:
    return status.auth.last_refresh_error if status.auth else None


def test_refused_credentials_are_reported_without_the_secret(base_dir: str) -> None:
    machines = Machines(TestAuthorizationServer())
    machines.secrets[CLIENT_ID] = "not-what-the-daemon-holds"
    with machine_world(base_dir, machines) as (url, _d, c):
        c.add_server(machine_spec(url, oauth_client_secret=SECRET))
        wait_until(lambda: machines.count(ok=False) >= 1, what="a refused request")
        wait_until(
            lambda: "invalid_client" in (refusal(c.server_status("robot")[0]) or ""),
            what="the refusal in servers/status",
        )
        status = c.server_status("robot")[0]
        with pytest.raises(InvalidParamsError):
            c.auth_login("robot")  # no one logs in to a machine's grant
    assert status.state == "login_required"
    assert "client credentials" in (status.last_error or "")
    assert SECRET not in repr(status)


def test_mcp_status_never_tells_a_machine_grant_to_log_in(base_dir: str) -> None:
    """``memorizzctl mcp status`` said "not logged in" for a machine grant
    before its first token, and "login_required" when its credentials were
    refused: no one logs in to a machine's grant."""
    machines = Machines(TestAuthorizationServer())
    with machine_world(base_dir, machines) as (url, d, c):
        c.add_server(machine_spec(url, oauth_client_secret=SECRET))
        d.wait_ready("robot")
        c.add_server(machine_spec(url, name="wrong", oauth_client_secret=WRONG))
        wait_until(
            lambda: "invalid_client" in (refusal(c.server_status("wrong")[0]) or ""),
            what="the refusal in servers/status",
        )
        shown = subprocess.run(
            [sys.executable, "-m", "memorizz.cli", "--socket", d.socket,
             "mcp", "status"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
    oauth = shown.split("\noauth:\n", 1)[1]
    assert "robot: ok, client_credentials grant (no login), issuer " in oauth
    assert (  # refused: no token (the reason is in LAST ERROR, above)
        "wrong: no token yet (client_credentials grant: the daemon gets one, no login)"
        in oauth
    )
    assert "log" not in oauth.replace("no login", "")


def test_a_machine_grant_without_a_token_yet_is_not_told_to_log_in() -> None:
    """Before its first token (the first connect is under way), as rendered."""
    waiting = m.AuthStatus(
        state="logged_out", issuer=None, client_id=None, scope=None,
        expires_at=None, refreshable=False, last_refresh=None, refreshes=0,
        last_refresh_error=None, grant="jwt_bearer",
    )  # fmt: skip
    assert render_auth(waiting, time.time()) == (
        "no token yet (jwt_bearer grant: the daemon gets one, no login)"
    )
    person = msgspec.structs.replace(waiting, grant="authorization_code")
    assert render_auth(person, time.time()) == "not logged in"


def test_the_secret_and_the_key_are_only_in_the_vault(base_dir: str) -> None:
    machines = Machines(TestAuthorizationServer())
    pem, public = ec_key()
    machines.public_keys["machine-8"] = public
    with serve_machines(machines) as url, daemon_process(base_dir) as d:
        with d.client() as c:
            c.add_server(machine_spec(url, oauth_client_secret=SECRET))
            c.add_server(
                machine_spec(url, name="robot2", oauth_client_id="machine-8",
                             oauth_private_key=pem)
            )  # fmt: skip
            d.wait_ready("robot")
            d.wait_ready("robot2")
            call_whoami(c)
            seen = [repr(c.list_servers()), repr(c.server_status()), repr(c.audit())]
        for argv in (["mcp", "list"], ["mcp", "status"], ["audit"]):
            run = subprocess.run(
                [sys.executable, "-m", "memorizz.cli", "--socket", d.socket,
                 "--json", *argv],
                capture_output=True, text=True, check=True,
            )  # fmt: skip
            seen.append(run.stdout + run.stderr)
        d.stop()
        seen.append(d.log())
        database = [
            path.read_bytes().decode("latin-1")
            for path in Path(base_dir, "state").iterdir()
        ]
    key_body = pem.splitlines()[1]
    for text in seen + database:
        assert SECRET not in text
        assert key_body not in text
    for token in machines.world.access:
        for text in seen:
            assert token not in text


def test_memorizzctl_adds_a_client_credentials_server(
    base_dir: str, capsys: pytest.CaptureFixture[str]
) -> None:
    machines = Machines(TestAuthorizationServer())
    pem, public = ec_key()
    machines.public_keys[CLIENT_ID] = public
    key_file = Path(base_dir, "robot.pem")
    key_file.write_text(pem)
    with machine_world(base_dir, machines) as (url, d, c):
        code = d.ctl(
            "mcp", "add", "robot", "--url", url, "--allow-private-network",
            "--oauth-grant", "client-credentials", "--client-id", CLIENT_ID,
            "--private-key-file", str(key_file),
        )  # fmt: skip
        assert code == 0
        said = capsys.readouterr().out
        d.wait_ready("robot")
        assert "authorized" in call_whoami(c)
        info = c.list_servers()[0]
    assert info.auth == "oauth"
    assert info.oauth_grant == "client_credentials"
    assert [r["method"] for r in machines.requests] == ["private_key_jwt"]
    # no one logs in to a machine's grant: mcp add does not send them to
    assert "mcp login" not in said
    assert "no login: the daemon gets a token with the client_credentials grant" in said


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"oauth_client_id": None, "oauth_client_secret": None}, "oauth_client_id"),
        ({}, "oauth_client_secret or oauth_private_key"),
        (
            {"oauth_private_key": "not a key"},
            "oauth_private_key must be a PEM private key",
        ),
        (
            {"oauth_token_endpoint_auth_method": "private_key_jwt"},
            "private_key_jwt needs oauth_private_key",
        ),
        (  # a login never signed with it: the key was taken, then not used
            {"oauth_grant": "authorization_code", "oauth_private_key": PEM},
            r"oauth_private_key \(private_key_jwt\) is for the machine grants",
        ),
    ],
)
def test_a_machine_grant_that_cannot_work_is_refused(
    base_dir: str, fields: dict[str, Any], says: str
) -> None:
    with DaemonHarness.running(daemon_config(base_dir)) as d, d.client() as c:
        spec = machine_spec("https://mcp.example.test/mcp", **fields)
        with pytest.raises(InvalidParamsError, match=says):
            c.add_server(spec)
