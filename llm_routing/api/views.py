"""HTTP views: no routing logic here — they validate, call :func:`llm_routing.service.execute`
(the same function as the Python API), shape the answer."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from django.http import StreamingHttpResponse
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from .. import pricing
from ..logging import current_request_id
from ..models import Provider
from ..resilience import breaker
from ..router import route_stream
from ..service import execute
from ..types import AuditRequest, StreamChunk, StreamFailure, StreamResult
from .base import RoutingAPIView
from .job_views import submit_job
from .schema_docs import AUDIT, HEALTH, documented
from .serializers import AuditRequestSerializer, AuditResponseSerializer
from .sse import SSE_HEADERS, sse

__all__ = ["AuditView", "HealthView"]


class AuditView(RoutingAPIView):
    def perform_content_negotiation(self, request: Request, force: bool = False) -> Any:
        # SSE clients send ``Accept: text/event-stream``: a streamed answer is served in
        # that type, and anything else (a 400, a 202) falls back to JSON instead of a 406.
        if "text/event-stream" in request.META.get("HTTP_ACCEPT", ""):
            force = True
        return super().perform_content_negotiation(request, force=force)

    @extend_schema(request=AuditRequestSerializer, **documented(AUDIT, ok=AuditResponseSerializer))
    def post(self, request: Request) -> Response | StreamingHttpResponse:
        serializer = AuditRequestSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        audit_request = self.authorize(request, serializer.to_request())
        if serializer.validated_data.get("async"):
            return submit_job(request, serializer.validated_data)
        if audit_request.stream:
            response = StreamingHttpResponse(
                _audit_events(audit_request), content_type="text/event-stream"
            )
            for name, value in SSE_HEADERS.items():
                response[name] = value
            return response
        routed = execute(audit_request, request_id=current_request_id())
        return Response(pricing.envelope(routed), headers={"X-Request-ID": routed.request_id})


def _audit_events(audit_request: AuditRequest) -> Iterator[bytes]:
    """``chunk`` (text delta) … then ``result`` (the envelope) or ``error``."""
    for event in route_stream(audit_request, request_id=current_request_id()):
        if isinstance(event, StreamChunk):
            chunk: dict[str, Any] = {"text": event.text}
            if event.tool_call is not None:  # a fragment of a tool call (OpenAI's shape)
                chunk["tool_call"] = event.tool_call.to_dict()
            yield sse(chunk, event="chunk")
        elif isinstance(event, StreamResult):
            yield sse(pricing.envelope(event.routed), event="result")
        elif isinstance(event, StreamFailure):
            yield sse(
                {
                    "request_id": event.routed.request_id,
                    "category": event.error.category,
                    "message": event.error.message,
                    "partial": event.partial,
                },
                event="error",
            )


class CircuitHealthSerializer(serializers.Serializer):
    model = serializers.CharField()
    state = serializers.ChoiceField(choices=["closed", "open", "half_open"])
    consecutive_failures = serializers.IntegerField()
    cooldown_step = serializers.IntegerField()
    open_until = serializers.DateTimeField(allow_null=True)
    last_success_at = serializers.DateTimeField(allow_null=True)
    last_error_at = serializers.DateTimeField(allow_null=True)
    last_error_category = serializers.CharField(allow_null=True)
    last_http_status = serializers.IntegerField(allow_null=True)


class ProviderHealthSerializer(serializers.Serializer):
    name = serializers.CharField()
    kind = serializers.CharField()
    model = serializers.CharField()
    mode = serializers.CharField()
    enabled = serializers.BooleanField()
    key_present = serializers.BooleanField()
    health = CircuitHealthSerializer(help_text="Passive health of the provider's own model.")
    overrides = CircuitHealthSerializer(
        many=True, help_text="Passive health of each model a chain entry overrides it with."
    )


class HealthResponseSerializer(serializers.Serializer):
    status = serializers.CharField(
        help_text='"ok", or "degraded" while the circuit cache is unreachable (see "cache").'
    )
    cache = serializers.CharField(
        help_text='"ok", or "degraded": the circuit cache failed; circuits are process-local '
        "and throttles fail open until it answers again.",
    )
    providers = ProviderHealthSerializer(many=True)


class HealthView(RoutingAPIView):
    @extend_schema(**documented(HEALTH, ok=HealthResponseSerializer))
    def get(self, request: Request) -> Response:
        rows = list(Provider.objects.order_by("name"))
        circuits = breaker.store.for_providers(rows)
        now = breaker.store.clock()
        providers: list[dict[str, Any]] = []
        for p in rows:
            health = [{"model": c.model, **c.health(now)} for c in circuits[p.name]]
            providers.append(
                {
                    "name": p.name,
                    "kind": p.kind,
                    "model": p.model,
                    "mode": p.mode,
                    "enabled": p.enabled,
                    "key_present": p.key_present,
                    "health": health[0],
                    "overrides": health[1:],
                }
            )
        cache = "degraded" if breaker.store.degraded else "ok"
        return Response({"status": cache, "cache": cache, "providers": providers})
