"""The shape of an explain-route answer (:func:`llm_routing.router.explain`): what the
walk would do with each candidate, were the request sent now. Data only."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .routing.plan import Plan

__all__ = ["AffinityExplanation", "CandidateExplanation", "Explanation", "HedgeExplanation"]


@dataclass(frozen=True)
class CandidateExplanation:
    """What the walk would do with one candidate, were the request sent now."""

    position: int
    provider: str
    model: str
    verdict: str  # "try" | "skip"
    reason: str | None = None  # the skip reason the walk would record
    missing_capability: str | None = None  # for "unsupported"
    circuit: str = "n/a"  # closed | open | half_open | n/a (the mock)
    open_until: float | None = None  # epoch seconds, while open
    probe: bool = False  # the call would be the half-open probe
    timeout_s: float | None = None
    first_token_timeout_s: float | None = None
    max_retries: int | None = None
    backstop: bool = False
    step: int | None = None  # the chain step (0 first); None: forced

    def to_dict(self) -> dict[str, object]:
        return {
            "position": self.position,
            "step": self.step,
            "provider": self.provider,
            "model": self.model,
            "verdict": self.verdict,
            "reason": self.reason,
            "missing_capability": self.missing_capability,
            "circuit": self.circuit,
            "open_until": _iso_time(self.open_until),
            "probe": self.probe,
            "timeout_s": self.timeout_s,
            "first_token_timeout_s": self.first_token_timeout_s,
            "max_retries": self.max_retries,
            "backstop": self.backstop,
        }


@dataclass(frozen=True)
class AffinityExplanation:
    """What an affinity key would do in one step of several (docs/strategies.md)."""

    step: int
    remembered: str | None  # the provider that served the key last here (None: none)
    serves: str | None  # the candidate of the step the walk would try first now
    # kept: back to the remembered one; moved: it is unavailable, the key moves to
    # whoever answers; new: nothing remembered, the key is remembered for whoever answers
    outcome: str

    def to_dict(self) -> dict[str, object]:
        return {
            "step": self.step,
            "remembered": self.remembered,
            "serves": self.serves,
            "outcome": self.outcome,
        }


@dataclass(frozen=True)
class HedgeExplanation:
    """Whether the first attempt would be hedged now, when and with whom."""

    setting: int | str | None  # the chain's hedge_after_ms: milliseconds, "p95", None
    after_ms: float | None  # what it resolves to now (None: no delay, no hedge)
    primary: str | None  # the candidate the walk would try first
    candidate: str | None  # the hedge: the next one the walk would try (never the mock)
    reason: str | None = None  # why no hedge would start (None: it would, when due)

    def to_dict(self) -> dict[str, object]:
        return {
            "hedge_after_ms": self.setting,
            "after_ms": self.after_ms,
            "primary": self.primary,
            "candidate": self.candidate,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class Explanation:
    """:func:`explain`'s answer: the plan and each candidate's verdict, in order."""

    plan: Plan
    candidates: tuple[CandidateExplanation, ...]
    deadline_s: float
    max_attempts: int
    picks: tuple[Mapping[str, Any], ...] = ()  # per step of several: the strategy's pick
    affinity: tuple[AffinityExplanation, ...] | None = None  # None: no affinity key
    hedge: HedgeExplanation | None = None

    @property
    def first_try(self) -> CandidateExplanation | None:
        return next((c for c in self.candidates if c.verdict == "try"), None)

    def to_dict(self) -> dict[str, object]:
        first = self.first_try
        return {
            "router_mode": self.plan.router_mode,
            "rule": self.plan.rule,
            "chain_name": self.plan.chain_name,
            "requested_provider": self.plan.requested_provider,
            "configured": self.plan.configured,
            "stream_mode": self.plan.stream_mode,
            "would_serve_first": first.provider if first else None,
            "budget": {"deadline_s": self.deadline_s, "max_attempts": self.max_attempts},
            "candidates": [c.to_dict() for c in self.candidates],
            "picks": [dict(p) for p in self.picks],
            "affinity": (None if self.affinity is None else [a.to_dict() for a in self.affinity]),
            "hedge": self.hedge.to_dict() if self.hedge is not None else None,
        }


def _iso_time(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, tz=UTC).isoformat().replace("+00:00", "Z")
