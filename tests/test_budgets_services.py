"""Budgets on the real services (issue 15, item 5): the Lua script on Redis, and the
race — 200 concurrent requests from one token against a cap of 50 on two gunicorn
workers sharing Redis give exactly 50 answers and 150 refusals.

Run with ``python3 dev.py test --services`` (Redis from ``LLMR_TEST_REDIS_URL``,
PostgreSQL from ``LLMR_TEST_DATABASE_URL``)."""

from __future__ import annotations

import asyncio
import contextvars
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.db.models import Sum
from django.test import override_settings
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from llm_routing import budgets
from llm_routing.cache import scripts_loaded
from llm_routing.models import Attempt, Budget, Chain, ChainEntry, Provider, RoutingDecision
from tests.fakes.upstream import FakeUpstream, Faults

from .support import database_url as _database_url
from .support import free_port as _free_port

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parent.parent
REDIS_URL = os.environ.get("LLMR_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
AUDIT = {"task": "summarize", "input_text": "Budget race input."}


@pytest.fixture
def require_services() -> None:
    from django.core.cache import caches
    from django.core.cache.backends.redis import RedisCache

    if connection.vendor != "postgresql" or not isinstance(caches["default"], RedisCache):
        pytest.fail("Run on the services: `python3 dev.py test --services`.")


@pytest.fixture
def prefix(require_services: None) -> Iterator[str]:
    """A cache key prefix of this test only, on the suite's Redis."""
    name = f"llmr-budgets-{uuid.uuid4().hex[:12]}"
    caches = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": name,
        }
    }
    budgets.reset_cache_state()
    with override_settings(CACHES=caches):
        yield name
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    try:
        for key in client.scan_iter(match=f"{name}:*", count=500):
            client.delete(key)
    finally:
        client.close()


@pytest.fixture
def token() -> str:
    user = get_user_model().objects.create_user("racer", password="pw-racer-123")
    return str(Token.objects.create(user=user).key)


def _post(client: APIClient, url: str, body: dict[str, Any]) -> Any:
    return client.post(url, data=json.dumps(body), content_type="application/json")


def test_lua_check_and_settle_on_redis(prefix: str, token: str) -> None:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    budget = Budget.objects.create(
        name="tok", scope="token", subject=token, max_requests=3, max_tokens=1000
    )
    assert [_post(client, "/audit/", AUDIT).status_code for _ in range(3)] == [200] * 3
    refused = _post(client, "/audit/", AUDIT)
    assert refused.status_code == 429 and refused.json()["budget"] == "tok"
    use = budgets.usage([budget])["tok"]
    assert use.requests == 3
    assert use.tokens > 0  # the mock's usage, settled through the Lua INCRBY
    v1 = _post(
        client,
        "/v1/chat/completions",
        {"model": "mock", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert v1.status_code == 429 and v1.json()["error"]["code"] == "budget_exceeded"
    # Counter keys name the budget, never the token key.
    import redis

    keys = [k.decode() for k in redis.Redis.from_url(REDIS_URL).scan_iter(match=f"{prefix}:*")]
    assert all(token not in k for k in keys)
    ours = sorted(k.rsplit(":", 1)[1] for k in keys if ":llmr:budget:tok:day:" in k)
    assert ours == ["cost", "requests", "soft", "tokens"]  # soft: the threshold flag


@pytest.fixture
def gunicorn(prefix: str, tmp_path: Path) -> Iterator[str]:
    """Two gunicorn workers on this test's database and Redis prefix."""
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k in {"PATH", "HOME", "LANG"}}
    env.update(
        DJANGO_SETTINGS_MODULE="tests.settings_services",
        LLMR_TEST_DATABASE_URL=_database_url(),
        LLMR_TEST_REDIS_URL=REDIS_URL,
        LLMR_TEST_CACHE_PREFIX=prefix,
        LLMR_TEST_NO_THROTTLES="1",
        TEST_PROVIDER_KEY="sk-budget-race-0123456789",  # the fake upstream's rows
        GUNICORN_BIND=f"127.0.0.1:{port}",
        WEB_CONCURRENCY="2",
        GUNICORN_THREADS="8",
        GUNICORN_ACCESSLOG="",
        PYTHONUNBUFFERED="1",
    )
    log_path = tmp_path / "web.log"
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "-c", "gunicorn.conf.py"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, log_path.read_text(errors="replace")[-4000:]
            try:
                if httpx.get(base + "/health/", timeout=2).status_code in {401, 403}:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "gunicorn did not answer"
            time.sleep(0.2)
        yield base
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


async def _race(base: str, token: str, n: int) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=base, timeout=120, limits=limits) as client:
        headers = {"Authorization": f"Token {token}"}
        return list(
            await asyncio.gather(
                *(client.post("/audit/", json=AUDIT, headers=headers) for _ in range(n))
            )
        )


def test_200_concurrent_requests_against_a_cap_of_50_on_two_workers(
    gunicorn: str, token: str
) -> None:
    Budget.objects.create(name="race-50", scope="token", subject=token, max_requests=50)
    responses = asyncio.run(_race(gunicorn, token, 200))
    statuses = Counter(r.status_code for r in responses)
    assert statuses == {200: 50, 429: 150}, statuses
    for r in responses:
        if r.status_code == 429:
            assert r.json()["budget"] == "race-50" and int(r.headers["Retry-After"]) >= 1
    assert RoutingDecision.objects.count() == 50  # refused requests never reached the walk
    assert budgets.usage([Budget.objects.get()])["race-50"].requests == 50


def test_the_async_check_counts_in_the_same_counters_on_redis(prefix: str, token: str) -> None:
    """``budgets.acheck`` (the Lua step through redis.asyncio, as the async views call
    it) and ``budgets.check`` (redis-py) count one request each in the same window."""
    budget = Budget.objects.create(name="mixed", scope="token", subject=token, max_requests=4)
    budgets.check(None, token)  # also reads the budget rows (fresh for the next second)
    results = [asyncio.run(budgets.acheck(None, token))]
    # The async Lua path ran, not the thread fallback.
    assert budgets._CHECK_LUA in scripts_loaded("async")
    results += [budgets.check(None, token), asyncio.run(budgets.acheck(None, token))]
    refused = asyncio.run(budgets.acheck(None, token))
    assert results == [None, None, None]
    assert refused is not None and refused.budget == "mixed" and refused.status == 429
    assert budgets.check(None, token) is not None
    assert budgets.usage([budget])["mixed"].requests == 4  # a refusal counts nothing


def test_the_async_throttle_shares_the_sync_window_on_redis(prefix: str) -> None:
    from types import SimpleNamespace

    from llm_routing.api.throttles import AuditUserThrottle

    request = SimpleNamespace(user=SimpleNamespace(is_authenticated=True, pk=uuid.uuid4().hex))
    rates = {"API_THROTTLE_RATES": {"user": "3/min", "anon": None}}
    with override_settings(LLM_ROUTING=rates):
        allowed = []
        for i in range(5):
            throttle = AuditUserThrottle()
            if i % 2:
                allowed.append(asyncio.run(throttle.aallow_request(request, None)))
            else:
                allowed.append(throttle.allow_request(request, None))
            wait = throttle.wait()
            assert wait is not None and 0 < wait <= 60
    assert allowed == [True, True, True, False, False]


# --- a cost cap under concurrency -------------------------------------------------------

#: The price override of the row (USD per million tokens) and what the fake OpenAI
#: upstream reports per answer (11 prompt + 7 completion tokens): $0.025 a request.
PRICE_IN, PRICE_OUT = Decimal("1000"), Decimal("2000")
PER_REQUEST = (11 * PRICE_IN + 7 * PRICE_OUT) / 1_000_000
COST_CAP = 20 * PER_REQUEST  # room for 20 requests
CLIENTS = 60


class _InFlight:
    """How many requests the fake upstream holds at once (the most, over the test)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = self.most = self.answered = 0

    def enter(self) -> None:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)

    def leave(self) -> None:
        with self.lock:
            self.now -= 1
            self.answered += 1


@pytest.fixture
def in_flight(fake_upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch) -> _InFlight:
    from tests.fakes import upstream

    seen = _InFlight()
    real_next, real_send = fake_upstream._next_fault, upstream._Handler._send

    def next_fault(vendor: str) -> Any:
        seen.enter()
        return real_next(vendor)

    def send(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            real_send(self, *args, **kwargs)
        finally:
            seen.leave()

    monkeypatch.setattr(fake_upstream, "_next_fault", next_fault)
    monkeypatch.setattr(upstream._Handler, "_send", send)
    return seen


async def _spend(base: str, token: str) -> list[httpx.Response]:
    """CLIENTS callers at once, each asking until its budget is exhausted (a refusal
    while the requests in flight hold the room is retried after its Retry-After)."""
    limits = httpx.Limits(max_connections=CLIENTS, max_keepalive_connections=0)
    deadline = time.monotonic() + 90
    async with httpx.AsyncClient(base_url=base, timeout=60, limits=limits) as client:

        async def caller() -> list[httpx.Response]:
            seen: list[httpx.Response] = []
            while time.monotonic() < deadline:
                r = await client.post(
                    "/audit/", json=AUDIT, headers={"Authorization": f"Token {token}"}
                )
                seen.append(r)
                if r.status_code != 429 or r.json().get("reset_at") is not None:
                    if r.status_code != 200:
                        return seen  # exhausted (or an error the test reports)
                    continue
                await asyncio.sleep(float(r.headers["Retry-After"]))
            return seen

        return [r for rs in await asyncio.gather(*(caller() for _ in range(CLIENTS))) for r in rs]


def test_a_cost_cap_is_overshot_by_at_most_one_request_on_two_workers(
    gunicorn: str, token: str, fake_upstream: FakeUpstream, in_flight: _InFlight
) -> None:
    """docs/budgets.md: a cost cap is overshot by at most one request's cost (every
    request costs the same here, so never more than the peak). 60 callers at once on
    two workers, each upstream answer taking 0.25 s; the spend is read from the Redis
    counters and from the Attempt rows."""
    row = Provider.objects.create(
        name="paid",
        kind="openai",
        model="gpt-4o-mini",
        base_url=f"{fake_upstream.url}/v1",
        api_key_env="TEST_PROVIDER_KEY",
        input_price_per_mtok=PRICE_IN,
        output_price_per_mtok=PRICE_OUT,
    )
    chain = Chain.objects.create(name="default", is_default=True)
    ChainEntry.objects.create(chain=chain, provider=row, position=0)
    budget = Budget.objects.create(
        name="spend", scope="token", subject=token, max_cost_usd=COST_CAP
    )
    fake_upstream.script("openai", *[Faults.slow(0.25)] * 400)
    time.sleep(1.2)  # the workers' copies of the rows are at most 1 s old

    responses = asyncio.run(_spend(gunicorn, token))
    statuses = Counter(r.status_code for r in responses)
    # Under ASGI an answer is settled by a task on the worker's loop: the last ones may
    # land a moment after their response.
    deadline = time.monotonic() + 10
    while budgets.usage([budget])["spend"].cost_usd != statuses[200] * PER_REQUEST:
        assert time.monotonic() < deadline, budgets.usage([budget])
        time.sleep(0.1)
    assert set(statuses) <= {200, 429}, statuses
    served = statuses[200]
    exhausted = [r for r in responses if r.status_code == 429 and r.json()["reset_at"]]
    held = [r for r in responses if r.status_code == 429 and not r.json()["reset_at"]]
    assert len(exhausted) == CLIENTS  # every caller ended on the exhausted budget
    assert {r.json()["budget"] for r in exhausted + held} == {"spend"}
    assert all(r.headers["Retry-After"] == "1" for r in held)

    spent = budgets.usage([budget])["spend"].cost_usd
    recorded = Attempt.objects.aggregate(total=Sum("cost_usd"))["total"]
    assert spent == recorded == served * PER_REQUEST  # every answer settled, exactly
    assert COST_CAP <= spent <= COST_CAP + PER_REQUEST, (spent, served)
    assert in_flight.answered == served
    # A real race: requests overlapped at the upstream (up to 18 fit under the cap
    # once one request's cost is known), and the first ones were held back.
    assert in_flight.most >= 2, in_flight.most
    assert held, "no caller was held back: nothing raced"


def test_the_async_settlement_releases_and_counts_on_redis(prefix: str, token: str) -> None:
    """On an event loop (the async router) ``request_routed`` settles through
    redis.asyncio in a task: the tokens land, the place in flight is given back."""
    from llm_routing.router import route
    from llm_routing.signals import asend, request_routed
    from llm_routing.types import AuditRequest

    request = AuditRequest(task="t", input_text="x", provider="mock")
    routed = route(request, persist=False)
    tokens = routed.result.usage.input_tokens + routed.result.usage.output_tokens
    assert tokens > 0
    budget = Budget.objects.create(name="aset", scope="token", subject=token, max_tokens=10**6)
    assert budgets.check(None, token) is None  # this request holds a place
    other = contextvars.Context().run(budgets.check, None, token)  # another request
    assert other is not None and other.code == "budget_in_flight"  # the peak is unknown

    async def finish() -> None:  # as the async router's exit announces it
        await asend(request_routed, request_id=routed.request_id, request=request, routed=routed)

    asyncio.run(finish())
    assert budgets._SETTLE_LUA in scripts_loaded("async")  # the redis.asyncio path ran
    assert budgets.usage([budget])["aset"].tokens == tokens
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    assert not list(client.scan_iter(match=f"{prefix}:*aset*inflight"))  # released
    assert contextvars.Context().run(budgets.check, None, token) is None


def test_the_budget_rows_read_off_the_loop_leave_no_connection_open(
    require_services: None,
) -> None:
    """On the event loop, a due re-read of the budget rows (every ``ROWS_TTL_S``) runs
    ``check`` in a worker thread of the loop's executor. That thread's connection was
    left open: a PostgreSQL session (with the pool option, a pool slot) held by a thread
    that outlives the request, until it was collected. Now it is closed as at the end of
    a request (found by tests/test_issue22_ledger.py's async ledger on PostgreSQL)."""
    from django.db.backends.signals import connection_created

    Budget.objects.create(name="rows", scope="global", max_requests=10**6)
    opened: list[Any] = []

    def created(sender: Any, connection: Any, **kwargs: Any) -> None:
        if threading.current_thread() is not threading.main_thread():
            opened.append(connection)

    budgets.reset_cache_state()  # the rows are due for a re-read
    connection_created.connect(created, dispatch_uid="test_rows_off_the_loop")
    try:
        assert asyncio.run(budgets.acheck(None)) is None
    finally:
        connection_created.disconnect(dispatch_uid="test_rows_off_the_loop")
        budgets.forget()
    assert opened, "the rows were read in a worker thread"
    assert all(wrapper.connection is None for wrapper in opened)


def test_the_lua_check_returns_the_room_on_redis(prefix: str) -> None:
    """The room a grant carries (for hedging) from the Lua step, on both clients."""
    Budget.objects.create(name="room-t", scope="global", max_tokens=1000)
    Budget.objects.create(name="room-c", scope="global", max_cost_usd=Decimal("0.00001"))
    Budget.objects.create(name="room-r", scope="global", max_requests=100)

    def sync() -> budgets.Grant | None:
        assert budgets.check(None) is None
        return budgets._current.get()

    async def aio() -> budgets.Grant | None:
        assert await budgets.acheck(None) is None
        return budgets._current.get()

    first = contextvars.Context().run(sync)
    assert first is not None and first.room == budgets.Room(tokens=1000, nano_usd=10_000)

    def settle() -> None:
        budgets._current.set(first)
        budgets.settle(100, Decimal("0.000002"))  # peaks: 100 tokens, 2000 nano-USD

    contextvars.Context().run(settle)
    second = contextvars.Context().run(sync)
    assert second is not None and second.room == budgets.Room(tokens=900, nano_usd=8000)
    third = contextvars.Context().run(asyncio.run, aio())
    assert budgets._CHECK_LUA in scripts_loaded("async")
    assert third is not None and third.room == budgets.Room(tokens=800, nano_usd=6000)
    assert budgets.usage([Budget.objects.get(name="room-r")])["room-r"].requests == 3
