"""The router over real adapters and the fake upstream: failover order, stops, budgets.

For every attempted candidate, ``retries + 1`` equals the number of requests that
upstream saw (checked against the fake server's request log and the Attempt rows).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.test import override_settings

from llm_routing.models import Attempt, RoutingDecision
from llm_routing.router import route
from llm_routing.types import AuditRequest, RoutingResult
from tests.conftest import Sleeps
from tests.fakes.upstream import FakeUpstream, Faults

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("driver")]

REQUEST = AuditRequest(task="summarize", input_text="Some input text.")


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_PROVIDER_KEY", "sk-router-test-123456")


def attempts(routed: RoutingResult) -> list[tuple[str, str, str | None, int]]:
    return [(a.provider, a.outcome, a.error_category, a.retries) for a in routed.metadata.attempts]


def assert_rows_match_upstream(
    routed: RoutingResult, fake: FakeUpstream, vendors: dict[str, str]
) -> None:
    """Attempt rows written == routing metadata, and retries + 1 == requests seen."""
    decision = RoutingDecision.objects.get(request_id=routed.request_id)
    rows = list(decision.attempts.order_by("index"))
    assert [(r.provider, r.outcome, r.error_category or None, r.retries) for r in rows] == attempts(
        routed
    )
    for row in rows:
        if row.outcome == "skipped" or row.provider == "mock":
            continue
        assert row.retries + 1 == len(fake.requests_for(vendors[row.provider])), row.provider


def test_failover_order_across_vendors(
    fake_upstream: FakeUpstream, upstream_chain: Callable[..., list[Any]]
) -> None:
    upstream_chain(
        ("oc", "openai_compatible", {}),
        ("an", "anthropic", {}),
        ("ge", "gemini", {}),
    )
    fake_upstream.script("openai", *[Faults.unavailable("openai", 503)] * 3)
    fake_upstream.script("anthropic", Faults.rate_limit("anthropic", retry_after="60"))
    sleeps = Sleeps()
    routed = route(REQUEST, sleeper=sleeps)

    assert routed.result.ok and routed.result.provider == "ge"
    assert routed.result.model == "gemini-model-fake"
    assert attempts(routed) == [
        ("oc", "error", "unavailable", 2),
        ("an", "error", "rate_limit", 0),
        ("ge", "ok", None, 0),
    ]
    assert routed.metadata.fallback_used and routed.metadata.fallback_reason == "unavailable"
    assert [r.vendor for r in fake_upstream.requests] == ["openai"] * 3 + ["anthropic", "gemini"]
    assert len(sleeps) == 2  # two backoffs on "oc"; the over-cap Retry-After sleeps never
    assert_rows_match_upstream(
        routed, fake_upstream, {"oc": "openai", "an": "anthropic", "ge": "gemini"}
    )
    http = [a.http_status for a in routed.metadata.attempts]
    assert http == [503, 429, None]


def test_context_length_advances_without_retry(
    fake_upstream: FakeUpstream, upstream_chain: Callable[..., list[Any]]
) -> None:
    upstream_chain(("oa", "openai", {}), ("an", "anthropic", {}))
    fake_upstream.script("openai", Faults.context_length("openai"))
    routed = route(REQUEST, sleeper=Sleeps())
    assert routed.result.provider == "an" and routed.result.ok
    assert attempts(routed)[0] == ("oa", "error", "context_length", 0)
    assert routed.metadata.attempts[0].transient is False
    assert_rows_match_upstream(routed, fake_upstream, {"oa": "openai", "an": "anthropic"})


@pytest.mark.parametrize(
    "fault, category",
    [
        (lambda: Faults.auth("anthropic"), "authentication"),
        (lambda: Faults.invalid_request("anthropic"), "invalid_request"),
        (lambda: Faults.content_policy("anthropic"), "content_policy"),
        (lambda: Faults.malformed(), "response"),
    ],
)
def test_permanent_errors_stop_the_walk(
    fault: Callable[[], Any],
    category: str,
    fake_upstream: FakeUpstream,
    upstream_chain: Callable[..., list[Any]],
) -> None:
    upstream_chain(("an", "anthropic", {}), ("ge", "gemini", {}))
    fake_upstream.script("anthropic", fault())
    sleeps = Sleeps()
    routed = route(REQUEST, sleeper=sleeps)
    assert routed.result.status == "error" and routed.result.mode == "error"
    assert routed.result.error is not None and routed.result.error.category == category
    assert attempts(routed) == [("an", "error", category, 0)]
    assert fake_upstream.requests_for("gemini") == []
    assert sleeps == []
    assert_rows_match_upstream(routed, fake_upstream, {"an": "anthropic"})


def test_timeout_fails_over_at_once(
    fake_upstream: FakeUpstream, upstream_chain: Callable[..., list[Any]]
) -> None:
    upstream_chain(("ge", "gemini", {"timeout_s": 0.3}), ("oa", "openai", {}))
    fake_upstream.script("gemini", Faults.hang())
    sleeps = Sleeps()
    routed = route(REQUEST, sleeper=sleeps)
    assert routed.result.provider == "oa"
    assert attempts(routed)[0] == ("ge", "error", "timeout", 0)
    assert sleeps == []
    assert_rows_match_upstream(routed, fake_upstream, {"ge": "gemini", "oa": "openai"})


def test_exhausted_chain_is_served_by_the_mock(
    fake_upstream: FakeUpstream, upstream_chain: Callable[..., list[Any]]
) -> None:
    upstream_chain(("oa", "openai", {"max_retries": 0}), ("an", "anthropic", {"max_retries": 1}))
    fake_upstream.script("openai", Faults.reset())
    fake_upstream.script("anthropic", Faults.overloaded(), Faults.overloaded())
    routed = route(REQUEST, sleeper=Sleeps())
    assert routed.result.provider == "mock" and routed.result.mode == "mock"
    assert routed.metadata.fallback_reason == "chain_exhausted"
    assert attempts(routed) == [
        ("oa", "error", "network", 0),
        ("an", "error", "unavailable", 1),
        ("mock", "ok", None, 0),
    ]
    assert_rows_match_upstream(routed, fake_upstream, {"oa": "openai", "an": "anthropic"})


@override_settings(LLM_ROUTING={"MAX_ATTEMPTS": 3})
def test_one_attempt_budget_spans_retries_and_candidates(
    fake_upstream: FakeUpstream, upstream_chain: Callable[..., list[Any]]
) -> None:
    upstream_chain(
        ("oa", "openai", {"max_retries": 2}),
        ("an", "anthropic", {"max_retries": 2}),
        ("ge", "gemini", {}),
    )
    fake_upstream.script("openai", *[Faults.unavailable("openai")] * 3)
    fake_upstream.script("anthropic", *[Faults.overloaded()] * 3)
    routed = route(REQUEST, sleeper=Sleeps())
    # 3 upstream requests in all: oa used them; an and ge are skipped, the mock answers.
    assert len(fake_upstream.requests) == 3
    assert attempts(routed) == [
        ("oa", "error", "unavailable", 2),
        ("an", "skipped", None, 0),
        ("ge", "skipped", None, 0),
        ("mock", "ok", None, 0),
    ]
    assert [a.reason for a in routed.metadata.attempts[1:3]] == ["budget_exhausted"] * 2
    assert routed.result.provider == "mock"
    assert_rows_match_upstream(routed, fake_upstream, {"oa": "openai"})


def test_structured_output_needs_the_capability(
    fake_upstream: FakeUpstream, upstream_chain: Callable[..., list[Any]]
) -> None:
    upstream_chain(
        ("oa", "openai", {"supports_structured_output": False}),
        ("an", "anthropic", {}),
    )
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    request = AuditRequest(task="t", input_text="x", response_schema=schema)
    routed = route(request, sleeper=Sleeps())
    assert routed.metadata.skipped_providers == [{"provider": "oa", "reason": "unsupported"}]
    assert routed.result.provider == "an" and routed.result.data == {"ok": False}
    assert fake_upstream.requests_for("openai") == []
    assert Attempt.objects.filter(provider="oa", outcome="skipped").count() == 1


def test_missing_key_is_skipped_without_a_request(
    fake_upstream: FakeUpstream, upstream_chain: Callable[..., list[Any]]
) -> None:
    upstream_chain(("oa", "openai", {"api_key_env": "UNSET_PROVIDER_KEY"}), ("ge", "gemini", {}))
    routed = route(REQUEST, sleeper=Sleeps())
    assert routed.metadata.skipped_providers == [{"provider": "oa", "reason": "missing_key"}]
    assert routed.result.provider == "ge"
    assert fake_upstream.requests_for("openai") == []
