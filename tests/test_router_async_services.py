"""The decision-row invariant under load (issue 14): 500 concurrent requests through the
async router on PostgreSQL, against a real HTTP upstream, with write-behind recording —
every answered request id has its decision row and its attempts once the queue is
flushed, and the 500 were in flight together (one event loop, no thread per call)."""

from __future__ import annotations

import asyncio
import time

import pytest
from django.test import override_settings

from llm_routing import recorder
from llm_routing.models import Attempt, Chain, ChainEntry, Provider, RoutingDecision
from llm_routing.router import aroute
from llm_routing.types import AuditRequest
from tests.conftest import upstream_fields
from tests.fakes.upstream import FakeUpstream, Faults

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]

CONCURRENT = 500
DELAY_S = 0.5


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_PROVIDER_KEY", "sk-async-load-123456")
    monkeypatch.delenv("DJANGO_ALLOW_ASYNC_UNSAFE", raising=False)


def test_every_answer_of_500_concurrent_requests_has_its_decision_row(
    fake_upstream: FakeUpstream, tmp_path: object
) -> None:
    row = Provider.objects.create(
        **{**upstream_fields("oc", "openai_compatible", fake_upstream), "max_retries": 0}
    )
    chain = Chain.objects.create(name="main", is_default=True)
    ChainEntry.objects.create(chain=chain, provider=row, position=0)
    fake_upstream.script("openai", *[Faults.slow(DELAY_S)] * CONCURRENT)
    request = AuditRequest(task="summarize", input_text="Some input text.")

    async def burst() -> tuple[list[str], float]:
        started = time.monotonic()
        routed = await asyncio.gather(*[aroute(request) for _ in range(CONCURRENT)])
        assert all(r.result.ok for r in routed), {r.result.error for r in routed}
        return [r.request_id for r in routed], time.monotonic() - started

    with override_settings(LLM_ROUTING={"RECORD_MODE": "write_behind", "SPOOL_DIR": str(tmp_path)}):
        ids, took = asyncio.run(burst())
        assert recorder.flush(timeout=60.0)
    assert len(set(ids)) == CONCURRENT
    assert recorder.missing_decisions(ids) == set()
    assert RoutingDecision.objects.filter(request_id__in=ids).count() == CONCURRENT
    assert Attempt.objects.filter(decision__request_id__in=ids, outcome="ok").count() == (
        CONCURRENT
    )
    # Held together, not one after another: far below 500 x the upstream's delay (a
    # bound on concurrency, not a timing target).
    assert took < CONCURRENT * DELAY_S / 10
