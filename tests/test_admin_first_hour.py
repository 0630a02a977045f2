"""The admin as a newcomer reads it: failed requests read as failures (list, detail,
timeline), the explain form has labels, choices and an empty state, raw tokens come as
words with the raw value in a tooltip, one date format, the mock's mode shown the same
way everywhere. Each test fails on main."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.urls import reverse

from llm_routing.errors import UnavailableError
from llm_routing.models import RoutingDecision
from llm_routing.router import route
from llm_routing.types import AuditRequest

from .conftest import make_chain, make_provider

pytestmark = pytest.mark.django_db

DOWN = UnavailableError("down", http_status=503)


@pytest.fixture
def failed_decision(scripted: Any, key_env: str) -> RoutingDecision:
    make_chain("main", [make_provider("local-llm")], is_default=True)
    scripted.scripts["local-llm"] = [DOWN, DOWN, DOWN]
    route(AuditRequest(task="summarize", input_text="x", backstop=False), sleeper=lambda s: None)
    decision = RoutingDecision.objects.get()
    assert decision.status != "ok" and decision.selected_provider == "local-llm"
    return decision


def test_a_failed_decision_reads_as_a_failure_in_the_list(admin_client, failed_decision):
    html = admin_client.get(reverse("admin:llm_routing_routingdecision_changelist")).content
    row = html.decode().split('id="result_list"', 1)[1]
    assert "Failed: no provider could answer" in row
    assert "— nobody" in row and 'title="last tried: local-llm"' in row
    assert "icon-yes.svg" not in row  # no "Fallback used ✓"


def test_a_failed_decision_reads_as_a_failure_on_its_page(admin_client, failed_decision):
    url = reverse("admin:llm_routing_routingdecision_change", args=[failed_decision.pk])
    html = admin_client.get(url).content.decode()
    assert "Selected provider" not in html and "Fallback used" not in html
    assert "Failed: no provider could answer, after 1 attempt." in html
    served = html.split("field-served_by", 1)[1][:400]
    assert "— nobody" in served and "local-llm" not in served.split("title=")[0]
    assert "icon-yes.svg" not in html.split('id="routingdecision_form"', 1)[1].split("<h2")[0]


def test_one_date_format_in_the_decision_list(admin_client, failed_decision):
    html = admin_client.get(reverse("admin:llm_routing_routingdecision_changelist")).content
    row = html.decode().split('id="result_list"', 1)[1]
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", row)
    assert "p.m." not in row and "a.m." not in row


def test_explain_form_has_labels_choices_and_an_empty_state(admin_client, scripted, key_env):
    make_chain("main", [make_provider("alpha"), make_provider("beta")], is_default=True)
    make_chain("cheap", [make_provider("gamma")])
    html = admin_client.get(reverse("admin:llm_routing_explain")).content.decode()
    assert ">force_provider<" not in html and ">schema<" not in html
    assert "Force a provider" in html and "Structured output schema" in html
    chain = html.split('id="id_chain"', 1)[1].split("</select>", 1)[0]
    assert '<option value="cheap">' in chain and '<option value="main">' in chain
    provider = html.split('id="id_provider"', 1)[1].split("</select>", 1)[0]
    assert all(f'<option value="{n}">' in provider for n in ("alpha", "beta", "gamma"))
    task = html.split('id="id_task"', 1)[0].rsplit("<input", 1)[1] + html.split('id="id_task"')[1]
    assert 'placeholder="summarize"' not in task.split(">", 1)[0]
    assert 'class="llmr-empty"' in html  # says what to fill in before anything is shown
    # Submitted without a task: the page says so (on main it showed nothing at all).
    empty = admin_client.get(reverse("admin:llm_routing_explain"), {"chain": "main"})
    assert "Task: This field is required." in empty.content.decode()


def test_explain_form_keeps_its_choices_after_explaining(admin_client, scripted, key_env):
    make_chain("main", [make_provider("alpha")], is_default=True)
    page = admin_client.get(
        reverse("admin:llm_routing_explain"), {"task": "summarize", "chain": "main"}
    ).content.decode()
    assert '<option value="main" selected>' in page
    assert 'id="llmr-candidates"' in page


def test_api_schema_names_no_internal_component(api):
    """Swagger listed ``_AssistantMessage`` and ``_Choice`` (private serializer names)."""
    schema = api.get("/api/schema/", {"format": "json"}).json()
    names = set(schema["components"]["schemas"])
    assert not [n for n in names if n.startswith("_")]
    assert {"ChatCompletionMessage", "ChatCompletionChoice", "ChatCompletionUsage"} <= names


def test_the_demo_root_page_is_not_django_administration(client):
    html = client.get("/").content.decode()
    assert "Django administration" not in html
    assert '<div id="site-name"><a href="/">django-llm-routing</a></div>' in html


def test_the_mock_kind_reads_the_same_in_the_list_and_its_form(admin_client):
    from llm_routing.models import Provider

    mock = Provider.objects.create(name="offline", kind="mock", model="m")
    assert mock.mode == "live"  # stored; the kind makes it answer offline
    listing = admin_client.get(reverse("admin:llm_routing_provider_changelist")).content
    assert "mock (answers offline)" in listing.decode()
    form = admin_client.get(reverse("admin:llm_routing_provider_change", args=[mock.pk]))
    assert "answers offline whatever its mode" in form.content.decode()


def test_raw_tokens_come_as_words_with_the_raw_value_in_a_tooltip(admin_client, failed_decision):
    url = reverse("admin:llm_routing_routingdecision_change", args=[failed_decision.pk])
    html = admin_client.get(url).content.decode()
    assert '<span class="llmr-term" title="unavailable">' not in html  # same word: no tooltip
    assert '<span class="llmr-term" title="default">default chain</span>' in html
    assert '<span class="llmr-term" title="error">failed</span>' in html  # attempt outcome
    assert 'class="module llmr-attempts"' in html  # its rows' str() labels are hidden
