"""The Budget admin pages (docs/budgets.md): each budget's use against its caps in the
current window, read from the live counters (one cache read per budget shown)."""

from __future__ import annotations

from django.contrib import admin
from django.utils.html import format_html

from . import budgets
from .models import Budget

__all__ = ["BudgetAdmin"]


def _use(obj: Budget) -> budgets.Usage | None:
    if obj.pk is None:
        return None
    try:
        return budgets.usage([obj])[obj.name]
    except Exception:  # the cache is down: the page still opens
        return None


def _against(used: object, cap: object) -> str:
    return f"{used} / {cap if cap is not None else '∞'}"


@admin.register(Budget)
class BudgetAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "scope",
        "shown_subject",
        "window",
        "requests_used",
        "tokens_used",
        "cost_used",
        "resets_at",
        "enabled",
    ]
    list_filter = ["scope", "window", "enabled", "on_cache_down"]
    search_fields = ["name", "subject"]
    readonly_fields = ["use_this_window"]
    fieldsets = [
        (None, {"fields": ["name", "scope", "subject", "window", "enabled"]}),
        ("Caps (at least one)", {"fields": ["max_requests", "max_tokens", "max_cost_usd"]}),
        ("Policy", {"fields": ["soft_threshold", "on_cache_down"]}),
        ("This window", {"fields": ["use_this_window"]}),
    ]

    @admin.display(description="subject", ordering="subject")
    def shown_subject(self, obj: Budget) -> str:
        if obj.scope == Budget.Scope.TOKEN and len(obj.subject) > 8:
            return obj.subject[:4] + "…"  # a token key is a credential
        return obj.subject or "—"

    @admin.display(description="requests")
    def requests_used(self, obj: Budget) -> str:
        use = _use(obj)
        return _against(use.requests, obj.max_requests) if use else "cache unavailable"

    @admin.display(description="tokens")
    def tokens_used(self, obj: Budget) -> str:
        use = _use(obj)
        return _against(use.tokens, obj.max_tokens) if use else "—"

    @admin.display(description="cost (USD)")
    def cost_used(self, obj: Budget) -> str:
        use = _use(obj)
        return _against(use.cost_usd.normalize(), obj.max_cost_usd) if use else "—"

    @admin.display(description="resets at (UTC)")
    def resets_at(self, obj: Budget) -> str:
        _, end = budgets.window_bounds(obj.window, budgets.clock())
        return end.strftime("%Y-%m-%d %H:%M")

    @admin.display(description="use against cap")
    def use_this_window(self, obj: Budget) -> str:
        if obj.pk is None:
            return "—"
        use = _use(obj)
        if use is None:
            return "The counters are unavailable (cache down)."
        start, end = budgets.window_bounds(obj.window, budgets.clock())
        return format_html(
            "requests {} · tokens {} · cost {} USD<br>window {} to {} UTC",
            _against(use.requests, obj.max_requests),
            _against(use.tokens, obj.max_tokens),
            _against(use.cost_usd.normalize(), obj.max_cost_usd),
            start.strftime("%Y-%m-%d %H:%M"),
            end.strftime("%Y-%m-%d %H:%M"),
        )
