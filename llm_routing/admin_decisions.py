"""How a routing decision reads in the admin: a failed request reads as a failure
everywhere (list, detail, timeline), never as "Selected provider: local-llm" with
"Fallback used ✓". Raw values stay one hover away (a tooltip), for grepping logs."""

from __future__ import annotations

from datetime import UTC, datetime

from django.contrib import admin
from django.utils.html import format_html
from django.utils.safestring import SafeString

from .admin_words import words
from .models import RoutingDecision

__all__ = ["DecisionDisplayMixin", "failed", "failure_words", "moment"]


def moment(value: datetime | None) -> str:
    """The admin's one date format: ``2026-12-04 14:07:31 UTC``."""
    if value is None:
        return "—"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def failed(obj: RoutingDecision) -> bool:
    """No provider answered this request (its status is not ``ok``)."""
    return obj.status != "ok"


def failure_words(obj: RoutingDecision) -> str:
    """Why the request failed, in words: the walk's end (``chain_exhausted``) or the
    last attempt's error category."""
    if obj.fallback_reason == "chain_exhausted":
        return words("chain_exhausted")
    categories = [a.error_category for a in obj.attempts.all() if a.error_category]
    return words(categories[-1]) if categories else "failed"


class DecisionDisplayMixin:
    """Display columns of :class:`~llm_routing.admin.RoutingDecisionAdmin`."""

    @admin.display(description="when", ordering="created_at")
    def when(self, obj: RoutingDecision) -> str:
        return moment(obj.created_at)

    @admin.display(description="result", ordering="status")
    def result(self, obj: RoutingDecision) -> SafeString:
        if failed(obj):
            return format_html(
                '<span class="llmr-failed" title="status {}, {}">Failed: {}</span>',
                obj.status,
                obj.fallback_reason or "no fallback",
                failure_words(obj),
            )
        return format_html(
            '<span class="llmr-answered" title="status {}">Answered</span>', obj.status
        )

    @admin.display(description="served by", ordering="selected_provider")
    def served_by(self, obj: RoutingDecision) -> SafeString:
        if failed(obj):
            last = obj.selected_provider or "none"
            return format_html('<span title="last tried: {}">— nobody</span>', last)
        return format_html("{}", obj.selected_provider or "—")

    @admin.display(description="fallback", ordering="fallback_used")
    def fallback(self, obj: RoutingDecision) -> SafeString:
        if failed(obj):
            return format_html(
                '<span title="no answer to fall back to; fallback_used={}">—</span>',
                obj.fallback_used,
            )
        if not obj.fallback_used:
            return format_html("{}", "no")
        return format_html(
            'yes: <span class="llmr-term" title="{}">{}</span>',
            obj.fallback_reason,
            words(obj.fallback_reason),
        )

    @admin.display(description="router mode", ordering="router_mode")
    def mode_words(self, obj: RoutingDecision) -> SafeString:
        return format_html(
            '<span class="llmr-term" title="{}">{}</span>', obj.router_mode, words(obj.router_mode)
        )
