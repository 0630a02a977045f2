"""project.env_bootstrap: routing seeds from the environment (demo project only)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from llm_routing import audit
from llm_routing.models import Chain, ChainEntry, Provider, RoutingRule
from project.env_bootstrap import parse_provider_list, parse_routes, routing_from_env

from .support import clean_env, manage

ROOT = Path(__file__).resolve().parent.parent


def test_chain_and_rules_from_the_issue_example() -> None:
    assert routing_from_env(
        {
            "LLM_PROVIDER_CHAIN": "openai,anthropic",
            "LLM_ROUTING_RULES": "vision=openai,anthropic;cheap=mock",
        }
    ) == {
        "DEFAULT_CHAIN": ["openai", "anthropic"],
        "ROUTES": {"vision": ["openai", "anthropic"], "cheap": ["mock"]},
    }


def test_unset_and_blank_mean_nothing_configured() -> None:
    empty = {"DEFAULT_CHAIN": [], "ROUTES": {}}
    assert routing_from_env({}) == empty
    assert routing_from_env({"LLM_PROVIDER_CHAIN": "  ", "LLM_ROUTING_RULES": ""}) == empty


def test_whitespace_and_a_trailing_semicolon_are_tolerated() -> None:
    assert parse_provider_list("V", " openai , anthropic ") == ["openai", "anthropic"]
    assert parse_routes("V", " a = x , y ; b=z ; ") == {"a": ["x", "y"], "b": ["z"]}


def test_single_provider_is_a_one_provider_chain() -> None:
    assert routing_from_env({"LLM_PROVIDER": "openai"}) == routing_from_env(
        {"LLM_PROVIDER_CHAIN": "openai"}
    )
    # Both set and agreeing is fine; disagreeing is refused.
    assert routing_from_env({"LLM_PROVIDER": "a", "LLM_PROVIDER_CHAIN": "a,b"})[
        "DEFAULT_CHAIN"
    ] == ["a", "b"]


@pytest.mark.parametrize(
    ("environ", "variable", "bad_part"),
    [
        ({"LLM_PROVIDER_CHAIN": "openai,,anthropic"}, "LLM_PROVIDER_CHAIN", "'openai,,anthropic'"),
        ({"LLM_PROVIDER_CHAIN": "openai,"}, "LLM_PROVIDER_CHAIN", "'openai,'"),
        ({"LLM_PROVIDER_CHAIN": "openai,anth ropic"}, "LLM_PROVIDER_CHAIN", "'anth ropic'"),
        ({"LLM_PROVIDER_CHAIN": "openai;anthropic"}, "LLM_PROVIDER_CHAIN", "'openai;anthropic'"),
        ({"LLM_PROVIDER_CHAIN": "a,b,a"}, "LLM_PROVIDER_CHAIN", "'a'"),
        ({"LLM_PROVIDER": "openai,anthropic"}, "LLM_PROVIDER", "'openai,anthropic'"),
        ({"LLM_PROVIDER": "b", "LLM_PROVIDER_CHAIN": "a,b"}, "LLM_PROVIDER", "'b'"),
        ({"LLM_ROUTING_RULES": "vision"}, "LLM_ROUTING_RULES", "'vision'"),
        ({"LLM_ROUTING_RULES": "vision=openai;;cheap=mock"}, "LLM_ROUTING_RULES", "''"),
        ({"LLM_ROUTING_RULES": "vision="}, "LLM_ROUTING_RULES", "'vision='"),
        ({"LLM_ROUTING_RULES": "vi sion=openai"}, "LLM_ROUTING_RULES", "'vi sion=openai'"),
        ({"LLM_ROUTING_RULES": "a=x;a=y"}, "LLM_ROUTING_RULES", "'a=y'"),
        ({"LLM_ROUTING_RULES": "a=x,,y"}, "LLM_ROUTING_RULES", "'x,,y'"),
    ],
)
def test_malformed_values_name_the_variable_and_the_bad_part(
    environ: dict[str, str], variable: str, bad_part: str
) -> None:
    with pytest.raises(ImproperlyConfigured) as excinfo:
        routing_from_env(environ)
    message = str(excinfo.value)
    assert message.startswith(f"{variable}: ")
    assert f"(bad part: {bad_part})" in message


def test_malformed_value_fails_at_startup() -> None:
    env = clean_env(
        DJANGO_SETTINGS_MODULE="project.settings",
        DEBUG="true",
        LLM_ROUTING_RULES="vision=openai;cheap",
    )
    proc = manage("check", env=env)
    assert proc.returncode != 0
    assert "ImproperlyConfigured: LLM_ROUTING_RULES: expected route=provider" in proc.stderr
    assert "(bad part: 'cheap')" in proc.stderr


# --- what the router does with the seeds ----------------------------------------------


def _shape(routing: dict[str, Any]) -> dict[str, Any]:
    meta = dict(routing["routing_metadata"])
    for volatile in ("request_id",):
        meta.pop(volatile)
    for attempt in meta["attempts"]:
        attempt.pop("latency_ms")
    result = dict(routing["result"])
    result.pop("latency_ms")
    return {"result": result, "meta": meta}


@pytest.mark.django_db
def test_single_provider_routes_exactly_like_a_one_provider_chain() -> None:
    Provider.objects.create(name="staging", kind="mock", model="staging-1")
    runs = []
    for environ in ({"LLM_PROVIDER": "staging"}, {"LLM_PROVIDER_CHAIN": "staging"}):
        with override_settings(LLM_ROUTING=routing_from_env(environ)):
            runs.append(_shape(audit(task="t", input_text="same input").to_dict()))
    assert runs[0] == runs[1]
    assert runs[0]["meta"]["chain_name"] == "settings"
    assert runs[0]["meta"]["selected_provider"] == "staging"


@pytest.mark.django_db
def test_seeds_apply_only_where_the_database_is_silent() -> None:
    Provider.objects.create(name="env-a", kind="mock")
    Provider.objects.create(name="env-b", kind="mock")
    db_p = Provider.objects.create(name="db-p", kind="mock")
    seeds = routing_from_env({"LLM_PROVIDER_CHAIN": "env-a", "LLM_ROUTING_RULES": "vision=env-b"})
    with override_settings(LLM_ROUTING=seeds):
        meta = audit(task="t", input_text="x").metadata
        assert (meta.chain_name, meta.selected_provider) == ("settings", "env-a")
        meta = audit(task="t", input_text="x", route="vision").metadata
        assert (meta.chain_name, meta.selected_provider) == ("route:vision", "env-b")
        # A default chain in the database wins over LLM_PROVIDER_CHAIN …
        chain = Chain.objects.create(name="main", is_default=True)
        ChainEntry.objects.create(chain=chain, provider=db_p, position=0)
        meta = audit(task="t", input_text="x").metadata
        assert (meta.chain_name, meta.selected_provider) == ("main", "db-p")
        # … and a matching rule wins over LLM_ROUTING_RULES.
        RoutingRule.objects.create(name="vision", route="vision", chain=chain)
        meta = audit(task="t", input_text="x", route="vision").metadata
        assert (meta.router_mode, meta.selected_provider) == ("rule", "db-p")
