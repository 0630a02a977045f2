"""Admin rough edges a newcomer hits: the kind is a choice list from the adapter
registry, the logs cannot be deleted from the admin, the mock shows the same mode and
circuit in the admin and in ``llm_routing_check``."""

from __future__ import annotations

import json
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.test import override_settings
from django.urls import reverse

from llm_routing.models import Attempt, Provider, RoutingDecision
from llm_routing.router import route
from llm_routing.types import AuditRequest

from .conftest import make_chain, make_provider

pytestmark = pytest.mark.django_db


def test_kind_is_a_choice_list_from_the_registry(admin_client, scripted):
    with override_settings(
        LLM_ROUTING={"PROVIDER_KINDS": {"acme": "llm_routing.providers.mock.MockProvider"}}
    ):
        html = admin_client.get(reverse("admin:llm_routing_provider_add")).content.decode()
    assert '<select name="kind"' in html
    for kind in ("openai", "anthropic", "gemini", "openai_compatible", "mock", "acme", "scripted"):
        assert f'<option value="{kind}">{kind}</option>' in html


def test_kind_outside_the_registry_is_a_form_error(admin_client):
    response = admin_client.post(
        reverse("admin:llm_routing_provider_add"),
        {
            "name": "typo",
            "kind": "opneai",
            "model": "m",
            "mode": "live",
            "timeout_s": 30,
            "first_token_timeout_s": 10,
            "max_retries": 2,
            "params": "{}",
        },
    )
    assert response.status_code == 200
    assert "Select a valid choice" in response.content.decode()
    assert not Provider.objects.filter(name="typo").exists()


@pytest.fixture
def decision(scripted: Any, key_env: str) -> RoutingDecision:
    make_chain("main", [make_provider("a")], is_default=True)
    route(AuditRequest(task="t", input_text="hello"))
    return RoutingDecision.objects.get()


@pytest.mark.parametrize("model", ["routingdecision", "attempt"])
def test_logs_offer_no_delete_to_superusers(admin_client, decision, model):
    changelist = admin_client.get(reverse(f"admin:llm_routing_{model}_changelist"))
    assert changelist.status_code == 200
    assert "delete_selected" not in changelist.content.decode()
    obj = decision if model == "routingdecision" else Attempt.objects.first()
    assert obj is not None
    delete = admin_client.post(
        reverse(f"admin:llm_routing_{model}_delete", args=[obj.pk]), {"post": "yes"}
    )
    assert delete.status_code == 403
    bulk = admin_client.post(
        reverse(f"admin:llm_routing_{model}_changelist"),
        {"action": "delete_selected", "_selected_action": [obj.pk], "post": "yes"},
    )
    assert bulk.status_code in (200, 302)
    assert RoutingDecision.objects.count() == 1
    assert Attempt.objects.count() == 1


@pytest.mark.parametrize(
    "fields",
    [
        {"name": "mock", "kind": "mock", "mode": "live"},
        {"name": "offline", "kind": "mock", "mode": "live"},
        {"name": "staging", "kind": "openai", "mode": "mock"},
    ],
)
def test_mock_mode_and_circuit_agree_in_admin_and_check(admin_client, fields):
    Provider.objects.create(model="m", **fields)
    html = admin_client.get(reverse("admin:llm_routing_provider_changelist")).content.decode()
    # The results table (Django 6 renders the filter sidebar, where "mock" is a link too,
    # before it).
    results = html[html.index('id="result_list"') :]
    row = results[results.index(f">{fields['name']}</a>") :]
    row = row[: row.index("</tr>")]
    assert "mock (answers offline)</" in row and 'class="field-mode_shown"' in row
    assert ">n/a</span>" in row and ">closed<" not in row
    out = StringIO()
    call_command("llm_routing_check", "--json", stdout=out)
    (shown,) = [p for p in json.loads(out.getvalue())["providers"] if p["name"] == fields["name"]]
    assert shown["mode"] == "mock"
    assert shown["circuit"] == "n/a"
