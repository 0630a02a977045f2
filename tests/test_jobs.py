"""llm_routing.jobs (and the thin task over it): claims, idempotency, failures."""

from __future__ import annotations

import socket
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import DataError
from django.utils import timezone

from llm_routing import jobs, service
from llm_routing.models import Attempt, AuditJob, RoutingDecision
from llm_routing.signals import before_provider_call
from llm_routing.tasks import run_audit_job

pytestmark = pytest.mark.django_db

PAYLOAD = {"task": "summarize", "input_text": "Some input.", "metadata": {"k": "v"}}


@pytest.fixture
def job() -> AuditJob:
    owner = get_user_model().objects.create_user("owner", password="pw-owner-123")
    return AuditJob.objects.create(owner=owner, task="summarize", payload=dict(PAYLOAD))


def test_run_job_routes_records_and_clears_the_payload(job: AuditJob) -> None:
    assert jobs.run_job(job.pk).state == "done"
    job.refresh_from_db()
    assert job.status == AuditJob.Status.DONE
    assert job.payload is None
    assert job.claims == 1 and job.claim_token is None
    assert job.request_id == job.pk
    decision = RoutingDecision.objects.get()
    assert decision.request_id == job.pk
    assert job.result["request_id"] == str(job.pk)
    assert job.result["result"]["provider"] == "mock"
    assert Attempt.objects.filter(decision=decision).count() == 1


def test_task_body_called_twice_routes_once(job: AuditJob) -> None:
    calls: list[str] = []

    def count(sender: Any, **kwargs: Any) -> None:
        calls.append(kwargs["request_id"])

    before_provider_call.connect(count)
    try:
        assert run_audit_job.run(str(job.pk)) == "done"
        assert run_audit_job.run(str(job.pk)) == "finished"
        assert run_audit_job.apply(args=[str(job.pk)]).get() == "finished"
    finally:
        before_provider_call.disconnect(count)
    assert calls == [str(job.pk)]  # the provider was called once
    assert RoutingDecision.objects.count() == 1
    job.refresh_from_db()
    assert job.claims == 1


def test_a_live_claim_makes_a_redelivery_wait(job: AuditJob) -> None:
    claimed, outcome = jobs.claim_job(job.pk)
    assert claimed is not None and outcome is None
    again = jobs.run_job(job.pk)
    assert again.state == "busy"
    assert again.retry_in is not None
    assert 0 < again.retry_in <= jobs.lease_seconds()
    assert not RoutingDecision.objects.exists()


def test_an_expired_claim_is_taken_over_and_finished_once(job: AuditJob) -> None:
    long_ago = timezone.now() - timedelta(seconds=jobs.lease_seconds() + 5)
    claimed, _ = jobs.claim_job(job.pk, now=long_ago)  # a worker that then died
    assert claimed is not None
    assert jobs.run_job(job.pk).state == "done"
    job.refresh_from_db()
    assert job.claims == 2
    assert RoutingDecision.objects.filter(request_id=job.pk).count() == 1


def test_a_run_that_lost_its_claim_writes_nothing(job: AuditJob) -> None:
    def steal(sender: Any, **kwargs: Any) -> None:
        # Another worker takes the job over while this one is mid-call.
        future = timezone.now() + timedelta(seconds=jobs.lease_seconds() + 5)
        jobs.claim_job(job.pk, now=future)

    before_provider_call.connect(steal)
    try:
        assert jobs.run_job(job.pk).state == "lost_claim"
    finally:
        before_provider_call.disconnect(steal)
    assert not RoutingDecision.objects.exists()
    job.refresh_from_db()
    assert job.status == AuditJob.Status.RUNNING
    assert job.payload == PAYLOAD  # the new claimant still needs it


def test_crash_between_routing_and_recording_leaves_no_half_state(
    job: AuditJob, monkeypatch: pytest.MonkeyPatch
) -> None:
    class WorkerKilled(BaseException):  # like SystemExit: not a recording error
        pass

    def crash(*args: Any, **kwargs: Any) -> None:
        raise WorkerKilled("worker killed while recording")

    monkeypatch.setattr(jobs, "record", crash)
    with pytest.raises(WorkerKilled):
        jobs.run_job(job.pk)
    monkeypatch.undo()
    job.refresh_from_db()
    assert job.status == AuditJob.Status.RUNNING  # the done-update was rolled back
    assert job.result is None and job.payload == PAYLOAD
    assert not RoutingDecision.objects.exists()
    # Redelivered after the lease ran out: routed and recorded exactly once.
    AuditJob.objects.filter(pk=job.pk).update(lease_expires_at=timezone.now())
    assert jobs.run_job(job.pk).state == "done"
    assert RoutingDecision.objects.filter(request_id=job.pk).count() == 1


def test_any_recording_error_ends_the_job_failed(
    job: AuditJob, monkeypatch: pytest.MonkeyPatch
) -> None:
    # issue 11: only IntegrityError was caught; a DataError left the job running, to be
    # re-routed on every lease expiry.
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise DataError("value too long for type character varying(64)")

    monkeypatch.setattr(jobs, "record", refuse)
    assert jobs.run_job(job.pk).state == "failed"
    job.refresh_from_db()
    assert job.status == AuditJob.Status.FAILED
    assert job.error == {
        "category": "recording",
        "message": "The routing decision could not be recorded.",
    }
    assert job.claim_token is None and job.payload is None
    assert not RoutingDecision.objects.exists()
    assert jobs.run_job(job.pk).state == "finished"  # a redelivery does nothing


def test_long_route_key_job_is_recorded_with_a_fitted_chain_name(
    job: AuditJob, settings: Any
) -> None:
    key = "k" * 64
    settings.LLM_ROUTING = {"ROUTES": {key: ["mock"]}}
    AuditJob.objects.filter(pk=job.pk).update(payload={**PAYLOAD, "route": key})
    assert jobs.run_job(job.pk).state == "done"
    decision = RoutingDecision.objects.get(request_id=job.pk)
    assert decision.route == key
    assert len(decision.chain_name) == 64
    assert decision.chain_name.startswith("route:kkk") and decision.chain_name.endswith("…")


def test_too_many_claims_fail_the_job(job: AuditJob) -> None:
    expired = timezone.now() - timedelta(seconds=1)
    AuditJob.objects.filter(pk=job.pk).update(
        status=AuditJob.Status.RUNNING, claims=3, lease_expires_at=expired
    )
    assert jobs.run_job(job.pk).state == "failed"
    job.refresh_from_db()
    assert job.status == AuditJob.Status.FAILED
    assert job.error["category"] == "too_many_claims"
    assert job.payload is None
    assert not RoutingDecision.objects.exists()


def test_invalid_payload_fails_the_job(job: AuditJob) -> None:
    AuditJob.objects.filter(pk=job.pk).update(payload={"task": "bad task!", "input_text": ""})
    assert jobs.run_job(job.pk).state == "failed"
    job.refresh_from_db()
    assert job.error["category"] == "invalid_payload"
    assert job.payload is None


@pytest.mark.parametrize("job_id", ["00000000-0000-0000-0000-000000000000", "not-a-uuid", ""])
def test_missing_or_malformed_job_id(job: AuditJob, job_id: str) -> None:
    assert jobs.run_job(job_id).state == "missing"
    assert run_audit_job.apply(args=[job_id]).get() == "missing"
    job.refresh_from_db()
    assert job.status == AuditJob.Status.PENDING


def test_unreachable_queue_fails_the_job_clearly(job: AuditJob) -> None:
    from celery import current_app

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    conf = current_app.conf
    saved = {k: conf[k] for k in ("task_always_eager", "broker_url", "task_publish_retry")}
    conf.update(
        task_always_eager=False,
        broker_url=f"amqp://guest:guest@127.0.0.1:{port}//",
        task_publish_retry=False,
    )
    try:
        jobs.enqueue(job.pk)
    finally:
        conf.update(saved)
        current_app.pool.force_close_all()
    job.refresh_from_db()
    assert job.status == AuditJob.Status.FAILED
    assert job.error == {"category": "queue_unavailable", "message": "The job could not be queued."}


def test_without_celery_the_job_runs_in_process(
    job: AuditJob, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(jobs, "celery_installed", lambda: False)
    jobs.enqueue(job.pk)
    job.refresh_from_db()
    assert job.status == AuditJob.Status.DONE


def test_requeue_stale_jobs_runs_lost_ones_only(job: AuditJob) -> None:
    fresh = AuditJob.objects.create(owner=job.owner, task="summarize", payload=dict(PAYLOAD))
    AuditJob.objects.filter(pk=job.pk).update(created_at=timezone.now() - timedelta(hours=1))
    assert jobs.requeue_stale_jobs(pending_after_s=300) == 1
    job.refresh_from_db()
    fresh.refresh_from_db()
    assert job.status == AuditJob.Status.DONE
    assert fresh.status == AuditJob.Status.PENDING


def test_jobs_route_through_the_single_service_entry_point(
    job: AuditJob, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[dict[str, Any]] = []
    real = service.execute

    def spy(request: Any, **kwargs: Any) -> Any:
        seen.append(kwargs)
        return real(request, **kwargs)

    monkeypatch.setattr(jobs, "execute", spy)
    assert jobs.run_job(job.pk).state == "done"
    assert seen == [{"request_id": str(job.pk), "persist": False}]
    assert RoutingDecision.objects.filter(request_id=job.pk).count() == 1


WITHOUT_CELERY = """
import json, os, sys
sys.modules["celery"] = None  # importing celery now raises ImportError
os.environ.update(DJANGO_SETTINGS_MODULE="tests.settings", DATABASE_URL="sqlite://:memory:")
import django
django.setup()
from django.contrib.auth import get_user_model
from django.core.management import call_command
from rest_framework.test import APIClient
call_command("migrate", verbosity=0)
client = APIClient()
client.force_authenticate(get_user_model().objects.create_user("nocelery"))
body = {"task": "summarize", "input_text": "x", "async": True}
submitted = client.post("/audit/", body, format="json")
polled = client.get(submitted.json()["status_url"]).json()
print(json.dumps({"code": submitted.status_code, "status": polled["status"],
                  "provider": polled["result"]["provider"],
                  "celery": sys.modules.get("celery") is not None}))
"""


def test_the_app_runs_async_jobs_without_celery_installed() -> None:
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    env = {"PATH": "/usr/bin:/bin", "SECRET_KEY": "x" * 60, "ALLOWED_HOSTS": "testserver"}
    result = subprocess.run(
        [sys.executable, "-c", WITHOUT_CELERY],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    shown = json.loads(result.stdout.strip().splitlines()[-1])
    assert shown == {"code": 202, "status": "done", "provider": "mock", "celery": False}
