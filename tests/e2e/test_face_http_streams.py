"""What the daemon sends outside a direct answer, over the Streamable HTTP
bridge (issue 11, item 2 and "How it is shown").

``memorizzctl mcp serve --transport streamable-http`` answers a request whose
handling makes the daemon send something first as an event stream (its
progress, log messages, the upstream's elicitation and sampling requests of
that call, then the answer), and offers each session a GET stream for the rest
(list changes, resource updates); the client's answers to the upstream's
requests come back as POSTs (202). The official Python SDK client, with its
callbacks, through the real bridge and the real daemon, in front of our SDK
test servers over stdio: ``alpha`` (tests/mcp_server.py), ``ask``
(tests/asking_server.py) and ``feat`` (tests/features_server.py). Plain HTTP
requests show the routing the SDK client does not reach: an upstream's request
sent on the GET stream when the call's POST takes JSON only, a list change
kept for a GET stream opened later, and a request refused at once when there
is no stream to send it on.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Iterator
from typing import Any

import anyio
import httpx2
import mcp_types as types
import msgspec
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from tests.e2e.test_face_asks import _sample, _text  # the same answers
from tests.faults import cutting_proxy
from tests.harness import (
    DaemonHarness,
    asking_spec,
    daemon_config,
    features_spec,
    http_bridge,
    short_tempdir,
    stdio_spec,
)

WAIT_S = 30  # a guard against a hang, never a measurement


@pytest.fixture(scope="module")
def harness() -> Iterator[DaemonHarness]:
    base = short_tempdir()
    config = daemon_config(
        base,
        servers=[
            stdio_spec("alpha"),
            asking_spec(),
            features_spec(),
        ],
    )
    with DaemonHarness.running(config) as harness:
        for name in ("alpha", "ask", "feat"):
            harness.wait_ready(name)
        yield harness


@pytest.fixture(scope="module")
def bridge(harness: DaemonHarness) -> Iterator[tuple[str, str]]:
    """The HTTP bridge on a loopback port in front of the operator's face;
    yields its URL and bearer token."""
    with http_bridge(harness.socket) as url_and_token:
        yield url_and_token


async def _elicit(context: Any, params: Any) -> types.ElicitResult:
    if isinstance(params, types.ElicitRequestURLParams):
        return types.ElicitResult(action="accept")
    return types.ElicitResult(action="accept", content={"name": "Ada"})


def _http(token: str) -> httpx2.AsyncClient:
    return httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {token}"}, timeout=WAIT_S
    )


def test_the_sdk_client_answers_an_upstreams_requests_over_http(
    bridge: tuple[str, str],
) -> None:
    """Form and URL elicitation, sampling with and without tools: each request
    comes on its call's event stream to the client's callbacks, and their
    answers (POSTed back) reach the upstream."""
    url, token = bridge
    asked: list[str] = []

    async def elicit(context: Any, params: Any) -> types.ElicitResult:
        asked.append(params.message)
        return await _elicit(context, params)

    async def run() -> list[str]:
        async with (
            _http(token) as http,
            Client(
                streamable_http_client(url, http_client=http),
                mode="legacy",
                elicitation_callback=elicit,
                sampling_callback=_sample,
                sampling_capabilities=types.SamplingCapability(
                    tools=types.SamplingToolsCapability()
                ),
            ) as client,
        ):
            results = [
                await client.call_tool("ask__ask_name", {}),
                await client.call_tool("ask__ask_url", {}),
                await client.call_tool("ask__sample", {"prompt": "2+2"}),
                await client.call_tool("ask__sample_tools", {"prompt": "look"}),
            ]
        assert not any(r.is_error for r in results), results
        return [_text(r) for r in results]

    assert anyio.run(run) == [
        "hello Ada",
        "accept",
        "model-x: answer to 2+2",
        "model-x: tool_use",
    ]
    assert asked == ["What is your name?", "Log in at the example page"]


@pytest.mark.filterwarnings(
    "ignore::mcp.shared.exceptions.MCPDeprecationWarning"  # logging/setLevel
)
def test_log_messages_list_changes_and_resource_updates_reach_the_sdk_client(
    bridge: tuple[str, str],
) -> None:
    """A log message during a call (on the call's stream) reaches the logging
    callback; ``tools/list_changed`` and ``resources/updated`` (on the
    session's GET stream) reach the message handler."""
    url, token = bridge
    logged: list[tuple[str, str | None, Any]] = []
    heard_log, changed, updated = anyio.Event(), anyio.Event(), anyio.Event()

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        logged.append((params.level, params.logger, params.data))
        heard_log.set()

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            changed.set()
        elif (
            isinstance(message, types.ResourceUpdatedNotification)
            and str(message.params.uri) == "feat://watched"
        ):
            updated.set()

    async def run() -> list[str]:
        async with (
            _http(token) as http,
            Client(
                streamable_http_client(url, http_client=http),
                mode="legacy",
                logging_callback=on_log,
                message_handler=on_message,
            ) as client,
        ):
            await client.session.set_logging_level("info")
            result = await client.call_tool("alpha__logged", {"text": "over http"})
            assert _text(result) == "logged"
            with anyio.fail_after(WAIT_S):
                await heard_log.wait()

            before = {t.name for t in (await client.list_tools()).tools}
            await client.call_tool("alpha__change_tools", {})
            with anyio.fail_after(WAIT_S):
                await changed.wait()
            after = {t.name for t in (await client.list_tools()).tools}

            await client.subscribe_resource("feat://watched")
            touched = await client.call_tool("feat__touch", {"uri": "feat://watched"})
            assert _text(touched) == "touched"
            with anyio.fail_after(WAIT_S):
                await updated.wait()
            await client.unsubscribe_resource("feat://watched")
        return sorted(after - before)

    (added,) = anyio.run(run)
    assert added.startswith("alpha__dyn_")
    assert ("info", "alpha", "over http") in logged


# --- by plain requests -----------------------------------------------------------


class _Raw:
    """A session by plain HTTP requests, and its GET stream's messages."""

    def __init__(self, url: str, token: str) -> None:
        self.url = url
        self.http = httpx2.Client(
            headers={"Authorization": f"Bearer {token}"}, timeout=WAIT_S
        )
        reply = self.http.post(
            url,
            json={
                "jsonrpc": "2.0",
                "id": 0,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-11-25",
                    "capabilities": {"elicitation": {}},
                    "clientInfo": {"name": "raw", "version": "0"},
                },
            },
            headers={"Accept": "application/json, text/event-stream"},
        )
        assert reply.status_code == 200, reply.text
        self.sid = {
            "Mcp-Session-Id": reply.headers["mcp-session-id"],
            "MCP-Protocol-Version": "2025-11-25",
        }
        assert self.notify("notifications/initialized").status_code == 202
        self.heard: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()
        self.status: int | None = None
        self.content_type: str | None = None

    def notify(self, method: str) -> httpx2.Response:
        return self.post({"jsonrpc": "2.0", "method": method})

    def post(self, body: object, accept: str = "application/json") -> httpx2.Response:
        return self.http.post(
            self.url, json=body, headers={**self.sid, "Accept": accept}
        )

    def call(self, rid: int, name: str, arguments: dict[str, Any]) -> httpx2.Response:
        """A tools/call whose POST takes JSON only (no event stream)."""
        body = {
            "jsonrpc": "2.0",
            "id": rid,
            "method": "tools/call",
            "params": {"name": name, "arguments": arguments},
        }
        return self.post(body)

    def listen(self) -> threading.Thread:
        """Open the GET stream; return once it is open, its messages going to
        ``heard`` from the thread returned (which ends with the stream)."""
        opened = threading.Event()

        def read() -> None:
            headers = {**self.sid, "Accept": "text/event-stream"}
            with (
                contextlib.suppress(httpx2.HTTPError),  # the session's end
                self.http.stream("GET", self.url, headers=headers) as stream,
            ):
                self.status = stream.status_code
                self.content_type = stream.headers.get("content-type")
                opened.set()
                for line in stream.iter_lines():
                    if line.startswith("data: ") and line[6:].strip():  # not priming
                        self.heard.put(msgspec.json.decode(line[6:]))

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        assert opened.wait(WAIT_S)
        assert (self.status, self.content_type) == (200, "text/event-stream")
        return reader

    def next_heard(self) -> dict[str, Any]:
        return self.heard.get(timeout=WAIT_S)

    def close(self) -> None:
        self.http.delete(self.url, headers=self.sid)
        self.http.close()


@pytest.fixture
def raw(bridge: tuple[str, str]) -> Iterator[_Raw]:
    session = _Raw(*bridge)
    try:
        yield session
    finally:
        session.close()


def test_a_request_whose_call_takes_json_only_comes_on_the_get_stream(
    raw: _Raw,
) -> None:
    """The call's POST accepts JSON only: the upstream's elicitation goes on
    the GET stream; the answer, POSTed, is taken (202) and reaches the
    upstream, and the call's answer is JSON."""
    raw.listen()
    answers: queue.SimpleQueue[httpx2.Response] = queue.SimpleQueue()
    threading.Thread(
        target=lambda: answers.put(raw.call(7, "ask__ask_name", {})), daemon=True
    ).start()
    asked = raw.next_heard()
    assert asked["method"] == "elicitation/create"
    assert asked["params"]["message"] == "What is your name?"
    response = {
        "jsonrpc": "2.0",
        "id": asked["id"],
        "result": {"action": "accept", "content": {"name": "Gus"}},
    }
    taken = raw.post(response)
    assert (taken.status_code, taken.content) == (202, b"")
    answer = answers.get(timeout=WAIT_S)
    assert answer.headers["content-type"] == "application/json"
    assert answer.json()["result"]["content"][0]["text"] == "hello Gus"


def test_a_list_change_waits_for_the_get_stream(raw: _Raw) -> None:
    """A ``tools/list_changed`` sent while the session has no GET stream open
    is kept, and is the first thing the stream says once opened."""
    listed = raw.post({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    assert listed.status_code == 200
    assert raw.call(2, "alpha__change_tools", {}).json()["result"]["content"]
    raw.listen()
    assert raw.next_heard() == {
        "jsonrpc": "2.0",
        "method": "notifications/tools/list_changed",
    }


def test_a_request_with_no_stream_to_go_on_is_refused_at_once(raw: _Raw) -> None:
    """No GET stream and a call that takes JSON only: the upstream's request
    is refused by the bridge at once (the upstream is not kept waiting) and
    the call ends with what the upstream made of that."""
    answer = raw.call(3, "ask__ask_name", {}).json()
    try:
        said = answer["result"]["content"][0]["text"]
    except KeyError:
        said = answer["error"]["message"]
    assert "no stream to the HTTP client to send this on" in said


def test_the_sdk_client_of_the_sessionless_era_is_asked_by_input_required_results(
    bridge: tuple[str, str],
) -> None:
    """2026-07-28 over HTTP: no session and no stream; an upstream's
    elicitation comes back as an input-required result, which the SDK client
    answers with its callback and retries (SEP-2322)."""
    url, token = bridge

    async def run() -> str:
        async with (
            _http(token) as http,
            Client(
                streamable_http_client(url, http_client=http),
                mode="auto",
                elicitation_callback=_elicit,
            ) as client,
        ):
            assert client.protocol_version == "2026-07-28"
            try:
                return _text(await client.call_tool("ask__ask_name", {}))
            except MCPError as exc:
                return exc.message

    assert anyio.run(run) == "hello Ada"


def test_a_newer_get_stream_ends_the_older_and_a_get_must_take_events(
    raw: _Raw,
) -> None:
    """One GET stream per session: a second ends the first (its response
    ends, and what comes next goes to the second); a GET that does not accept
    ``text/event-stream`` is 406, one for an unknown session 404."""
    older = raw.listen()
    raw.heard = queue.SimpleQueue()  # the newer stream's
    raw.listen()
    older.join(WAIT_S)
    assert not older.is_alive()  # the bridge ended its response
    raw.post({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    assert raw.call(2, "alpha__change_tools", {}).status_code == 200
    assert raw.next_heard()["method"] == "notifications/tools/list_changed"
    json_only = raw.http.get(raw.url, headers={**raw.sid, "Accept": "application/json"})
    assert json_only.status_code == 406
    unknown = raw.http.get(
        raw.url, headers={"Mcp-Session-Id": "nope", "Accept": "text/event-stream"}
    )
    assert unknown.status_code == 404


# --- resumption (Last-Event-ID) -------------------------------------------------


class _Event(msgspec.Struct):
    id: str | None = None
    retry: int | None = None
    data: str = ""


def _events(lines: Iterator[str]) -> Iterator[_Event]:
    """The events of an SSE stream, priming events (no data) among them."""
    event = _Event()
    for line in lines:
        if not line:
            if event.id is not None or event.data:
                yield event
            event = _Event()
        elif line.startswith("id: "):
            event.id = line[4:]
        elif line.startswith("retry: "):
            event.retry = int(line[7:])
        elif line.startswith("data: "):
            event.data += line[6:]


def _progressing(rid: int, steps: int) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": rid,
        "method": "tools/call",
        "params": {
            "name": "alpha__progressing",
            "arguments": {"steps": steps},
            "_meta": {"progressToken": f"p{rid}"},
        },
    }


def _seq(event: _Event) -> tuple[int, int]:
    assert event.id is not None
    number, _, seq = event.id.partition("-")
    return int(number), int(seq)


def test_a_call_whose_event_stream_breaks_is_resumed_with_its_last_event_id(
    raw: _Raw,
) -> None:
    """A call's event stream starts with a priming event (an id, no data, a
    retry time); a client whose connection breaks mid-call comes back with a
    GET and ``Last-Event-ID`` and gets the rest: every progress step once, in
    order, then the answer (MCP's Streamable HTTP resumability)."""
    accept = {**raw.sid, "Accept": "application/json, text/event-stream"}
    with raw.http.stream(
        "POST", raw.url, json=_progressing(5, 40), headers=accept
    ) as r:
        assert r.headers["content-type"] == "text/event-stream"
        events = _events(r.iter_lines())
        priming = next(events)
        first = [next(events), next(events)]
    # the connection is closed here, the call still running
    assert (priming.data, priming.retry) == ("", 1000)
    number, zero = _seq(priming)
    assert zero == 0
    assert [_seq(e) for e in first] == [(number, 1), (number, 2)]
    assert first[-1].id is not None
    resume = {**raw.sid, "Accept": "text/event-stream", "Last-Event-ID": first[-1].id}
    rest: list[_Event] = []
    with raw.http.stream("GET", raw.url, headers=resume) as r:
        assert (r.status_code, r.headers["content-type"]) == (200, "text/event-stream")
        for event in _events(r.iter_lines()):
            rest.append(event)
            if msgspec.json.decode(event.data).get("id") == 5:
                break
    seqs = [_seq(e) for e in rest]
    assert seqs == [(number, n) for n in range(3, len(rest) + 3)]  # no gap, none twice
    messages = [msgspec.json.decode(e.data) for e in first + rest]
    steps = [m["params"]["progress"] for m in messages[:-1]]
    assert steps == list(range(1, 41))
    assert messages[-1]["result"]["content"][0]["text"] == "done in 40 steps"
    # the answer was given: there is nothing left to resume
    again = raw.http.get(
        raw.url, headers={**resume, "Last-Event-ID": rest[-1].id or ""}
    )
    assert again.status_code == 400
    assert "no stream to resume" in again.json()["error"]["message"]


def test_the_sdk_client_resumes_a_call_whose_connection_breaks(
    bridge: tuple[str, str],
) -> None:
    """The official Python SDK client, its connection cut mid-call by a relay
    in front of the bridge (after the third progress step): it comes back with
    a GET and ``Last-Event-ID`` once the priming event's retry time has passed,
    and gets every step once, in order, then the answer."""
    url, token = bridge
    steps: list[float] = []

    async def progressed(
        progress: float, total: float | None, message: str | None
    ) -> None:
        steps.append(progress)

    async def run(proxied: str) -> types.CallToolResult:
        async with (
            _http(token) as http,
            Client(
                streamable_http_client(proxied, http_client=http), mode="legacy"
            ) as client,
        ):
            return await client.call_tool(
                "alpha__progressing", {"steps": 20}, progress_callback=progressed
            )

    with cutting_proxy(url, b'"progress":3') as (proxied, cuts):
        result = anyio.run(run, proxied)
    assert cuts.cut.is_set()
    assert (result.is_error, _text(result)) == (False, "done in 20 steps")
    assert steps == [float(n) for n in range(1, 21)]
    came_back = [h for h in cuts.heads("GET") if b"\r\nlast-event-id:" in h]
    assert len(came_back) == 1, cuts.heads("GET")


def test_a_get_stream_that_breaks_is_resumed_after_its_last_event(raw: _Raw) -> None:
    """The GET stream's events are numbered across its GETs: a GET with the
    ``Last-Event-ID`` of the one a dropped stream's client last saw gets the
    events after it again, then what waited for a stream."""
    raw.post({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    listen = {**raw.sid, "Accept": "text/event-stream"}
    with raw.http.stream("GET", raw.url, headers=listen) as r:
        events = _events(r.iter_lines())
        priming = next(events)
        for rid in (2, 3):
            raw.post({"jsonrpc": "2.0", "id": 10 + rid, "method": "tools/list"})
            assert raw.call(rid, "alpha__change_tools", {}).status_code == 200
        heard = [next(events), next(events)]
    assert priming.id == "0-0"
    assert [e.id for e in heard] == ["0-1", "0-2"]
    raw.post({"jsonrpc": "2.0", "id": 14, "method": "tools/list"})
    assert raw.call(4, "alpha__change_tools", {}).status_code == 200  # no stream open
    with raw.http.stream(
        "GET", raw.url, headers={**listen, "Last-Event-ID": "0-1"}
    ) as r:
        events = _events(r.iter_lines())
        again = [next(events), next(events)]
    assert [e.id for e in again] == ["0-2", "0-3"]
    assert {msgspec.json.decode(e.data)["method"] for e in again} == {
        "notifications/tools/list_changed"
    }
    # a GET without one starts after what the session's streams sent
    with raw.http.stream("GET", raw.url, headers=listen) as r:
        assert next(_events(r.iter_lines())).id == "0-3"


@pytest.mark.parametrize(
    "event_id",
    [b"999-1", b"1-\xb2", b"\xb9-1", b"1-" + b"9" * 5000, b"-", b"1--1"],
    ids=["unknown", "superscript-2", "superscript-1", "5000-digits", "dash", "minus"],
)
def test_a_last_event_id_of_no_stream_here_is_400(raw: _Raw, event_id: bytes) -> None:
    # "²" passes str.isdigit and made int() raise: the request got no answer
    headers = {**raw.sid, "Accept": "text/event-stream", "Last-Event-ID": event_id}
    refused = raw.http.get(raw.url, headers=headers)
    assert refused.status_code == 400
    assert "no stream to resume" in refused.json()["error"]["message"]
