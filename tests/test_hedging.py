"""Hedged requests on both drivers, against the fake upstream (docs/strategies.md
"Hedging"): the hedge wins (the primary's connection closed on the event loop) or
loses, the first attempt fails while the hedge runs, a hedge skipped for the deadline
or the attempt budget, no hedge without ``hedge_after_ms``; the loser recorded as
``hedge_lost`` and never counted on its circuit; one decision row per request.

Delays are generous and only their order matters (primary 3 s against a hedge after
100 ms and a second candidate answering in 50 ms); nothing here times anything."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import override_settings

from llm_routing import balance, budgets, metrics
from llm_routing.models import Attempt, Budget, Chain, ChainEntry, Provider, RoutingDecision
from llm_routing.resilience import breaker
from llm_routing.router import route
from llm_routing.types import AuditRequest
from tests.conftest import upstream_fields
from tests.fakes.upstream import FakeUpstream, Faults
from tests.support import wait_for

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("driver", "key_env")]

REQUEST = AuditRequest(task="summarize", input_text="Hedge the slow ones.")


@pytest.fixture(autouse=True)
def _fresh_latencies() -> Iterator[None]:
    balance.reset()
    yield
    balance.reset()


#: Each candidate on its own vendor's fault queue: which request reaches the fake first
#: does not decide which fault it gets.
KINDS = {"a": "openai", "b": "anthropic", "c": "gemini"}


def chain(fake: FakeUpstream, hedge: str = "100", names: tuple[str, ...] = ("a", "b")) -> Chain:
    """A default chain of providers on the fake upstream (a: OpenAI, b: Anthropic, c:
    Gemini), each a step of its own, each provider's model its name."""
    row = Chain.objects.create(name="main", is_default=True, hedge_after_ms=hedge)
    for position, name in enumerate(names):
        fields = upstream_fields(name, KINDS[name], fake)
        fields.update({"model": name, "max_retries": 0})
        provider = Provider.objects.create(**fields)
        ChainEntry.objects.create(chain=row, provider=provider, position=position)
    return row


def called(fake: FakeUpstream) -> list[str]:
    """Who the fake upstream heard from, by name."""
    vendors = {"openai": "a", "anthropic": "b", "gemini": "c"}
    return sorted(vendors[r.vendor] for r in fake.requests)


def walk(routed: Any) -> list[tuple[str, str, str | None]]:
    return [(a.provider, a.outcome, a.reason) for a in routed.metadata.attempts]


def failures(name: str) -> int:
    return int(breaker.store.load(name, name).health(time.time())["consecutive_failures"])


def hedges(outcome: str) -> float:
    value = metrics.REGISTRY.get_sample_value(
        "llm_routing_hedges_total", {"chain": "main", "outcome": outcome}
    )
    return value or 0.0


def test_the_hedge_wins_and_the_primary_is_cancelled(
    fake_upstream: FakeUpstream, driver: str, settings: Any
) -> None:
    settings.LLM_ROUTING = {**settings.LLM_ROUTING, "METRICS_TOKEN": "t" * 32}
    chain(fake_upstream)
    fake_upstream.script("openai", Faults.slow(3.0, watch=True))
    fake_upstream.script("anthropic", Faults.slow(0.05))
    won = hedges("won")
    routed = route(REQUEST)
    assert routed.result.ok and routed.result.provider == "b"
    assert walk(routed) == [("a", "hedge_lost", "hedge_lost"), ("b", "ok", None)]
    assert routed.metadata.hedge == "won" and not routed.metadata.fallback_used
    assert called(fake_upstream) == ["a", "b"]
    # One decision, both attempts recorded; the loser is no failure of its circuit.
    decision = RoutingDecision.objects.get()
    rows = list(Attempt.objects.filter(decision=decision).order_by("index"))
    assert [(r.provider, r.outcome) for r in rows] == [("a", "hedge_lost"), ("b", "ok")]
    assert failures("a") == 0
    if driver == "async":  # the cancelled task closed the primary's connection
        assert wait_for(lambda: fake_upstream.disconnects == 1, 10.0), "primary left open"
    assert hedges("won") == won + 1


def test_the_hedge_loses_when_the_primary_answers_first(
    fake_upstream: FakeUpstream, driver: str, settings: Any
) -> None:
    settings.LLM_ROUTING = {**settings.LLM_ROUTING, "METRICS_TOKEN": "t" * 32}
    lost = hedges("lost")
    chain(fake_upstream)
    fake_upstream.script("openai", Faults.slow(0.6))
    fake_upstream.script("anthropic", Faults.slow(3.0, watch=True))
    routed = route(REQUEST)
    assert routed.result.provider == "a"
    assert walk(routed) == [("a", "ok", None), ("b", "hedge_lost", "hedge_lost")]
    assert routed.metadata.hedge == "lost" and hedges("lost") == lost + 1
    assert called(fake_upstream) == ["a", "b"]
    assert failures("b") == 0
    if driver == "async":
        assert wait_for(lambda: fake_upstream.disconnects == 1, 10.0), "hedge left open"


def test_a_primary_failing_while_the_hedge_runs_leaves_the_hedge_as_the_next_attempt(
    fake_upstream: FakeUpstream,
) -> None:
    chain(fake_upstream, names=("a", "b", "c"))
    failing = dataclasses.replace(Faults.unavailable("openai"), delay=0.3)
    fake_upstream.script("openai", failing)
    fake_upstream.script("anthropic", Faults.slow(1.0))
    routed = route(REQUEST)
    assert routed.result.provider == "b"
    assert [(p, o) for p, o, _ in walk(routed)] == [("a", "error"), ("b", "ok")]
    assert routed.metadata.hedge == "won"
    assert routed.metadata.fallback_used  # the primary failed: b is a fallback
    assert routed.metadata.fallback_reason == routed.metadata.attempts[0].reason
    assert called(fake_upstream) == ["a", "b"]  # no second call to b, none to c
    assert failures("a") == 1  # a real failure still counts


def test_no_hedge_when_the_deadline_cannot_afford_it(
    fake_upstream: FakeUpstream, settings: Any
) -> None:
    # At 600 ms, 400 ms are left: less than the hedge delay itself.
    settings.LLM_ROUTING = {**settings.LLM_ROUTING, "METRICS_TOKEN": "t" * 32}
    skipped = hedges("skipped")
    chain(fake_upstream, hedge="600")
    fake_upstream.script("openai", Faults.slow(3.0))
    with override_settings(LLM_ROUTING={**settings.LLM_ROUTING, "REQUEST_DEADLINE_S": 1.0}):
        routed = route(REQUEST)
    assert ("b", "hedge_skipped", "deadline") in walk(routed)
    assert routed.metadata.hedge == "skipped" and hedges("skipped") == skipped + 1
    assert called(fake_upstream) == ["a"]


def test_no_hedge_when_the_attempt_budget_is_spent(fake_upstream: FakeUpstream) -> None:
    chain(fake_upstream)
    fake_upstream.script("openai", Faults.slow(0.6))
    with override_settings(LLM_ROUTING={"MAX_ATTEMPTS": 1}):
        routed = route(REQUEST)
    assert routed.result.provider == "a"
    assert walk(routed) == [("a", "ok", None), ("b", "hedge_skipped", "attempt_budget")]
    assert routed.metadata.attempted_providers == ["a"]
    assert called(fake_upstream) == ["a"]


def test_no_hedge_without_hedge_after_ms(fake_upstream: FakeUpstream) -> None:
    chain(fake_upstream, hedge="")
    fake_upstream.script("openai", Faults.slow(0.6))
    routed = route(REQUEST)
    assert walk(routed) == [("a", "ok", None)]
    assert routed.metadata.hedge is None
    assert called(fake_upstream) == ["a"]


def test_p95_hedges_only_once_the_primary_has_enough_samples(
    fake_upstream: FakeUpstream,
) -> None:
    chain(fake_upstream, hedge="p95")
    fake_upstream.script("openai", Faults.slow(0.3))
    assert walk(route(REQUEST)) == [("a", "ok", None)]  # no p95 yet: no hedge
    for _ in range(balance.P95_MIN_SAMPLES):
        balance.observe_answer("a", 100.0)
    fake_upstream.script("openai", Faults.slow(3.0, watch=True))
    fake_upstream.script("anthropic", Faults.slow(0.05))
    routed = route(REQUEST)
    assert walk(routed) == [("a", "hedge_lost", "hedge_lost"), ("b", "ok", None)]


def test_a_chain_of_one_never_hedges(fake_upstream: FakeUpstream) -> None:
    chain(fake_upstream, names=("a",))
    fake_upstream.script("openai", Faults.slow(0.4))
    routed = route(REQUEST)
    assert walk(routed) == [("a", "ok", None)]  # the mock backstop is never a hedge
    assert routed.metadata.hedge is None


def test_a_hedged_request_is_one_decision_charged_once(
    api: Any, fake_upstream: FakeUpstream, driver: str
) -> None:
    # Through /audit/: one decision row, one request against the budget, and the tokens
    # of the answer that served (the cancelled loser reported none).
    if driver == "async":
        pytest.skip("the API view picks its own driver")
    Budget.objects.create(name="cap", scope="user", subject="alice", max_requests=100,
                          max_tokens=100_000, window="day")  # fmt: skip
    chain(fake_upstream)
    fake_upstream.script("openai", Faults.slow(3.0, watch=True))
    fake_upstream.script("anthropic", Faults.slow(0.05))
    answer = api.post(
        "/audit/",
        data=json.dumps({"task": "summarize", "input_text": "Hedge the slow ones."}),
        content_type="application/json",
    )
    assert answer.status_code == 200, answer.content
    envelope = answer.json()
    usage = envelope["result"]["usage"]
    assert envelope["result"]["provider"] == "b" and envelope["routing_metadata"]["hedge"] == "won"
    outcomes = [(a["provider"], a["outcome"]) for a in envelope["routing_metadata"]["attempts"]]
    assert outcomes == [("a", "hedge_lost"), ("b", "ok")]
    assert RoutingDecision.objects.count() == 1
    assert Attempt.objects.filter(outcome="hedge_lost", provider="a").count() == 1
    used = budgets.usage([Budget.objects.get(name="cap")])["cap"]
    assert used.requests == 1
    assert used.tokens == usage["input_tokens"] + usage["output_tokens"] > 0


@pytest.fixture
def admitted() -> Iterator[None]:
    """This test's request admitted by its budgets (as the views do before the walk);
    its grant forgotten afterwards."""
    budgets.reset_cache_state()
    yield
    budgets.forget()


def admit() -> None:
    assert budgets.check(None) is None


# "Hedge the slow ones." is 20 characters: 5 input tokens, and 256 output tokens assumed
# (no max_tokens): an estimate of 261 tokens per call, 522 for the primary and a hedge.


@pytest.mark.parametrize("cap", [{"max_tokens": 10_000}, {"max_cost_usd": "10"}])
def test_a_cap_with_room_for_both_calls_lets_the_hedge_run(
    fake_upstream: FakeUpstream, admitted: None, cap: dict[str, Any]
) -> None:
    chain(fake_upstream)
    Provider.objects.filter(name="b").update(
        input_price_per_mtok=1000, output_price_per_mtok=1000
    )  # 261 tokens at $1000 per million: $0.261
    Budget.objects.create(name="cap", scope="global", **cap)
    fake_upstream.script("openai", Faults.slow(3.0, watch=True))
    fake_upstream.script("anthropic", Faults.slow(0.05))
    admit()
    routed = route(REQUEST)
    assert walk(routed) == [("a", "hedge_lost", "hedge_lost"), ("b", "ok", None)]
    assert routed.metadata.hedge == "won"


@pytest.mark.parametrize(
    "cap",
    [
        {"max_tokens": 500},  # room for one call (261), not two (522)
        {"max_cost_usd": "0.2"},  # the hedge alone is estimated at $0.261
        {"max_tokens": 10_000, "max_cost_usd": "0.2"},
    ],
)
def test_a_cap_without_room_for_the_hedge_skips_it(
    fake_upstream: FakeUpstream, admitted: None, cap: dict[str, Any], settings: Any
) -> None:
    settings.LLM_ROUTING = {**settings.LLM_ROUTING, "METRICS_TOKEN": "t" * 32}
    skipped = hedges("skipped")
    chain(fake_upstream)
    Provider.objects.filter(name="b").update(input_price_per_mtok=1000, output_price_per_mtok=1000)
    Budget.objects.create(name="cap", scope="global", **cap)
    fake_upstream.script("openai", Faults.slow(0.6))
    admit()
    routed = route(REQUEST)
    assert routed.result.ok and routed.result.provider == "a"  # the primary, alone
    assert walk(routed) == [("a", "ok", None), ("b", "hedge_skipped", "cost_cap")]
    assert routed.metadata.hedge == "skipped" and hedges("skipped") == skipped + 1
    assert called(fake_upstream) == ["a"]


def test_an_unpriced_hedge_fits_any_cost_cap(fake_upstream: FakeUpstream, admitted: None) -> None:
    # b's price is unknown (its model "b" is in no price list): budgets charge it 0.
    chain(fake_upstream)
    Budget.objects.create(name="cap", scope="global", max_cost_usd="0.000001")
    fake_upstream.script("openai", Faults.slow(3.0, watch=True))
    fake_upstream.script("anthropic", Faults.slow(0.05))
    admit()
    routed = route(REQUEST)
    assert walk(routed) == [("a", "hedge_lost", "hedge_lost"), ("b", "ok", None)]


def test_a_request_cap_alone_does_not_bound_the_hedge(
    fake_upstream: FakeUpstream, admitted: None
) -> None:
    chain(fake_upstream)
    Budget.objects.create(name="cap", scope="global", max_requests=1)
    fake_upstream.script("openai", Faults.slow(3.0, watch=True))
    fake_upstream.script("anthropic", Faults.slow(0.05))
    admit()
    assert budgets.room() is None
    routed = route(REQUEST)
    assert walk(routed) == [("a", "hedge_lost", "hedge_lost"), ("b", "ok", None)]
