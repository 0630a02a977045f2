"""The step strategies as pure functions (llm_routing.strategies; docs/strategies.md):
the order each gives, its pick and the numbers it records. Seeded draws, so every
figure here is the same on every run."""

from __future__ import annotations

from collections import Counter

from llm_routing.strategies import Candidate, Inputs, order


def names(ordered: tuple[Candidate, ...]) -> list[str]:
    return [c.name for c in ordered]


def test_weighted_is_seeded_by_the_request_id_and_step():
    step = [Candidate("a"), Candidate("b", weight=0.25), Candidate("c", weight=3)]
    first, pick = order("weighted", step, step=0, seed="req-1")
    again, pick_again = order("weighted", step, step=0, seed="req-1")
    assert names(first) == names(again) and pick == pick_again  # a replay explains it
    assert pick.reason == "weighted" and pick.picked == first[0].name
    assert pick.weights == {"a": 1.0, "b": 0.25, "c": 3.0}
    assert pick.draw is not None and 0 <= pick.draw < 1
    assert sorted(names(first)) == ["a", "b", "c"]  # the rest of the step follows
    orders = {tuple(names(order("weighted", step, step=s, seed="req-1")[0])) for s in range(20)}
    assert len(orders) > 1  # the step is part of the seed


def test_weighted_shares_follow_exact_weights():
    step = [Candidate("a", weight=70), Candidate("b", weight=20), Candidate("c", weight=10)]
    picks = Counter(order("weighted", step, step=0, seed=f"r{i}")[1].picked for i in range(10_000))
    assert abs(picks["a"] / 10_000 - 0.70) < 0.02
    assert abs(picks["b"] / 10_000 - 0.20) < 0.02
    assert abs(picks["c"] / 10_000 - 0.10) < 0.02


def test_weighted_takes_tiny_weights_as_given():
    # No rounding below 0.01: two tiny weights split evenly, and a tiny weight beats 0.
    step = [Candidate("a", weight=0.001), Candidate("b", weight=0.001)]
    picks = Counter(order("weighted", step, step=0, seed=f"r{i}")[1].picked for i in range(2000))
    assert 0.45 < picks["a"] / 2000 < 0.55
    only, pick = order("weighted", [Candidate("z", weight=0), Candidate("t", weight=1e-9)],
                       step=0, seed="x")  # fmt: skip
    assert pick.picked == "t" and names(only) == ["t", "z"]


def test_drained_candidates_go_last_in_every_strategy():
    step = [Candidate("a", weight=0), Candidate("b"), Candidate("c", weight=0)]
    for strategy in ("weighted", "least_in_flight", "latency", "cost"):
        ordered, pick = order(strategy, step, step=1, seed="s", inputs=Inputs())
        assert names(ordered) == ["b", "a", "c"], strategy
        assert pick.picked == "b" and pick.step == 1
    ordered, pick = order("weighted", [Candidate("a", weight=0)] * 1, step=0, seed="s")
    assert pick.picked is None and names(ordered) == ["a"]


def test_least_in_flight_orders_by_counts_then_weight():
    step = [Candidate("a"), Candidate("b", weight=2), Candidate("c")]
    ordered, pick = order(
        "least_in_flight", step, step=0, seed="s", inputs=Inputs(counts={"a": 3, "b": 1, "c": 0})
    )
    assert names(ordered) == ["c", "b", "a"]
    assert pick.counts == {"a": 3, "b": 1, "c": 0} and pick.reason == "least_in_flight"
    ordered, _ = order("least_in_flight", step, step=0, seed="s", inputs=Inputs(counts={"a": 1}))
    assert names(ordered)[0] == "b"  # b and c tie at 0: the heavier weight first


def test_latency_prefers_the_fastest_and_explores():
    step = [Candidate("slow"), Candidate("fast"), Candidate("new")]
    inputs = Inputs(latencies={"slow": 900.0, "fast": 100.0, "new": None})
    ordered, pick = order("latency", step, step=0, seed="s", inputs=inputs, explore=0.0)
    assert names(ordered) == ["new", "fast", "slow"]  # no sample yet: tried first
    assert pick.scores == {"slow": 900.0, "fast": 100.0, "new": None} and not pick.explored
    inputs = Inputs(latencies={"slow": 900.0, "fast": 100.0, "new": 500.0})
    ordered, pick = order("latency", step, step=0, seed="s", inputs=inputs, explore=1.0)
    assert pick.explored and names(ordered)[0] != "fast"
    # The default floor: a small share of requests go elsewhere first, never none.
    firsts = Counter(
        order("latency", step, step=0, seed=f"r{i}", inputs=inputs)[1].picked for i in range(2000)
    )
    assert firsts["fast"] > 1800 and firsts["slow"] + firsts["new"] > 20


def test_cost_orders_cheapest_first_unknown_last_ties_by_weight():
    step = [
        Candidate("dear"),
        Candidate("unknown"),
        Candidate("cheap"),
        Candidate("cheap2", weight=5),
    ]
    inputs = Inputs(costs={"dear": 0.02, "unknown": None, "cheap": 0.001, "cheap2": 0.001})
    ordered, pick = order("cost", step, step=0, seed="s", inputs=inputs)
    assert names(ordered) == ["cheap2", "cheap", "dear", "unknown"]
    assert pick.picked == "cheap2" and pick.scores == dict(inputs.costs)


def test_pick_to_dict_carries_what_explains_it():
    _, pick = order("weighted", [Candidate("a"), Candidate("b")], step=2, seed="s")
    data = pick.to_dict()
    assert set(data) == {"step", "strategy", "picked", "reason", "order", "weights", "draw"}
    assert data["step"] == 2 and data["order"][0] == data["picked"]
