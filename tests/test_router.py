"""Router semantics (the routing walk in docs/architecture.md): modes, skip reasons, dedup,
mock-last, rules, forced."""

from __future__ import annotations

import pytest
from django.test import override_settings

from llm_routing.errors import (
    AuthenticationError,
    ContextLengthError,
    InvalidRequestError,
    UnavailableError,
)
from llm_routing.models import Attempt, RoutingDecision, RoutingRule
from llm_routing.router import resolve, route, route_stream
from llm_routing.types import AuditRequest, StreamResult

from .conftest import make_chain, make_provider

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("driver")]

SCHEMA = {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]}


def req(**kw: object) -> AuditRequest:
    kw.setdefault("task", "summarize")
    kw.setdefault("input_text", "some input")
    return AuditRequest(**kw)  # type: ignore[arg-type]


def skips(routed) -> list[tuple[str, str]]:
    return [(s["provider"], s["reason"]) for s in routed.metadata.skipped_providers]


def test_default_chain_served_by_primary(scripted, key_env):
    a, b = make_provider("a"), make_provider("b")
    make_chain("main", [a, b], is_default=True)
    routed = route(req())
    m = routed.metadata
    assert m.router_mode == "default"
    assert m.chain_name == "main"
    assert m.chain == ("a", "b", "mock")
    assert routed.result.provider == "a" and routed.result.mode == "live"
    assert routed.result.status == "ok"
    assert m.fallback_used is False and m.fallback_reason is None
    assert [c[0] for c in scripted.calls] == ["a"]
    # the key was read at call time and handed to the adapter
    assert scripted.calls[0][1] == key_env


def test_missing_key_and_disabled_skip_to_mock(scripted, monkeypatch):
    monkeypatch.delenv("TEST_PROVIDER_KEY", raising=False)
    a = make_provider("a")
    b = make_provider("b", enabled=False)
    make_chain("main", [a, b], is_default=True)
    routed = route(req())
    assert skips(routed) == [("a", "missing_key"), ("b", "disabled")]
    assert routed.result.provider == "mock" and routed.result.mode == "mock"
    assert routed.metadata.fallback_used is True
    assert routed.metadata.fallback_reason == "missing_key"
    assert routed.metadata.attempted_providers == ["mock"]
    assert scripted.calls == []


def test_empty_key_counts_as_missing(scripted, monkeypatch):
    monkeypatch.setenv("TEST_PROVIDER_KEY", "")
    make_chain("main", [make_provider("a")], is_default=True)
    assert skips(route(req())) == [("a", "missing_key")]


def test_keyless_kind_needs_no_key(scripted, monkeypatch):
    monkeypatch.delenv("TEST_PROVIDER_KEY", raising=False)
    make_chain("main", [make_provider("local", kind="scripted_keyless")], is_default=True)
    routed = route(req())
    assert routed.result.provider == "local"


def test_unknown_provider_in_explicit_mode(scripted, key_env):
    make_chain("main", [make_provider("a")], is_default=True)
    routed = route(req(provider="nope"))
    assert routed.metadata.router_mode == "explicit"
    assert routed.metadata.requested_provider == "nope"
    assert routed.metadata.chain == ("nope", "a", "mock")
    assert skips(routed) == [("nope", "unknown_provider")]
    assert routed.result.provider == "a"
    assert routed.metadata.fallback_reason == "unknown_provider"


def test_explicit_provider_goes_first_and_is_deduplicated(scripted, key_env):
    a, b = make_provider("a"), make_provider("b")
    make_chain("main", [a, b], is_default=True)
    routed = route(req(provider="b"))
    assert routed.metadata.chain == ("b", "a", "mock")
    assert routed.result.provider == "b"
    assert routed.metadata.fallback_used is False


def test_mock_is_always_last(scripted, key_env):
    mock = make_provider("mock", kind="mock", api_key_env="")
    a = make_provider("a")
    make_chain("main", [mock, a], is_default=True)
    routed = route(req())
    assert routed.metadata.chain == ("a", "mock")
    assert routed.result.provider == "a"


def test_unknown_kind_row_is_skipped_not_crashing(scripted, key_env):
    make_chain("main", [make_provider("weird", kind="no-such-kind")], is_default=True)
    routed = route(req())
    assert skips(routed) == [("weird", "unknown_provider")]
    assert routed.result.provider == "mock"


def test_unsupported_capability_is_skipped(scripted, key_env):
    a = make_provider("a")  # supports_structured_output defaults to False
    b = make_provider("b", supports_structured_output=True)
    make_chain("main", [a, b], is_default=True)
    routed = route(req(response_schema=SCHEMA))
    assert skips(routed) == [("a", "unsupported")]
    assert routed.result.provider == "b"


def test_mock_answers_structured_output_with_valid_data(scripted, key_env):
    routed = route(req(response_schema=SCHEMA))
    assert routed.result.provider == "mock"
    assert routed.result.data == {"x": "mock"}


def test_rule_mode_by_route_and_priority(scripted, key_env):
    a, b, c = make_provider("a"), make_provider("b"), make_provider("c")
    make_chain("main", [a], is_default=True)
    chain_b = make_chain("chain-b", [b])
    chain_c = make_chain("chain-c", [c])
    RoutingRule.objects.create(name="low", priority=50, route="vision", chain=chain_b)
    RoutingRule.objects.create(name="high", priority=10, route="vision", chain=chain_c)
    routed = route(req(route="vision"))
    assert routed.metadata.router_mode == "rule"
    assert routed.metadata.rule == "high"
    assert routed.metadata.chain_name == "chain-c"
    assert routed.result.provider == "c"
    # no route → no rule matches → default chain
    other = route(req())
    assert other.metadata.router_mode == "default" and other.result.provider == "a"


def test_a_rule_whose_chain_the_caller_may_not_use_does_not_apply_to_them(
    scripted, key_env, django_user_model
):
    """The rule's chain is limited to a group: for a principal outside it the rule does
    not exist (default chain); for a member, or trusted code (no principal), it applies."""
    from django.contrib.auth.models import Group

    from llm_routing.types import Principal

    a, b = make_provider("a"), make_provider("b")
    make_chain("main", [a], is_default=True)
    vip_chain = make_chain("vip-chain", [b])
    vips = Group.objects.create(name="vips")
    vip_chain.allowed_groups.add(vips)
    RoutingRule.objects.create(name="to-vip", priority=10, route="gold", chain=vip_chain)
    outsider = Principal(user_id=1)
    member = Principal(user_id=2, group_ids=frozenset({vips.pk}))
    denied = route(req(route="gold", principal=outsider))
    assert denied.metadata.router_mode == "default" and denied.metadata.rule is None
    assert denied.result.provider == "a"
    for principal in (member, None):
        allowed = route(req(route="gold", principal=principal))
        assert allowed.metadata.rule == "to-vip" and allowed.result.provider == "b"


def test_rule_task_glob_and_disabled_rule(scripted, key_env):
    a, b = make_provider("a"), make_provider("b")
    make_chain("main", [a], is_default=True)
    chain_b = make_chain("chain-b", [b])
    rule = RoutingRule.objects.create(name="sum", priority=1, task_glob="summ*", chain=chain_b)
    assert route(req(task="summarize")).result.provider == "b"
    assert route(req(task="classify")).result.provider == "a"
    rule.enabled = False
    rule.save()
    assert route(req(task="summarize")).result.provider == "a"


def test_rule_with_route_and_glob_needs_both(scripted, key_env):
    a, b = make_provider("a"), make_provider("b")
    make_chain("main", [a], is_default=True)
    RoutingRule.objects.create(
        name="both", route="vision", task_glob="describe*", chain=make_chain("cb", [b])
    )
    assert route(req(task="describe-image", route="vision")).result.provider == "b"
    assert route(req(task="summarize", route="vision")).result.provider == "a"


def test_chain_entry_model_override_and_disabled_entry(scripted, key_env):
    a, b = make_provider("a"), make_provider("b")
    chain = make_chain("main", [a, b], is_default=True)
    chain.entries.filter(provider=a).update(enabled=False)
    chain.entries.filter(provider=b).update(model="b-large")
    routed = route(req())
    assert routed.metadata.chain == ("b", "mock")
    assert routed.result.provider == "b" and routed.result.model == "b-large"


def test_default_chain_setting_when_db_has_none(scripted, key_env):
    make_provider("a")
    with override_settings(LLM_ROUTING={"DEFAULT_CHAIN": ["a"]}):
        routed = route(req())
    assert routed.metadata.chain_name == "settings"
    assert routed.metadata.chain == ("a", "mock")
    assert routed.result.provider == "a"


def test_routes_setting_used_when_no_rule_matches(scripted, key_env):
    make_provider("a"), make_provider("b")
    with override_settings(LLM_ROUTING={"DEFAULT_CHAIN": ["a"], "ROUTES": {"cheap": ["b"]}}):
        assert route(req(route="cheap")).result.provider == "b"
        assert route(req(route="other")).result.provider == "a"


def test_nothing_configured_mock_answers_with_reason(scripted):
    routed = route(req())
    assert routed.metadata.chain == ("mock",)
    assert routed.result.provider == "mock" and routed.result.status == "ok"
    assert routed.metadata.fallback_used is True
    assert routed.metadata.fallback_reason == "no_chain"


def test_transient_failure_advances_and_is_recorded(scripted, key_env):
    a, b = make_provider("a", max_retries=0), make_provider("b")
    make_chain("main", [a, b], is_default=True)
    scripted.scripts["a"] = [UnavailableError("down", http_status=503)]
    routed = route(req(), sleeper=lambda s: None)
    assert routed.result.provider == "b"
    assert routed.metadata.attempted_providers == ["a", "b"]
    first = routed.metadata.attempts[0]
    assert (first.outcome, first.error_category, first.http_status, first.transient) == (
        "error",
        "unavailable",
        503,
        True,
    )
    assert routed.metadata.fallback_reason == "unavailable"


def test_all_candidates_fail_transiently_mock_backstop_chain_exhausted(scripted, key_env):
    a, b = make_provider("a", max_retries=0), make_provider("b", max_retries=0)
    make_chain("main", [a, b], is_default=True)
    scripted.scripts["a"] = [UnavailableError()]
    scripted.scripts["b"] = [UnavailableError()]
    routed = route(req(), sleeper=lambda s: None)
    assert routed.result.provider == "mock"
    assert routed.metadata.fallback_reason == "chain_exhausted"


def test_context_length_advances(scripted, key_env):
    a, b = make_provider("a"), make_provider("b")
    make_chain("main", [a, b], is_default=True)
    scripted.scripts["a"] = [ContextLengthError(http_status=400)]
    routed = route(req())
    assert routed.result.provider == "b"
    assert [c[0] for c in scripted.calls] == ["a", "b"]


@pytest.mark.parametrize("error", [AuthenticationError(http_status=401), InvalidRequestError()])
def test_permanent_error_stops_the_walk(scripted, key_env, error):
    a, b = make_provider("a"), make_provider("b")
    make_chain("main", [a, b], is_default=True)
    scripted.scripts["a"] = [error]
    routed = route(req())
    assert routed.result.status == "error" and routed.result.mode == "error"
    assert routed.result.error is not None
    assert routed.result.error.category == error.category
    assert [c[0] for c in scripted.calls] == ["a"]  # b never touched, no mock substitution
    assert routed.metadata.selected_provider == "a"


def test_adapter_bug_never_escapes(scripted, key_env):
    make_chain("main", [make_provider("a")], is_default=True)
    scripted.scripts["a"] = [RuntimeError("boom sk-canary")]
    routed = route(req())
    assert routed.result.status == "error"
    assert routed.result.error.category == "response"
    assert "boom" not in routed.result.error.message


def test_forced_mode_uses_exactly_that_provider(scripted, key_env):
    a, _b = make_provider("a"), make_provider("b")
    make_chain("main", [a], is_default=True)
    routed = route(req(force_provider="b"))
    assert routed.metadata.router_mode == "forced"
    assert routed.metadata.chain == ("b",)
    assert routed.result.provider == "b"
    assert routed.metadata.fallback_used is False


def test_forced_mode_with_disabled_provider_returns_safe_result(scripted, key_env):
    make_provider("a", enabled=False)
    routed = route(req(force_provider="a"))
    assert routed.result.provider == "a"
    assert (routed.result.mode, routed.result.status) == ("disabled", "fallback")
    assert routed.result.error.category == "disabled"
    assert scripted.calls == []
    assert routed.metadata.attempts[0].outcome == "skipped"


def test_forced_mode_missing_key_and_unknown(scripted, monkeypatch):
    monkeypatch.delenv("TEST_PROVIDER_KEY", raising=False)
    make_provider("a")
    missing = route(req(force_provider="a"))
    assert (missing.result.mode, missing.result.status) == ("disabled", "fallback")
    assert missing.result.error.category == "missing_key"
    unknown = route(req(force_provider="ghost"))
    assert (unknown.result.mode, unknown.result.status) == ("error", "error")
    assert unknown.result.error.category == "unknown_provider"


def test_forced_mode_does_not_fail_over(scripted, key_env):
    make_provider("a", max_retries=0)
    scripted.scripts["a"] = [UnavailableError(http_status=503)]
    routed = route(req(force_provider="a"), sleeper=lambda s: None)
    assert routed.result.status == "error" and routed.result.provider == "a"
    assert routed.metadata.chain == ("a",)


def test_resolve_dedups_chain_duplicates(scripted, key_env):
    a = make_provider("a")
    with override_settings(LLM_ROUTING={"DEFAULT_CHAIN": ["a", "a", "mock", "b", "a"]}):
        plan = resolve(req())
    assert plan.names == ("a", "b", "mock")
    assert a.name == "a"


def test_every_candidate_considered_gets_exactly_one_row(scripted, key_env, monkeypatch):
    a = make_provider("a", enabled=False)
    b = make_provider("b", max_retries=0)
    c = make_provider("c")
    make_chain("main", [a, b, c], is_default=True)
    scripted.scripts["b"] = [UnavailableError()]
    routed = route(req(), sleeper=lambda s: None)
    decision = RoutingDecision.objects.get(request_id=routed.request_id)
    rows = list(decision.attempts.values_list("index", "provider", "outcome", "reason", "served"))
    assert rows == [
        (0, "a", "skipped", "disabled", False),
        (1, "b", "error", "unavailable", False),
        (2, "c", "ok", "", True),
    ]
    assert Attempt.objects.count() == 3  # mock (not reached) has no row


def test_well_formed_requests_never_raise(scripted, key_env):
    """A grab-bag of odd but well-formed requests: the router always answers."""
    make_chain("main", [make_provider("a")], is_default=True)
    for r in [
        req(provider="mock"),
        req(force_provider="mock"),
        req(route="nothing-matches"),
        req(input_text="x" * 10_000, instructions="y" * 1000),
        req(response_schema={"type": "array", "items": {"type": "integer"}, "minItems": 2}),
    ]:
        routed = route(r)
        assert routed.result.status in {"ok", "fallback", "error"}


def test_unimportable_mock_kind_override_never_raises(scripted, caplog):
    # issue 11: route() raised AssertionError (an assert on a reachable path).
    from llm_routing.providers.registry import clear_adapter_cache

    clear_adapter_cache()
    with override_settings(LLM_ROUTING={"PROVIDER_KINDS": {"mock": "no.such.module.Mock"}}):
        routed = route(req())
        streamed = list(route_stream(req(stream=True)))
    clear_adapter_cache()
    assert routed.result.provider == "mock" and routed.result.status == "ok"
    assert routed.result.mode == "mock"
    assert isinstance(streamed[-1], StreamResult)
    assert streamed[-1].routed.result.status == "ok"
    assert "Cannot build adapter for provider mock" in caplog.text
