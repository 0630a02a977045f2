"""Admin for every model. Key values are never shown: only a key-present badge."""

from __future__ import annotations

import uuid
from typing import Any, TypeVar

from django.contrib import admin, messages
from django.db.models import Model, QuerySet
from django.http import HttpRequest
from django.utils.html import format_html

from .models import (
    Attempt,
    AuditJob,
    Chain,
    ChainEntry,
    Provider,
    RoutingDecision,
    RoutingRule,
)
from .resilience import breaker

_M = TypeVar("_M", bound=Model)


@admin.register(Provider)
class ProviderAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "kind",
        "model",
        "mode",
        "enabled",
        "key_badge",
        "circuit",
        "updated_at",
    ]
    list_filter = ["kind", "mode", "enabled"]
    actions = ["reset_circuits"]
    search_fields = ["name", "model"]
    readonly_fields = ["key_badge", "created_at", "updated_at"]
    fieldsets = [
        (None, {"fields": ["name", "kind", "model", "base_url", "enabled", "mode"]}),
        ("Key", {"fields": ["api_key_env", "key_badge"]}),
        ("Limits", {"fields": ["timeout_s", "first_token_timeout_s", "max_retries", "params"]}),
        (
            "Capabilities",
            {
                "fields": [
                    "supports_structured_output",
                    "supports_streaming",
                    "supports_prefill",
                    "supports_tools",
                    "supports_images",
                ]
            },
        ),
        ("Timestamps", {"fields": ["created_at", "updated_at"]}),
    ]

    @admin.display(description="key")
    def key_badge(self, obj: Provider) -> str:
        if obj.pk is None or not obj.api_key_env:
            return "—"
        if obj.key_present:
            return format_html(
                '<span class="llmr-key llmr-key-ok" title="{}">present</span>', obj.api_key_env
            )
        return format_html(
            '<span class="llmr-key llmr-key-missing" title="{}">missing</span>', obj.api_key_env
        )

    @admin.display(description="circuit")
    def circuit(self, obj: Provider) -> str:
        """Passive health of the provider's own model, from real calls only."""
        if obj.pk is None:
            return "—"
        circuit = breaker.store.load(obj.name, obj.model)
        now = breaker.store.clock()
        phase = circuit.phase(now)
        detail = []
        if circuit.failures:
            detail.append(f"{circuit.failures} consecutive failure(s)")
        if circuit.last_error_category:
            status = f" {circuit.last_http_status}" if circuit.last_http_status else ""
            detail.append(f"last error: {circuit.last_error_category}{status}")
        if phase == breaker.OPEN and circuit.open_until is not None:
            detail.append(f"retry in {max(0.0, circuit.open_until - now):.1f}s")
        return format_html(
            '<span class="llmr-circuit llmr-circuit-{}" title="{}">{}</span>',
            phase,
            "; ".join(detail) or "no failures seen",
            phase.replace("_", "-"),
        )

    @admin.action(description="Reset the circuit breaker of the selected providers")
    def reset_circuits(self, request: HttpRequest, queryset: QuerySet[Provider]) -> None:
        rows = list(queryset)
        count = sum(breaker.store.reset_provider(p) for p in rows)
        message = f"Reset {count} circuit(s) of {len(rows)} provider(s)."
        self.message_user(request, message, messages.SUCCESS)


class ChainEntryInline(admin.TabularInline):
    model = ChainEntry
    extra = 1
    ordering = ["position"]
    fields = ["position", "provider", "model", "enabled"]
    autocomplete_fields = ["provider"]


@admin.register(Chain)
class ChainAdmin(admin.ModelAdmin):
    list_display = ["name", "is_default", "stream_mode", "providers", "description"]
    list_filter = ["is_default"]
    search_fields = ["name"]
    inlines = [ChainEntryInline]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Chain]:
        return super().get_queryset(request).prefetch_related("entries__provider")

    @admin.display(description="providers (in order)")
    def providers(self, obj: Chain) -> str:
        entries = sorted(obj.entries.all(), key=lambda e: e.position)
        return " → ".join(e.provider.name for e in entries if e.enabled) or "—"


@admin.register(ChainEntry)
class ChainEntryAdmin(admin.ModelAdmin):
    list_display = ["chain", "position", "provider", "model", "enabled"]
    list_filter = ["chain", "enabled"]
    list_select_related = ["chain", "provider"]
    ordering = ["chain__name", "position"]
    autocomplete_fields = ["provider"]


@admin.register(RoutingRule)
class RoutingRuleAdmin(admin.ModelAdmin):
    list_display = ["name", "priority", "enabled", "route", "task_glob", "chain"]
    list_filter = ["enabled", "chain"]
    list_editable = ["priority", "enabled"]
    search_fields = ["name", "route", "task_glob"]
    ordering = ["priority", "name"]


def _search_by_request_id(
    queryset: QuerySet[_M], term: str, uuid_field: str, text_field: str
) -> QuerySet[_M]:
    """An exact request-id match for a UUID; anything else searches ``text_field``
    (an exact UUID lookup with a malformed value would raise)."""
    term = term.strip()
    if not term:
        return queryset
    try:
        uuid.UUID(term)
    except ValueError:
        return queryset.filter(**{f"{text_field}__icontains": term})
    return queryset.filter(**{uuid_field: term})


class ReadOnlyMixin:
    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


ATTEMPT_FIELDS = (
    "index",
    "provider",
    "model",
    "outcome",
    "reason",
    "http_status",
    "transient",
    "retries",
    "latency_ms",
    "served",
    "partial",
)


class AttemptInline(ReadOnlyMixin, admin.TabularInline):
    model = Attempt
    extra = 0
    can_delete = False
    fields = ATTEMPT_FIELDS
    readonly_fields = ATTEMPT_FIELDS


@admin.register(RoutingDecision)
class RoutingDecisionAdmin(ReadOnlyMixin, admin.ModelAdmin):
    list_display = [
        "created_at",
        "request_id",
        "task",
        "router_mode",
        "selected_provider",
        "status",
        "fallback_used",
        "fallback_reason",
        "total_latency_ms",
    ]
    list_filter = ["status", "router_mode", "fallback_used", "selected_provider", "created_at"]
    search_fields = ["=request_id", "task"]
    date_hierarchy = "created_at"
    inlines = [AttemptInline]

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[RoutingDecision], search_term: str
    ) -> tuple[QuerySet[RoutingDecision], bool]:
        return _search_by_request_id(queryset, search_term, "request_id", "task"), False


@admin.register(Attempt)
class AttemptAdmin(ReadOnlyMixin, admin.ModelAdmin):
    list_display = ["decision", *ATTEMPT_FIELDS]
    list_filter = ["outcome", "provider", "served", "decision__created_at"]
    search_fields = ["=decision__request_id"]
    list_select_related = ["decision"]

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Attempt], search_term: str
    ) -> tuple[QuerySet[Attempt], bool]:
        return (
            _search_by_request_id(queryset, search_term, "decision__request_id", "provider"),
            False,
        )


AUDIT_JOB_FIELDS = (
    "id",
    "owner",
    "task",
    "status",
    "request_id",
    "claims",
    "lease_expires_at",
    "error",
    "created_at",
    "started_at",
    "finished_at",
)


@admin.register(AuditJob)
class AuditJobAdmin(ReadOnlyMixin, admin.ModelAdmin):
    """Async jobs: state only. The stored payload (raw input) is never shown."""

    list_display = ["created_at", "id", "owner", "task", "status", "claims", "finished_at"]
    list_filter = ["status", "created_at"]
    list_select_related = ["owner"]
    date_hierarchy = "created_at"
    fields = AUDIT_JOB_FIELDS
    readonly_fields = AUDIT_JOB_FIELDS
