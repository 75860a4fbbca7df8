"""Params and Result structs for every method, and the method table.

Each method is declared once, at the bottom (``Method``: name, params,
result, roles): the daemon's dispatcher and authority table and the thin
client are built from that table.

Two spelling rules:

* The daemon's own structs use snake_case field names (``--json`` output equals
  the attribute names).
* Structs that carry MCP objects through (tools, resources, prompts, tool
  results) keep MCP's own camelCase spelling on the wire (``inputSchema``,
  ``isError``, ``structuredContent``), so an agent that knows MCP reads them
  natively. Content items and resource contents are passed through verbatim.

Evolution: new fields get defaults; a name never changes meaning; unknown
fields are ignored by both sides. Anything else bumps ``PROTOCOL_VERSION``.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Generic, Literal, TypeVar

import msgspec

Transport = Literal["stdio", "streamable_http", "sse", "builtin"]
Builtin = Literal["cognee"]
"""The bridges built into the daemon (``transport = "builtin"``): no process,
no MCP server; the daemon answers ``tools/list`` and ``tools/call`` itself."""
Risk = Literal["read", "write", "destructive"]
Decision = Literal["allow", "ask", "deny"]
AuditOutcome = Literal[
    "ok",
    "tool_error",
    "denied",
    "timeout",
    "failed",
    "result_too_large",
    "approval_required",
    "client_aborted",
    "task_created",
    "interrupted",
]
ProposalStatus = Literal[
    "pending", "approved", "rejected", "cancelled", "expired", "consumed", "invalidated"
]  # fmt: skip
ServerState = Literal[
    "connecting", "ready", "backoff", "failed", "stopped", "login_required"
]
ProtocolMode = Literal["auto", "legacy", "2026-07-28"]
AuthMode = Literal["none", "bearer", "oauth"]
TokenEndpointAuthMethod = Literal[
    "none", "client_secret_basic", "client_secret_post", "private_key_jwt"
]
OAuthGrantType = Literal[
    "authorization_code", "client_credentials", "jwt_bearer", "token_exchange"
]

DEFAULT_TIMEOUT_S: Final = 60.0
DEFAULT_MAX_RESULT_BYTES: Final = 2_000_000
DEFAULT_REDIRECT_URI: Final = "http://127.0.0.1:33418/callback"
"""An OAuth server's redirect URI unless ``oauth_redirect_uri`` says otherwise."""

# Every number a caller sends is range-checked where it is decoded, so a
# handler never sees one that SQLite, a timer or a sleep would choke on.
Deadline = Annotated[float, msgspec.Meta(gt=0, le=3600)]
"""Seconds in (0, 3600]: a call's own deadline (capped by the server's)."""
WaitSeconds = Annotated[float, msgspec.Meta(ge=0, le=300)]
"""Seconds in [0, 300]: how long a long-poll may wait."""
PageLimit = Annotated[int, msgspec.Meta(ge=1, le=1000)]
"""1..1000 items per page."""
RowId = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
"""A record id: a non-negative signed 64-bit integer."""
UnixTime = Annotated[float, msgspec.Meta(ge=0, le=1e11)]
"""Seconds since the epoch."""
MAX_ARGUMENT_DEPTH: Final = 64
"""How deeply ``tools/call`` arguments may nest (objects and arrays); deeper is
``invalid_params``: the MCP SDKs cannot encode much deeper, and a request they
cannot encode would fail the whole upstream session, not just the call."""


class Params(msgspec.Struct, kw_only=True, frozen=True):
    """Base of every Params struct."""


class Result(msgspec.Struct, kw_only=True):
    """Base of every Result struct; a result is always an object, never null."""


class ServerParams(Params, kw_only=True, frozen=True):
    server: str
    """The configured server's name."""


# --- MCP objects, spelled as MCP spells them --------------------------------


class Tool(msgspec.Struct, kw_only=True, rename="camel", omit_defaults=True):
    name: str
    input_schema: dict[str, Any]
    title: str | None = None
    description: str | None = None
    output_schema: dict[str, Any] | None = None
    annotations: dict[str, Any] | None = None
    execution: dict[str, Any] | None = None
    icons: list[dict[str, Any]] | None = None
    meta: dict[str, Any] | None = msgspec.field(default=None, name="_meta")
    risk: Risk | None = None
    """memorizz: the tool's risk class (catalog, operator, annotations; else write)."""
    decision: Decision | None = None
    """memorizz: what a call gets: allow, ask (operator approval) or deny."""


class Resource(msgspec.Struct, kw_only=True, rename="camel", omit_defaults=True):
    uri: str
    name: str
    title: str | None = None
    description: str | None = None
    mime_type: str | None = None
    size: int | None = None
    annotations: dict[str, Any] | None = None
    icons: list[dict[str, Any]] | None = None
    meta: dict[str, Any] | None = msgspec.field(default=None, name="_meta")


class ResourceTemplate(
    msgspec.Struct, kw_only=True, rename="camel", omit_defaults=True
):
    uri_template: str
    name: str
    title: str | None = None
    description: str | None = None
    mime_type: str | None = None
    annotations: dict[str, Any] | None = None
    icons: list[dict[str, Any]] | None = None
    meta: dict[str, Any] | None = msgspec.field(default=None, name="_meta")


class PromptArgument(msgspec.Struct, kw_only=True, omit_defaults=True):
    name: str
    description: str | None = None
    required: bool | None = None


class Prompt(msgspec.Struct, kw_only=True, omit_defaults=True):
    name: str
    title: str | None = None
    description: str | None = None
    arguments: list[PromptArgument] = []
    icons: list[dict[str, Any]] | None = None
    meta: dict[str, Any] | None = msgspec.field(default=None, name="_meta")


# --- MCP pass-through methods --------------------------------------------------


class ToolsListParams(ServerParams, kw_only=True, frozen=True):
    refresh: bool = False
    """Fetch from the upstream instead of the daemon's warm cache."""


class ToolsListResult(Result, kw_only=True):
    tools: list[Tool]
    instructions: str | None = None
    """The server's connection instructions for agents (null: none)."""


Arguments = Annotated[msgspec.Raw, msgspec.Meta(extra_json_schema={"type": "object"})]
"""A JSON object, kept as its bytes: the daemon relays a call's arguments as
the caller sent them (it decodes a copy for policy and the audit)."""


def arguments(value: dict[str, Any] | None = None) -> msgspec.Raw:
    """``value`` as ``ToolsCallParams.arguments``."""
    return msgspec.Raw(msgspec.json.encode(value or {}))


ProgressToken = Annotated[str, msgspec.Meta(max_length=256)] | int
"""A caller's name for one call's progress reports (the daemon echoes it)."""


TaskId = Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
"""A task's id as the daemon shows it (``t_`` and 24 hex digits)."""


class TaskMetadata(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """MCP's task metadata of a task-augmented request."""

    ttl: Annotated[int, msgspec.Meta(ge=0)] | None = None
    """How long the server should keep the task, in milliseconds (it decides)."""


class Task(Result, kw_only=True, rename="camel", omit_defaults=True):
    """An MCP task (2025-11-25), its id the daemon's; also the result of
    ``tasks/get`` and ``tasks/cancel``. ``_meta`` names its ``memorizz/server``
    and ``memorizz/tool``."""

    task_id: TaskId
    status: str
    """``working``, ``input_required``, ``completed``, ``failed`` or ``cancelled``."""
    created_at: str | None = None
    last_updated_at: str | None = None
    ttl: int | None = None
    """Milliseconds the server keeps it from its creation; null: no limit."""
    poll_interval: int | None = None
    status_message: str | None = None
    meta: dict[str, Any] | None = msgspec.field(default=None, name="_meta")


class TaskStatusNotification(msgspec.Struct, kw_only=True):
    """The line a task's creator gets when its server says the task's status
    changed (MCP ``notifications/tasks/status``), unasked, at any time after
    the ``tools/call`` that created it."""

    jsonrpc: Literal["2.0"] = "2.0"
    method: Literal["notifications/tasks/status"] = "notifications/tasks/status"
    params: Task


class TasksGetParams(Params, kw_only=True, frozen=True):
    task_id: TaskId


class TasksResultParams(Params, kw_only=True, frozen=True):
    task_id: TaskId
    timeout_s: Deadline | None = None
    """Wait at most this long (capped by the server's ``timeout_s``) for the
    task to end; then ``timeout``, and the task runs on."""


class TasksCancelParams(Params, kw_only=True, frozen=True):
    task_id: TaskId


class TasksListParams(Params, kw_only=True, frozen=True):
    pass


class TasksListResult(Result, kw_only=True):
    tasks: list[Task]
    """The caller's own tasks that their servers still keep, oldest first."""


class CallMeta(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """A ``tools/call``'s ``_meta``, as MCP's: the caller's W3C trace context
    (``traceparent``, ``tracestate``), which the daemon's span of the call
    continues when tracing is on; other members are ignored."""

    traceparent: str | None = None
    tracestate: str | None = None


class ToolsCallParams(ServerParams, kw_only=True, frozen=True):
    name: str
    arguments: Arguments = msgspec.field(default_factory=arguments)
    """A JSON object (``arguments({...})`` makes one)."""
    timeout_s: Deadline | None = None
    """A shorter deadline for this call; capped by the server's ``timeout_s``."""
    progress_token: ProgressToken | None = None
    """Ask for the call's progress: while it runs, the daemon sends
    ``notifications/progress`` (``ProgressNotification``) lines carrying this
    token on this connection, before the reply. Without it, nothing but the
    reply is ever sent (the opt-in is per call)."""
    task: TaskMetadata | None = None
    """Call the tool as a task (MCP 2025-11-25; the tool's ``execution.taskSupport``
    is ``required`` or ``optional``): the reply is at once, its ``task`` the
    task created (``content`` empty), and the server's ``notifications/tasks/status``
    lines reach this connection; ``tasks/get``, ``tasks/result`` and
    ``tasks/cancel`` follow it."""
    meta: CallMeta | None = msgspec.field(default=None, name="_meta")
    """The caller's trace context (``{"traceparent": ...}``): the parent of
    the call's span, and passed on upstream (``[tracing] enabled``)."""


class ProgressParams(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One progress report of a ``tools/call`` that carried ``progress_token``:
    the upstream's report (MCP ``notifications/progress``), under the caller's
    token. ``total`` and ``message`` are there when the server gave them."""

    progress_token: ProgressToken
    progress: float
    total: float | None = None
    message: str | None = None


class ProgressNotification(msgspec.Struct, kw_only=True):
    """The line the daemon sends unasked for a report (no ``id``: not a reply).
    Fields in this order: a line starts ``{"jsonrpc":"2.0","method":``."""

    jsonrpc: Literal["2.0"] = "2.0"
    method: Literal["notifications/progress"] = "notifications/progress"
    params: ProgressParams


LogLevel = Literal[
    "debug", "info", "notice", "warning", "error", "critical", "alert", "emergency"
]
"""MCP's log levels, lowest first."""


class LogParams(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One log message of the server a call runs on (MCP
    ``notifications/message``), with the server's name: sent to a connection
    that asked for them (``daemon/hello`` capabilities ``logging``) while it
    has a call in flight on that server. ``logger`` is there when the server
    named one."""

    server: str
    level: LogLevel
    data: Any = None
    logger: str | None = None


class LogNotification(msgspec.Struct, kw_only=True):
    """The line the daemon sends unasked for a log message (no ``id``)."""

    jsonrpc: Literal["2.0"] = "2.0"
    method: Literal["notifications/message"] = "notifications/message"
    params: LogParams


class ToolsCallResult(Result, kw_only=True, rename="camel", omit_defaults=True):
    content: list[dict[str, Any]] = msgspec.field(default_factory=list)
    """Always present in a tool's result (MCP requires it), even when empty;
    absent when the call created a task (``task``)."""
    structured_content: dict[str, Any] | None = None
    is_error: bool = False
    meta: dict[str, Any] | None = msgspec.field(default=None, name="_meta")
    task: Task | None = None
    """The task the call created (a ``tools/call`` with ``task``): its result
    comes later, from ``tasks/result``."""


class ResourcesListParams(ServerParams, kw_only=True, frozen=True):
    pass


class ResourcesListResult(Result, kw_only=True):
    resources: list[Resource]


class ResourcesTemplatesListParams(ServerParams, kw_only=True, frozen=True):
    pass


class ResourcesTemplatesListResult(Result, kw_only=True, rename="camel"):
    resource_templates: list[ResourceTemplate]


class ResourcesReadParams(ServerParams, kw_only=True, frozen=True):
    uri: str
    timeout_s: Deadline | None = None


class ResourcesReadResult(Result, kw_only=True):
    contents: list[dict[str, Any]]
    """MCP resource contents, verbatim: ``{uri, mimeType?, text}`` or ``{uri, mimeType?, blob}``."""


class PromptsListParams(ServerParams, kw_only=True, frozen=True):
    pass


class PromptsListResult(Result, kw_only=True):
    prompts: list[Prompt]


class PromptsGetParams(ServerParams, kw_only=True, frozen=True):
    name: str
    arguments: dict[str, str] = {}
    timeout_s: Deadline | None = None


class PromptsGetResult(Result, kw_only=True, omit_defaults=True):
    messages: list[dict[str, Any]]
    description: str | None = None


class ResourcesSubscribeParams(ServerParams, kw_only=True, frozen=True):
    uri: str
    """The resource's URI, as the server lists it (or builds it from a template)."""


class ResourcesUnsubscribeParams(ServerParams, kw_only=True, frozen=True):
    uri: str


class EmptyResult(Result, kw_only=True):
    """``{}``: done (``resources/subscribe``, ``resources/unsubscribe``)."""


class ResourceUpdatedParams(msgspec.Struct, kw_only=True):
    """A resource this connection subscribed to changed (MCP
    ``notifications/resources/updated``), with its server's name: read it
    again (``resources/read``) for what it holds now."""

    server: str
    uri: str


class ResourceUpdatedNotification(msgspec.Struct, kw_only=True):
    """The line the daemon sends unasked for an update (no ``id``), on the
    connection that holds the subscription, for as long as it holds it
    (``resources/subscribe`` is the opt-in: a connection that never
    subscribes never gets one)."""

    jsonrpc: Literal["2.0"] = "2.0"
    method: Literal["notifications/resources/updated"] = (
        "notifications/resources/updated"
    )
    params: ResourceUpdatedParams


class PromptReference(
    msgspec.Struct,
    kw_only=True,
    frozen=True,
    omit_defaults=True,
    tag_field="type",
    tag="ref/prompt",
):
    """A prompt, by its name on the server (MCP ``PromptReference``)."""

    name: str
    title: str | None = None


class ResourceTemplateReference(
    msgspec.Struct, kw_only=True, frozen=True, tag_field="type", tag="ref/resource"
):
    """A resource template, by its URI template (MCP ``ResourceTemplateReference``)."""

    uri: str


CompletionReference = PromptReference | ResourceTemplateReference
"""What ``completion/complete`` completes an argument of (``type``:
``ref/prompt`` or ``ref/resource``)."""


class CompletionArgument(msgspec.Struct, kw_only=True, frozen=True):
    name: str
    """The argument's name (a prompt argument, a URI template variable)."""
    value: str
    """What has been typed so far."""


class CompletionContext(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    arguments: dict[str, str] = {}
    """The values of the reference's other arguments, already chosen."""


class CompletionCompleteParams(ServerParams, kw_only=True, frozen=True):
    ref: CompletionReference
    argument: CompletionArgument
    context: CompletionContext | None = None
    timeout_s: Deadline | None = None


class Completion(msgspec.Struct, kw_only=True, rename="camel", omit_defaults=True):
    values: list[str]
    """The server's suggestions (MCP allows at most 100)."""
    total: int | None = None
    """How many there are in all, when the server says."""
    has_more: bool | None = None
    """More than ``values`` hold, when the server says."""


class CompletionCompleteResult(Result, kw_only=True, omit_defaults=True):
    """MCP's ``CompleteResult``, as the server sent it."""

    completion: Completion
    meta: dict[str, Any] | None = msgspec.field(default=None, name="_meta")


class PingParams(Params, kw_only=True, frozen=True):
    server: str | None = None
    """Ping this upstream; without it, ping the daemon itself."""


class PingResult(Result, kw_only=True):
    latency_ms: float


# --- the daemon's own methods -------------------------------------------------


class DaemonHelloParams(Params, kw_only=True, frozen=True):
    protocol_version: int
    client: str = ""
    """Free-form client name and version, for the log."""
    capabilities: dict[str, Any] = {}
    """What this connection's client answers while its calls run, as MCP's
    client capabilities spell it: ``elicitation`` (``{"form": {}, "url": {}}``)
    and ``sampling`` (``{"tools": {}}``). An upstream's request of a call is
    then sent to it as a request line on this connection (``ElicitRequest``,
    ``SampleRequest``); without them, the upstream is refused at once.
    ``logging`` (``{}``, or ``{"level": "warning"}``: from that level on) asks
    for the log messages of the servers its calls run on, while they run
    (``LogNotification`` lines before the reply)."""


class DaemonHelloResult(Result, kw_only=True):
    protocol_version: int
    daemon_version: str
    servers: list[str] = []
    """The servers this socket serves its caller, by name, as they stand at
    the hello (an operator's: every one; an agent's: its profile's): how an
    agent learns what it may call (``servers/list`` is the operator's)."""


class DaemonStatusParams(Params, kw_only=True, frozen=True):
    pass


class DaemonStatusResult(Result, kw_only=True):
    version: str
    protocol_version: int
    pid: int
    uptime_s: float
    socket: str
    state_dir: str
    config_path: str | None
    servers_total: int
    servers_ready: int
    connections: int
    calls_in_flight: int
    rss_bytes: int
    agent_sockets: dict[str, str] = {}
    """Profile name -> the path of its agent socket (``socket`` is the operator's)."""
    last_reload: ReloadStatus | None = None
    """The last reload (``daemon/reload`` or SIGHUP) since start; None: none yet."""


class ReloadStatus(msgspec.Struct, kw_only=True):
    """How the last reload went (kept until the next one)."""

    time: float
    """When it ran (Unix time)."""
    ok: bool
    """False: the file was refused and nothing changed (``message`` says why)."""
    message: str
    """What changed, or why the file was refused."""
    trigger: Literal["api", "signal"]
    """``daemon/reload`` or SIGHUP (``systemctl reload``)."""


class DaemonReloadParams(Params, kw_only=True, frozen=True):
    pass


class DaemonReloadResult(Result, kw_only=True):
    """What a reload changed: config-file servers by name (servers added
    through the API are not touched), profiles by name, settings by key."""

    config_path: str
    servers_started: list[str] = []
    servers_restarted: list[str] = []
    """Their spec changed: reconnected with the new one."""
    servers_updated: list[str] = []
    """Only their tool policy changed (allow_tools, block_tools, risk, ...):
    applied to the warm session, not reconnected."""
    servers_stopped: list[str] = []
    """Removed from the file: their in-flight calls finish, then they stop."""
    servers_unchanged: list[str] = []
    profiles_added: list[str] = []
    profiles_removed: list[str] = []
    profiles_changed: list[str] = []
    settings_changed: list[str] = []
    """Other keys whose new values apply now (to calls that start from now on)."""
    restart_required: list[str] = []
    """Keys whose new values are not applied: they take a restart."""


class ServerSpec(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """How to reach one upstream MCP server (config file entry and ``servers/add``)."""

    name: str
    transport: Transport
    command: str | None = None
    """stdio: the executable (no shell)."""
    args: list[str] = []
    env: dict[str, str] = {}
    cwd: str | None = None
    url: str | None = None
    """streamable_http / sse: the endpoint URL."""
    timeout_s: float = DEFAULT_TIMEOUT_S
    """Default and maximum deadline of one request to this server."""
    max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES
    protocol: ProtocolMode = "auto"
    """``auto`` probes once and remembers; ``legacy`` forces the initialize handshake."""
    replicas: int = 1
    """stdio only: run this many processes behind the one name, for a server
    that keeps no state between calls; each call goes to the least busy one."""
    allow_private_network: bool = False
    """HTTP only: allow ``http://`` and private/loopback addresses for this server alone
    (an intentional local service)."""
    allow_tools: list[str] = []
    """Glob patterns; when set, only matching tools exist for callers."""
    block_tools: list[str] = []
    """Glob patterns; matching tools are hidden and refused (``tool_blocked``)."""
    require_approval: bool = False
    """Make write and destructive tools ``ask``."""
    risk: dict[str, Risk] = {}
    """Operator overrides of tools' risk classes, by exact tool name."""
    auth: AuthMode = "none"
    """HTTP only: ``bearer`` sends ``Authorization: Bearer <token>`` on every request."""
    token: str | None = None
    """Input only: the bearer token. ``servers/add`` moves it into the vault."""
    headers: dict[str, str] = {}
    """HTTP only: custom request headers; the values are secrets (moved into the vault)."""
    secret_env: dict[str, str] = {}
    """stdio only: environment variables whose values are secrets (moved into the vault)."""
    oauth_client_id: str | None = None
    """OAuth: a client registered with the authorization server beforehand
    (else a client ID metadata document or dynamic registration is used)."""
    oauth_client_secret: str | None = None
    """Input only: the pre-registered client's secret (moved into the vault)."""
    oauth_private_key: str | None = None
    """Input only: the pre-registered client's PEM private key, for
    ``private_key_jwt`` (moved into the vault)."""
    oauth_grant: OAuthGrantType = "authorization_code"
    """OAuth: ``client_credentials`` is a machine's grant: no login, the daemon
    gets (and renews) tokens with the pre-registered client's credentials;
    ``jwt_bearer`` (RFC 7523 §2.1) exchanges a JWT from the workload's
    identity provider (``oauth_assertion`` or ``oauth_assertion_file``);
    ``token_exchange`` (enterprise-managed authorization, SEP-990) first
    exchanges an ID token at the enterprise identity provider for an ID-JAG
    (RFC 8693), then presents that with the JWT bearer grant."""
    oauth_assertion: str | None = None
    """Input only, ``jwt_bearer``: the assertion (a JWT; moved into the vault)."""
    oauth_assertion_file: str | None = None
    """``jwt_bearer``: an absolute path read at each token request (a
    workload identity token its platform rotates on disk)."""
    oauth_subject_token: str | None = None
    """Input only, ``token_exchange``: the ID token from the enterprise
    identity provider's single sign-on (moved into the vault)."""
    oauth_subject_token_file: str | None = None
    """``token_exchange``: an absolute path holding the ID token, read at each
    exchange (whatever signs the operator in keeps it fresh)."""
    oauth_idp_issuer: str | None = None
    """``token_exchange``: the enterprise identity provider's issuer; its
    token endpoint is discovered (OpenID Connect, RFC 8414) unless given."""
    oauth_idp_token_endpoint: str | None = None
    """``token_exchange``: the identity provider's token endpoint."""
    oauth_idp_client_id: str | None = None
    """``token_exchange``: this client's id at the identity provider."""
    oauth_idp_client_secret: str | None = None
    """Input only, ``token_exchange``: this client's secret at the identity
    provider (moved into the vault)."""
    oauth_client_metadata_url: str | None = None
    """OAuth: an https URL of this client's metadata document, used as its
    client_id where the authorization server supports that."""
    oauth_scopes: list[str] = []
    """OAuth: the scopes to ask for (default: what the server advertises)."""
    oauth_token_endpoint_auth_method: TokenEndpointAuthMethod | None = None
    """OAuth, pre-registered client: how it authenticates (default: from the
    authorization server's metadata)."""
    oauth_redirect_uri: str | None = None
    """OAuth: the redirect URI (default ``http://127.0.0.1:33418/callback``)."""
    roots: list[str] = []
    """``file://`` URIs of absolute paths, declared to the server as the
    client's roots (``roots/list``). From the configuration, not a caller:
    callers share the server's one warm session."""
    preset: str | None = None
    """A connection preset (``presets/list``): it fills in what this spec
    leaves at its default (``memorizz.api.presets``); kept as the server's
    provenance, and its risk catalog applies whatever the server calls itself."""
    workspace: str | None = None
    """Presets with a workspace (``honcho``): configured once, set on every
    call of a tool whose input schema has the preset's workspace argument."""
    fixed_arguments: dict[str, str] = {}
    """Tool arguments the daemon sets on every call of a tool whose input
    schema has that property, replacing a caller's value; callers do not see
    the property in the listed schema. Not secrets (shown in ``servers/list``)."""
    instructions: str | bool | None = None
    """What agents are told about this server (MCP ``instructions``): a text,
    ``false`` for none; unset or ``true``: the preset's."""
    builtin: Builtin | None = None
    """``transport = "builtin"``: which bridge (``cognee``: Cognee Cloud, its
    tenant URL in ``url``, its API key in ``token``; both moved into the vault)."""


class ServerInfo(msgspec.Struct, kw_only=True):
    """A configured server as ``servers/list`` shows it (env values are never shown)."""

    name: str
    transport: Transport
    source: Literal["config", "api"]
    command: str | None
    """stdio: the absolute path that runs (resolved when the server was added)."""
    args: list[str]
    env_keys: list[str]
    cwd: str | None
    url: str | None
    timeout_s: float
    max_result_bytes: int
    protocol: ProtocolMode
    state: ServerState
    replicas: int = 1
    allow_private_network: bool = False
    allow_tools: list[str] = []
    block_tools: list[str] = []
    require_approval: bool = False
    risk: dict[str, Risk] = {}
    auth: AuthMode = "none"
    header_names: list[str] = []
    """Custom headers sent to the server (names only; values live in the vault)."""
    secret_env_keys: list[str] = []
    """Secret environment variables of a stdio server (names only)."""
    oauth_client_id: str | None = None
    oauth_grant: OAuthGrantType = "authorization_code"
    oauth_client_metadata_url: str | None = None
    oauth_scopes: list[str] = []
    oauth_token_endpoint_auth_method: TokenEndpointAuthMethod | None = None
    oauth_redirect_uri: str | None = None
    oauth_assertion_file: str | None = None
    """jwt_bearer: the file the assertion is read from (an inline one is a
    secret: it is never shown)."""
    oauth_subject_token_file: str | None = None
    """token_exchange: the file the ID token is read from (an inline one is
    never shown)."""
    oauth_idp_issuer: str | None = None
    oauth_idp_token_endpoint: str | None = None
    oauth_idp_client_id: str | None = None
    """token_exchange: the identity provider and our client there (its
    secret is never shown)."""
    preset: str | None = None
    workspace: str | None = None
    fixed_arguments: dict[str, str] = {}
    instructions: str | None = None
    """The connection instructions agents are given (null: none)."""


class Preset(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """A connection preset (``memorizz.api.presets``): reviewed data, no secret."""

    name: str
    title: str
    provider: str
    """The daemon's risk catalog entry for this provider's tools."""
    transport: Transport
    url: str | None = None
    command: str | None = None
    args: list[str] = []
    auth: AuthMode = "none"
    auth_alternatives: list[AuthMode] = []
    """Other auth kinds the provider takes (``notion``: bearer)."""
    oauth_registration: Literal["dynamic", "pre_registered"] | None = None
    """``pre_registered``: give ``oauth_client_id`` (and its secret)."""
    oauth_authorization_server: str | None = None
    """The authorization server the provider documents (for reference)."""
    oauth_scopes: list[str] = []
    only: list[str] = []
    """The tool allow-list (``allow_tools``) a server from it starts with."""
    workspace_arguments: list[str] = []
    """Tool arguments ``workspace`` is projected into (non-empty: required)."""
    setup: str = ""
    """What to do on the provider's side, and which options to give."""
    builtin: Builtin | None = None
    """``transport = "builtin"``: the daemon's own bridge to the provider."""
    instructions: str = ""
    """The connection instructions agents are given (``ServerSpec.instructions``)."""
    tools: dict[str, Risk] = {}
    """The provider's documented tools and their risk classes (the daemon's
    catalog; ``presets/list`` fills it in)."""


class PresetsListParams(Params, kw_only=True, frozen=True):
    pass


class PresetsListResult(Result, kw_only=True):
    presets: list[Preset]


class ServersListParams(Params, kw_only=True, frozen=True):
    pass


class ServersListResult(Result, kw_only=True):
    servers: list[ServerInfo]


class ServersAddParams(Params, kw_only=True, frozen=True):
    server: ServerSpec


class ServersAddResult(Result, kw_only=True):
    server: ServerInfo


class ServersRemoveParams(Params, kw_only=True, frozen=True):
    name: str


class ServersRemoveResult(Result, kw_only=True):
    name: str


class ServersStatusParams(Params, kw_only=True, frozen=True):
    name: str | None = None
    """One server; all when omitted."""


class ServerStatus(msgspec.Struct, kw_only=True):
    name: str
    transport: Transport
    state: ServerState
    since: float
    """Unix time of the last state change."""
    last_error: str | None
    pid: int | None
    protocol_version: str | None
    server_name: str | None
    server_version: str | None
    tool_count: int | None
    in_flight: int
    calls_ok: int
    calls_failed: int
    latency_p50_ms: float | None
    restarts: int
    auth: AuthStatus | None = None
    """OAuth servers: the grant (never a token)."""
    instructions: str | None = None
    """The connection instructions agents are given (null: none)."""


class AuthStatus(msgspec.Struct, kw_only=True):
    """An OAuth server's grant as the operator may see it: no token, ever."""

    state: Literal["logged_out", "ok", "login_required"]
    issuer: str | None
    client_id: str | None
    scope: str | None
    expires_at: float | None
    """Unix time the current access token expires (null: unknown or none)."""
    refreshable: bool
    """A refresh token is held: the daemon renews the access token itself."""
    last_refresh: float | None
    """Unix time of the last successful refresh by this daemon process."""
    refreshes: int
    """Successful refreshes since the daemon started."""
    last_refresh_error: str | None
    grant: OAuthGrantType = "authorization_code"
    """How the grant is had: ``authorization_code`` by an operator's login;
    the others are machine grants the daemon gets and renews itself (no login)."""


class FaceRename(msgspec.Struct, kw_only=True):
    """A tool the MCP face shows under another name than ``SERVER__TOOL``
    (invalid, over 64 characters, or taken by an earlier entry)."""

    face: str
    """Whose face: ``operator``, or the profile's name."""
    shown: str
    """The name the face lists and takes calls by."""
    server: str
    tool: str
    """The tool's own name on its server."""


class ServersStatusResult(Result, kw_only=True):
    servers: list[ServerStatus]
    face_renames: list[FaceRename] = []
    """The MCP faces' renames of these servers' tools, from the warm listings."""


class ServersTestParams(Params, kw_only=True, frozen=True):
    name: str
    timeout_s: Deadline | None = None


class ServersTestResult(Result, kw_only=True):
    name: str
    outcome: Literal[
        "ok",
        "authorization_required",
        "login_required",
        "unreachable",
        "refused_by_policy",
        "tls_error",
        "timeout",
        "upstream_error",
    ]
    """``ok`` only when a real ``tools/list`` round trip to the server succeeded;
    ``login_required``: an OAuth server with no usable grant."""
    message: str
    """What happened, as the daemon saw it (what to do about it is the
    client's to say: ``memorizzctl`` keys its hints by ``outcome``)."""
    tool_count: int | None
    latency_ms: float | None
    reason: str | None = None
    """The ``data.reason`` of the error behind a failure, when there was one
    (``host_not_allowed``, ``command_not_allowed``, ``login_required`` ...)."""
    auth: AuthMode = "none"
    """The server's auth mode (``oauth``: log in again; else: give credentials)."""
    source: Literal["config", "api"] = "api"
    """Where the server is configured: the config file, or ``servers/add``."""


class AuditRecord(msgspec.Struct, kw_only=True):
    """One append-only audit record: a tool call or an operator action."""

    id: int
    time: float
    """Unix time the action started."""
    action: str
    """``tools/call``, ``servers/add``, ``servers/remove``, ..."""
    caller_socket: str
    caller_uid: int
    caller_gid: int
    caller_pid: int
    server: str | None
    tool: str | None
    risk: Risk | None
    decision: Decision | None
    outcome: str
    """tools/call: ok, tool_error, denied, approval_required, timeout, failed,
    result_too_large, client_aborted (the caller cancelled or went away),
    task_created (called as a task); operator actions: ok, failed, or
    interrupted (cancelled, or the daemon stopped before it ended: it may or
    may not have taken effect)."""
    reason: str | None
    """The error's ``data.reason`` when it failed or was refused."""
    duration_ms: float
    argument_keys: list[str]
    arguments_hmac: str | None
    """HMAC-SHA-256 (hex) of the canonical JSON arguments under the audit key."""
    result_bytes: int | None
    proposal_id: str | None = None
    """The approval proposal this record is about (``approvals/*`` and the
    ``tools/call`` that created or ran it)."""
    caller_profile: str | None = None
    """The agent profile of the caller's socket; null on the operator socket."""


class AuditListParams(Params, kw_only=True, frozen=True):
    server: str | None = None
    tool: str | None = None
    outcome: str | None = None
    since: UnixTime | None = None
    """Only records at or after this Unix time."""
    before_id: RowId | None = None
    """Paging: only records older than this id (pass the last page's ``next_before_id``)."""
    limit: PageLimit = 100
    """At most this many records (1..1000), newest first."""


class AuditListResult(Result, kw_only=True):
    records: list[AuditRecord]
    next_before_id: int | None
    """Pass as ``before_id`` for the next (older) page; null at the end."""


class VaultRotateParams(Params, kw_only=True, frozen=True):
    new_key: bool = False
    """Key file only: generate a new primary key first (the old keys still decrypt)."""


class VaultRotateResult(Result, kw_only=True):
    reencrypted: int
    """Secrets re-encrypted under the primary key (the canary included)."""
    key_source: str
    """Where the key came from: credential, environment or key file (never the key)."""
    new_key: bool
    """A new primary key was generated and written to the key file."""


class AuthLoginParams(Params, kw_only=True, frozen=True):
    server: str
    redirect_uri: str | None = None
    """Override the server's redirect URI for this login (loopback or https)."""


class AuthLoginResult(Result, kw_only=True):
    server: str
    authorization_url: str
    """Open this in a browser, on any machine."""
    redirect_uri: str
    """Where the browser is sent afterwards; give that full URL to ``auth/complete``."""
    issuer: str
    scope: str | None
    expires_at: float
    """Unix time after which this login can no longer be completed."""


class AuthCompleteParams(Params, kw_only=True, frozen=True):
    server: str
    callback_url: str
    """The full URL the browser was redirected to (with ``code`` and ``state``)."""


class AuthCompleteResult(Result, kw_only=True):
    server: str
    auth: AuthStatus


class AuthLogoutParams(Params, kw_only=True, frozen=True):
    server: str


class AuthLogoutResult(Result, kw_only=True):
    server: str
    revocation: Literal["revoked", "not_supported", "failed", "nothing_to_revoke"]
    """RFC 7009 at the authorization server; the grant is deleted here either way."""
    message: str


# --- approvals -------------------------------------------------------------------


class Proposal(msgspec.Struct, kw_only=True):
    """A tools/call that waits for (or got) an operator's decision."""

    id: str
    status: ProposalStatus
    server: str
    tool: str
    risk: Risk | None
    argument_keys: list[str]
    arguments_hmac: str
    """HMAC-SHA-256 (hex) of the canonical JSON arguments under the audit key."""
    schema_hash: str
    """SHA-256 of the tool's inputSchema when it was proposed; a different
    schema at resume (or on tools/list_changed) invalidates the proposal."""
    created: float
    expires_at: float
    """Unix time; after it the proposal can neither be approved nor resumed."""
    caller_uid: int
    caller_user: str | None
    caller_pid: int
    caller_profile: str | None
    """The agent profile that asked; null for the operator socket."""
    decided_by_uid: int | None = None
    """The kernel-verified uid of the operator who approved or rejected it."""
    decided_by_user: str | None = None
    approver_label: str | None = None
    """A free-form label the approver added (``--approver``); not an identity."""
    decided_at: float | None = None
    reason: str | None = None
    """Why it was rejected, cancelled or invalidated."""
    consumed_at: float | None = None
    arguments: dict[str, Any] | None = None
    """The values: only to an operator who asked (``show_arguments``)."""


class ApprovalsListParams(Params, kw_only=True, frozen=True):
    status: ProposalStatus | None = None
    limit: PageLimit = 100
    """At most this many (1..1000), newest first."""
    show_arguments: bool = False
    """Include the argument values (operators only)."""


class ApprovalsListResult(Result, kw_only=True):
    proposals: list[Proposal]


class ApprovalsApproveParams(Params, kw_only=True, frozen=True):
    id: str
    approver: str | None = None
    """An extra label for the record; the approver is the connection's uid."""


class ApprovalsRejectParams(Params, kw_only=True, frozen=True):
    id: str
    reason: str | None = None


class ApprovalsCancelParams(Params, kw_only=True, frozen=True):
    id: str


class ApprovalsDecisionResult(Result, kw_only=True):
    proposal: Proposal


class ApprovalsResumeParams(Params, kw_only=True, frozen=True):
    id: str
    timeout_s: Deadline | None = None


class ApprovalsWaitParams(Params, kw_only=True, frozen=True):
    id: str
    timeout_s: WaitSeconds = 30.0
    """Return at the latest after this long (at most 300 s)."""


class ApprovalsWaitResult(Result, kw_only=True):
    proposal: Proposal
    decided: bool
    """False when the deadline passed with the proposal still pending."""


# --- the method table: each method declared once ------------------------------

P = TypeVar("P", bound=Params)
R = TypeVar("R", bound=Result)

Role = Literal["operator", "agent"]
"""Who a connection is, by the socket it came in on (``memorizzd.caller``)."""
OPERATOR_ONLY: Final[frozenset[Role]] = frozenset({"operator"})
AGENTS_TOO: Final[frozenset[Role]] = frozenset({"operator", "agent"})
"""The non-escalating surface: what an agent socket serves too."""


class Method(msgspec.Struct, Generic[P, R], frozen=True, kw_only=True):
    """One method of the wire contract, declared once.

    The daemon's dispatcher decodes ``params`` with it and lets only ``roles``
    call it (``memorizzd.rpc``), the thin client sends it and decodes
    ``result`` with it (``memorizz.client``), and the JSON Schema is generated
    from it (``memorizz.api.schema``). Tests check that each of them covers
    exactly this table."""

    name: str
    params: type[P]
    result: type[R]
    roles: frozenset[Role]
    doc: str
    passthrough: bool = False
    """An MCP method relayed to one upstream server (``server`` param)."""


def _mcp(name: str, params: type[P], result: type[R], doc: str) -> Method[P, R]:
    return Method(
        name=name,
        params=params,
        result=result,
        roles=AGENTS_TOO,
        doc=doc,
        passthrough=True,
    )


def _own(
    name: str,
    params: type[P],
    result: type[R],
    doc: str,
    *,
    roles: frozenset[Role] = OPERATOR_ONLY,
) -> Method[P, R]:
    return Method(name=name, params=params, result=result, roles=roles, doc=doc)


# The MCP pass-through methods: every role, relayed to the named server.
TOOLS_LIST: Final = _mcp(
    "tools/list", ToolsListParams, ToolsListResult, "A server's tools."
)
TOOLS_CALL: Final = _mcp("tools/call", ToolsCallParams, ToolsCallResult, "Call a tool.")
RESOURCES_LIST: Final = _mcp(
    "resources/list", ResourcesListParams, ResourcesListResult, "A server's resources."
)
RESOURCES_TEMPLATES_LIST: Final = _mcp(
    "resources/templates/list",
    ResourcesTemplatesListParams,
    ResourcesTemplatesListResult,
    "A server's resource templates.",
)
RESOURCES_READ: Final = _mcp(
    "resources/read", ResourcesReadParams, ResourcesReadResult, "Read one resource."
)
RESOURCES_SUBSCRIBE: Final = _mcp(
    "resources/subscribe",
    ResourcesSubscribeParams,
    EmptyResult,
    "Hear of one resource's updates on this connection.",
)
RESOURCES_UNSUBSCRIBE: Final = _mcp(
    "resources/unsubscribe",
    ResourcesUnsubscribeParams,
    EmptyResult,
    "Stop hearing of one resource's updates.",
)
PROMPTS_LIST: Final = _mcp(
    "prompts/list", PromptsListParams, PromptsListResult, "A server's prompts."
)
PROMPTS_GET: Final = _mcp(
    "prompts/get", PromptsGetParams, PromptsGetResult, "Get one prompt."
)
COMPLETION_COMPLETE: Final = _mcp(
    "completion/complete",
    CompletionCompleteParams,
    CompletionCompleteResult,
    "Complete an argument of a prompt or a resource template.",
)
PING: Final = _mcp("ping", PingParams, PingResult, "Ping the daemon or one upstream.")

# The daemon's own methods.
DAEMON_HELLO: Final = _own(
    "daemon/hello",
    DaemonHelloParams,
    DaemonHelloResult,
    "Check protocol compatibility.",
    roles=AGENTS_TOO,
)
DAEMON_STATUS: Final = _own(
    "daemon/status",
    DaemonStatusParams,
    DaemonStatusResult,
    "Daemon version, uptime, counts.",
)
DAEMON_RELOAD: Final = _own(
    "daemon/reload",
    DaemonReloadParams,
    DaemonReloadResult,
    "Re-read the config file and apply what changed (as SIGHUP).",
)
SERVERS_LIST: Final = _own(
    "servers/list", ServersListParams, ServersListResult, "Configured servers."
)
PRESETS_LIST: Final = _own(
    "presets/list",
    PresetsListParams,
    PresetsListResult,
    "The connection presets servers/add takes.",
)
SERVERS_ADD: Final = _own(
    "servers/add",
    ServersAddParams,
    ServersAddResult,
    "Add a server at run time (persisted).",
)
SERVERS_REMOVE: Final = _own(
    "servers/remove",
    ServersRemoveParams,
    ServersRemoveResult,
    "Remove a run-time server.",
)
SERVERS_STATUS: Final = _own(
    "servers/status",
    ServersStatusParams,
    ServersStatusResult,
    "Live state and stats per server.",
)
SERVERS_TEST: Final = _own(
    "servers/test",
    ServersTestParams,
    ServersTestResult,
    "A real round trip to one server.",
)
AUDIT_LIST: Final = _own(
    "audit/list", AuditListParams, AuditListResult, "The audit trail, newest first."
)
VAULT_ROTATE: Final = _own(
    "vault/rotate",
    VaultRotateParams,
    VaultRotateResult,
    "Re-encrypt every secret under the primary key.",
)
AUTH_LOGIN: Final = _own(
    "auth/login",
    AuthLoginParams,
    AuthLoginResult,
    "Start an OAuth login: the authorization URL to open.",
)
AUTH_COMPLETE: Final = _own(
    "auth/complete",
    AuthCompleteParams,
    AuthCompleteResult,
    "Finish an OAuth login with the browser's final callback URL.",
)
AUTH_LOGOUT: Final = _own(
    "auth/logout",
    AuthLogoutParams,
    AuthLogoutResult,
    "Revoke (where supported) and delete a server's OAuth grant.",
)
APPROVALS_LIST: Final = _own(
    "approvals/list",
    ApprovalsListParams,
    ApprovalsListResult,
    "Proposals, newest first (an agent sees its profile's own).",
    roles=AGENTS_TOO,
)
APPROVALS_APPROVE: Final = _own(
    "approvals/approve",
    ApprovalsApproveParams,
    ApprovalsDecisionResult,
    "Approve a pending proposal.",
)
APPROVALS_REJECT: Final = _own(
    "approvals/reject",
    ApprovalsRejectParams,
    ApprovalsDecisionResult,
    "Reject a pending proposal.",
)
APPROVALS_CANCEL: Final = _own(
    "approvals/cancel",
    ApprovalsCancelParams,
    ApprovalsDecisionResult,
    "Withdraw a pending or approved proposal.",
    roles=AGENTS_TOO,
)
APPROVALS_RESUME: Final = _own(
    "approvals/resume",
    ApprovalsResumeParams,
    ToolsCallResult,
    "Run an approved proposal's stored call, once.",
    roles=AGENTS_TOO,
)
APPROVALS_WAIT: Final = _own(
    "approvals/wait",
    ApprovalsWaitParams,
    ApprovalsWaitResult,
    "Wait until a proposal is decided or the deadline passes.",
    roles=AGENTS_TOO,
)
TASKS_GET: Final = _own(
    "tasks/get",
    TasksGetParams,
    Task,
    "The status of one of the caller's tasks.",
    roles=AGENTS_TOO,
)
TASKS_RESULT: Final = _own(
    "tasks/result",
    TasksResultParams,
    ToolsCallResult,
    "Wait for one of the caller's tasks to end: its tool result.",
    roles=AGENTS_TOO,
)
TASKS_CANCEL: Final = _own(
    "tasks/cancel",
    TasksCancelParams,
    Task,
    "Cancel one of the caller's tasks (its server cancels it).",
    roles=AGENTS_TOO,
)
TASKS_LIST: Final = _own(
    "tasks/list",
    TasksListParams,
    TasksListResult,
    "The caller's tasks.",
    roles=AGENTS_TOO,
)

METHODS: Final[dict[str, Method[Any, Any]]] = {
    method.name: method
    for method in (
        DAEMON_HELLO,
        DAEMON_STATUS,
        DAEMON_RELOAD,
        SERVERS_LIST,
        PRESETS_LIST,
        SERVERS_ADD,
        SERVERS_REMOVE,
        SERVERS_STATUS,
        SERVERS_TEST,
        TOOLS_LIST,
        TOOLS_CALL,
        RESOURCES_LIST,
        RESOURCES_TEMPLATES_LIST,
        RESOURCES_READ,
        RESOURCES_SUBSCRIBE,
        RESOURCES_UNSUBSCRIBE,
        PROMPTS_LIST,
        PROMPTS_GET,
        COMPLETION_COMPLETE,
        PING,
        AUDIT_LIST,
        VAULT_ROTATE,
        AUTH_LOGIN,
        AUTH_COMPLETE,
        AUTH_LOGOUT,
        APPROVALS_LIST,
        APPROVALS_APPROVE,
        APPROVALS_REJECT,
        APPROVALS_CANCEL,
        APPROVALS_RESUME,
        APPROVALS_WAIT,
        TASKS_GET,
        TASKS_RESULT,
        TASKS_CANCEL,
        TASKS_LIST,
    )
}
"""Every method by name, in the schema's order: THE wire contract's table."""
