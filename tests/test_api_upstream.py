"""The issue's "done when": POST /audit/ over real adapters and the fake upstream."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from llm_routing.models import Attempt, RoutingDecision
from tests.fakes.upstream import FakeUpstream, Faults

pytestmark = pytest.mark.django_db

BODY = {"task": "summarize", "input_text": "A text to summarize.", "instructions": "Be brief."}


@pytest.fixture
def client(monkeypatch: pytest.MonkeyPatch) -> APIClient:
    monkeypatch.setenv("TEST_PROVIDER_KEY", "sk-api-test-123456")
    api = APIClient()
    api.force_authenticate(get_user_model().objects.create_user("alice", password="pw-12345678"))
    return api


def test_503_on_the_first_is_served_by_the_second(
    client: APIClient, fake_upstream: FakeUpstream, upstream_chain: Callable[..., list[Any]]
) -> None:
    upstream_chain(
        ("compat", "openai_compatible", {"max_retries": 1, "model": "llama-3"}),
        ("claude", "anthropic", {"model": "claude-x"}),
    )
    fake_upstream.script("openai", *[Faults.unavailable("openai", 503)] * 2)

    response = client.post("/audit/", BODY, format="json")

    assert response.status_code == 200
    data = response.json()
    assert data["result"]["provider"] == "claude"
    assert data["result"]["status"] == "ok" and data["result"]["mode"] == "live"
    assert data["result"]["model"] == "claude-x-fake"
    assert data["result"]["usage"] == {"input_tokens": 12, "output_tokens": 8}
    meta = data["routing_metadata"]
    assert meta["selected_provider"] == "claude"
    assert meta["attempted_providers"] == ["compat", "claude"]
    assert meta["fallback_used"] is True and meta["fallback_reason"] == "unavailable"
    first, second = meta["attempts"]
    assert first["provider"] == "compat" and first["outcome"] == "error"
    assert first["error_category"] == "unavailable" and first["http_status"] == 503
    assert first["transient"] is True and first["retries"] == 1
    assert second["provider"] == "claude" and second["outcome"] == "ok"
    # The first's attempts are recorded, and the rows equal what the upstream saw.
    decision = RoutingDecision.objects.get(request_id=data["request_id"])
    rows = list(decision.attempts.order_by("index"))
    assert [(r.provider, r.outcome, r.http_status, r.retries) for r in rows] == [
        ("compat", "error", 503, 1),
        ("claude", "ok", None, 0),
    ]
    assert rows[0].retries + 1 == len(fake_upstream.requests_for("openai")) == 2
    assert rows[1].retries + 1 == len(fake_upstream.requests_for("anthropic")) == 1
    assert fake_upstream.requests_for("anthropic")[0].headers["x-api-key"] == "sk-api-test-123456"


def test_401_on_the_first_stops_with_status_error(
    client: APIClient, fake_upstream: FakeUpstream, upstream_chain: Callable[..., list[Any]]
) -> None:
    upstream_chain(("compat", "openai_compatible", {}), ("claude", "anthropic", {}))
    fake_upstream.script("openai", Faults.auth("openai"))

    response = client.post("/audit/", BODY, format="json")

    assert response.status_code == 200
    data = response.json()
    assert data["result"]["status"] == "error"
    assert data["result"]["provider"] == "compat"
    assert data["result"]["error"]["category"] == "authentication"
    assert data["result"]["error"]["http_status"] == 401
    assert data["routing_metadata"]["attempted_providers"] == ["compat"]
    assert fake_upstream.requests_for("anthropic") == []  # the second is never touched
    assert len(fake_upstream.requests_for("openai")) == 1  # and the first never retried
    assert list(Attempt.objects.values_list("provider", "outcome", "error_category")) == [
        ("compat", "error", "authentication")
    ]
    assert "sk-api-test-123456" not in response.content.decode()
