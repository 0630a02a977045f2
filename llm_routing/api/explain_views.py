"""``GET /audit/explain/``: what ``POST /audit/`` would do with a request, now — without
calling any provider, recording anything or touching circuit state."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response

from ..access import Viewer, may_see, viewer_for, visible_picks
from ..explanation import CandidateExplanation, Explanation
from ..router import explain
from ..snapshot import ConfigSnapshot, current
from ..types import AuditRequest
from .base import AFFINITY_MAX_CHARS, RoutingAPIView, affinity_header
from .chat_serializers import StrictCharField, check_input, json_text
from .schema_docs import EXPLAIN, documented
from .serializers import (
    SLUG_RE,
    AuditRequestSerializer,
    StrictRegexField,
    check_one_provider_choice,
)

__all__ = ["ExplainQuerySerializer", "ExplainView", "hidden_chain", "visible_explanation"]


class ExplainQuerySerializer(serializers.Serializer):
    """The routing inputs of ``POST /audit/`` as query parameters (no input text:
    routing never depends on it)."""

    task = StrictRegexField(SLUG_RE, max_length=64)
    route = StrictRegexField(SLUG_RE, max_length=64, required=False, allow_blank=True)
    provider = StrictRegexField(SLUG_RE, max_length=64, required=False, allow_blank=True)
    force_provider = StrictRegexField(SLUG_RE, max_length=64, required=False, allow_blank=True)
    chain = StrictRegexField(SLUG_RE, max_length=64, required=False, allow_blank=True)
    stream = serializers.BooleanField(required=False, default=False)
    request_id = serializers.UUIDField(
        required=False,
        help_text="A routed request's id: a step's seeded draw is replayed for it.",
    )
    schema = serializers.CharField(
        required=False,
        allow_blank=True,
        help_text="A JSON Schema object (as JSON text): the request needs structured output.",
    )
    affinity = StrictCharField(
        required=False,
        allow_blank=True,
        max_length=AFFINITY_MAX_CHARS,
        help_text="A prompt-cache affinity key (as /audit/'s affinity field or the "
        "X-LLM-Affinity header): each step of several goes back to the candidate that "
        "served it last, read and never written.",
    )

    def to_internal_value(self, data: Any) -> Any:
        check_input(data)  # the input boundary (llm_routing.boundary), as for /audit/
        return super().to_internal_value(data)

    def validate_schema(self, value: str) -> dict[str, Any] | None:
        if not value.strip():
            return None
        parsed = json_text(value)  # the same depth limit, no NaN, no lone surrogate
        checked: dict[str, Any] | None = AuditRequestSerializer().validate_response_schema(parsed)
        return checked

    def validate_affinity(self, value: str) -> str:
        if any(ord(c) < 32 or ord(c) == 127 for c in value):  # as the header
            raise serializers.ValidationError(f"At most {AFFINITY_MAX_CHARS} printable characters.")
        return value

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
            affinity=d.get("affinity") or None,
        )


_PARAMS = [
    OpenApiParameter("task", OpenApiTypes.STR, required=True, description="The task slug."),
    OpenApiParameter("route", OpenApiTypes.STR, description="The route key."),
    OpenApiParameter("provider", OpenApiTypes.STR, description="A provider tried first."),
    OpenApiParameter("force_provider", OpenApiTypes.STR, description="Exactly this provider."),
    OpenApiParameter("chain", OpenApiTypes.STR, description="A chain chosen by name."),
    OpenApiParameter("stream", OpenApiTypes.BOOL, description="The request streams."),
    OpenApiParameter("schema", OpenApiTypes.STR, description="JSON Schema object, as JSON."),
    OpenApiParameter(
        "request_id", OpenApiTypes.UUID, description="Replay the step picks of this request."
    ),
    OpenApiParameter(
        "affinity",
        OpenApiTypes.STR,
        description="A prompt-cache affinity key (else the X-LLM-Affinity header): read "
        "the candidate that served it last in each step of several.",
    ),
]


def hidden_chain(name: str) -> NotFound:
    """The 404 of a chain that does not exist or that the caller may not use: the same
    status and words for both, so chain names cannot be enumerated."""
    return NotFound(f"No chain {name!r} that you may use.", code="unknown_chain")


def visible_explanation(
    explanation: Explanation, viewer: Viewer, config: ConfigSnapshot | None = None
) -> dict[str, object]:
    """``explanation.to_dict()`` as ``viewer`` may see it (:func:`access.may_see`): a
    candidate they may not see is left out — or, when they named it themselves, shown
    exactly as a provider that does not exist — and so is one the walk would skip as
    ``not_allowed`` that they did not name (as :func:`access.visible_routed` leaves it
    out of their answer); a chain or rule they may not see is not named. Positions are
    renumbered, so a left-out candidate leaves no gap."""
    data = explanation.to_dict()
    if viewer.principal is None or viewer.operator:
        return data
    config = config or current()
    named = {explanation.plan.requested_provider}
    shown: list[CandidateExplanation] = []
    for c in explanation.candidates:
        visible = may_see(viewer, "provider", c.provider, config=config)
        if c.provider in named:  # the caller's own word: shown, or as an unknown name
            shown.append(
                c
                if visible
                else CandidateExplanation(c.position, c.provider, "", "skip", "unknown_provider")
            )
        elif visible and c.reason != "not_allowed":  # as the caller's copy of a decision
            shown.append(c)
    shown = [replace(c, position=i) for i, c in enumerate(shown)]
    chain = explanation.plan.chain_name
    if (
        chain
        and config.chain(chain) is not None
        and not may_see(viewer, "chain", chain, config=config)
    ):
        data["chain_name"] = None
        data["rule"] = None
    first = next((c for c in shown if c.verdict == "try"), None)
    data["would_serve_first"] = first.provider if first else None
    data["candidates"] = [c.to_dict() for c in shown]
    hidden = {c.provider for c in explanation.candidates if c.reason == "not_allowed"}

    def seen(name: str) -> bool:
        return name not in hidden and may_see(viewer, "provider", name, config=config)

    data["picks"] = [dict(p) for p in visible_picks(explanation.picks, seen)]
    if explanation.affinity is not None:  # a name they may not see: as none
        data["affinity"] = [
            {
                **a.to_dict(),
                "remembered": a.remembered if a.remembered and seen(a.remembered) else None,
                "serves": a.serves if a.serves and seen(a.serves) else None,
            }
            for a in explanation.affinity
        ]
    if explanation.hedge is not None:
        hedge = explanation.hedge
        data["hedge"] = {
            **hedge.to_dict(),
            "primary": hedge.primary if hedge.primary and seen(hedge.primary) else None,
            "candidate": hedge.candidate if hedge.candidate and seen(hedge.candidate) else None,
        }
    return data


class ExplainView(RoutingAPIView):
    """Same authentication, permissions and throttles as ``POST /audit/``."""

    @extend_schema(parameters=_PARAMS, **documented(EXPLAIN))
    def get(self, request: Request) -> Response:
        query = ExplainQuerySerializer(data=request.query_params.dict())
        query.is_valid(raise_exception=True)
        # The caller's identity, as /audit/ would carry it: what they may use but not now
        # shows as not_allowed (no 403 here — explaining a refusal is the point); what
        # they may not see is answered as what does not exist (access.may_see).
        viewer = viewer_for(request.user)
        config = current()
        audit_request = query.to_request()
        audit_request = replace(
            audit_request,
            principal=viewer.principal,
            affinity=audit_request.affinity or affinity_header(request),
        )
        chain = audit_request.chain
        if chain and (config.chain(chain) is None or not may_see(viewer, "chain", chain)):
            raise hidden_chain(chain)
        seed = query.validated_data.get("request_id")
        explanation = explain(audit_request, request_id=str(seed) if seed else None)
        return Response(visible_explanation(explanation, viewer, config))
