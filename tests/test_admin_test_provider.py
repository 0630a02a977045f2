"""The "Test the selected providers" admin action: one tiny real request per provider
through its adapter (a real HTTP call to a local fake upstream), recorded as a normal
decision with task ``admin_test``, the outcome shown per provider."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse

from llm_routing.models import Attempt, Provider, RoutingDecision

from .conftest import upstream_fields
from .fakes.upstream import FakeUpstream

pytestmark = pytest.mark.django_db


def test_action_calls_each_provider_and_records_decisions(
    admin_client: Any, fake_upstream: FakeUpstream, key_env: str
) -> None:
    fields = upstream_fields("good", "openai", fake_upstream)
    good = Provider.objects.create(**{**fields, "model": "gpt-test", "max_retries": 0})
    keyless = Provider.objects.create(
        **{**fields, "name": "keyless", "api_key_env": "UNSET_ADMIN_TEST_KEY"}
    )
    response = admin_client.post(
        reverse("admin:llm_routing_provider_changelist"),
        {"action": "test_providers", "_selected_action": [good.pk, keyless.pk]},
        follow=True,
    )
    requests_seen = len(fake_upstream.requests)
    assert response.status_code == 200
    html = response.content.decode()
    text = html.lower()  # the admin capitalises the first letter of a message
    assert "good: ok in" in text and "gpt-test" in html
    assert "keyless: missing_key" in text
    assert requests_seen == 1  # the keyless provider never reached the upstream
    decisions = RoutingDecision.objects.filter(task="admin_test").order_by("created_at")
    assert [(d.requested_provider, d.router_mode, d.status) for d in decisions] == [
        ("good", "forced", "ok"),
        ("keyless", "forced", "fallback"),
    ]
    assert Attempt.objects.get(decision=decisions[0]).served
    assert key_env not in html
    for d in decisions:
        assert str(d.request_id) in html
