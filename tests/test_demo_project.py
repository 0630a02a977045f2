"""The demo project: seed command, production checks."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import call_command
from django.test import override_settings
from rest_framework.authtoken.models import Token

from llm_routing.models import Chain, ChainEntry, Provider, RoutingRule

ROOT = Path(__file__).resolve().parent.parent


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


def test_check_deploy_is_clean_with_production_environment():
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "DATABASE_", "CACHE_"))
    }
    env.update(
        DJANGO_SETTINGS_MODULE="project.settings",
        DEBUG="false",
        SECRET_KEY="a-long-random-production-secret-" + "x7Q9#kL2" * 6,
        ALLOWED_HOSTS="llm.example.com",
        SECURE_SSL_REDIRECT="true",
        SECURE_HSTS_SECONDS="31536000",
        SECURE_HSTS_INCLUDE_SUBDOMAINS="true",
        SECURE_HSTS_PRELOAD="true",
        SESSION_COOKIE_SECURE="true",
        CSRF_COOKIE_SECURE="true",
    )
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_settings_refuse_to_start_without_secret_key_when_not_debug():
    env = {k: v for k, v in os.environ.items() if k not in {"SECRET_KEY", "DJANGO_SETTINGS_MODULE"}}
    env.update(DEBUG="false", DJANGO_SETTINGS_MODULE="project.settings")
    result = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
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
