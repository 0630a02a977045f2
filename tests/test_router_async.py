"""The async driver itself: ``aroute`` / ``aroute_stream`` on an event loop, over the
fake upstream (HttpProvider through BaseProvider's worker-thread defaults).

Unlike the dual-driver runs of the other router modules (tests/drivers.py), the
database calls here take the real path: off the loop, in worker threads, on committed
rows (``transactional_db``), and with Django's async-safety check on — an ORM call
on the event loop would raise SynchronousOnlyOperation.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest
from django.core.cache import caches
from django.test import override_settings

from llm_routing.models import Attempt, Chain, ChainEntry, Provider, RoutingDecision
from llm_routing.providers import registry
from llm_routing.resilience import breaker
from llm_routing.router import aroute, aroute_stream, route_stream
from llm_routing.types import (
    AuditRequest,
    ErrorInfo,
    ProviderConfig,
    ProviderResult,
    RouterStreamEvent,
    StreamChunk,
    StreamDelta,
    StreamEnd,
    StreamEvent,
    StreamResult,
)
from tests.breaker_support import BrokenCache, FakeClock
from tests.conftest import ScriptedProvider, upstream_fields
from tests.fakes.upstream import FakeUpstream, Faults

pytestmark = pytest.mark.django_db(transaction=True)

REQUEST = AuditRequest(task="summarize", input_text="Some input text.")
STREAM = AuditRequest(task="summarize", input_text="Some input text.", stream=True)


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_PROVIDER_KEY", "sk-async-test-123456")
    monkeypatch.delenv("DJANGO_ALLOW_ASYNC_UNSAFE", raising=False)


class ASleeps(list[float]):
    """An injectable async sleeper that records each wait and never sleeps."""

    async def __call__(self, seconds: float) -> None:
        self.append(seconds)


def chain_of(*rows: Provider) -> None:
    chain = Chain.objects.create(name="main", is_default=True)
    for position, row in enumerate(rows):
        ChainEntry.objects.create(chain=chain, provider=row, position=position)


def upstream_row(name: str, kind: str, fake: FakeUpstream, **fields: Any) -> Provider:
    return Provider.objects.create(**{**upstream_fields(name, kind, fake), **fields})


async def collect(events: Any) -> list[RouterStreamEvent]:
    return [event async for event in events]


# --- non-stream ---------------------------------------------------------------------------


def test_aroute_fails_over_and_records_off_the_loop(fake_upstream: FakeUpstream) -> None:
    chain_of(
        upstream_row("oc", "openai_compatible", fake_upstream),
        upstream_row("an", "anthropic", fake_upstream),
    )
    fake_upstream.script("openai", *[Faults.unavailable("openai", 503)] * 3)
    sleeps = ASleeps()
    routed = asyncio.run(aroute(REQUEST, sleeper=sleeps))

    assert routed.result.ok and routed.result.provider == "an"
    assert [(a.provider, a.outcome, a.retries) for a in routed.metadata.attempts] == [
        ("oc", "error", 2),
        ("an", "ok", 0),
    ]
    assert len(sleeps) == 2  # the async sleeper got both backoffs
    assert [r.vendor for r in fake_upstream.requests] == ["openai"] * 3 + ["anthropic"]
    decision = RoutingDecision.objects.get(request_id=routed.request_id)
    assert decision.selected_provider == "an"
    assert list(decision.attempts.order_by("index").values_list("provider", "outcome")) == [
        ("oc", "error"),
        ("an", "ok"),
    ]


def test_aroute_skips_an_open_circuit_without_a_request(
    fake_upstream: FakeUpstream, clock: FakeClock
) -> None:
    chain_of(
        upstream_row("oc", "openai_compatible", fake_upstream),
        upstream_row("an", "anthropic", fake_upstream),
    )
    breaker.store.force_open("oc", "openai_compatible-model", 60)
    routed = asyncio.run(aroute(REQUEST, persist=False))

    assert routed.result.provider == "an"
    assert [(a.provider, a.outcome, a.reason) for a in routed.metadata.attempts] == [
        ("oc", "skipped", "circuit_open"),
        ("an", "ok", None),
    ]
    assert [r.vendor for r in fake_upstream.requests] == ["anthropic"]


def test_aroute_half_open_probe_is_claimed_per_task(
    fake_upstream: FakeUpstream, clock: FakeClock
) -> None:
    """Two concurrent requests on one loop, a half-open circuit: exactly one task gets
    the probe (the claim lives in its own context), the other skips circuit_open."""
    chain_of(
        upstream_row("oc", "openai_compatible", fake_upstream, max_retries=0),
        upstream_row("an", "anthropic", fake_upstream),
    )
    breaker.store.force_open("oc", "openai_compatible-model", 1)
    clock.advance(2)  # half-open now
    fake_upstream.script("openai", Faults.slow(0.3))

    async def both() -> list[Any]:
        return list(await asyncio.gather(aroute(REQUEST), aroute(REQUEST)))

    first, second = asyncio.run(both())
    served = sorted(r.result.provider for r in (first, second))
    assert served == ["an", "oc"]
    assert len(fake_upstream.requests_for("openai")) == 1
    assert breaker.store.load("oc", "openai_compatible-model").phase(clock()) == breaker.CLOSED


def test_aroute_spends_one_budget_across_candidates(fake_upstream: FakeUpstream) -> None:
    chain_of(
        upstream_row("oc", "openai_compatible", fake_upstream, max_retries=5),
        upstream_row("an", "anthropic", fake_upstream),
    )
    fake_upstream.script("openai", *[Faults.unavailable("openai", 503)] * 3)
    with override_settings(LLM_ROUTING={"MAX_ATTEMPTS": 2, "DEFAULT_CHAIN": []}):
        routed = asyncio.run(aroute(REQUEST, sleeper=ASleeps(), persist=False))

    attempts = [(a.provider, a.outcome, a.reason) for a in routed.metadata.attempts]
    assert attempts[:2] == [("oc", "error", "unavailable"), ("an", "skipped", "budget_exhausted")]
    assert routed.result.provider == "mock"  # the backstop answers a spent budget
    assert len(fake_upstream.requests) == 2


def test_a_deadline_cut_aroute_is_budget_exhausted(fake_upstream: FakeUpstream) -> None:
    chain_of(upstream_row("oc", "openai_compatible", fake_upstream, max_retries=0))
    fake_upstream.script("openai", Faults.slow(3.0))
    with override_settings(LLM_ROUTING={"REQUEST_DEADLINE_S": 0.5, "DEFAULT_CHAIN": []}):
        routed = asyncio.run(aroute(REQUEST, persist=False))

    first = routed.metadata.attempts[0]
    assert (first.provider, first.error_category) == ("oc", "budget_exhausted")
    assert routed.result.provider == "mock"


def test_a_cancelled_aroute_still_records_its_decision(fake_upstream: FakeUpstream) -> None:
    chain_of(upstream_row("oc", "openai_compatible", fake_upstream, max_retries=0))
    fake_upstream.script("openai", Faults.slow(1.0))
    request_id = str(uuid.uuid4())

    async def cancel_it() -> None:
        task = asyncio.create_task(aroute(REQUEST, request_id=request_id))
        while not fake_upstream.requests:  # the call is in flight
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel_it())
    decision = RoutingDecision.objects.get(request_id=request_id)
    assert decision.status == "error"
    row = Attempt.objects.get(decision=decision)
    assert (row.provider, row.error_category) == ("oc", "client_disconnected")
    circuit = breaker.store.load("oc", "openai_compatible-model")
    assert circuit.failures == 0 and circuit.last_error_category is None


def test_a_cancelled_hedged_aroute_closes_both_calls_and_records_its_decision(
    fake_upstream: FakeUpstream,
) -> None:
    # Cancelled while both sides of a hedge are in flight: both upstream connections
    # close, the decision is recorded, and neither circuit counts a failure.
    chain_of(
        upstream_row("oa", "openai", fake_upstream, max_retries=0),
        upstream_row("an", "anthropic", fake_upstream, max_retries=0),
    )
    Chain.objects.filter(name="main").update(hedge_after_ms="100")
    fake_upstream.script("openai", Faults.slow(3.0, watch=True))
    fake_upstream.script("anthropic", Faults.slow(3.0, watch=True))
    request_id = str(uuid.uuid4())

    async def cancel_it() -> None:
        task = asyncio.create_task(aroute(REQUEST, request_id=request_id))
        while len(fake_upstream.requests) < 2:  # the primary and its hedge in flight
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel_it())
    deadline = time.monotonic() + 10.0
    while fake_upstream.disconnects < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert fake_upstream.disconnects == 2
    decision = RoutingDecision.objects.get(request_id=request_id)
    assert decision.status == "error"
    rows = Attempt.objects.filter(decision=decision).order_by("index")
    assert [(r.provider, r.error_category) for r in rows] == [("oa", "client_disconnected")]
    # The primary's row: in its step, not served, no retry, no answer time to report.
    (row,) = rows
    assert (row.outcome, row.step, row.served, row.retries, row.latency_ms) == (
        "error", 0, False, 0, 0.0,
    )  # fmt: skip
    for name, kind in (("oa", "openai"), ("an", "anthropic")):
        circuit = breaker.store.load(name, f"{kind}-model")
        assert circuit.failures == 0 and circuit.last_error_category is None


# --- streams ------------------------------------------------------------------------------


def test_aroute_stream_sends_chunks_then_one_result(fake_upstream: FakeUpstream) -> None:
    chain_of(upstream_row("oa", "openai", fake_upstream, supports_streaming=True))
    fake_upstream.script("openai", Faults.stream(text="one two three"))
    events = asyncio.run(collect(aroute_stream(STREAM)))

    chunks, last = events[:-1], events[-1]
    assert chunks and all(isinstance(e, StreamChunk) for e in chunks)
    assert isinstance(last, StreamResult) and last.routed.result.ok
    text = "".join(e.text for e in chunks if isinstance(e, StreamChunk))
    assert text == last.routed.result.output == "one two three"
    decision = RoutingDecision.objects.get(request_id=last.routed.request_id)
    assert decision.status == "ok"


def test_aroute_stream_fails_over_before_the_first_chunk(fake_upstream: FakeUpstream) -> None:
    chain_of(
        upstream_row("oa", "openai", fake_upstream, supports_streaming=True, max_retries=0),
        upstream_row("an", "anthropic", fake_upstream, supports_streaming=True),
    )
    fake_upstream.script("openai", Faults.unavailable("openai", 503))
    events = asyncio.run(collect(aroute_stream(STREAM)))

    last = events[-1]
    assert isinstance(last, StreamResult) and last.routed.result.provider == "an"
    assert {e.provider for e in events[:-1] if isinstance(e, StreamChunk)} == {"an"}


class ClosingProvider(ScriptedProvider):
    """A custom kind whose stream notes when it is closed (its upstream ended) and can
    stall between events (a float step: wait that long, or until released)."""

    kind: ClassVar[str] = "scripted_closing"
    script: ClassVar[list[str | float]] = []
    closed: ClassVar[list[str]] = []
    threads: ClassVar[set[int]] = set()
    release: ClassVar[threading.Event] = threading.Event()

    def stream(
        self, request: AuditRequest, *, api_key: str | None, timeout: float
    ) -> Iterator[StreamEvent]:
        cls = type(self)
        closed = cls.closed  # this test's list, even if the stream is closed later
        try:
            for step in cls.script:
                cls.threads.add(threading.get_ident())
                if isinstance(step, float):
                    cls.release.wait(step)
                elif step == "END":
                    yield StreamEnd(finish_reason="stop")
                    return
                else:
                    yield StreamDelta(step)
        finally:
            closed.append(self.config.name)


@pytest.fixture
def closing(scripted: type[ScriptedProvider]) -> Iterator[type[ClosingProvider]]:
    registry.register("scripted_closing", ClosingProvider)
    ClosingProvider.script = ["one ", "two ", "three ", "END"]
    ClosingProvider.closed = []
    ClosingProvider.threads = set()
    ClosingProvider.release = threading.Event()
    row = Provider.objects.create(
        name="cl",
        kind="scripted_closing",
        model="cl-model",
        api_key_env="TEST_PROVIDER_KEY",
        supports_streaming=True,
    )
    chain_of(row)
    yield ClosingProvider
    ClosingProvider.release.set()


def _disconnect_recorded(request_id: str) -> None:
    row = Attempt.objects.get(decision__request_id=request_id)
    assert (row.provider, row.error_category) == ("cl", "client_disconnected")
    decision = RoutingDecision.objects.get(request_id=request_id)
    assert decision.status == "error"
    circuit = breaker.store.load("cl", "cl-model")
    assert circuit.failures == 0 and circuit.last_error_category is None


def test_aclose_mid_stream_records_the_disconnect_and_closes_upstream(
    closing: type[ClosingProvider],
) -> None:
    request_id = str(uuid.uuid4())

    async def first_then_leave() -> None:
        events = aroute_stream(STREAM, request_id=request_id)
        first = await anext(events)
        assert isinstance(first, StreamChunk) and first.text == "one "
        assert closing.closed == []
        await events.aclose()  # type: ignore[attr-defined]
        assert closing.closed == ["cl"]  # the upstream stream was closed, at once

    asyncio.run(first_then_leave())
    assert threading.get_ident() not in closing.threads  # pulled in worker threads
    _disconnect_recorded(request_id)


def test_a_stream_cancelled_while_waiting_upstream_records_the_disconnect(
    closing: type[ClosingProvider],
) -> None:
    """The serving task is cancelled while it awaits the next upstream event (what an
    ASGI server does when the client goes away)."""
    closing.script = ["one ", 30.0, "two ", "END"]
    request_id = str(uuid.uuid4())

    async def consume(first: asyncio.Event) -> None:
        async for _event in aroute_stream(STREAM, request_id=request_id):
            first.set()

    async def cancel_it() -> None:
        first = asyncio.Event()
        task = asyncio.create_task(consume(first))
        await first.wait()
        await asyncio.sleep(0.05)  # now awaiting the stalled upstream
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        closing.release.set()  # the worker thread still in next() may finish now

    asyncio.run(cancel_it())
    # The worker thread's next() could not be interrupted; the stream is closed by a
    # closer thread once it returns (the loop is never held waiting for it).
    waited = 0.0
    while not closing.closed and waited < 10.0:
        time.sleep(0.02)
        waited += 0.02
    assert closing.closed == ["cl"]
    _disconnect_recorded(request_id)


def test_a_stream_dropped_by_its_consumer_is_closed_by_the_loop(
    closing: type[ClosingProvider],
) -> None:
    """A consumer that stops iterating without aclose(): the loop's async-generator
    finalizer closes the stream, which records the disconnect."""
    request_id = str(uuid.uuid4())

    async def leave_early() -> None:
        async for _event in aroute_stream(STREAM, request_id=request_id):
            break

    asyncio.run(leave_early())
    assert closing.closed == ["cl"]
    _disconnect_recorded(request_id)


def test_a_disconnect_frees_the_half_open_probe_slot(
    closing: type[ClosingProvider], clock: FakeClock
) -> None:
    config = ProviderConfig(name="cl", kind="scripted_closing", model="cl-model")
    breaker.store.force_open("cl", "cl-model", 1)
    clock.advance(2)

    async def probe_then_leave() -> None:
        events = aroute_stream(STREAM)
        await anext(events)
        assert breaker.is_probe(config)  # this task holds the slot
        await events.aclose()  # type: ignore[attr-defined]
        assert not breaker.is_probe(config)

    asyncio.run(probe_then_leave())
    key = breaker._key("cl", "cl-model") + ":probe"
    assert caches["default"].get(key) is None  # free for the next caller
    assert asyncio.run(breaker.aallow(config))  # and the next caller gets it


def test_the_probe_claim_does_not_leak_between_contexts(clock: FakeClock) -> None:
    config = ProviderConfig(name="p", kind="openai", model="m")
    breaker.store.force_open("p", "m", 1)
    clock.advance(2)

    async def claim() -> bool:
        return await breaker.aallow(config) and breaker.is_probe(config)

    assert contextvars.copy_context().run(asyncio.run, claim())
    assert not breaker.is_probe(config)  # another context never sees the claim


# --- the breaker's async cache path -------------------------------------------------------


class CountingCache(BrokenCache):
    """A non-LocMem backend (so the store takes Django's async methods) that counts
    the calls reaching it."""

    calls: ClassVar[list[str]] = []

    def get(self, key: str, default: Any = None, version: int | None = None) -> Any:
        CountingCache.calls.append("get")
        return super().get(key, default, version)

    def add(self, key: str, value: Any, timeout: Any = None, version: int | None = None) -> bool:
        CountingCache.calls.append("add")
        return super().add(key, value, timeout, version)

    def set(self, key: str, value: Any, timeout: Any = None, version: int | None = None) -> None:
        CountingCache.calls.append("set")
        super().set(key, value, timeout, version)


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[CountingCache]]:
    caches_setting = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "circuits": {"BACKEND": "tests.test_router_async.CountingCache"},
    }
    BrokenCache.broken = False
    CountingCache._data = {}
    CountingCache.calls = []
    monkeypatch.setattr(breaker, "store", breaker.CircuitStore(clock=FakeClock()))
    with override_settings(CACHES=caches_setting, LLM_ROUTING={"CACHE_ALIAS": "circuits"}):
        yield CountingCache
    BrokenCache.broken = True


CONFIG = ProviderConfig(name="p", kind="openai", model="m", timeout_s=5.0)
FAILED = ProviderResult(
    provider="p",
    model="m",
    mode="error",
    status="error",
    error=ErrorInfo(category="unavailable", message="503", http_status=503, transient=True),
    upstream_requests=1,
)


def test_a_closed_circuit_costs_one_async_cache_read(counted: type[CountingCache]) -> None:
    assert asyncio.run(breaker.aallow(CONFIG))
    assert counted.calls == ["get"]


def test_a_healthy_call_costs_one_cache_read(counted: type[CountingCache]) -> None:
    """allow reads the circuit; the success after it, on a circuit that was clean with a
    success written moments ago, needs neither a second read nor a write."""
    ok = ProviderResult(provider="p", model="m", mode="live", status="ok", upstream_requests=1)

    async def call() -> None:
        assert await breaker.aallow(CONFIG)
        await breaker.aobserve(CONFIG, ok)

    asyncio.run(call())  # the first success is written
    assert counted.calls == ["get", "get", "set"]
    counted.calls.clear()
    asyncio.run(call())
    assert counted.calls == ["get"]
    breaker.store.clock.advance(breaker.SUCCESS_WRITE_INTERVAL_S)  # type: ignore[attr-defined]
    counted.calls.clear()
    asyncio.run(call())  # then at most one write per interval
    assert counted.calls == ["get", "get", "set"]


def test_async_failures_open_the_circuit_then_one_probe(
    counted: type[CountingCache],
) -> None:
    policy = breaker.Policy.from_settings()

    async def scenario() -> tuple[bool, bool]:
        for _ in range(policy.threshold):
            await breaker.aobserve(CONFIG, FAILED)
        return await breaker.aallow(CONFIG), breaker.is_probe(CONFIG)

    assert asyncio.run(scenario()) == (False, False)
    circuit = breaker.store.load("p", "m")
    assert circuit.state == breaker.OPEN and circuit.failures == policy.threshold
    assert "set" in counted.calls  # written through the async path to the backend


def test_the_async_cache_path_falls_back_to_process_state(
    counted: type[CountingCache], caplog: pytest.LogCaptureFixture
) -> None:
    BrokenCache.broken = True

    async def scenario() -> bool:
        for _ in range(breaker.Policy.from_settings().threshold):
            await breaker.aobserve(CONFIG, FAILED)
        return await breaker.aallow(CONFIG)

    assert asyncio.run(scenario()) is False  # opened in process-local state
    assert breaker.store.degraded
    assert "s3cret" not in caplog.text  # the cache's location never logged


def test_closing_the_sync_stream_closes_upstream_too(closing: type[ClosingProvider]) -> None:
    """The sync driver's disconnect, on the same core: GeneratorExit → ClientGone."""
    request_id = str(uuid.uuid4())
    events = route_stream(STREAM, request_id=request_id)
    first = next(events)
    assert isinstance(first, StreamChunk) and closing.closed == []
    events.close()  # type: ignore[attr-defined]
    assert closing.closed == ["cl"]
    _disconnect_recorded(request_id)
