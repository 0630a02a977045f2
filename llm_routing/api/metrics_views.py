"""``GET /metrics``: the Prometheus exposition (docs/observability.md).

404 unless ``LLM_ROUTING["METRICS_TOKEN"]`` is set; then only a request carrying
``Authorization: Bearer <that token>`` gets the metrics (compared in constant time),
any other gets 401. A plain Django view: no session, no DRF authentication or throttle.
"""

from __future__ import annotations

from django.http import Http404, HttpRequest, HttpResponse
from django.views.decorators.http import require_GET

from ..access import holds_operator_token
from ..conf import routing_settings

__all__ = ["metrics_view"]


@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    token = routing_settings.METRICS_TOKEN
    if not token:
        raise Http404("Metrics are off.")
    if not holds_operator_token(request.headers):
        response = HttpResponse("Unauthorized.\n", status=401, content_type="text/plain")
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    from .. import metrics  # prometheus-client is imported only when metrics are on

    body, content_type = metrics.exposition()
    response = HttpResponse(body, content_type=content_type)
    response["Cache-Control"] = "no-store"
    return response
