"""What a warm session to one upstream offers, whoever speaks it.

Two kinds implement ``Connection``: ``jsonrpc.JsonRpcSession``, our own MCP
client over a stdio server's pipes (no SDK, no model objects: a tool call's
arguments go out as the bytes the caller sent and its result comes back as
the bytes the server wrote), and ``session.SdkConnection``, the MCP SDK's
client for the HTTP transports (loaded only when a server needs it). A third,
``cognee.CogneeConnection``, is no MCP client at all: the built-in Cognee
Cloud bridge answers ``tools/list`` and ``tools/call`` itself.

Every method raises our classes only: ``RemoteError`` subclasses for answers,
``errors.ConnectionLost`` when the session is gone, ``TimeoutError`` never
(the caller owns the deadline and cancels).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Final, Protocol

import msgspec

from memorizz.api import methods as m
from memorizz.api.errors import TooLargeError, UpstreamError

CAPABILITIES = ("tools", "resources", "prompts")

ProgressHandler = Callable[[msgspec.Raw], Awaitable[None]]
"""Told each ``notifications/progress`` of a call: its params, raw (the
caller rewrites the token to its own)."""


class ToolResult(msgspec.Struct, frozen=True):
    """A ``tools/call`` result as the server wrote it."""

    raw: msgspec.Raw
    """The result object's JSON, verbatim (spliced into our reply)."""
    is_error: bool


class CallShape(msgspec.Struct, rename="camel"):
    """What the daemon checks of a tool result: MCP's required ``content``
    list and the ``isError`` flag; everything else passes through unread."""

    content: list[msgspec.Raw]
    is_error: bool = False


class Cursors:
    """A listing's pages, followed by cursor the same way by every client:
    to the end (no ``nextCursor``, or an empty one), at most ``limit``
    pages, never round a loop (a cursor the server gave before would
    bring the same pages again, up to the limit), and within ``max_bytes``
    for all the pages together (the server's ``max_result_bytes``: the
    transport caps each page alone, so a server that answered every page
    near the cap, with a fresh cursor, would have ``limit`` times as much
    decoded for one listing)."""

    def __init__(self, server: str, limit: int, *, method: str, max_bytes: int) -> None:
        self._server = server
        self._limit = limit
        self._method = method
        self._max_bytes = max_bytes
        self._read = 0
        self._seen: set[str] = set()

    def page(self, bytes_read: int) -> None:
        """Count a page's ``bytes_read`` (as the transport read them);
        ``TooLargeError`` once the listing's pages together exceed the cap."""
        self._read += bytes_read
        if self._read > self._max_bytes:
            server = self._server
            raise TooLargeError(
                f"{server}: {self._method}: the listing's pages together exceed "
                f"max_result_bytes ({self._max_bytes})",
                data={"server": server},
            )

    def follow(self, cursor: str | None) -> str | None:
        """The cursor a page ended with, to ask for the next page with (None:
        the listing is whole); ``UpstreamError`` when it must not be followed."""
        if not cursor:
            return None
        server = self._server
        if cursor in self._seen:
            raise UpstreamError(
                f"{server}: the listing's pages loop (cursor {cursor[:40]!r} "
                "came twice); refusing to follow",
                data={"server": server},
            )
        self._seen.add(cursor)
        if len(self._seen) >= self._limit:
            raise UpstreamError(
                f"{server}: the listing has more than {self._limit} pages; "
                "refusing to follow",
                data={"server": server},
            )
        return cursor


MAX_INSTRUCTIONS: Final = 16_000
"""The most of a server's own ``instructions`` kept (characters)."""


def told(instructions: object) -> str | None:
    """A server's ``instructions`` (its handshake's answer) as kept: a string
    with something in it, cut at ``MAX_INSTRUCTIONS``; anything else, none."""
    if not isinstance(instructions, str) or not instructions.strip():
        return None
    return instructions[:MAX_INSTRUCTIONS]


class Connection(Protocol):
    protocol_version: str | None
    server_name: str | None
    server_version: str | None
    instructions: str | None
    """What the server tells its clients at the handshake (``told``)."""

    def declares(self, capability: str) -> bool:
        """Whether the server declared ``capability`` (tools, resources, prompts)."""
        ...

    async def call_tool(
        self, name: str, arguments: bytes, progress: ProgressHandler | None = None
    ) -> ToolResult:
        """``arguments``: a JSON object's bytes, as the caller sent them.
        ``progress``: the server's progress on this call, if it reports any."""
        ...

    def takes_tool_tasks(self) -> bool:
        """Whether a ``tools/call`` may be sent as a task on this session: the
        server declares ``tasks.requests.tools.call`` (MCP 2025-11-25)."""
        ...

    async def call_tool_task(
        self, name: str, arguments: bytes, task: bytes
    ) -> msgspec.Raw:
        """``tools/call`` with ``task`` (the caller's task metadata, a JSON
        object's bytes) in its params: the server's ``CreateTaskResult``, raw."""
        ...

    async def task_request(self, method: str, params: dict[str, Any]) -> msgspec.Raw:
        """``tasks/get``, ``tasks/result``, ``tasks/cancel`` or ``tasks/list``
        with ``params`` as MCP has them: the server's result, raw."""
        ...

    async def list_tools(self, *, page_limit: int) -> list[m.Tool]: ...

    async def list_resources(self, *, page_limit: int) -> list[m.Resource]: ...

    async def list_resource_templates(
        self, *, page_limit: int
    ) -> list[m.ResourceTemplate]: ...

    async def read_resource(self, uri: str) -> m.ResourcesReadResult: ...

    async def list_prompts(self, *, page_limit: int) -> list[m.Prompt]: ...

    async def get_prompt(
        self, name: str, arguments: dict[str, str]
    ) -> m.PromptsGetResult: ...

    def can_subscribe(self) -> bool:
        """Whether ``resources/subscribe`` works on this session: the server
        declares ``resources.subscribe`` in the handshake era (2026-07-28
        subscribes on a ``subscriptions/listen`` stream instead: not yet)."""
        ...

    async def subscribe_resource(self, uri: str) -> None: ...

    async def unsubscribe_resource(self, uri: str) -> None: ...

    async def complete(self, params: dict[str, Any]) -> dict[str, Any]:
        """``completion/complete`` with ``params`` as MCP has them; the result."""
        ...

    async def probe(self) -> None:
        """A cheap liveness round trip (never cancelled upstream when abandoned)."""
        ...

    async def watch_tool_changes(self, on_change: Callable[[], None]) -> bool:
        """Call ``on_change`` whenever the server says its tools changed, on a
        2026-07-28 ``subscriptions/listen`` stream: True once the stream ended
        (the server ended it; the caller may listen again); False at once when
        there is none to hold (the handshake era says so in notifications)."""
        ...
