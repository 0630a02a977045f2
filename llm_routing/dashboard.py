"""The admin dashboard's figures for a time window: aggregate queries only.

Attempt rows carry no timestamp of their own; they belong to a decision, and decision
ids grow with ``created_at`` (rows are inserted as requests finish). So a window is
turned once into the first decision id inside it (one index lookup on ``created_at``)
and every Attempt query filters on ``decision_id >= first`` — a range over the
``(decision, provider, outcome, latency_ms)`` index, with no join. A decision inserted
a few milliseconds out of id order at the window's very edge may be counted in the
neighbouring window; nothing else is approximate.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import connections, router
from django.db.models import Aggregate, Count, F, FloatField, Q
from django.utils import timezone

from .models import Attempt, RoutingDecision

__all__ = [
    "DEFAULT_WINDOW",
    "WINDOWS",
    "Dashboard",
    "attempts_by_outcome",
    "build",
    "first_decision_id",
    "latency_percentiles",
    "request_summary",
    "top_skip_reasons",
]

WINDOWS: dict[str, timedelta] = {
    "1h": timedelta(hours=1),
    "24h": timedelta(hours=24),
    "7d": timedelta(days=7),
}
DEFAULT_WINDOW = "24h"
TOP_REASONS = 8
#: Above this many decisions in the window, percentiles come from a systematic sample
#: (every k-th decision id) of about this many decisions.
PERCENTILE_SAMPLE = 20_000


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


def _attempts(first_id: int) -> Any:
    return Attempt.objects.filter(decision_id__gte=first_id)


def request_summary(since: datetime) -> dict[str, Any]:
    row = RoutingDecision.objects.filter(created_at__gte=since).aggregate(
        requests=Count("*"), fallbacks=Count("created_at", filter=Q(fallback_used=True))
    )
    requests, fallbacks = int(row["requests"] or 0), int(row["fallbacks"] or 0)
    return {
        "requests": requests,
        "fallbacks": fallbacks,
        "fallback_rate": fallbacks / requests if requests else 0.0,
    }


def attempts_by_outcome(first_id: int | None) -> dict[str, dict[str, int]]:
    """provider -> outcome -> count."""
    if first_id is None:
        return {}
    out: dict[str, dict[str, int]] = {}
    rows = (
        _attempts(first_id)
        .values("provider", "outcome")
        .annotate(n=Count("*"))
        .order_by("provider", "outcome")
    )
    for row in rows:
        out.setdefault(row["provider"], {})[row["outcome"]] = int(row["n"])
    return out


def latency_percentiles(first_id: int | None) -> dict[str, tuple[float, float]]:
    """provider -> (p50, p95) latency in ms of the attempts that called the upstream
    (skips excluded). PostgreSQL computes them in the query; other databases get the
    same figures (linear interpolation) from the latencies in Python. Windows of more
    than ``2 * PERCENTILE_SAMPLE`` decisions are sampled (every k-th decision id)."""
    if first_id is None:
        return {}
    called = _attempts(first_id).exclude(outcome=Attempt.Outcome.SKIPPED)
    last_id = RoutingDecision.objects.order_by("-id").values_list("id", flat=True).first() or 0
    step = (last_id - first_id + 1) // PERCENTILE_SAMPLE
    if step > 1:
        # A wide window: every step-th decision's attempts. Percentiles of a systematic
        # sample of >= PERCENTILE_SAMPLE requests, instead of sorting every latency.
        called = called.alias(sample=F("decision_id") % step).filter(sample=0)
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


def top_skip_reasons(first_id: int | None, limit: int = TOP_REASONS) -> list[tuple[str, int]]:
    if first_id is None:
        return []
    rows = (
        _attempts(first_id)
        .filter(outcome=Attempt.Outcome.SKIPPED)
        .values("reason")
        .annotate(n=Count("*"))
        .order_by("-n", "reason")[:limit]
    )
    return [(r["reason"] or "—", int(r["n"])) for r in rows]


@dataclass
class Dashboard:
    window: str
    since: datetime
    summary: dict[str, Any]
    outcomes: dict[str, dict[str, int]] = field(default_factory=dict)
    latency: dict[str, tuple[float, float]] = field(default_factory=dict)
    skips: list[tuple[str, int]] = field(default_factory=list)


def build(window: str = DEFAULT_WINDOW, *, now: datetime | None = None) -> Dashboard:
    window = window if window in WINDOWS else DEFAULT_WINDOW
    since = (now or timezone.now()) - WINDOWS[window]
    first = first_decision_id(since)
    return Dashboard(
        window=window,
        since=since,
        summary=request_summary(since),
        outcomes=attempts_by_outcome(first),
        latency=latency_percentiles(first),
        skips=top_skip_reasons(first),
    )
