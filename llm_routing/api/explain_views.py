"""``GET /audit/explain/``: what ``POST /audit/`` would do with a request, now — without
calling any provider, recording anything or touching circuit state."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from ..access import principal_for
from ..router import explain
from ..types import AuditRequest
from .base import RoutingAPIView
from .schema_docs import EXPLAIN, documented
from .serializers import (
    SLUG_RE,
    AuditRequestSerializer,
    StrictRegexField,
    check_one_provider_choice,
    known_chain,
)

__all__ = ["ExplainQuerySerializer", "ExplainView"]


class ExplainQuerySerializer(serializers.Serializer):
    """The routing inputs of ``POST /audit/`` as query parameters (no input text:
    routing never depends on it)."""

    task = StrictRegexField(SLUG_RE, max_length=64)
    route = StrictRegexField(SLUG_RE, max_length=64, required=False, allow_blank=True)
    provider = StrictRegexField(SLUG_RE, max_length=64, required=False, allow_blank=True)
    force_provider = StrictRegexField(SLUG_RE, max_length=64, required=False, allow_blank=True)
    chain = StrictRegexField(SLUG_RE, max_length=64, required=False, allow_blank=True)
    stream = serializers.BooleanField(required=False, default=False)
    schema = serializers.CharField(
        required=False,
        allow_blank=True,
        help_text="A JSON Schema object (as JSON text): the request needs structured output.",
    )

    def validate_schema(self, value: str) -> dict[str, Any] | None:
        if not value.strip():
            return None
        try:
            parsed = json.loads(value)
        except ValueError:
            message = "Expected JSON text of a JSON Schema object."
            raise serializers.ValidationError(message) from None
        checked: dict[str, Any] | None = AuditRequestSerializer().validate_response_schema(parsed)
        return checked

    def validate_chain(self, value: str) -> str:
        return known_chain(value) or ""

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        check_one_provider_choice(attrs)
        return attrs

    def to_request(self) -> AuditRequest:
        d = self.validated_data
        return AuditRequest(
            task=d["task"],
            input_text="",
            provider=d.get("provider") or None,
            route=d.get("route") or None,
            force_provider=d.get("force_provider") or None,
            chain=d.get("chain") or None,
            response_schema=d.get("schema"),
            stream=bool(d.get("stream")),
        )


_PARAMS = [
    OpenApiParameter("task", OpenApiTypes.STR, required=True, description="The task slug."),
    OpenApiParameter("route", OpenApiTypes.STR, description="The route key."),
    OpenApiParameter("provider", OpenApiTypes.STR, description="A provider tried first."),
    OpenApiParameter("force_provider", OpenApiTypes.STR, description="Exactly this provider."),
    OpenApiParameter("chain", OpenApiTypes.STR, description="A chain chosen by name."),
    OpenApiParameter("stream", OpenApiTypes.BOOL, description="The request streams."),
    OpenApiParameter("schema", OpenApiTypes.STR, description="JSON Schema object, as JSON."),
]


class ExplainView(RoutingAPIView):
    """Same authentication, permissions and throttles as ``POST /audit/``."""

    @extend_schema(parameters=_PARAMS, **documented(EXPLAIN))
    def get(self, request: Request) -> Response:
        query = ExplainQuerySerializer(data=request.query_params.dict())
        query.is_valid(raise_exception=True)
        # The caller's identity, as /audit/ would carry it: what they may not use shows
        # as not_allowed (no 403 here — explaining a refusal is the point).
        audit_request = replace(query.to_request(), principal=principal_for(request.user))
        return Response(explain(audit_request).to_dict())
