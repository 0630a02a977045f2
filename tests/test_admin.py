"""Every admin changelist and change page renders, and no key value appears anywhere."""

from __future__ import annotations

import re

import pytest
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.urls import reverse

from llm_routing.models import AuditJob, Budget, Chain, Provider, RoutingDecision, RoutingRule
from llm_routing.router import route
from llm_routing.types import AuditRequest

from .conftest import make_chain, make_provider

pytestmark = pytest.mark.django_db

# Every model of the app registered in the admin (a new model must be registered).
MODELS = sorted(
    (m for m in admin.site._registry if m._meta.app_label == "llm_routing"),
    key=lambda m: m._meta.model_name,
)


@pytest.fixture
def populated(scripted, key_env):
    a = make_provider("a", params={"temperature": 0.2})
    b = make_provider("b", enabled=False)
    chain = make_chain("main", [a, b], is_default=True)
    RoutingRule.objects.create(name="r", route="vision", chain=chain)
    Budget.objects.create(name="everyone", scope="global", max_requests=5)
    route(AuditRequest(task="t", input_text="INPUT-CANARY-93b2 text"))
    owner = get_user_model().objects.create_user(username="job-owner", password="pw-job-1")
    AuditJob.objects.create(
        owner=owner,
        task="t",
        payload={"task": "t", "input_text": "INPUT-CANARY-93b2 queued"},
    )
    return key_env


def urls_for(model: type) -> list[str]:
    opts = model._meta
    base = f"admin:{opts.app_label}_{opts.model_name}"
    obj = model.objects.first()
    urls = [reverse(f"{base}_changelist")]
    if obj is not None:
        urls.append(reverse(f"{base}_change", args=[obj.pk]))
    return urls


def test_every_page_renders_without_key_or_input(admin_client, populated):
    seen = 0
    for model in MODELS:
        for url in urls_for(model):
            response = admin_client.get(url)
            assert response.status_code == 200, url
            html = response.content.decode()
            assert populated not in html, url
            assert "INPUT-CANARY" not in html, url
            seen += 1
    assert {m.__name__ for m in MODELS} == {
        "Provider", "Chain", "ChainEntry", "RoutingRule", "RoutingDecision", "Attempt", "AuditJob",
        "Budget",
    }  # fmt: skip
    assert seen == 2 * len(MODELS)


def test_add_pages_for_configuration_models(admin_client, populated):
    for model in [Provider, Chain, RoutingRule]:
        opts = model._meta
        url = reverse(f"admin:{opts.app_label}_{opts.model_name}_add")
        assert admin_client.get(url).status_code == 200


def test_provider_list_shows_key_badge_not_value(admin_client, populated):
    html = admin_client.get(reverse("admin:llm_routing_provider_changelist")).content.decode()
    assert "present" in html
    assert "TEST_PROVIDER_KEY" in html  # the variable's NAME is fine
    assert populated not in html


def test_logs_are_read_only(admin_client, populated):
    decision = RoutingDecision.objects.get()
    add = admin_client.get(reverse("admin:llm_routing_routingdecision_add"))
    assert add.status_code == 403
    change = admin_client.post(
        reverse("admin:llm_routing_routingdecision_change", args=[decision.pk]), {"task": "x"}
    )
    assert change.status_code == 403
    decision.refresh_from_db()
    assert decision.task == "t"


def test_decisions_search_by_request_id_and_filter(admin_client, populated):
    decision = RoutingDecision.objects.get()
    url = reverse("admin:llm_routing_routingdecision_changelist")
    hit = admin_client.get(url, {"q": str(decision.request_id)})
    assert str(decision.request_id) in hit.content.decode()
    miss = admin_client.get(url, {"q": "00000000-0000-0000-0000-000000000000"})
    assert "0 routing decisions" in miss.content.decode()
    assert admin_client.get(url, {"q": "not-a-uuid"}).status_code == 200
    assert admin_client.get(url, {"status__exact": "ok"}).status_code == 200
    attempts = reverse("admin:llm_routing_attempt_changelist")
    assert admin_client.get(attempts, {"outcome__exact": "skipped"}).status_code == 200
    assert admin_client.get(attempts, {"q": str(decision.request_id)}).status_code == 200


def test_chain_inline_edits_entries_in_order(admin_client, populated):
    chain = Chain.objects.get(name="main")
    html = admin_client.get(reverse("admin:llm_routing_chain_change", args=[chain.pk])).content
    text = html.decode()
    # The entry rows, in position order (other widgets on the page hold values too).
    positions = re.findall(r'name="entries-\d+-position" value="(\d+)"', text)
    assert positions[:2] == ["0", "1"]
    changelist = admin_client.get(reverse("admin:llm_routing_chain_changelist")).content.decode()
    assert "a → b" in changelist


def test_provider_form_rejects_bad_env_name(admin_client, populated):
    response = admin_client.post(
        reverse("admin:llm_routing_provider_add"),
        {
            "name": "newp",
            "kind": "mock",
            "model": "m",
            "base_url": "",
            "api_key_env": "SECRET_KEY",
            "mode": "live",
            "timeout_s": 30,
            "first_token_timeout_s": 10,
            "max_retries": 2,
            "params": "{}",
            "enabled": "on",
        },
    )
    assert response.status_code == 200
    assert "deployment secret" in response.content.decode()
    assert not Provider.objects.filter(name="newp").exists()
