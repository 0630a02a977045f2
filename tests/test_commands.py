"""The operator commands llm_routing_audit and llm_routing_check."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from dataclasses import replace

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings

from llm_routing.models import Chain, ChainEntry, Provider, RoutingDecision
from llm_routing.providers.base import BaseProvider
from llm_routing.resilience import breaker
from llm_routing.types import AuditRequest, ErrorInfo, ProviderResult

pytestmark = pytest.mark.django_db

KEY_VAR = "LLMR_I7_CMD_KEY"
KEY_VALUE = "sk-test-never-printed-0123456789abcdef"


def run(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out, no_color=True)
    return out.getvalue()


class KeyedProvider(BaseProvider):
    """A stand-in vendor adapter that needs a key (never called: its key is unset)."""

    kind = "keyed"

    def complete(
        self, request: AuditRequest, *, api_key: str | None, timeout: float
    ) -> ProviderResult:
        raise AssertionError("not called in these tests")


@pytest.fixture
def configured(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv(KEY_VAR, raising=False)
    openai = Provider.objects.create(
        name="openai-main", kind="keyed", model="gpt-4o-mini", api_key_env=KEY_VAR
    )
    staging = Provider.objects.create(name="staging", kind="mock", model="staging-1")
    chain = Chain.objects.create(name="main", is_default=True)
    ChainEntry.objects.create(chain=chain, provider=openai, position=0)
    ChainEntry.objects.create(chain=chain, provider=staging, position=1)
    kinds = {"keyed": f"{__name__}.KeyedProvider"}
    with override_settings(LLM_ROUTING={"PROVIDER_KINDS": kinds}):
        yield


def test_audit_json_is_the_http_envelope(configured: None) -> None:
    out = run("llm_routing_audit", "--task", "summarize", "--input", "Some text.", "--json")
    envelope = json.loads(out)
    assert set(envelope) == {"request_id", "result", "routing_metadata", "diagnostics"}
    meta = envelope["routing_metadata"]
    assert meta["chain"] == ["openai-main", "staging", "mock"]
    assert meta["skipped_providers"] == [{"provider": "openai-main", "reason": "missing_key"}]
    assert meta["selected_provider"] == "staging"
    assert envelope["result"]["status"] == "ok"
    decision = RoutingDecision.objects.get(request_id=envelope["request_id"])
    assert decision.input_length == len("Some text.")


def test_audit_human_output(configured: None) -> None:
    out = run(
        "llm_routing_audit",
        "--task",
        "summarize",
        "--input",
        "Some text.",
        "--metadata",
        "team=search",
    )
    assert "result:      ok from staging" in out
    assert "routing:     mode default, chain main [openai-main, staging, mock]" in out
    assert "#0 openai-main: skipped (missing_key)" in out
    assert "fallback:    yes (missing_key)" in out


def test_audit_forced_provider(configured: None) -> None:
    envelope = json.loads(
        run(
            "llm_routing_audit", "--task", "t", "--input", "x", "--force-provider", "mock", "--json"
        )
    )
    assert envelope["routing_metadata"]["router_mode"] == "forced"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--task", "not a slug", "--input", "x"], "task:"),
        (["--task", "t", "--input", "   "], "input_text:"),
        (["--task", "t", "--input", "x", "--metadata", "novalue"], "KEY=VALUE"),
        (
            ["--task", "t", "--input", "x", "--provider", "a", "--force-provider", "b"],
            "force_provider",
        ),
    ],
)
def test_audit_bad_input_is_a_clear_error(args: list[str], message: str) -> None:
    with pytest.raises(CommandError, match=message):
        run("llm_routing_audit", *args)
    assert RoutingDecision.objects.count() == 0


def test_check_lists_providers_and_key_presence_without_values(
    configured: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = run("llm_routing_check")
    lines = {line.split()[0]: line.split() for line in out.splitlines() if line.strip()}
    assert lines["openai-main"][-3:-1] == ["missing", "closed"]
    assert lines["staging"][-2] == "n/a"  # a mock answers offline: no circuit
    assert "not needed" in out.splitlines()[2]  # staging: the mock kind needs no key
    assert "default chain: main" in out
    assert "llm_routing.W001" in out

    monkeypatch.setenv(KEY_VAR, KEY_VALUE)
    out = run("llm_routing_check")
    assert KEY_VALUE not in out
    assert "present" in next(line for line in out.splitlines() if line.startswith("openai-main"))
    assert "llm_routing.W001" not in out
    assert "No problems found." in out


def test_check_json(configured: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_VAR, KEY_VALUE)
    raw = run("llm_routing_check", "--json")
    assert KEY_VALUE not in raw
    data = json.loads(raw)
    assert [p["name"] for p in data["providers"]] == ["openai-main", "staging"]
    assert data["providers"][0]["key_present"] is True
    assert data["default_chain"] == "main"
    assert data["checks"] == []


def test_check_shows_circuit_state_from_the_breaker(configured: None) -> None:
    vendor = Provider.objects.get(name="openai-main")
    other = Chain.objects.create(name="other")
    ChainEntry.objects.create(chain=other, provider=vendor, position=0, model="gpt-4o")
    data = json.loads(run("llm_routing_check", "--json"))
    assert {p["name"]: p["circuit"] for p in data["providers"]} == {
        "openai-main": "closed",
        "staging": "n/a",
    }

    def trip(model: str) -> None:
        # Three transient failures (after retries) open a circuit: the breaker's own path.
        failure = ProviderResult(
            provider=vendor.name,
            model=model,
            mode="error",
            status="error",
            error=ErrorInfo(category="unavailable", message="503", http_status=503, transient=True),
            upstream_requests=1,
        )
        config = replace(vendor.to_config(), model=model)
        for _ in range(3):
            breaker.observe(config, failure)

    trip("gpt-4o")
    data = json.loads(run("llm_routing_check", "--json"))
    assert data["providers"][0]["circuit"] == "closed; gpt-4o: open"
    trip("gpt-4o-mini")
    assert "openai-main  keyed  gpt-4o-mini" in run("llm_routing_check")
    data = json.loads(run("llm_routing_check", "--json"))
    assert data["providers"][0]["circuit"] == "open; gpt-4o: open"


def test_check_fails_on_configuration_errors() -> None:
    Provider.objects.create(name="weird", kind="no-such-kind")
    with pytest.raises(CommandError, match="1 error"):
        run("llm_routing_check")


def test_check_with_nothing_configured() -> None:
    out = run("llm_routing_check")
    assert "no providers" in out
    assert "llm_routing.I001" in out


def test_check_before_migrate_is_a_clear_error() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE llm_routing_provider RENAME TO llm_routing_provider_away")
    try:
        with pytest.raises(CommandError, match="has `migrate` run"):
            run("llm_routing_check")
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE llm_routing_provider_away RENAME TO llm_routing_provider")
