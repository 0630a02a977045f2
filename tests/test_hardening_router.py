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

from llm_routing.errors import UnavailableError
from llm_routing.models import Attempt, Chain, ChainEntry, Provider, RoutingDecision
from llm_routing.resilience import breaker
from llm_routing.resilience.breaker import CLOSED, OPEN
from llm_routing.router import route, route_stream
from llm_routing.types import AuditRequest, RouterStreamEvent, StreamChunk, StreamFailure
from tests.breaker_support import FakeClock
from tests.conftest import ScriptedProvider, Sleeps, make_chain, make_provider, upstream_fields
from tests.fakes.upstream import FakeUpstream, Fault, Faults

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("driver")]

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


@override_settings(LLM_ROUTING={"REQUEST_DEADLINE_S": 1.2})
def test_a_stream_cut_by_the_request_deadline_is_not_charged_either(
    fake_upstream: FakeUpstream, clock: FakeClock
) -> None:
    broken_after_first_chunk(fake_upstream)
    words = " ".join(f"w{i}" for i in range(12))
    for _ in range(3):
        # Healthy but slow: a word every 0.25 s outlasts the 1.2 s deadline (its own
        # timeout_s is 5 s), so the stream is cut after the commit point.
        fake_upstream.script("openai", Faults.stream(text=words, interval=0.25))
        events = stream_once()
        assert isinstance(events[0], StreamChunk)
        failure = events[-1]
        assert isinstance(failure, StreamFailure) and failure.partial
        assert failure.error.category == "budget_exhausted"
    circuit = breaker.store.load("oa", "openai-model")
    assert circuit.phase(clock()) == CLOSED and circuit.failures == 0
    rows = Attempt.objects.values_list("error_category", "partial")
    assert list(rows) == [("budget_exhausted", True)] * 3


# --- (7) mid-stream accounting -------------------------------------------------------------

STREAM = AuditRequest(task="summarize", input_text="Some input text.", stream=True)


def stream_once(request: AuditRequest = STREAM) -> list[RouterStreamEvent]:
    return list(route_stream(request, sleeper=Sleeps()))


def broken_after_first_chunk(fake: FakeUpstream, *, model_override: str = "") -> Provider:
    row = Provider.objects.create(
        **{**upstream_fields("oa", "openai", fake), "max_retries": 0, "supports_streaming": True}
    )
    chain = Chain.objects.create(name="main", is_default=True)
    ChainEntry.objects.create(chain=chain, provider=row, position=0, model=model_override)
    return row


def test_a_provider_failing_after_the_first_chunk_opens_its_circuit(
    fake_upstream: FakeUpstream, clock: FakeClock
) -> None:
    broken_after_first_chunk(fake_upstream)
    for _ in range(3):
        fake_upstream.script("openai", Faults.stream(error_after=1, error_status=503))
        events = stream_once()
        assert isinstance(events[0], StreamChunk)
        assert isinstance(events[-1], StreamFailure) and events[-1].partial
    circuit = breaker.store.load("oa", "openai-model")
    assert circuit.phase(clock()) == OPEN  # the commit point no longer resets the count
    seen = len(fake_upstream.requests)
    skipped = stream_once()
    assert len(fake_upstream.requests) == seen  # the open circuit is skipped
    last = skipped[-1]
    assert last.routed.metadata.skipped_providers[0] == {  # type: ignore[union-attr]
        "provider": "oa",
        "reason": "circuit_open",
    }


def test_a_mid_stream_failure_is_charged_to_the_chain_entrys_model(
    fake_upstream: FakeUpstream, clock: FakeClock
) -> None:
    broken_after_first_chunk(fake_upstream, model_override="gpt-override")
    for _ in range(3):
        fake_upstream.script("openai", Faults.stream(error_after=1, error_status=503))
        assert isinstance(stream_once()[-1], StreamFailure)
    assert [r.json["model"] for r in fake_upstream.requests] == ["gpt-override"] * 3
    assert breaker.store.load("oa", "gpt-override").phase(clock()) == OPEN
    untouched = breaker.store.load("oa", "openai-model")
    assert untouched.failures == 0 and untouched.last_error_at is None


def test_a_custom_adapters_mid_stream_error_text_is_redacted(
    scripted: type[ScriptedProvider], key_env: str, caplog: pytest.LogCaptureFixture
) -> None:
    make_chain("main", [make_provider("a", supports_streaming=True)], is_default=True)
    scripted.streams["a"] = [["one ", UnavailableError(f"upstream said: bad key {key_env}")]]
    with caplog.at_level("DEBUG"):
        events = stream_once(AuditRequest(task="t", input_text="x", stream=True))
    failure = events[-1]
    assert isinstance(failure, StreamFailure) and failure.partial
    assert key_env not in failure.error.message and "[redacted]" in failure.error.message
    assert key_env not in repr(failure.routed.to_dict())
    assert key_env not in caplog.text
    decision = RoutingDecision.objects.get(request_id=failure.routed.request_id)
    stored = repr(list(RoutingDecision.objects.values())) + repr(list(decision.attempts.values()))
    assert key_env not in stored


def test_a_client_disconnect_is_not_the_providers_failure(
    fake_upstream: FakeUpstream, clock: FakeClock, admin_client: Any
) -> None:
    broken_after_first_chunk(fake_upstream)
    fake_upstream.script("openai", Faults.stream(interval=0.05))
    events = route_stream(STREAM, sleeper=Sleeps())
    assert isinstance(next(events), StreamChunk)
    events.close()  # the client went away
    row = Attempt.objects.get()
    assert row.error_category == "client_disconnected"
    circuit = breaker.store.load("oa", "openai-model")
    assert circuit.failures == 0 and circuit.last_error_category is None
    health = admin_client.get("/health/").json()  # the operator's view
    (oa,) = [p for p in health["providers"] if p["name"] == "oa"]
    assert oa["health"]["last_error_category"] is None


# --- (5) output ceilings ---------------------------------------------------------------------


def chat(api: Any, **body: Any) -> Any:
    body = {"model": "oc", "messages": [{"role": "user", "content": "hi"}], **body}
    return api.post("/v1/chat/completions", body, format="json")


@pytest.fixture
def oc(fake_upstream: FakeUpstream) -> Provider:
    fields = upstream_fields("oc", "openai_compatible", fake_upstream)
    row = Provider.objects.create(**{**fields, "params": {"max_tokens": 256}})
    make_chain("main", [row], is_default=True)  # a chain anyone may use
    return row


def test_the_rows_max_tokens_is_a_ceiling_for_the_client(
    api: Any, fake_upstream: FakeUpstream, oc: Provider
) -> None:
    resp = chat(api, max_tokens=1_000_000)
    assert resp.status_code == 200, resp.json()
    resp = chat(api, max_tokens=100)
    assert resp.status_code == 200
    resp = chat(api)
    assert resp.status_code == 200
    sent = [r.json["max_tokens"] for r in fake_upstream.requests_for("openai")]
    assert sent == [256, 100, 256]


@override_settings(LLM_ROUTING={"MAX_OUTPUT_TOKENS": 512})
def test_the_global_ceiling_clamps_clients_and_rows(
    api: Any, fake_upstream: FakeUpstream, oc: Provider
) -> None:
    oc.params = {"max_tokens": 4096}
    oc.save()
    assert chat(api, max_completion_tokens=100_000).status_code == 200
    assert chat(api).status_code == 200  # the row's own 4096 is above the ceiling too
    assert chat(api, max_tokens=300).status_code == 200
    sent = [r.json["max_tokens"] for r in fake_upstream.requests_for("openai")]
    assert sent == [512, 512, 300]


def test_a_streamed_anthropic_call_is_clamped_too(fake_upstream: FakeUpstream) -> None:
    fields = upstream_fields("an", "anthropic", fake_upstream)
    row = Provider.objects.create(
        **{**fields, "supports_streaming": True, "params": {"max_tokens": 300}}
    )
    make_chain("main", [row], is_default=True)
    request = AuditRequest(task="t", input_text="x", stream=True, max_tokens=50_000)
    events = list(route_stream(request, sleeper=Sleeps()))
    assert events[-1].routed.result.ok  # type: ignore[union-attr]
    assert [r.json["max_tokens"] for r in fake_upstream.requests_for("anthropic")] == [300]


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_max_tokens_above_the_hard_bound_is_a_400_naming_the_field(
    api: Any, fake_upstream: FakeUpstream, oc: Provider, field: str
) -> None:
    resp = chat(api, **{field: 1_000_000_000})
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert error["param"] == field and "1048576" in error["message"]
    assert fake_upstream.requests == []
