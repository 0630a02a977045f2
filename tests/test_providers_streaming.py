"""Native streaming of the vendor adapters against the fake upstream (real SSE over
HTTP on 127.0.0.1): event mapping, end markers, cuts, stalls, first-token timeouts,
in-band errors, malformed events, structured output, prefill and pass-through."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator

import pytest
from django.test import override_settings

from llm_routing.errors import (
    ContentPolicyError,
    ContextLengthError,
    NetworkError,
    ProviderError,
    ProviderTimeoutError,
    ResponseError,
    UnavailableError,
)
from llm_routing.providers.base import HttpProvider
from llm_routing.types import AuditRequest, StreamDelta, StreamEnd, StreamEvent, Usage
from tests.conftest import VENDOR_OF_KIND
from tests.fakes.upstream import FakeUpstream, Fault, Faults

KINDS = ["openai", "openai_compatible", "anthropic", "gemini"]
KEY = "sk-stream-KEY-aa11bb22cc33dd44"
TEXT = "The quick brown fox jumps over"
PIECES = ["The", " quick", " brown", " fox", " jumps", " over"]
REQUEST = AuditRequest(task="t", input_text="Say it.", instructions="Be brief.", stream=True)
#: (finish reason, usage, model) of a healthy fake stream per vendor for TEXT.
ENDS = {
    "openai": StreamEnd("stop", Usage(11, 6), "model-x-2024-fake"),
    "anthropic": StreamEnd("end_turn", Usage(12, 6), "model-x-fake"),
    "gemini": StreamEnd("STOP", Usage(13, 6), "model-x-fake"),
}

MakeAdapter = Callable[..., HttpProvider]


def run(adapter: HttpProvider, request: AuditRequest = REQUEST, timeout: float = 5.0):
    """(events, error): every event the adapter yielded, and what it raised (or None)."""
    events: list[StreamEvent] = []
    try:
        for event in adapter.stream(request, api_key=KEY, timeout=timeout):
            events.append(event)
    except ProviderError as exc:
        return events, exc
    return events, None


def texts(events: list[StreamEvent]) -> list[str]:
    return [e.text for e in events if isinstance(e, StreamDelta)]


@pytest.fixture
def fast_idle() -> Iterator[None]:
    with override_settings(LLM_ROUTING={"STREAM_IDLE_TIMEOUT_S": 0.3}):
        yield


@pytest.mark.parametrize("kind", KINDS)
def test_healthy_stream_yields_every_piece_then_end_with_usage_and_model(
    kind: str, make_adapter: MakeAdapter, fake_upstream: FakeUpstream
) -> None:
    vendor = VENDOR_OF_KIND[kind]
    fake_upstream.script(vendor, Faults.stream(text=TEXT))
    events, error = run(make_adapter(kind))
    assert error is None
    assert texts(events) == PIECES
    assert events[-1] == ENDS[vendor]
    assert sum(isinstance(e, StreamEnd) for e in events) == 1
    (sent,) = fake_upstream.requests_for(vendor)
    assert sent.headers["accept"] == "text/event-stream"
    if vendor == "gemini":
        assert sent.path.endswith("/models/model-x:streamGenerateContent")
        assert sent.query == "alt=sse"  # the key is never in the URL
        assert sent.headers["x-goog-api-key"] == KEY
        assert "stream" not in sent.json
    else:
        assert sent.json["stream"] is True
    if vendor == "openai":
        assert sent.json["stream_options"] == {"include_usage": True}


def test_openai_row_can_turn_off_stream_options(
    make_adapter: MakeAdapter, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script("openai", Faults.stream(text=TEXT))
    adapter = make_adapter("openai_compatible", params={"stream_include_usage": False})
    events, error = run(adapter)
    assert error is None and texts(events) == PIECES
    sent = fake_upstream.requests_for("openai")[0].json
    assert "stream_options" not in sent and "stream_include_usage" not in sent
    end = events[-1]
    assert isinstance(end, StreamEnd) and end.finish_reason == "stop" and end.usage is None


@pytest.mark.parametrize("kind", KINDS)
def test_one_malformed_event_is_skipped_and_logged_without_content(
    kind: str,
    make_adapter: MakeAdapter,
    fake_upstream: FakeUpstream,
    caplog: pytest.LogCaptureFixture,
) -> None:
    vendor = VENDOR_OF_KIND[kind]
    fake_upstream.script(vendor, Faults.stream(text=TEXT, malformed_at=2))
    with caplog.at_level(logging.WARNING, logger="llm_routing.providers"):
        events, error = run(make_adapter(kind))
    assert error is None
    assert texts(events) == PIECES
    assert isinstance(events[-1], StreamEnd)
    skipped = [r for r in caplog.records if "malformed stream event" in r.getMessage()]
    assert len(skipped) == 1
    assert "content" not in skipped[0].getMessage() and "{" not in skipped[0].getMessage()


def test_too_many_malformed_events_make_the_stream_unusable(
    make_adapter: MakeAdapter, fake_upstream: FakeUpstream
) -> None:
    adapter = make_adapter("openai")
    adapter.max_skipped_events = 0  # type: ignore[misc]
    fake_upstream.script("openai", Faults.stream(text=TEXT, malformed_at=2))
    events, error = run(adapter)
    assert texts(events) == PIECES[:2]
    assert isinstance(error, ResponseError)


@pytest.mark.parametrize("kind", KINDS)
def test_no_end_marker_but_finish_reason_and_clean_end_is_finalized(
    kind: str, make_adapter: MakeAdapter, fake_upstream: FakeUpstream
) -> None:
    vendor = VENDOR_OF_KIND[kind]
    fake_upstream.script(vendor, Faults.stream(text=TEXT, no_end_marker=True))
    events, error = run(make_adapter(kind))
    assert error is None
    assert texts(events) == PIECES
    assert events[-1] == ENDS[vendor]


@pytest.mark.parametrize("kind", KINDS)
def test_clean_cut_after_n_chunks_ends_without_stream_end(
    kind: str, make_adapter: MakeAdapter, fake_upstream: FakeUpstream
) -> None:
    vendor = VENDOR_OF_KIND[kind]
    fake_upstream.script(vendor, Faults.stream(text=TEXT, cut_after=3))
    events, error = run(make_adapter(kind))
    assert error is None
    assert texts(events) == PIECES[:3]
    assert not any(isinstance(e, StreamEnd) for e in events)  # the router reports the cut


@pytest.mark.parametrize("kind", ["openai", "anthropic", "gemini"])
def test_reset_after_n_chunks_is_a_network_error(
    kind: str, make_adapter: MakeAdapter, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script(kind, Faults.stream(text=TEXT, cut_after=2, reset=True))
    events, error = run(make_adapter(kind))
    assert texts(events) == PIECES[:2]
    assert isinstance(error, NetworkError)


@pytest.mark.parametrize("kind", KINDS)
def test_headers_but_no_first_token_in_time_is_a_timeout(
    kind: str, make_adapter: MakeAdapter, fake_upstream: FakeUpstream
) -> None:
    vendor = VENDOR_OF_KIND[kind]
    fake_upstream.script(vendor, Faults.stream(text=TEXT, first_chunk_delay=5.0))
    events, error = run(make_adapter(kind, first_token_timeout_s=0.3))
    assert events == []
    assert isinstance(error, ProviderTimeoutError)
    assert "first token" in error.message


def test_no_headers_within_first_token_timeout_is_a_timeout(
    make_adapter: MakeAdapter, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script("anthropic", Faults.hang())
    events, error = run(make_adapter("anthropic", first_token_timeout_s=0.3))
    assert events == [] and isinstance(error, ProviderTimeoutError)


@pytest.mark.parametrize("kind", KINDS)
def test_stall_after_the_first_token_is_an_idle_timeout(
    kind: str, make_adapter: MakeAdapter, fake_upstream: FakeUpstream, fast_idle: None
) -> None:
    vendor = VENDOR_OF_KIND[kind]
    fake_upstream.script(vendor, Faults.stream(text=TEXT, stall_after=2))
    events, error = run(make_adapter(kind))
    assert texts(events) == PIECES[:2]
    assert isinstance(error, ProviderTimeoutError)
    assert "stalled" in error.message


def test_a_slow_consumer_is_not_upstream_silence(
    make_adapter: MakeAdapter, fake_upstream: FakeUpstream, fast_idle: None
) -> None:
    fake_upstream.script("openai", Faults.stream(text=TEXT))
    received = []
    for event in make_adapter("openai").stream(REQUEST, api_key=KEY, timeout=5.0):
        received.append(event)
        time.sleep(0.4)  # longer than the idle timeout, spent on our side
    assert texts(received) == PIECES and isinstance(received[-1], StreamEnd)


def test_overall_timeout_bounds_a_slow_but_steady_stream(
    make_adapter: MakeAdapter, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script("openai", Faults.stream(text=TEXT, interval=0.3))
    events, error = run(make_adapter("openai"), timeout=0.8)
    assert 1 <= len(texts(events)) < len(PIECES)
    assert texts(events) == PIECES[: len(texts(events))]
    assert isinstance(error, ProviderTimeoutError)


@pytest.mark.parametrize(
    ("kind", "category"),
    [("openai", "unavailable"), ("anthropic", "unavailable"), ("gemini", "unavailable")],
)
def test_in_band_error_event_is_classified(
    kind: str, category: str, make_adapter: MakeAdapter, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script(kind, Faults.stream(text=TEXT, error_after=2))
    events, error = run(make_adapter(kind))
    assert texts(events) == PIECES[:2]
    assert error is not None and error.category == category
    if kind == "anthropic":
        assert isinstance(error, UnavailableError) and error.message == "Overloaded"


@pytest.mark.parametrize("kind", KINDS)
def test_error_status_before_the_stream_is_classified_like_complete(
    kind: str, make_adapter: MakeAdapter, fake_upstream: FakeUpstream
) -> None:
    vendor = VENDOR_OF_KIND[kind]
    fake_upstream.script(vendor, Faults.context_length(vendor), Faults.unavailable(vendor))
    adapter = make_adapter(kind)
    events, error = run(adapter)
    assert events == [] and isinstance(error, ContextLengthError)
    events, error = run(adapter)
    assert events == [] and isinstance(error, UnavailableError) and error.http_status == 503


def test_gemini_prompt_block_answered_as_json_is_content_policy(
    make_adapter: MakeAdapter, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script("gemini", Faults.content_policy("gemini"))  # 200 JSON, not SSE
    events, error = run(make_adapter("gemini"))
    assert events == [] and isinstance(error, ContentPolicyError)


def test_a_server_ignoring_stream_answers_in_one_piece(
    make_adapter: MakeAdapter, fake_upstream: FakeUpstream
) -> None:
    body = {
        "model": "local-7b",
        "choices": [{"index": 0, "message": {"content": "whole answer"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 2, "completion_tokens": 2},
    }
    fake_upstream.script("openai", Fault(body=body))
    events, error = run(make_adapter("openai_compatible"))
    assert error is None
    assert events == [StreamDelta("whole answer"), StreamEnd("stop", Usage(2, 2), "local-7b")]


SCHEMA = {
    "type": "object",
    "properties": {"title": {"type": "string"}, "n": {"type": "integer"}},
    "required": ["title", "n"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("kind", KINDS)
def test_structured_stream_is_validated_once_complete(
    kind: str, make_adapter: MakeAdapter, fake_upstream: FakeUpstream
) -> None:
    vendor = VENDOR_OF_KIND[kind]
    request = AuditRequest(task="t", input_text="x", response_schema=SCHEMA, stream=True)
    fake_upstream.script(vendor, Faults.stream())
    events, error = run(make_adapter(kind), request)
    assert error is None
    assert isinstance(json.loads("".join(texts(events))), dict)
    fake_upstream.script(vendor, Faults.stream(text='{"title": "x", "n": "not a number"}'))
    events, error = run(make_adapter(kind), request)
    assert isinstance(error, ResponseError) and "n" in error.message
    if vendor == "anthropic":  # the JSON is the forced tool's input
        assert fake_upstream.requests_for("anthropic")[-1].json["tool_choice"]["type"] == "tool"


PREFILL = "The quick"


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("streaming", [True, False])
def test_prefill_is_a_trailing_assistant_turn(
    kind: str, streaming: bool, make_adapter: MakeAdapter, fake_upstream: FakeUpstream
) -> None:
    vendor = VENDOR_OF_KIND[kind]
    request = AuditRequest(task="t", input_text="Say it.", prefill=PREFILL, stream=streaming)
    adapter = make_adapter(kind)
    if streaming:
        fake_upstream.script(vendor, Faults.stream(text=TEXT))
        assert run(adapter, request)[1] is None
    else:
        adapter.complete(request, api_key=KEY, timeout=5.0)
    sent = fake_upstream.requests_for(vendor)[0].json
    if vendor == "gemini":
        assert sent["contents"][-1] == {"role": "model", "parts": [{"text": PREFILL}]}
        assert sent["contents"][0]["role"] == "user"
    else:
        assert sent["messages"][-1] == {"role": "assistant", "content": PREFILL}
        assert sent["messages"][-2]["role"] == "user"


def test_anthropic_prefill_whitespace_is_cut_and_not_duplicated(
    make_adapter: MakeAdapter, fake_upstream: FakeUpstream
) -> None:
    request = AuditRequest(task="t", input_text="Say it.", prefill="The quick ", stream=True)
    fake_upstream.script("anthropic", Faults.stream(text=" brown fox"))
    events, error = run(make_adapter("anthropic"), request)
    assert error is None
    sent = fake_upstream.requests_for("anthropic")[0].json
    assert sent["messages"][-1] == {"role": "assistant", "content": "The quick"}
    assert "The quick " + "".join(texts(events)) == "The quick brown fox"


@pytest.mark.parametrize("kind", KINDS)
def test_temperature_and_max_tokens_override_row_params(
    kind: str, make_adapter: MakeAdapter, fake_upstream: FakeUpstream
) -> None:
    vendor = VENDOR_OF_KIND[kind]
    adapter = make_adapter(kind, params={"temperature": 0.9, "max_tokens": 500})
    request = AuditRequest(task="t", input_text="x", temperature=0.1, max_tokens=42)
    adapter.complete(request, api_key=KEY, timeout=5.0)
    adapter.complete(AuditRequest(task="t", input_text="x"), api_key=KEY, timeout=5.0)
    overridden, default = (r.json for r in fake_upstream.requests_for(vendor))
    if vendor == "gemini":
        assert overridden["generationConfig"] == {"temperature": 0.1, "maxOutputTokens": 42}
        assert default["generationConfig"] == {"temperature": 0.9, "maxOutputTokens": 500}
    else:
        assert (overridden["temperature"], overridden["max_tokens"]) == (0.1, 42)
        assert (default["temperature"], default["max_tokens"]) == (0.9, 500)
        assert "max_completion_tokens" not in overridden


def test_openai_max_tokens_goes_to_max_completion_tokens_unless_the_row_names_a_key(
    make_adapter: MakeAdapter, fake_upstream: FakeUpstream
) -> None:
    request = AuditRequest(task="t", input_text="x", max_tokens=42)
    make_adapter("openai").complete(request, api_key=KEY, timeout=5.0)
    make_adapter("openai_compatible").complete(request, api_key=KEY, timeout=5.0)
    first, second = (r.json for r in fake_upstream.requests_for("openai"))
    assert first["max_completion_tokens"] == 42 and "max_tokens" not in first
    assert second["max_tokens"] == 42 and "max_completion_tokens" not in second
