"""The only writer of routing logs: one RoutingDecision + its Attempt rows per request.

Written in one transaction, so a request is logged whole or not at all. The input is
stored as its length and SHA-256 only; no output, prompt or key is ever stored.
"""

from __future__ import annotations

import logging

from django.db import transaction

from .models import Attempt, RoutingDecision
from .types import AuditRequest, RoutingResult

__all__ = ["record"]

logger = logging.getLogger("llm_routing.recorder")


def record(request: AuditRequest, routed: RoutingResult) -> RoutingDecision:
    meta = routed.metadata
    with transaction.atomic():
        decision = RoutingDecision.objects.create(
            request_id=routed.request_id,
            task=request.task,
            route=request.route or "",
            rule=meta.rule or "",
            router_mode=meta.router_mode,
            chain_name=meta.chain_name or "",
            requested_provider=meta.requested_provider or "",
            selected_provider=meta.selected_provider or "",
            fallback_used=meta.fallback_used,
            fallback_reason=meta.fallback_reason or "",
            status=routed.result.status,
            mode=routed.result.mode,
            input_length=request.input_length,
            input_sha256=request.input_sha256,
            total_latency_ms=routed.total_latency_ms,
        )
        Attempt.objects.bulk_create(
            [
                Attempt(
                    decision=decision,
                    index=a.index,
                    provider=a.provider,
                    model=a.model,
                    outcome=a.outcome,
                    reason=a.reason or "",
                    error_category=a.error_category or "",
                    http_status=a.http_status,
                    transient=a.transient,
                    retries=a.retries,
                    latency_ms=a.latency_ms,
                    served=a.served,
                    partial=a.partial,
                )
                for a in meta.attempts
            ]
        )
    return decision
