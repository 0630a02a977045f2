"""The lean lane (``llm_routing.asgi.lane``, issue 23) answers every ``/v1`` request as
the DRF views answer it through Django's request cycle: the same statuses, bodies,
headers and records.

One matrix: each case runs twice against the same fake upstreams (real HTTP, each
vendor's wire format: tests/fakes/upstream.py) — once through the project's Django ASGI
application (``llm_routing.asgi.get_asgi_application()``), once through the lane around
it — and the two answers are compared after the values that differ by nature (ids,
timestamps) are replaced. The decision rows each request left are compared too. Cases:
every vendor kind non-stream and stream, failover, circuit open and the request
deadline; the mock kind; 400/401/403/404/405/413/415/429 and the budgets' 429;
``GET /v1/models``; and a client that leaves mid-stream (under uvicorn, each path).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from django.test import override_settings
from rest_framework.authtoken.models import Token

from llm_routing.asgi import get_asgi_application, lane
from llm_routing.lane import lane_paths
from llm_routing.models import Attempt, RoutingDecision
from llm_routing.resilience import breaker
from tests.breaker_support import FakeClock
from tests.conftest import VENDOR_OF_KIND, make_chain, make_provider
from tests.fakes.upstream import FakeUpstream, Faults
from tests.support import chat_words, uvicorn_server, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

KINDS = ["openai", "openai_compatible", "anthropic", "gemini"]
MESSAGES = [{"role": "user", "content": "Say hello."}]
CHAT = {"model": "default", "messages": MESSAGES}
URL = "/v1/chat/completions"
#: The headers both paths must send alike (the host's middleware adds others on the
#: Django path only: docs/production.md, "The lean lane").
COMPARED_HEADERS = (
    "content-type",
    "x-llm-provider",
    "x-llm-attempts",
    "www-authenticate",
    "retry-after",
    "allow",
)
SERVED = ("django", "lane")


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_PROVIDER_KEY", "sk-lane-kinds-123456")
    monkeypatch.delenv("DJANGO_ALLOW_ASYNC_UNSAFE", raising=False)


@pytest.fixture
def token(user: Any) -> str:
    return str(Token.objects.create(user=user).key)


def application(served: str) -> Any:
    django_app = get_asgi_application()
    return lane(django_app) if served == "lane" else django_app


Call = tuple[str, str, Any, dict[str, str]]  # method, url, body (dict, bytes or None), headers


def send(served: str, token: str | None, *calls: Call) -> list[httpx.Response]:
    """Each call in turn on one event loop (as one uvicorn worker would)."""
    app = application(served)

    async def go() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
        auth = {"Authorization": f"Token {token}"} if token else {}
        async with httpx.AsyncClient(
            transport=transport, base_url="http://testserver", headers=auth, timeout=30
        ) as client:
            out = []
            for method, url, body, headers in calls:
                content = body if isinstance(body, bytes) else None
                payload = None if isinstance(body, bytes) or body is None else body
                out.append(
                    await client.request(
                        method,
                        url,
                        json=payload,
                        content=content,
                        headers={"Content-Type": "application/json", **headers},
                    )
                )
            return out

    return asyncio.run(go())


_VARYING = re.compile(
    r"(?:chatcmpl-|msg_|resp_|fc_)[0-9a-f]{32}|[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
    r'|"created(?:_at)?": ?\d+'
)


def answer(response: httpx.Response) -> tuple[Any, ...]:
    """What must be the same on both paths: the status, the body (ids and timestamps
    replaced), the compared headers, and the decision rows of the request."""
    body = _VARYING.sub("…", response.text)
    request_id = response.headers.get("x-request-id")
    headers = {h: response.headers.get(h) for h in COMPARED_HEADERS}
    return response.status_code, body, headers, records(request_id)


def records(request_id: str | None) -> list[Any]:
    if not request_id:
        return []
    rows = RoutingDecision.objects.filter(request_id=request_id)
    out: list[Any] = []
    for d in rows:
        attempts = Attempt.objects.filter(decision=d).order_by("index")
        out.append(
            (
                d.status,
                d.selected_provider,
                [
                    (a.provider, a.outcome, a.error_category or a.reason, a.partial)
                    for a in attempts
                ],
            )
        )
    return out


def both(
    token: str | None, script: Callable[[], None], *calls: Call, opened: bool = False
) -> list[tuple[Any, ...]]:
    """The calls answered by each path (``script`` readies the fake upstream before
    each); asserts the two paths answered alike and returns the answers."""
    answers = {}
    for served in SERVED:
        for provider in ("first", "second"):  # each path from the same circuits
            breaker.store.reset(provider, f"{provider}-model")
        if opened:
            breaker.store.force_open("first", "first-model", 60)
        script()
        answers[served] = [answer(r) for r in send(served, token, *calls)]
    assert answers["lane"] == answers["django"]
    return answers["lane"]


def post(body: Any, **headers: str) -> Call:
    return ("POST", URL, body, headers)


def first_and_second(upstream_chain: Callable[..., list[Any]], kind: str) -> None:
    upstream_chain(
        ("first", kind, {"model": "first-model", "supports_streaming": True, "max_retries": 0}),
        ("second", kind, {"model": "second-model", "supports_streaming": True}),
    )


# --- every vendor kind -------------------------------------------------------------------

CASES = ["ok", "failover", "circuit_open", "deadline"]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("kind", KINDS)
def test_the_lane_and_django_answer_alike(
    token: str,
    fake_upstream: FakeUpstream,
    upstream_chain: Callable[..., list[Any]],
    clock: FakeClock,
    kind: str,
    case: str,
) -> None:
    first_and_second(upstream_chain, kind)
    vendor = VENDOR_OF_KIND[kind]
    settings: dict[str, Any] = {}
    if case == "ok":
        faults = [Faults.ok(), Faults.stream(text="one two three")]
    elif case == "failover":
        down = Faults.unavailable(vendor, 503)
        faults = [down, Faults.ok(), down, Faults.stream(text="from the second")]
    elif case == "circuit_open":
        faults = [Faults.ok(), Faults.stream(text="one two three")]
    else:  # a hung upstream under a 1 s deadline: 503 before any byte, both modes
        faults = [Faults.hang(), Faults.stream(first_chunk_delay=60.0)]
        settings = {"REQUEST_DEADLINE_S": 1.0, "DEFAULT_CHAIN": []}
    with override_settings(LLM_ROUTING=settings) if settings else _nothing():
        plain, streamed = both(
            token,
            lambda: fake_upstream.script(vendor, *faults),
            post(CHAT),
            post({**CHAT, "stream": True}),
            opened=case == "circuit_open",
        )
    expected_status = 503 if case == "deadline" else 200
    assert (plain[0], streamed[0]) == (expected_status, expected_status), plain[1]
    served_by = {"ok": "first", "failover": "second", "circuit_open": "second"}.get(case)
    if served_by:
        assert plain[2]["x-llm-provider"] == streamed[2]["x-llm-provider"] == served_by
        assert "[DONE]" in streamed[1]
        assert plain[3][0][:2] == ("ok", served_by)  # one decision row, as recorded
        assert streamed[3][0][:2] == ("ok", served_by)
    else:
        assert json.loads(plain[1])["error"]["code"] == "no_provider_available"
        assert plain[3][0][2][0][:3] == ("first", "error", "budget_exhausted")


def test_the_mock_kind_answers_alike(token: str) -> None:
    make_chain("main", [make_provider("m", kind="mock", model="")], is_default=True)
    body = {**CHAT, "model": "main"}
    plain, streamed = both(token, lambda: None, post(body), post({**body, "stream": True}))
    assert (plain[0], streamed[0]) == (200, 200)
    assert "[mock] chat:" in plain[1] and "[DONE]" in streamed[1]


# --- the other /v1 faces ------------------------------------------------------------------

FACE_CALLS = {
    "messages": (
        "/v1/messages",
        {"model": "default", "max_tokens": 64, "messages": MESSAGES},
        {"anthropic-version": "2023-06-01"},
    ),
    "responses": ("/v1/responses", {"model": "default", "input": "Say hello."}, {}),
    "count_tokens": ("/v1/messages/count_tokens", {"model": "default", "messages": MESSAGES}, {}),
    "embeddings": ("/v1/embeddings", {"model": "default", "input": ["Say", "hello."]}, {}),
}
#: The faces with no stream.
WHOLE_ONLY = ("count_tokens", "embeddings")


@pytest.mark.parametrize("face", sorted(FACE_CALLS))
def test_the_other_faces_answer_alike(
    token: str,
    fake_upstream: FakeUpstream,
    upstream_chain: Callable[..., list[Any]],
    face: str,
) -> None:
    """/v1/messages, /v1/responses, count_tokens and /v1/embeddings ride the lane
    (LANE_ROUTES) and answer as through Django: plain, streamed (where the face
    streams) and a failover."""
    first_and_second(upstream_chain, "openai")
    url, body, headers = FACE_CALLS[face]
    down = Faults.unavailable("openai", 503)
    calls = [("POST", url, body, headers)]
    faults = [down, Faults.ok()]
    if face not in WHOLE_ONLY:
        calls.append(("POST", url, {**body, "stream": True}, headers))
        faults += [down, Faults.stream(text="hi")]
    answers = both(token, lambda: fake_upstream.script("openai", *faults), *calls)
    assert [a[0] for a in answers] == [200] * len(calls), answers[0][1]
    if face != "count_tokens":
        assert all(a[3][0][:2] == ("ok", "second") for a in answers)  # recorded alike
    assert url in lane_paths()  # served on the lane, not passed through to Django


# --- the errors --------------------------------------------------------------------------


@pytest.fixture
def two(
    fake_upstream: FakeUpstream, upstream_chain: Callable[..., list[Any]]
) -> Callable[[], None]:
    from django.contrib.auth.models import Group

    from llm_routing.models import Chain

    first_and_second(upstream_chain, "openai")
    Chain.objects.create(name="premium").allowed_groups.add(Group.objects.create(name="vips"))
    return lambda: fake_upstream.script("openai", Faults.ok())


@pytest.mark.parametrize(
    ("credentials", "call", "status"),
    [
        ("none", post(CHAT), 401),
        ("bad", post(CHAT), 401),
        # a chain for group "vips" only: the same 404 as an absent model (one visibility rule)
        ("good", post({**CHAT, "model": "premium"}), 404),
        ("good", post({**CHAT, "model": "nope"}), 404),
        ("good", post(json.dumps({**CHAT, "pad": "x" * 2_000_000}).encode()), 413),
        ("good", post({"model": "default", "messages": []}), 400),
        ("good", post({**CHAT, "n": 2}), 400),
        ("good", post(b"{not json"), 400),
        ("good", post(CHAT, **{"Content-Type": "text/plain"}), 415),
        ("good", ("GET", URL, None, {}), 405),
        ("good", post(CHAT, Host="evil.example"), 400),  # not in ALLOWED_HOSTS
        ("good", ("GET", "/v1/models", None, {}), 200),
        ("none", ("GET", "/v1/models", None, {}), 401),
    ],
)
def test_errors_and_models_alike(
    token: str, two: Callable[[], None], credentials: str, call: Call, status: int
) -> None:
    used = {"none": None, "bad": "not-a-real-token", "good": token}[credentials]
    (answered,) = both(used, lambda: None, call)
    assert answered[0] == status, answered[1]
    if status != 200:
        assert RoutingDecision.objects.count() == 0


def test_403_of_a_permission_the_caller_lacks_alike(token: str, two: Callable[[], None]) -> None:
    # A host that keeps /v1 to staff (API_PERMISSION_CLASSES): alice, authenticated by
    # her token but not staff, gets the same 403 from both paths, on every face, and
    # nothing is routed.
    admin_only = {"API_PERMISSION_CLASSES": ["rest_framework.permissions.IsAdminUser"]}
    calls = [
        post(CHAT),
        ("GET", "/v1/models", None, {}),
        ("POST", "/v1/embeddings", {"model": "default", "input": "x"}, {}),
    ]
    with override_settings(LLM_ROUTING=admin_only):
        answered = both(token, two, *calls)
    assert [a[0] for a in answered] == [403, 403, 403]
    assert RoutingDecision.objects.count() == 0


def test_429_throttle_alike(token: str, two: Callable[[], None]) -> None:
    with override_settings(LLM_ROUTING={"API_THROTTLE_RATES": {"user": "1/min", "anon": None}}):
        answers = {}
        for served in SERVED:
            two()
            from django.core.cache import cache

            cache.clear()  # the window counters: each path starts from zero
            answers[served] = [
                (
                    r.status_code,
                    re.sub(r"\d+", "N", _VARYING.sub("…", r.text)),
                    bool(r.headers.get("retry-after")),
                )
                for r in send(served, token, post(CHAT), post(CHAT))
            ]
    assert answers["lane"] == answers["django"]
    assert [a[0] for a in answers["lane"]] == [200, 429]


def test_budget_429_alike(
    token: str, two: Callable[[], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    from llm_routing import budgets
    from llm_routing.models import Budget

    monkeypatch.setattr(budgets, "clock", lambda: 1_775_000_000.0)  # fixed: same Retry-After
    Budget.objects.create(name="tok-1", scope="token", subject=token, max_requests=1)
    answers = {}
    try:
        for served in SERVED:
            from django.core.cache import cache

            cache.clear()  # the budget's counters: each path starts from zero
            budgets.reset_cache_state()
            two()
            answers[served] = [answer(r)[:3] for r in send(served, token, post(CHAT), post(CHAT))]
    finally:
        budgets.reset_cache_state()
    assert answers["lane"] == answers["django"]
    assert [a[0] for a in answers["lane"]] == [200, 429]
    assert "tok-1" in answers["lane"][1][1] and token not in answers["lane"][1][1]


# --- what the lane serves and what it leaves to Django ------------------------------------


def test_the_lane_serves_v1_and_leaves_the_rest_to_django(
    token: str, two: Callable[[], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request on the lane never reaches the wrapped application; any other path
    (and an unknown /v1 path) reaches it unchanged; ``lifespan`` is answered."""
    seen: list[str] = []
    inner = get_asgi_application()

    async def spy(scope: dict[str, Any], receive: Any, send_: Any) -> None:
        seen.append(scope.get("path", scope["type"]))
        await inner(scope, receive, send_)

    app = lane(spy)  # type: ignore[arg-type]

    async def go() -> list[int]:
        transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
            headers = {"Authorization": f"Token {token}"}
            two()
            return [
                (await client.post(URL, json=CHAT, headers=headers)).status_code,
                (await client.get("/v1/models", headers=headers)).status_code,
                (await client.get("/health/", headers=headers)).status_code,
                (await client.get("/v1/nothing-here", headers=headers)).status_code,
            ]

    assert asyncio.run(go()) == [200, 200, 200, 404]
    assert seen == ["/health/", "/v1/nothing-here"]


def test_the_request_id_is_the_decisions_on_the_lane(token: str, two: Callable[[], None]) -> None:
    two()
    (response,) = send("lane", token, post(CHAT))
    request_id = response.headers["x-request-id"]
    assert str(RoutingDecision.objects.get().request_id) == request_id
    assert response.headers["content-length"] == str(len(response.content))


def test_registering_a_face(monkeypatch: pytest.MonkeyPatch) -> None:
    """A new /v1 face registers its URL name; a name the URLconf lacks is left to Django."""
    from llm_routing import lane as lane_module

    monkeypatch.setattr(lane_module, "LANE_ROUTES", ["chat-completions"])
    lane_module.register("models")
    lane_module.register("models")
    lane_module.register("no-such-face")
    assert lane_module.LANE_ROUTES == ["chat-completions", "models", "no-such-face"]
    assert sorted(lane_module.lane_paths()) == ["/v1/chat/completions", "/v1/models"]


# --- a real ASGI server: the client goes away mid-stream ----------------------------------


@pytest.fixture(params=SERVED)
def server(request: pytest.FixtureRequest) -> Iterator[str]:
    with uvicorn_server(application(request.param)) as base:
        yield base


WORDS = "one two three four five six seven eight nine ten eleven twelve"


@pytest.mark.parametrize("kind", KINDS)
def test_a_client_leaving_mid_stream_is_recorded_alike(
    server: str,
    token: str,
    fake_upstream: FakeUpstream,
    upstream_chain: Callable[..., list[Any]],
    kind: str,
) -> None:
    """The client reads two words of twelve and leaves: on either path the upstream
    request is closed and the decision says ``client_disconnected`` (partial)."""
    upstream_chain(("first", kind, {"model": "first-model", "supports_streaming": True}))
    fake_upstream.script(VENDOR_OF_KIND[kind], Faults.stream(text=WORDS, interval=0.2))
    with (
        httpx.Client(base_url=server, timeout=10) as client,
        client.stream(
            "POST", URL, json={**CHAT, "stream": True}, headers={"Authorization": f"Bearer {token}"}
        ) as response,
    ):
        assert response.status_code == 200
        request_id = response.headers["X-Request-ID"]
        received = chat_words(response, 2)
    assert received == ["one", " two"]
    assert wait_for(lambda: fake_upstream.disconnects == 1, 10.0), "upstream left open"
    assert wait_for(lambda: bool(records(request_id)), 15.0), "no decision row"
    assert records(request_id)[0][2] == [("first", "error", "client_disconnected", True)]


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def test_a_session_caller_is_django_paths_only(user: Any, two: Callable[[], None]) -> None:
    """What a host gives up on the lane (docs/production.md): no SessionMiddleware runs
    there, so a caller with only a session cookie is a 401 on the lane and served on
    Django's path (CSRF aside: a GET)."""
    from django.test import Client

    browser = Client()
    browser.force_login(user)
    cookie = browser.cookies["sessionid"].value
    statuses = {}
    for served in SERVED:
        app = application(served)

        async def go(app: Any = app) -> int:
            transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
            async with httpx.AsyncClient(
                transport=transport, base_url="http://testserver", cookies={"sessionid": cookie}
            ) as client:
                return (await client.get("/v1/models")).status_code

        statuses[served] = asyncio.run(go())
    assert statuses == {"django": 200, "lane": 401}


def test_the_lane_logs_an_error_answer_as_djangos_handler_does(
    token: str, two: Callable[[], None], fake_upstream: FakeUpstream, monkeypatch: Any
) -> None:
    """A /v1 5xx (every candidate down: 503) is an ERROR line on ``django.request``
    ("Service Unavailable: /v1/chat/completions") on both paths alike: the same logger,
    level, words and status, the path and never the body. (A 4xx is Django's WARNING,
    which the project's LOGGING leaves out on both.)"""
    records: list[logging.LogRecord] = []
    call_handlers = logging.Logger.callHandlers

    def spy(self: logging.Logger, record: logging.LogRecord) -> None:
        # On the class: building the ASGI application reconfigures logging (django.setup).
        if record.name == "django.request":
            records.append(record)
        call_handlers(self, record)

    monkeypatch.setattr(logging.Logger, "callHandlers", spy)
    logged: dict[str, list[tuple[str, str, Any]]] = {}
    for served in SERVED:
        breaker.store.reset("first", "first-model")
        breaker.store.force_open("second", "second-model", 60)
        fake_upstream.script("openai", Faults.unavailable("openai"))  # first: down
        records.clear()
        down, refused = send(served, token, post(CHAT)), send(served, None, post(CHAT))
        assert [down[0].status_code, refused[0].status_code] == [503, 401]
        logged[served] = [
            (r.levelname, r.getMessage(), getattr(r, "status_code", None)) for r in records
        ]
    assert logged["lane"] == logged["django"]
    assert logged["lane"] == [("ERROR", f"Service Unavailable: {URL}", 503)]
