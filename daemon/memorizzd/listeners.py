"""The daemon's sockets: the operator socket and one per agent profile.

Each socket is either handed over by systemd socket activation
(``LISTEN_FDS``/``LISTEN_PID``/``LISTEN_FDNAMES``: ``FileDescriptorName=operator``
or the profile's name) or bound here:

* the operator socket at ``socket`` (group ``[operators] socket_group`` and
  0660 when set or as root, else 0600);
* an agent socket at ``<agents_dir>/<profile>/api.sock``, in a directory of its
  own (0755, as is ``agents_dir``, whatever the umask: a container mounts just
  that directory, and its callers must reach the socket), 0660 with
  the profile's ``socket_group``; 0666 when the profile names ``uids``/``gids``
  (the in-process check does the gating) and no group; else 0660.

A stale socket from a crashed daemon is replaced (``prepare_socket_path``:
connect first, unlink only when nobody answers). Sockets bound here are
unlinked on exit; activated ones belong to systemd and stay.
"""

from __future__ import annotations

import logging
import os
import socket
import stat
from collections.abc import Collection, Mapping
from contextlib import suppress
from typing import Final

import anyio
import anyio.abc
import msgspec

from memorizzd.config import Config, Limits, Profile, gid_of
from memorizzd.rpc.authority import SocketRule, agent_rule, operator_rule
from memorizzd.rpc.server import SocketInUseError, prepare_socket_path

log = logging.getLogger("memorizzd.listeners")

OPERATOR_NAME: Final = "operator"
AGENT_SOCKET: Final = "api.sock"
MCP_SOCKET: Final = "mcp.sock"
"""The MCP face's socket, beside each API socket (``face.py``)."""
FACE_SUFFIX: Final = "-mcp"
"""A face's name: its API socket's name plus this (``operator-mcp``); under
socket activation, the FileDescriptorName of its socket."""
_LISTEN_FDS_START: Final = 3


class Listening(msgspec.Struct, kw_only=True):
    """One socket, ready to serve: what it is and who may use it."""

    name: str
    """``operator`` or the profile's name."""
    path: str
    listener: anyio.abc.SocketListener
    rule: SocketRule
    limits: Limits | None
    activated: bool
    face: bool = False
    """The MCP face beside the API socket of the same rule (``mcp.sock``)."""


def face_socket_path(api_socket: str) -> str:
    """The MCP face's socket beside an API socket: ``mcp.sock`` in its directory."""
    return os.path.join(os.path.dirname(api_socket) or ".", MCP_SOCKET)


def agent_socket_path(config: Config, profile: str) -> str:
    """``<agents_dir>/<profile>/api.sock`` (agents_dir: default ``agents``
    next to the operator socket)."""
    base = config.agents_dir or os.path.join(
        os.path.dirname(config.socket) or ".", "agents"
    )
    return os.path.join(base, profile, AGENT_SOCKET)


def activated_sockets(
    environ: Mapping[str, str] | None = None,
) -> dict[str, socket.socket]:
    """The sockets systemd passed, by FileDescriptorName (sd_listen_fds_with_names).

    Unsets ``LISTEN_*`` so that nothing else takes them as its own.
    """
    env = os.environ if environ is None else environ
    if env.get("LISTEN_PID") != str(os.getpid()):
        return {}
    try:
        count = int(env.get("LISTEN_FDS", "0"))
    except ValueError:
        return {}
    names = env.get("LISTEN_FDNAMES", "").split(":")
    found: dict[str, socket.socket] = {}
    for i in range(count):
        fd = _LISTEN_FDS_START + i
        name = names[i] if i < len(names) and names[i] else f"fd{fd}"
        sock = socket.socket(fileno=fd)
        if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM:
            log.warning(
                "ignoring activated fd %d (%s): not a Unix stream socket", fd, name
            )
            sock.detach()
            continue
        os.set_inheritable(fd, False)
        sock.setblocking(False)
        found[name] = sock
    if environ is None:
        for key in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
            os.environ.pop(key, None)
    return found


async def open_all(
    config: Config,
    inherited: dict[str, socket.socket] | None = None,
    *,
    only: Collection[str] | None = None,
) -> list[Listening]:
    """Every socket the config asks for (activated ones where systemd passed them);
    with ``only``, those of the profiles so named (a reload's new ones).

    On failure, whatever was already opened is closed again.
    """
    inherited = activated_sockets() if inherited is None else inherited
    opened: list[Listening] = []
    # Shared (0660, its directory 0755) as root, or with a socket_group (the
    # daemon as the user memorizzd, its operators in memorizzd-operators);
    # else the daemon's uid alone may reach it.
    shared = os.geteuid() == 0 or config.operators.socket_group is not None
    wanted = [
        (
            OPERATOR_NAME,
            config.socket,
            operator_rule(config.operators),
            None,
            (
                0o660 if shared else 0o600,
                config.operators.socket_group,
                0o755 if shared else 0o700,
            ),
        ),
        *(
            (
                profile.name,
                agent_socket_path(config, profile.name),
                agent_rule(profile),
                profile.limits,
                (agent_mode(profile), profile.socket_group, 0o755),
            )
            for profile in config.profiles
        ),
    ]
    if only is not None:
        wanted = [each for each in wanted if each[0] in only]
    try:
        for name, path, rule, limits, (mode, group, directory_mode) in wanted:
            opened.append(
                await _open(
                    name,
                    path,
                    rule,
                    limits,
                    inherited,
                    mode=mode,
                    group=group,
                    directory_mode=directory_mode,
                )
            )
            if config.mcp_face:  # its MCP face: same directory, rule and limits
                face = await _open(
                    name + FACE_SUFFIX,
                    face_socket_path(path),
                    rule,
                    limits,
                    inherited,
                    mode=mode,
                    group=group,
                    directory_mode=directory_mode,
                )
                opened.append(msgspec.structs.replace(face, face=True))
    except BaseException:
        await close_all(opened)
        raise
    for name, sock in inherited.items():
        if name not in {item.name for item in opened}:
            log.warning("activated socket %r matches no profile; closing it", name)
            sock.close()
    return opened


async def close_all(opened: list[Listening]) -> None:
    for item in opened:
        with suppress(Exception):
            await item.listener.aclose()
        if not item.activated:
            with suppress(FileNotFoundError):
                os.unlink(item.path)


def agent_mode(profile: Profile) -> int:
    """An agent socket's mode (the module's docstring says why)."""
    if profile.socket_group is None and (profile.uids or profile.gids):
        return 0o666
    return 0o660


async def _open(
    name: str,
    path: str,
    rule: SocketRule,
    limits: Limits | None,
    inherited: dict[str, socket.socket],
    *,
    mode: int,
    group: int | str | None,
    directory_mode: int,
) -> Listening:
    sock = inherited.get(name)
    if sock is not None:
        listener = await anyio.abc.SocketListener.from_socket(sock)
        log.info("%s: using the socket systemd passed (%s)", name, path)
        return Listening(
            name=name,
            path=path,
            listener=listener,
            rule=rule,
            limits=limits,
            activated=True,
        )
    directory = os.path.dirname(path) or "."
    if rule.role == "agent":
        # agents_dir and the profile's directory must be traversable by the
        # profile's callers whatever the daemon's umask (UMask=0077 under systemd)
        _ensure_directory(os.path.dirname(directory), directory_mode)
        _ensure_directory(directory, directory_mode)
    else:
        os.makedirs(directory, mode=directory_mode, exist_ok=True)
    _check_directory(directory)
    prepare_socket_path(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        old_umask = os.umask(0o177)  # never wider than 0600 before the chmod
        try:
            sock.bind(path)
        finally:
            os.umask(old_umask)
        if group is not None:
            os.chown(path, -1, gid_of(group))
        os.chmod(path, mode)
        sock.listen(socket.SOMAXCONN)
        sock.setblocking(False)
        listener = await anyio.abc.SocketListener.from_socket(sock)
    except BaseException:
        sock.close()
        with suppress(FileNotFoundError):
            os.unlink(path)
        raise
    return Listening(
        name=name,
        path=path,
        listener=listener,
        rule=rule,
        limits=limits,
        activated=False,
    )


def _ensure_directory(directory: str, mode: int) -> None:
    """Create it if needed; give a directory the daemon owns exactly ``mode``."""
    os.makedirs(directory, mode=mode, exist_ok=True)
    if os.stat(directory).st_uid == os.geteuid():
        os.chmod(directory, mode)


def _check_directory(directory: str) -> None:
    """The socket's directory must be a real directory nobody else can write to."""
    st = os.lstat(directory)
    if not stat.S_ISDIR(st.st_mode):
        raise SocketInUseError(f"{directory} is not a directory")
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        raise SocketInUseError(
            f"{directory} is writable by others; refusing to put a socket there"
        )
