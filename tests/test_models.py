"""Model validation: slugs, api_key_env names and deny-list, base_url, uniqueness."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.test import override_settings

from llm_routing.models import Chain, ChainEntry, Provider, RoutingRule

pytestmark = pytest.mark.django_db


def provider(**kw: object) -> Provider:
    kw.setdefault("name", "p1")
    kw.setdefault("kind", "mock")
    return Provider(**kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["OPENAI_API_KEY", "_X", "A1_B2"])
def test_valid_env_names(name):
    provider(api_key_env=name).full_clean()


@pytest.mark.parametrize(
    "name",
    ["sk-abc123", "openai_api_key", "1ABC", "A B", "A-B", "X" * 129, "SECRET_KEY", "DATABASE_URL"],
)
def test_invalid_or_denied_env_names(name):
    with pytest.raises(ValidationError) as info:
        provider(api_key_env=name).full_clean()
    assert "api_key_env" in info.value.message_dict


@pytest.mark.parametrize(
    "name",
    [
        "DB_PASSWORD",
        "DJANGO_DB_PASSWORD",
        "SENTRY_DSN",
        "RABBITMQ_URL",
        "MONGO_URI",
        "DATABASE_HOST",
        "APP_CLIENT_SECRET",
        "SSH_PRIVATE_KEY",
        "SMTP_PASSWD",
    ],
)
def test_deployment_secrets_are_denied_by_pattern(name):
    with pytest.raises(ValidationError) as info:
        provider(api_key_env=name).full_clean()
    assert info.value.error_dict["api_key_env"][0].code == "denied_env_name"


@pytest.mark.parametrize("name", ["OPENAI_API_KEY", "HF_TOKEN", "ANTHROPIC_API_KEY", "GEMINI_KEY"])
def test_provider_key_names_pass_the_patterns(name):
    provider(api_key_env=name).full_clean()


def test_deny_patterns_extend_from_settings():
    provider(api_key_env="CORP_VAULT_TOKEN").full_clean()
    with override_settings(LLM_ROUTING={"DENIED_KEY_ENV_NAMES": ["CORP_VAULT_*"]}):
        with pytest.raises(ValidationError):
            provider(api_key_env="CORP_VAULT_TOKEN").full_clean()


def test_deny_list_extends_from_settings():
    provider(api_key_env="MY_INTERNAL_TOKEN").full_clean()
    with override_settings(LLM_ROUTING={"DENIED_KEY_ENV_NAMES": ["MY_INTERNAL_TOKEN"]}):
        with pytest.raises(ValidationError):
            provider(api_key_env="MY_INTERNAL_TOKEN").full_clean()


@pytest.mark.parametrize(
    "url",
    ["ftp://x.example/", "file:///etc/passwd", "javascript:alert(1)", "https://u:p@h.example/"],
)
def test_base_url_must_be_http_without_credentials(url):
    with pytest.raises(ValidationError) as info:
        provider(base_url=url).full_clean()
    assert "base_url" in info.value.message_dict


def test_base_url_http_ok():
    provider(base_url="http://127.0.0.1:11434/v1").full_clean()
    provider(base_url="https://api.example.com").full_clean()


@pytest.mark.parametrize("name", ["has space", "UPPER CASE", "semi;colon", ""])
def test_names_are_slugs(name):
    with pytest.raises(ValidationError):
        provider(name=name).full_clean()


def test_unknown_kind_is_a_validation_error():
    with pytest.raises(ValidationError) as info:
        provider(kind="nope").full_clean()
    assert "kind" in info.value.message_dict


def test_at_most_one_default_chain():
    Chain.objects.create(name="one", is_default=True)
    second = Chain(name="two", is_default=True)
    with pytest.raises(ValidationError, match="already the default"):
        second.full_clean()
    with pytest.raises(IntegrityError), transaction.atomic():
        second.save()
    Chain.objects.create(name="three", is_default=False)


def test_chain_entry_uniqueness():
    chain = Chain.objects.create(name="c")
    a = Provider.objects.create(name="a", kind="mock")
    b = Provider.objects.create(name="b", kind="mock")
    ChainEntry.objects.create(chain=chain, provider=a, position=0)
    with pytest.raises(IntegrityError), transaction.atomic():
        ChainEntry.objects.create(chain=chain, provider=b, position=0)
    with pytest.raises(IntegrityError), transaction.atomic():
        ChainEntry.objects.create(chain=chain, provider=a, position=1)
    ChainEntry.objects.create(chain=chain, provider=b, position=1)


def test_rule_needs_a_condition():
    chain = Chain.objects.create(name="c")
    with pytest.raises(ValidationError, match="route key, a task pattern"):
        RoutingRule(name="r", chain=chain).full_clean()
    RoutingRule(name="r", chain=chain, task_glob="sum*").full_clean()


def test_key_present_reads_presence_only(monkeypatch):
    p = provider(api_key_env="SOME_TEST_KEY")
    monkeypatch.delenv("SOME_TEST_KEY", raising=False)
    assert p.key_present is False
    monkeypatch.setenv("SOME_TEST_KEY", "")
    assert p.key_present is False
    monkeypatch.setenv("SOME_TEST_KEY", "value")
    assert p.key_present is True
    assert "value" not in repr(p.to_config())
