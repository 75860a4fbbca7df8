"""``vault/rotate`` against removals: a rotation reads every secret and
rewrites it; a secret deleted in between (a server removed while the key
rotates) must stay deleted, never be written back under the new key.

The interleaving is forced, not hoped for: the real store's read of the
rotation stops at an event while the deletion runs (or tries to), and the
daemon test removes servers while rotations run, many times."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.fernet import Fernet

from memorizzd.store import Store
from memorizzd.vault import CANARY_REF, FernetCredentialStore, KeySource
from memorizzd.vault.keys import ENV_KEY
from tests.harness import DaemonHarness, daemon_config, light_spec

SECRET = "rotation-race-marker-5c1e8a"  # noqa: S105 - a test marker
GONE = "server/gone/token"
KEPT = "server/kept/token"


@pytest.fixture(autouse=True)
def no_outside_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_KEY, raising=False)
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)


class PausingStore(Store):
    """The real store, whose rotation read (``all_secrets``) sets ``read``,
    then waits for ``resume`` (at most ``wait_s``) before it returns."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.read = threading.Event()
        self.resume = threading.Event()
        self.wait_s = 10.0

    def all_secrets(self) -> list[tuple[str, bytes]]:
        rows = super().all_secrets()
        self.read.set()
        self.resume.wait(self.wait_s)
        return rows


@pytest.fixture
def store(tmp_path: Path) -> Iterator[PausingStore]:
    s = PausingStore(str(tmp_path / "state"))
    yield s
    s.close()


def keys(*k: bytes) -> KeySource:
    return KeySource("test keys", "environment", k)


def filled(store: Store) -> tuple[FernetCredentialStore, bytes, bytes]:
    old, new = Fernet.generate_key(), Fernet.generate_key()
    FernetCredentialStore.open(store, keys(old)).put_many({GONE: SECRET, KEPT: SECRET})
    return FernetCredentialStore.open(store, keys(new, old)), old, new


def test_a_delete_during_a_rotation_is_not_undone(store: PausingStore) -> None:
    """The rotation has read every row; a removal deletes one of them now.
    Without the rotation's lock the delete went through at once, and the
    rotation then wrote the row back (under the new key): the removed
    server's secret was in the vault again."""
    vault, _, new = filled(store)
    store.wait_s = 1.0  # the longest the rotation waits for the delete
    deleted = threading.Event()
    errors: list[BaseException] = []

    def rotate() -> None:
        try:
            vault.rotate()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            errors.append(exc)

    def delete() -> None:
        vault.delete(GONE)
        deleted.set()
        store.resume.set()  # the rotation may go on (it has, if serialized)

    rotation = threading.Thread(target=rotate)
    rotation.start()
    assert store.read.wait(10)
    removal = threading.Thread(target=delete)
    removal.start()
    rotation.join(20)
    removal.join(20)
    assert not rotation.is_alive()
    assert not removal.is_alive()
    assert errors == []
    assert deleted.is_set()
    assert GONE not in store.secret_refs()
    assert FernetCredentialStore.open(store, keys(new)).get(KEPT) == SECRET


def test_a_row_deleted_by_another_handle_is_not_written_back(
    store: PausingStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process (``memorizzd --forget-secrets``, a second handle on
    ``state.db``) takes no lock of ours: the rotation's rewrite itself must
    leave a row alone that is gone, or no longer what it read."""
    vault, old, _ = filled(store)
    other = Store(str(tmp_path / "state"))
    writer = FernetCredentialStore(other, keys(old))

    def read_then_others_write() -> list[tuple[str, bytes]]:
        rows = Store.all_secrets(store)
        other.delete_secrets([GONE])
        writer.put(KEPT, "rewritten meanwhile")  # under the old key
        return rows

    monkeypatch.setattr(store, "all_secrets", read_then_others_write)
    try:
        assert vault.rotate() == 1  # the canary only
    finally:
        other.close()
    assert GONE not in store.secret_refs()
    assert vault.get(KEPT) == "rewritten meanwhile"
    # Left as the other handle wrote it: under the old key, not rotated over.
    assert FernetCredentialStore(store, keys(old)).get(KEPT) == "rewritten meanwhile"


def test_servers_removed_during_rotations_leave_no_secret(base_dir: str) -> None:
    """Through the daemon: servers with secrets removed while ``vault/rotate``
    runs again and again; none of their secrets survives, and every one of
    the servers that stay still reads."""
    with DaemonHarness.running(daemon_config(base_dir)) as d:
        with d.client() as c:
            for i in range(24):
                c.add_server(
                    light_spec(f"s{i}", secret_env={"API_KEY": f"{SECRET}-{i}"})
                )
        stop = threading.Event()
        rotations: list[int] = []
        errors: list[BaseException] = []

        def rotate() -> None:
            try:
                with d.client() as c:
                    while not stop.is_set():
                        rotations.append(c.rotate_vault().reencrypted)
            except BaseException as exc:  # noqa: BLE001 - handed to the test
                errors.append(exc)

        rotator = threading.Thread(target=rotate)
        rotator.start()
        try:
            with d.client() as c:
                for i in range(0, 24, 2):
                    c.remove_server(f"s{i}")
        finally:
            stop.set()
            rotator.join(30)
        assert errors == []
        assert rotations
        with d.client() as c:
            assert c.rotate_vault().reencrypted == 12 + 1  # and the canary
    state = Store(str(Path(base_dir, "state")))
    try:
        refs = state.secret_refs()
    finally:
        state.close()
    assert sorted(refs) == sorted(
        [CANARY_REF, *(f"server/s{i}/env/API_KEY" for i in range(1, 24, 2))]
    )
