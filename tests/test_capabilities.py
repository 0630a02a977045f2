"""Capabilities: a row inherits what its adapter kind declares unless it overrides it
(nullable flags), the migration keeps what was set on purpose, the check command and
config-as-code show/carry the values, and the router skips on what is missing."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from llm_routing import config_io
from llm_routing.models import Chain, Provider
from llm_routing.providers.registry import get_adapter
from llm_routing.router import missing_capability
from llm_routing.types import AuditRequest, ContentPart, Message, Tool

pytestmark = pytest.mark.django_db


def _minimal(name: str, kind: str) -> Provider:
    """A row made with only the fields a new user fills in."""
    return Provider.objects.create(
        name=name,
        kind=kind,
        model="m-1",
        base_url="http://127.0.0.1:9/v1",
        api_key_env="LLMR_CAPS_KEY",
    )


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("openai_compatible", {"streaming", "tools"}),
        ("openai", {"streaming", "structured_output", "tools", "images"}),
        ("anthropic", {"streaming", "structured_output", "tools", "images", "prefill"}),
        ("gemini", {"streaming", "structured_output", "tools", "images"}),
    ],
)
def test_a_default_row_inherits_the_kind(kind: str, expected: set[str]) -> None:
    row = _minimal("p", kind)
    assert row.supports_streaming is None and row.supports_tools is None
    adapter = get_adapter(row.to_config())
    caps = {c for c in ("streaming", "structured_output", "tools", "images", "prefill")}
    assert {c for c in caps if adapter.supports(c)} == expected


def test_a_row_override_wins_both_ways() -> None:
    row = _minimal("p", "openai_compatible")
    row.supports_streaming = False
    row.supports_structured_output = True
    row.supports_images = True
    row.save()
    adapter = get_adapter(row.to_config())
    assert not adapter.supports("streaming")
    assert adapter.supports("structured_output") and adapter.supports("images")
    assert adapter.supports("tools")  # still inherited


def test_missing_capability_names_what_is_lacking() -> None:
    adapter = get_adapter(_minimal("p", "openai_compatible").to_config())
    assert missing_capability(adapter, AuditRequest(task="t", input_text="x", stream=True)) is None
    schema_request = AuditRequest(task="t", input_text="x", response_schema={"type": "object"})
    assert missing_capability(adapter, schema_request) == "structured_output"
    image = Message(
        role="user",
        content=(ContentPart(type="image_url", image_url="https://example.com/a.png"),),
    )
    assert missing_capability(adapter, AuditRequest(task="t", messages=(image,))) == "images"
    tools = AuditRequest(
        task="t", messages=(Message(role="user", content="hi"),), tools=(Tool(name="f"),)
    )
    assert missing_capability(adapter, tools) is None


@pytest.mark.django_db(transaction=True)
def test_the_migration_keeps_true_and_turns_the_old_default_into_inherit() -> None:
    executor = MigrationExecutor(connection)
    executor.migrate([("llm_routing", "0003_auditjob")])
    try:
        old = executor.loader.project_state([("llm_routing", "0003_auditjob")]).apps
        OldProvider = old.get_model("llm_routing", "Provider")
        OldProvider.objects.create(
            name="set", kind="anthropic", supports_streaming=True, supports_prefill=True
        )
        OldProvider.objects.create(name="unset", kind="openai_compatible")
        executor = MigrationExecutor(connection)
        executor.migrate([("llm_routing", "0004_chat_capabilities")])
    finally:
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate(executor.loader.graph.leaf_nodes("llm_routing"))
    set_row = Provider.objects.get(name="set")
    assert set_row.supports_streaming is True and set_row.supports_prefill is True
    assert set_row.supports_structured_output is None
    unset = Provider.objects.get(name="unset")
    assert (unset.supports_streaming, unset.supports_prefill, unset.supports_tools) == (
        None,
        None,
        None,
    )
    assert get_adapter(unset.to_config()).supports("streaming")
    assert Chain._meta.get_field("mock_backstop").default is False


def test_check_shows_effective_capabilities_and_marks_overrides(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _minimal("compat", "openai_compatible")
    row = _minimal("claude", "anthropic")
    row.supports_prefill = False
    row.save()
    out = io.StringIO()
    call_command("llm_routing_check", "--json", stdout=out)
    data = {p["name"]: p for p in json.loads(out.getvalue())["providers"]}
    assert data["compat"]["capabilities"] == {
        "streaming": True,
        "structured_output": False,
        "tools": True,
        "images": False,
        "prefill": False,
        "embeddings": True,
        "token_inputs": True,
    }
    assert data["compat"]["capability_overrides"] == {}
    assert data["claude"]["capabilities"]["embeddings"] is False
    assert data["claude"]["capabilities"]["prefill"] is False
    assert data["claude"]["capability_overrides"] == {"prefill": False}
    text = io.StringIO()
    call_command("llm_routing_check", stdout=text, no_color=True)
    lines = {line.split()[0]: line for line in text.getvalue().splitlines() if line.strip()}
    assert lines["compat"].rstrip().endswith("streaming,tools,embeddings,token_inputs")
    assert "no prefill*" in lines["claude"]
    assert "* set on the row" in text.getvalue()


def test_config_file_carries_overrides_and_omits_unset_flags() -> None:
    text = (
        "version = 1\n\n"
        "[providers.local]\n"
        'kind = "openai_compatible"\n'
        'model = "llama"\n'
        'base_url = "http://127.0.0.1:8081/v1"\n'
        "supports_streaming = false\n"
        "supports_tools = true\n\n"
        "[chains.main]\n"
        "mock_backstop = true\n"
        'entries = ["local"]\n'
    )
    config_io.apply(text)
    row = Provider.objects.get(name="local")
    assert (row.supports_streaming, row.supports_tools, row.supports_images) == (False, True, None)
    assert Chain.objects.get(name="main").mock_backstop is True
    exported = config_io.export()
    assert "supports_streaming = false" in exported
    assert "supports_tools = true" in exported
    assert "supports_images" not in exported and "supports_prefill" not in exported
    assert "mock_backstop = true" in exported
    config_io.apply(exported)
    assert config_io.export() == exported  # byte-for-byte round trip


def test_the_admin_form_takes_unknown_yes_and_no(admin_client) -> None:
    from django.urls import reverse

    url = reverse("admin:llm_routing_provider_add")
    assert 'name="supports_tools"' in admin_client.get(url).content.decode()
    form = {
        "name": "compat",
        "kind": "openai_compatible",
        "model": "llama",
        "base_url": "http://127.0.0.1:8081/v1",
        "api_key_env": "",
        "enabled": "on",
        "mode": "live",
        "timeout_s": "30",
        "first_token_timeout_s": "10",
        "max_retries": "2",
        "params": "{}",
        "supports_structured_output": "unknown",
        "supports_streaming": "false",
        "supports_prefill": "unknown",
        "supports_tools": "true",
        "supports_images": "unknown",
    }
    response = admin_client.post(url, form)
    assert response.status_code == 302, response.content.decode()[:2000]
    row = Provider.objects.get(name="compat")
    assert row.supports_streaming is False
    assert row.supports_tools is True
    assert row.supports_images is None and row.supports_structured_output is None
    chain_url = reverse("admin:llm_routing_chain_add")
    assert 'name="mock_backstop"' in admin_client.get(chain_url).content.decode()
