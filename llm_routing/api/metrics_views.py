"""``GET /metrics``: the Prometheus exposition (docs/observability.md).

404 unless ``LLM_ROUTING["METRICS_TOKEN"]`` is set; then only a request carrying
``Authorization: Bearer <that token>`` gets the metrics (compared in constant time),
any other gets 401. A plain Django view: no session, no DRF authentication or throttle.
"""

from __future__ import annotations

import hmac

from django.http import Http404, HttpRequest, HttpResponse
from django.views.decorators.http import require_GET

from ..conf import routing_settings

__all__ = ["metrics_view"]


@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    token = routing_settings.METRICS_TOKEN
    if not token:
        raise Http404("Metrics are off.")
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(
        given.strip().encode(), str(token).encode()
    ):
        response = HttpResponse("Unauthorized.\n", status=401, content_type="text/plain")
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    from .. import metrics  # prometheus-client is imported only when metrics are on

    body, content_type = metrics.exposition()
    response = HttpResponse(body, content_type=content_type)
    response["Cache-Control"] = "no-store"
    return response
