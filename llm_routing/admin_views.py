"""Admin pages beyond the changelists: explain-route (more pages join it here).

Each view is hung on a ModelAdmin's ``get_urls`` (so it lives under the host's admin
site, with its login and permissions) and renders a template under
``templates/admin/llm_routing/``."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse

from .api.explain_views import ExplainQuerySerializer
from .router import explain

__all__ = ["EXPLAIN_FIELDS", "explain_url", "explain_view"]

#: The query parameters of the explain page (and of ``GET /audit/explain/``).
EXPLAIN_FIELDS = ("task", "route", "provider", "force_provider", "chain", "stream", "schema")


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
    errors: dict[str, Any] = {}
    if values["task"]:
        query = ExplainQuerySerializer(data={k: v for k, v in values.items() if v != ""})
        if query.is_valid():
            explanation = explain(query.to_request())
        else:
            errors = {k: [str(m) for m in v] for k, v in query.errors.items()}
    context = {
        **site.each_context(request),
        "title": "Explain a route",
        "values": values,
        "errors": errors,
        "explanation": explanation,
        "ex": explanation.to_dict() if explanation else None,
        "api_url": _api_url(values),
    }
    return TemplateResponse(request, "admin/llm_routing/explain.html", context)


def _api_url(values: dict[str, str]) -> str | None:
    if not values["task"]:
        return None
    try:
        base = reverse("llm_routing:audit-explain")
    except Exception:  # the host mounted the admin but not the API
        return None
    return f"{base}?{urlencode({k: v for k, v in values.items() if v})}"
