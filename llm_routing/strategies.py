"""How a step of several candidates orders them: the strategies (docs/strategies.md).

Pure functions, no I/O: what they need of the world (the requests in flight, recent
latencies, estimated costs) arrives as :class:`Inputs`, gathered by
:mod:`llm_routing.balance`. :func:`order` answers the step's candidates in the order the
walk tries them (the first is the pick; on failover the rest of the step follows in
that order) and a :class:`Pick` saying why, with the numbers it used.

* ``weighted`` — draws without replacement in proportion to the weights (any positive
  number, however small), seeded by the request id and the step, so the same request
  id and weights always give the same order (a replay explains the pick).
* ``least_in_flight`` — fewest requests in flight (across every worker: the counts come
  from the shared cache); ties by weight, then the seeded draw.
* ``latency`` — lowest recent latency (peak-EWMA; a candidate without a sample scores 0
  so it is tried); with probability :data:`EXPLORE` another candidate goes first, so a
  recovered candidate gets traffic back.
* ``cost`` — cheapest estimate for this request; unknown prices last; ties by weight.

A weight of 0 drains a candidate in every strategy: it goes last and the walk skips it
as ``drained`` (:func:`llm_routing.availability.may_try`).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["EXPLORE", "STRATEGIES", "Candidate", "Inputs", "Pick", "order"]

#: The strategies a step of several entries may use.
STRATEGIES = ("weighted", "least_in_flight", "latency", "cost")
#: The latency strategy's exploration floor: the share of requests on which a candidate
#: other than the fastest goes first.
EXPLORE = 0.05


@dataclass(frozen=True, slots=True)
class Candidate:
    """One member of a step: a provider, its model override and its weight."""

    name: str
    model: str = ""
    weight: float = 1.0

    @property
    def drained(self) -> bool:
        return self.weight <= 0


@dataclass(frozen=True, slots=True)
class Inputs:
    """What :mod:`llm_routing.balance` gathered for a step (only what its strategy reads)."""

    counts: Mapping[str, int] = field(default_factory=dict)  # requests in flight
    latencies: Mapping[str, float | None] = field(default_factory=dict)  # peak-EWMA ms
    costs: Mapping[str, float | None] = field(default_factory=dict)  # estimated USD


@dataclass(frozen=True, slots=True)
class Pick:
    """Why a step's candidates were tried in this order (``routing_metadata.picks``)."""

    step: int
    strategy: str
    picked: str | None  # the first candidate in order that is not drained
    reason: str  # the strategy's name
    order: tuple[str, ...]
    weights: Mapping[str, float] = field(default_factory=dict)
    counts: Mapping[str, int] | None = None
    scores: Mapping[str, float | None] | None = None  # latency ms, or cost USD
    draw: float | None = None  # the seeded draw that made a weighted pick
    explored: bool = False  # latency: an exploration pick

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "step": self.step,
            "strategy": self.strategy,
            "picked": self.picked,
            "reason": self.reason,
            "order": list(self.order),
            "weights": dict(self.weights),
        }
        if self.counts is not None:
            out["counts"] = dict(self.counts)
        if self.scores is not None:
            out["scores"] = {
                k: (None if v is None else round(v, 9)) for k, v in self.scores.items()
            }
        if self.draw is not None:
            out["draw"] = self.draw
        if self.explored:
            out["explored"] = True
        return out


def _rng(seed: str, step: int) -> random.Random:
    # A str seed is hashed with SHA-512 (random.seed version 2): the same in every process.
    return random.Random(f"{seed}:{step}")  # noqa: S311 - load spreading, not secrets


def _weighted(live: list[Candidate], rng: random.Random) -> tuple[list[Candidate], float | None]:
    """Draw without replacement in proportion to the weights; the first draw's value."""
    pool = list(live)
    out: list[Candidate] = []
    first: float | None = None
    while pool:
        u = rng.random()
        if first is None:
            first = u
        target = u * sum(c.weight for c in pool)
        chosen = len(pool) - 1  # float rounding at the top end lands on the last
        acc = 0.0
        for i, c in enumerate(pool):
            acc += c.weight
            if target < acc:
                chosen = i
                break
        out.append(pool.pop(chosen))
    return out, first


def order(
    strategy: str,
    candidates: Sequence[Candidate],
    *,
    step: int,
    seed: str,
    inputs: Inputs | None = None,
    explore: float = EXPLORE,
) -> tuple[tuple[Candidate, ...], Pick]:
    """The step's candidates in the order to try them, and the :class:`Pick`.

    ``seed``: the request id (the same id and inputs always give the same order);
    ``inputs``: the counts, latencies or costs the strategy reads; ``explore``: the
    latency strategy's exploration share."""
    inputs = inputs or Inputs()
    live = [c for c in candidates if not c.drained]
    drained = [c for c in candidates if c.drained]
    rng = _rng(seed, step)
    weights = {c.name: c.weight for c in candidates}
    counts: dict[str, int] | None = None
    scores: dict[str, float | None] | None = None
    draw: float | None = None
    explored = False
    if strategy == "least_in_flight":
        counts = {c.name: int(inputs.counts.get(c.name, 0)) for c in candidates}
        tie = {c.name: rng.random() for c in live}
        ordered = sorted(live, key=lambda c: (counts[c.name], -c.weight, tie[c.name]))
    elif strategy == "latency":
        latency = {c.name: inputs.latencies.get(c.name) for c in candidates}
        scores = dict(latency)
        tie = {c.name: rng.random() for c in live}
        ordered = sorted(live, key=lambda c: (latency[c.name] or 0.0, tie[c.name]))
        if len(ordered) > 1 and rng.random() < explore:
            chosen = ordered[1 + int(rng.random() * (len(ordered) - 1))]
            ordered = [chosen, *(c for c in ordered if c is not chosen)]
            explored = True
    elif strategy == "cost":
        costs = {c.name: inputs.costs.get(c.name) for c in candidates}
        scores = dict(costs)
        position = {c.name: i for i, c in enumerate(candidates)}

        def cost_key(c: Candidate) -> tuple[bool, float, float, int]:
            cost = costs[c.name]
            return (cost is None, cost or 0.0, -c.weight, position[c.name])

        ordered = sorted(live, key=cost_key)
    else:  # weighted (the default of a step of several)
        ordered, draw = _weighted(live, rng)
    final = (*ordered, *drained)
    pick = Pick(
        step=step,
        strategy=strategy,
        picked=ordered[0].name if ordered else None,
        reason=strategy,
        order=tuple(c.name for c in final),
        weights=weights,
        counts=counts,
        scores=scores,
        draw=draw,
        explored=explored,
    )
    return final, pick
