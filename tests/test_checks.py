"""Every system check of llm_routing.checks, triggered for real."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.core import checks
from django.test import override_settings

from llm_routing.checks import MESSAGES, check_configuration_rows, check_settings
from llm_routing.models import Chain, ChainEntry, Provider

from .support import clean_env, manage

ROOT = Path(__file__).resolve().parent.parent
KEY_VAR = "LLMR_I7_TEST_KEY"


def ids(messages: list[checks.CheckMessage]) -> list[str]:
    return [m.id or "" for m in messages]


def rows() -> list[checks.CheckMessage]:
    return check_configuration_rows(databases=["default"])


def test_every_message_has_text_and_hint() -> None:
    assert set(MESSAGES) >= {"E001", "E002", "E003", "E004", "W001", "W002", "I001"}
    for text, hint in MESSAGES.values():
        assert text and hint


@override_settings(LLM_ROUTING={"DEFAULT_CHAIN": [], "NOT_A_SETTING": 1})
def test_e001_unknown_setting() -> None:
    messages = check_settings()
    assert ids(messages) == ["llm_routing.E001"]
    assert "NOT_A_SETTING" in messages[0].msg


@pytest.mark.parametrize(
    ("value", "detail"),
    [
        ({"DEFAULT_CHAIN": "openai"}, "DEFAULT_CHAIN must be a list"),
        ({"ROUTES": ["x"]}, "ROUTES must be a dict"),
        ({"MAX_ATTEMPTS": 0}, "MAX_ATTEMPTS must be a positive number"),
        (["not", "a", "dict"], "must be a dict"),
    ],
)
def test_e002_malformed_setting(value: object, detail: str) -> None:
    with override_settings(LLM_ROUTING=value):
        messages = check_settings()
    assert ids(messages) == ["llm_routing.E002"]
    assert detail in messages[0].msg


@pytest.mark.parametrize(
    ("value", "detail"),
    [
        ({"HTTP_MAX_CONNECTIONS": 10.5}, "HTTP_MAX_CONNECTIONS must be a whole number"),
        ({"HTTP_MAX_KEEPALIVE": 2.0}, "HTTP_MAX_KEEPALIVE must be a whole number"),
        ({"HTTP_MAX_CONNECTIONS": 10}, "HTTP_MAX_KEEPALIVE is larger than HTTP_MAX_CONNECTIONS"),
        (
            {"HTTP_MAX_CONNECTIONS": 5, "HTTP_MAX_KEEPALIVE": 6},
            "HTTP_MAX_KEEPALIVE is larger than HTTP_MAX_CONNECTIONS",
        ),
    ],
)
def test_e010_http_pool_limits(value: dict[str, object], detail: str) -> None:
    with override_settings(LLM_ROUTING=value):
        messages = check_settings()
    assert ids(messages) == ["llm_routing.E010"]
    assert detail in messages[0].msg


@pytest.mark.parametrize(
    "value",
    [{}, {"HTTP_MAX_CONNECTIONS": 10, "HTTP_MAX_KEEPALIVE": 10}, {"HTTP_MAX_KEEPALIVE": 1}],
)
def test_e010_accepts_usable_pool_limits(value: dict[str, object]) -> None:
    with override_settings(LLM_ROUTING=value):
        assert check_settings() == []


def test_a_non_positive_pool_limit_is_e002_only() -> None:
    with override_settings(LLM_ROUTING={"HTTP_MAX_KEEPALIVE": 0}):
        assert ids(check_settings()) == ["llm_routing.E002"]


@pytest.mark.django_db
def test_e003_unknown_kind() -> None:
    Provider.objects.create(name="weird", kind="no-such-kind")
    messages = rows()
    assert "llm_routing.E003" in ids(messages)
    e003 = next(m for m in messages if m.id == "llm_routing.E003")
    assert e003.level == checks.ERROR
    assert "'weird'" in e003.msg and "no-such-kind" in e003.msg


@pytest.mark.django_db
@pytest.mark.parametrize(
    "env_name", ["SECRET_KEY", "DATABASE_URL", "sk-live-0123456789abcdef", "lower_case"]
)
def test_e004_invalid_key_variable_name(env_name: str) -> None:
    # Rows written past full_clean (a script, an older deny-list) are still caught.
    Provider.objects.create(name="p", kind="openai", api_key_env=env_name)
    messages = [m for m in rows() if m.id == "llm_routing.E004"]
    assert len(messages) == 1
    assert messages[0].level == checks.ERROR
    if env_name.startswith("sk-"):
        assert env_name not in messages[0].msg  # a pasted key is never echoed


@pytest.mark.django_db
def test_e004_respects_denied_names_setting() -> None:
    Provider.objects.create(name="p", kind="openai", api_key_env="BILLING_TOKEN")
    assert "llm_routing.E004" not in ids(rows())
    with override_settings(LLM_ROUTING={"DENIED_KEY_ENV_NAMES": ["BILLING_TOKEN"]}):
        assert "llm_routing.E004" in ids(rows())


@pytest.mark.django_db
def test_w001_enabled_provider_with_missing_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEY_VAR, raising=False)
    Provider.objects.create(name="openai-main", kind="openai", api_key_env=KEY_VAR)
    w001 = [m for m in rows() if m.id == "llm_routing.W001"]
    assert len(w001) == 1 and w001[0].level == checks.WARNING
    assert KEY_VAR in w001[0].msg

    monkeypatch.setenv(KEY_VAR, "")  # empty counts as missing
    assert "llm_routing.W001" in ids(rows())

    monkeypatch.setenv(KEY_VAR, "sk-test-value-not-shown-0123456789")
    messages = rows()
    assert "llm_routing.W001" not in ids(messages)
    assert all("sk-test-value" not in m.msg for m in messages)


@pytest.mark.django_db
def test_w001_no_key_variable_at_all() -> None:
    Provider.objects.create(name="openai-main", kind="openai", api_key_env="")
    w001 = [m for m in rows() if m.id == "llm_routing.W001"]
    assert len(w001) == 1 and "names no key variable" in w001[0].msg


@pytest.mark.django_db
def test_w001_not_for_disabled_mock_mode_or_keyless_kinds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEY_VAR, raising=False)
    Provider.objects.create(name="off", kind="openai", api_key_env=KEY_VAR, enabled=False)
    Provider.objects.create(name="staging", kind="openai", api_key_env=KEY_VAR, mode="mock")
    Provider.objects.create(name="mock", kind="mock")
    assert "llm_routing.W001" not in ids(rows())


@pytest.mark.django_db
def test_w002_chain_whose_every_entry_is_disabled() -> None:
    live = Provider.objects.create(name="live", kind="mock")
    off = Provider.objects.create(name="off", kind="mock", enabled=False)
    all_off = Chain.objects.create(name="all-off", is_default=True)
    ChainEntry.objects.create(chain=all_off, provider=live, position=0, enabled=False)
    ChainEntry.objects.create(chain=all_off, provider=off, position=1)
    fine = Chain.objects.create(name="fine")
    ChainEntry.objects.create(chain=fine, provider=live, position=0)
    ChainEntry.objects.create(chain=fine, provider=off, position=1)
    Chain.objects.create(name="empty")
    w002 = sorted(m.msg for m in rows() if m.id == "llm_routing.W002")
    assert len(w002) == 2
    assert "'all-off'" in w002[0]
    assert "'empty'" in w002[1] and "no entries" in w002[1]


@pytest.mark.django_db
def test_i001_no_default_chain_anywhere() -> None:
    messages = [m for m in rows() if m.id == "llm_routing.I001"]
    assert len(messages) == 1 and messages[0].level == checks.INFO
    with override_settings(LLM_ROUTING={"DEFAULT_CHAIN": ["openai"]}):
        assert "llm_routing.I001" not in ids(rows())
    Chain.objects.create(name="main", is_default=True)
    assert "llm_routing.I001" not in ids(rows())


@pytest.mark.django_db
def test_row_checks_are_database_tagged(django_assert_num_queries) -> None:  # type: ignore[no-untyped-def]
    Provider.objects.create(name="weird", kind="no-such-kind")
    # Django 6's own JSONField check asks SQLite once per connection whether it supports
    # JSON (a query of Django's, cached on the connection): a first run pays it.
    checks.run_checks()
    # Plain `manage.py check` (no databases) never touches the database for them …
    with django_assert_num_queries(0):
        plain = checks.run_checks()
    assert "llm_routing.E003" not in ids(plain)
    # … `check --database default` (and migrate) runs them.
    assert "llm_routing.E003" in ids(checks.run_checks(databases=["default"]))


def test_check_and_migrate_work_on_an_empty_database(tmp_path: Path) -> None:
    """`check --database default` and `migrate` run the row checks before any table exists."""
    env = clean_env(
        DJANGO_SETTINGS_MODULE="project.settings",
        DATABASE_URL=f"sqlite:///{tmp_path / 'fresh.sqlite3'}",
        DEBUG="true",
    )
    check = manage("check", "--database", "default", env=env)
    assert check.returncode == 0, check.stderr
    assert "Traceback" not in check.stderr
    assert "llm_routing.I001" not in check.stderr  # no tables yet: the row checks skip
    migrate = manage("migrate", "--noinput", "-v", "0", env=env)
    assert migrate.returncode == 0, migrate.stderr
    after = manage("check", "--database", "default", env=env)
    assert after.returncode == 0, after.stderr
    assert "llm_routing.I001" in after.stderr  # the tables exist now, and are empty


@pytest.mark.django_db
def test_w001_not_for_keyless_openai_compatible_row(monkeypatch: pytest.MonkeyPatch) -> None:
    # issue 11: a local server row naming no key variable needs none (the router agrees).
    Provider.objects.create(
        name="local-llama",
        kind="openai_compatible",
        api_key_env="",
        base_url="http://127.0.0.1:1/v1",
    )
    assert "llm_routing.W001" not in ids(rows())
    # ... but a row that names a variable needs it set.
    monkeypatch.delenv(KEY_VAR, raising=False)
    Provider.objects.create(
        name="hosted",
        kind="openai_compatible",
        api_key_env=KEY_VAR,
        base_url="https://h.example/v1",
    )
    w001 = [m for m in rows() if m.id == "llm_routing.W001"]
    assert len(w001) == 1 and "hosted" in w001[0].msg


@pytest.mark.django_db
def test_w005_a_step_whose_weights_sum_to_zero() -> None:
    a, b, c = (Provider.objects.create(name=n, kind="mock") for n in ("a", "b", "c"))
    chain = Chain.objects.create(name="spread")
    ChainEntry.objects.create(chain=chain, provider=a, position=0, step=0, weight=0)
    ChainEntry.objects.create(chain=chain, provider=b, position=1, step=0, weight=0)
    ChainEntry.objects.create(chain=chain, provider=c, position=2, weight=0)  # a step of one
    (w005,) = [m for m in rows() if m.id == "llm_routing.W005"]
    assert "'spread': step 0 (weighted)" in w005.msg and w005.level == checks.WARNING
    ChainEntry.objects.filter(provider=b).update(weight=0.01)
    assert "llm_routing.W005" not in ids(rows())


@pytest.mark.django_db
def test_w006_hedging_on_a_chain_of_one() -> None:
    a = Provider.objects.create(name="a", kind="openai_compatible", base_url="https://a.example/v1")
    chain = Chain.objects.create(name="solo", hedge_after_ms="400")
    ChainEntry.objects.create(chain=chain, provider=a, position=0)
    (w006,) = [m for m in rows() if m.id == "llm_routing.W006"]
    assert "'solo' hedges (hedge_after_ms = 400)" in w006.msg and w006.level == checks.WARNING
    b = Provider.objects.create(name="b", kind="openai_compatible", base_url="https://b.example/v1")
    ChainEntry.objects.create(chain=chain, provider=b, position=1)
    assert "llm_routing.W006" not in ids(rows())
    Chain.objects.filter(pk=chain.pk).update(hedge_after_ms="")
    ChainEntry.objects.filter(provider=b).delete()
    assert "llm_routing.W006" not in ids(rows())
