"""The Cognee Cloud bridge: a built-in server (``transport = "builtin"``,
``builtin = "cognee"``; the ``cognee`` preset).

Cognee has no hosted MCP endpoint. This ``Connection`` answers ``tools/list``
and ``tools/call`` itself, with exactly the three memory tools of
``cognee-mcp`` 0.5.5 (``remember``, ``recall``, ``forget``: their names and
input schemas; what its remote (API) mode sends, this sends) over the Cognee
Cloud HTTP API of the tenant: ``POST /api/v1/remember`` (multipart; with a
``session_id``, ``/api/v1/remember/entry``), ``POST /api/v1/recall``,
``POST /api/v1/forget``, and ``GET /api/v1/datasets/``. The API key goes in
``X-Api-Key`` (and a ``tenant-<uuid>`` host's id in ``X-Tenant-Id``).

No process, no package, nothing installed: every request goes through the
daemon's hardened client (``egress``: the host allowlist, pinned and checked
addresses, TLS, no redirects), the answer is read up to the server's
``max_result_bytes``, and calls pass through ``calls.py`` like any server's
(policy, deadline, audit). The tenant URL must be
``https://TENANT.aws.cognee.ai`` (``memorizz.api.spec.cognee_tenant_url``),
checked again at every connect and health check; the key and the URL come
from the vault.

* Setup (the connect's listing, ``servers/test``) checks access with
  ``GET /api/v1/datasets/``: a refused key is ``authorization_required``.
* The health probe checks the configuration only (no API call).
* HTTP 409 (Cognee still indexing what was just remembered) is a tool error
  (``isError``) with ``structuredContent.reason`` and ``retryable``: the
  caller may simply try again; 401/403 raise ``authorization_required``;
  429/503 ``upstream_busy``; other 4xx are tool errors, 5xx upstream errors.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, Final, TypeVar

import httpx2
import msgspec

from memorizz.api import methods as m
from memorizz.api.errors import (
    AuthRequiredError,
    InvalidParamsError,
    MethodNotFoundError,
    RemoteError,
    TooLargeError,
    UnavailableError,
    UpstreamError,
)
from memorizz.api.spec import cognee_tenant_url
from memorizzd.egress.busy import busy_error
from memorizzd.egress.client import hardened_client
from memorizzd.egress.oversize import TOO_LARGE_MARKER
from memorizzd.egress.urls import check_url
from memorizzd.upstream.connection import ProgressHandler, ToolResult
from memorizzd.vault.server_secrets import ServerSecrets

SERVER_NAME: Final = "cognee-cloud-bridge"
DEFAULT_DATASET: Final = "main_dataset"
MAX_UPLOAD_BYTES: Final = 10 * 1024 * 1024
MAX_TOP_K: Final = 100
REMEMBERED_RECENTLY_S: Final = 600.0
"""A 409 within this long of a ``remember`` is read as indexing not finished."""
RETRY_AFTER_S: Final = 5.0
_TENANT_ID: Final = re.compile(r"tenant-([0-9a-f-]{36})\.")
_TEXT_MAX: Final = 200
_T = TypeVar("_T")


def _string(description: str) -> dict[str, Any]:
    return {"default": None, "type": "string", "description": description}


TOOLS: Final[tuple[m.Tool, ...]] = (
    m.Tool(
        name="remember",
        description=(
            "Store data in Cognee memory. Without session_id: permanent memory"
            " (ingested and built into the knowledge graph). With session_id:"
            " the session cache only. Pass data (text) or filename and"
            " content_base64 (a file of at most 10 MB), not both."
        ),
        input_schema={
            "type": "object",
            "properties": {
                "data": _string("The text to store."),
                "filename": _string("A file upload's name (with content_base64)."),
                "content_base64": _string("A file upload's content, base64."),
                "dataset_name": _string("The dataset (default main_dataset)."),
                "session_id": _string("Store in this session's cache only."),
                "custom_prompt": _string("Entity extraction prompt (permanent)."),
                "background": {
                    "default": False,
                    "type": "boolean",
                    "description": "Queue the ingestion and return at once.",
                },
            },
        },
    ),
    m.Tool(
        name="recall",
        description=(
            "Search Cognee memory (auto-routed; session first when session_id"
            " is given). Returns the results as JSON text."
        ),
        input_schema={
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "What to recall."},
                "search_type": _string(
                    "Override the routing: GRAPH_COMPLETION, RAG_COMPLETION,"
                    " CHUNKS, SUMMARIES, TEMPORAL, ..."
                ),
                "datasets": _string("Comma-separated dataset names."),
                "session_id": _string("Search this session's cache first."),
                "system_prompt": _string("The prompt for completion searches."),
                "top_k": {
                    "default": 15,
                    "type": "integer",
                    "description": "At most this many results (1..100).",
                },
            },
            "required": ["query"],
        },
    ),
    m.Tool(
        name="forget",
        description=(
            "Delete from Cognee memory: a dataset (by name or id), one data"
            " item (data_id with its dataset), or everything."
        ),
        input_schema={
            "type": "object",
            "properties": {
                "dataset": _string("A dataset's name: delete it entirely."),
                "everything": {
                    "default": False,
                    "type": "boolean",
                    "description": "Delete ALL data of every dataset.",
                },
                "data_id": _string("One data item's UUID (with its dataset)."),
                "dataset_id": _string("A dataset's UUID."),
            },
        },
    ),
)


class _Remember(msgspec.Struct, frozen=True):
    data: str | None = None
    filename: str | None = None
    content_base64: str | None = None
    dataset_name: str | None = None
    session_id: str | None = None
    custom_prompt: str | None = None
    background: bool = False


class _Recall(msgspec.Struct, frozen=True):
    query: str
    search_type: str | None = None
    datasets: str | None = None
    session_id: str | None = None
    system_prompt: str | None = None
    top_k: int = 15


class _Forget(msgspec.Struct, frozen=True):
    dataset: str | None = None
    everything: bool = False
    data_id: str | None = None
    dataset_id: str | None = None


class _Text(msgspec.Struct):
    text: str
    type: str = "text"


class _Result(msgspec.Struct, rename="camel", omit_defaults=True):
    content: list[_Text]
    is_error: bool = False
    structured_content: dict[str, Any] | None = None


_encode = msgspec.json.Encoder().encode


class ToolError(Exception):
    """A tool call that fails as a tool (``isError``), with its reason."""

    def __init__(
        self, text: str, *, reason: str, retryable: bool = False, **extra: Any
    ) -> None:
        super().__init__(text)
        self.text = text
        self.structured: dict[str, Any] = {
            "reason": reason,
            "retryable": retryable,
            **extra,
        }


def check_configuration(
    spec: m.ServerSpec, secrets: ServerSecrets, host_allowlist: Sequence[str]
) -> str:
    """The tenant URL (the Cognee rule, then the egress policy) and the key's
    presence; the URL as the bridge uses it. No request is sent."""
    if secrets.url is None or not secrets.headers.get("X-Api-Key"):
        raise InvalidParamsError(
            f"server {spec.name!r}: the cognee bridge needs its tenant URL and API key"
        )
    url = cognee_tenant_url(secrets.url)
    check_url(url, allowlist=host_allowlist, allow_private_network=False)
    return url


@asynccontextmanager
async def open_cognee(
    spec: m.ServerSpec,
    *,
    secrets: ServerSecrets,
    host_allowlist: Sequence[str],
) -> AsyncIterator[CogneeConnection]:
    """A bridge session: the hardened client to the tenant, configured once."""
    url = check_configuration(spec, secrets, host_allowlist)
    headers = dict(secrets.headers)
    tenant = _TENANT_ID.match(url.removeprefix("https://") + ".")
    if tenant is not None:
        headers["X-Tenant-Id"] = tenant.group(1)
    http = hardened_client(
        limit=spec.max_result_bytes,
        timeout=httpx2.Timeout(30.0, read=spec.timeout_s + 30),
        allowlist=host_allowlist,
        allow_private_network=False,
        headers=headers,
        challenges=False,  # a 401/403 is an answer (the key is refused)
    )
    async with http:
        yield CogneeConnection(
            spec,
            http=http,
            base=url,
            secret=headers["X-Api-Key"],
            check=lambda: check_configuration(spec, secrets, host_allowlist),
        )


class CogneeConnection:
    """``Connection`` for the bridge (``upstream/connection.py``)."""

    protocol_version: str | None = None
    server_name: str | None = SERVER_NAME
    instructions: str | None = None
    server_version: str | None = "0.5.5"
    """The cognee-mcp version whose tools this bridge offers."""

    def __init__(
        self,
        spec: m.ServerSpec,
        *,
        http: httpx2.AsyncClient,
        base: str,
        secret: str,
        check: Callable[[], str],
    ) -> None:
        self._spec = spec
        self._http = http
        self._base = base
        self._secret = secret
        self._check = check
        self._remembered: float | None = None

    # --- what the bridge declares ------------------------------------------

    def declares(self, capability: str) -> bool:
        return capability == "tools"

    async def list_tools(self, *, page_limit: int) -> list[m.Tool]:
        """The three tools, once the tenant accepted the key (datasets)."""
        await self._request("GET", "/api/v1/datasets/")
        return list(TOOLS)

    async def probe(self) -> None:
        """The configuration only: no request to the API."""
        self._check()

    async def watch_tool_changes(self, on_change: Callable[[], None]) -> bool:
        return False

    # --- tools/call ---------------------------------------------------------

    async def call_tool(
        self, name: str, arguments: bytes, progress: ProgressHandler | None = None
    ) -> ToolResult:
        try:
            text = await self._run(name, arguments)
        except ToolError as exc:
            return _result(exc.text, error=True, structured=exc.structured)
        return _result(text)

    async def _run(self, name: str, arguments: bytes) -> str:
        try:
            if name == "remember":
                return await self._remember(_decode(arguments, _Remember))
            if name == "recall":
                return await self._recall(_decode(arguments, _Recall))
            if name == "forget":
                return await self._forget(_decode(arguments, _Forget))
        except msgspec.ValidationError as exc:
            raise ToolError(
                f"Error: invalid arguments: {exc}", reason="invalid_arguments"
            ) from None
        raise ToolError(f"Error: unknown tool {name[:80]!r}", reason="unknown_tool")

    async def _remember(self, a: _Remember) -> str:
        if a.content_base64 and a.data:
            raise _usage(
                "pass either `data` or `filename` + `content_base64`, not both."
            )
        if not a.content_base64 and not a.data:
            raise _usage("provide `data` or `filename` + `content_base64`.")
        if a.content_base64 and a.session_id:
            raise _usage("file uploads (content_base64) don't support session_id.")
        dataset = a.dataset_name or DEFAULT_DATASET
        if a.session_id:
            if a.custom_prompt:
                raise _usage("custom_prompt is not supported with session_id.")
            entry = {"type": "qa", "question": "", "answer": a.data, "context": ""}
            answer = await self._request(
                "POST",
                "/api/v1/remember/entry",
                json={
                    "entry": entry,
                    "dataset_name": dataset,
                    "session_id": a.session_id,
                },
                remember=True,
            )
            status = _status(answer, "completed")
            return (
                f"Stored in session cache (session_id={a.session_id}, status={status})."
            )
        if a.content_base64:
            if not a.filename:
                raise _usage("a file upload (content_base64) needs its filename.")
            try:
                content = base64.b64decode(a.content_base64, validate=True)
            except (binascii.Error, ValueError):
                raise _usage("invalid base64 content.") from None
            if len(content) > MAX_UPLOAD_BYTES:
                raise _usage(f"file exceeds 10 MB limit ({len(content):,} bytes).")
            upload = (_safe_name(a.filename), content, "application/octet-stream")
        else:
            assert a.data is not None  # noqa: S101 - checked above
            content = a.data.encode()
            digest = hashlib.sha256(content).hexdigest()[:16]
            upload = (f"text_{digest}.txt", content, "text/plain")
        form = {"datasetName": dataset}
        if a.custom_prompt:
            form["custom_prompt"] = a.custom_prompt
        if a.background:
            form["run_in_background"] = "true"
        answer = await self._request(
            "POST",
            "/api/v1/remember",
            files={"data": upload},
            data=form,
            remember=True,
        )
        status = _status(answer, "completed")
        if a.background:
            return f"Queued for dataset '{dataset}' (status={status})."
        if a.content_base64:
            return (
                f"Ingested '{upload[0]}' ({len(content):,} bytes) into dataset"
                f" '{dataset}' (status={status})."
            )
        return f"Stored permanently in knowledge graph (dataset={dataset}, status={status})."

    async def _recall(self, a: _Recall) -> str:
        if not 1 <= a.top_k <= MAX_TOP_K:
            raise _usage(f"top_k must be in 1..{MAX_TOP_K}.")
        payload: dict[str, Any] = {"query": a.query, "top_k": a.top_k}
        payload["search_type"] = a.search_type.upper() if a.search_type else None
        datasets = [d.strip() for d in (a.datasets or "").split(",") if d.strip()]
        if not datasets and not a.session_id:
            # As cognee-mcp: an unscoped recall searches every dataset one sees.
            listing = await self._request("GET", "/api/v1/datasets/")
            if isinstance(listing, list):
                datasets = [
                    d["name"]
                    for d in listing
                    if isinstance(d, dict) and isinstance(d.get("name"), str)
                ]
        if datasets:
            payload["datasets"] = datasets
        if a.session_id:
            payload["session_id"] = a.session_id
        if a.system_prompt:
            payload["system_prompt"] = a.system_prompt
        answer = await self._request("POST", "/api/v1/recall", json=payload)
        return msgspec.json.encode(answer).decode()

    async def _forget(self, a: _Forget) -> str:
        if not (a.dataset or a.everything or a.data_id or a.dataset_id):
            raise _usage(
                "specify 'dataset' name or set 'everything' to true. To remove a"
                " single item, pass 'data_id' with 'dataset' or 'dataset_id'."
            )
        if a.data_id and not a.dataset and not a.dataset_id:
            raise _usage("'data_id' requires 'dataset' or 'dataset_id'.")
        payload: dict[str, Any] = {"everything": a.everything}
        try:
            if a.dataset:
                payload["dataset"] = a.dataset
            if a.data_id:
                payload["data_id"] = str(uuid.UUID(a.data_id))
            if a.dataset_id:
                payload["dataset_id"] = str(uuid.UUID(a.dataset_id))
        except ValueError:
            raise _usage("invalid UUID.") from None
        answer = await self._request("POST", "/api/v1/forget", json=payload)
        status = _status(answer, "completed")
        if a.everything:
            return f"All data deleted (status={status})."
        if a.data_id:
            return f"Data item '{a.data_id}' deleted (status={status})."
        return f"Dataset '{a.dataset or a.dataset_id}' deleted (status={status})."

    # --- the API ------------------------------------------------------------

    async def _request(
        self, method: str, path: str, *, remember: bool = False, **kwargs: Any
    ) -> Any:
        """One API request; its JSON answer (None for an empty body)."""
        where = f"server {self._spec.name!r}"
        try:
            async with self._http.stream(method, self._base + path, **kwargs) as r:
                body = await _read(r, self._spec.max_result_bytes, where)
                status = r.status_code
                busy = busy_error(r)
        except RemoteError:
            raise  # an egress refusal, the size cap: already ours
        except httpx2.TimeoutException:
            raise UnavailableError(
                f"{where}: Cognee Cloud did not answer in time"
            ) from None
        except httpx2.TransportError as exc:
            raise UnavailableError(
                f"{where}: Cognee Cloud is unreachable ({type(exc).__name__})"
            ) from None
        if remember and status < 300:
            self._remembered = time.monotonic()
        if status < 300:
            return _json(body)
        text = self._error_text(body)
        if status in (401, 403):
            raise AuthRequiredError(
                f"{where}: Cognee Cloud refused the API key (HTTP {status}); add the"
                " server again with a valid key",
                data={"server": self._spec.name},
            )
        if busy is not None:
            raise busy
        if status == 409:
            recent = (
                self._remembered is not None
                and time.monotonic() - self._remembered < REMEMBERED_RECENTLY_S
            )
            if recent:
                raise ToolError(
                    "Error: Cognee is still indexing what was just remembered"
                    f" (HTTP 409: {text}). Retry in a few seconds.",
                    reason="indexing_not_finished",
                    retryable=True,
                    retry_after_s=RETRY_AFTER_S,
                    status=409,
                )
            raise ToolError(
                f"Error: Cognee answered HTTP 409 Conflict: {text}",
                reason="conflict",
                retryable=True,
                retry_after_s=RETRY_AFTER_S,
                status=409,
            )
        if 400 <= status < 500:
            raise ToolError(
                f"Error: Cognee refused the request (HTTP {status}): {text}",
                reason="rejected",
                status=status,
            )
        raise UpstreamError(
            f"{where}: Cognee Cloud failed (HTTP {status}): {text}",
            data={"server": self._spec.name, "status": status},
        )

    def _error_text(self, body: bytes) -> str:
        """The API's error message, cut to 200 printable characters, without
        the key should the answer echo it."""
        found = _json(body) if body else None
        if isinstance(found, dict):
            for key in ("detail", "error", "message"):
                if isinstance(found.get(key), str):
                    found = found[key]
                    break
        text = found if isinstance(found, str) else body.decode("utf-8", "replace")
        text = text.replace(self._secret, "***")
        text = "".join(c if c.isprintable() else " " for c in text)
        return text[:_TEXT_MAX].strip() or "no details"

    # --- what a bridge does not offer -----------------------------------------

    def _none(self, what: str) -> MethodNotFoundError:
        return MethodNotFoundError(
            f"server {self._spec.name!r}: the cognee bridge has no {what}",
            data={"server": self._spec.name},
        )

    def takes_tool_tasks(self) -> bool:
        return False

    async def call_tool_task(
        self, name: str, arguments: bytes, task: bytes
    ) -> msgspec.Raw:
        raise self._none("tasks")

    async def task_request(self, method: str, params: dict[str, Any]) -> msgspec.Raw:
        raise self._none("tasks")

    async def list_resources(self, *, page_limit: int) -> list[m.Resource]:
        return []

    async def list_resource_templates(
        self, *, page_limit: int
    ) -> list[m.ResourceTemplate]:
        return []

    async def read_resource(self, uri: str) -> m.ResourcesReadResult:
        raise self._none("resources")

    async def list_prompts(self, *, page_limit: int) -> list[m.Prompt]:
        return []

    async def get_prompt(
        self, name: str, arguments: dict[str, str]
    ) -> m.PromptsGetResult:
        raise self._none("prompts")

    def can_subscribe(self) -> bool:
        return False

    async def subscribe_resource(self, uri: str) -> None:
        raise self._none("resources")

    async def unsubscribe_resource(self, uri: str) -> None:
        raise self._none("resources")

    async def complete(self, params: dict[str, Any]) -> dict[str, Any]:
        raise self._none("completions")


def _decode(arguments: bytes, into: type[_T]) -> _T:
    try:
        value = msgspec.json.decode(arguments or b"{}")
    except msgspec.DecodeError:
        raise msgspec.ValidationError("the arguments are not JSON") from None
    if not isinstance(value, dict):
        raise msgspec.ValidationError("the arguments must be an object")
    # Explicit nulls are the defaults (the schemas say so).
    return msgspec.convert({k: v for k, v in value.items() if v is not None}, into)


def _usage(text: str) -> ToolError:
    return ToolError(f"Error: {text}", reason="invalid_arguments")


async def _read(response: httpx2.Response, limit: int, where: str) -> bytes:
    body = bytearray()
    async for chunk in response.aiter_raw():
        body += chunk
        if len(body) > limit:
            break
    if len(body) > limit or TOO_LARGE_MARKER.encode() in body[:512]:
        raise TooLargeError(f"{where}: answer larger than max_result_bytes ({limit})")
    return bytes(body)


def _json(body: bytes) -> Any:
    if not body.strip():
        return None
    try:
        return msgspec.json.decode(body)
    except (msgspec.DecodeError, RecursionError):  # not JSON we can read: text
        return body.decode("utf-8", "replace")


def _status(answer: Any, default: str) -> str:
    found = answer.get("status") if isinstance(answer, dict) else None
    return str(found)[:60] if found is not None else default


def _safe_name(filename: str) -> str:
    name = filename.replace("\\", "/").rsplit("/", 1)[-1]
    name = "".join(c for c in name if c.isprintable() and c not in '"\r\n')
    return name[:200] or "upload"


def _result(
    text: str, *, error: bool = False, structured: dict[str, Any] | None = None
) -> ToolResult:
    result = _Result(
        content=[_Text(text)], is_error=error, structured_content=structured
    )
    return ToolResult(msgspec.Raw(_encode(result)), error)
