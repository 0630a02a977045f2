"""The admin dashboard's figures for a time window: aggregate queries only.

Attempt rows carry no timestamp of their own; they belong to a decision, and decision
ids grow with ``created_at`` (rows are inserted as requests finish). So a window is
turned once into the first decision id inside it (one index lookup on ``created_at``)
and every Attempt query filters on ``decision_id >= first`` — a range over the
``(decision, provider, outcome, latency_ms)`` index, with no join. A decision inserted
a few milliseconds out of id order at the window's very edge may be counted in the
neighbouring window.

A window of more than ``2 * SAMPLE_DECISIONS`` decisions is *sampled* for the Attempt
charts: ``SAMPLE_BLOCKS`` evenly spaced stretches of consecutive decision ids, about
``SAMPLE_DECISIONS`` decisions in all (a time-stratified sample), read as index range
scans; counts are scaled up by the sampling ratio and the page says they are estimates.
The request and fallback counts are always exact.

The spend tables are :mod:`llm_routing.dashboard_spend`'s, the Steps and Hedges panels
:mod:`llm_routing.dashboard_steps`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import connections, router
from django.db.models import Aggregate, Count, FloatField, Q
from django.utils import timezone

from .dashboard_spend import Spend, spend
from .dashboard_steps import HedgeRow, StepSplit, hedges, step_splits
from .models import Attempt, RoutingDecision

__all__ = [
    "DEFAULT_WINDOW",
    "SAMPLE_BLOCKS",
    "SAMPLE_DECISIONS",
    "WINDOWS",
    "Dashboard",
    "Slice",
    "attempts_by_outcome",
    "build",
    "first_decision_id",
    "latency_percentiles",
    "request_summary",
    "top_skip_reasons",
    "window_slice",
]

WINDOWS: dict[str, timedelta] = {
    "1h": timedelta(hours=1),
    "24h": timedelta(hours=24),
    "7d": timedelta(days=7),
}
DEFAULT_WINDOW = "24h"
TOP_REASONS = 8
#: Windows of more than twice this many decisions feed the Attempt charts from a sample
#: of about this many decisions, in SAMPLE_BLOCKS evenly spaced stretches of ids.
SAMPLE_DECISIONS = 20_000
SAMPLE_BLOCKS = 40


@dataclass(frozen=True)
class Slice:
    """The Attempt rows of a window: a filter on decision ids, and the factor that turns
    counts of the filtered rows into counts of the whole window (1.0: exact)."""

    where: Q
    scale: float = 1.0
    decisions: int = 0  # decisions the filter covers

    @property
    def sampled(self) -> bool:
        return self.scale > 1.0


class _PercentileCont(Aggregate):
    """PostgreSQL's ``percentile_cont(p) WITHIN GROUP (ORDER BY expr)``."""

    function = "percentile_cont"
    template = "%(function)s(%(fraction)s) WITHIN GROUP (ORDER BY %(expressions)s)"
    output_field = FloatField()

    def __init__(self, expression: Any, fraction: float, **extra: Any) -> None:
        super().__init__(expression, fraction=float(fraction), **extra)


def first_decision_id(since: datetime) -> int | None:
    """The id of the first decision at or after ``since`` (None: the window is empty)."""
    return (
        RoutingDecision.objects.filter(created_at__gte=since)
        .order_by("created_at")
        .values_list("id", flat=True)
        .first()
    )


def window_slice(since: datetime) -> Slice | None:
    """The Attempt rows of the window starting at ``since`` (None: no decision in it)."""
    first = first_decision_id(since)
    if first is None:
        return None
    last = RoutingDecision.objects.order_by("-id").values_list("id", flat=True).first() or first
    span = last - first + 1
    if span <= 2 * SAMPLE_DECISIONS:
        return Slice(Q(decision_id__gte=first), 1.0, span)
    size = max(1, SAMPLE_DECISIONS // SAMPLE_BLOCKS)
    stride = span / SAMPLE_BLOCKS
    where = Q()
    for block in range(SAMPLE_BLOCKS):
        low = first + int(block * stride)
        where |= Q(decision_id__gte=low, decision_id__lt=low + size)
    covered = size * SAMPLE_BLOCKS
    return Slice(where, span / covered, covered)


def _attempts(window: Slice) -> Any:
    return Attempt.objects.filter(window.where)


def request_summary(since: datetime) -> dict[str, Any]:
    """Requests, those with a fallback, and those that failed (no answer: status not
    ``ok``) in the window."""
    row = RoutingDecision.objects.filter(created_at__gte=since).aggregate(
        requests=Count("*"),
        fallbacks=Count("created_at", filter=Q(fallback_used=True)),
        failures=Count("created_at", filter=~Q(status="ok")),
    )
    requests, fallbacks = int(row["requests"] or 0), int(row["fallbacks"] or 0)
    failures = int(row["failures"] or 0)
    return {
        "requests": requests,
        "fallbacks": fallbacks,
        "fallback_rate": fallbacks / requests if requests else 0.0,
        "failures": failures,
        "failure_rate": failures / requests if requests else 0.0,
    }


def attempts_by_outcome(window: Slice | None) -> dict[str, dict[str, int]]:
    """provider -> outcome -> count (scaled up when the window is sampled)."""
    if window is None:
        return {}
    out: dict[str, dict[str, int]] = {}
    rows = (
        _attempts(window)
        .values("provider", "outcome")
        .annotate(n=Count("*"))
        .order_by("provider", "outcome")
    )
    for row in rows:
        out.setdefault(row["provider"], {})[row["outcome"]] = round(row["n"] * window.scale)
    return out


def latency_percentiles(window: Slice | None) -> dict[str, tuple[float, float]]:
    """provider -> (p50, p95) latency in ms of the attempts that called the upstream
    (skips excluded). PostgreSQL computes them in the query; other databases get the
    same figures (linear interpolation) from the latencies in Python."""
    if window is None:
        return {}
    called = _attempts(window).exclude(outcome=Attempt.Outcome.SKIPPED)
    vendor = connections[router.db_for_read(Attempt)].vendor
    if vendor == "postgresql":
        rows = (
            called.values("provider")
            .annotate(
                p50=_PercentileCont("latency_ms", 0.5), p95=_PercentileCont("latency_ms", 0.95)
            )
            .order_by("provider")
        )
        return {r["provider"]: (float(r["p50"]), float(r["p95"])) for r in rows}
    values: dict[str, list[float]] = {}
    for provider, latency in called.values_list("provider", "latency_ms").order_by(
        "provider", "latency_ms"
    ):
        values.setdefault(provider, []).append(float(latency))
    return {p: (_percentile(v, 0.5), _percentile(v, 0.95)) for p, v in values.items()}


def _percentile(ordered: list[float], fraction: float) -> float:
    """``percentile_cont`` on an ordered list (linear interpolation)."""
    if not ordered:
        return 0.0
    rank = fraction * (len(ordered) - 1)
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def top_skip_reasons(window: Slice | None, limit: int = TOP_REASONS) -> list[tuple[str, int]]:
    if window is None:
        return []
    rows = (
        _attempts(window)
        .filter(outcome=Attempt.Outcome.SKIPPED)
        .values("reason")
        .annotate(n=Count("*"))
        .order_by("-n", "reason")[:limit]
    )
    return [(r["reason"] or "—", round(r["n"] * window.scale)) for r in rows]


@dataclass
class Dashboard:
    window: str
    since: datetime
    summary: dict[str, Any]
    outcomes: dict[str, dict[str, int]] = field(default_factory=dict)
    latency: dict[str, tuple[float, float]] = field(default_factory=dict)
    skips: list[tuple[str, int]] = field(default_factory=list)
    sampled_decisions: int | None = None  # set when the Attempt charts are estimates
    spend: Spend | None = None  # per provider / user (dashboard_spend)
    steps: list[StepSplit] = field(default_factory=list)  # per step of several
    hedges: list[HedgeRow] = field(default_factory=list)  # per chain that hedges


def build(window: str = DEFAULT_WINDOW, *, now: datetime | None = None) -> Dashboard:
    window = window if window in WINDOWS else DEFAULT_WINDOW
    since = (now or timezone.now()) - WINDOWS[window]
    part = window_slice(since)
    return Dashboard(
        window=window,
        since=since,
        summary=request_summary(since),
        outcomes=attempts_by_outcome(part),
        latency=latency_percentiles(part),
        skips=top_skip_reasons(part),
        sampled_decisions=part.decisions if part is not None and part.sampled else None,
        spend=spend(since),
        steps=step_splits(part.where if part is not None else None, part.scale if part else 1.0),
        hedges=hedges(since),
    )
