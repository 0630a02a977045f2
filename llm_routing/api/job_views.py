"""Async audit jobs over HTTP: ``POST /audit/`` with ``"async": true`` answers 202;
``GET /audit/jobs/<id>/`` reports the job, with the synchronous envelope once done.

Only the job's owner (or a staff user) sees a job; anyone else gets the same 404 as for
an id that does not exist.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.urls import reverse
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import NotAuthenticated, NotFound
from rest_framework.request import Request
from rest_framework.response import Response

from .. import jobs
from ..models import AuditJob
from .base import RoutingAPIView
from .schema_docs import AUDIT_JOB, documented

__all__ = ["AuditJobView", "job_representation", "submit_job"]


def _status_url(request: Request, job: AuditJob) -> str:
    return request.build_absolute_uri(reverse("llm_routing:audit-job", args=[str(job.pk)]))


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


def job_representation(request: Request, job: AuditJob) -> dict[str, Any]:
    """The job's state; when done, the synchronous envelope's keys at the top level."""
    body: dict[str, Any] = {
        "job_id": str(job.pk),
        "status": job.status,
        "status_url": _status_url(request, job),
        "created_at": _iso(job.created_at),
        "started_at": _iso(job.started_at),
        "finished_at": _iso(job.finished_at),
    }
    if job.status == AuditJob.Status.DONE and isinstance(job.result, dict):
        body.update(job.result)
    if job.status == AuditJob.Status.FAILED:
        body["error"] = job.error
    return body


def submit_job(request: Request, validated: dict[str, Any]) -> Response:
    """Create the job, queue it, answer 202 with its id and status URL. Its
    ``X-Request-ID`` is the id its decision row will carry (the job's id:
    :func:`llm_routing.jobs.run_job` routes it under that id), not the id of this
    HTTP request, so one id follows the job from the 202 to the decision."""
    user = request.user
    if user is None or not user.is_authenticated:
        raise NotAuthenticated("Async jobs need an authenticated user.")
    job = jobs.submit(owner=user, validated=validated)
    job.refresh_from_db(fields=["status"])  # eager mode may have finished it already
    url = _status_url(request, job)
    return Response(
        {"job_id": str(job.pk), "status": job.status, "status_url": url},
        status=status.HTTP_202_ACCEPTED,
        headers={"Location": url, "X-Request-ID": str(job.pk)},
    )


class AuditJobSerializer(serializers.Serializer):
    job_id = serializers.UUIDField()
    status = serializers.ChoiceField(choices=AuditJob.Status.choices)
    status_url = serializers.URLField()
    created_at = serializers.DateTimeField()
    started_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)


class AuditJobView(RoutingAPIView):
    @extend_schema(**documented(AUDIT_JOB, ok=AuditJobSerializer))
    def get(self, request: Request, job_id: str) -> Response:
        try:
            pk = uuid.UUID(job_id)
        except ValueError:
            raise NotFound("No such job.") from None
        rows = AuditJob.objects.filter(pk=pk)
        if not request.user.is_staff:
            rows = rows.filter(owner_id=request.user.pk)
        job = rows.first()
        if job is None:
            raise NotFound("No such job.")
        headers = {"X-Request-ID": str(job.request_id)} if job.request_id else None
        return Response(job_representation(request, job), headers=headers)
