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

from llm_routing import balance, budgets, metrics, strategies
from llm_routing.models import Attempt, Budget, Chain, ChainEntry, Provider, RoutingDecision
from llm_routing.resilience import breaker
from llm_routing.router import route
from llm_routing.types import AuditRequest, Principal
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


# --- which candidate a hedge takes, and what the walk records of it --------------------


def provider(fake: FakeUpstream, name: str, kind: str | None = None, **fields: Any) -> Provider:
    """A provider row on the fake upstream (its vendor from :data:`KINDS` unless
    ``kind`` says), its model its name, no retries."""
    values = upstream_fields(name, kind or KINDS[name], fake)
    values.update({"model": name, "max_retries": 0, **fields})
    return Provider.objects.create(**values)


def entry(row: Chain, position: int, provider: Provider, **fields: Any) -> ChainEntry:
    return ChainEntry.objects.create(chain=row, provider=provider, position=position, **fields)


def attempts(routed: Any) -> list[dict[str, Any]]:
    """The attempt rows as the caller reads them (latency as a flag: ran or not)."""
    rows = []
    for a in routed.metadata.attempts:
        rows.append({"provider": a.provider, "model": a.model, "step": a.step,
                     "outcome": a.outcome, "reason": a.reason, "served": a.served,
                     "ran": a.latency_ms > 0})  # fmt: skip
    return rows


def test_the_loser_is_recorded_with_its_model_step_and_run_time(
    fake_upstream: FakeUpstream,
) -> None:
    chain(fake_upstream)
    fake_upstream.script("openai", Faults.slow(3.0, watch=True))
    fake_upstream.script("anthropic", Faults.slow(0.05))
    routed = route(REQUEST)
    assert attempts(routed) == [
        {"provider": "a", "model": "a", "step": 0, "outcome": "hedge_lost",
         "reason": "hedge_lost", "served": False, "ran": True},
        {"provider": "b", "model": "b-fake", "step": 1, "outcome": "ok", "reason": None,
         "served": True, "ran": True},  # the model the upstream answered with
    ]  # fmt: skip
    fake_upstream.script("openai", Faults.slow(0.6))
    fake_upstream.script("anthropic", Faults.slow(3.0, watch=True))
    loser = attempts(route(REQUEST))[1]
    assert loser == {"provider": "b", "model": "b", "step": 1, "outcome": "hedge_lost",
                     "reason": "hedge_lost", "served": False, "ran": True}  # fmt: skip


def test_a_skipped_hedge_is_recorded_in_its_step_without_a_call(
    fake_upstream: FakeUpstream,
) -> None:
    chain(fake_upstream)
    fake_upstream.script("openai", Faults.slow(0.6))
    with override_settings(LLM_ROUTING={"MAX_ATTEMPTS": 1}):
        routed = route(REQUEST)
    # No call was made, so no model was sent and nothing ran.
    assert attempts(routed)[1] == {
        "provider": "b", "model": "", "step": 1, "outcome": "hedge_skipped",
        "reason": "attempt_budget", "served": False, "ran": False,
    }  # fmt: skip


def test_the_hedge_sends_its_chain_entry_model(fake_upstream: FakeUpstream) -> None:
    row = Chain.objects.create(name="main", is_default=True, hedge_after_ms="100")
    entry(row, 0, provider(fake_upstream, "a"), model="a-large")
    entry(row, 1, provider(fake_upstream, "b"), model="b-large")
    fake_upstream.script("openai", Faults.slow(3.0, watch=True))
    fake_upstream.script("anthropic", Faults.slow(0.05))
    routed = route(REQUEST)
    assert routed.result.provider == "b" and routed.metadata.hedge == "won"
    assert [r.json["model"] for r in fake_upstream.requests_for("anthropic")] == ["b-large"]
    assert [(a["provider"], a["model"], a["outcome"]) for a in attempts(routed)] == [
        ("a", "a-large", "hedge_lost"),
        ("b", "b-large-fake", "ok"),  # the model the upstream answered with
    ]


def _weighted_order(names: list[str], seed: str) -> list[str]:
    step = [strategies.Candidate(n) for n in names]
    return [c.name for c in strategies.order("weighted", step, step=0, seed=seed)[0]]


def test_the_hedge_is_the_next_member_of_a_strategy_step(fake_upstream: FakeUpstream) -> None:
    row = Chain.objects.create(name="main", is_default=True, hedge_after_ms="100")
    for position, name in enumerate(("a", "b")):
        entry(row, position, provider(fake_upstream, name), step=0, strategy="weighted")
    request_id = "00000000-0000-4000-8000-000000000007"
    first, second = _weighted_order(["a", "b"], request_id)
    vendor = KINDS[first]
    fake_upstream.script(vendor, Faults.slow(3.0, watch=True))
    routed = route(REQUEST, request_id=request_id)
    assert routed.metadata.picks[0]["order"] == [first, second]
    assert routed.result.provider == second and routed.metadata.hedge == "won"
    assert [(a["provider"], a["step"], a["outcome"]) for a in attempts(routed)] == [
        (first, 0, "hedge_lost"),
        (second, 0, "ok"),
    ]


def test_a_drained_candidate_is_never_the_hedge(fake_upstream: FakeUpstream) -> None:
    row = Chain.objects.create(name="main", is_default=True, hedge_after_ms="100")
    entry(row, 0, provider(fake_upstream, "a"), step=0, strategy="weighted", weight=1.0)
    entry(row, 1, provider(fake_upstream, "b"), step=0, strategy="weighted", weight=0.0)
    fake_upstream.script("openai", Faults.slow(0.6))
    routed = route(REQUEST)
    assert routed.result.provider == "a" and routed.metadata.hedge is None
    assert called(fake_upstream) == ["a"]  # b (weight 0) is no hedge


def test_a_hedge_passes_over_a_window_that_already_failed_for_length(
    fake_upstream: FakeUpstream,
) -> None:
    # The first candidate fails for length at once; the second is slow, and its hedge
    # may not be a candidate whose context window is no larger than the one that failed.
    row = Chain.objects.create(name="main", is_default=True, hedge_after_ms="400")
    entry(row, 0, provider(fake_upstream, "a", context_window=8000))
    entry(row, 1, provider(fake_upstream, "b", context_window=128000))
    entry(row, 2, provider(fake_upstream, "small", "openai", context_window=4000))
    fake_upstream.script("openai", Faults.context_length("openai"))
    fake_upstream.script("anthropic", Faults.slow(1.2))
    routed = route(REQUEST)
    assert routed.result.provider == "b" and routed.metadata.hedge is None
    assert [r.json["model"] for r in fake_upstream.requests_for("openai")] == ["a"]
    assert [(a["provider"], a["outcome"]) for a in attempts(routed)] == [
        ("a", "error"),
        ("b", "ok"),
    ]


def test_a_hedge_never_goes_to_a_candidate_the_caller_may_not_use(
    fake_upstream: FakeUpstream, user: Any
) -> None:
    # x is in a chain open to everyone; the default chain (b, c) is alice's only. A
    # stranger naming x gets x first and b, c as not_allowed: nobody to hedge with.
    mine = Chain.objects.create(name="mine")
    entry(mine, 0, provider(fake_upstream, "x", "openai"))
    main = chain(fake_upstream, names=("b", "c"))
    main.allowed_users.add(user)
    fake_upstream.script("openai", Faults.slow(0.6))
    stranger = Principal(user_id=user.pk + 1000)
    routed = route(dataclasses.replace(REQUEST, provider="x", principal=stranger))
    assert routed.result.provider == "x" and routed.metadata.hedge is None
    assert [(r.vendor, r.json["model"]) for r in fake_upstream.requests] == [("openai", "x")]


def test_a_hedge_that_fails_beside_a_failed_primary_is_not_called_again(
    fake_upstream: FakeUpstream, settings: Any
) -> None:
    settings.LLM_ROUTING = {**settings.LLM_ROUTING, "METRICS_TOKEN": "t" * 32}
    failed = hedges("failed")
    chain(fake_upstream, names=("a", "b", "c"))
    fake_upstream.script("openai", dataclasses.replace(Faults.unavailable("openai"), delay=0.3))
    fake_upstream.script(
        "anthropic", dataclasses.replace(Faults.unavailable("anthropic"), delay=0.5)
    )
    routed = route(REQUEST)
    assert routed.result.provider == "c"
    assert [(a["provider"], a["step"], a["outcome"]) for a in attempts(routed)] == [
        ("a", 0, "error"),
        ("b", 1, "error"),
        ("c", 2, "ok"),
    ]
    assert routed.metadata.hedge == "failed" and hedges("failed") == failed + 1
    assert called(fake_upstream) == ["a", "b", "c"]  # b once: as the hedge


def test_a_half_open_probe_is_never_hedged(fake_upstream: FakeUpstream, clock: Any) -> None:
    chain(fake_upstream)
    breaker.store.force_open("a", "a", 1.0)
    clock.advance(2.0)  # half-open: the next call to a is its single probe
    fake_upstream.script("openai", Faults.slow(0.6))
    routed = route(REQUEST)
    assert routed.result.provider == "a" and routed.metadata.hedge is None
    assert called(fake_upstream) == ["a"]


def test_p95_learns_from_the_answers_the_walk_records(
    fake_upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each answer that served feeds its provider's p95; a failed call feeds nothing.
    monkeypatch.setattr(balance, "P95_MIN_SAMPLES", 1)
    chain(fake_upstream, hedge="")
    fake_upstream.script("openai", Faults.unavailable("openai"))
    routed = route(REQUEST)
    failed, served = routed.metadata.attempts
    assert (failed.provider, failed.outcome, served.provider) == ("a", "error", "b")
    assert balance.p95("a") is None
    assert balance.p95("b") == served.latency_ms > 0


# --- what a strategy step learns from a hedge -------------------------------------------


def latency_step(fake: FakeUpstream) -> None:
    """One ``latency`` step of a (OpenAI) and b (Anthropic), hedged after 100 ms; a
    looks faster (10 ms against 5 s), so a goes first."""
    row = Chain.objects.create(name="main", is_default=True, hedge_after_ms="100")
    for position, name in enumerate(("a", "b")):
        fields = {**upstream_fields(name, KINDS[name], fake), "model": name, "max_retries": 0}
        ChainEntry.objects.create(
            chain=row, provider=Provider.objects.create(**fields), position=position,
            step=0, strategy="latency",
        )  # fmt: skip
    balance.reset()
    balance.observe_latency("a", 10.0, ok=True)
    balance.observe_latency("b", 5000.0, ok=True)


def test_a_hedge_that_wins_in_a_strategy_step_moves_the_affinity_key_and_the_latencies(
    fake_upstream: FakeUpstream,
) -> None:
    latency_step(fake_upstream)
    fake_upstream.script("openai", Faults.slow(3.0, watch=True))
    turn = dataclasses.replace(REQUEST, affinity="conversation-1")
    rid = "00000000-0000-4000-a000-000000000001"  # a draw that does not explore
    routed = route(turn, request_id=rid)
    assert routed.metadata.picks[0]["picked"] == "a"
    assert walk(routed) == [("a", "hedge_lost", "hedge_lost"), ("b", "ok", None)]
    # The loser ran at least until the hedge's answer: a's estimate learns that much.
    lost = next(a for a in routed.metadata.attempts if a.outcome == "hedge_lost")
    assert (balance.latencies(["a"])["a"] or 0) >= lost.latency_ms >= 100
    # The served hedge is settled as its step's member: its latency is sampled (below
    # the 5 s it started from) and the affinity key follows it.
    assert (balance.latencies(["b"])["b"] or 5000.0) < 5000.0
    again = route(turn, request_id=rid)
    assert again.metadata.picks[0]["reason"] == "affinity"
    assert again.metadata.picks[0]["picked"] == again.result.provider == "b"
