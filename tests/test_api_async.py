"""The async faces of ``/audit/``, ``/v1/chat/completions`` and ``/health/`` (served
under ASGI): Django's ``AsyncClient`` drives the ASGI handler in process, a real uvicorn
server the client-disconnect case. Every error is compared with what the sync face
(WSGI, DRF's ``APIClient``) answers to the same request: the same status, body and
headers."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import httpx
import pytest
from asgiref.sync import async_to_sync, iscoroutinefunction
from django.core.asgi import get_asgi_application
from django.test import AsyncClient, override_settings
from django.urls import resolve
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from llm_routing.errors import NetworkError
from llm_routing.models import RoutingDecision

from . import support
from .conftest import VENDOR_OF_KIND, make_chain, make_provider
from .fakes.upstream import FakeUpstream, Faults

# The async face reads and writes through worker threads (their own connections): the
# rows a test makes must be committed to be seen.
pytestmark = pytest.mark.django_db(transaction=True)

GOOD = {"task": "summarize", "input_text": "Django is a web framework."}
MESSAGES = [{"role": "user", "content": "Say hello."}]
T = TypeVar("T")


def run(make: Callable[[], Awaitable[T]]) -> T:
    """Run one coroutine on a fresh event loop (as the ASGI server would)."""

    async def call() -> T:
        return await make()

    return async_to_sync(call)()


@pytest.fixture
def token(user: Any) -> str:
    return Token.objects.create(user=user).key


class TokenAsyncClient(AsyncClient):
    """An AsyncClient sending ``Authorization: Token …`` with every request."""

    def __init__(self, token: str) -> None:
        super().__init__()
        self.auth = {"authorization": f"Token {token}"}

    def generic(self, *args: Any, headers: dict[str, str] | None = None, **kwargs: Any) -> Any:
        return super().generic(*args, headers={**self.auth, **(headers or {})}, **kwargs)


@pytest.fixture
def aclient(token: str) -> AsyncClient:
    return TokenAsyncClient(token)


@pytest.fixture
def chain(scripted: Any, key_env: str) -> Any:
    a = make_provider("a", supports_streaming=True, max_retries=0)
    b = make_provider("b", supports_streaming=True, model="b-served-model")
    make_chain("main", [a, b], is_default=True)
    return scripted


def apost(client: AsyncClient, url: str, body: object, **headers: str) -> Any:
    return run(
        lambda: client.post(
            url, data=json.dumps(body), content_type="application/json", headers=headers
        )
    )


def apost_stream(
    client: AsyncClient, url: str, body: object, **headers: str
) -> tuple[Any, list[bytes]]:
    """The response and its body, one item per chunk the view sent, read on the loop
    that made the request (a loop that ends closes the async generators it started)."""

    async def call() -> tuple[Any, list[bytes]]:
        response = await client.post(
            url, data=json.dumps(body), content_type="application/json", headers=headers
        )
        if not response.streaming:
            return response, []
        assert response.is_async  # an async iterator: each frame is sent as it comes
        return response, [bytes(part) async for part in response.streaming_content]

    return async_to_sync(call)()


# --- which face serves ----------------------------------------------------------------


@pytest.mark.parametrize("url", ["/audit/", "/v1/chat/completions", "/health/"])
def test_the_view_is_a_coroutine_function_on_the_event_loop_only(url: str) -> None:
    view = resolve(url).func
    assert not iscoroutinefunction(view)  # WSGI (no running loop): the sync face

    async def on_loop() -> bool:
        return iscoroutinefunction(view)

    assert run(on_loop) is True  # ASGI: Django awaits the async face, no thread hop


def test_views_without_an_async_face_stay_plain_functions() -> None:
    assert not hasattr(resolve("/v1/models").func, "async_view")


# --- /audit/ ----------------------------------------------------------------------------


def test_audit_non_stream_answers_the_same_envelope(aclient: AsyncClient, chain: Any) -> None:
    response = apost(aclient, "/audit/", GOOD)
    assert response.status_code == 200
    assert not hasattr(response, "data")  # rendered by the async face, not a DRF Response
    body = response.json()
    assert set(body) == {"request_id", "result", "routing_metadata", "diagnostics"}
    assert body["result"]["provider"] == "a" and body["result"]["output"] == "answer from a"
    assert response["X-Request-ID"] == body["request_id"]
    assert RoutingDecision.objects.filter(request_id=body["request_id"]).exists()


def test_audit_fails_over_on_the_async_face(aclient: AsyncClient, chain: Any) -> None:
    chain.scripts["a"] = [NetworkError("connection refused")]
    body = apost(aclient, "/audit/", GOOD).json()
    meta = body["routing_metadata"]
    assert body["result"]["provider"] == "b"
    assert meta["attempted_providers"] == ["a", "b"]
    assert meta["fallback_used"] is True and meta["fallback_reason"] == "network"
    decision = RoutingDecision.objects.get(request_id=body["request_id"])
    assert [a.provider for a in decision.attempts.order_by("index")] == ["a", "b"]


def test_audit_stream_sends_each_event_as_its_own_chunk(aclient: AsyncClient, chain: Any) -> None:
    chain.streams["a"] = [["Hello", " there", " friend", "END"]]
    response, frames = apost_stream(
        aclient, "/audit/", {**GOOD, "stream": True}, accept="text/event-stream"
    )
    assert response.status_code == 200
    assert response["Content-Type"] == "text/event-stream"
    assert response["Cache-Control"] == "no-cache"
    assert [f.split(b"\n", 1)[0] for f in frames] == [
        b"event: chunk",
        b"event: chunk",
        b"event: chunk",
        b"event: result",
    ]
    texts = [json.loads(f.split(b"data: ", 1)[1])["text"] for f in frames[:3]]
    assert texts == ["Hello", " there", " friend"]
    result = json.loads(frames[-1].split(b"data: ", 1)[1])
    assert result["result"]["output"] == "Hello there friend"
    assert RoutingDecision.objects.filter(request_id=result["request_id"]).exists()


# --- /v1/chat/completions ---------------------------------------------------------------


def test_chat_completion_non_stream(aclient: AsyncClient, chain: Any) -> None:
    response = apost(aclient, "/v1/chat/completions", {"model": "main", "messages": MESSAGES})
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "chat.completion" and body["model"] == "a-model"
    assert body["choices"][0]["message"]["content"] == "answer from a"
    assert response["X-LLM-Provider"] == "a" and response["X-LLM-Attempts"] == "1"
    decision = RoutingDecision.objects.get()
    assert body["id"] == "chatcmpl-" + str(decision.request_id).replace("-", "")


def test_chat_completion_stream_chunks_and_failover(aclient: AsyncClient, chain: Any) -> None:
    chain.streams["a"] = [[NetworkError("refused before the first chunk")]]
    chain.streams["b"] = [["Hi", " you", "END"]]
    body = {"model": "main", "messages": MESSAGES, "stream": True}
    response, frames = apost_stream(aclient, "/v1/chat/completions", body)
    assert response.status_code == 200
    assert response["X-LLM-Provider"] == "b"
    assert frames[-1] == b"data: [DONE]\n\n"
    chunks = [json.loads(f[len(b"data: ") :]) for f in frames[:-1]]
    assert [c["choices"][0]["delta"].get("content") for c in chunks] == ["Hi", " you", None]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert {c["model"] for c in chunks} == {"b-served-model"}
    decision = RoutingDecision.objects.get(request_id=response["X-Request-ID"])
    assert decision.selected_provider == "b"


def test_chat_completion_stream_exhausted_chain_is_a_503_before_any_byte(
    aclient: AsyncClient, scripted: Any, key_env: str
) -> None:
    a = make_provider("a", supports_streaming=True, max_retries=0)
    make_chain("main", [a], is_default=True)
    scripted.streams["a"] = [[NetworkError("refused")]]
    body = {"model": "main", "messages": MESSAGES, "stream": True}
    response = apost(aclient, "/v1/chat/completions", body)
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "no_provider_available"
    assert RoutingDecision.objects.count() == 1


# --- errors: the same status, body and headers as the sync face -------------------------

COMPARED_HEADERS = ("Content-Type", "WWW-Authenticate", "Allow", "Vary", "Retry-After")


def both_faces(
    method: str, url: str, body: object = None, *, token: str | None, **headers: str
) -> tuple[Any, Any]:
    sync = APIClient()
    aclient = AsyncClient()
    if token is not None:
        sync.credentials(HTTP_AUTHORIZATION=token)
        headers["authorization"] = token
    data = json.dumps(body) if body is not None else None
    kwargs: dict[str, Any] = {"content_type": headers.pop("content_type", "application/json")}
    if method == "get":
        kwargs = {}
    sync_response = getattr(sync, method)(
        url, data=data, **kwargs, **{f"HTTP_{k.upper()}": v for k, v in headers.items()}
    )
    async_response = run(
        lambda: getattr(aclient, method)(url, data=data, headers=headers, **kwargs)
    )
    return sync_response, async_response


def assert_same(sync: Any, asynch: Any, *, status: int) -> None:
    assert (sync.status_code, asynch.status_code) == (status, status)
    assert json.loads(sync.content) == json.loads(asynch.content)
    for name in COMPARED_HEADERS:
        assert sync.get(name) == asynch.get(name), name


@pytest.mark.parametrize(
    ("url", "body", "param"),
    [
        ("/audit/", {"task": "summarize"}, "input_text"),
        ("/audit/", {**GOOD, "temperature": "hot"}, "temperature"),
        ("/v1/chat/completions", {"model": "main", "messages": []}, "messages"),
        ("/v1/chat/completions", {"model": "main", "messages": MESSAGES, "n": 2}, "n"),
        ("/v1/chat/completions", {"model": "main", "messages": MESSAGES, "foo": 1}, "foo"),
    ],
)
def test_400_is_the_same_on_both_faces(
    token: str, chain: Any, url: str, body: dict[str, Any], param: str
) -> None:
    sync, asynch = both_faces("post", url, body, token=f"Token {token}")
    assert_same(sync, asynch, status=400)
    assert param in asynch.content.decode()
    assert RoutingDecision.objects.count() == 0


@pytest.mark.parametrize("url", ["/audit/", "/v1/chat/completions", "/health/"])
@pytest.mark.parametrize("token", [None, "Token not-a-real-token", "Bearer nope"])
def test_401_is_the_same_on_both_faces(url: str, token: str | None) -> None:
    method = "get" if url == "/health/" else "post"
    sync, asynch = both_faces(method, url, GOOD if method == "post" else None, token=token)
    assert_same(sync, asynch, status=401)
    assert asynch["WWW-Authenticate"]


def test_unknown_model_404_and_unsupported_media_type_415(token: str, chain: Any) -> None:
    body = {"model": "nope", "messages": MESSAGES}
    assert_same(
        *both_faces("post", "/v1/chat/completions", body, token=f"Token {token}"), status=404
    )
    assert_same(
        *both_faces("post", "/audit/", GOOD, token=f"Token {token}", content_type="text/plain"),
        status=415,
    )


def test_a_method_without_an_async_face_is_the_sync_answer(token: str) -> None:
    sync, asynch = both_faces("get", "/audit/", token=f"Token {token}")
    assert_same(sync, asynch, status=405)
    assert asynch["Allow"] == "POST, OPTIONS"


def test_access_refusal_403_is_the_same_on_both_faces(token: str, chain: Any) -> None:
    # force_provider needs the llm_routing.force_provider permission (docs/operations.md).
    body = {**GOOD, "force_provider": "a"}
    sync, asynch = both_faces("post", "/audit/", body, token=f"Token {token}")
    assert_same(sync, asynch, status=403)
    assert "force_provider" in asynch.json()["detail"]


def test_session_auth_enforces_csrf_on_the_async_face(user: Any, chain: Any) -> None:
    sync = APIClient(enforce_csrf_checks=True)
    sync.force_login(user)
    aclient = AsyncClient(enforce_csrf_checks=True)
    aclient.force_login(user)
    data = json.dumps(GOOD)

    def apost_session(**headers: str) -> Any:
        return run(
            lambda: aclient.post(
                "/audit/", data=data, content_type="application/json", headers=headers
            )
        )

    refused = apost_session()
    assert_same(
        sync.post("/audit/", data=data, content_type="application/json"), refused, status=403
    )
    assert "CSRF" in refused.json()["detail"]
    sync.get("/admin/login/")  # sets the csrftoken cookie
    csrf = sync.cookies["csrftoken"].value
    aclient.cookies["csrftoken"] = csrf
    assert apost_session(**{"X-CSRFToken": csrf}).status_code == 200


def _digits(response: Any) -> str:
    return re.sub(rb"\d+", b"N", response.content).decode()


@pytest.mark.parametrize(
    ("url", "body"),
    [("/audit/", GOOD), ("/v1/chat/completions", {"model": "main", "messages": MESSAGES})],
)
def test_429_is_the_same_on_both_faces(token: str, chain: Any, url: str, body: Any) -> None:
    with override_settings(LLM_ROUTING={"API_THROTTLE_RATES": {"user": "2/min", "anon": None}}):
        sync_ok, async_ok = both_faces("post", url, body, token=f"Token {token}")
        assert (sync_ok.status_code, async_ok.status_code) == (200, 200)
        sync, asynch = both_faces("post", url, body, token=f"Token {token}")
    assert (sync.status_code, asynch.status_code) == (429, 429)
    assert _digits(sync) == _digits(asynch)  # "Expected available in N seconds."
    assert asynch["Retry-After"].isdigit() and 0 < int(asynch["Retry-After"]) <= 60
    assert sync["Content-Type"] == asynch["Content-Type"]


# --- /health/ ---------------------------------------------------------------------------


def test_health_is_the_same_on_both_faces(
    token: str, user: Any, scripted: Any, key_env: str
) -> None:
    make_provider("a", kind="scripted")
    make_provider("b", kind="mock", api_key_env="")
    sync, asynch = both_faces("get", "/health/", token=f"Token {token}")
    assert_same(sync, asynch, status=200)  # a caller's summary
    assert asynch.json() == {"status": "ok", "cache": "ok"}
    user.is_staff = True
    user.save()  # the operator's view: every provider
    sync, asynch = both_faces("get", "/health/", token=f"Token {token}")
    assert_same(sync, asynch, status=200)
    body = asynch.json()
    assert [p["name"] for p in body["providers"]] == ["a", "b"]
    assert key_env not in asynch.content.decode()


# --- a real ASGI server: the client goes away mid-stream --------------------------------


@pytest.fixture
def uvicorn_server() -> Iterator[str]:
    """The project's ASGI application under uvicorn, in a thread of this process."""
    with support.uvicorn_server(get_asgi_application(), lifespan="off") as base:
        yield base


def test_client_disconnect_mid_stream_is_recorded(
    uvicorn_server: str,
    token: str,
    fake_upstream: FakeUpstream,
    upstream_chain: Callable[..., list[Any]],
    key_env: str,
) -> None:
    upstream_chain(("oc", "openai_compatible", {"supports_streaming": True}))
    text = "one two three four five six seven eight nine ten eleven twelve"
    fake_upstream.script("openai", Faults.stream(text=text, interval=0.2))
    body = {"model": "default", "messages": MESSAGES, "stream": True}
    received: list[str] = []
    with (
        httpx.Client(base_url=uvicorn_server, timeout=10) as client,
        client.stream(
            "POST",
            "/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {token}"},
        ) as response,
    ):
        assert response.status_code == 200
        request_id = response.headers["X-Request-ID"]
        for line in response.iter_lines():
            if line.startswith("data: {"):
                received.append(json.loads(line[6:])["choices"][0]["delta"].get("content", ""))
            if len(received) == 2:
                break  # leave mid-stream: the connection is closed with the client

    deadline = time.monotonic() + 15
    while not RoutingDecision.objects.filter(request_id=request_id).exists():
        assert time.monotonic() < deadline, "no decision row for the abandoned stream"
        time.sleep(0.1)
    attempt = RoutingDecision.objects.get(request_id=request_id).attempts.get()
    assert attempt.error_category == "client_disconnected"
    assert attempt.partial is True
    assert "".join(received).startswith("one two")


def test_the_live_server_of_the_services_suite_is_asgi(live_server: Any) -> None:
    # Embedded suite: pytest-django's WSGI server; services suite (tests/services_plugin.py):
    # uvicorn serving project.asgi, so the live-server tests run through the async views.
    import os

    response = httpx.get(f"{live_server.url}/health/", timeout=10)
    assert response.status_code == 401
    services = os.environ["DJANGO_SETTINGS_MODULE"] == "tests.settings_services"
    assert (response.headers.get("server") == "uvicorn") is services


# --- every vendor kind, over real HTTP to the fake upstream -----------------------------

KINDS = ["openai", "openai_compatible", "anthropic", "gemini"]


@pytest.mark.parametrize("kind", KINDS)
def test_every_vendor_kind_non_stream_and_stream_with_failover(
    aclient: AsyncClient,
    fake_upstream: FakeUpstream,
    upstream_chain: Callable[..., list[Any]],
    key_env: str,
    kind: str,
) -> None:
    # A first candidate of the same vendor fails with 503 (no retry), the second answers.
    upstream_chain(
        ("first", kind, {"supports_streaming": True, "max_retries": 0}),
        ("second", kind, {"supports_streaming": True, "model": "served-model"}),
    )
    vendor = VENDOR_OF_KIND[kind]
    fake_upstream.script(vendor, Faults.unavailable(vendor, 503))
    response = apost(aclient, "/v1/chat/completions", {"model": "default", "messages": MESSAGES})
    assert response.status_code == 200, response.content
    assert response["X-LLM-Provider"] == "second"
    assert response.json()["model"].startswith("served-model")  # as the upstream named it

    fake_upstream.script(vendor, Faults.unavailable(vendor, 503))
    fake_upstream.script(vendor, Faults.stream(text="one two three"))
    body = {"model": "default", "messages": MESSAGES, "stream": True}
    response, frames = apost_stream(aclient, "/v1/chat/completions", body)
    assert response.status_code == 200 and response["X-LLM-Provider"] == "second"
    chunks = [json.loads(f[len(b"data: ") :]) for f in frames[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert text == "one two three" and frames[-1] == b"data: [DONE]\n\n"
    assert len(frames) >= 4  # one frame per upstream chunk, then finish and [DONE]
    assert len(fake_upstream.requests_for(vendor)) == 4
    decisions = RoutingDecision.objects.order_by("created_at")
    assert [d.selected_provider for d in decisions] == ["second", "second"]


# --- budgets (the hook in authorize, run in the admit hop) ------------------------------


@pytest.mark.parametrize(
    ("url", "body"),
    [("/audit/", GOOD), ("/v1/chat/completions", {"model": "main", "messages": MESSAGES})],
)
def test_budget_counts_both_faces_and_refuses_the_same(
    token: str, chain: Any, monkeypatch: pytest.MonkeyPatch, url: str, body: Any
) -> None:
    from llm_routing import budgets
    from llm_routing.models import Budget

    monkeypatch.setattr(budgets, "clock", lambda: 1_775_000_000.0)  # fixed: same Retry-After
    budgets.reset_cache_state()
    Budget.objects.create(name="tok-2", scope="token", subject=token, max_requests=2)
    try:
        served = both_faces("post", url, body, token=f"Token {token}")  # one request each
        assert [r.status_code for r in served] == [200, 200]
        sync, asynch = both_faces("post", url, body, token=f"Token {token}")
        assert_same(sync, asynch, status=429)
        assert "tok-2" in asynch.content.decode() and token not in asynch.content.decode()
    finally:
        budgets.reset_cache_state()


# --- where the admit step runs ----------------------------------------------------------


def _spy_admit(monkeypatch: pytest.MonkeyPatch, view: type) -> list[bool]:
    """Wrap ``view.admit`` (still called through): True per call made on an event loop."""
    import asyncio

    on_loop: list[bool] = []
    original = view.admit

    def admit(self: Any, request: Any) -> Any:
        try:
            asyncio.get_running_loop()
            on_loop.append(True)
        except RuntimeError:
            on_loop.append(False)
        return original(self, request)

    monkeypatch.setattr(view, "admit", admit)
    return on_loop


@pytest.mark.parametrize(
    ("url", "body"),
    [("/audit/", GOOD), ("/v1/chat/completions", {"model": "main", "messages": MESSAGES})],
)
def test_a_cached_token_is_admitted_on_the_event_loop(
    token: str, chain: Any, url: str, body: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from llm_routing.api.authentication import clear_token_cache
    from llm_routing.api.openai_compat import ChatCompletionsView
    from llm_routing.api.views import AuditView

    view = AuditView if url == "/audit/" else ChatCompletionsView
    on_loop = _spy_admit(monkeypatch, view)
    clear_token_cache()
    client = TokenAsyncClient(token)
    # First: the token is read from the database, so the step runs in a worker thread;
    # then it is cached, and the same step runs on the loop with the same answer.
    first, second, third = (apost(client, url, body) for _ in range(3))
    assert [r.status_code for r in (first, second, third)] == [200, 200, 200]
    assert on_loop == [False, True, True]
    assert RoutingDecision.objects.count() == 3


def test_an_unknown_token_and_other_authenticators_take_the_worker_thread(
    token: str, chain: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from llm_routing.api.openai_compat import ChatCompletionsView

    on_loop = _spy_admit(monkeypatch, ChatCompletionsView)
    body = {"model": "main", "messages": MESSAGES}
    assert apost(TokenAsyncClient(token), "/v1/chat/completions", body).status_code == 200
    assert apost(TokenAsyncClient("x" * 40), "/v1/chat/completions", body).status_code == 401
    assert apost(TokenAsyncClient(token), "/v1/chat/completions", body).status_code == 200
    session_first = {
        "API_AUTHENTICATION_CLASSES": [
            "rest_framework.authentication.SessionAuthentication",
            "llm_routing.api.authentication.TokenAuthentication",
        ]
    }
    with override_settings(LLM_ROUTING=session_first):
        # A cached token, but the session is asked first (it reads the session): a thread.
        assert apost(TokenAsyncClient(token), "/v1/chat/completions", body).status_code == 200
    assert on_loop == [False, True, False]  # the 401 never reached admit


def test_a_principal_is_computed_once_per_cached_user(
    token: str, chain: Any, user: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django.contrib.auth.models import Group

    from llm_routing import access

    group = Group.objects.create(name="routers")
    user.groups.add(group)
    computed: list[int] = []
    original = access._principal_of
    monkeypatch.setattr(access, "_principal_of", lambda u: computed.append(1) or original(u))
    client = TokenAsyncClient(token)
    body = {"model": "main", "messages": MESSAGES}
    for _ in range(3):
        assert apost(client, "/v1/chat/completions", body).status_code == 200
    assert computed == [1]
    decision = RoutingDecision.objects.order_by("created_at").last()
    assert decision is not None and decision.user_pk == str(user.pk)


def test_an_unknown_chain_is_a_404_on_the_async_face_too(aclient: AsyncClient, chain: Any) -> None:
    """The chain check reads the config snapshot during admit, on the event loop."""
    body = {"task": "t", "input_text": "hi", "chain": "nonexistent"}
    response = apost(aclient, "/audit/", body)
    assert response.status_code == 404
    assert "'nonexistent'" in response.json()["detail"]
    served = apost(aclient, "/audit/", {**body, "chain": "main"})
    assert served.status_code == 200
    assert served.json()["routing_metadata"]["chain_name"] == "main"
