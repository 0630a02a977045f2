"""The async adapter interface (issue 14): ``acomplete`` / ``astream`` / ``aclose``.

Real HTTP over ``httpx.AsyncClient`` to the fake upstreams on 127.0.0.1, each test
compared with the sync path where both exist (``mode`` is ``sync`` or ``async``): the
same results, events, error classes and messages, deadlines, size limits; closing or
cancelling a stream closes the upstream connection; one AsyncClient per adapter and
event loop, closed by ``aclose`` / the registry; BaseProvider's defaults for adapters
written against the sync interface.

Every test runs once per async transport (``async_transport``: httpx over aiohttp, and
httpx over httpcore), unchanged; the shard tests are httpcore's own.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine, Iterator
from contextlib import aclosing
from dataclasses import replace
from typing import Any, ClassVar, TypeVar, cast

import httpx
import pytest
from django.test import override_settings

from llm_routing import errors
from llm_routing.errors import ProviderError, ProviderTimeoutError, ResponseError
from llm_routing.providers import registry
from llm_routing.providers.base import BaseProvider, HttpProvider, pool_limits
from llm_routing.providers.mock import MockProvider
from llm_routing.types import (
    AuditRequest,
    ProviderConfig,
    ProviderResult,
    StreamDelta,
    StreamEnd,
    StreamEvent,
    Usage,
)
from tests.conftest import VENDOR_OF_KIND, upstream_fields
from tests.fakes.upstream import FakeUpstream, Faults

pytestmark = pytest.mark.usefixtures("async_transport")
HTTPCORE_ONLY = pytest.mark.parametrize("async_transport", ["httpx"], indirect=True)

KINDS = ["openai", "openai_compatible", "anthropic", "gemini"]
MODES = ["sync", "async"]
KEY = "sk-async-KEY-0a1b2c3d4e5f"
TEXT = "The quick brown fox jumps over"
PIECES = ["The", " quick", " brown", " fox", " jumps", " over"]
REQUEST = AuditRequest(task="t", input_text="Say it.", instructions="Be brief.")
STREAM_REQUEST = replace(REQUEST, stream=True)
LONG_TEXT = " ".join(f"w{n}" for n in range(80))

MakeAdapter = Callable[..., HttpProvider]
T = TypeVar("T")


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def complete(
    mode: str, adapter: HttpProvider, request: AuditRequest = REQUEST, timeout: float = 5.0
) -> ProviderResult:
    if mode == "sync":
        return adapter.complete(request, api_key=KEY, timeout=timeout)

    async def go() -> ProviderResult:
        try:
            return await adapter.acomplete(request, api_key=KEY, timeout=timeout)
        finally:
            await adapter.aclose()

    return run_async(go())


def stream(
    mode: str,
    adapter: BaseProvider,
    request: AuditRequest = STREAM_REQUEST,
    timeout: float = 5.0,
    *,
    pause: float = 0.0,
) -> tuple[list[StreamEvent], ProviderError | None]:
    """(events, error) of one stream; ``pause``: seconds the consumer spends per event."""
    events: list[StreamEvent] = []
    if mode == "sync":
        try:
            for event in adapter.stream(request, api_key=KEY, timeout=timeout):
                events.append(event)
                time.sleep(pause)
        except ProviderError as exc:
            return events, exc
        return events, None

    async def go() -> ProviderError | None:
        try:
            events_of = cast(
                AsyncGenerator[StreamEvent, None],
                adapter.astream(request, api_key=KEY, timeout=timeout),
            )
            async with aclosing(events_of) as it:
                async for event in it:
                    events.append(event)
                    await asyncio.sleep(pause)
        except ProviderError as exc:
            return exc
        finally:
            await adapter.aclose()
        return None

    return events, run_async(go())


def texts(events: list[StreamEvent]) -> list[str]:
    return [e.text for e in events if isinstance(e, StreamDelta)]


def wait_for(predicate: Callable[[], bool], seconds: float = 5.0) -> bool:
    """Poll ``predicate`` until true or ``seconds`` passed (not a timing assertion)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


@pytest.fixture
def fast_idle() -> Iterator[None]:
    with override_settings(LLM_ROUTING={"STREAM_IDLE_TIMEOUT_S": 0.3}):
        yield


# --- same answers as the sync path ------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_acomplete_returns_what_complete_returns(
    kind: str, make_adapter: MakeAdapter, fake_upstream: FakeUpstream
) -> None:
    vendor = VENDOR_OF_KIND[kind]
    adapter = make_adapter(kind)
    sync = complete("sync", adapter)
    asynchronous = complete("async", adapter)
    assert sync.ok and sync.output
    assert replace(asynchronous, latency_ms=0.0) == replace(sync, latency_ms=0.0)
    first, second = fake_upstream.requests_for(vendor)
    assert (second.path, second.query, second.json) == (first.path, first.query, first.json)
    assert second.headers["user-agent"] == first.headers["user-agent"]
    assert second.headers["user-agent"].startswith("django-llm-routing/")
    for name in ("authorization", "x-api-key", "x-goog-api-key", "anthropic-version"):
        assert second.headers.get(name) == first.headers.get(name)


@pytest.mark.parametrize("kind", KINDS)
def test_astream_yields_what_stream_yields(
    kind: str, make_adapter: MakeAdapter, fake_upstream: FakeUpstream
) -> None:
    vendor = VENDOR_OF_KIND[kind]
    fake_upstream.script(vendor, Faults.stream(text=TEXT), Faults.stream(text=TEXT))
    adapter = make_adapter(kind)
    sync_events, sync_error = stream("sync", adapter)
    async_events, async_error = stream("async", adapter)
    assert sync_error is None and async_error is None
    assert texts(async_events) == PIECES
    assert isinstance(async_events[-1], StreamEnd) and async_events[-1].finish_reason
    assert async_events == sync_events
    first, second = fake_upstream.requests_for(vendor)
    assert second.headers["accept"] == "text/event-stream"
    assert (second.path, second.query, second.json) == (first.path, first.query, first.json)


@pytest.mark.parametrize("kind", ["openai", "anthropic", "gemini"])
def test_astream_tool_call_fragments_match_stream(
    kind: str, make_adapter: MakeAdapter, fake_upstream: FakeUpstream
) -> None:
    from llm_routing.types import Tool

    tool = Tool(
        name="lookup",
        description="Find a thing.",
        parameters={"type": "object", "properties": {"q": {"type": "string"}}},
    )
    request = replace(STREAM_REQUEST, tools=(tool,))
    adapter = make_adapter(kind)
    sync_events, sync_error = stream("sync", adapter, request)
    async_events, async_error = stream("async", adapter, request)
    assert sync_error is None and async_error is None
    end = async_events[-1]
    assert isinstance(end, StreamEnd) and [c.name for c in end.tool_calls] == ["lookup"]
    assert async_events == sync_events


# --- errors -------------------------------------------------------------------------------
FAULTS: dict[str, tuple[Callable[[str], Any], type[ProviderError], int | None]] = {
    "429 retry-after": (
        lambda v: Faults.rate_limit(v, retry_after="2"),
        errors.RateLimitError,
        429,
    ),
    "503": (lambda v: Faults.unavailable(v, 503), errors.UnavailableError, 503),
    "400": (lambda v: Faults.invalid_request(v), errors.InvalidRequestError, 400),
    "reset": (lambda v: Faults.reset(), errors.NetworkError, None),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case", list(FAULTS))
def test_faults_are_classified_alike(
    mode: str, kind: str, case: str, make_adapter: MakeAdapter, fake_upstream: FakeUpstream
) -> None:
    builder, expected, status = FAULTS[case]
    vendor = VENDOR_OF_KIND[kind]
    fake_upstream.script(vendor, builder(vendor), builder(vendor))
    adapter = make_adapter(kind)
    with pytest.raises(ProviderError) as caught:
        complete(mode, adapter)
    events, error = stream(mode, adapter)  # an error status before the stream
    for exc in (caught.value, error):
        assert type(exc) is expected, f"{case}: {exc!r}"
        assert exc.http_status == status
        assert KEY not in str(exc) and fake_upstream.url not in str(exc)
    assert events == []
    if case == "429 retry-after":
        assert caught.value.retry_after == 2.0 and error is not None and error.retry_after == 2.0


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", KINDS)
def test_a_silent_upstream_is_a_timeout(
    mode: str, kind: str, make_adapter: MakeAdapter, fake_upstream: FakeUpstream
) -> None:
    vendor = VENDOR_OF_KIND[kind]
    fake_upstream.script(vendor, Faults.hang())
    with pytest.raises(ProviderTimeoutError):
        complete(mode, make_adapter(kind), timeout=0.3)


@pytest.mark.parametrize("mode", MODES)
def test_connection_refused_is_network(mode: str, make_adapter: MakeAdapter) -> None:
    adapter = make_adapter("openai", base_url="http://127.0.0.1:9")
    with pytest.raises(errors.NetworkError):
        complete(mode, adapter, timeout=2.0)


# --- stream deadlines ----------------------------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", KINDS)
def test_no_first_token_in_time(
    mode: str, kind: str, make_adapter: MakeAdapter, fake_upstream: FakeUpstream
) -> None:
    vendor = VENDOR_OF_KIND[kind]
    fake_upstream.script(vendor, Faults.stream(text=TEXT, first_chunk_delay=5.0))
    events, error = stream(mode, make_adapter(kind, first_token_timeout_s=0.3))
    assert events == []
    assert isinstance(error, ProviderTimeoutError)
    assert error.message == "The provider sent no first token in time."


def test_no_headers_within_the_first_token_deadline_names_the_phase(
    make_adapter: MakeAdapter, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script("anthropic", Faults.hang())
    events, error = stream("async", make_adapter("anthropic", first_token_timeout_s=0.3))
    assert events == [] and isinstance(error, ProviderTimeoutError)
    assert error.message == "The provider sent no first token in time."


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", KINDS)
def test_a_stall_after_the_first_token_is_an_idle_timeout(
    mode: str, kind: str, make_adapter: MakeAdapter, fake_upstream: FakeUpstream, fast_idle: None
) -> None:
    vendor = VENDOR_OF_KIND[kind]
    fake_upstream.script(vendor, Faults.stream(text=TEXT, stall_after=2))
    events, error = stream(mode, make_adapter(kind))
    assert texts(events) == PIECES[:2]
    assert isinstance(error, ProviderTimeoutError)
    assert error.message == "The provider's stream stalled (no event within the idle timeout)."


@pytest.mark.parametrize("mode", MODES)
def test_a_slow_consumer_is_not_upstream_silence(
    mode: str, make_adapter: MakeAdapter, fake_upstream: FakeUpstream, fast_idle: None
) -> None:
    fake_upstream.script("openai", Faults.stream(text=TEXT))
    events, error = stream(mode, make_adapter("openai"), pause=0.4)
    assert error is None
    assert texts(events) == PIECES and isinstance(events[-1], StreamEnd)


@pytest.mark.parametrize("mode", MODES)
def test_the_overall_timeout_bounds_a_slow_but_steady_stream(
    mode: str, make_adapter: MakeAdapter, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script("openai", Faults.stream(text=TEXT, interval=0.3))
    events, error = stream(mode, make_adapter("openai"), timeout=0.8)
    assert 1 <= len(texts(events)) < len(PIECES)
    assert texts(events) == PIECES[: len(texts(events))]
    assert isinstance(error, ProviderTimeoutError)
    assert error.message == "The provider did not finish its answer in time."


@pytest.mark.parametrize("kind", ["openai", "anthropic", "gemini"])
def test_a_cut_stream_ends_without_stream_end(
    kind: str, make_adapter: MakeAdapter, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script(kind, Faults.stream(text=TEXT, cut_after=3))
    events, error = stream("async", make_adapter(kind))
    assert error is None and texts(events) == PIECES[:3]
    assert not any(isinstance(e, StreamEnd) for e in events)
    fake_upstream.script(kind, Faults.stream(text=TEXT, error_after=2))
    events, error = stream("async", make_adapter(kind))
    assert texts(events) == PIECES[:2]
    assert error is not None and error.category == "unavailable"


# --- size limits ---------------------------------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", KINDS)
@override_settings(LLM_ROUTING={"MAX_RESPONSE_BYTES": 300})
def test_size_limits(
    mode: str, kind: str, make_adapter: MakeAdapter, fake_upstream: FakeUpstream
) -> None:
    vendor = VENDOR_OF_KIND[kind]
    fake_upstream.script(vendor, Faults.ok(body={"pad": "x" * 5000}))
    with pytest.raises(ResponseError) as caught:
        complete(mode, make_adapter(kind))
    assert "larger than 300 bytes" in caught.value.message
    fake_upstream.script(vendor, Faults.stream(text=LONG_TEXT))
    events, error = stream(mode, make_adapter(kind))
    assert isinstance(error, ResponseError)
    assert "stream is larger than 300 bytes" in error.message
    assert not any(isinstance(e, StreamEnd) for e in events)


# --- closing a stream closes the upstream request ----------------------------------------
@pytest.mark.parametrize("mode", MODES)
def test_closing_the_stream_closes_the_upstream_connection(
    mode: str, make_adapter: MakeAdapter, fake_upstream: FakeUpstream
) -> None:
    # 80 words, one every 50 ms: the fake is still writing when the consumer stops.
    fake_upstream.script("openai", Faults.stream(text=LONG_TEXT, interval=0.05))
    adapter = make_adapter("openai")
    got: list[StreamEvent] = []
    if mode == "sync":
        iterator = adapter.stream(STREAM_REQUEST, api_key=KEY, timeout=10.0)
        got += [next(iterator), next(iterator)]
        iterator.close()  # type: ignore[attr-defined]
        assert wait_for(lambda: fake_upstream.disconnects == 1)
    else:

        async def go() -> None:
            agen = adapter.astream(STREAM_REQUEST, api_key=KEY, timeout=10.0)
            got.extend([await anext(agen), await anext(agen)])
            await agen.aclose()  # type: ignore[attr-defined]
            # Checked while the loop (and the client's pool) is alive: no help from GC.
            assert await asyncio.to_thread(wait_for, lambda: fake_upstream.disconnects == 1)

        run_async(go())
    assert texts(got) == ["w0", " w1"]
    assert fake_upstream.disconnects == 1


def test_cancelling_the_consumer_task_closes_the_upstream_connection(
    make_adapter: MakeAdapter, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script("openai", Faults.stream(text=LONG_TEXT, interval=0.05))
    adapter = make_adapter("openai")
    got: list[StreamEvent] = []

    async def consume(seen: asyncio.Event) -> None:
        async for event in adapter.astream(STREAM_REQUEST, api_key=KEY, timeout=10.0):
            got.append(event)
            if len(got) == 2:
                seen.set()

    async def go() -> None:
        seen = asyncio.Event()
        task = asyncio.create_task(consume(seen))
        await seen.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await asyncio.to_thread(wait_for, lambda: fake_upstream.disconnects == 1)

    run_async(go())
    assert 2 <= len(got) < 80


def test_a_stream_read_to_its_end_is_not_a_disconnect(
    make_adapter: MakeAdapter, fake_upstream: FakeUpstream
) -> None:
    """The control of the two tests above: the fake only counts real early closes."""
    fake_upstream.script("openai", Faults.stream(text=TEXT))
    events, error = stream("async", make_adapter("openai"))
    assert error is None and isinstance(events[-1], StreamEnd)
    time.sleep(0.2)
    assert fake_upstream.disconnects == 0


# --- one AsyncClient per adapter and event loop ------------------------------------------
def test_one_async_client_per_event_loop(
    make_adapter: MakeAdapter, fake_upstream: FakeUpstream
) -> None:
    adapter = make_adapter("openai")

    async def two_calls() -> httpx.AsyncClient:
        client = adapter.aclient
        for _ in range(2):
            result = await adapter.acomplete(REQUEST, api_key=KEY, timeout=5.0)
            assert result.ok
        assert adapter.aclient is client  # reused within the loop
        return client

    first = run_async(two_calls())
    second = run_async(two_calls())
    assert first is not second
    assert isinstance(first, httpx.AsyncClient) and isinstance(second, httpx.AsyncClient)
    # The first loop is closed: its client was dropped when the second one was built.
    assert [c for _, c in adapter._aclients.values()] == [second]

    async def close() -> None:
        await adapter.aclose()

    run_async(close())
    assert adapter._aclients == {}
    assert not second.is_closed  # its loop had ended: dropped, not closable any more


def test_aclose_closes_the_running_loops_client(
    make_adapter: MakeAdapter, fake_upstream: FakeUpstream
) -> None:
    adapter = make_adapter("openai")

    async def go() -> tuple[httpx.AsyncClient, httpx.AsyncClient]:
        await adapter.acomplete(REQUEST, api_key=KEY, timeout=5.0)
        client = adapter.aclient
        await adapter.aclose()
        assert client.is_closed
        result = await adapter.acomplete(REQUEST, api_key=KEY, timeout=5.0)  # a new one
        assert result.ok and adapter.aclient is not client
        fresh = adapter.aclient
        await adapter.aclose()
        return client, fresh

    closed, fresh = run_async(go())
    assert closed.is_closed and fresh.is_closed


class LoopThread:
    """An event loop running in a thread (another server's loop)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=10)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)
        self.loop.close()


@pytest.fixture
def loop_thread() -> Iterator[LoopThread]:
    runner = LoopThread()
    yield runner
    runner.stop()


def test_close_from_another_thread_closes_the_client_on_its_own_loop(
    make_adapter: MakeAdapter, fake_upstream: FakeUpstream, loop_thread: LoopThread
) -> None:
    adapter = make_adapter("openai")

    async def call() -> httpx.AsyncClient:
        assert (await adapter.acomplete(REQUEST, api_key=KEY, timeout=5.0)).ok
        return adapter.aclient

    client = loop_thread.run(call())
    adapter.close()  # the registry's eviction path, from this (other) thread
    assert wait_for(lambda: client.is_closed)


def test_registry_eviction_and_aclose_all_close_async_clients(
    fake_upstream: FakeUpstream, loop_thread: LoopThread
) -> None:
    fields = upstream_fields("evicted", "openai", fake_upstream)
    v1 = ProviderConfig(**fields, version="1")
    v2 = ProviderConfig(**fields, version="2")

    async def call(config: ProviderConfig) -> tuple[BaseProvider, httpx.AsyncClient]:
        adapter = registry.get_adapter(config)
        assert (await adapter.acomplete(REQUEST, api_key=KEY, timeout=5.0)).ok
        assert isinstance(adapter, HttpProvider)
        return adapter, adapter.aclient

    try:
        old, old_client = loop_thread.run(call(v1))
        new, new_client = loop_thread.run(call(v2))  # the row changed: v1 is evicted
        assert new is not old
        assert wait_for(lambda: old_client.is_closed)
        assert not new_client.is_closed
        loop_thread.run(registry.aclose_all())
        assert new_client.is_closed
        assert registry.get_adapter(v2) is not new  # rebuilt on next use
    finally:
        registry.clear_adapter_cache()


@pytest.mark.parametrize("how", ["close", "aclose"])
def test_closing_the_adapter_mid_stream_is_a_network_error(
    how: str, make_adapter: MakeAdapter, fake_upstream: FakeUpstream
) -> None:
    """A provider row changed while its stream runs (the registry closes the adapter):
    the stream ends with a classified NetworkError, never a raw transport exception."""
    fake_upstream.script("openai", Faults.stream(text=LONG_TEXT, interval=0.05))
    adapter = make_adapter("openai")

    async def go() -> tuple[list[StreamEvent], BaseException | None]:
        events: list[StreamEvent] = []
        agen = adapter.astream(STREAM_REQUEST, api_key=KEY, timeout=10.0)
        events.append(await anext(agen))
        if how == "close":
            adapter.close()  # scheduled on this (running) loop
        else:
            await adapter.aclose()
        try:
            async for event in agen:
                events.append(event)
        except BaseException as exc:
            return events, exc
        return events, None

    events, error = run_async(go())
    assert isinstance(error, errors.NetworkError)
    assert 1 <= len(texts(events)) < 80
    assert not any(isinstance(e, StreamEnd) for e in events)


# --- pool limits ---------------------------------------------------------------------------
def test_pool_limits_come_from_settings() -> None:
    assert pool_limits() == httpx.Limits(max_connections=1000, max_keepalive_connections=100)
    with override_settings(LLM_ROUTING={"HTTP_MAX_CONNECTIONS": 7, "HTTP_MAX_KEEPALIVE": 3}):
        assert pool_limits() == httpx.Limits(max_connections=7, max_keepalive_connections=3)


@pytest.mark.parametrize("mode", MODES)
@override_settings(LLM_ROUTING={"HTTP_MAX_CONNECTIONS": 1, "HTTP_MAX_KEEPALIVE": 1})
def test_a_full_pool_makes_the_next_call_wait_and_time_out(
    mode: str, make_adapter: MakeAdapter, fake_upstream: FakeUpstream
) -> None:
    """The limit reaches the transport (httpx ignores a client's ``limits`` once a
    transport is given): with one connection held by an open stream, the next call
    waits for the pool and fails with a pool timeout (the connect timeout)."""
    fake_upstream.script("openai", Faults.stream(text=LONG_TEXT, interval=0.05))
    adapter = make_adapter("openai", first_token_timeout_s=0.3)
    if mode == "sync":
        held = adapter.stream(STREAM_REQUEST, api_key=KEY, timeout=10.0)
        assert isinstance(next(held), StreamDelta)
        with pytest.raises(ProviderTimeoutError) as caught:
            adapter.complete(REQUEST, api_key=KEY, timeout=5.0)
        held.close()  # type: ignore[attr-defined]
        error: ProviderError = caught.value
    else:

        async def go() -> ProviderError:
            agen = adapter.astream(STREAM_REQUEST, api_key=KEY, timeout=10.0)
            assert isinstance(await anext(agen), StreamDelta)
            try:
                with pytest.raises(ProviderTimeoutError) as caught:
                    await adapter.acomplete(REQUEST, api_key=KEY, timeout=5.0)
            finally:
                await agen.aclose()  # type: ignore[attr-defined]
                await adapter.aclose()
            return caught.value

        error = run_async(go())
    assert "PoolTimeout" in error.message
    assert len(fake_upstream.requests_for("openai")) == 1  # the second call never went out


# --- BaseProvider's defaults for sync-only adapters ----------------------------------------
class SyncOnly(BaseProvider):
    """A custom adapter written against the sync interface only."""

    kind: ClassVar[str] = "sync_only"
    threads: ClassVar[list[int]] = []
    closed: ClassVar[list[str]] = []

    def complete(
        self, request: AuditRequest, *, api_key: str | None, timeout: float
    ) -> ProviderResult:
        type(self).threads.append(threading.get_ident())
        if request.input_text == "fail":
            raise errors.RateLimitError("Slow down.", retry_after=1.0)
        return ProviderResult(
            provider=self.config.name,
            model="m",
            mode="live",
            status="ok",
            output=f"echo {request.input_text}",
            usage=Usage(1, 2),
        )

    def stream(
        self, request: AuditRequest, *, api_key: str | None, timeout: float
    ) -> Iterator[StreamEvent]:
        try:
            for word in ("one ", "two ", "three"):
                type(self).threads.append(threading.get_ident())
                if word == "three" and request.input_text == "fail":
                    raise errors.NetworkError("Cut.")
                yield StreamDelta(word)
            yield StreamEnd("stop", Usage(1, 3), "m")
        finally:
            type(self).closed.append(request.input_text)


@pytest.fixture
def sync_only() -> Iterator[SyncOnly]:
    SyncOnly.threads, SyncOnly.closed = [], []
    yield SyncOnly(ProviderConfig(name="sync-only", kind="sync_only", model="m"))


def test_a_sync_only_adapter_runs_in_worker_threads(sync_only: SyncOnly) -> None:
    async def go() -> tuple[int, ProviderResult, list[StreamEvent]]:
        result = await sync_only.acomplete(REQUEST, api_key=None, timeout=5.0)
        events = [e async for e in sync_only.astream(REQUEST, api_key=None, timeout=5.0)]
        return threading.get_ident(), result, events

    loop_thread, result, events = run_async(go())
    assert result == sync_only.complete(REQUEST, api_key=None, timeout=5.0)
    assert events == list(sync_only.stream(REQUEST, api_key=None, timeout=5.0))
    assert len(SyncOnly.threads) == 1 + 3 + 1 + 3
    assert loop_thread not in SyncOnly.threads[:4]  # never on the event loop


def test_a_sync_only_adapter_keeps_its_exceptions(sync_only: SyncOnly) -> None:
    failing = replace(REQUEST, input_text="fail")

    async def go() -> tuple[BaseException, list[StreamEvent], BaseException]:
        with pytest.raises(errors.RateLimitError) as completed:
            await sync_only.acomplete(failing, api_key=None, timeout=5.0)
        events: list[StreamEvent] = []
        with pytest.raises(errors.NetworkError) as streamed:
            async for event in sync_only.astream(failing, api_key=None, timeout=5.0):
                events.append(event)
        return completed.value, events, streamed.value

    completed, events, streamed = run_async(go())
    assert isinstance(streamed, errors.NetworkError)
    assert isinstance(completed, errors.RateLimitError) and completed.retry_after == 1.0
    assert texts(events) == ["one ", "two "] and streamed.message == "Cut."


def test_closing_a_sync_only_stream_closes_its_iterator(sync_only: SyncOnly) -> None:
    async def go() -> None:
        agen = sync_only.astream(REQUEST, api_key=None, timeout=5.0)
        assert await anext(agen) == StreamDelta("one ")
        await agen.aclose()  # type: ignore[attr-defined]

    run_async(go())
    assert SyncOnly.closed == ["Say it."]


def test_the_mock_answers_inline_with_the_same_result() -> None:
    mock = MockProvider(ProviderConfig(name="mock", kind="mock", model="mock-1"))
    seen: list[int] = []

    async def go() -> tuple[ProviderResult, list[StreamEvent]]:
        seen.append(threading.get_ident())
        result = await mock.acomplete(REQUEST, api_key=None, timeout=5.0)
        events: AsyncIterator[StreamEvent] = mock.astream(REQUEST, api_key=None, timeout=5.0)
        return result, [e async for e in events]

    result, events = run_async(go())
    expected = mock.complete(REQUEST, api_key=None, timeout=5.0)
    assert replace(result, latency_ms=0.0) == replace(expected, latency_ms=0.0)
    assert events == list(mock.stream(REQUEST, api_key=None, timeout=5.0))


def test_an_http_subclass_overriding_sync_complete_keeps_it(
    fake_upstream: FakeUpstream,
) -> None:
    from llm_routing.providers.openai import OpenAIProvider

    class Custom(OpenAIProvider):
        def complete(
            self, request: AuditRequest, *, api_key: str | None, timeout: float
        ) -> ProviderResult:
            result = super().complete(request, api_key=api_key, timeout=timeout)
            return replace(result, output=f"custom {result.output}")

    fields = {**upstream_fields("custom", "openai", fake_upstream), "model": "model-x"}
    adapter = Custom(ProviderConfig(**fields))
    try:
        result = complete("async", adapter)
        assert result.output.startswith("custom ")
    finally:
        adapter.close()


def test_a_large_async_pool_is_split_into_shards_holding_the_limits() -> None:
    """httpcore scans a whole pool per request: the async pool is cut into shards of
    POOL_SHARD_SIZE connections that together hold the configured limits."""
    from llm_routing.providers.base import POOL_SHARD_SIZE, ShardedAsyncTransport

    transport = ShardedAsyncTransport.from_limits(
        httpx.Limits(max_connections=1000, max_keepalive_connections=100)
    )
    pools = [shard._pool for shard in transport.shards]
    assert len(pools) == 1000 // POOL_SHARD_SIZE + 1  # 32 shards of at most 32
    assert all(p._max_connections <= POOL_SHARD_SIZE for p in pools)
    assert sum(p._max_connections for p in pools) >= 1000
    assert sum(p._max_keepalive_connections for p in pools) >= 100
    one = ShardedAsyncTransport.from_limits(httpx.Limits(max_connections=1))
    assert len(one.shards) == 1 and one.shards[0]._pool._max_connections == 1


def test_every_shard_and_client_shares_one_verifying_tls_context() -> None:
    """One CA bundle per process (a context per shard took 40 ms and 0.9 MiB each), and
    it still verifies: a self-signed upstream is refused."""
    import ssl

    from llm_routing.providers.base import ShardedAsyncTransport, shared_ssl_context

    from .fakes.tls import self_signed_server

    transport = ShardedAsyncTransport.from_limits(httpx.Limits(max_connections=1000))
    contexts = {id(shard._pool._ssl_context) for shard in transport.shards}
    assert contexts == {id(shared_ssl_context())}
    context = shared_ssl_context()
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname

    async def call(url: str) -> None:
        async with httpx.AsyncClient(transport=transport) as client:
            await client.get(url)

    with self_signed_server() as url:
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            asyncio.run(call(f"{url}/"))


@HTTPCORE_ONLY
def test_every_shard_and_client_shares_one_tls_context(
    make_adapter: MakeAdapter,
) -> None:
    """A TLS context holds its own parsed CA bundle (~0.8 MiB): one per process, not one
    per shard (32 per provider per event loop at the default limits)."""
    import ssl

    from llm_routing.providers.base import ShardedAsyncTransport, shared_ssl_context

    context = shared_ssl_context()
    assert isinstance(context, ssl.SSLContext)
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    transport = ShardedAsyncTransport.from_limits(httpx.Limits(max_connections=1000))
    assert len(transport.shards) > 1
    assert all(shard._pool._ssl_context is context for shard in transport.shards)
    adapter = make_adapter("openai")
    assert isinstance(adapter, HttpProvider)
    try:
        assert adapter.client._transport._pool._ssl_context is context  # type: ignore[attr-defined]

        async def shards() -> list[object]:
            aclient = adapter.aclient
            assert isinstance(aclient._transport, ShardedAsyncTransport)
            contexts = [s._pool._ssl_context for s in aclient._transport.shards]
            await adapter.aclose()
            return contexts

        assert all(c is context for c in run_async(shards()))
    finally:
        adapter.close()


@HTTPCORE_ONLY
@override_settings(LLM_ROUTING={"HTTP_MAX_CONNECTIONS": 64, "HTTP_MAX_KEEPALIVE": 64})
def test_concurrent_calls_are_spread_over_the_shards(
    make_adapter: MakeAdapter, fake_upstream: FakeUpstream
) -> None:
    adapter = make_adapter("openai")
    assert isinstance(adapter, HttpProvider)

    async def go() -> tuple[list[ProviderResult], list[int]]:
        results = await asyncio.gather(
            *[adapter.acomplete(REQUEST, api_key=KEY, timeout=5.0) for _ in range(40)]
        )
        transport = adapter.aclient._transport
        assert isinstance(transport, ShardedAsyncTransport)
        opened = [len(shard._pool.connections) for shard in transport.shards]
        await adapter.aclose()
        return results, opened

    from llm_routing.providers.base import ShardedAsyncTransport

    results, opened = run_async(go())
    assert all(r.ok for r in results) and len(fake_upstream.requests) == 40
    assert len(opened) == 2 and all(n > 0 for n in opened)  # both shards carried calls
