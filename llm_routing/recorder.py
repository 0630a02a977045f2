"""The only writer of routing logs: one RoutingDecision + its Attempt rows per request.

Written in one transaction, so a request is logged whole or not at all. The input is
stored as its length and SHA-256 only; no output, prompt or key is ever stored.

Every string is fitted to its column before the insert (:func:`fit`): a route key of 64
characters makes ``chain_name = "route:<key>"`` longer than its column, and a vendor
reports whatever model name it likes. A value that is too long is cut and ends with
``…``; NUL characters (which PostgreSQL refuses in text) are dropped.

:func:`decision_rows` is the JSON-ready form of what :func:`record` writes (the spool,
:mod:`llm_routing.spool`, keeps exactly that when the database cannot be written);
:func:`write_rows` writes it.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from django.db import models, transaction
from django.utils import timezone

from .models import Attempt, RoutingDecision
from .types import AuditRequest, RoutingResult

__all__ = ["decision_rows", "fit", "record", "write_rows"]

logger = logging.getLogger("llm_routing.recorder")


def fit(model: type[models.Model], values: dict[str, Any]) -> dict[str, Any]:
    """*values* with every string cut to its ``CharField``'s ``max_length``."""
    fitted = dict(values)
    for name, value in values.items():
        if not isinstance(value, str):
            continue
        field = model._meta.get_field(name)
        if not isinstance(field, models.CharField):
            continue
        value = value.replace("\x00", "")
        limit = field.max_length
        if limit and len(value) > limit:
            value = value[: limit - 1] + "…"
        fitted[name] = value
    return fitted


def decision_rows(request: AuditRequest, routed: RoutingResult) -> dict[str, Any]:
    """The decision and its attempts as plain JSON values (no input, no output)."""
    meta = routed.metadata
    return {
        "decision": {
            "request_id": str(routed.request_id),
            "task": request.task,
            "route": request.route or "",
            "rule": meta.rule or "",
            "router_mode": meta.router_mode,
            "chain_name": meta.chain_name or "",
            "requested_provider": meta.requested_provider or "",
            "selected_provider": meta.selected_provider or "",
            "fallback_used": meta.fallback_used,
            "fallback_reason": meta.fallback_reason or "",
            "status": routed.result.status,
            "mode": routed.result.mode,
            "input_length": request.input_length,
            "input_sha256": request.input_sha256,
            "total_latency_ms": routed.total_latency_ms,
            "created_at": timezone.now().isoformat(),
        },
        "attempts": [
            {
                "index": a.index,
                "provider": a.provider,
                "model": a.model,
                "outcome": a.outcome,
                "reason": a.reason or "",
                "error_category": a.error_category or "",
                "http_status": a.http_status,
                "transient": a.transient,
                "retries": a.retries,
                "latency_ms": a.latency_ms,
                "served": a.served,
                "partial": a.partial,
            }
            for a in meta.attempts
        ],
    }


def write_rows(rows: dict[str, Any], *, keep_created_at: bool = False) -> RoutingDecision:
    """Insert one decision and its attempts in one transaction (strings fitted).

    ``keep_created_at`` stores the time the decision was made (the spool's replay)
    instead of now.
    """
    values = dict(rows["decision"])
    created_at = values.pop("created_at", None)
    with transaction.atomic():
        decision = RoutingDecision.objects.create(**fit(RoutingDecision, values))
        if keep_created_at and created_at:
            when = datetime.fromisoformat(created_at)
            RoutingDecision.objects.filter(pk=decision.pk).update(created_at=when)
            decision.created_at = when
        Attempt.objects.bulk_create(
            [Attempt(decision=decision, **fit(Attempt, dict(a))) for a in rows["attempts"]]
        )
    return decision


def record(request: AuditRequest, routed: RoutingResult) -> RoutingDecision:
    return write_rows(decision_rows(request, routed))
