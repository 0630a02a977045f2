"""The breaker with the real vendor adapters against the shared fake upstream: their
classification (Retry-After parsing, 4xx/5xx taxonomy) drives the circuit."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from llm_routing.resilience import breaker
from llm_routing.resilience.breaker import CLOSED, OPEN, CircuitStore
from llm_routing.router import route
from llm_routing.types import AuditRequest
from tests.breaker_support import FakeClock
from tests.conftest import Sleeps
from tests.fakes.upstream import FakeUpstream, Faults

pytestmark = pytest.mark.django_db

REQUEST = AuditRequest(task="summarize", input_text="Some input text.")


@pytest.fixture(autouse=True)
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    monkeypatch.setenv("TEST_PROVIDER_KEY", "sk-breaker-test-123456")
    fake = FakeClock()
    monkeypatch.setattr(breaker, "store", CircuitStore(clock=fake))
    return fake


def test_vendor_503s_open_the_circuit_and_the_fallback_serves(
    fake_upstream: FakeUpstream, upstream_chain: Callable[..., list[Any]]
) -> None:
    upstream_chain(("oc", "openai_compatible", {}), ("an", "anthropic", {}))
    fake_upstream.script("openai", *[Faults.unavailable("openai", 503)] * 9)
    for _ in range(3):
        assert route(REQUEST, sleeper=Sleeps()).result.provider == "an"
    assert len(fake_upstream.requests_for("openai")) == 9
    routed = route(REQUEST, sleeper=Sleeps())
    assert routed.metadata.skipped_providers == [{"provider": "oc", "reason": "circuit_open"}]
    assert routed.result.provider == "an"
    assert len(fake_upstream.requests_for("openai")) == 9
    circuit = breaker.store.load("oc", "openai_compatible-model")
    assert circuit.last_http_status == 503 and circuit.last_error_category == "unavailable"


def test_a_vendor_retry_after_over_the_cap_opens_the_circuit_for_that_long(
    fake_upstream: FakeUpstream, upstream_chain: Callable[..., list[Any]], clock: FakeClock
) -> None:
    upstream_chain(("an", "anthropic", {}), ("ge", "gemini", {}))
    fake_upstream.script("anthropic", Faults.rate_limit("anthropic", retry_after="60"))
    assert route(REQUEST, sleeper=Sleeps()).result.provider == "ge"
    circuit = breaker.store.load("an", "anthropic-model")
    assert circuit.phase(clock()) == OPEN
    assert circuit.open_until == clock() + 60.0
    assert circuit.last_http_status == 429


@pytest.mark.parametrize(
    "fault",
    [Faults.auth("openai"), Faults.invalid_request("openai"), Faults.context_length("openai")],
    ids=["auth", "invalid_request", "context_length"],
)
def test_vendor_client_errors_never_open_the_circuit(
    fake_upstream: FakeUpstream, upstream_chain: Callable[..., list[Any]], fault: Any
) -> None:
    upstream_chain(("oc", "openai_compatible", {}), ("an", "anthropic", {}))
    fake_upstream.script("openai", *[fault] * 6)
    for _ in range(6):
        route(REQUEST, sleeper=Sleeps())
    assert len(fake_upstream.requests_for("openai")) == 6
    assert breaker.store.load("oc", "openai_compatible-model").state == CLOSED
