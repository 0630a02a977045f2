"""The ASGI views — ``/audit/`` and ``/v1/chat/completions`` — over real HTTP to the fake
upstream for every vendor kind the app ships (issue 14's "Done when"): non-stream,
stream, failover, circuit open, the request deadline, and a client that goes away
mid-stream (the upstream request must be closed, as the fake server sees it).

Served the way ``gunicorn -c gunicorn.conf.py`` serves them: the project's ASGI
application (``llm_routing.asgi.get_asgi_application``: Django's handler with the inline
middleware and the lifespan protocol), driven in process by ``httpx.ASGITransport``,
and under a real uvicorn server (lifespan on) for the disconnects, which need a socket
to close. The services suite runs this module again on PostgreSQL + Redis (its name
starts with ``test_api``: tests/services_plugin.py).

Two providers of the same kind, ``first`` and ``second``, on one fake server: which of
them a request reached is read from the model it named.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from django.test import override_settings
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from llm_routing.asgi import get_asgi_application
from llm_routing.models import Attempt, RoutingDecision
from llm_routing.resilience import breaker
from tests.breaker_support import FakeClock
from tests.conftest import VENDOR_OF_KIND, make_chain, make_provider
from tests.fakes.upstream import FakeUpstream, Faults
from tests.support import uvicorn_server, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

KINDS = ["openai", "openai_compatible", "anthropic", "gemini"]
MESSAGES = [{"role": "user", "content": "Say hello."}]
AUDIT = {"task": "summarize", "input_text": "Django is a web framework."}
CHAT = {"model": "default", "messages": MESSAGES}


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_PROVIDER_KEY", "sk-asgi-kinds-123456")
    monkeypatch.delenv("DJANGO_ALLOW_ASYNC_UNSAFE", raising=False)


@pytest.fixture
def token(user: Any) -> str:
    return str(Token.objects.create(user=user).key)


def first_and_second(upstream_chain: Callable[..., list[Any]], kind: str, **first: Any) -> None:
    upstream_chain(
        (
            "first",
            kind,
            {"model": "first-model", "supports_streaming": True, "max_retries": 0, **first},
        ),
        ("second", kind, {"model": "second-model", "supports_streaming": True}),
    )


def models_asked(fake: FakeUpstream, kind: str) -> list[str]:
    vendor = VENDOR_OF_KIND[kind]
    if vendor == "gemini":  # /v1beta/models/{model}:generateContent
        return [r.path.rsplit("/", 1)[-1].split(":", 1)[0] for r in fake.requests_for(vendor)]
    return [r.json["model"] for r in fake.requests_for(vendor)]


# --- the project's ASGI application in process --------------------------------------------


def accept(url: str, body: dict[str, Any]) -> str:
    """The Accept header of each call: an /audit/ stream asks for SSE; the OpenAI face
    gets what the OpenAI SDK sends (``application/json``, stream or not; see
    test_chat_stream_accepts_an_sse_accept_header)."""
    return "text/event-stream" if body.get("stream") and url == "/audit/" else "application/json"


def asgi(token: str, *calls: tuple[str, dict[str, Any]]) -> list[httpx.Response]:
    """POST each (url, body) in turn to the project's ASGI application on one event loop
    (as one uvicorn worker would)."""
    app = get_asgi_application()

    async def send_all() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
        headers = {"Authorization": f"Token {token}"}
        async with httpx.AsyncClient(
            transport=transport, base_url="http://testserver", headers=headers, timeout=30
        ) as client:
            out = []
            for url, body in calls:
                out.append(await client.post(url, json=body, headers={"Accept": accept(url, body)}))
            return out

    return asyncio.run(send_all())


def sse(response: httpx.Response) -> list[tuple[str, Any]]:
    """(event name, data) of each SSE event of a streamed answer ("message" when the
    event has no name; data "[DONE]" kept as a string)."""
    assert response.headers["content-type"].startswith("text/event-stream"), response.text
    events = []
    for block in response.text.split("\n\n"):
        if not block.strip():
            continue
        name, data = "message", ""
        for line in block.split("\n"):
            if line.startswith("event: "):
                name = line[len("event: ") :]
            elif line.startswith("data: "):
                data += line[len("data: ") :]
        events.append((name, data if data == "[DONE]" else json.loads(data)))
    return events


def chat_text(response: httpx.Response) -> str:
    events = sse(response)
    assert events[-1] == ("message", "[DONE]")
    return "".join(d["choices"][0]["delta"].get("content") or "" for _, d in events[:-1])


def audit_stream(response: httpx.Response) -> tuple[str, dict[str, Any]]:
    """The text of an /audit/ stream's chunk events, and its final result event."""
    events = sse(response)
    assert [name for name, _ in events[:-1]] == ["chunk"] * (len(events) - 1)
    name, result = events[-1]
    assert name == "result", events[-1]
    return "".join(d["text"] for _, d in events[:-1]), result


def audit_attempts(body: dict[str, Any]) -> list[tuple[str, str, str | None]]:
    return [
        (a["provider"], a["outcome"], a.get("reason") or a.get("error_category"))
        for a in body["routing_metadata"]["attempts"]
    ]


def decision_attempts(request_id: str) -> list[tuple[str, str, str]]:
    rows = Attempt.objects.filter(decision__request_id=request_id).order_by("index")
    return [(r.provider, r.outcome, r.error_category or r.reason) for r in rows]


# --- non-stream and stream ----------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_audit_and_chat_non_stream_and_stream(
    token: str, fake_upstream: FakeUpstream, upstream_chain: Callable[..., list[Any]], kind: str
) -> None:
    upstream_chain(("first", kind, {"model": "first-model", "supports_streaming": True}))
    vendor = VENDOR_OF_KIND[kind]
    fake_upstream.script(vendor, Faults.ok(), Faults.ok(), Faults.stream(text="one two three"))
    fake_upstream.script(vendor, Faults.stream(text="four five six"))
    audited, chatted, audit_streamed, chat_streamed = asgi(
        token,
        ("/audit/", AUDIT),
        ("/v1/chat/completions", CHAT),
        ("/audit/", {**AUDIT, "stream": True}),
        ("/v1/chat/completions", {**CHAT, "stream": True}),
    )
    assert audited.status_code == 200, audited.text
    body = audited.json()
    assert body["result"]["provider"] == "first"
    assert body["result"]["output"].startswith("fake answer")
    assert audited.headers["X-Request-ID"] == body["request_id"]

    assert chatted.status_code == 200, chatted.text
    assert chatted.json()["choices"][0]["message"]["content"].startswith("fake answer")
    assert chatted.json()["model"].startswith("first-model")  # as the upstream named it
    assert chatted.headers["X-LLM-Provider"] == "first"

    text, result = audit_stream(audit_streamed)
    assert text == result["result"]["output"] == "one two three"
    assert chat_text(chat_streamed) == "four five six"
    assert len(sse(chat_streamed)) >= 5  # a frame per upstream chunk, the finish, [DONE]

    assert models_asked(fake_upstream, kind) == ["first-model"] * 4
    ids = [body["request_id"], result["request_id"], chat_streamed.headers["X-Request-ID"]]
    assert RoutingDecision.objects.filter(request_id__in=ids, status="ok").count() == 3
    assert RoutingDecision.objects.count() == 4


# --- failover (/v1/chat/completions: tests/test_api_async.py, every kind) ------------------


@pytest.mark.parametrize("kind", KINDS)
def test_audit_fails_over_non_stream_and_stream(
    token: str, fake_upstream: FakeUpstream, upstream_chain: Callable[..., list[Any]], kind: str
) -> None:
    first_and_second(upstream_chain, kind)
    vendor = VENDOR_OF_KIND[kind]
    fake_upstream.script(
        vendor,
        Faults.unavailable(vendor, 503),
        Faults.ok(),
        Faults.unavailable(vendor, 503),
        Faults.stream(text="from the second"),
    )
    plain, streamed = asgi(token, ("/audit/", AUDIT), ("/audit/", {**AUDIT, "stream": True}))
    body = plain.json()
    assert body["result"]["provider"] == "second"
    failed_over = [("first", "error", "unavailable"), ("second", "ok", None)]
    assert audit_attempts(body) == failed_over, body["routing_metadata"]
    assert body["routing_metadata"]["fallback_reason"] == "unavailable"
    text, result = audit_stream(streamed)
    assert text == "from the second" and result["result"]["provider"] == "second"
    assert audit_attempts(result) == failed_over
    assert models_asked(fake_upstream, kind) == ["first-model", "second-model"] * 2
    assert decision_attempts(result["request_id"]) == [
        ("first", "error", "unavailable"),
        ("second", "ok", ""),
    ]


# --- circuit open -------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_an_open_circuit_is_skipped_without_a_request(
    token: str,
    fake_upstream: FakeUpstream,
    upstream_chain: Callable[..., list[Any]],
    clock: FakeClock,
    kind: str,
) -> None:
    first_and_second(upstream_chain, kind)
    breaker.store.force_open("first", "first-model", 60)
    audited, audit_streamed, chatted, streamed = asgi(
        token,
        ("/audit/", AUDIT),
        ("/audit/", {**AUDIT, "stream": True}),
        ("/v1/chat/completions", CHAT),
        ("/v1/chat/completions", {**CHAT, "stream": True}),
    )
    text, result = audit_stream(audit_streamed)
    assert text and result["result"]["provider"] == "second"
    assert result["routing_metadata"]["skipped_providers"] == [
        {"provider": "first", "reason": "circuit_open"}
    ]
    meta = audited.json()["routing_metadata"]
    assert audited.json()["result"]["provider"] == "second"
    assert meta["skipped_providers"] == [{"provider": "first", "reason": "circuit_open"}]
    assert audit_attempts(audited.json()) == [("second", "ok", None)]
    assert chatted.status_code == 200 and chatted.headers["X-LLM-Provider"] == "second"
    assert streamed.headers["X-LLM-Provider"] == "second" and chat_text(streamed)
    assert models_asked(fake_upstream, kind) == ["second-model"] * 4  # never the first
    for response in (audited, audit_streamed, chatted, streamed):
        assert decision_attempts(response.headers["X-Request-ID"]) == [
            ("first", "skipped", "circuit_open"),
            ("second", "ok", ""),
        ]


# --- the request deadline -----------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_the_request_deadline_cuts_a_hung_upstream(
    token: str, fake_upstream: FakeUpstream, upstream_chain: Callable[..., list[Any]], kind: str
) -> None:
    """A hung upstream (no answer; a stream's headers, then nothing) under a 1 s
    request deadline: ``/audit/`` is answered by the mock backstop (non-stream and
    stream), ``/v1/chat/completions`` (no backstop) with 503 before any byte of an
    answer (non-stream and stream); the second candidate is never tried."""
    first_and_second(upstream_chain, kind)
    vendor = VENDOR_OF_KIND[kind]
    hung_stream = Faults.stream(first_chunk_delay=60.0)  # headers, then nothing
    fake_upstream.script(vendor, Faults.hang(), hung_stream, Faults.hang(), hung_stream)
    with override_settings(LLM_ROUTING={"REQUEST_DEADLINE_S": 1.0, "DEFAULT_CHAIN": []}):
        audited, audit_streamed, chatted, streamed = asgi(
            token,
            ("/audit/", AUDIT),
            ("/audit/", {**AUDIT, "stream": True}),
            ("/v1/chat/completions", CHAT),
            ("/v1/chat/completions", {**CHAT, "stream": True}),
        )
    text, result = audit_stream(audit_streamed)
    assert result["result"]["provider"] == "mock" and text == result["result"]["output"]
    assert audit_attempts(result)[0] == ("first", "error", "budget_exhausted")
    body = audited.json()
    assert body["result"]["provider"] == "mock"
    assert audit_attempts(body) == [("first", "error", "budget_exhausted"), ("mock", "ok", None)]
    skipped = body["routing_metadata"]["skipped_providers"]
    assert skipped == [{"provider": "second", "reason": "budget_exhausted"}]
    for response in (audited, audit_streamed, chatted, streamed):
        if response in (chatted, streamed):
            assert response.status_code == 503, response.text
            assert response.json()["error"]["code"] == "no_provider_available"
        assert decision_attempts(response.headers["X-Request-ID"])[:2] == [
            ("first", "error", "budget_exhausted"),
            ("second", "skipped", "budget_exhausted"),
        ]
    assert models_asked(fake_upstream, kind) == ["first-model"] * 4
    assert breaker.store.load("first", "first-model").failures == 0  # the request's deadline


# --- the built-in mock kind (no upstream) -------------------------------------------------


def test_the_mock_kind_non_stream_and_stream(token: str) -> None:
    make_chain("main", [make_provider("m", kind="mock", model="")], is_default=True)
    audited, audit_streamed, chatted, streamed = asgi(
        token,
        ("/audit/", AUDIT),
        ("/audit/", {**AUDIT, "stream": True}),
        ("/v1/chat/completions", {**CHAT, "model": "main"}),
        ("/v1/chat/completions", {**CHAT, "model": "main", "stream": True}),
    )
    body = audited.json()
    assert body["result"]["provider"] == "m" and body["result"]["mode"] == "mock"
    text, result = audit_stream(audit_streamed)
    assert text == result["result"]["output"] == body["result"]["output"]
    assert chatted.status_code == 200, chatted.text
    assert chatted.headers["X-LLM-Provider"] == "m"
    content = chatted.json()["choices"][0]["message"]["content"]
    assert content.startswith("[mock] chat:") and chat_text(streamed) == content
    assert RoutingDecision.objects.count() == 4


# --- a real ASGI server: the client goes away mid-stream ----------------------------------


@pytest.fixture
def asgi_server() -> Iterator[str]:
    """The project's ASGI application under uvicorn (lifespan on, as the shipped
    gunicorn.conf.py's uvicorn workers run it), in a thread of this process (the test's
    environment and settings reach it)."""
    with uvicorn_server(get_asgi_application()) as base:
        yield base


WORDS = "one two three four five six seven eight nine ten eleven twelve"


@pytest.mark.parametrize("url", ["/v1/chat/completions", "/audit/"])
@pytest.mark.parametrize("kind", KINDS)
def test_client_disconnect_mid_stream_closes_the_upstream_request(
    asgi_server: str,
    token: str,
    fake_upstream: FakeUpstream,
    upstream_chain: Callable[..., list[Any]],
    kind: str,
    url: str,
) -> None:
    """Twelve words 0.2 s apart (2.4 s of stream); the client reads two and closes its
    connection. The server must close the upstream request (the fake server's next
    write fails: a disconnect) while it still had words to send, and record the
    decision as ``client_disconnected``."""
    upstream_chain(("first", kind, {"model": "first-model", "supports_streaming": True}))
    fake_upstream.script(VENDOR_OF_KIND[kind], Faults.stream(text=WORDS, interval=0.2))
    body = {**(CHAT if url.startswith("/v1") else AUDIT), "stream": True}
    received: list[str] = []
    with (
        httpx.Client(base_url=asgi_server, timeout=10) as client,
        client.stream(
            "POST",
            url,
            json=body,
            headers={"Authorization": f"Bearer {token}", "Accept": accept(url, body)},
        ) as response,
    ):
        assert response.status_code == 200
        request_id = response.headers["X-Request-ID"]
        for line in response.iter_lines():
            if line.startswith("data: {"):
                data = json.loads(line[len("data: ") :])
                delta = data["choices"][0]["delta"] if "choices" in data else data
                if delta.get("content") or delta.get("text"):
                    received.append(delta.get("content") or delta["text"])
            if len(received) == 2:
                break  # leave mid-stream: the connection is closed with the client
    assert received == ["one", " two"]

    assert wait_for(lambda: fake_upstream.disconnects == 1, 10.0), "upstream left open"
    assert wait_for(lambda: RoutingDecision.objects.filter(request_id=request_id).exists(), 15.0), (
        "no decision row for the abandoned stream"
    )
    attempt = Attempt.objects.get(decision__request_id=request_id)
    assert (attempt.error_category, attempt.partial) == ("client_disconnected", True)
    assert breaker.store.load("first", "first-model").failures == 0


# --- content negotiation of the OpenAI face -----------------------------------------------


def test_chat_stream_accepts_an_sse_accept_header(
    token: str, fake_upstream: FakeUpstream, upstream_chain: Callable[..., list[Any]]
) -> None:
    """SSE clients (EventSource polyfills, curl users) send ``Accept: text/event-stream``
    with a streamed chat completion; the OpenAI API answers them, and so does /audit/."""
    upstream_chain(("first", "openai", {"model": "first-model", "supports_streaming": True}))
    body = {**CHAT, "stream": True}
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    sync = api.post(
        "/v1/chat/completions",
        data=json.dumps(body),
        content_type="application/json",
        HTTP_ACCEPT="text/event-stream",
    )
    # Read and close it as a server would: a stream left to the garbage collector
    # records its decision from whatever code the collector interrupts.
    sync_body = b"".join(sync.streaming_content)
    sync.close()
    assert b'"content"' in sync_body and sync_body.rstrip().endswith(b"data: [DONE]")
    app = get_asgi_application()

    async def post() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
            return await c.post(
                "/v1/chat/completions",
                json=body,
                headers={"Authorization": f"Token {token}", "Accept": "text/event-stream"},
            )

    asynch = asyncio.run(post())
    assert (sync.status_code, asynch.status_code) == (200, 200)
    assert chat_text(asynch).startswith("fake answer")
