"""Admin for every model. Key values are never shown: only a key-present badge."""

from __future__ import annotations

import re
import uuid
from typing import Any, TypeVar, cast

from django import forms
from django.contrib import admin, messages
from django.db.models import Model, QuerySet
from django.http import HttpRequest
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html, format_html_join

from .admin_chain import ChainEntryForm, ChainEntryFormSet, save_entries, steps_summary
from .admin_decisions import DecisionDisplayMixin, failed, failure_words, moment
from .admin_views import circuit_board_view, dashboard_view, explain_url, explain_view
from .admin_words import term, words
from .charts import TimelineItem, timeline_svg
from .models import (
    Attempt,
    AuditJob,
    Chain,
    ChainEntry,
    Provider,
    RoutingDecision,
    RoutingRule,
)
from .providers.registry import get_adapter, known_kinds
from .resilience import breaker
from .service import execute
from .types import AuditRequest

_M = TypeVar("_M", bound=Model)

#: The task and input of the "Test the selected providers" action.
ADMIN_TEST_TASK = "admin_test"
ADMIN_TEST_INPUT = "Reply with the single word: pong"

#: The capabilities a request may need (``adapter.supports(name)``).
CAPABILITIES = ("structured_output", "streaming", "prefill", "embeddings")


class ProviderForm(forms.ModelForm):
    """``kind`` is a choice among the registered adapter kinds (built-in, from
    ``LLM_ROUTING["PROVIDER_KINDS"]`` and ``register()``), read when the form is built."""

    kind = forms.ChoiceField(choices=(), help_text=Provider._meta.get_field("kind").help_text)

    class Meta:
        model = Provider
        exclude: list[str] = []  # every editable field; the admin's fieldsets pick them

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        kinds = known_kinds()
        current = self.instance.kind if self.instance.pk else ""
        if current and current not in kinds:
            kinds = [*kinds, current]  # shown so the page renders; refused on save
        field = cast(forms.ChoiceField, self.fields["kind"])
        field.choices = [("", "---------"), *((k, k) for k in kinds)]
        if current == "mock" and "mode" in self.fields:
            # The list shows what the router does; the form says why it differs.
            self.fields["mode"].help_text = (
                "A provider of kind mock answers offline whatever its mode: the list "
                "shows it as “mock (answers offline)”."
            )
        if "affinity_ttl_s" in self.fields:
            self.fields["affinity_ttl_s"].required = False  # empty: the default

    def clean_affinity_ttl_s(self) -> int:
        value = self.cleaned_data.get("affinity_ttl_s")
        default = Provider._meta.get_field("affinity_ttl_s").get_default()
        return int(default if value is None else value)


@admin.register(Provider)
class ProviderAdmin(admin.ModelAdmin):
    form = ProviderForm
    list_display = [
        "name",
        "kind",
        "model",
        "mode_shown",
        "enabled",
        "key_badge",
        "circuit",
        "updated",
    ]
    list_filter = ["kind", "mode", "enabled"]
    actions = ["test_providers", "reset_circuits"]
    search_fields = ["name", "model"]
    readonly_fields = [
        "key_badge",
        "circuit",
        "effective_capabilities",
        "explain_link",
        "created_at",
        "updated_at",
    ]
    fieldsets = [
        (None, {"fields": ["name", "kind", "model", "base_url", "enabled", "mode"]}),
        ("State", {"fields": ["circuit", "effective_capabilities", "explain_link"]}),
        ("Key", {"fields": ["api_key_env", "key_badge"]}),
        ("Limits", {"fields": ["timeout_s", "first_token_timeout_s", "max_retries", "params"]}),
        ("Price override", {"fields": ["input_price_per_mtok", "output_price_per_mtok"]}),
        ("Context and affinity", {"fields": ["context_window", "affinity_ttl_s"]}),
        (
            "Capabilities",
            {
                "fields": [
                    "supports_structured_output",
                    "supports_streaming",
                    "supports_prefill",
                    "supports_tools",
                    "supports_images",
                    "supports_embeddings",
                    "embedding_dimensions",
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

    def get_urls(self) -> list[URLPattern]:
        extra = [
            path(
                "circuits/",
                self.admin_site.admin_view(lambda request: circuit_board_view(request, self)),
                name="llm_routing_circuits",
            ),
        ]
        return extra + super().get_urls()

    @admin.display(description="effective capabilities")
    def effective_capabilities(self, obj: Provider) -> str:
        """What the adapter declares for this row (what the router checks)."""
        if obj.pk is None:
            return "—"
        try:
            adapter = get_adapter(obj.to_config())
        except Exception:  # an unknown or broken kind: the kind field says why
            return "— (no adapter for this kind)"
        return format_html_join(
            " ",
            '<span class="llmr-badge {}">{}: {}</span>',
            (
                (
                    "llmr-ok" if adapter.supports(cap) else "llmr-na",
                    cap,
                    "yes" if adapter.supports(cap) else "no",
                )
                for cap in CAPABILITIES
            ),
        )

    @admin.display(description="explain")
    def explain_link(self, obj: Provider) -> str:
        if obj.pk is None:
            return "—"
        return format_html(
            '<a href="{}">Explain a request that asks for this provider first</a>',
            explain_url(task="example", provider=obj.name),
        )

    @admin.display(description="updated", ordering="updated_at")
    def updated(self, obj: Provider) -> str:
        return moment(obj.updated_at)

    @admin.display(description="mode", ordering="mode")
    def mode_shown(self, obj: Provider) -> str:
        """The mode the router really uses (``mock`` for the mock kind and the backstop),
        in the form's own words; the stored mode in a tooltip when it differs."""
        label = str(Provider.Mode(obj.effective_mode).label)
        if obj.effective_mode == obj.mode:
            return label
        return format_html(
            '<span class="llmr-term" title="kind {}: stored mode {}">{}</span>',
            obj.kind,
            obj.mode,
            label,
        )

    @admin.display(description="circuit")
    def circuit(self, obj: Provider) -> str:
        """Passive health of the provider's own model, from real calls only."""
        if obj.pk is None:
            return "—"
        if obj.effective_mode == "mock":
            return format_html(
                '<span class="llmr-circuit llmr-circuit-n-a" title="{}">n/a</span>',
                "answers offline: no upstream, no circuit",
            )
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

    # Both actions need change permission on Provider (a test is a real call billed to the
    # operator's key; a reset changes what the router tries): a view-only user neither
    # sees them nor can post them. Each writes the admin history of its providers.
    @admin.action(
        description="Test the selected providers (one tiny real request each)",
        permissions=["change"],
    )
    def test_providers(self, request: HttpRequest, queryset: QuerySet[Provider]) -> None:
        """One request per provider through its adapter, forced to that provider and
        recorded as a normal routing decision with task ``admin_test``."""
        for provider in queryset.order_by("name"):
            routed = execute(
                AuditRequest(
                    task=ADMIN_TEST_TASK,
                    input_text=ADMIN_TEST_INPUT,
                    force_provider=provider.name,
                    max_tokens=16,
                )
            )
            result = routed.result
            link = reverse("admin:llm_routing_routingdecision_changelist")
            where = format_html(
                '<a href="{}?q={}">decision {}</a>', link, routed.request_id, routed.request_id
            )
            outcome = "ok" if result.ok else (result.error.category if result.error else "failed")
            self.log_change(
                request,
                provider,
                f"Tested with one real request: {outcome} (decision {routed.request_id}).",
            )
            if result.ok:
                self.message_user(
                    request,
                    format_html(
                        "{}: ok in {} from model {} ({}).",
                        provider.name,
                        _ms(result.latency_ms),
                        result.model or "—",
                        where,
                    ),
                    messages.SUCCESS,
                )
            else:
                error = result.error
                status = f" {error.http_status}" if error and error.http_status else ""
                self.message_user(
                    request,
                    format_html(
                        "{}: {}{} — {} ({}).",
                        provider.name,
                        error.category if error else result.status,
                        status,
                        error.message if error else "",
                        where,
                    ),
                    messages.ERROR,
                )

    @admin.action(
        description="Reset the circuit breaker of the selected providers",
        permissions=["change"],
    )
    def reset_circuits(self, request: HttpRequest, queryset: QuerySet[Provider]) -> None:
        rows = list(queryset)
        count = 0
        for p in rows:
            reset = breaker.store.reset_provider(p)
            count += reset
            self.log_change(request, p, f"Reset the circuit breaker ({reset} circuit(s)).")
        message = f"Reset {count} circuit(s) of {len(rows)} provider(s)."
        self.message_user(request, message, messages.SUCCESS)


class ChainEntryInline(admin.TabularInline):
    model = ChainEntry
    form = ChainEntryForm
    formset = ChainEntryFormSet
    extra = 1
    ordering = ["position"]
    fields = ["position", "provider", "model", "enabled", "step", "weight", "strategy"]
    autocomplete_fields = ["provider"]
    classes = ["llmr-chain-entries"]
    verbose_name = "entry"
    verbose_name_plural = (
        "entries (drag ☰ to reorder; tried top to bottom; entries sharing a step number "
        "form one step, picked by its strategy)"
    )

    def get_queryset(self, request: HttpRequest) -> QuerySet[ChainEntry]:
        return super().get_queryset(request).select_related("chain", "provider")


@admin.register(Chain)
class ChainAdmin(admin.ModelAdmin):
    list_display = ["name", "is_default", "stream_mode", "providers", "description"]
    list_filter = ["is_default"]
    search_fields = ["name"]
    inlines = [ChainEntryInline]
    filter_horizontal = ["allowed_users", "allowed_groups"]

    class Media:
        # Self-hosted drag handles that rewrite the position inputs (no CDN).
        js = ["llm_routing/admin/chain_order.js"]
        css = {"all": ["llm_routing/admin/llm_routing.css"]}

    readonly_fields = ["steps", "explain_link"]

    def get_urls(self) -> list[URLPattern]:
        site = self.admin_site
        extra = [
            path(
                "explain/",
                site.admin_view(lambda request: explain_view(request, site)),
                name="llm_routing_explain",
            ),
        ]
        return extra + super().get_urls()

    @admin.display(description="explain")
    def explain_link(self, obj: Chain) -> str:
        if obj.pk is None:
            return "—"
        return format_html(
            '<a href="{}">Explain a request routed to this chain</a>',
            explain_url(task="example", chain=obj.name),
        )

    def save_formset(self, request: HttpRequest, form: Any, formset: Any, change: bool) -> None:
        if isinstance(formset, ChainEntryFormSet):
            save_entries(formset)
        else:
            super().save_formset(request, form, formset, change)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Chain]:
        return super().get_queryset(request).prefetch_related("entries__provider")

    @admin.display(description="providers (in order)")
    def providers(self, obj: Chain) -> str:
        return steps_summary(obj.entries.all()) or "—"

    @admin.display(description="steps")
    def steps(self, obj: Chain) -> str:
        if obj.pk is None:
            return "—"
        return steps_summary(obj.entries.select_related("provider")) or "—"


@admin.register(ChainEntry)
class ChainEntryAdmin(admin.ModelAdmin):
    list_display = [
        "chain",
        "position",
        "provider",
        "model",
        "enabled",
        "step",
        "weight",
        "strategy",
    ]
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
    readonly_fields = ["explain_link"]

    @admin.display(description="explain")
    def explain_link(self, obj: RoutingRule) -> str:
        if obj.pk is None:
            return "—"
        return format_html(
            '<a href="{}">Explain a request this rule matches</a>',
            explain_url(task=_example_task(obj.task_glob), route=obj.route),
        )


def _example_task(glob: str) -> str:
    """A task name the glob matches, for the explain link (``summar*`` → ``summarx``)."""
    if not glob:
        return "example"
    text = re.sub(r"\[!?([^\]]*)\]", lambda m: (m.group(1) or "x")[0], glob)
    text = text.replace("*", "x").replace("?", "x")
    return text if re.fullmatch(r"[-a-zA-Z0-9_]+", text) else "example"


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


class LogMixin(ReadOnlyMixin):
    """The routing logs: view-only for everyone, superusers included. Retention is the
    ``llm_routing_purge`` command's job, so no delete page and no "Delete selected"."""

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


ATTEMPT_FIELDS = (
    "index",
    "step",
    "provider",
    "model",
    "outcome_words",
    "reason_words",
    "http_status",
    "transient",
    "retries",
    "latency",
    "served",
    "partial",
)


def _ms(value: float | None) -> str:
    """A latency for people: whole milliseconds (``0.4`` → ``<1 ms``)."""
    if value is None:
        return "—"
    if 0 < value < 1:
        return "<1 ms"
    return f"{value:,.0f} ms"


class LatencyMixin:
    @admin.display(description="latency", ordering="latency_ms")
    def latency(self, obj: Attempt) -> str:
        return _ms(obj.latency_ms)

    @admin.display(description="outcome", ordering="outcome")
    def outcome_words(self, obj: Attempt) -> str:
        return term(obj.outcome)

    @admin.display(description="reason", ordering="reason")
    def reason_words(self, obj: Attempt) -> str:
        return term(obj.reason or obj.error_category)


class AttemptInline(LatencyMixin, LogMixin, admin.TabularInline):
    model = Attempt
    extra = 0
    can_delete = False
    fields = ATTEMPT_FIELDS
    readonly_fields = ATTEMPT_FIELDS
    classes = ["llmr-attempts"]


@admin.register(RoutingDecision)
class RoutingDecisionAdmin(DecisionDisplayMixin, LogMixin, admin.ModelAdmin):
    list_display = [
        "when",
        "request_id",
        "task",
        "mode_words",
        "result",
        "served_by",
        "fallback",
        "total_latency",
    ]
    list_filter = ["status", "router_mode", "fallback_used", "selected_provider", "created_at"]
    search_fields = ["=request_id", "task"]
    date_hierarchy = "created_at"
    inlines = [AttemptInline]
    fieldsets = [
        (None, {"fields": ["result", "timeline", "explain_link"]}),
        (
            "Request",
            {
                "fields": [
                    "request_id",
                    "when",
                    "task",
                    "route",
                    "input_length",
                    "input_sha256",
                ]
            },
        ),
        (
            "Routing",
            {
                "fields": [
                    "mode_words",
                    "rule",
                    "chain_name",
                    "requested_provider",
                    "served_by",
                    "fallback",
                    "hedge",
                    "total_latency",
                ]
            },
        ),
    ]
    readonly_fields = [
        "result",
        "when",
        "mode_words",
        "served_by",
        "fallback",
        "timeline",
        "explain_link",
        "total_latency",
    ]

    class Media:
        css = {"all": ["llm_routing/admin/llm_routing.css"]}

    def get_urls(self) -> list[URLPattern]:
        extra = [
            path(
                "dashboard/",
                self.admin_site.admin_view(lambda request: dashboard_view(request, self)),
                name="llm_routing_dashboard",
            ),
        ]
        return extra + super().get_urls()

    def get_queryset(self, request: HttpRequest) -> QuerySet[RoutingDecision]:
        return super().get_queryset(request).prefetch_related("attempts")

    @admin.display(description="total latency", ordering="total_latency_ms")
    def total_latency(self, obj: RoutingDecision) -> str:
        return _ms(obj.total_latency_ms)

    @admin.display(description="timeline")
    def timeline(self, obj: RoutingDecision) -> str:
        attempts = sorted(obj.attempts.all(), key=lambda a: a.index)
        svg = timeline_svg(
            [
                TimelineItem(
                    index=a.index,
                    provider=a.provider,
                    outcome=a.outcome,
                    latency_ms=a.latency_ms,
                    retries=a.retries,
                    reason=words(a.reason or a.error_category),
                    served=a.served,
                    http_status=a.http_status,
                )
                for a in attempts
            ]
        )
        if failed(obj):
            return format_html(
                '<p class="llmr-failed llmr-timeline-verdict">Failed: {}, after {} attempt{}.'
                "</p>{}",
                failure_words(obj),
                len(attempts),
                "" if len(attempts) == 1 else "s",
                svg,
            )
        return svg

    @admin.display(description="explain")
    def explain_link(self, obj: RoutingDecision) -> str:
        """The explain page with this decision's routing inputs (what would happen now)."""
        forced = obj.router_mode == "forced"
        chain_by_name = obj.router_mode == "explicit" and not obj.requested_provider
        return format_html(
            '<a href="{}">Explain this route now</a>',
            explain_url(
                task=obj.task,
                route=obj.route,
                provider="" if forced else obj.requested_provider,
                force_provider=obj.requested_provider if forced else "",
                chain=obj.chain_name if chain_by_name else "",
            ),
        )

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[RoutingDecision], search_term: str
    ) -> tuple[QuerySet[RoutingDecision], bool]:
        return _search_by_request_id(queryset, search_term, "request_id", "task"), False


@admin.register(Attempt)
class AttemptAdmin(LatencyMixin, LogMixin, admin.ModelAdmin):
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

    list_display = ["when", "id", "owner", "task", "status", "claims", "finished"]
    list_filter = ["status", "created_at"]
    list_select_related = ["owner"]
    date_hierarchy = "created_at"
    fields = AUDIT_JOB_FIELDS
    readonly_fields = AUDIT_JOB_FIELDS

    @admin.display(description="created", ordering="created_at")
    def when(self, obj: AuditJob) -> str:
        return moment(obj.created_at)

    @admin.display(description="finished", ordering="finished_at")
    def finished(self, obj: AuditJob) -> str:
        return moment(obj.finished_at)


from . import admin_budgets  # noqa: E402,F401  (budgets: registers BudgetAdmin)
