"""Issue 11 (part A, item 9): every snapshotted string fits its column before the insert.

Each test runs twice: on SQLite in the embedded suite and, marked ``services``, on
PostgreSQL (which refuses an over-long value with DataError instead of storing it).
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

import pytest
from django.contrib.auth import get_user_model

from llm_routing import jobs
from llm_routing.models import Attempt, AuditJob, RoutingDecision
from llm_routing.providers.base import BaseProvider
from llm_routing.providers.registry import clear_adapter_cache
from llm_routing.types import AuditRequest, ProviderResult, Usage

from .conftest import make_chain, make_provider

pytestmark = pytest.mark.django_db

BACKENDS = [
    pytest.param("sqlite", id="embedded"),
    pytest.param("postgresql", id="postgresql", marks=pytest.mark.services),
]
VENDOR_MODEL = "vendor/" + "m" * 300 + "\x00tail"


class LongModelProvider(BaseProvider):
    """A live adapter whose vendor reports an absurd model name (NUL included)."""

    kind: ClassVar[str] = "longmodel"
    requires_key: ClassVar[bool] = False

    def complete(
        self, request: AuditRequest, *, api_key: str | None, timeout: float
    ) -> ProviderResult:
        return ProviderResult(
            provider=self.config.name,
            model=VENDOR_MODEL,
            mode="live",
            status="ok",
            output="answer",
            usage=Usage(input_tokens=1, output_tokens=1),
        )


def _audit(api, **body: Any):
    return api.post(
        "/audit/",
        data=json.dumps({"task": "t", "input_text": "hi", **body}),
        content_type="application/json",
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_route_key_of_64_characters_is_logged(api, settings, backend):
    key = "r" * 64
    settings.LLM_ROUTING = {"ROUTES": {key: ["mock"]}}
    response = _audit(api, route=key)
    assert response.status_code == 200
    request_id = response.json()["request_id"]
    decision = RoutingDecision.objects.get(request_id=request_id)
    assert decision.route == key
    assert decision.chain_name == "route:" + "r" * 57 + "…"
    assert len(decision.chain_name) == RoutingDecision._meta.get_field("chain_name").max_length


@pytest.mark.parametrize("backend", BACKENDS)
def test_vendor_reported_model_name_is_fitted(api, settings, backend):
    settings.LLM_ROUTING = {"PROVIDER_KINDS": {"longmodel": f"{__name__}.LongModelProvider"}}
    clear_adapter_cache()
    make_chain("main", [make_provider("vendor", kind="longmodel")], is_default=True)
    response = _audit(api)
    clear_adapter_cache()
    assert response.status_code == 200
    assert response.json()["result"]["model"] == VENDOR_MODEL  # the caller sees it whole
    attempt = Attempt.objects.get(decision__request_id=response.json()["request_id"])
    assert len(attempt.model) == 128 and "\x00" not in attempt.model
    assert attempt.model.startswith("vendor/mmm") and attempt.model.endswith("…")


@pytest.mark.parametrize("backend", BACKENDS)
def test_async_job_with_a_long_route_key_ends_done(settings, backend):
    key = "j" * 64
    settings.LLM_ROUTING = {"ROUTES": {key: ["mock"]}}
    owner = get_user_model().objects.create_user("owner", password="pw-owner-123")
    job = AuditJob.objects.create(
        owner=owner, task="t", payload={"task": "t", "input_text": "hi", "route": key}
    )
    assert jobs.run_job(job.pk).state == "done"
    job.refresh_from_db()
    assert job.status == AuditJob.Status.DONE
    assert RoutingDecision.objects.filter(request_id=job.pk).count() == 1
