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

import json
import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import DatabaseError, IntegrityError, models, transaction
from django.utils import timezone

from . import pricing, spool
from .models import Attempt, RoutingDecision
from .types import AuditRequest, RoutingResult

__all__ = [
    "FlushReport",
    "decision_rows",
    "fit",
    "flush_spool",
    "record",
    "record_or_spool",
    "write_rows",
]

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
    cost = pricing.costs(routed)
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
            "cost_usd": pricing.format_usd(cost.total),
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
                "cost_usd": pricing.format_usd(c),
            }
            for a, c in zip(meta.attempts, cost.attempts, strict=True)
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


def record_or_spool(request: AuditRequest, routed: RoutingResult) -> None:
    """Record the decision; when the database refuses, spool it (``SPOOL_DIR``).

    Never raises: the caller has an answer to give whatever happens here.
    """
    rows = decision_rows(request, routed)
    try:
        write_rows(rows)
        return
    except Exception as exc:
        # The exception's text may quote the statement: its type only.
        problem = type(exc).__name__
    try:
        where = spool.append(rows)
    except Exception:
        logger.exception("Could not spool routing decision %s either", routed.request_id)
        return
    if where is None:
        logger.error(
            "Could not record routing decision %s (%s); it is lost (set "
            'LLM_ROUTING["SPOOL_DIR"] to keep such decisions).',
            routed.request_id,
            problem,
        )
    else:
        logger.warning(
            "Could not record routing decision %s (%s); spooled to %s "
            "(manage.py llm_routing_spool_flush writes it).",
            routed.request_id,
            problem,
            where,
        )


@dataclass(frozen=True)
class FlushReport:
    written: int = 0
    already_recorded: int = 0
    rejected: int = 0
    left: int = 0  # lines still spooled because the database failed mid-flush

    def to_dict(self) -> dict[str, int]:
        return {
            "written": self.written,
            "already_recorded": self.already_recorded,
            "rejected": self.rejected,
            "left": self.left,
        }


def flush_spool() -> FlushReport:
    """Write every spooled decision not yet in the database (idempotent: ``request_id``
    is unique). A line that can never be written (malformed) moves to ``rejected.jsonl``;
    a database error stops the flush and leaves the file for the next one."""
    written = already = rejected = left = 0
    for path in spool.claim():
        pending = list(spool.lines(path))
        for position, (_, text) in enumerate(pending):
            try:
                rows = json.loads(text)
                request_id = rows["decision"]["request_id"]
                if RoutingDecision.objects.filter(request_id=request_id).exists():
                    already += 1
                    continue
                write_rows(rows, keep_created_at=True)
                written += 1
            except IntegrityError:
                already += 1  # a concurrent flush (or the router) wrote it first
            except DatabaseError as exc:
                left += len(pending) - position
                logger.warning(
                    "Spool flush stopped (%s); %d decision(s) left in %s",
                    type(exc).__name__,
                    len(pending) - position,
                    path.name,
                )
                return FlushReport(written, already, rejected, left)
            except (ValueError, KeyError, TypeError) as exc:
                rejected += 1
                logger.error("Spooled line rejected (%s); kept in %s", exc, spool.REJECTED)
                _reject(text)
        path.unlink(missing_ok=True)  # a concurrent flush may have finished it first
    return FlushReport(written, already, rejected, left)


def _reject(text: str) -> None:
    directory = spool.spool_dir()
    if directory is not None:
        with (directory / spool.REJECTED).open("a", encoding="ascii", errors="replace") as f:
            f.write(text if text.endswith("\n") else text + "\n")
