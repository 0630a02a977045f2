"""The admin's routing figures: ``dashboard_context()`` (the dashboard page's charts and
tables), ``{% llmr_dashboard %}`` (the same, as an inclusion tag) and
``{% llmr_admin_links %}`` (the dashboard, circuit board and explain links at the top of
the admin index and of the app's index)."""

from __future__ import annotations

from typing import Any

from django import template
from django.urls import reverse

from ..admin_words import term, words
from ..charts import COLORS, Bar, Segment, bar_chart_svg, stacked_bar_chart_svg
from ..dashboard import DEFAULT_WINDOW, WINDOWS, build
from ..dashboard_steps import HedgeRow, StepSplit

register = template.Library()

OUTCOME_ORDER = ("ok", "error", "skipped", "hedge_lost", "hedge_skipped")

register.filter("llmr_words", words)
register.filter("llmr_term", term)


@register.inclusion_tag("admin/llm_routing/admin_links.html", takes_context=True)
def llmr_admin_links(context: template.Context) -> dict[str, Any]:
    """Links to the app's own pages, for the users who may open them."""
    request = context.get("request")
    user = getattr(request, "user", None)
    if user is None:
        return {"links": []}
    links: list[tuple[str, str, str]] = []
    if user.has_perm("llm_routing.view_routingdecision"):
        links.append(
            (
                reverse("admin:llm_routing_dashboard"),
                "Routing dashboard",
                "Requests, fallbacks, failures, latency, spend, steps and hedges",
            )
        )
    if user.has_perm("llm_routing.view_provider"):
        links.append(
            (
                reverse("admin:llm_routing_circuits"),
                "Circuit breakers",
                "Every provider's circuit: reset or force open",
            )
        )
        if user.has_perm("llm_routing.view_chain"):
            links.append(
                (
                    reverse("admin:llm_routing_explain"),
                    "Explain a route",
                    "What a request would do now, without sending it",
                )
            )
    return {"links": links}


@register.inclusion_tag("admin/llm_routing/dashboard.html", takes_context=True)
def llmr_dashboard(context: template.Context) -> dict[str, Any]:
    request = context.get("request")
    user = getattr(request, "user", None)
    if request is None or user is None or not user.has_perm("llm_routing.view_routingdecision"):
        return {"allowed": False}
    return dashboard_context(request.GET.get("window", DEFAULT_WINDOW))


def dashboard_context(window: str) -> dict[str, Any]:
    """The dashboard's figures for ``window`` (one of ``WINDOWS``), ready to render."""
    board = build(window)
    summary = board.summary
    outcomes = stacked_bar_chart_svg(
        "Attempts by outcome, per provider",
        [
            (
                provider,
                [
                    Segment(o, float(counts.get(o, 0)), COLORS[o])
                    for o in OUTCOME_ORDER
                    if counts.get(o)
                ],
            )
            for provider, counts in sorted(board.outcomes.items())
        ],
    )
    latency = stacked_bar_chart_svg(
        "Latency per provider: p50, then p95 (ms)",
        [
            (
                provider,
                [
                    Segment("p50", p50, COLORS["p50"]),
                    Segment("to p95", max(0.0, p95 - p50), COLORS["p95"]),
                ],
            )
            for provider, (p50, p95) in sorted(board.latency.items())
        ],
    )
    skips = bar_chart_svg(
        "Top skip reasons",
        [Bar(words(reason), float(n), COLORS["skipped"], reason) for reason, n in board.skips],
    )
    return {
        "allowed": True,
        "windows": list(WINDOWS),
        "window": board.window,
        "requests": summary["requests"],
        "fallbacks": summary["fallbacks"],
        "fallback_pct": round(100 * summary["fallback_rate"], 1),
        "failures": summary["failures"],
        "failure_pct": round(100 * summary["failure_rate"], 1),
        "charts": [outcomes, latency, skips],
        "sampled_decisions": board.sampled_decisions,
        "latency": [(p, round(p50), round(p95)) for p, (p50, p95) in sorted(board.latency.items())],
        "spend": board.spend,
        "steps": [_step_view(s) for s in board.steps],
        "hedges": [_hedge_view(h) for h in board.hedges],
    }


def _pct(fraction: float | None) -> str:
    return "—" if fraction is None else f"{100 * fraction:.1f}"


def _step_view(split: StepSplit) -> dict[str, Any]:
    """One step of several, ready to render: per candidate the served answers and share,
    the configured share (weighted), the drift in percentage points, and the bar's
    widths (0..100)."""
    rows = []
    for c in split.candidates:
        drift = c.drift
        rows.append(
            {
                "provider": c.provider,
                "served": c.served,
                "share": _pct(c.share if split.served else None),
                "weight": "—" if c.weight is None else f"{c.weight:g}",
                "configured": _pct(c.weight_share),
                "drift": "—" if drift is None or not split.served else f"{100 * drift:+.1f}",
                "bar": round(100 * c.share, 1) if split.served else 0.0,
                "mark": None if c.weight_share is None else round(100 * c.weight_share, 1),
                "gone": c.weight is None,
            }
        )
    return {
        "chain": split.chain,
        "step": split.step,
        "strategy": split.strategy,
        "weighted": split.strategy == "weighted",
        "served": split.served,
        "rows": rows,
    }


def _hedge_view(row: HedgeRow) -> dict[str, Any]:
    return {
        "chain": row.chain or "—",
        "hedge_after": (
            "off now"
            if not row.hedge_after
            else ("p95" if row.hedge_after == "p95" else f"{row.hedge_after} ms")
        ),
        "requests": row.requests,
        "hedged": row.hedged,
        "won": row.counts.get("won", 0),
        "lost": row.counts.get("lost", 0),
        "failed": row.counts.get("failed", 0),
        "skipped": row.counts.get("skipped", 0),
        "skip_reasons": row.skip_reasons,
        "rate": _pct(row.rate),
    }
