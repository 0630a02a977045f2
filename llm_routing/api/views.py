"""HTTP views: no routing logic here — they validate, call :func:`llm_routing.service.execute`
(the same function as the Python API; ``aexecute`` under ASGI), shape the answer."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, NamedTuple

from django.contrib.auth.models import AnonymousUser
from django.http.response import HttpResponseBase
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.authentication import BaseAuthentication
from rest_framework.request import Request
from rest_framework.response import Response

from .. import pricing
from ..access import Viewer, holds_operator_token, may_see, viewer_for, visible_routed
from ..logging import current_request_id
from ..models import Provider
from ..resilience import breaker
from ..router import aroute_stream, route_stream
from ..service import aexecute, execute
from ..types import AuditRequest, RouterStreamEvent, RoutingResult, StreamChunk, StreamResult
from .base import RoutingAPIView, in_thread
from .job_views import submit_job
from .reuse import reused
from .schema_docs import AUDIT, HEALTH, documented
from .serializers import AuditRequestSerializer, AuditResponseSerializer
from .sse import EventFrames, SSENegotiationMixin, closing_events, sse, sse_response

__all__ = ["AuditView", "HealthView"]


class AuditView(SSENegotiationMixin, RoutingAPIView):
    async_method = "post"
    admits_inline = True  # an async job is submitted by the answer, in a worker thread

    @extend_schema(request=AuditRequestSerializer, **documented(AUDIT, ok=AuditResponseSerializer))
    def post(self, request: Request) -> HttpResponseBase:
        return self.handle(request)

    def admit(self, request: Request) -> AuditRequest | _Job:
        """The validated, authorized request, or the async job to submit."""
        with reused(AuditRequestSerializer, request.data) as serializer:
            serializer.is_valid(raise_exception=True)
            audit_request = serializer.to_request()
            data = serializer.validated_data
        # A chain or provider the caller may not see is the 404 of one that does not
        # exist, as explain and /v1 answer (authorize: access.refusal, access.may_see).
        audit_request = self.authorize(request, audit_request)
        if data.get("async"):  # the job keeps the affinity key, the header's included
            return _Job({**data, "affinity": audit_request.affinity})
        return audit_request

    def answer(self, request: Request, admitted: AuditRequest | _Job) -> HttpResponseBase:
        if isinstance(admitted, _Job):
            return submit_job(request, admitted.data)  # 202
        viewer = viewer_for(request.user)
        if admitted.stream:
            events = route_stream(admitted, request_id=current_request_id())
            return sse_response(EventFrames(events, lambda e: (_audit_frame(e, viewer),)))
        return _audit_response(execute(admitted, request_id=current_request_id()), viewer)

    async def aanswer(self, request: Request, admitted: AuditRequest | _Job) -> HttpResponseBase:
        if isinstance(admitted, _Job):  # a row and a broker message: off the loop
            return await in_thread(submit_job)(request, admitted.data)
        viewer = viewer_for(request.user)
        if admitted.stream:
            return sse_response(_aaudit_frames(admitted, viewer))
        routed = await aexecute(admitted, request_id=current_request_id())
        return _audit_response(routed, viewer)


class _Job(NamedTuple):
    """An admitted ``"async": true`` request: submitted by the answer (202)."""

    data: dict[str, Any]


def _audit_response(routed: RoutingResult, viewer: Viewer) -> Response:
    """The envelope as the caller may see it (:func:`llm_routing.access.visible_routed`)."""
    return Response(
        pricing.envelope(routed, visible_routed(routed, viewer)),
        headers={"X-Request-ID": routed.request_id},
    )


async def _aaudit_frames(audit_request: AuditRequest, viewer: Viewer) -> AsyncIterator[bytes]:
    events = aroute_stream(audit_request, request_id=current_request_id())
    async with closing_events(events) as events:
        async for event in events:
            yield _audit_frame(event, viewer)


def _audit_frame(event: RouterStreamEvent, viewer: Viewer) -> bytes:
    """``chunk`` (text delta) … then ``result`` (the envelope, as ``viewer`` may see
    it) or ``error``."""
    if isinstance(event, StreamChunk):
        chunk: dict[str, Any] = {"text": event.text}
        if event.tool_call is not None:  # a fragment of a tool call (OpenAI's shape)
            chunk["tool_call"] = event.tool_call.to_dict()
        return sse(chunk, event="chunk")
    if isinstance(event, StreamResult):
        shown = visible_routed(event.routed, viewer)
        return sse(pricing.envelope(event.routed, shown), event="result")
    return sse(
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
    providers = ProviderHealthSerializer(
        many=True,
        required=False,
        help_text="Operators only (staff, superusers, the METRICS_TOKEN): every provider "
        "row; other callers get the summary (status and cache) without it.",
    )


#: ``request.auth`` of a request that carried the ``METRICS_TOKEN`` (no user).
OPERATOR_TOKEN = object()


class OperatorTokenAuthentication(BaseAuthentication):
    """``Authorization: Bearer <METRICS_TOKEN>``: a monitoring probe with no user, that
    sees the operations view (``/health/``'s full list). Any other header falls through
    to the configured authentication classes."""

    def authenticate(self, request: Request) -> tuple[Any, Any] | None:
        if holds_operator_token(request.headers):
            return AnonymousUser(), OPERATOR_TOKEN
        return None


class OperatorTokenScheme(OpenApiAuthenticationExtension):
    target_class = "llm_routing.api.views.OperatorTokenAuthentication"
    name = "metricsToken"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "LLM_ROUTING['METRICS_TOKEN']: the full /health/ list, no user.",
        }


class HealthView(RoutingAPIView):
    # Under ASGI the rows and circuit states are read in a worker thread (``admit``), the
    # answer is shaped on the loop. Who sees the per-provider list: access.may_see.
    async_method = "get"

    @extend_schema(**documented(HEALTH, ok=HealthResponseSerializer))
    def get(self, request: Request) -> HttpResponseBase:
        return self.handle(request)

    def get_authenticators(self) -> list[BaseAuthentication]:
        return [OperatorTokenAuthentication(), *super().get_authenticators()]

    def get_authenticate_header(self, request: Request) -> str:
        """The 401's ``WWW-Authenticate`` of the configured authentication (DRF reads the
        first authenticator's, which here is the token probe's); "" gives DRF's 403."""
        configured = super().get_authenticators()
        return (configured[0].authenticate_header(request) or "") if configured else ""

    def check_permissions(self, request: Request) -> None:
        if request.auth is not OPERATOR_TOKEN:  # the token holder has no user to check
            super().check_permissions(request)

    def admit(self, request: Request) -> dict[str, Any]:
        # The circuits are read for every caller: reading them is what notices a cache
        # outage ("degraded"), which the summary reports too.
        rows = list(Provider.objects.order_by("name"))
        circuits = breaker.store.for_providers(rows)
        if not rows:  # no circuit was read: read one, so "cache" says whether it answers
            breaker.store.load("llm_routing", "health")
        now = breaker.store.clock()
        cache = "degraded" if breaker.store.degraded else "ok"
        viewer = viewer_for(request.user, operator_token=request.auth is OPERATOR_TOKEN)
        if not may_see(viewer, "operations"):
            return {"status": cache, "cache": cache}
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
        return {"status": cache, "cache": cache, "providers": providers}

    def answer(self, request: Request, admitted: dict[str, Any]) -> Response:
        return Response(admitted)

    async def aanswer(self, request: Request, admitted: dict[str, Any]) -> Response:
        return Response(admitted)
