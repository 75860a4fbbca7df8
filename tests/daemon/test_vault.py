"""The vault: Fernet ciphertexts bound to their refs, key sources, rotation,
and a wrong key refused at startup by the real executable."""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.fernet import Fernet

from memorizz.api.errors import UnavailableError
from memorizzd.store import Store, StoreError
from memorizzd.vault import (
    CANARY_REF,
    FernetCredentialStore,
    KeySource,
    VaultError,
    VaultKeyError,
    load_keys,
)
from memorizzd.vault.keys import CREDENTIAL_NAME, ENV_KEY, KEY_FILE
from tests.harness import (
    DAEMON_EXE,
    DaemonHarness,
    daemon_config,
    daemon_process,
    stdio_spec,
    wait_until,
)
from tests.process import empty_config

SECRET = "vault-marker-4e9a1c7b3f"  # noqa: S105 - a test marker


@pytest.fixture(autouse=True)
def no_outside_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_KEY, raising=False)
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(str(tmp_path / "state"))
    yield s
    s.close()


def source(*keys: bytes) -> KeySource:
    return KeySource("test keys", "environment", tuple(keys))


def test_round_trip_and_refs(store: Store) -> None:
    vault = FernetCredentialStore.open(store, source(Fernet.generate_key()))
    vault.put("server/a/token", SECRET)
    vault.put_many({"server/a/header/X-K": "h", "server/b/env/K": "e"})
    assert vault.get("server/a/token") == SECRET
    assert vault.refs() == ["server/a/header/X-K", "server/a/token", "server/b/env/K"]
    vault.delete("server/a/token")
    with pytest.raises(VaultError, match="not in the vault"):
        vault.get("server/a/token")
    raw = store.path.read_bytes() + Path(f"{store.path}-wal").read_bytes()
    assert SECRET.encode() not in raw


def test_the_key_file_is_made_0600_once_and_announced(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    state = str(tmp_path / "state")
    first = load_keys(state)
    path = Path(state, KEY_FILE)
    assert first.kind == "key_file"
    assert first.path == str(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert "BACK IT UP" in caplog.text
    assert load_keys(state).keys == first.keys
    assert first.keys[0].decode() not in repr(first)


def test_keys_from_the_systemd_credential_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    creds = tmp_path / "creds"
    creds.mkdir()
    key = Fernet.generate_key()
    (creds / CREDENTIAL_NAME).write_bytes(key + b"\n")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(creds))
    monkeypatch.setenv(ENV_KEY, Fernet.generate_key().decode())
    found = load_keys(str(tmp_path / "state"))
    assert (found.kind, found.keys) == ("credential", (key,))
    assert not (tmp_path / "state" / KEY_FILE).exists()


def test_keys_from_the_environment_several(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    new, old = Fernet.generate_key(), Fernet.generate_key()
    monkeypatch.setenv(ENV_KEY, f"{new.decode()},\n{old.decode()}\n")
    found = load_keys(str(tmp_path / "state"))
    assert (found.kind, found.keys) == ("environment", (new, old))
    assert not (tmp_path / "state" / KEY_FILE).exists()


def test_a_malformed_key_is_named_by_source_not_content(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_KEY, SECRET)
    with pytest.raises(VaultKeyError) as caught:
        load_keys(str(tmp_path))
    assert ENV_KEY in str(caught.value)
    assert SECRET not in str(caught.value)


def test_old_keys_still_decrypt_and_rotate_moves_to_the_primary(store: Store) -> None:
    old, new = Fernet.generate_key(), Fernet.generate_key()
    vault = FernetCredentialStore.open(store, source(old))
    vault.put("server/a/token", SECRET)
    rotated = FernetCredentialStore.open(store, source(new, old))
    assert rotated.get("server/a/token") == SECRET
    with pytest.raises(VaultKeyError):  # the canary is still under the old key
        FernetCredentialStore.open(store, source(new))
    assert rotated.rotate() == 2  # the secret and the canary
    assert rotated.rotate() == 2  # idempotent
    only_new = FernetCredentialStore.open(store, source(new))
    assert only_new.get("server/a/token") == SECRET


def test_rotate_with_a_new_key_rewrites_the_key_file(tmp_path: Path) -> None:
    state = str(tmp_path / "state")
    keys = load_keys(state)
    s = Store(state)
    try:
        vault = FernetCredentialStore.open(s, keys)
        vault.put("server/a/token", SECRET)
        assert vault.rotate(new_key=True) == 2
        written = load_keys(state)
        assert len(written.keys) == 2
        assert written.keys[1] == keys.keys[0]
        assert stat.S_IMODE(Path(state, KEY_FILE).stat().st_mode) == 0o600
        primary_only = FernetCredentialStore.open(s, source(written.keys[0]))
        assert primary_only.get("server/a/token") == SECRET
    finally:
        s.close()


def test_a_leftover_tmp_key_file_does_not_leak_its_mode_to_the_new_key(
    tmp_path: Path,
) -> None:
    """A rotation cut short leaves vault.key.tmp; one made 0644 (by hand, or by
    an older version under a loose umask) kept that mode through O_CREAT, and
    the rewritten key file was world-readable after the rename."""
    state = str(tmp_path / "state")
    keys = load_keys(state)
    leftover = Path(state, f"{KEY_FILE}.tmp")
    leftover.write_bytes(b"half a key")
    os.chmod(leftover, 0o644)
    s = Store(state)  # the start tightens what it finds ...
    try:
        assert stat.S_IMODE(leftover.stat().st_mode) == 0o600
        os.chmod(leftover, 0o644)  # ... and the rotation does not rely on it
        FernetCredentialStore.open(s, keys).rotate(new_key=True)
    finally:
        s.close()
    assert stat.S_IMODE(Path(state, KEY_FILE).stat().st_mode) == 0o600
    assert not leftover.exists()


def test_new_key_is_only_for_the_key_file(store: Store) -> None:
    vault = FernetCredentialStore.open(store, source(Fernet.generate_key()))
    with pytest.raises(VaultKeyError, match="only for the key file"):
        vault.rotate(new_key=True)


def test_a_swapped_ciphertext_is_detected(store: Store) -> None:
    vault = FernetCredentialStore.open(store, source(Fernet.generate_key()))
    vault.put_many({"server/a/token": SECRET, "server/b/token": "other"})
    (token_a,) = [t for ref, t in store.all_secrets() if ref == "server/a/token"]
    store.put_secrets([("server/b/token", token_a)])
    with pytest.raises(VaultError, match="another record") as caught:
        vault.get("server/b/token")
    assert SECRET not in str(caught.value)
    assert vault.get("server/a/token") == SECRET


def test_a_wrong_key_fails_open_against_the_canary(store: Store) -> None:
    vault = FernetCredentialStore.open(store, source(Fernet.generate_key()))
    assert store.secret(CANARY_REF) is None  # an empty vault is not touched
    vault.put("server/x/token", "secret")
    assert store.secret(CANARY_REF) is not None
    with pytest.raises(VaultKeyError, match="test keys"):
        FernetCredentialStore.open(store, source(Fernet.generate_key()))


def _start(base: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # noqa: PLW1510 - the exit status is the assertion
        [
            DAEMON_EXE,
            "--config",
            empty_config(base),
            "--socket",
            os.path.join(base, "d.sock"),
            "--state-dir",
            os.path.join(base, "state"),
            "--log-level",  # no start-up notes (the open files limit) around the error
            "warning",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )


def test_the_daemon_refuses_a_wrong_key_with_exit_78(base_dir: str) -> None:
    with daemon_process(base_dir) as d, d.client() as c:
        assert c.hello().protocol_version == 1
        c.add_server(stdio_spec("s", secret_env={"API_KEY": "k"}))
    key_file = Path(base_dir, "state", KEY_FILE)
    right = key_file.read_bytes()
    wrong = Fernet.generate_key()
    key_file.write_bytes(wrong + b"\n")
    env = {k: v for k, v in os.environ.items() if k != ENV_KEY}
    refused = _start(base_dir, env)
    assert refused.returncode == 78
    assert "Traceback" not in refused.stderr
    assert f"key file {key_file}" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    for key in (wrong, right.strip()):
        assert key.decode() not in refused.stderr
    other = Fernet.generate_key().decode()
    refused = _start(base_dir, env | {ENV_KEY: other})
    assert refused.returncode == 78
    assert ENV_KEY in refused.stderr
    assert other not in refused.stderr
    # Recovery from a lost key: forget the secrets, then start afresh.
    forgot = subprocess.run(
        [
            DAEMON_EXE,
            "--config",
            empty_config(base_dir),
            "--state-dir",
            os.path.join(base_dir, "state"),
            "--forget-secrets",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
        check=True,
    )
    assert "deleted 2 stored secrets" in forgot.stdout  # the secret and the canary
    with daemon_process(base_dir) as d, d.client() as c:
        assert c.hello().protocol_version == 1


def test_rotate_through_the_daemon(base_dir: str) -> None:
    with DaemonHarness.running(daemon_config(base_dir)) as d:
        d.add(stdio_spec("s", secret_env={"MY_SECRET": SECRET}))
        with d.client() as c:
            result = c.rotate_vault(new_key=True)
            assert result.reencrypted == 2
            assert result.new_key
            assert result.key_source.startswith("key file ")
            assert d.ctl("vault", "rotate") == 0
            audit = c.audit(limit=5).records
            assert [r.action for r in audit[:2]] == ["vault/rotate", "vault/rotate"]
    keys = Path(base_dir, "state", KEY_FILE).read_text().strip().split(",")
    assert len(keys) == 2


def test_a_deleted_key_file_in_front_of_secrets_stops_the_start_and_makes_no_key(
    base_dir: str,
) -> None:
    """A lost key file is not a first start: the daemon used to generate a new
    key (announcing "BACK IT UP"), fail against the canary, and leave that
    useless key where the operator would restore the old one."""
    with daemon_process(base_dir) as d, d.client() as c:
        c.add_server(stdio_spec("s", secret_env={"API_KEY": SECRET}))
    key_file = Path(base_dir, "state", KEY_FILE)
    lost = key_file.read_bytes().strip().decode()
    key_file.unlink()
    env = {k: v for k, v in os.environ.items() if k != ENV_KEY}
    refused = _start(base_dir, env)
    assert refused.returncode == 78
    expected = (
        f"memorizzd: vault: key file {key_file} is missing, and"
        f" {Path(base_dir, 'state', 'state.db')} holds secrets encrypted with it:"
        " restore it from your backup (or set the key that encrypted them), or run"
        " memorizzd --forget-secrets and re-add the credentials (see docs/auth.md)"
    )
    assert refused.stderr.strip().splitlines() == [expected]
    assert not key_file.exists()
    for secret in (SECRET, lost):
        assert secret not in refused.stderr
    key_file.write_text(lost + "\n")  # restored from the backup
    os.chmod(key_file, 0o600)
    with daemon_process(base_dir) as d:
        d.wait_ready("s")
        with d.client() as c:
            text = c.call_tool("s", "env", {"name": "API_KEY"}).content[0]["text"]
            assert text == SECRET


def test_a_truncated_ciphertext_fails_its_server_only_and_says_so(
    base_dir: str,
) -> None:
    config = daemon_config(base_dir)
    with DaemonHarness.running(config) as d:
        d.add(stdio_spec("cut", secret_env={"API_KEY": SECRET}))
        d.add(stdio_spec("whole", secret_env={"API_KEY": "whole"}))
    s = Store(config.state_dir)
    try:
        (token,) = [t for ref, t in s.all_secrets() if ref == "server/cut/env/API_KEY"]
        s.put_secrets([("server/cut/env/API_KEY", token[: len(token) // 2])])
    finally:
        s.close()
    with DaemonHarness.running(config) as d:
        d.wait_ready("whole")
        with d.client() as c:
            wait_until(
                lambda: c.server_status("cut")[0].state == "failed",
                what="cut failed",
            )
            (status,) = c.server_status("cut")
            assert status.last_error == (
                "credentials: secret 'server/cut/env/API_KEY' is damaged"
                " (truncated or not a Fernet token): set it again"
            )
            with pytest.raises(UnavailableError) as refused:
                c.call_tool("cut", "echo", {"text": "x"})
            assert SECRET not in str(refused.value)
            assert c.call_tool("whole", "env", {"name": "API_KEY"}).content[0][
                "text"
            ] == ("whole")


def test_a_rotation_cut_short_resumes_and_then_needs_no_old_key(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    old, new = Fernet.generate_key(), Fernet.generate_key()
    secrets = {f"server/s{i}/token": f"{SECRET}-{i}" for i in range(6)}
    FernetCredentialStore.open(store, source(old)).put_many(secrets)
    vault = FernetCredentialStore.open(store, source(new, old))
    write = store.rewrite_secrets

    def crash_half_way(tokens: list[tuple[str, bytes, bytes]]) -> int:
        # What a crash between two writes leaves (the store writes a rotation
        # in one transaction; a store that cannot must still be safe).
        monkeypatch.setattr(store, "rewrite_secrets", write)
        write(tokens[: len(tokens) // 2])
        raise StoreError("state database: disk I/O error")

    monkeypatch.setattr(store, "rewrite_secrets", crash_half_way)
    with pytest.raises(StoreError):
        vault.rotate()
    # Half under the new key, half under the old: both still read.
    reopened = FernetCredentialStore.open(store, source(new, old))
    assert {ref: reopened.get(ref) for ref in secrets} == secrets
    new_only = FernetCredentialStore.open(store, source(new))
    last = max(secrets)  # rows go in ref order: the last is still old
    with pytest.raises(VaultError, match="cannot be decrypted"):
        new_only.get(last)
    # Resumed: idempotent, all under the new key.
    assert reopened.rotate() == len(secrets) + 1  # and the canary
    assert reopened.rotate() == len(secrets) + 1
    new_only = FernetCredentialStore.open(store, source(new))
    assert {ref: new_only.get(ref) for ref in secrets} == secrets
