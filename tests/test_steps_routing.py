"""Steps and strategies in the walk, on both drivers, against the fake upstream
(docs/strategies.md): picks, recorded reasons and steps, failover inside a step, drained
and zero weights, shared in-flight counts with an expiring lease, the latency
strategy's exploration, the cost strategy, context-aware fallback, explain's replay."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from decimal import Decimal
from typing import Any

import pytest
from django.core.cache import caches
from django.core.cache.backends.filebased import FileBasedCache
from django.test import override_settings

from llm_routing import balance, effects, snapshot, strategies
from llm_routing.access import visible_picks
from llm_routing.models import Attempt, Chain, ChainEntry, Provider, RoutingDecision
from llm_routing.router import explain, route, route_stream
from llm_routing.routing import plan
from llm_routing.types import AuditRequest, Principal, StreamResult
from tests.conftest import Sleeps, upstream_fields
from tests.fakes.upstream import FakeUpstream, Faults
from tests.support import wait_for

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("driver", "key_env")]

REQUEST = AuditRequest(task="summarize", input_text="Steps spread the load.")


class Clock:
    def __init__(self) -> None:
        self.now = time.time()  # wall time: a Redis key expires at an absolute time

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[Clock]:
    fake = Clock()
    monkeypatch.setattr(balance, "clock", fake)
    balance.reset()
    yield fake
    balance.reset()


def chain(fake: FakeUpstream, *steps: Any, **provider_fields: dict[str, Any]) -> Chain:
    """A default chain of openai-kind providers on the fake upstream; a step is a name,
    or (strategy, [(name, weight), …]). Each provider's model is its name, so the fake
    upstream's requests tell who was called."""
    row = Chain.objects.create(name="main", is_default=True)
    position = 0
    for index, step in enumerate(steps):
        members = [(step, 1.0)] if isinstance(step, str) else step[1]
        for name, weight in members:
            fields = upstream_fields(name, "openai", fake)
            fields.update({"model": name, "max_retries": 0, **provider_fields.get(name, {})})
            provider = Provider.objects.create(**fields)
            ChainEntry.objects.create(
                chain=row,
                provider=provider,
                position=position,
                step=None if isinstance(step, str) else index,
                weight=weight,
                strategy="" if isinstance(step, str) else step[0],
            )
            position += 1
    return row


def called(fake: FakeUpstream) -> list[str]:
    return [r.json["model"] for r in fake.requests_for("openai")]


def walk(routed: Any) -> list[tuple[str, str, str | None, int | None]]:
    return [(a.provider, a.outcome, a.reason, a.step) for a in routed.metadata.attempts]


def test_weighted_pick_is_served_recorded_and_replayed(
    fake_upstream: FakeUpstream, clock: Clock
) -> None:
    chain(fake_upstream, ("weighted", [("a", 1.0), ("b", 0.25)]), "c")
    routed = route(REQUEST, request_id="00000000-0000-4000-8000-000000000001")
    (pick,) = routed.metadata.picks
    assert pick["strategy"] == "weighted" and pick["reason"] == "weighted"
    assert pick["weights"] == {"a": 1.0, "b": 0.25} and pick["step"] == 0
    assert routed.result.provider == pick["picked"] == called(fake_upstream)[0]
    assert walk(routed) == [(pick["picked"], "ok", None, 0)]
    assert routed.metadata.fallback_used is False
    # The decision row records the step; the envelope carries the pick.
    decision = RoutingDecision.objects.get(request_id=routed.request_id)
    assert list(Attempt.objects.filter(decision=decision).values_list("step", flat=True)) == [0]
    assert routed.to_dict()["routing_metadata"]["picks"] == [pick]
    # explain replays the pick for the same request id, without calling anyone.
    replay = explain(REQUEST, request_id=routed.request_id)
    assert replay.to_dict()["picks"] == [pick]
    assert [c.provider for c in replay.candidates][:2] == pick["order"]
    assert [c.step for c in replay.candidates] == [0, 0, 1, 2]
    assert len(fake_upstream.requests) == 1


def test_failover_tries_the_rest_of_the_step_in_order_first(
    fake_upstream: FakeUpstream, clock: Clock
) -> None:
    chain(fake_upstream, ("weighted", [("a", 1.0), ("b", 1.0), ("c", 1.0)]), "d")
    fake_upstream.script("openai", Faults.unavailable("openai"), Faults.unavailable("openai"))
    routed = route(REQUEST, request_id="00000000-0000-4000-8000-000000000002", sleeper=Sleeps())
    order = routed.metadata.picks[0]["order"]
    assert called(fake_upstream) == order  # the step's order, then nothing further
    assert walk(routed) == [
        (order[0], "error", "unavailable", 0),
        (order[1], "error", "unavailable", 0),
        (order[2], "ok", None, 0),
    ]
    assert routed.metadata.fallback_reason == "unavailable"


def test_drained_and_zero_weights(fake_upstream: FakeUpstream, clock: Clock) -> None:
    chain(
        fake_upstream,
        ("weighted", [("a", 0.0), ("b", 1.0)]),
        ("cost", [("c", 0.0), ("d", 0.0)]),
        "e",
    )
    fake_upstream.script("openai", Faults.unavailable("openai"))
    routed = route(REQUEST, sleeper=Sleeps())
    first, second = routed.metadata.picks
    assert first["picked"] == "b" and first["order"] == ["b", "a"]
    assert second["picked"] is None  # every weight 0: the step is drained
    assert walk(routed) == [
        ("b", "error", "unavailable", 0),
        ("a", "skipped", "drained", 0),
        ("c", "skipped", "drained", 1),
        ("d", "skipped", "drained", 1),
        ("e", "ok", None, 2),
    ]
    assert called(fake_upstream) == ["b", "e"]


def test_least_in_flight_reads_shared_counts_and_leases_expire(
    fake_upstream: FakeUpstream, clock: Clock
) -> None:
    chain(fake_upstream, ("least_in_flight", [("a", 1.0), ("b", 1.0)]))
    # Another worker holds two places at b and one at a, then crashes (never releases).
    for name in ("b", "b", "a"):
        effects.run(_lease(name))
    routed = route(REQUEST)
    (pick,) = routed.metadata.picks
    assert pick["counts"] == {"a": 1, "b": 2} and pick["picked"] == "a"
    assert routed.result.provider == "a"
    # The request gave its own place back when it ended.
    assert effects.run(_count(("a", "b"))) == {"a": 1, "b": 2}
    clock.now += balance.lease_s() + 1  # the crashed worker's leases expire
    assert effects.run(_count(("a", "b"))) == {"a": 0, "b": 0}
    routed = route(REQUEST)
    assert routed.metadata.picks[0]["counts"] == {"a": 0, "b": 0}


def _lease(name: str) -> Any:
    return (yield balance.Lease(name))


def _count(names: tuple[str, ...]) -> Any:
    return (yield balance.CountInFlight(names))


def test_a_failed_call_gives_its_place_back_at_once(
    fake_upstream: FakeUpstream, clock: Clock
) -> None:
    chain(fake_upstream, ("least_in_flight", [("a", 1.0), ("b", 1.0)]))
    fake_upstream.script("openai", Faults.unavailable("openai"))
    routed = route(REQUEST, sleeper=Sleeps())
    assert [a.outcome for a in routed.metadata.attempts] == ["error", "ok"]
    assert effects.run(_count(("a", "b"))) == {"a": 0, "b": 0}


def test_a_hedge_in_a_least_in_flight_step_holds_a_place_while_it_runs(
    fake_upstream: FakeUpstream, clock: Clock
) -> None:
    row = chain(fake_upstream, ("least_in_flight", [("a", 1.0), ("b", 1.0)]))
    Chain.objects.filter(pk=row.pk).update(hedge_after_ms="100")
    effects.run(_lease("b"))  # another worker's place at b: the walk picks a first
    fake_upstream.script("openai", Faults.slow(3.0, watch=True))  # a: the slow primary
    fake_upstream.script("openai", Faults.slow(0.5))  # b: the hedge, which wins
    seen: list[dict[str, int]] = []

    def watch() -> None:  # the counts while both calls are upstream
        if wait_for(lambda: len(fake_upstream.requests_for("openai")) == 2, 10.0):
            seen.append(effects.run(_count(("a", "b"))))

    watcher = threading.Thread(target=watch)
    watcher.start()
    routed = route(REQUEST)
    watcher.join()
    assert routed.result.provider == "b" and routed.metadata.hedge == "won"
    assert [(p, o) for p, o, _, _ in walk(routed)] == [("a", "hedge_lost"), ("b", "ok")]
    assert seen == [{"a": 1, "b": 2}]  # the hedge counted like the walk's own call
    assert effects.run(_count(("a", "b"))) == {"a": 0, "b": 1}  # both given back


def _seed(names: list[str], latencies: dict[str, float], *, explored: bool) -> str:
    """A request id whose seeded draw explores, or not (found, not guessed: the draw is
    a function of the id)."""
    step = [strategies.Candidate(n) for n in names]
    inputs = strategies.Inputs(latencies=latencies)
    for i in range(10_000):
        seed = f"00000000-0000-4000-8000-{i:012d}"
        pick = strategies.order("latency", step, step=0, seed=seed, inputs=inputs)[1]
        if pick.explored is explored:
            return seed
    raise AssertionError("no such seed")


def test_latency_prefers_the_fast_one_and_explores_the_slow_one(
    fake_upstream: FakeUpstream, clock: Clock
) -> None:
    chain(fake_upstream, ("latency", [("slow", 1.0), ("fast", 1.0)]))
    balance.observe_latency("slow", 900.0, ok=True)
    balance.observe_latency("fast", 100.0, ok=True)
    scores = {"slow": 900.0, "fast": 100.0}
    routed = route(REQUEST, request_id=_seed(["slow", "fast"], scores, explored=False))
    (pick,) = routed.metadata.picks
    assert pick["picked"] == "fast" and pick["scores"] == scores and "explored" not in pick
    routed = route(REQUEST, request_id=_seed(["slow", "fast"], scores, explored=True))
    (pick,) = routed.metadata.picks
    assert pick["explored"] is True and pick["picked"] == "slow"
    assert routed.result.provider == "slow"
    # A recovered candidate's score comes down as fast samples arrive.
    before = balance.latencies(["slow"])["slow"]
    clock.now += 30
    balance.observe_latency("slow", 50.0, ok=True)
    after = balance.latencies(["slow"])["slow"]
    assert before is not None and after is not None and after < 100.0 < before


def test_peak_ewma_counts_a_slow_or_failed_call_at_once(clock: Clock) -> None:
    balance.observe_latency("x", 100.0, ok=True)
    balance.observe_latency("x", 700.0, ok=True)
    assert balance.latencies(["x"]) == {"x": 700.0}
    balance.observe_latency("x", 10.0, ok=False)
    assert balance.latencies(["x"]) == {"x": balance.FAILURE_PENALTY_MS}


def test_cost_picks_the_cheapest_estimate(fake_upstream: FakeUpstream, clock: Clock) -> None:
    price = {"input_price_per_mtok": Decimal("5"), "output_price_per_mtok": Decimal("15")}
    cheap = {"input_price_per_mtok": Decimal("0.1"), "output_price_per_mtok": Decimal("0.4")}
    chain(
        fake_upstream,
        ("cost", [("dear", 1.0), ("cheap", 1.0), ("unpriced", 1.0)]),
        dear=price,
        cheap=cheap,
        unpriced={"kind": "openai_compatible", "base_url": fake_upstream.url + "/v1"},
    )
    routed = route(REQUEST)
    (pick,) = routed.metadata.picks
    assert pick["order"] == ["cheap", "dear", "unpriced"]
    assert pick["scores"]["unpriced"] is None and pick["scores"]["cheap"] < pick["scores"]["dear"]
    assert routed.result.provider == "cheap"


def test_context_too_small_skips_windows_that_cannot_hold_it(
    fake_upstream: FakeUpstream, clock: Clock
) -> None:
    chain(
        fake_upstream,
        "small",
        "same",
        "smaller",
        "undeclared",
        small={"context_window": 8000},
        same={"context_window": 8000},
        smaller={"context_window": 4000},
    )
    fake_upstream.script("openai", Faults.context_length("openai"))
    routed = route(REQUEST)
    assert walk(routed) == [
        ("small", "error", "context_length", 0),
        ("same", "skipped", "context_too_small", 1),
        ("smaller", "skipped", "context_too_small", 2),
        ("undeclared", "ok", None, 3),
    ]
    assert called(fake_upstream) == ["small", "undeclared"]


def test_a_larger_window_is_tried_after_a_context_failure(
    fake_upstream: FakeUpstream, clock: Clock
) -> None:
    chain(fake_upstream, "small", "large", small={"context_window": 8000},
          large={"context_window": 128000})  # fmt: skip
    fake_upstream.script("openai", Faults.context_length("openai"))
    routed = route(REQUEST)
    assert walk(routed)[1] == ("large", "ok", None, 1)


def test_only_a_context_length_failure_raises_the_floor(
    fake_upstream: FakeUpstream, clock: Clock
) -> None:
    chain(fake_upstream, "large", "small", large={"context_window": 128000},
          small={"context_window": 4000})  # fmt: skip
    fake_upstream.script("openai", Faults.unavailable("openai"))
    routed = route(REQUEST, sleeper=Sleeps())
    assert walk(routed) == [("large", "error", "unavailable", 0), ("small", "ok", None, 1)]


def test_the_smallest_window_that_failed_for_length_is_a_floor_too(
    fake_upstream: FakeUpstream, clock: Clock
) -> None:
    chain(fake_upstream, "one", "also_one", "any", one={"context_window": 1},
          also_one={"context_window": 1})  # fmt: skip
    fake_upstream.script("openai", Faults.context_length("openai"))
    routed = route(REQUEST)
    assert walk(routed) == [
        ("one", "error", "context_length", 0),
        ("also_one", "skipped", "context_too_small", 1),
        ("any", "ok", None, 2),
    ]


def test_a_latency_step_learns_each_calls_time(fake_upstream: FakeUpstream, clock: Clock) -> None:
    chain(fake_upstream, ("latency", [("a", 1.0), ("b", 1.0)]), ("weighted", [("c", 1.0)]))
    fake_upstream.script("openai", Faults.unavailable("openai"))
    routed = route(REQUEST, sleeper=Sleeps())
    failed, served = routed.metadata.attempts
    assert (failed.outcome, served.outcome) == ("error", "ok")
    # The served call's time as it is; a failed call counts at least the penalty.
    assert balance.latencies([failed.provider, served.provider]) == {
        failed.provider: max(failed.latency_ms, balance.FAILURE_PENALTY_MS),
        served.provider: served.latency_ms,
    }


def test_a_step_of_several_with_no_member_the_caller_may_use_has_no_pick(
    fake_upstream: FakeUpstream, clock: Clock, user: Any
) -> None:
    row = chain(fake_upstream, ("weighted", [("a", 1.0), ("b", 1.0)]))
    row.allowed_users.add(user)
    stranger = Principal(user_id=user.pk + 1000)
    routed = route(replace(REQUEST, principal=stranger, backstop=True))
    assert routed.metadata.picks == ()
    assert walk(routed) == [
        ("a", "skipped", "not_allowed", 0),
        ("b", "skipped", "not_allowed", 0),
        ("mock", "ok", None, 1),
    ]
    assert called(fake_upstream) == []


def test_picks_hide_what_the_caller_may_not_see() -> None:
    picks = (
        {"step": 0, "strategy": "least_in_flight", "picked": "pub", "reason": "least_in_flight",
         "order": ["pub", "secret"], "weights": {"pub": 1.0, "secret": 1.0},
         "counts": {"pub": 0, "secret": 3}},
        {"step": 1, "strategy": "weighted", "picked": "secret", "reason": "weighted",
         "order": ["secret", "pub"], "weights": {"pub": 1.0, "secret": 1.0}},
    )  # fmt: skip
    (shown,) = visible_picks(picks, lambda n: n != "secret")
    assert shown["order"] == ["pub"] and shown["counts"] == {"pub": 0}
    assert "secret" not in repr(shown)


def test_a_stream_holds_its_place_in_flight_until_it_ends(
    fake_upstream: FakeUpstream, clock: Clock
) -> None:
    chain(fake_upstream, ("least_in_flight", [("a", 1.0), ("b", 1.0)]))
    stream = route_stream(AuditRequest(task="summarize", input_text="x", stream=True))
    first = next(iter(stream))
    assert first is not None
    held = effects.run(_count(("a", "b")))
    assert sorted(held.values()) == [0, 1]  # the stream's place, while it runs
    events = list(stream)
    assert isinstance(events[-1], StreamResult)
    routed = events[-1].routed
    assert routed.metadata.picks[0]["strategy"] == "least_in_flight"
    assert [a.step for a in routed.metadata.attempts] == [0]
    assert effects.run(_count(("a", "b"))) == {"a": 0, "b": 0}


def test_picks_are_counted_in_metrics(
    fake_upstream: FakeUpstream, clock: Clock, settings: Any
) -> None:
    from llm_routing import metrics

    settings.LLM_ROUTING = {**settings.LLM_ROUTING, "METRICS_TOKEN": "t" * 32}
    chain(fake_upstream, ("weighted", [("a", 1.0), ("b", 1.0)]))
    labels = {"chain": "main", "step": "0", "strategy": "weighted", "reason": "weighted"}

    def count(provider: str) -> float:
        value = metrics.REGISTRY.get_sample_value(
            "llm_routing_picks_total", {**labels, "provider": provider}
        )
        return value or 0.0

    before = count("a") + count("b")
    routed = route(REQUEST)
    picked = routed.metadata.picks[0]["picked"]
    assert count("a") + count("b") == before + 1 and count(picked) >= 1


def test_the_api_carries_picks_and_explain_replays_them(
    fake_upstream: FakeUpstream, clock: Clock, api: Any, driver: str
) -> None:
    if driver == "async":
        pytest.skip("the HTTP views: one run is enough")
    chain(fake_upstream, ("weighted", [("a", 3.0), ("b", 1.0)]), "c")
    body = api.post("/audit/", {"task": "summarize", "input_text": "x"}, format="json").json()
    meta = body["routing_metadata"]
    (pick,) = meta["picks"]
    assert meta["attempts"][0]["step"] == 0 and meta["selected_provider"] == pick["picked"]
    query = {"task": "summarize", "request_id": body["request_id"]}
    explained = api.get("/audit/explain/", query).json()
    assert explained["picks"] == [pick]
    assert [c["step"] for c in explained["candidates"]] == [0, 0, 1, 2]
    assert explained["would_serve_first"] == pick["picked"]


# --- prompt-cache affinity -------------------------------------------------------------


class Store:
    """A routing-cache stand-in that records what the affinity effects write."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.timeouts: dict[str, float | None] = {}

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)

    def set(self, key: str, value: Any, timeout: float | None = None) -> None:
        self.values[key], self.timeouts[key] = value, timeout

    async def aget(self, key: str, default: Any = None) -> Any:  # the async driver's
        return self.get(key, default)

    async def aset(self, key: str, value: Any, timeout: float | None = None) -> None:
        self.set(key, value, timeout)


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch) -> Store:
    fake = Store()
    monkeypatch.setattr(balance, "routing_cache", lambda: fake)
    return fake


def rid(i: int) -> str:
    return f"00000000-0000-4000-a000-{i:012d}"


def test_affinity_keeps_a_conversation_where_it_started(
    fake_upstream: FakeUpstream, clock: Clock, store: Store
) -> None:
    chain(fake_upstream, ("weighted", [("a", 1.0), ("b", 1.0)]), "c",
          b={"affinity_ttl_s": 3600}, a={"affinity_ttl_s": 3600})  # fmt: skip
    turn = AuditRequest(task="summarize", input_text="turn", affinity="conversation-42")
    first = route(turn, request_id=rid(0))
    home = first.result.provider
    assert first.metadata.picks[0]["reason"] == "weighted"  # nothing remembered yet
    for i in range(1, 12):  # other ids draw differently; the key keeps them home
        routed = route(turn, request_id=rid(i))
        (pick,) = routed.metadata.picks
        assert pick["reason"] == "affinity" and pick["picked"] == home
        assert pick["order"] == [home, "b" if home == "a" else "a"]  # home first
        assert routed.result.provider == home
    assert set(store.timeouts.values()) == {3600}  # the serving provider's TTL
    assert not any("conversation-42" in k for k in store.values)  # only a hash is kept
    # Without the key the step's strategy picks as before.
    plain = [route(REQUEST, request_id=rid(i)).metadata.picks[0]["reason"] for i in range(3)]
    assert plain == ["weighted"] * 3


def test_a_step_of_one_keeps_no_affinity(
    fake_upstream: FakeUpstream, clock: Clock, store: Store
) -> None:
    chain(fake_upstream, "solo")
    turn = AuditRequest(task="summarize", input_text="turn", affinity="conversation-42")
    assert route(turn).result.provider == "solo"
    assert store.values == {}  # nothing to choose between: nothing remembered


def test_affinity_moves_when_its_candidate_fails(
    fake_upstream: FakeUpstream, clock: Clock, store: Store
) -> None:
    chain(fake_upstream, ("weighted", [("a", 1.0), ("b", 1.0)]))
    turn = AuditRequest(task="summarize", input_text="turn", affinity="conv")
    home = route(turn, request_id=rid(0)).result.provider
    other = "b" if home == "a" else "a"
    fake_upstream.script("openai", Faults.unavailable("openai"))  # home fails once
    moved = route(turn, request_id=rid(1), sleeper=Sleeps())
    assert walk(moved) == [(home, "error", "unavailable", 0), (other, "ok", None, 0)]
    after = route(turn, request_id=rid(2))  # the key followed the answer
    assert after.metadata.picks[0] == {**after.metadata.picks[0], "reason": "affinity",
                                       "picked": other}  # fmt: skip
    assert after.result.provider == other


class LoopGuardedCache(FileBasedCache):
    """A file cache whose blocking methods refuse to run on an event loop: the async
    driver must reach a cache that is neither LocMem nor Redis through its async
    methods, never block the loop on file (or network) I/O."""

    def get(self, key: str, default: Any = None, version: int | None = None) -> Any:
        _not_on_a_loop()
        return super().get(key, default, version)

    def set(self, key: str, value: Any, timeout: Any = None, version: int | None = None) -> None:
        _not_on_a_loop()
        super().set(key, value, timeout, version)


def _not_on_a_loop() -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise AssertionError("a blocking cache call on the event loop")


def test_affinity_on_another_cache_backend_never_blocks_the_event_loop(
    fake_upstream: FakeUpstream, clock: Clock, tmp_path: Any
) -> None:
    files = {"BACKEND": "tests.test_steps_routing.LoopGuardedCache", "LOCATION": str(tmp_path)}
    locmem = {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
    with override_settings(
        CACHES={"default": locmem, "files": files}, LLM_ROUTING={"CACHE_ALIAS": "files"}
    ):
        chain(fake_upstream, ("weighted", [("a", 1.0), ("b", 1.0)]))
        turn = AuditRequest(task="summarize", input_text="turn", affinity="conv-on-files")
        home = route(turn, request_id=rid(0)).result.provider
        for i in range(1, 4):
            routed = route(turn, request_id=rid(i))
            assert routed.metadata.picks[0]["reason"] == "affinity"
            assert routed.result.provider == home
        key = balance.affinity_cache_key(routed.metadata.chain_name or "", 0, "conv-on-files")
        assert FileBasedCache.get(caches["files"], key) == home  # written to the files


def test_affinity_is_remembered_per_chain_and_per_step(
    fake_upstream: FakeUpstream, clock: Clock, store: Store
) -> None:
    chain(fake_upstream, ("weighted", [("a", 1.0), ("b", 1.0)]),
          ("weighted", [("c", 1.0), ("d", 1.0)]))  # fmt: skip
    other = Chain.objects.create(name="other")
    for position, name in enumerate(("a", "b")):
        ChainEntry.objects.create(chain=other, provider=Provider.objects.get(name=name),
                                  position=position, step=0, strategy="weighted")  # fmt: skip
    turn = AuditRequest(task="summarize", input_text="turn", affinity="conv")
    home = route(turn, request_id=rid(0)).result.provider
    # Another chain with the same key has a memory of its own: nothing yet.
    elsewhere = route(replace(turn, chain="other"), request_id=rid(1))
    assert elsewhere.metadata.picks[0]["reason"] == "weighted"
    # The first step fails whole: the second step serves and remembers for itself...
    fake_upstream.script("openai", Faults.unavailable("openai"), Faults.unavailable("openai"))
    moved = route(turn, request_id=rid(2), sleeper=Sleeps())
    assert moved.result.provider in {"c", "d"}
    # ...and the first step still returns home.
    back = route(turn, request_id=rid(3))
    assert back.metadata.picks[0]["reason"] == "affinity" and back.result.provider == home


def test_a_drained_candidate_loses_its_affinity(
    fake_upstream: FakeUpstream, clock: Clock, store: Store
) -> None:
    chain(fake_upstream, ("weighted", [("a", 1.0), ("b", 1.0)]))
    turn = AuditRequest(task="summarize", input_text="turn", affinity="conv")
    home = route(turn, request_id=rid(0)).result.provider
    ChainEntry.objects.filter(provider__name=home).update(weight=0)
    routed = route(turn, request_id=rid(1))
    assert routed.result.provider != home
    assert routed.metadata.picks[0]["reason"] == "weighted"


def test_affinity_from_the_header_and_the_openai_user(
    fake_upstream: FakeUpstream, clock: Clock, store: Store, api: Any, driver: str
) -> None:
    if driver == "async":
        pytest.skip("the HTTP views: one run is enough")
    row = chain(fake_upstream, ("weighted", [("a", 1.0), ("b", 1.0)]))
    body = {"task": "summarize", "input_text": "x"}
    headers = {"HTTP_X_LLM_AFFINITY": "thread-7"}
    first = api.post("/audit/", body, format="json", **headers).json()
    home = first["routing_metadata"]["selected_provider"]
    for _ in range(4):
        meta = api.post("/audit/", body, format="json", **headers).json()["routing_metadata"]
        assert meta["picks"][0]["reason"] == "affinity" and meta["selected_provider"] == home
    bad = api.post("/audit/", body, format="json", HTTP_X_LLM_AFFINITY="x" * 257)
    assert bad.status_code == 400
    assert len(store.values) == 1  # one key: the header's
    # /v1: the OpenAI user field counts once the chain opts in; the header always.
    chat = {"model": "main", "messages": [{"role": "user", "content": "hi"}], "user": "u-9"}
    for _ in range(2):
        response = api.post("/v1/chat/completions", chat, format="json")
        assert response.status_code == 200, response.content[:500]
    assert len(store.values) == 1  # not opted in: the user field is no key
    row.affinity_from_user = True
    row.save()
    for _ in range(2):
        assert api.post("/v1/chat/completions", chat, format="json").status_code == 200
    assert len(store.values) == 2  # the user's key
    response = api.post("/v1/chat/completions", chat, format="json", HTTP_X_LLM_AFFINITY="h")
    assert response.status_code == 200 and len(store.values) == 3  # the header wins


def test_affinity_is_a_field_of_audit_and_the_python_api(
    fake_upstream: FakeUpstream, clock: Clock, store: Store
) -> None:
    from llm_routing import audit

    chain(fake_upstream, ("weighted", [("a", 1.0), ("b", 1.0)]))
    home = audit(task="summarize", input_text="x", affinity="k").result.provider
    again = audit(task="summarize", input_text="x", affinity="k")
    assert again.result.provider == home
    assert again.metadata.picks[0]["reason"] == "affinity"


# --- the plan's steps --------------------------------------------------------------------


def test_a_continuation_is_recorded_in_its_own_step(
    fake_upstream: FakeUpstream, clock: Clock
) -> None:
    row = Chain.objects.create(name="main", is_default=True, stream_mode="continuation")
    members = (("a", "openai", {}), ("b", "anthropic", {"supports_prefill": True}))
    for position, (name, kind, extra) in enumerate(members):
        fields = upstream_fields(name, kind, fake_upstream)
        fields.update({"model": name, "max_retries": 0, "supports_streaming": True, **extra})
        provider = Provider.objects.create(**fields)
        ChainEntry.objects.create(chain=row, provider=provider, position=position)
    fake_upstream.script("openai", Faults.stream(text="The quick brown fox", cut_after=2))
    fake_upstream.script("anthropic", Faults.stream(text=" jumps."))
    events = list(route_stream(AuditRequest(task="summarize", input_text="x", stream=True)))
    last = events[-1]
    assert isinstance(last, StreamResult) and last.routed.result.provider == "b"
    assert [(a.provider, a.step) for a in last.routed.metadata.attempts] == [("a", 0), ("b", 1)]


def test_a_chains_steps_are_worked_out_once_per_snapshot(
    fake_upstream: FakeUpstream, clock: Clock
) -> None:
    chain(fake_upstream, ("weighted", [("a", 1.0), ("b", 1.0)]), "c")
    other = Chain.objects.create(name="other")
    ChainEntry.objects.create(chain=other, provider=Provider.objects.get(name="c"), position=0)
    config = snapshot.current()
    first = plan.resolve(REQUEST, config)
    assert plan.resolve(replace(REQUEST, chain="other"), config).steps != first.steps
    again = plan.resolve(REQUEST, config)
    assert again.steps is first.steps and again.candidates is first.candidates
    assert [[c.name for c in s.members] for s in first.steps] == [["a", "b"], ["c"], ["mock"]]


def shape(request: AuditRequest) -> list[tuple[str, list[tuple[str, str]]]]:
    """The resolved plan's steps: (strategy, [(provider, model override), …]) each."""
    steps = plan.resolve(request, snapshot.current()).steps
    return [(s.strategy, [(c.name, c.model) for c in s.members]) for s in steps]


def test_an_explicit_provider_leaves_its_place_in_its_step(
    fake_upstream: FakeUpstream, clock: Clock
) -> None:
    chain(fake_upstream, ("weighted", [("a", 1.0), ("b", 1.0), ("c", 1.0)]),
          ("cost", [("d", 1.0), ("e", 1.0)]), "f")  # fmt: skip
    assert shape(replace(REQUEST, provider="b")) == [
        ("", [("b", "")]),
        ("weighted", [("a", ""), ("c", "")]),
        ("cost", [("d", ""), ("e", "")]),
        ("", [("f", "")]),
        ("", [("mock", "")]),
    ]
    # A step left with one member is a step of one: no strategy (nor drained weights).
    assert shape(replace(REQUEST, provider="e"))[:3] == [
        ("", [("e", "")]),
        ("weighted", [("a", ""), ("b", ""), ("c", "")]),
        ("", [("d", "")]),
    ]


def test_the_mock_in_a_chain_is_its_last_step_with_its_model(
    fake_upstream: FakeUpstream, clock: Clock
) -> None:
    row = chain(fake_upstream, ("weighted", [("a", 1.0)]))
    mock = Provider.objects.create(name="mock", kind="mock", model="mock-1")
    b = Provider.objects.create(**{**upstream_fields("b", "openai", fake_upstream), "model": "b"})
    ChainEntry.objects.create(chain=row, provider=mock, position=1, step=0,
                              strategy="weighted", model="mock-large")  # fmt: skip
    ChainEntry.objects.create(chain=row, provider=b, position=2, step=0, strategy="weighted")
    assert shape(REQUEST) == [
        ("weighted", [("a", ""), ("b", "")]),
        ("", [("mock", "mock-large")]),
    ]
