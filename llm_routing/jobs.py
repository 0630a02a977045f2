"""Asynchronous audit jobs: submit, claim, run, finish. The idempotency rules live here.

A job moves ``pending → running → done | failed``. The Celery task in
:mod:`llm_routing.tasks` is a thin wrapper over :func:`run_job`; without Celery
installed, :func:`enqueue` runs the job in-process (the same code path).

Idempotency (a redelivered message — broker visibility timeout, worker killed — never
routes a job twice, and never logs it twice):

* **Claim** — one conditional ``UPDATE`` moves a job to ``running`` only when it is
  ``pending``, or ``running`` with an expired lease (its worker presumed dead). The
  claim writes a fresh ``claim_token`` and a lease of ``REQUEST_DEADLINE_S +
  JOB_LEASE_GRACE_S``; the router's request-wide deadline bounds a live run, so a live
  worker's lease never expires while it is still routing. A redelivery that finds a
  live lease is told to come back when it expires; one that finds the job finished
  does nothing.
* **Finish** — the routing decision is recorded and the job marked ``done`` in *one*
  transaction, and only while the job still carries this run's ``claim_token``: a run
  that lost its claim rolls back and writes nothing.
* **Unique decision** — the decision's ``request_id`` is the job's id (the column is
  unique), so even a bug in the above could not log a job twice.

A crash after the upstream answered but before the commit re-runs the job once its
lease expires: the upstream may see that request again, the database never does.
After ``JOB_MAX_CLAIMS`` claims a job is marked ``failed`` (a poison-message guard).
"""

from __future__ import annotations

import importlib.util
import logging
import uuid
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django.db.models.functions import Coalesce
from django.utils import timezone

from . import pricing
from .access import principal_for, viewer_for, visible_routed
from .conf import routing_settings
from .models import AuditJob
from .recorder import record
from .service import execute
from .types import AuditRequest, ForcedTool

__all__ = [
    "PAYLOAD_FIELDS",
    "RunOutcome",
    "celery_installed",
    "claim_job",
    "enqueue",
    "job_payload",
    "lease_seconds",
    "requeue_stale_jobs",
    "run_job",
    "submit",
]

logger = logging.getLogger("llm_routing.jobs")

#: The request fields a job keeps until it has run (never ``async`` / ``stream``).
PAYLOAD_FIELDS = (
    "task",
    "chain",
    "instructions",
    "input_text",
    "provider",
    "route",
    "force_provider",
    "response_schema",
    "metadata",
    "messages",
    "tools",
    "tool_choice",
    "affinity",
)


@dataclass(frozen=True, slots=True)
class RunOutcome:
    """What one delivery of a job did: ``done``, ``failed``, ``finished`` (already
    finished: nothing done), ``busy`` (another live run holds it; retry in
    ``retry_in`` seconds), ``lost_claim`` or ``missing``."""

    state: str
    retry_in: float | None = None


def lease_seconds() -> float:
    return float(routing_settings.REQUEST_DEADLINE_S) + float(routing_settings.JOB_LEASE_GRACE_S)


def job_payload(validated: dict[str, Any]) -> dict[str, Any]:
    """The part of a validated ``POST /audit/`` body a worker needs to run the job
    (JSON: messages, tools and the tool choice in their wire shapes, validated again
    when the job runs)."""
    payload = {name: validated.get(name) for name in PAYLOAD_FIELDS}
    if payload["messages"] is not None:
        payload["messages"] = [m.to_dict() for m in payload["messages"]]
    if payload["tools"] is not None:
        payload["tools"] = [t.to_dict() for t in payload["tools"]]
    if isinstance(payload["tool_choice"], ForcedTool):
        name = payload["tool_choice"].name
        payload["tool_choice"] = {"type": "function", "function": {"name": name}}
    return payload


def submit(*, owner: Any, validated: dict[str, Any]) -> AuditJob:
    """Create a pending job and queue it once the surrounding transaction commits."""
    job = AuditJob.objects.create(
        owner=owner, task=validated["task"], payload=job_payload(validated)
    )
    job_id = job.pk
    transaction.on_commit(lambda: enqueue(job_id))
    return job


#: The Celery task that runs a job (``llm_routing.tasks.run_audit_job``), sent by name.
RUN_TASK = "llm_routing.run_audit_job"


def celery_installed() -> bool:
    """Whether Celery can be imported (it is an optional extra of the app)."""
    try:
        return importlib.util.find_spec("celery") is not None
    except (ImportError, ValueError):  # ValueError: sys.modules["celery"] is None
        return False


def enqueue(job_id: uuid.UUID | str) -> None:
    """Hand the job to Celery (eager when no broker is configured); without Celery
    installed, run it here. A queue that cannot be reached fails the job clearly."""
    if not celery_installed():
        run_job(job_id)
        return
    from celery import current_app  # by the task's name: this module never imports tasks

    if current_app.conf.task_always_eager:
        run_job(job_id)  # what the task does when run eagerly (it retries only on a worker)
        return
    try:
        current_app.send_task(RUN_TASK, args=[str(job_id)])
    except Exception:
        logger.exception("Could not queue audit job %s", job_id)
        _fail(job_id, None, "queue_unavailable", "The job could not be queued.")


def claim_job(
    job_id: uuid.UUID | str, *, now: datetime | None = None
) -> tuple[AuditJob | None, RunOutcome | None]:
    """Atomically claim a job. Returns ``(job, None)`` when claimed, else
    ``(None, outcome)`` saying why not."""
    now = now or timezone.now()
    token = uuid.uuid4()
    max_claims = int(routing_settings.JOB_MAX_CLAIMS)
    claimable = Q(status=AuditJob.Status.PENDING) | Q(
        status=AuditJob.Status.RUNNING, lease_expires_at__lte=now
    )
    claimed = AuditJob.objects.filter(claimable, pk=job_id, claims__lt=max_claims).update(
        status=AuditJob.Status.RUNNING,
        claims=F("claims") + 1,
        claim_token=token,
        lease_expires_at=now + timedelta(seconds=lease_seconds()),
        started_at=Coalesce("started_at", now),
    )
    if claimed:
        return AuditJob.objects.get(pk=job_id), None
    job = AuditJob.objects.filter(pk=job_id).first()
    if job is None:
        return None, RunOutcome("missing")
    if job.finished:
        return None, RunOutcome("finished")
    if job.claims >= max_claims and (
        job.status == AuditJob.Status.PENDING
        or (job.lease_expires_at is not None and job.lease_expires_at <= now)
    ):
        _fail(job.pk, None, "too_many_claims", "The job was claimed too often without finishing.")
        return None, RunOutcome("failed")
    remaining = (job.lease_expires_at - now).total_seconds() if job.lease_expires_at else 1.0
    return None, RunOutcome("busy", retry_in=max(remaining, 0.5))


def _request_from_payload(payload: Any) -> AuditRequest:
    from .service import build_request  # imports the API serializers: keep it lazy

    if not isinstance(payload, dict):
        raise ValidationError("The job has no payload.")
    return build_request(**{k: v for k, v in payload.items() if v is not None})


def run_job(job_id: uuid.UUID | str) -> RunOutcome:
    """Claim, route and finish one job. Safe to call any number of times."""
    try:
        job_id = uuid.UUID(str(job_id))
    except ValueError:
        logger.warning("audit job id %r is not a UUID; message dropped", str(job_id)[:64])
        return RunOutcome("missing")
    job, outcome = claim_job(job_id)
    if outcome is not None:
        logger.info("audit job %s not run: %s", job_id, outcome.state)
        return outcome
    assert job is not None and job.claim_token is not None
    token = job.claim_token
    try:
        # The owner's access rules apply when the job runs, as they did when it was sent.
        request = replace(_request_from_payload(job.payload), principal=principal_for(job.owner))
    except ValidationError:
        _fail(job.pk, token, "invalid_payload", "The stored request is no longer valid.")
        return RunOutcome("failed")
    try:
        routed = execute(request, request_id=str(job.pk), persist=False)
    except Exception:
        logger.exception("Routing audit job %s failed", job.pk)
        _fail(job.pk, token, "internal", "The job could not be routed.")
        return RunOutcome("failed")
    now = timezone.now()
    try:
        with transaction.atomic():
            finished = AuditJob.objects.filter(
                pk=job.pk, status=AuditJob.Status.RUNNING, claim_token=token
            ).update(
                status=AuditJob.Status.DONE,
                # What its owner may see (access.visible_routed); the row keeps all.
                result=pricing.envelope(routed, visible_routed(routed, viewer_for(job.owner))),
                payload=None,
                request_id=job.pk,
                finished_at=now,
                claim_token=None,
                lease_expires_at=None,
            )
            if finished != 1:
                raise _LostClaimError
            record(request, routed)
    except _LostClaimError:
        logger.warning("audit job %s: claim lost before finishing; nothing written", job.pk)
        return RunOutcome("lost_claim")
    except IntegrityError:
        logger.warning("audit job %s: decision already recorded; nothing written", job.pk)
        return RunOutcome("lost_claim")
    except Exception:
        # Any other recording error (a value the database refuses, a dropped connection):
        # end the job rather than leave it running to be re-routed on every lease expiry.
        logger.exception("audit job %s: the routing decision could not be recorded", job.pk)
        try:
            _fail(job.pk, token, "recording", "The routing decision could not be recorded.")
        except Exception:
            logger.exception("audit job %s: could not be marked failed either", job.pk)
        return RunOutcome("failed")
    return RunOutcome("done")


class _LostClaimError(Exception):
    pass


def _fail(job_id: uuid.UUID | str, token: uuid.UUID | None, category: str, message: str) -> None:
    unfinished = [AuditJob.Status.PENDING, AuditJob.Status.RUNNING]
    rows = AuditJob.objects.filter(pk=job_id, status__in=unfinished)
    if token is not None:
        rows = rows.filter(claim_token=token)
    rows.update(
        status=AuditJob.Status.FAILED,
        error={"category": category, "message": message},
        payload=None,
        finished_at=timezone.now(),
        claim_token=None,
        lease_expires_at=None,
    )


def requeue_stale_jobs(*, pending_after_s: float = 300.0, now: datetime | None = None) -> int:
    """Queue again the jobs whose message was lost: pending for longer than
    ``pending_after_s``, or running with an expired lease. Duplicates are harmless
    (see the claim rules); returns how many were queued."""
    now = now or timezone.now()
    stale = AuditJob.objects.filter(
        Q(status=AuditJob.Status.PENDING, created_at__lte=now - timedelta(seconds=pending_after_s))
        | Q(status=AuditJob.Status.RUNNING, lease_expires_at__lte=now)
    ).values_list("pk", flat=True)[:1000]
    ids = list(stale)
    for job_id in ids:
        enqueue(job_id)
    return len(ids)
