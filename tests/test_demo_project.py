"""The demo project: seed command, production checks."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.test import override_settings
from rest_framework.authtoken.models import Token

from llm_routing.models import Chain, ChainEntry, Provider, RoutingRule

from .support import clean_env, manage


@pytest.mark.django_db
def test_seed_demo_is_idempotent_and_prints_curl_only_in_debug():
    out = io.StringIO()
    with override_settings(DEBUG=True):
        call_command("seed_demo", stdout=out)
        call_command("seed_demo", stdout=io.StringIO())
    assert Provider.objects.count() == 3
    assert Chain.objects.filter(is_default=True).get().name == "default"
    assert list(
        ChainEntry.objects.filter(chain__name="default").values_list("provider__name", flat=True)
    ) == ["openai-main", "anthropic"]
    assert RoutingRule.objects.count() == 1
    token = Token.objects.get()
    assert f"Authorization: Token {token.key}" in out.getvalue()
    assert "curl -s -X POST" in out.getvalue()
    quiet = io.StringIO()
    call_command("seed_demo", stdout=quiet)  # DEBUG off in tests
    assert "Token" not in quiet.getvalue()


def test_settings_refuse_to_start_without_secret_key_when_not_debug():
    result = manage(
        "check", env=clean_env(DEBUG="false", DJANGO_SETTINGS_MODULE="project.settings")
    )
    assert result.returncode != 0
    assert "SECRET_KEY must be set" in result.stderr


@pytest.mark.django_db
def test_seeded_demo_answers_from_the_mock_naming_missing_key_and_disabled(monkeypatch):
    from rest_framework.test import APIClient

    monkeypatch.delenv("DEMO_OPENAI_API_KEY", raising=False)
    with override_settings(DEBUG=True):
        call_command("seed_demo", stdout=io.StringIO())
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.get().key}")
    response = client.post(
        "/audit/", {"task": "summarize", "input_text": "Django is a web framework."}, format="json"
    )
    assert response.status_code == 200
    body = response.json()
    assert body["result"]["provider"] == "mock" and body["result"]["status"] == "ok"
    assert body["routing_metadata"]["skipped_providers"] == [
        {"provider": "openai-main", "reason": "missing_key"},
        {"provider": "anthropic", "reason": "disabled"},
    ]
    cheap = client.post(
        "/audit/", {"task": "summarize", "input_text": "x", "route": "cheap"}, format="json"
    ).json()
    assert cheap["routing_metadata"]["router_mode"] == "rule"
    assert cheap["routing_metadata"]["rule"] == "cheap-route"
