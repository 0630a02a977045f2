"""The dashboard's "Steps" and "Hedges" panels for its window (docs/strategies.md).

**Steps.** For every step of several entries of every chain — as the router reads the
configuration (:func:`llm_routing.snapshot.current`), so the step numbers are the
``step`` the Attempt rows carry (0 first) — the answers each candidate served in the
window, their share of the step's answers, and for a ``weighted`` step the share its
weight asks for. One aggregate query over the served Attempt rows of the window's slice
(sampled and scaled like the other Attempt charts), joined to their decision for the
chain's name (the join restricted to the same decision ids). How each pick was made
(the strategy, or prompt-cache affinity) is not stored with the rows:
``llm_routing_picks_total{reason}`` counts it.

**Hedges.** For every chain that hedges (``hedge_after_ms``), or whose requests hedged
in the window: its requests, and how their hedge went — ``won``, ``lost``, ``failed``,
``skipped`` (the decision's ``hedge``, the ``routing_metadata.hedge`` of the answer).
One aggregate query over the ``(created_at, chain_name, hedge)`` index, exact (not
sampled); when hedges were skipped, one more for their reasons (the ``hedge_skipped``
attempts of those requests only).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from django.db.models import Count, FilteredRelation, Q

from . import snapshot
from .models import Attempt, RoutingDecision

__all__ = [
    "HEDGE_OUTCOMES",
    "HedgeRow",
    "StepCandidate",
    "StepSplit",
    "hedges",
    "step_splits",
]

#: How a request's hedge went (RoutingDecision.hedge; "" — no hedge was due).
HEDGE_OUTCOMES = ("won", "lost", "failed", "skipped")


@dataclass(frozen=True)
class StepCandidate:
    provider: str
    served: int  # answers it served from this step in the window (scaled when sampled)
    share: float  # of the step's served answers, 0..1
    weight: float | None = None  # configured weight (None: not in the step now)
    weight_share: float | None = None  # weighted steps: weight / the step's weights

    @property
    def drift(self) -> float | None:
        """Served share minus configured share (weighted steps), in points of 0..1."""
        return None if self.weight_share is None else self.share - self.weight_share


@dataclass(frozen=True)
class StepSplit:
    chain: str
    step: int  # 0 first, as Attempt.step and routing_metadata.picks
    strategy: str
    served: int  # answers the step served in the window
    candidates: tuple[StepCandidate, ...]


@dataclass(frozen=True)
class HedgeRow:
    chain: str
    hedge_after: str  # the chain's hedge_after_ms now ("": no longer hedges)
    requests: int  # the chain's requests in the window
    counts: dict[str, int] = field(default_factory=dict)  # HEDGE_OUTCOMES -> requests
    skip_reasons: tuple[tuple[str, int], ...] = ()  # (reason, requests), most first

    @property
    def hedged(self) -> int:
        """Requests that sent a second call (won, lost or failed)."""
        return sum(self.counts.get(o, 0) for o in ("won", "lost", "failed"))

    @property
    def rate(self) -> float:
        return self.hedged / self.requests if self.requests else 0.0


def _steps_of_several() -> dict[str, list[tuple[int, str, dict[str, float]]]]:
    """chain -> [(step index, strategy, {provider: weight})] for its steps of several."""
    out: dict[str, list[tuple[int, str, dict[str, float]]]] = {}
    for name, chain in sorted(snapshot.current().chains.items()):
        for index, (strategy, members) in enumerate(chain.steps()):
            if len(members) > 1:
                weights = {m.provider: float(m.weight) for m in members}
                out.setdefault(name, []).append((index, strategy or "weighted", weights))
    return out


def _on_decision(where: Q) -> Q:
    """A window's filter on ``Attempt.decision_id`` as the same filter on the joined
    decision's id (``decision__id__gte`` …, read inside a FilteredRelation)."""
    out = Q()
    out.connector, out.negated = where.connector, where.negated
    for child in where.children:
        if isinstance(child, Q):
            out.children.append(_on_decision(child))
        else:
            assert isinstance(child, tuple), child
            lookup, value = child
            assert lookup.startswith("decision_id__"), lookup
            out.children.append((lookup.replace("decision_id__", "decision__id__", 1), value))
    return out


def step_splits(where: Q | None, scale: float = 1.0) -> list[StepSplit]:
    """The served answers per candidate of every step of several, over the Attempt rows
    ``where`` selects (the window's slice; None: an empty window), counts times
    ``scale``."""
    config = _steps_of_several()
    if not config:
        return []
    served: dict[tuple[str, int], dict[str, int]] = {}
    if where is not None:
        # The decision side of the join gets the same id ranges (in its ON clause):
        # without them PostgreSQL hashes every decision row to find the chain names.
        rows = (
            Attempt.objects.filter(where, served=True)
            .exclude(step=None)
            .alias(d=FilteredRelation("decision", condition=_on_decision(where)))
            .filter(d__chain_name__in=list(config))
            .values("d__chain_name", "step", "provider")
            .annotate(n=Count("*"))
            .order_by()
        )
        for row in rows:
            key = (row["d__chain_name"], row["step"] or 0)  # never None: excluded
            served.setdefault(key, {})[row["provider"]] = round(row["n"] * scale)
    out: list[StepSplit] = []
    for chain, steps in config.items():
        for index, strategy, weights in steps:
            counts = served.get((chain, index), {})
            total = sum(counts.values())
            weight_sum = sum(weights.values())
            shares = strategy == "weighted" and weight_sum > 0
            names = list(weights) + sorted(set(counts) - set(weights))
            candidates = tuple(
                StepCandidate(
                    provider=name,
                    served=counts.get(name, 0),
                    share=counts.get(name, 0) / total if total else 0.0,
                    weight=weights.get(name),
                    weight_share=(
                        weights[name] / weight_sum if shares and name in weights else None
                    ),
                )
                for name in names
            )
            out.append(StepSplit(chain, index, strategy, total, candidates))
    return out


def hedges(since: datetime) -> list[HedgeRow]:
    """Per chain that hedges now or hedged in the window: requests and hedge outcomes."""
    hedging = {
        name: chain.hedge_after_ms
        for name, chain in snapshot.current().chains.items()
        if chain.hedge_after_ms
    }
    rows = (
        RoutingDecision.objects.filter(created_at__gte=since)
        .filter(Q(chain_name__in=list(hedging)) | ~Q(hedge=""))
        .values("chain_name", "hedge")
        .annotate(n=Count("*"))
        .order_by()
    )
    requests: dict[str, int] = dict.fromkeys(hedging, 0)
    counts: dict[str, dict[str, int]] = {}
    for row in rows:
        chain = row["chain_name"]
        requests[chain] = requests.get(chain, 0) + row["n"]
        if row["hedge"]:
            per = counts.setdefault(chain, {})
            per[row["hedge"]] = per.get(row["hedge"], 0) + row["n"]
    reasons: dict[str, list[tuple[str, int]]] = {}
    if any(c.get("skipped") for c in counts.values()):
        skipped = (
            Attempt.objects.filter(
                decision__created_at__gte=since,
                decision__hedge="skipped",
                outcome=Attempt.Outcome.HEDGE_SKIPPED,
            )
            .values("decision__chain_name", "reason")
            .annotate(n=Count("decision", distinct=True))
            .order_by("-n", "reason")
        )
        for skip in skipped:
            reasons.setdefault(skip["decision__chain_name"], []).append(
                (skip["reason"] or "—", skip["n"])
            )
    # Chains hedging now first, then those that hedged in the window only; by name.
    order = sorted(requests, key=lambda c: (c not in hedging, c))
    return [
        HedgeRow(
            chain=chain,
            hedge_after=hedging.get(chain, ""),
            requests=requests[chain],
            counts={o: counts.get(chain, {}).get(o, 0) for o in HEDGE_OUTCOMES},
            skip_reasons=tuple(reasons.get(chain, ())),
        )
        for chain in order
    ]
