"""Streaming through the router: the commit point, atomic and continuation modes."""

from __future__ import annotations

import pytest

from llm_routing.errors import ContentPolicyError, NetworkError, UnavailableError
from llm_routing.models import RoutingDecision
from llm_routing.router import route_stream
from llm_routing.types import AuditRequest, StreamChunk, StreamFailure, StreamResult

from .conftest import make_chain, make_provider

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("driver")]


def run(**kw: object) -> tuple[str, object]:
    mode = kw.pop("stream_mode", None)
    request = AuditRequest(task="t", input_text="x", stream=True, **kw)  # type: ignore[arg-type]
    events = list(route_stream(request, stream_mode=mode, sleeper=lambda s: None))  # type: ignore[arg-type]
    assert all(isinstance(e, StreamChunk) for e in events[:-1])
    assert isinstance(events[-1], StreamResult | StreamFailure)
    text = "".join(e.text for e in events if isinstance(e, StreamChunk))
    return text, events[-1]


@pytest.fixture
def two(scripted, key_env):
    a = make_provider("a", supports_streaming=True, max_retries=0)
    b = make_provider("b", supports_streaming=True, supports_prefill=True)
    make_chain("main", [a, b], is_default=True)
    return scripted


def test_clean_stream_ends_with_the_full_envelope(two):
    two.streams["a"] = [["Hel", "lo ", "world", "END"]]
    text, last = run()
    assert text == "Hello world"
    assert isinstance(last, StreamResult)
    result = last.routed.result
    assert (result.provider, result.status, result.output) == ("a", "ok", "Hello world")
    assert result.usage.output_tokens == 4
    d = RoutingDecision.objects.get()
    assert d.status == "ok" and list(d.attempts.values_list("partial", flat=True)) == [False]


def test_failure_before_first_chunk_fails_over(two):
    two.streams["a"] = [[UnavailableError(http_status=503)]]
    two.streams["b"] = [["from b", "END"]]
    text, last = run()
    assert text == "from b"
    assert isinstance(last, StreamResult) and last.routed.result.provider == "b"
    assert last.routed.metadata.fallback_reason == "unavailable"


def test_cut_after_first_chunk_is_an_error_event_never_a_clean_end(two):
    two.streams["a"] = [["one ", "two ", NetworkError("reset")]]
    two.streams["b"] = [["never", "END"]]
    text, last = run()
    assert text == "one two "
    assert isinstance(last, StreamFailure)
    assert last.partial is True and last.error.category == "network"
    assert [c[0] for c in two.calls] == ["a"]  # no failover after the commit point
    d = RoutingDecision.objects.get()
    assert d.status == "error"
    row = d.attempts.get()
    assert (row.partial, row.outcome, row.served) == (True, "error", False)


def test_stream_ending_without_finish_is_a_failure(two):
    two.streams["a"] = [["half an ans"]]  # body ends, no END
    text, last = run()
    assert text == "half an ans"
    assert isinstance(last, StreamFailure) and last.error.category == "response"


def test_atomic_mode_fails_over_with_a_complete_answer(two):
    two.streams["a"] = [["one ", "two ", NetworkError("reset")]]
    two.streams["b"] = [["complete ", "answer", "END"]]
    text, last = run(stream_mode="atomic")
    assert text == "complete answer"  # nothing of a's partial text leaked
    assert isinstance(last, StreamResult) and last.routed.result.provider == "b"


def test_continuation_mode_continues_without_duplicating(two):
    two.streams["a"] = [["The quick ", "brown ", NetworkError("reset")]]
    two.streams["b"] = [["fox jumps.", "END"]]
    text, last = run(stream_mode="continuation")
    assert text == "The quick brown fox jumps."
    assert isinstance(last, StreamResult)
    assert last.routed.result.provider == "b"
    assert last.routed.result.output == "The quick brown fox jumps."
    assert ("b", "The quick brown ") in two.prefills
    rows = list(RoutingDecision.objects.get().attempts.values_list("provider", "partial", "served"))
    assert rows == [("a", True, False), ("b", False, True)]


def test_continuation_fallback_failure_does_not_mask_the_original(two):
    two.streams["a"] = [["The quick ", NetworkError("reset")]]
    two.streams["b"] = [[ContentPolicyError("prefill rejected")]]
    text, last = run(stream_mode="continuation")
    assert text == "The quick "
    assert isinstance(last, StreamFailure)
    assert last.error.category == "network"  # the original failure, not b's
    assert last.partial is True


def test_continuation_needs_prefill_support(scripted, key_env):
    a = make_provider("a", supports_streaming=True)
    b = make_provider("b", supports_streaming=True, supports_prefill=False)
    make_chain("main", [a, b], is_default=True)
    scripted.streams["a"] = [["x ", NetworkError("reset")]]
    text, last = run(stream_mode="continuation")
    assert isinstance(last, StreamFailure) and text == "x "
    assert [c[0] for c in scripted.calls] == ["a"]


def test_permanent_error_before_first_chunk_is_a_result_with_status_error(two):
    two.streams["a"] = [[ContentPolicyError("no", http_status=400)]]
    text, last = run()
    assert text == ""
    assert isinstance(last, StreamResult)
    assert last.routed.result.status == "error"
    assert last.routed.result.error.category == "content_policy"
    assert [c[0] for c in two.calls] == ["a"]


def test_provider_without_streaming_is_skipped_unsupported(scripted, key_env):
    make_chain("main", [make_provider("a", supports_streaming=False)], is_default=True)
    text, last = run()
    assert isinstance(last, StreamResult)
    assert last.routed.metadata.skipped_providers == [{"provider": "a", "reason": "unsupported"}]
    assert last.routed.result.provider == "mock" and text.startswith("[mock]")


def test_mock_stream_equals_mock_complete():
    from llm_routing.router import route

    text, last = run()
    full = route(AuditRequest(task="t", input_text="x")).result.output
    assert text == full == last.routed.result.output


def test_client_disconnect_records_a_partial_attempt(two):
    two.streams["a"] = [["one ", "two ", "three", "END"]]
    gen = route_stream(AuditRequest(task="t", input_text="x", stream=True))
    assert isinstance(next(gen), StreamChunk)
    gen.close()
    d = RoutingDecision.objects.get()
    assert d.status == "error"
    row = d.attempts.get()
    assert row.partial is True and row.error_category == "client_disconnected"


def test_chain_stream_mode_comes_from_the_chain(two):
    from llm_routing.models import Chain

    Chain.objects.filter(name="main").update(stream_mode="atomic")
    two.streams["a"] = [["one ", NetworkError("reset")]]
    two.streams["b"] = [["whole", "END"]]
    text, last = run()
    assert text == "whole" and isinstance(last, StreamResult)
