"""The Cognee Cloud bridge end to end: ``memorizzctl mcp add NAME --preset
cognee --url https://TENANT.aws.cognee.ai --token-file KEY`` against a local
fake of the Cognee Cloud API on loopback TLS.

Nothing is bypassed for the test: the tenant is a real ``*.aws.cognee.ai``
name, answered by the fake DNS of ``egress_world`` with a public address that
the loopback dial maps to the fake (the only mocks: the DNS answer and the
dial), its certificate from the test CA. The tenant URL rules are table-driven.
"""

from __future__ import annotations

import os
import secrets
import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from memorizz.api import methods as m
from memorizz.api.errors import (
    ApprovalRequiredError,
    InvalidParamsError,
    PermissionDeniedError,
)
from memorizz.api.spec import check_server_spec, cognee_tenant_url
from memorizzd.config import Decisions
from memorizzd.egress import client as egress_client
from tests.egress_world import (
    PUBLIC_V4,
    TLS,
    FakeDNS,
    LoopbackDial,
    World,
    serve,
    tls_material,
)
from tests.harness import DaemonHarness, daemon_config

TENANT_ID = "3f2c1a9e-5b7d-4c8e-9a1f-0d6b2e4c8a71"
TENANT = f"tenant-{TENANT_ID}.aws.cognee.ai"
TENANT_URL = f"https://{TENANT}"
PLACEHOLDER = "k"
"""A key where only its presence matters."""


class FakeCognee:
    """The Cognee Cloud API's part the bridge uses, in memory. A dataset
    that was just remembered into answers its first recall with 409 (still
    indexing), and the next one with what it holds."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.datasets: dict[str, list[str]] = {}
        self.indexing: set[str] = set()
        self.sessions: dict[str, list[str]] = {}
        self.log: list[str] = []
        self.tenant_ids: list[str | None] = []

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/api/v1/datasets/", self.list_datasets, methods=["GET"]),
                Route("/api/v1/remember", self.remember, methods=["POST"]),
                Route("/api/v1/remember/entry", self.entry, methods=["POST"]),
                Route("/api/v1/recall", self.recall, methods=["POST"]),
                Route("/api/v1/forget", self.forget, methods=["POST"]),
            ]
        )

    def _refused(self, request: Request) -> Response | None:
        self.log.append(f"{request.method} {request.url.path}")
        self.tenant_ids.append(request.headers.get("x-tenant-id"))
        if request.headers.get("x-api-key") != self.key:
            return JSONResponse({"detail": "Invalid API key"}, status_code=401)
        return None

    async def list_datasets(self, request: Request) -> Response:
        if (refused := self._refused(request)) is not None:
            return refused
        return JSONResponse(
            [
                {"id": str(uuid.uuid5(uuid.NAMESPACE_DNS, name)), "name": name}
                for name in self.datasets
            ]
        )

    async def remember(self, request: Request) -> Response:
        if (refused := self._refused(request)) is not None:
            return refused
        async with request.form() as form:
            upload: Any = form["data"]
            name = str(form.get("datasetName") or "main_dataset")
            text = (await upload.read()).decode()
        self.datasets.setdefault(name, []).append(text)
        self.indexing.add(name)
        return JSONResponse({"status": "PipelineRunCompleted", "dataset_name": name})

    async def entry(self, request: Request) -> Response:
        if (refused := self._refused(request)) is not None:
            return refused
        body = msgspec.json.decode(await request.body())
        self.sessions.setdefault(body["session_id"], []).append(body["entry"]["answer"])
        return JSONResponse({"status": "stored"})

    async def recall(self, request: Request) -> Response:
        if (refused := self._refused(request)) is not None:
            return refused
        body = msgspec.json.decode(await request.body())
        names = body.get("datasets") or []
        busy = [n for n in names if n in self.indexing]
        if busy:
            self.indexing.difference_update(busy)  # ready by the next recall
            return JSONResponse(
                {"error": "An error occurred during recall."}, status_code=409
            )
        words = body["query"].lower().split()
        return JSONResponse(
            [
                {
                    "dataset_name": n,
                    "search_result": [
                        t
                        for t in self.datasets.get(n, [])
                        if any(w in t.lower() for w in words)
                    ],
                }
                for n in names
            ]
        )

    async def forget(self, request: Request) -> Response:
        if (refused := self._refused(request)) is not None:
            return refused
        body = msgspec.json.decode(await request.body())
        if body.get("everything"):
            self.datasets.clear()
        else:
            self.datasets.pop(body["dataset"], None)
        return JSONResponse({"status": "success"})


@pytest.fixture(scope="module")
def tls() -> Iterator[TLS]:
    with tls_material(("*.aws.cognee.ai",)) as material:
        yield material


@pytest.fixture(scope="module")
def key() -> str:
    return secrets.token_urlsafe(24)  # made here: no credential in this file


@pytest.fixture
def fake(tls: TLS, key: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCognee]:
    cognee = FakeCognee(key)
    with serve(cognee.app(), tls) as port:
        world = World(tls, FakeDNS({TENANT: [PUBLIC_V4]}), LoopbackDial())
        world.route(PUBLIC_V4, 443, port)
        monkeypatch.setattr(egress_client, "DEFAULT_NETWORK", world.network())
        yield cognee


def add_cognee(d: DaemonHarness, base_dir: str, key: str, name: str = "cognee") -> int:
    key_file = Path(base_dir, f"{name}.key")
    key_file.write_text(key + "\n")
    return d.ctl(
        "mcp", "add", name, "--preset", "cognee", "--url", TENANT_URL,
        "--token-file", str(key_file),
    )  # fmt: skip


def text_of(result: m.ToolsCallResult) -> str:
    return str(result.content[0]["text"])


def test_remember_recall_forget_through_the_bridge(
    base_dir: str, fake: FakeCognee, key: str, capsys: pytest.CaptureFixture[str]
) -> None:
    config = daemon_config(base_dir, decisions=Decisions(destructive="allow"))
    with DaemonHarness.running(config) as d:
        assert add_cognee(d, base_dir, key) == 0
        d.wait_ready("cognee")
        with d.client() as c:
            tools = {t.name: t for t in c.list_tools("cognee")}
            assert set(tools) == {"remember", "recall", "forget"}
            assert {n: t.risk for n, t in tools.items()} == {
                "recall": "read",
                "remember": "write",
                "forget": "destructive",
            }
            assert tools["recall"].input_schema["required"] == ["query"]
            assert set(tools["remember"].input_schema["properties"]) == {
                "data", "filename", "content_base64", "dataset_name",
                "session_id", "custom_prompt", "background",
            }  # fmt: skip
            assert set(tools["forget"].input_schema["properties"]) == {
                "dataset", "everything", "data_id", "dataset_id",
            }  # fmt: skip

            stored = c.call_tool(
                "cognee",
                "remember",
                {"data": "Ada prefers tea", "dataset_name": "people"},
            )
            assert not stored.is_error
            assert "dataset=people" in text_of(stored)
            assert fake.datasets == {"people": ["Ada prefers tea"]}

            # Right after remember: still indexing, a retryable tool error.
            early = c.call_tool("cognee", "recall", {"query": "tea"})
            assert early.is_error
            assert early.structured_content == {
                "reason": "indexing_not_finished",
                "retryable": True,
                "retry_after_s": 5.0,
                "status": 409,
            }
            assert "still indexing" in text_of(early)
            ready = c.call_tool("cognee", "recall", {"query": "tea"})
            assert not ready.is_error
            assert "Ada prefers tea" in text_of(ready)

            session = c.call_tool(
                "cognee", "remember", {"data": "draft", "session_id": "s1"}
            )
            assert "session cache" in text_of(session)
            assert fake.sessions == {"s1": ["draft"]}

            refused = c.call_tool("cognee", "forget", {})
            assert refused.is_error
            assert refused.structured_content == {
                "reason": "invalid_arguments",
                "retryable": False,
            }
            gone = c.call_tool("cognee", "forget", {"dataset": "people"})
            assert "deleted" in text_of(gone)
            assert fake.datasets == {}

            info = c.list_servers()[0]
            assert info.transport == "builtin"
            assert info.url is None  # the tenant URL lives in the vault
            assert info.timeout_s == 60  # calls without a timeout get 60 s
            audit = c.audit(server="cognee", tool="recall").records
            assert [r.outcome for r in audit] == ["ok", "tool_error"]
    # A tenant-<uuid> host's id goes in X-Tenant-Id, as cognee-mcp sends it.
    assert set(fake.tenant_ids) == {TENANT_ID}
    assert "POST /api/v1/remember" in fake.log
    # The key and the tenant URL are in no row of the state database.
    state = sqlite3.connect(os.path.join(base_dir, "state", "state.db"))
    try:
        dump = "\n".join(state.iterdump())
    finally:
        state.close()
    assert key not in dump
    assert TENANT not in dump


def test_setup_checks_access_and_the_health_check_calls_nothing(
    base_dir: str, fake: FakeCognee, key: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with DaemonHarness.running(daemon_config(base_dir)) as d:
        assert add_cognee(d, base_dir, key) == 0
        d.wait_ready("cognee")
        with d.client() as c:
            before = list(fake.log)
            c.ping("cognee")  # the health probe: configuration only
            assert fake.log == before
            result = c.test_server("cognee")
            assert result.outcome == "ok", result.message
            assert fake.log[len(before) :] == ["GET /api/v1/datasets/"]
            # Destructive tools ask by default: forget is held for an operator.
            tools = {t.name: t.decision for t in c.list_tools("cognee")}
            assert tools == {"recall": "allow", "remember": "allow", "forget": "ask"}
            with pytest.raises(ApprovalRequiredError):
                c.call_tool("cognee", "forget", {"everything": True})
        assert add_cognee(d, base_dir, "not-the-key", name="wrong") == 0
        d.wait_ready("wrong")
        with d.client() as c:
            result = c.test_server("wrong")
            assert result.outcome == "authorization_required"
            assert "refused the API key" in result.message
            status = c.server_status("wrong")[0]
    capsys.readouterr()
    assert "not-the-key" not in msgspec.json.encode(status).decode()


def test_the_host_allowlist_applies_to_the_tenant(
    base_dir: str, fake: FakeCognee, key: str, capsys: pytest.CaptureFixture[str]
) -> None:
    config = daemon_config(base_dir, host_allowlist=["*.example.test"])
    with DaemonHarness.running(config) as d, d.client() as c:
        spec = m.ServerSpec(
            name="cognee",
            transport="builtin",
            preset="cognee",
            url=TENANT_URL,
            token=key,
        )
        with pytest.raises(PermissionDeniedError) as refused:
            c.add_server(spec)
        assert refused.value.reason == "host_not_allowed"
    assert fake.log == []


GOOD = [
    (TENANT_URL, TENANT_URL),
    (TENANT_URL + "/", TENANT_URL),
    ("HTTPS://Acme.AWS.Cognee.AI", "https://acme.aws.cognee.ai"),
    ("https://a.b.aws.cognee.ai", "https://a.b.aws.cognee.ai"),
]
BAD = [
    ("http://acme.aws.cognee.ai", "https only"),
    ("acme.aws.cognee.ai", "https only"),
    ("ftp://acme.aws.cognee.ai", "https only"),
    ("https://acme.example.com", "under *.aws.cognee.ai"),
    ("https://aws.cognee.ai", "under *.aws.cognee.ai"),
    ("https://acme.aws.cognee.ai.evil.test", "under *.aws.cognee.ai"),
    ("https://acme.cognee.ai", "under *.aws.cognee.ai"),
    ("https://acme-aws.cognee.ai", "under *.aws.cognee.ai"),
    ("https://127.0.0.1", "under *.aws.cognee.ai"),
    ("https://acme.aws.cognee.ai.", "under *.aws.cognee.ai"),
    ("https://user:pw@acme.aws.cognee.ai", "no credentials"),
    ("https://user@acme.aws.cognee.ai", "no credentials"),
    ("https://evil.test@acme.aws.cognee.ai", "no credentials"),
    ("https://acme.aws.cognee.ai:443", "no port"),
    ("https://acme.aws.cognee.ai:8443", "no port"),
    ("https://acme.aws.cognee.ai/api", "no path"),
    ("https://acme.aws.cognee.ai//", "no path"),
    ("https://acme.aws.cognee.ai?x=1", "no query"),
    ("https://acme.aws.cognee.ai/?", "no query"),
    ("https://acme.aws.cognee.ai#top", "no fragment"),
    ("https://acme.aws.cognee.ai/#", "no fragment"),
    (" https://acme.aws.cognee.ai", "spaces"),
    ("https://acme.aws.cognee.ai\\@evil.test", "backslash"),
]


@pytest.mark.parametrize(("url", "expected"), GOOD)
def test_a_tenant_url_is_taken_as_https_host(url: str, expected: str) -> None:
    assert cognee_tenant_url(url) == expected
    check_server_spec(
        m.ServerSpec(
            name="c",
            transport="builtin",
            builtin="cognee",
            url=url,
            auth="bearer",
            token=PLACEHOLDER,
        )
    )


@pytest.mark.parametrize(("url", "rule"), BAD)
def test_a_tenant_url_that_breaks_a_rule_is_refused(url: str, rule: str) -> None:
    with pytest.raises(InvalidParamsError, match=rule_pattern(rule)):
        cognee_tenant_url(url)
    spec = m.ServerSpec(
        name="c",
        transport="builtin",
        builtin="cognee",
        url=url,
        auth="bearer",
        token=PLACEHOLDER,
    )
    with pytest.raises(InvalidParamsError, match=rule_pattern(rule)):
        check_server_spec(spec)


def rule_pattern(rule: str) -> str:
    import re

    return re.escape(rule)


def test_the_cli_refuses_a_bad_tenant_url_before_the_socket(
    base_dir: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with DaemonHarness.running(daemon_config(base_dir)) as d:
        status = d.ctl(
            "mcp", "add", "c", "--preset", "cognee",
            "--url", "https://acme.aws.cognee.ai:8443", "--token", "k",
        )  # fmt: skip
        assert status == 2
        assert "no port" in capsys.readouterr().err
        with d.client() as c:
            assert c.list_servers() == []
            no_key = m.ServerSpec(
                name="c", transport="builtin", preset="cognee", url=TENANT_URL
            )
            with pytest.raises(InvalidParamsError, match="auth bearer needs a token"):
                c.add_server(no_key)


def test_a_key_without_auth_bearer_says_so() -> None:
    """A token given without ``auth = "bearer"`` was told "needs its API key
    (--token -)", as if there were none."""
    spec = m.ServerSpec(
        name="c",
        transport="builtin",
        builtin="cognee",
        url=TENANT_URL,
        token=PLACEHOLDER,
    )
    with pytest.raises(InvalidParamsError) as refused:
        check_server_spec(spec)
    assert refused.value.message == (
        "server 'c': the cognee bridge's API key goes with auth = \"bearer\""
        " (auth is 'none')"
    )
