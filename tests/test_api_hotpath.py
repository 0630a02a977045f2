"""The API's hot path (issue 14, item 3): a request after warm-up reads nothing from the
database but writes its records; the token lookup is cached briefly; throttles are a
fixed-window counter. Also run on PostgreSQL + Redis by the services suite."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from llm_routing.api import authentication
from llm_routing.cache import raw_redis, routing_cache

from .breaker_support import FakeClock
from .conftest import make_chain, make_provider

pytestmark = pytest.mark.django_db

GOOD = {"task": "summarize", "input_text": "hello there"}


def post(client: APIClient, body: dict[str, Any] = GOOD) -> Any:
    return client.post("/audit/", data=json.dumps(body), content_type="application/json")


def reads(queries: CaptureQueriesContext) -> list[str]:
    """Every statement except the writes of the request's own records."""
    return [
        q["sql"]
        for q in queries.captured_queries
        if not q["sql"].lstrip().upper().startswith(("INSERT", "SAVEPOINT", "RELEASE"))
    ]


@pytest.fixture
def token(user: Any) -> Token:
    return Token.objects.create(user=user)


def client_for(token: Token, keyword: str = "Token") -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"{keyword} {token.key}")
    return client


@pytest.fixture
def auth_clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock(500.0)
    monkeypatch.setattr(authentication, "_clock", fake)
    return fake


# --- no reads per request ----------------------------------------------------------------


def test_audit_after_warm_up_reads_no_row(token: Token, scripted: Any, key_env: str) -> None:
    a, b = make_provider("a"), make_provider("b")
    make_chain("main", [a, b], is_default=True)
    client = client_for(token)
    assert post(client).status_code == 200  # warm-up: snapshot, token, principal
    with CaptureQueriesContext(connection) as queries:
        response = post(client)
        bearer = post(client_for(token, "Bearer"))
    assert response.status_code == 200 and bearer.status_code == 200
    assert response.json()["result"]["provider"] == "a"
    assert reads(queries) == []


# --- token lookup cached briefly ---------------------------------------------------------


def test_token_lookup_is_cached_for_the_ttl(token: Token, auth_clock: FakeClock) -> None:
    client = client_for(token)
    assert client.get("/health/").status_code == 200
    # Revoked behind this process's back (another worker, raw SQL): no signal here.
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM authtoken_token WHERE key = %s", [token.key])
    auth_clock.advance(authentication.TOKEN_CACHE_TTL_S - 0.1)
    assert client.get("/health/").status_code == 200  # still trusted: the documented bound
    auth_clock.advance(0.1)
    assert client.get("/health/").status_code == 401


def test_token_delete_in_this_process_is_seen_at_once(token: Token, auth_clock: Any) -> None:
    client = client_for(token, "Bearer")
    assert client.get("/health/").status_code == 200
    token.delete()
    assert client.get("/health/").status_code == 401


def test_user_deactivated_in_this_process_is_seen_at_once(
    token: Token, user: Any, auth_clock: Any
) -> None:
    client = client_for(token)
    assert client.get("/health/").status_code == 200
    user.is_active = False
    user.save()
    assert client.get("/health/").status_code == 401


def test_permission_granted_is_seen_at_once(token: Token, user: Any, scripted: Any) -> None:
    from django.contrib.auth.models import Permission

    make_provider("a", kind="mock", api_key_env="")
    client = client_for(token)
    forced = {**GOOD, "force_provider": "a"}
    assert post(client, forced).status_code == 403
    user.user_permissions.add(
        Permission.objects.get(codename="force_provider"),
        Permission.objects.get(codename="route_any_provider"),
    )
    assert post(client, forced).status_code == 200


# --- throttles: a fixed-window counter ---------------------------------------------------


def test_exactly_n_allowed_then_429_with_retry_after(token: Token) -> None:
    client = client_for(token)
    with override_settings(LLM_ROUTING={"API_THROTTLE_RATES": {"user": "3/min", "anon": None}}):
        statuses = [client.get("/health/").status_code for _ in range(3)]
        refused = client.get("/health/")
    assert statuses == [200, 200, 200]
    assert refused.status_code == 429
    assert 1 <= int(refused["Retry-After"]) <= 60


def test_counters_are_shared_by_clients_and_kept_as_one_number(token: Token, user: Any) -> None:
    first, second = client_for(token), client_for(token, "Bearer")
    with override_settings(LLM_ROUTING={"API_THROTTLE_RATES": {"user": "4/min", "anon": None}}):
        assert [first.get("/health/").status_code for _ in range(2)] == [200, 200]
        assert [second.get("/health/").status_code for _ in range(2)] == [200, 200]
        assert first.get("/health/").status_code == 429
        assert second.get("/health/").status_code == 429
        # Constant cost: one integer per caller and window, however many requests.
        assert routing_cache().get(f"llmr-throttle:llm_routing_user:u{user.pk}") == 6


def test_users_are_counted_apart(token: Token, django_user_model: Any) -> None:
    other = django_user_model.objects.create_user(username="zed", password="pw-zed-12345")
    with override_settings(LLM_ROUTING={"API_THROTTLE_RATES": {"user": "1/min", "anon": None}}):
        assert client_for(token).get("/health/").status_code == 200
        assert client_for(token).get("/health/").status_code == 429
        assert client_for(Token.objects.create(user=other)).get("/health/").status_code == 200


def test_anonymous_callers_are_counted_per_address(anon: APIClient) -> None:
    settings = {
        "API_PERMISSION_CLASSES": ["rest_framework.permissions.AllowAny"],
        "API_THROTTLE_RATES": {"user": None, "anon": "2/min"},
    }
    with override_settings(LLM_ROUTING=settings):
        assert [anon.get("/health/").status_code for _ in range(3)] == [200, 200, 429]
        other = APIClient(REMOTE_ADDR="10.9.8.7")
        assert other.get("/health/").status_code == 200


def test_the_routing_cache_is_one_object_per_process() -> None:
    import threading

    seen: list[int] = []
    threads = [threading.Thread(target=lambda: seen.append(id(routing_cache()))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(seen)) == 1 and seen[0] == id(routing_cache())
    client = raw_redis(routing_cache())
    if client is not None:  # Redis (services suite): one client, reused by every call
        assert raw_redis(routing_cache()) is client
