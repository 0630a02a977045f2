"""Celery tasks: thin wrappers over :mod:`llm_routing.jobs`,
:mod:`llm_routing.retention` and the decision spool (:mod:`llm_routing.recorder`).

Importing this module needs Celery (the ``celery`` extra); nothing else in the app
imports it: :func:`llm_routing.jobs.enqueue` sends ``run_audit_job`` by its name
(:data:`llm_routing.jobs.RUN_TASK`), so the web process needs no task module loaded.
Tasks are declared ``acks_late`` + ``reject_on_worker_lost``: a message is
acknowledged only after its task returned, so a killed worker's job is delivered
again — and :func:`llm_routing.jobs.run_job` makes that redelivery harmless.
"""

from __future__ import annotations

from typing import Any

from celery import shared_task

from . import jobs, recorder, retention

__all__ = ["flush_decision_spool", "purge_routing_logs", "requeue_stale_jobs", "run_audit_job"]


@shared_task(
    bind=True,
    name=jobs.RUN_TASK,
    acks_late=True,
    reject_on_worker_lost=True,
    max_retries=None,
    ignore_result=True,
)
def run_audit_job(self: Any, job_id: str) -> str:
    """Run one async audit job; a job another live worker holds is retried later."""
    outcome = jobs.run_job(job_id)
    if outcome.retry_in is not None and not self.request.is_eager:
        raise self.retry(countdown=outcome.retry_in)
    return outcome.state


@shared_task(
    name="llm_routing.purge_routing_logs",
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
)
def purge_routing_logs(days: float | None = None, batch_size: int | None = None) -> dict[str, Any]:
    """The retention purge (scheduled by Celery beat; see CELERY_BEAT_SCHEDULE)."""
    return retention.purge(days=days, batch_size=batch_size).to_dict()


@shared_task(
    name="llm_routing.requeue_stale_jobs",
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
)
def requeue_stale_jobs(pending_after_s: float = 300.0) -> int:
    """Queue again async jobs whose message was lost (a safety net; see jobs.py)."""
    return jobs.requeue_stale_jobs(pending_after_s=pending_after_s)


@shared_task(
    name="llm_routing.flush_decision_spool",
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
)
def flush_decision_spool() -> dict[str, int]:
    """Write spooled routing decisions (scheduled by Celery beat when SPOOL_DIR is set)."""
    return recorder.flush_spool().to_dict()
