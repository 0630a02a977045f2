"""Admin pages beyond the changelists: explain-route (more pages join it here).

Each view is hung on a ModelAdmin's ``get_urls`` (so it lives under the host's admin
site, with its login and permissions) and renders a template under
``templates/admin/llm_routing/``."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse

from . import snapshot
from .api.explain_views import ExplainQuerySerializer
from .models import Provider
from .resilience import breaker
from .router import explain
from .templatetags.llm_routing_admin import DEFAULT_WINDOW, dashboard_context
from .types import MOCK_PROVIDER_NAME

#: Longest force-open an operator may ask for on the breaker board (one day).
MAX_FORCE_OPEN_S = 86_400

__all__ = [
    "EXPLAIN_FIELDS",
    "circuit_board_view",
    "circuit_rows",
    "dashboard_view",
    "explain_url",
    "explain_view",
]

#: The query parameters of the explain page (and of ``GET /audit/explain/``).
EXPLAIN_FIELDS = (
    "task",
    "route",
    "provider",
    "force_provider",
    "chain",
    "stream",
    "schema",
    "affinity",
)
#: Their labels on the page (errors name the field as the form shows it).
EXPLAIN_LABELS = {
    "task": "Task",
    "route": "Route key",
    "provider": "Try this provider first",
    "force_provider": "Force a provider",
    "chain": "Chain",
    "stream": "Streams",
    "schema": "Structured output schema",
    "affinity": "Affinity key",
    "non_field_errors": "Request",
}


def explain_url(**params: Any) -> str:
    """The admin explain page, pre-filled with ``params`` (empty values left out)."""
    query = {k: v for k, v in params.items() if v not in (None, "", False)}
    if query.get("stream") is True:
        query["stream"] = "true"
    base = reverse("admin:llm_routing_explain")
    return f"{base}?{urlencode(query)}" if query else base


def _can_view(request: HttpRequest) -> bool:
    user = request.user
    return bool(
        user.is_active
        and user.is_staff
        and user.has_perm("llm_routing.view_chain")
        and user.has_perm("llm_routing.view_provider")
    )


def explain_view(request: HttpRequest, site: admin.AdminSite) -> HttpResponse:
    """Explain a route: the same resolve() and skip checks as the router, read-only."""
    if not _can_view(request):
        raise PermissionDenied
    values = {name: request.GET.get(name, "") for name in EXPLAIN_FIELDS}
    explanation = None
    errors: list[tuple[str, str]] = []
    if values["task"] or any(name in request.GET for name in EXPLAIN_FIELDS):
        # Submitted (an empty task included): explain, or say what is wrong.
        query = ExplainQuerySerializer(data={k: v for k, v in values.items() if v != ""})
        if query.is_valid():
            request_to_explain = query.to_request()
            if message := snapshot.unknown_chain(request_to_explain.chain):
                errors = [(EXPLAIN_LABELS["chain"], message)]
            else:
                explanation = explain(request_to_explain)
        else:
            errors = [
                (EXPLAIN_LABELS.get(k, k), str(m)) for k, v in query.errors.items() for m in v
            ]
    config = snapshot.current()
    context = {
        **site.each_context(request),
        "title": "Explain a route",
        "values": values,
        "errors": errors,
        "chains": _with(sorted(config.chains), values["chain"]),
        "providers": _with(
            sorted({*config.providers, MOCK_PROVIDER_NAME}),
            values["provider"],
            values["force_provider"],
        ),
        "explanation": explanation,
        "ex": explanation.to_dict() if explanation else None,
        "api_url": _api_url(values),
    }
    return TemplateResponse(request, "admin/llm_routing/explain.html", context)


def _with(names: list[str], *current: str) -> list[str]:
    """The choices, plus a value asked for that is not among them (kept, and explained)."""
    extra = [c for c in current if c and c not in names]
    return names + sorted(set(extra))


def _api_url(values: dict[str, str]) -> str | None:
    if not values["task"]:
        return None
    try:
        base = reverse("llm_routing:audit-explain")
    except Exception:  # the host mounted the admin but not the API
        return None
    return f"{base}?{urlencode({k: v for k, v in values.items() if v})}"


# --- dashboard -----------------------------------------------------------------------


def dashboard_view(request: HttpRequest, model_admin: admin.ModelAdmin) -> HttpResponse:
    """The routing dashboard as a page of its own (full width): the figures of a window."""
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    context = {
        **model_admin.admin_site.each_context(request),
        "title": "Routing dashboard",
        "opts": model_admin.model._meta,
        **dashboard_context(request.GET.get("window", DEFAULT_WINDOW)),
    }
    return TemplateResponse(request, "admin/llm_routing/dashboard_page.html", context)


# --- breaker board -------------------------------------------------------------------


def circuit_rows(providers: list[Provider]) -> list[dict[str, Any]]:
    """One row per (provider, model) circuit of these providers (the mock has none)."""
    tracked = [p for p in providers if p.effective_mode != "mock"]
    circuits = breaker.store.for_providers(tracked)
    now = breaker.store.clock()
    rows: list[dict[str, Any]] = []
    for p in tracked:
        for circuit in circuits[p.name]:
            health = circuit.health(now)
            remaining = (
                max(0.0, circuit.open_until - now)
                if health["state"] == breaker.OPEN and circuit.open_until is not None
                else None
            )
            shown = {
                k: _when(v) if k.endswith("_at") or k == "open_until" else v
                for k, v in health.items()
            }
            rows.append(
                {
                    "provider": p,
                    "model": circuit.model,
                    "override": circuit.model != p.model,
                    "remaining_s": round(remaining) if remaining is not None else None,
                    **shown,
                }
            )
    return rows


def _when(iso: Any) -> Any:
    """``2026-12-03T09:17:47.275+00:00`` → ``2026-12-03 09:17:47 UTC`` (None stays)."""
    if not isinstance(iso, str):
        return iso
    try:
        moment = datetime.fromisoformat(iso.replace("Z", "+00:00"))
    except ValueError:
        return iso
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def circuit_board_view(request: HttpRequest, model_admin: admin.ModelAdmin) -> HttpResponse:
    """Every (provider, model) circuit; reset and force-open, logged to admin history."""
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    if request.method == "POST":
        return _circuit_action(request, model_admin)
    providers = list(Provider.objects.order_by("name"))
    context = {
        **model_admin.admin_site.each_context(request),
        "title": "Circuit breakers",
        "opts": Provider._meta,
        "rows": circuit_rows(providers),
        "offline": [p for p in providers if p.effective_mode == "mock"],
        "can_change": model_admin.has_change_permission(request),
        "degraded": breaker.store.degraded,
        "max_force_open_s": MAX_FORCE_OPEN_S,
    }
    return TemplateResponse(request, "admin/llm_routing/circuits.html", context)


def _circuit_action(request: HttpRequest, model_admin: admin.ModelAdmin) -> HttpResponse:
    board = reverse("admin:llm_routing_circuits")
    if not model_admin.has_change_permission(request):
        raise PermissionDenied
    action = request.POST.get("action", "")
    provider = Provider.objects.filter(name=request.POST.get("provider", "")).first()
    model = request.POST.get("model", "")
    known = provider is not None and any(
        c.model == model for c in breaker.store.for_providers([provider])[provider.name]
    )
    if provider is None or not known or provider.effective_mode == "mock":
        messages.error(request, "No such circuit: pick one from the board.")
        return HttpResponseRedirect(board)
    if action == "reset":
        breaker.store.reset(provider.name, model)
        text = f"Reset the circuit of model {model!r}."
    elif action == "force_open":
        try:
            seconds = float(request.POST.get("seconds", ""))
        except ValueError:
            seconds = -1.0
        if not 1 <= seconds <= MAX_FORCE_OPEN_S:
            messages.error(request, f"Duration: a number of seconds from 1 to {MAX_FORCE_OPEN_S}.")
            return HttpResponseRedirect(board)
        breaker.store.force_open(provider.name, model, seconds)
        text = f"Forced the circuit of model {model!r} open for {seconds:g} s."
    else:
        messages.error(request, "Unknown action.")
        return HttpResponseRedirect(board)
    model_admin.log_change(request, provider, text)
    messages.success(request, f"{provider.name}: {text}")
    return HttpResponseRedirect(board)
