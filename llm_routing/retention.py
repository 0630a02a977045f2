"""Retention: delete routing logs and async jobs older than ``RETENTION_DAYS``.

Rows go in batches of ``RETENTION_BATCH_SIZE``, one transaction per batch, oldest
first, so a purge never holds long locks and can be interrupted at any point without
leaving a decision without its attempts. Used by the periodic Celery task
(:func:`llm_routing.tasks.purge_routing_logs`) and by ``manage.py llm_routing_purge``.

Jobs are purged whatever their status: a job still unfinished after the retention
period is abandoned, and deleting it also deletes the input it was still holding.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from .conf import routing_settings
from .models import Attempt, AuditJob, RoutingDecision

__all__ = ["PurgeReport", "cutoff_for", "purge"]


@dataclass(frozen=True, slots=True)
class PurgeReport:
    cutoff: datetime
    decisions: int
    attempts: int
    jobs: int
    dry_run: bool

    def to_dict(self) -> dict[str, object]:
        return {
            "cutoff": self.cutoff.isoformat(),
            "decisions": self.decisions,
            "attempts": self.attempts,
            "jobs": self.jobs,
            "dry_run": self.dry_run,
        }


def cutoff_for(days: float, *, now: datetime | None = None) -> datetime:
    return (now or timezone.now()) - timedelta(days=days)


def _positive(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ValueError(f"{name} must be a positive number.")
    return float(value)


def purge(
    *,
    days: float | None = None,
    batch_size: int | None = None,
    dry_run: bool = False,
    now: datetime | None = None,
) -> PurgeReport:
    """Delete (or with ``dry_run`` only count) rows created before the cutoff."""
    days = _positive(routing_settings.RETENTION_DAYS if days is None else days, "days")
    size = int(
        _positive(
            routing_settings.RETENTION_BATCH_SIZE if batch_size is None else batch_size,
            "batch_size",
        )
    )
    cutoff = cutoff_for(days, now=now)
    old_decisions = RoutingDecision.objects.filter(created_at__lt=cutoff)
    old_jobs = AuditJob.objects.filter(created_at__lt=cutoff)
    if dry_run:
        return PurgeReport(
            cutoff=cutoff,
            decisions=old_decisions.count(),
            attempts=Attempt.objects.filter(decision__created_at__lt=cutoff).count(),
            jobs=old_jobs.count(),
            dry_run=True,
        )
    decisions = attempts = jobs = 0
    while True:
        with transaction.atomic():
            ids = list(
                old_decisions.order_by("created_at", "pk").values_list("pk", flat=True)[:size]
            )
            if not ids:
                break
            attempts += Attempt.objects.filter(decision_id__in=ids).delete()[0]
            decisions += RoutingDecision.objects.filter(pk__in=ids).delete()[0]
        if len(ids) < size:
            break
    while True:
        with transaction.atomic():
            job_ids = list(
                old_jobs.order_by("created_at", "pk").values_list("pk", flat=True)[:size]
            )
            if not job_ids:
                break
            jobs += AuditJob.objects.filter(pk__in=job_ids).delete()[0]
        if len(job_ids) < size:
            break
    return PurgeReport(
        cutoff=cutoff, decisions=decisions, attempts=attempts, jobs=jobs, dry_run=False
    )
