"""What coverage-guided fuzzing of the daemon's parsers found, each kept as
the smallest input that showed it.

Every parser of untrusted bytes either succeeds or raises the error its
callers catch; none raises anything else, hangs, or takes time that grows
faster than its input.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import anyio
import httpx2
import msgspec
import pytest

from memorizz.api.errors import InvalidParamsError, LoginError, UpstreamError
from memorizz.api.methods import METHODS
from memorizz.api.protocol import Request
from memorizzd import calllife, calls, face
from memorizzd.caller import Caller
from memorizzd.config import ConfigError, load
from memorizzd.egress.client import HardenedClient
from memorizzd.oauth import discovery, endpoints, machine
from memorizzd.oauth.mcp_sdk import OAuthClientMetadata
from memorizzd.rpc.dispatch import Dispatcher
from memorizzd.upstream import asks, cognee, jsonrpc, logs, session, tasks

DEEP: int = 5000
"""Nesting deeper than msgspec's limit (about 1000 levels, the recursion limit)."""


def nested(depth: int = DEEP) -> bytes:
    return b"[" * depth + b"]" * depth


def _run(main: Callable[[], object]) -> None:
    anyio.run(main, backend="asyncio")  # type: ignore[arg-type]


class _Pipes:
    """What ``JsonRpcSession`` needs of ``StdioPipes``: the lines the server
    wrote, then the end of its stdout."""

    def __init__(self, lines: list[bytes]) -> None:
        self._lines = lines
        self.taken: Callable[[bytes], bool] | None = None
        self.written: list[bytes] = []

    def take_answers(self, taken: Callable[[bytes], bool]) -> None:
        self.taken = taken

    def has_room(self) -> bool:
        return True

    def kept(self) -> int:
        return 0

    def write_now(self, data: bytes) -> None:
        self.written.append(data)

    async def send(self, data: bytes) -> None:
        self.written.append(data)

    async def lines(self):  # type: ignore[no-untyped-def]
        for line in self._lines:
            yield line


# --- the stdio reader (upstream/jsonrpc.py) --------------------------------


def test_a_stdio_answer_nested_too_deeply_fails_its_call_and_the_reader_goes_on() -> (
    None
):
    """``{"id":1,"result":[[[[...]]]]}`` 5000 deep raised RecursionError out
    of the reader, which ended the session; the call it answered now fails at
    once, and the lines after it are read."""
    lines = [
        b'{"jsonrpc":"2.0","id":1,"result":' + nested() + b"}",
        b'{"jsonrpc":"2.0","method":"notifications/message","params":'
        + nested()
        + b"}",
        b'{"jsonrpc":"2.0","id":' + nested() + b',"result":{}}',
        b'{"jsonrpc":"2.0","id":2,"result":{"content":[]}}',
    ]

    async def main() -> None:
        notified: list[str] = []
        session = jsonrpc.JsonRpcSession(
            _Pipes(lines),  # type: ignore[arg-type]
            server="deep",
            on_notification=lambda method, params: notified.append(method),
        )
        first, second = jsonrpc._Waiter(), jsonrpc._Waiter()
        assert session.start_call("t", b"{}", first) is not None
        assert session.start_call("t", b"{}", second) is not None
        await session.read()
        with pytest.raises(UpstreamError, match="nested too deeply"):
            session.result_of(first.message)
        assert bytes(session.result_of(second.message).raw) == b'{"content":[]}'
        assert notified == []

    _run(main)


def test_answers_taken_in_the_loop_callback_may_be_nested_too_deeply() -> None:
    """The loop's reader callback (``_answers_now``) raised RecursionError;
    now it leaves such a line to the reader."""

    async def main() -> None:
        pipes = _Pipes([])
        jsonrpc.JsonRpcSession(pipes, server="deep")  # type: ignore[arg-type]
        assert pipes.taken is not None
        line = b'{"jsonrpc":"2.0","id":1,"result":' + nested() + b"}\n"
        assert pipes.taken(line) is False

    _run(main)


def test_results_read_again_deeper_in_the_stack_are_malformed_not_a_crash() -> None:
    """A result the reader could read (it reads near the bottom of the stack)
    may be nested too deeply for the caller's own decoding, higher up: that
    is a malformed result (UpstreamError), not RecursionError."""

    async def main() -> None:
        session = jsonrpc.JsonRpcSession(_Pipes([]), server="deep")  # type: ignore[arg-type]
        deep = msgspec.Raw(b'{"content":' + nested() + b"}")
        with pytest.raises(UpstreamError, match="malformed tool result"):
            session.result_of(jsonrpc.Message(id=1, result=deep))
        with pytest.raises(UpstreamError, match="malformed result"):
            session._decode(deep, dict, "completion/complete")
        assert asks.input_required(deep) is None
        assert jsonrpc._honored_uris(deep) is None
        assert jsonrpc._subscription_of(deep) is None
        session._progressed(deep)  # not a progress report of ours: dropped

    _run(main)


# --- OAuth (oauth/discovery.py, oauth/endpoints.py, oauth/machine.py) -------

MCP = "https://mcp.example.com/mcp"
AS = "https://as.example.com"


def _serving(documents: dict[str, bytes]) -> httpx2.AsyncClient:
    """A client whose requests get ``documents[path]`` (else a 404)."""

    def answer(request: httpx2.Request) -> httpx2.Response:
        body = documents.get(request.url.path)
        if body is None:
            return httpx2.Response(404)
        return httpx2.Response(
            200, content=body, headers={"content-type": "application/json"}
        )

    # the daemon's client class and policy, its network the documents above
    return HardenedClient(
        allowlist=(),
        allow_private_network=False,
        transport=httpx2.MockTransport(answer),
    )


def _as_metadata(extra: bytes = b"") -> bytes:
    return (
        b'{"issuer":"'
        + AS.encode()
        + b'","authorization_endpoint":"'
        + AS.encode()
        + b'/a","token_endpoint":"'
        + AS.encode()
        + b'/t",'
        b'"response_types_supported":["code"],'
        b'"code_challenge_methods_supported":["S256"]' + extra + b"}"
    )


def _discovered(documents: dict[str, bytes]) -> object:
    async def main() -> object:
        async with _serving(documents) as http:
            return await discovery.discover(http, MCP, None)

    return anyio.run(main, backend="asyncio")


def test_an_authorization_server_url_urllib_cannot_join_is_a_login_error() -> None:
    """``"authorization_servers":["https://a//["]`` passes pydantic's URL
    check, then the SDK's discovery URLs (``urljoin``) raised ValueError
    ("Invalid IPv6 URL") out of discovery."""
    prm = (
        b'{"resource":"' + MCP.encode() + b'","authorization_servers":["https://a//["]}'
    )
    with pytest.raises(LoginError, match="authorization server"):
        _discovered({"/.well-known/oauth-protected-resource/mcp": prm})


def test_metadata_pydantic_takes_but_is_not_json_is_a_login_error() -> None:
    """pydantic reads ``NaN`` in a metadata document; msgspec, which reads
    the issuer as written, does not: its DecodeError escaped discovery."""
    prm = (
        b'{"resource":"'
        + MCP.encode()
        + b'","authorization_servers":["'
        + AS.encode()
        + b'"]}'
    )
    documents = {
        "/.well-known/oauth-protected-resource/mcp": prm,
        "/.well-known/oauth-authorization-server": _as_metadata(b',"x":NaN'),
    }
    with pytest.raises(LoginError, match="not usable"):
        _discovered(documents)


@pytest.mark.parametrize(
    "body",
    [
        nested(),
        b'{"access_token":"a","x":' + nested() + b"}",
        b'{"error":"e","x":' + nested() + b"}",
    ],
)
def test_authorization_server_answers_nested_too_deeply_are_bad_responses(
    body: bytes,
) -> None:
    """Every answer of an authorization server or identity provider was
    decoded by msgspec catching its DecodeError only: one nested 5000 deep
    raised RecursionError instead of ``EndpointError("bad_response")``."""
    with pytest.raises(endpoints.EndpointError):
        endpoints._token_of(body, dpop_sent=False)
    error = endpoints._error_of(httpx2.Response(400, content=body), "token")
    assert error.error == "bad_response"

    async def main() -> None:
        async with _serving(
            {
                "/t": body,
                "/register": body,
                "/.well-known/oauth-authorization-server": body,
            }
        ) as http:
            with pytest.raises(endpoints.EndpointError):
                await endpoints.exchange_token(
                    http,
                    f"{AS}/t",
                    None,
                    subject_token="a.b.c",  # noqa: S106 - not a secret
                    audience=AS,
                    resource=MCP,
                    scope=None,
                )
            meta = OAuthClientMetadata(redirect_uris=["http://127.0.0.1:1/cb"])  # type: ignore[list-item]
            with pytest.raises(endpoints.EndpointError):
                await endpoints.register(http, f"{AS}/register", meta)
            with pytest.raises(endpoints.EndpointError):
                await machine._idp_token_endpoint(http, AS)

    anyio.run(main, backend="asyncio")


@pytest.mark.parametrize(
    ("header", "scope", "error"),
    [
        # a parameter quoted inside another's value is not one
        (
            'Bearer error="invalid_token", error_description="scope=admin"',
            None,
            "invalid_token",
        ),
        ('Bearer error_description="error=insufficient_scope"', None, None),
        # nor is a longer name that ends like one
        (
            'Bearer xscope="admin", error="insufficient_scope"',
            None,
            "insufficient_scope",
        ),
        # names are case-insensitive, quoted values unescaped (RFC 9110 §11.2)
        (
            'Bearer Scope="a \\"b\\"", ERROR=insufficient_scope',
            'a "b"',
            "insufficient_scope",
        ),
        (
            'Bearer scope = "read write" , error="insufficient_scope"',
            "read write",
            "insufficient_scope",
        ),
    ],
)
def test_www_authenticate_parameters_are_read_as_parameters(
    header: str, scope: str | None, error: str | None
) -> None:
    """The challenge's parameters were found by a regex search of the whole
    header: ``scope=`` inside a quoted ``error_description`` (or ``xscope=``)
    was taken for the scope a login then asked for."""
    challenge = discovery.Challenge.parse(403, header)
    assert (challenge.scope, challenge.error) == (scope, error)


@pytest.mark.parametrize(
    ("issuer", "documents"),
    [
        # the identity provider's metadata names an issuer urllib cannot parse
        (
            AS,
            {
                "/.well-known/oauth-authorization-server": b'{"issuer":"https://as.exampl].com",'
                b'"token_endpoint":"https://as.example.com/t"}'
            },
        ),
        # a configured issuer that urlsplit takes (check_server_spec) and urljoin does not
        (AS + "//[", {}),
    ],
)
def test_identity_provider_issuers_urllib_refuses_are_endpoint_errors(
    issuer: str, documents: dict[str, bytes]
) -> None:
    """Both raised ValueError ("Invalid IPv6 URL") out of the SDK's
    ``issuers_match`` and discovery URL builder, not ``EndpointError``."""

    async def main() -> None:
        async with _serving(documents) as http:
            with pytest.raises(endpoints.EndpointError):
                await machine._idp_token_endpoint(http, issuer)

    anyio.run(main, backend="asyncio")


@pytest.mark.parametrize("url", ["https://[login.example/a", "//[", "https://]x"])
def test_an_authorization_endpoint_urllib_cannot_split_is_refused(url: str) -> None:
    """``urlsplit`` raised ValueError ("Invalid IPv6 URL") out of the check."""
    with pytest.raises(LoginError, match="not an https URL"):
        discovery.check_authorization_endpoint(url)


# --- upstream bodies and notifications decoded past the reader --------------


def _in_a_member() -> bytes:
    """An object nested too deeply in a member no struct declares (skipped,
    recursively): a nesting at the top fails a struct's type check first."""
    return b'{"level":"error","progressToken":1,"progress":1,"x":' + nested() + b"}"


def _heard_by_a_log_sink() -> None:
    sink = logs.LogSink(_no_send, "debug", lambda *said: b"")
    sink.heard("deep", msgspec.Raw(_in_a_member()))


def _a_task_status() -> None:
    anyio.run(tasks.TaskBook().noticed, "deep", msgspec.Raw(nested()))


def _a_progress_report() -> None:
    async def main() -> None:
        token = calllife.current.set(SimpleNamespace(send=_no_send))  # type: ignore[arg-type]
        try:
            forward = calls.progress_to_client(lambda report: b"")
            assert forward is not None
            await forward(msgspec.Raw(_in_a_member()))
        finally:
            calllife.current.reset(token)

    anyio.run(main, backend="asyncio")


def _a_404_body() -> None:
    assert session._names_the_session(_in_a_member()) is False


def _a_cognee_answer() -> None:
    assert cognee._json(nested()) == nested().decode()


@pytest.mark.parametrize(
    "read",
    [
        _heard_by_a_log_sink,
        _a_task_status,
        _a_progress_report,
        _a_404_body,
        _a_cognee_answer,
    ],
)
def test_upstream_json_nested_too_deeply_is_dropped_not_a_crash(
    read: Callable[[], None],
) -> None:
    """Found reading the reader's neighbours once its RecursionError was
    known: each decoded a server's bytes catching msgspec's errors only. A
    log message's params and a task status (decoded again in the session's
    reader, higher up the stack than the line was), a progress report
    (logged as a bug by its lane), a 404 body, a Cognee answer."""
    read()


async def _no_send(line: bytes) -> None:
    raise AssertionError("nothing is sent")


# --- the config file (config.py) ------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        ".".join(["a"] * 3000) + " = 1\n",  # found by fuzzing
        "[" + ".".join(["a"] * 3000) + "]\n",
        'servers = [{name = "x", env = {' + ".".join(["a"] * 3000) + ' = "1"}}]\n',
    ],
)
def test_dotted_keys_nested_too_deeply_are_a_config_error(
    text: str, tmp_path: Path
) -> None:
    """tomllib builds dotted keys' tables without recursing (it recurses for
    nested arrays and inline tables, which were already a ConfigError); the
    NUL check after it did, and raised RecursionError out of ``load``."""
    path = tmp_path / "memorizzd.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match="nested too deeply"):
        load(
            str(path),
            state_dir=str(tmp_path),
            environ={"MEMORIZZ_SOCKET": str(tmp_path / "s")},
        )


# --- the socket API (rpc/dispatch.py) ------------------------------------------


def test_params_too_deep_for_their_decoder_are_invalid_params() -> None:
    """Params the line reader could read (it parses near the bottom of the
    stack) may be too deep for the method's decoder higher up: that was
    RecursionError, answered ``internal`` with a traceback logged."""

    async def never(caller: Caller, params: object) -> None:
        raise AssertionError("not run")

    dispatcher = Dispatcher(dict.fromkeys(METHODS, never))  # type: ignore[arg-type]
    request = Request(
        jsonrpc="2.0",
        method="tools/call",
        id=1,
        params=msgspec.Raw(
            b'{"server":"t","name":"x","arguments":{"a":' + nested() + b"}}"
        ),
    )
    caller = Caller(pid=1, uid=0, gid=0, socket="s", role="operator")
    line = anyio.run(dispatcher.run, caller, request)
    assert msgspec.json.decode(line)["error"]["code"] == -32602


def test_face_params_too_deep_for_their_decoder_are_invalid_params() -> None:
    """The face's params decoder, like the socket API's: a line the reader
    could parse may be too deep where its params are decoded again, higher
    up the stack; that was RecursionError, answered ``internal``."""
    deep = msgspec.Raw(b'{"uri":' + nested() + b"}")
    with pytest.raises(InvalidParamsError, match="nested too deeply"):
        face._decode(deep, dict)


def test_decode_sites_of_untrusted_json_take_a_too_deep_value_as_unreadable() -> None:
    """The class, site by site: each place that decodes what a caller or a
    server sent and catches msgspec's errors catches RecursionError too."""
    roots = Path(face.__file__).parent
    sites = []
    for path in sorted(roots.rglob("*.py")):
        lines = path.read_text().splitlines()
        for number, line in enumerate(lines, 1):
            around = "".join(lines[max(0, number - 5) : number + 6])  # its try
            if "except (msgspec." in line and "RecursionError" not in around:
                sites.append(f"{path.relative_to(roots)}:{number}")
    assert sites == [], sites
