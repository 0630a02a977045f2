"""``{% llmr_dashboard %}``: the charts on the app's admin index page."""

from __future__ import annotations

from typing import Any

from django import template

from ..charts import COLORS, Bar, Segment, bar_chart_svg, stacked_bar_chart_svg
from ..dashboard import DEFAULT_WINDOW, WINDOWS, build

register = template.Library()

OUTCOME_ORDER = ("ok", "error", "skipped")


@register.inclusion_tag("admin/llm_routing/dashboard.html", takes_context=True)
def llmr_dashboard(context: template.Context) -> dict[str, Any]:
    request = context.get("request")
    user = getattr(request, "user", None)
    if request is None or user is None or not user.has_perm("llm_routing.view_routingdecision"):
        return {"allowed": False}
    window = request.GET.get("window", DEFAULT_WINDOW)
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
        "Top skip reasons", [Bar(reason, float(n), COLORS["skipped"]) for reason, n in board.skips]
    )
    return {
        "allowed": True,
        "windows": list(WINDOWS),
        "window": board.window,
        "requests": summary["requests"],
        "fallbacks": summary["fallbacks"],
        "fallback_pct": round(100 * summary["fallback_rate"], 1),
        "charts": [outcomes, latency, skips],
        "sampled_decisions": board.sampled_decisions,
        "latency": [(p, round(p50), round(p95)) for p, (p50, p95) in sorted(board.latency.items())],
        "spend": board.spend,
    }
