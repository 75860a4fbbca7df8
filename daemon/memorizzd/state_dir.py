"""The state directory: the daemon's own, 0700, with its files 0600.

It holds the state database (the audit trail, the run-time servers with their
env values, the vault's ciphertexts), the vault key and the audit key. At start,
before anything in it is opened, ``secure_state_dir`` makes sure that it is private:

* missing: created 0700 (parents as needed), whatever the umask;
* an existing directory owned by the daemon's uid: tightened to 0700 if it is
  wider (made by hand, or by an older version), and logged;
* owned by another uid, not a directory, or a symbolic link: refused, and the
  daemon does not start (``StateDirError``). The other uid could read or swap
  the keys whatever the mode; and a link is refused rather than followed, so
  that a link planted where the directory should be never gets the daemon to
  chmod, or write its database into, the directory it names;
* the files the daemon keeps there (``PRIVATE_FILES``) that exist: tightened to
  0600 if wider, refused like the directory when they are not regular files
  owned by the daemon's uid. SQLite creates the WAL and shared-memory files
  with the database file's mode, so a database left 0644 would have made them
  0644 too.

Files created later are made 0600 where they are created (``os.open`` with
0600 and ``O_EXCL``, or ``fchmod``), so the umask only ever narrows them. The
key files are written whole or not at all (``create_private_file``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from typing import Final

log = logging.getLogger("memorizzd.state")

DIRECTORY_MODE: Final = 0o700
FILE_MODE: Final = 0o600
PRIVATE_FILES: Final = (
    "state.db",
    "state.db-wal",
    "state.db-shm",
    "state.db-journal",
    "vault.key",  # memorizzd.vault.keys.KEY_FILE
    "vault.key.tmp",  # a key rotation cut short
    "audit.key",  # memorizzd.audit.KEY_FILE
    "audit.key.tmp",  # a first start cut short
    "audit.spool",  # memorizzd.spool.FILE_NAME
)
"""What the daemon keeps in the state directory (a test checks the key names)."""


class StateDirError(Exception):
    """The state directory (or a file in it) is not the daemon's own."""


def secure_state_dir(path: str) -> None:
    """Create ``path`` 0700, or check and tighten the existing directory and its files."""
    try:
        os.makedirs(path, mode=DIRECTORY_MODE, exist_ok=True)
    except FileExistsError:
        pass  # a file or a dangling link: described below
    except OSError as exc:
        raise StateDirError(
            f"cannot create the state directory {path}: {exc.strerror}"
        ) from None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise StateDirError(_not_a_directory(path, exc)) from None
    try:
        _tighten(fd, path, "state directory", DIRECTORY_MODE)
        for name in PRIVATE_FILES:
            _secure_file(fd, path, name)
    finally:
        os.close(fd)


ROOM_NEEDED: Final = 64 * 1024
"""Free bytes under which the state directory's file system is full: SQLite
needs more than that to open the database (its 32 KiB shared-memory file)
and to write a transaction."""


def free_bytes(path: str) -> int | None:
    """How many bytes the daemon may still write on the file system of
    ``path`` (None: it cannot be told)."""
    try:
        found = os.statvfs(path)
    except OSError:
        return None
    return found.f_bavail * found.f_frsize


def no_room(path: str) -> bool:
    """Whether the file system of ``path`` is full (``ROOM_NEEDED``)."""
    free = free_bytes(path)
    return free is not None and free < ROOM_NEEDED


def create_private_file(path: str, data: bytes) -> bool:
    """``data`` in a new file at ``path`` (0600), whole or not at all: written
    to ``path.tmp`` beside it (``write_private_file``), then linked into
    place, never over a file another start made first (then False, and that
    one stands). Created in place, a daemon killed between the create and the
    write left an empty file. The caller fsyncs the directory (``fsync_dir``)
    when it is True; an ``OSError`` is the caller's to say."""
    tmp = f"{path}.tmp"
    write_private_file(tmp, data)
    try:
        os.link(tmp, path)  # never replaces: another start made it first
    except FileExistsError:
        return False
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    return True


def write_private_file(path: str, data: bytes) -> None:
    """``data`` in a new file at ``path``, 0600 and fsynced. Whatever is there
    is unlinked first, never written through: a leftover temporary file (its
    mode would survive ``O_CREAT``), or another name of a key file itself (a
    start killed between linking the new key file and unlinking its
    temporary), whose truncation would empty the key file. A write that
    fails (a full disk) leaves no piece of it behind."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(path, flags, FILE_MODE)
    try:
        view = memoryview(data)
        while view:  # a short write (a full disk): the next one says why
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise
    finally:
        os.close(fd)


def fsync_dir(path: str) -> None:
    """fsync the directory ``path``: the names linked into it last are durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _secure_file(dir_fd: int, directory: str, name: str) -> None:
    path = os.path.join(directory, name)
    try:
        fd = os.open(
            name,
            os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
            dir_fd=dir_fd,
        )
    except FileNotFoundError:
        return
    except OSError as exc:
        what = "a symbolic link" if _is_link(dir_fd, name) else exc.strerror
        raise StateDirError(
            f"{path} is {what}: the state directory's files must be the daemon's own"
            " regular files; refusing to start"
        ) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise StateDirError(
                f"{path} is not a regular file: the state directory's files must be"
                " the daemon's own regular files; refusing to start"
            )
        _tighten(fd, path, "file", FILE_MODE)
    finally:
        os.close(fd)


def _tighten(fd: int, path: str, what: str, mode: int) -> None:
    info = os.fstat(fd)
    uid = os.geteuid()
    if info.st_uid != uid:
        raise StateDirError(
            f"{what} {path} is owned by uid {info.st_uid}, and memorizzd runs as uid"
            f" {uid}: refusing to start (another user could read or replace the keys"
            " and the database). Run memorizzd as its owner, or chown it"
        )
    current = stat.S_IMODE(info.st_mode)
    if current == mode:
        return
    try:
        os.fchmod(fd, mode)
    except OSError as exc:  # a read-only file system
        raise StateDirError(
            f"{what} {path} is {current:04o} and cannot be tightened to {mode:04o}:"
            f" {exc.strerror}; refusing to start"
        ) from None
    if current & 0o077:
        log.warning(
            "%s %s was %04o, open to other users: tightened it to %04o",
            what,
            path,
            current,
            mode,
        )


def _is_link(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(name, dir_fd=dir_fd).st_mode)
    except OSError:
        return False


def _not_a_directory(path: str, exc: OSError) -> str:
    try:
        kind = os.lstat(path).st_mode
    except OSError:
        kind = 0
    if stat.S_ISLNK(kind):
        what = "a symbolic link; set state_dir to the directory itself"
    elif kind and not stat.S_ISDIR(kind):
        what = "not a directory"
    else:
        what = f"unusable: {exc.strerror}"
    return f"state directory {path} is {what}; refusing to start"
