"""OAuth secrets as credential store references (``credential:NAME``, a
systemd credential): the real daemon, the real local authorization servers,
a config file that holds no secret. The client credentials grant, a login's
pre-registered client (its code exchange, refresh and revocation) and the
token exchange's two client secrets all send the credential's value, read at
each token request; a reference that cannot be resolved fails the request
naming the reference, and no secret shows in a status, a listing or a log."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from memorizz.api import methods as m
from memorizz.api.errors import AuthRequiredError, LoginError
from memorizz.client import Client
from memorizzd.config import Credentials
from tests.daemon.test_oauth import login, oauth_spec
from tests.daemon.test_oauth_machine import (
    CLIENT_ID,
    SECRET,
    Machines,
    call_whoami,
    ec_key,
    machine_spec,
    serve_machines,
)
from tests.daemon.test_oauth_token_exchange import (
    AS_SECRET,
    IDP_CLIENT,
    IDP_SECRET,
    Enterprise,
)
from tests.daemon.test_oauth_token_exchange import serve as serve_enterprise
from tests.daemon.test_oauth_token_exchange import spec as exchange_spec
from tests.harness import DaemonHarness, daemon_config, wait_until
from tests.oauth_world import (
    PRE_CLIENT_ID,
    PRE_CLIENT_SECRET,
    TestAuthorizationServer,
    serve_protected,
)

ROTATED = "cc-rotated-marker-0b8e44"  # a test marker
# References to systemd credentials: names, not secrets.
ROBOT_REF = "credential:robot-secret"
CAL_REF = "credential:cal-secret"
ABSENT_REF = "credential:absent"


@pytest.fixture
def creds(base_dir: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``$CREDENTIALS_DIRECTORY``, as systemd sets it for the unit."""
    path = Path(base_dir, "credentials")
    path.mkdir()
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(path))
    return path


@contextlib.contextmanager
def daemon_with(
    base_dir: str, *servers: m.ServerSpec
) -> Iterator[tuple[DaemonHarness, Client]]:
    """The daemon with ``servers`` in its config file, and the systemd store."""
    config = daemon_config(
        base_dir,
        credentials=Credentials(stores=["vault", "systemd"]),
        servers=list(servers),
    )
    with DaemonHarness.running(config) as d, d.client() as c:
        yield d, c


def shown(c: Client) -> str:
    return msgspec.json.encode(
        [c.server_status(), c.list_servers(), c.audit().records]
    ).decode()


def logged(caplog: pytest.LogCaptureFixture) -> str:
    return "\n".join(r.getMessage() for r in caplog.records) + caplog.text


@pytest.mark.parametrize("where", ["config", "servers/add"])
def test_a_client_credentials_secret_from_a_systemd_credential(
    base_dir: str, creds: Path, where: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    (creds / "robot-secret").write_text(SECRET + "\n")
    machines = Machines(TestAuthorizationServer())
    with serve_machines(machines) as url:
        robot = machine_spec(url, oauth_client_secret=ROBOT_REF)
        with daemon_with(base_dir, *([robot] if where == "config" else [])) as (d, c):
            if where == "servers/add":
                c.add_server(robot)
            d.wait_ready("robot")
            assert "authorized" in call_whoami(c)
            # The credential is rotated: the next token request reads it again.
            (creds / "robot-secret").write_text(ROTATED + "\n")
            machines.secrets[CLIENT_ID] = ROTATED
            machines.world.expire_access_tokens()
            with contextlib.suppress(AuthRequiredError):
                c.call_tool("robot", "whoami", {})  # its 401 asks for a new token
            wait_until(lambda: machines.count() == 2, what="a token after the 401")
            d.wait_ready("robot")
            assert "authorized" in call_whoami(c)
            seen = shown(c)
    assert machines.count(ok=False) == 0
    assert [r["method"] for r in machines.requests] == ["client_secret_basic"] * 2
    for secret in (SECRET, ROTATED):
        assert secret not in seen
        assert secret not in logged(caplog)


def test_an_absent_reference_fails_the_token_request_naming_it(
    base_dir: str, creds: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    (creds / "robot-secret").write_text(SECRET)
    machines = Machines(TestAuthorizationServer())
    with serve_machines(machines) as url:
        good = machine_spec(url, oauth_client_secret=ROBOT_REF)
        missing = machine_spec(url, name="missing", oauth_client_secret=ABSENT_REF)
        with daemon_with(base_dir, good, missing) as (d, c):
            d.wait_ready("robot")

            def refusal() -> str:
                auth = c.server_status("missing")[0].auth
                return (auth.last_refresh_error if auth else None) or ""

            wait_until(
                lambda: "credential:absent" in refusal(),
                what="the missing credential in servers/status",
            )
            with pytest.raises(AuthRequiredError) as refused:
                c.call_tool("missing", "whoami", {})
            status = c.server_status("missing")[0]
            refused_by_store = refusal()
            seen = shown(c)
    assert refused_by_store == (
        "credentials: the client secret: secret 'credential:absent': "
        "no credential 'absent' in $CREDENTIALS_DIRECTORY"
    )
    assert "'credential:absent'" in refused.value.message
    assert status.state == "login_required"
    assert "client credentials grant failed" in (status.last_error or "")
    # LAST ERROR says why as it stands now (it was the text of the moment the
    # state was entered, before the first attempt failed)
    assert "'credential:absent'" in (status.last_error or "")
    # nothing was sent for it: the reference is not a secret to try
    assert all(r["ok"] for r in machines.requests)
    assert SECRET not in seen
    assert SECRET not in logged(caplog)


def test_a_logins_client_secret_from_a_systemd_credential(
    base_dir: str, creds: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    (creds / "cal-secret").write_text(PRE_CLIENT_SECRET + "\n")
    world = TestAuthorizationServer()
    world.preregister("http://127.0.0.1:33418/callback")
    with serve_protected(world) as url:
        cal = oauth_spec(
            url,
            oauth_client_id=PRE_CLIENT_ID,
            oauth_client_secret=CAL_REF,
        )
        absent = oauth_spec(
            url,
            name="absent",
            oauth_client_id=PRE_CLIENT_ID,
            oauth_client_secret=ABSENT_REF,
        )
        with daemon_with(base_dir, cal, absent) as (d, c):
            with pytest.raises(LoginError, match="'credential:absent'"):
                c.auth_login("absent")
            assert login(c, "cal").auth.state == "ok"
            d.wait_ready("cal")
            assert c.call_tool("cal", "whoami", {}).is_error is False
            keeper = d.daemon.pool.get("cal").keeper
            assert keeper is not None
            assert keeper.grant is not None
            # The grant keeps the reference, not the value it stands for.
            assert keeper.grant.client_secret == CAL_REF
            # A refresh authenticates with the credential too.
            world.expire_access_tokens()
            grant = keeper.grant
            keeper.grant = msgspec.structs.replace(grant, expires_at=grant.obtained_at)
            assert c.call_tool("cal", "whoami", {}).is_error is False
            assert world.count("refresh_token") == 1
            seen = shown(c)
            revoked = c.auth_logout("cal")
    assert revoked.revocation == "revoked", revoked.message
    assert world.grants == ["authorization_code", "refresh_token"]
    assert PRE_CLIENT_SECRET not in seen
    assert PRE_CLIENT_SECRET not in logged(caplog)


def test_the_token_exchanges_two_client_secrets_from_systemd_credentials(
    base_dir: str, creds: Path
) -> None:
    (creds / "as-secret").write_text(AS_SECRET)
    (creds / "idp-secret").write_text(IDP_SECRET)
    world = Enterprise()
    id_token = Path(base_dir, "id_token.jwt")
    with serve_enterprise(world) as url:
        id_token.write_text(world.id_token("alice"))
        corp = exchange_spec(
            url,
            oauth_client_secret="credential:as-secret",  # noqa: S106
            oauth_idp_client_secret="credential:idp-secret",  # noqa: S106
            oauth_subject_token_file=str(id_token),
            oauth_idp_issuer=world.idp,
        )
        with daemon_with(base_dir, corp) as (d, c):
            d.wait_ready("corp")
            result = c.call_tool("corp", "whoami", {})
            assert not result.is_error
    assert world.idp_auth == [(IDP_CLIENT, IDP_SECRET)]
    assert world.subjects == ["alice"]


def test_a_private_key_from_a_systemd_credential_signs_the_assertion(
    base_dir: str, creds: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``oauth_private_key = "credential:NAME"``: the spec check took only a
    PEM key, and the daemon used the value as written."""
    caplog.set_level(logging.DEBUG)
    pem, public = ec_key()
    (creds / "robot-key").write_text(pem)
    machines = Machines(TestAuthorizationServer())
    machines.public_keys[CLIENT_ID] = public
    with serve_machines(machines) as url:
        robot = machine_spec(url, oauth_private_key="credential:robot-key")
        with daemon_with(base_dir) as (d, c):
            c.add_server(robot)  # checked as given
            d.wait_ready("robot")
            assert "authorized" in call_whoami(c)
            seen = shown(c)
    assert [r["method"] for r in machines.requests] == ["private_key_jwt"]
    key_body = pem.splitlines()[1]
    assert key_body not in seen
    assert key_body not in logged(caplog)
