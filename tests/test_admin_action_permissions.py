"""Issue 22, finding 3 — every admin action declares the permission it needs and
writes admin history: "Test the selected providers" (a real call with the operator's
key, to the local fake upstream) and "Reset the circuit breaker" need change permission
on Provider; a staff user with view permission only neither sees them nor can post them."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse

from llm_routing.models import Provider, RoutingDecision
from llm_routing.resilience import breaker
from llm_routing.resilience.breaker import OPEN

from .conftest import upstream_fields
from .fakes.upstream import FakeUpstream

pytestmark = pytest.mark.django_db

CHANGELIST = "admin:llm_routing_provider_changelist"
ACTIONS = ("test_providers", "reset_circuits")


@pytest.fixture
def row(fake_upstream: FakeUpstream, key_env: str, clock: Any) -> Provider:
    fields = upstream_fields("good", "openai", fake_upstream)
    provider = Provider.objects.create(**{**fields, "model": "gpt-test", "max_retries": 0})
    breaker.store.force_open("good", "gpt-test", 600)
    return provider


def staff_client(django_user_model: Any, name: str, *codenames: str) -> Client:
    user = django_user_model.objects.create_user(name, password=f"pw-{name}-123", is_staff=True)
    for codename in codenames:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    client = Client()
    client.force_login(user)
    return client


def post_action(client: Client, action: str, row: Provider) -> Any:
    return client.post(
        reverse(CHANGELIST), {"action": action, "_selected_action": [row.pk]}, follow=True
    )


def circuit_state(row: Provider) -> str:
    return breaker.store.load(row.name, row.model).phase(breaker.store.clock())


def test_view_only_staff_neither_sees_nor_runs_the_actions(
    django_user_model: Any, row: Provider, fake_upstream: FakeUpstream
) -> None:
    viewer = staff_client(django_user_model, "viewer", "view_provider")
    page = viewer.get(reverse(CHANGELIST))
    assert page.status_code == 200
    html = page.content.decode()
    assert "good" in html  # the row is listed: view permission is enough for that
    assert not any(f'value="{action}"' in html for action in ACTIONS)

    for action in ACTIONS:  # a forged POST: refused, nothing runs
        post_action(viewer, action, row)
    assert fake_upstream.requests == []
    assert RoutingDecision.objects.count() == 0
    assert circuit_state(row) == OPEN
    assert LogEntry.objects.count() == 0


def test_change_permission_runs_the_actions_and_writes_history(
    django_user_model: Any, row: Provider, fake_upstream: FakeUpstream, key_env: str
) -> None:
    operator = staff_client(django_user_model, "operator", "view_provider", "change_provider")
    html = operator.get(reverse(CHANGELIST)).content.decode()
    assert all(f'value="{action}"' in html for action in ACTIONS)

    assert post_action(operator, "reset_circuits", row).status_code == 200
    assert circuit_state(row) == "closed"
    reset = LogEntry.objects.get(object_id=str(row.pk))
    assert "Reset the circuit breaker (1 circuit(s))" in reset.get_change_message()
    assert reset.user.username == "operator"

    tested = post_action(operator, "test_providers", row)
    assert tested.status_code == 200 and len(fake_upstream.requests) == 1
    decision = RoutingDecision.objects.get(task="admin_test")
    entry = LogEntry.objects.exclude(pk=reset.pk).get(object_id=str(row.pk))
    message = entry.get_change_message()
    assert f"Tested with one real request: ok (decision {decision.request_id})" in message
    assert key_env not in message
