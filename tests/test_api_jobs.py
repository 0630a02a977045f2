"""Async audit jobs over HTTP (``POST /audit/`` with ``"async": true``, polling).

Embedded: eager Celery, SQLite. The services suite runs this module again on
PostgreSQL + Redis (see tests/services_plugin.py).
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse
from rest_framework.test import APIClient

from llm_routing.models import AuditJob, RoutingDecision

# transaction=True: jobs are queued on commit, as in production.
pytestmark = pytest.mark.django_db(transaction=True)

BODY = {"task": "summarize", "input_text": "The quick brown fox.", "async": True}


def _client(user: Any) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


@pytest.fixture
def alice() -> Any:
    return get_user_model().objects.create_user("alice", password="pw-alice-123")


@pytest.fixture
def bob() -> Any:
    return get_user_model().objects.create_user("bob", password="pw-bob-123")


def test_async_post_answers_202_with_job_id_and_status_url(alice: Any) -> None:
    response = _client(alice).post("/audit/", BODY, format="json")
    assert response.status_code == 202, response.content
    body = response.json()
    assert set(body) == {"job_id", "status", "status_url"}
    job_id = uuid.UUID(body["job_id"])
    assert body["status_url"] == f"http://testserver/audit/jobs/{job_id}/"
    assert response["Location"] == body["status_url"]
    assert body["status"] == "done"  # eager Celery ran it before the answer
    assert AuditJob.objects.get(pk=job_id).owner == alice


def test_polling_returns_the_synchronous_envelope(alice: Any) -> None:
    client = _client(alice)
    job = client.post("/audit/", BODY, format="json").json()
    sync = client.post("/audit/", {**BODY, "async": False}, format="json").json()
    polled = client.get(job["status_url"])
    assert polled.status_code == 200
    data = polled.json()
    assert data["status"] == "done"
    assert data["job_id"] == job["job_id"]
    assert data["request_id"] == job["job_id"]  # the decision reuses the job id
    assert data["routing_metadata"]["request_id"] == job["job_id"]
    for key in ("request_id", "result", "routing_metadata", "diagnostics"):
        assert key in data
    # Same envelope shape and the same (deterministic mock) answer as the sync path.
    assert set(data["result"]) == set(sync["result"])
    assert set(data["routing_metadata"]) == set(sync["routing_metadata"])
    assert data["result"]["output"] == sync["result"]["output"]
    assert data["result"]["provider"] == "mock"
    assert data["finished_at"] is not None
    assert polled["X-Request-ID"] == job["job_id"]
    assert RoutingDecision.objects.filter(request_id=job["job_id"]).count() == 1


def test_pending_job_shows_status_without_envelope(alice: Any) -> None:
    job = AuditJob.objects.create(owner=alice, task="t", payload={"task": "t"})
    data = _client(alice).get(reverse("llm_routing:audit-job", args=[job.pk])).json()
    assert data["status"] == "pending"
    assert "result" not in data and "routing_metadata" not in data


def test_failed_job_shows_error(alice: Any) -> None:
    job = AuditJob.objects.create(
        owner=alice,
        task="t",
        status=AuditJob.Status.FAILED,
        error={"category": "queue_unavailable", "message": "The job could not be queued."},
    )
    data = _client(alice).get(f"/audit/jobs/{job.pk}/").json()
    assert data["status"] == "failed"
    assert data["error"]["category"] == "queue_unavailable"


def test_payload_is_deleted_once_the_job_finished(alice: Any) -> None:
    secret_input = "Confidential input that must not stay in the jobs table."
    body = {**BODY, "input_text": secret_input}
    job_id = _client(alice).post("/audit/", body, format="json").json()["job_id"]
    job = AuditJob.objects.get(pk=job_id)
    assert job.status == AuditJob.Status.DONE
    assert job.payload is None
    assert secret_input not in str(job.result)
    assert secret_input not in str(job.error)


def test_other_users_get_404_and_staff_can_see(alice: Any, bob: Any) -> None:
    job_id = _client(alice).post("/audit/", BODY, format="json").json()["job_id"]
    url = f"/audit/jobs/{job_id}/"
    assert _client(bob).get(url).status_code == 404
    staff = get_user_model().objects.create_user("ops", password="pw-ops-123", is_staff=True)
    assert _client(staff).get(url).status_code == 200
    assert _client(alice).get(url).status_code == 200


@pytest.mark.parametrize("job_id", ["not-a-uuid", "1234", str(uuid.uuid4())])
def test_bad_or_unknown_job_id_is_404(alice: Any, job_id: str) -> None:
    response = _client(alice).get(f"/audit/jobs/{job_id}/")
    assert response.status_code == 404
    assert response.json() == {"detail": "No such job."}


def test_unauthenticated_poll_is_refused(alice: Any) -> None:
    job_id = _client(alice).post("/audit/", BODY, format="json").json()["job_id"]
    assert APIClient().get(f"/audit/jobs/{job_id}/").status_code in {401, 403}


def test_async_with_bad_input_is_400_and_creates_no_job(alice: Any) -> None:
    response = _client(alice).post("/audit/", {**BODY, "input_text": "  "}, format="json")
    assert response.status_code == 400
    assert "input_text" in response.json()
    assert not AuditJob.objects.exists()


def test_async_false_still_answers_200(alice: Any) -> None:
    response = _client(alice).post("/audit/", {**BODY, "async": False}, format="json")
    assert response.status_code == 200
    assert not AuditJob.objects.exists()


def test_async_and_stream_together_are_refused(alice: Any) -> None:
    response = _client(alice).post("/audit/", {**BODY, "stream": True}, format="json")
    assert response.status_code == 400
    assert response.json() == {"async": ["Use either stream or async, not both."]}
    assert not AuditJob.objects.exists()


def test_async_keeps_the_named_chain(alice: Any) -> None:
    """``chain`` travels with the job: the job routes through the chain the caller
    named, as the synchronous request does (it used to run on the default chain)."""
    from tests.conftest import make_chain, make_provider

    make_chain("other", [make_provider("m2", kind="mock", model="")])
    client = _client(alice)
    job = client.post("/audit/", {**BODY, "chain": "other"}, format="json").json()
    data = client.get(job["status_url"]).json()
    assert data["routing_metadata"]["chain_name"] == "other", data["routing_metadata"]
    assert data["routing_metadata"]["router_mode"] == "chain"


def test_the_202_carries_the_decisions_request_id(alice: Any) -> None:
    """The 202's ``X-Request-ID`` is the id of the job's decision row (the job's id),
    not the HTTP request's own id, which no row carries."""
    response = _client(alice).post("/audit/", BODY, format="json")
    assert response.status_code == 202
    job_id = response.json()["job_id"]
    decision = RoutingDecision.objects.get()  # eager Celery routed it before the answer
    assert response["X-Request-ID"] == str(decision.request_id) == job_id
    polled = _client(alice).get(response["Location"])
    assert polled["X-Request-ID"] == job_id


def test_async_keeps_the_affinity_key_of_the_header(
    alice: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from llm_routing import jobs

    seen: list[Any] = []
    real = jobs._request_from_payload

    def spy(payload: Any) -> Any:
        seen.append(real(payload).affinity)
        return real(payload)

    monkeypatch.setattr(jobs, "_request_from_payload", spy)
    client = _client(alice)
    response = client.post("/audit/", BODY, format="json", HTTP_X_LLM_AFFINITY="conv-1")
    assert response.status_code == 202, response.content
    response = client.post("/audit/", {**BODY, "affinity": "conv-2"}, format="json")
    assert response.status_code == 202, response.content
    assert seen == ["conv-1", "conv-2"]
