"""The async Python API — ``llm_routing.aaudit``, ``llm_routing.achat`` and the async
stream ``await achat(..., stream=True)`` — over real HTTP to the fake upstream, for every
vendor kind the app ships (issue 14's "Done when"): non-stream, stream, failover,
circuit open, the request deadline, and a consumer that leaves mid-stream (its
``aclose()`` must close the upstream request, as the fake server sees it).

Two providers of the same kind, ``first`` and ``second``, on one fake server: which of
them a request reached is read from the model it named (the body's ``model``, or
Gemini's URL path). The database calls take the real path (worker threads, committed
rows, Django's async-safety check on). The built-in ``mock`` kind has no upstream: it
is covered for non-stream and stream only (docs/testing.md, "Async coverage").
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from django.test import override_settings

import llm_routing
from llm_routing.models import Attempt, RoutingDecision
from llm_routing.resilience import breaker
from llm_routing.types import (
    RouterStreamEvent,
    RoutingResult,
    StreamChunk,
    StreamFailure,
    StreamResult,
)
from tests.breaker_support import FakeClock
from tests.conftest import VENDOR_OF_KIND, make_chain, make_provider
from tests.fakes.upstream import FakeUpstream, Faults

pytestmark = pytest.mark.django_db(transaction=True)

#: Every shipped kind that calls an upstream (llm_routing/providers/registry.py).
KINDS = ["openai", "openai_compatible", "anthropic", "gemini"]
MESSAGES = [{"role": "user", "content": "Say hello."}]
AUDIT = {"task": "summarize", "input_text": "Django is a web framework."}


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_PROVIDER_KEY", "sk-async-kinds-123456")
    monkeypatch.delenv("DJANGO_ALLOW_ASYNC_UNSAFE", raising=False)


def first_and_second(upstream_chain: Callable[..., list[Any]], kind: str, **first: Any) -> None:
    """The default chain: ``first`` then ``second``, both of ``kind``, streaming."""
    upstream_chain(
        (
            "first",
            kind,
            {"model": "first-model", "supports_streaming": True, "max_retries": 0, **first},
        ),
        ("second", kind, {"model": "second-model", "supports_streaming": True}),
    )


def models_asked(fake: FakeUpstream, kind: str) -> list[str]:
    """The model each request to ``kind``'s vendor named, in order."""
    vendor = VENDOR_OF_KIND[kind]
    if vendor == "gemini":  # /v1beta/models/{model}:generateContent
        return [r.path.rsplit("/", 1)[-1].split(":", 1)[0] for r in fake.requests_for(vendor)]
    return [r.json["model"] for r in fake.requests_for(vendor)]


def attempts(routed: RoutingResult) -> list[tuple[str, str, str | None]]:
    """(provider, outcome, error category — or the skip reason of a skipped one)."""
    return [
        (a.provider, a.outcome, a.reason if a.outcome == "skipped" else a.error_category)
        for a in routed.metadata.attempts
    ]


async def collect(events: AsyncIterator[RouterStreamEvent]) -> list[RouterStreamEvent]:
    return [event async for event in events]


async def achat_stream(**kwargs: Any) -> list[RouterStreamEvent]:
    events = await llm_routing.achat(MESSAGES, stream=True, **kwargs)
    return await collect(events)


def text_of(events: list[RouterStreamEvent]) -> str:
    return "".join(e.text for e in events if isinstance(e, StreamChunk))


def final(events: list[RouterStreamEvent]) -> RoutingResult:
    last = events[-1]
    assert isinstance(last, StreamResult | StreamFailure), last
    return last.routed


# --- non-stream ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_aaudit_and_achat_non_stream(
    fake_upstream: FakeUpstream, upstream_chain: Callable[..., list[Any]], kind: str
) -> None:
    upstream_chain(("first", kind, {"model": "first-model"}))

    async def both() -> tuple[RoutingResult, RoutingResult]:
        return await llm_routing.aaudit(**AUDIT), await llm_routing.achat(MESSAGES)

    audited, chatted = asyncio.run(both())
    for routed in (audited, chatted):
        assert isinstance(routed, RoutingResult)
        assert routed.result.ok and routed.result.provider == "first"
        assert routed.result.output.startswith("fake answer")
        assert routed.result.model.startswith("first-model")  # as the upstream named it
        assert routed.result.usage.input_tokens > 0
    assert models_asked(fake_upstream, kind) == ["first-model", "first-model"]
    ids = [audited.request_id, chatted.request_id]
    assert RoutingDecision.objects.filter(request_id__in=ids, status="ok").count() == 2


# --- stream -------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_achat_stream_is_one_chunk_per_upstream_event(
    fake_upstream: FakeUpstream, upstream_chain: Callable[..., list[Any]], kind: str
) -> None:
    upstream_chain(("first", kind, {"model": "first-model", "supports_streaming": True}))
    fake_upstream.script(VENDOR_OF_KIND[kind], Faults.stream(text="one two three four"))
    events = asyncio.run(achat_stream())

    chunks = [e for e in events if isinstance(e, StreamChunk)]
    assert [c.text for c in chunks] == ["one", " two", " three", " four"]
    assert {c.provider for c in chunks} == {"first"}
    routed = final(events)
    assert isinstance(events[-1], StreamResult) and routed.result.ok
    assert routed.result.output == "one two three four"
    assert models_asked(fake_upstream, kind) == ["first-model"]
    request = fake_upstream.requests_for(VENDOR_OF_KIND[kind])[0]
    assert request.json.get("stream") is True or "streamGenerateContent" in request.path
    assert RoutingDecision.objects.get(request_id=routed.request_id).status == "ok"


# --- failover -----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_failover_non_stream_and_stream(
    fake_upstream: FakeUpstream, upstream_chain: Callable[..., list[Any]], kind: str
) -> None:
    first_and_second(upstream_chain, kind)
    vendor = VENDOR_OF_KIND[kind]
    fake_upstream.script(vendor, Faults.unavailable(vendor, 503))
    routed = asyncio.run(llm_routing.aaudit(**AUDIT))
    assert routed.result.ok and routed.result.provider == "second"
    assert attempts(routed) == [("first", "error", "unavailable"), ("second", "ok", None)]
    assert routed.metadata.fallback_used and routed.metadata.fallback_reason == "unavailable"

    fake_upstream.script(vendor, Faults.unavailable(vendor, 503), Faults.stream(text="a b c"))
    events = asyncio.run(achat_stream())
    assert text_of(events) == "a b c"
    assert {e.provider for e in events if isinstance(e, StreamChunk)} == {"second"}
    streamed = final(events)
    assert attempts(streamed) == [("first", "error", "unavailable"), ("second", "ok", None)]
    assert models_asked(fake_upstream, kind) == ["first-model", "second-model"] * 2
    rows = Attempt.objects.filter(decision__request_id=streamed.request_id).order_by("index")
    assert [(r.provider, r.outcome) for r in rows] == [("first", "error"), ("second", "ok")]


# --- circuit open -------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_an_open_circuit_is_skipped_without_a_request(
    fake_upstream: FakeUpstream,
    upstream_chain: Callable[..., list[Any]],
    clock: FakeClock,
    kind: str,
) -> None:
    first_and_second(upstream_chain, kind)
    breaker.store.force_open("first", "first-model", 60)

    async def both() -> tuple[RoutingResult, list[RouterStreamEvent]]:
        return await llm_routing.aaudit(**AUDIT), await achat_stream()

    routed, events = asyncio.run(both())
    skipped = [("first", "skipped", "circuit_open"), ("second", "ok", None)]
    assert attempts(routed) == skipped and routed.result.provider == "second"
    assert attempts(final(events)) == skipped and text_of(events)
    assert {e.provider for e in events if isinstance(e, StreamChunk)} == {"second"}
    assert models_asked(fake_upstream, kind) == ["second-model", "second-model"]


# --- the request deadline -----------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_the_request_deadline_cuts_a_hung_upstream(
    fake_upstream: FakeUpstream, upstream_chain: Callable[..., list[Any]], kind: str
) -> None:
    """A hung upstream (no answer for 60 s) under a 1 s request deadline: the call is
    cut by the deadline (``budget_exhausted``, not the provider's own 5 s timeout), the
    second candidate is never tried, the mock backstop answers."""
    first_and_second(upstream_chain, kind)
    vendor = VENDOR_OF_KIND[kind]
    fake_upstream.script(vendor, Faults.hang(), Faults.stream(first_chunk_delay=60.0))
    with override_settings(LLM_ROUTING={"REQUEST_DEADLINE_S": 1.0, "DEFAULT_CHAIN": []}):
        routed = asyncio.run(llm_routing.aaudit(**AUDIT))
        events = asyncio.run(achat_stream())

    assert attempts(routed)[0] == ("first", "error", "budget_exhausted")
    assert routed.result.provider == "mock"  # the backstop answers a spent deadline
    streamed = final(events)
    assert attempts(streamed)[0] == ("first", "error", "budget_exhausted")
    assert models_asked(fake_upstream, kind) == ["first-model", "first-model"]
    for request_id in (routed.request_id, streamed.request_id):
        row = Attempt.objects.get(decision__request_id=request_id, index=0)
        assert row.error_category == "budget_exhausted"
    # The deadline is the request's, not the provider's: its circuit is not charged.
    assert breaker.store.load("first", "first-model").failures == 0


# --- the consumer leaves mid-stream -------------------------------------------------------


def _wait_for(predicate: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.mark.parametrize("kind", KINDS)
def test_aclose_mid_stream_closes_the_upstream_request(
    fake_upstream: FakeUpstream, upstream_chain: Callable[..., list[Any]], kind: str
) -> None:
    """Twelve words, 0.2 s apart (2.4 s of stream): the consumer takes two chunks and
    closes the iterator. The fake server sees its connection closed (a write fails)
    while it still had words to send; the decision records ``client_disconnected``."""
    upstream_chain(("first", kind, {"model": "first-model", "supports_streaming": True}))
    words = "one two three four five six seven eight nine ten eleven twelve"
    fake_upstream.script(VENDOR_OF_KIND[kind], Faults.stream(text=words, interval=0.2))

    async def two_then_leave() -> list[str]:
        events = await llm_routing.achat(MESSAGES, stream=True, metadata={"case": "leave"})
        received: list[str] = []
        async for event in events:
            assert isinstance(event, StreamChunk)
            received.append(event.text)
            if len(received) == 2:
                break
        await events.aclose()  # type: ignore[attr-defined]
        return received

    received = asyncio.run(two_then_leave())
    assert received == ["one", " two"]
    # Closed, not drained: the server's next write finds the connection gone (well
    # before its 2.4 s of words would have ended on their own).
    assert _wait_for(lambda: fake_upstream.disconnects == 1, 10.0), "upstream still open"
    row = Attempt.objects.get(decision__status="error")
    assert (row.provider, row.error_category, row.partial) == ("first", "client_disconnected", True)
    assert breaker.store.load("first", "first-model").failures == 0  # not the provider's fault


# --- the built-in mock kind (no upstream) -------------------------------------------------


def test_the_mock_kind_non_stream_and_stream() -> None:
    make_chain("main", [make_provider("m", kind="mock", model="")], is_default=True)

    async def both() -> tuple[RoutingResult, RoutingResult, list[RouterStreamEvent]]:
        return (
            await llm_routing.aaudit(**AUDIT),
            await llm_routing.achat(MESSAGES),
            await achat_stream(),
        )

    audited, chatted, events = asyncio.run(both())
    assert audited.result.provider == "m" and audited.result.mode == "mock"
    assert audited.result.output.startswith("[mock] summarize:")
    assert chatted.result.provider == "m" and chatted.result.output.startswith("[mock] chat:")
    assert text_of(events) == final(events).result.output == chatted.result.output
    assert len([e for e in events if isinstance(e, StreamChunk)]) > 1  # a word at a time
    assert RoutingDecision.objects.count() == 3
