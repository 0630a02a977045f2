"""Issue 11, part B — the router's accounting: a deadline-clamped timeout is not the
provider's failure; mid-stream failures are charged (and redacted) correctly.

Over real adapters and the fake upstream (tests/fakes/upstream.py) wherever a vendor
wire format is involved; the scripted adapter kind where a custom adapter is the point.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.test import override_settings

from llm_routing.models import Attempt
from llm_routing.resilience import breaker
from llm_routing.resilience.breaker import CLOSED
from llm_routing.router import route
from llm_routing.types import AuditRequest
from tests.breaker_support import FakeClock
from tests.conftest import Sleeps
from tests.fakes.upstream import Fault, FakeUpstream, Faults

pytestmark = pytest.mark.django_db

REQUEST = AuditRequest(task="summarize", input_text="Some input text.")


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_PROVIDER_KEY", "sk-hardening-test-123456")


# --- (8) a timeout the request deadline caused -------------------------------------------


@override_settings(LLM_ROUTING={"REQUEST_DEADLINE_S": 2.0})
def test_a_deadline_clamped_timeout_is_not_charged_to_a_healthy_provider(
    fake_upstream: FakeUpstream, upstream_chain: Callable[..., list[Any]], clock: FakeClock
) -> None:
    upstream_chain(
        ("an", "anthropic", {"max_retries": 0}),
        ("oa", "openai", {"max_retries": 0, "timeout_s": 5.0}),
    )
    slow_503 = Faults.unavailable("anthropic", 503)
    for _ in range(3):
        # The first candidate answers 503 after 1 s of the 2 s deadline; the second,
        # healthy (it answers in 1.8 s, well inside its own 5 s), gets what is left.
        fake_upstream.script(
            "anthropic", Fault(status=slow_503.status, body=slow_503.body, delay=1.0)
        )
        fake_upstream.script("openai", Faults.slow(1.8))
        routed = route(REQUEST, sleeper=Sleeps())
        second = routed.metadata.attempts[1]
        assert (second.provider, second.outcome) == ("oa", "error")
        assert second.error_category == "budget_exhausted"
        assert routed.result.provider == "mock"

    oa = breaker.store.load("oa", "openai-model")
    assert oa.phase(clock()) == CLOSED and oa.failures == 0
    assert oa.last_error_category is None  # not even shown as the provider's last error
    an = breaker.store.load("an", "anthropic-model")
    assert an.phase(clock()) != CLOSED  # the slow 503s do count
    rows = Attempt.objects.filter(provider="oa").values_list("error_category", flat=True)
    assert list(rows) == ["budget_exhausted"] * 3
