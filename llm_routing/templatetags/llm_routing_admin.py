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

register = template.Library()

OUTCOME_ORDER = ("ok", "error", "skipped")

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
                "Requests, fallbacks, failures, latency and spend",
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
    }
