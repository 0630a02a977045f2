"""The AuditJob admin shows a job's state, never its stored input."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from llm_routing.models import AuditJob

pytestmark = pytest.mark.django_db

SECRET_INPUT = "Raw input that the admin must never display."


def test_job_admin_pages_hide_the_payload() -> None:
    admin_user = get_user_model().objects.create_superuser("root", password="pw-root-123")
    job = AuditJob.objects.create(
        owner=admin_user,
        task="summarize",
        payload={"task": "summarize", "input_text": SECRET_INPUT},
    )
    client = Client()
    client.force_login(admin_user)
    listing = client.get("/admin/llm_routing/auditjob/")
    detail = client.get(f"/admin/llm_routing/auditjob/{job.pk}/change/")
    assert listing.status_code == 200 and detail.status_code == 200
    assert str(job.pk) in detail.content.decode()
    assert SECRET_INPUT not in listing.content.decode()
    assert SECRET_INPUT not in detail.content.decode()
    assert client.get("/admin/llm_routing/auditjob/add/").status_code == 403
