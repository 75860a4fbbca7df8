"""Credential stores: the vault, systemd credentials (``credential:NAME`` from
``$CREDENTIALS_DIRECTORY``) and a deployment's own store, loaded by module
path and by entry point (a tiny package made here, with a ``.dist-info`` on
``sys.path``). A secret set through each reaches its server, and appears in
no log line, status, listing, audit record or row of the state database."""

from __future__ import annotations

import logging
import os
import secrets
import sqlite3
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from memorizz.api import methods as m
from memorizzd.config import Credentials
from memorizzd.vault import SecretNotFoundError, VaultError, VaultKeyError
from memorizzd.vault.stores import (
    CredentialStores,
    ReadOnlyStoreError,
    SystemdCredentialStore,
    open_stores,
)
from tests.harness import DaemonHarness, daemon_config, serve_http, wait_until

PLUGIN = '''
"""A deployment's store: secrets in memory, under demo:NAME (a stand-in for
a cloud secret manager)."""

SECRETS = {}


class DemoStore:
    prefix = "demo"

    def get(self, ref):
        from memorizzd.vault import SecretNotFoundError

        try:
            return SECRETS[ref.removeprefix("demo:")]
        except KeyError:
            raise SecretNotFoundError(f"secret {ref!r} is not in the demo store") from None

    def put(self, ref, secret):
        raise NotImplementedError

    def put_many(self, secrets):
        raise NotImplementedError

    def delete(self, ref):
        raise NotImplementedError

    def refs(self):
        return []


def factory(config):
    return DemoStore()
'''


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """``mz_demo_store`` on ``sys.path``, with an entry point ``demo`` in the
    group ``memorizz.credential_stores`` (a ``.dist-info`` beside it)."""
    (tmp_path / "mz_demo_store.py").write_text(textwrap.dedent(PLUGIN))
    info = tmp_path / "mz_demo_store-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: mz-demo-store\nVersion: 1.0\n"
    )
    (info / "entry_points.txt").write_text(
        "[memorizz.credential_stores]\ndemo = mz_demo_store:factory\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import mz_demo_store  # type: ignore[import-not-found]  # made above

    yield mz_demo_store
    sys.modules.pop("mz_demo_store", None)


def bearer_guard(app: Any, token: str) -> Any:
    async def guarded(scope: Any, receive: Any, send: Any) -> None:
        if (
            scope["type"] == "http"
            and dict(scope["headers"]).get(b"authorization")
            != f"Bearer {token}".encode()
        ):
            await send({"type": "http.response.start", "status": 401, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        await app(scope, receive, send)

    return guarded


def http_server(name: str, url: str, token: str) -> m.ServerSpec:
    return m.ServerSpec(
        name=name,
        transport="streamable_http",
        url=url,
        auth="bearer",
        token=token,
        allow_private_network=True,
    )


@pytest.mark.parametrize("plugin_name", ["mz_demo_store:factory", "demo"])
def test_a_secret_from_each_store_reaches_its_server_and_nowhere_else(
    base_dir: str,
    plugin: Any,
    plugin_name: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    in_vault, in_systemd, in_plugin = (secrets.token_urlsafe(20) for _ in range(3))
    creds = Path(base_dir, "credentials")
    creds.mkdir()
    (creds / "api-token").write_text(in_systemd + "\n")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(creds))
    plugin.SECRETS["api-token"] = in_plugin
    caplog.set_level(logging.DEBUG)
    with (
        serve_http("streamable_http", wrap=lambda a: bearer_guard(a, in_vault)) as u1,
        serve_http("streamable_http", wrap=lambda a: bearer_guard(a, in_systemd)) as u2,
        serve_http("streamable_http", wrap=lambda a: bearer_guard(a, in_plugin)) as u3,
    ):
        config = daemon_config(
            base_dir,
            credentials=Credentials(stores=["vault", "systemd", plugin_name]),
            servers=[
                http_server("systemd", u2, "credential:api-token"),
                http_server("plugin", u3, "demo:api-token"),
                http_server("missing", u2, "credential:absent"),
            ],
        )
        with DaemonHarness.running(config) as d, d.client() as c:
            c.add_server(http_server("vault", u1, in_vault))
            for name in ("vault", "systemd", "plugin"):
                d.wait_ready(name)
                result = c.call_tool(name, "echo", {"text": name})
                assert result.content[0]["text"] == name
            wait_until(lambda: c.server_status("missing")[0].last_error is not None)
            missing = c.server_status("missing")[0]
            assert "'credential:absent'" in (missing.last_error or "")
            shown = msgspec.json.encode(
                [c.server_status(), c.list_servers(), c.audit().records]
            ).decode()
    logged = "\n".join(r.getMessage() for r in caplog.records) + caplog.text
    state = sqlite3.connect(os.path.join(base_dir, "state", "state.db"))
    try:
        rows = "\n".join(state.iterdump())
    finally:
        state.close()
    for secret in (in_vault, in_systemd, in_plugin):
        assert secret not in shown
        assert secret not in logged
        assert secret not in rows


def test_a_systemd_reference_without_the_systemd_store_is_never_sent(
    base_dir: str,
) -> None:
    """``token = "credential:NAME"`` with ``[credentials] stores`` lacking
    ``systemd``: the reference went to the server as the token itself."""
    heard: list[bytes] = []

    def listening(app: Any) -> Any:
        async def recorded(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "http":
                heard.append(dict(scope["headers"]).get(b"authorization", b""))
            await app(scope, receive, send)

        return recorded

    with serve_http("streamable_http", wrap=listening) as url:
        config = daemon_config(
            base_dir,
            credentials=Credentials(stores=["vault"]),
            servers=[http_server("mem0", url, "credential:mem0-key")],
        )
        with DaemonHarness.running(config) as d, d.client() as c:
            wait_until(lambda: c.server_status("mem0")[0].last_error is not None)
            status = c.server_status("mem0")[0]
    assert status.state != "ready"
    assert (
        "'credential:mem0-key' is a systemd credential reference, but"
        ' [credentials] stores does not include "systemd"'
    ) in (status.last_error or "")
    assert heard == []  # nothing was sent with it


def test_systemd_credentials_are_read_only_files(tmp_path: Path) -> None:
    (tmp_path / "k").write_text("value\n")
    store = SystemdCredentialStore(str(tmp_path))
    assert store.get("credential:k") == "value"
    assert store.refs() == []
    for bad in ("credential:../k", "credential:", "credential:a/b", "other:k"):
        with pytest.raises(SecretNotFoundError):
            store.get(bad)
    with pytest.raises(SecretNotFoundError, match="no credential 'absent'"):
        store.get("credential:absent")
    with pytest.raises(SecretNotFoundError, match="CREDENTIALS_DIRECTORY"):
        SystemdCredentialStore(None).get("credential:k")
    with pytest.raises(ReadOnlyStoreError):
        store.put("credential:k", "x")
    (tmp_path / "empty").write_text("")
    with pytest.raises(VaultError, match="empty"):
        store.get("credential:empty")


class _Vault:
    def __init__(self) -> None:
        self.data: dict[str, str] = {}

    def get(self, ref: str) -> str:
        return self.data[ref]

    def put(self, ref: str, secret: str) -> None:
        self.data[ref] = secret

    def put_many(self, secrets: dict[str, str]) -> None:
        self.data.update(secrets)

    def delete(self, ref: str) -> None:
        self.data.pop(ref, None)

    def refs(self) -> list[str]:
        return list(self.data)


def test_references_route_to_their_store_and_writes_to_the_vault(
    tmp_path: Path, base_dir: str
) -> None:
    (tmp_path / "k").write_text("from-systemd")
    vault = _Vault()
    stores = open_stores(
        ["vault", "systemd"],
        vault,
        config=daemon_config(base_dir),
        environ={"CREDENTIALS_DIRECTORY": str(tmp_path)},
    )
    assert isinstance(stores, CredentialStores)
    stores.put("server/a/token", "credential:k")
    assert vault.data == {"server/a/token": "credential:k"}
    assert stores.resolve(stores.get("server/a/token")) == "from-systemd"
    assert stores.resolve("plain-token") == "plain-token"
    assert stores.resolve("demo:x") == "demo:x"  # no such store: a plain value


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("nope", "no entry point"),
        ("no_such_module_here:factory", "cannot load it: ModuleNotFoundError"),
    ],
)
def test_a_store_that_cannot_be_loaded_stops_the_start(
    base_dir: str, name: str, message: str
) -> None:
    with pytest.raises(VaultKeyError, match=message):
        open_stores(["vault", name], _Vault(), config=daemon_config(base_dir))


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("nope", "no entry point"),
        ("no_such_module_here:factory", "cannot load it: ModuleNotFoundError"),
    ],
)
def test_check_config_refuses_a_store_that_cannot_be_found(
    base_dir: str, name: str, message: str
) -> None:
    """``--check-config`` passed it, and the start failed."""
    import subprocess

    from tests.process import DAEMON_EXE

    config = Path(base_dir, "memorizzd.toml")
    config.write_text(f'[credentials]\nstores = ["vault", "{name}"]\n')
    check = subprocess.run(  # noqa: PLW1510 - the exit status is the assertion
        [DAEMON_EXE, "--config", str(config), "--check-config"],
        capture_output=True,
        text=True,
    )
    assert check.returncode == 78, check.stdout + check.stderr
    assert message in check.stderr
    assert check.stderr.count("\n") == 1
    # a start stops as early: no vault key made for a daemon that never ran
    state = Path(base_dir, "state")
    start = subprocess.run(  # noqa: PLW1510 - the exit status is the assertion
        [DAEMON_EXE, "--config", str(config), "--state-dir", str(state),
         "--socket", str(Path(base_dir, "d.sock"))],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert start.returncode == 78, start.stderr
    assert message in start.stderr
    assert not Path(state, "vault.key").exists()
