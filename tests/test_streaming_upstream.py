"""Stream fault scenarios end to end: real adapters, the fake upstream, the router's
commit point — through ``route_stream``, ``POST /audit/`` (``"stream": true``) and
``/v1/chat/completions`` with the official ``openai`` SDK over a live server.

Each test asserts the exact text the client received and the requests the upstream saw.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import openai
import pytest
from django.test import override_settings
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from llm_routing.models import Chain, RoutingDecision
from llm_routing.router import route_stream
from llm_routing.types import (
    AuditRequest,
    RouterStreamEvent,
    StreamChunk,
    StreamFailure,
    StreamResult,
)
from tests.fakes.upstream import FakeUpstream, Faults

KEY = "sk-stream-upstream-0123456789abcdef"
TEXT = "The quick brown fox jumps over the lazy dog."
PIECES = ["The", " quick", " brown", " fox", " jumps", " over", " the", " lazy", " dog."]
FALLBACK_TEXT = "A complete answer from the fallback."
REQUEST = AuditRequest(task="chat", input_text="Tell me about the fox.", stream=True)
MESSAGES = [{"role": "user", "content": "Tell me about the fox."}]

Chainer = Callable[..., list[Any]]


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_PROVIDER_KEY", KEY)


@pytest.fixture(autouse=True)
def _fast() -> Iterator[None]:
    with override_settings(
        LLM_ROUTING={"STREAM_IDLE_TIMEOUT_S": 0.5, "BACKOFF_BASE_S": 0.01, "BACKOFF_MAX_S": 0.02}
    ):
        yield


def two_vendor_chain(
    upstream_chain: Chainer, *, mode: str = "direct", first: dict[str, Any] | None = None
) -> None:
    """``oc`` (openai_compatible) then ``claude`` (anthropic, declares prefill)."""
    upstream_chain(
        ("oc", "openai_compatible", {"supports_streaming": True, **(first or {})}),
        (
            "claude",
            "anthropic",
            {"supports_streaming": True, "supports_prefill": True, "model": "claude-x"},
        ),
    )
    Chain.objects.filter(name="default").update(stream_mode=mode)


def collect(events: Iterator[RouterStreamEvent]) -> tuple[str, RouterStreamEvent]:
    text, last = [], None
    for event in events:
        if isinstance(event, StreamChunk):
            text.append(event.text)
        else:
            last = event
    assert last is not None
    return "".join(text), last


def seen(fake: FakeUpstream) -> dict[str, int]:
    return {v: len(fake.requests_for(v)) for v in ("openai", "anthropic", "gemini")}


def attempt_rows(request_id: str) -> list[tuple[str, str, str, bool]]:
    decision = RoutingDecision.objects.get(request_id=request_id)
    return [
        (a.provider, a.outcome, a.error_category, a.partial)
        for a in decision.attempts.order_by("index")
    ]


def audit_stream(api: APIClient, body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    response = api.post("/audit/", {**body, "stream": True}, format="json")
    assert response.status_code == 200
    assert response["content-type"].startswith("text/event-stream")
    raw = b"".join(response.streaming_content).decode()
    events = []
    for block in raw.strip().split("\n\n"):
        lines = block.split("\n")
        name = next(line[7:] for line in lines if line.startswith("event: "))
        data = "\n".join(line[6:] for line in lines if line.startswith("data: "))
        events.append((name, json.loads(data)))
    return events


# --- route_stream and POST /audit/ -----------------------------------------------------
pytestmark = pytest.mark.django_db


def test_cut_after_n_chunks_direct_ends_with_an_error_event_after_exactly_those(
    api: APIClient, fake_upstream: FakeUpstream, upstream_chain: Chainer
) -> None:
    two_vendor_chain(upstream_chain)
    fake_upstream.script("openai", Faults.stream(text=TEXT, cut_after=3))

    events = audit_stream(api, {"task": "chat", "input_text": "Tell me about the fox."})

    assert [e for e, _ in events] == ["chunk", "chunk", "chunk", "error"]
    assert "".join(d["text"] for e, d in events if e == "chunk") == "The quick brown"
    error = events[-1][1]
    assert error["partial"] is True and error["category"] == "response"
    assert seen(fake_upstream) == {"openai": 1, "anthropic": 0, "gemini": 0}  # no replay
    assert attempt_rows(error["request_id"]) == [("oc", "error", "response", True)]


def test_cut_atomic_serves_the_complete_answer_from_the_fallback(
    fake_upstream: FakeUpstream, upstream_chain: Chainer
) -> None:
    two_vendor_chain(upstream_chain, mode="atomic", first={"max_retries": 1})
    # A cut is a truncated transfer: transient, retried once on the same provider.
    fake_upstream.script("openai", *[Faults.stream(text=TEXT, cut_after=3)] * 2)
    fake_upstream.script("anthropic", Faults.stream(text=FALLBACK_TEXT))

    text, last = collect(route_stream(REQUEST))

    assert text == FALLBACK_TEXT  # nothing of the cut answer reached the client
    assert isinstance(last, StreamResult)
    result = last.routed.result
    assert (result.status, result.provider, result.output) == ("ok", "claude", FALLBACK_TEXT)
    assert result.model == "claude-x-fake"
    assert seen(fake_upstream) == {"openai": 2, "anthropic": 1, "gemini": 0}
    assert attempt_rows(last.routed.request_id) == [
        ("oc", "error", "network", False),
        ("claude", "ok", "", False),
    ]


def test_malformed_chunk_is_skipped_and_the_answer_is_complete(
    fake_upstream: FakeUpstream, upstream_chain: Chainer
) -> None:
    upstream_chain(("gem", "gemini", {"supports_streaming": True}))
    fake_upstream.script("gemini", Faults.stream(text=TEXT, malformed_at=4))

    text, last = collect(route_stream(REQUEST))

    assert text == TEXT
    assert isinstance(last, StreamResult) and last.routed.result.status == "ok"
    assert last.routed.result.usage.output_tokens == len(PIECES)
    assert seen(fake_upstream) == {"openai": 0, "anthropic": 0, "gemini": 1}


def test_no_done_marker_is_finalized_with_usage(
    api: APIClient, fake_upstream: FakeUpstream, upstream_chain: Chainer
) -> None:
    two_vendor_chain(upstream_chain)
    fake_upstream.script("openai", Faults.stream(text=TEXT, no_end_marker=True))

    events = audit_stream(api, {"task": "chat", "input_text": "Tell me about the fox."})

    assert [e for e, _ in events] == ["chunk"] * len(PIECES) + ["result"]
    assert "".join(d["text"] for e, d in events if e == "chunk") == TEXT
    result = events[-1][1]["result"]
    assert result["status"] == "ok" and result["output"] == TEXT
    assert result["usage"] == {"input_tokens": 11, "output_tokens": len(PIECES)}
    assert result["model"] == "openai_compatible-model-2024-fake"
    assert seen(fake_upstream) == {"openai": 1, "anthropic": 0, "gemini": 0}


def test_context_length_goes_to_the_next_candidate(
    fake_upstream: FakeUpstream, upstream_chain: Chainer
) -> None:
    two_vendor_chain(upstream_chain)
    fake_upstream.script("openai", Faults.context_length("openai"))
    fake_upstream.script("anthropic", Faults.stream(text=FALLBACK_TEXT))

    text, last = collect(route_stream(REQUEST))

    assert text == FALLBACK_TEXT
    assert isinstance(last, StreamResult) and last.routed.result.provider == "claude"
    assert last.routed.metadata.fallback_reason == "context_length"
    assert seen(fake_upstream) == {"openai": 1, "anthropic": 1, "gemini": 0}


def test_in_band_error_after_the_first_chunk_is_an_error_not_a_failover(
    fake_upstream: FakeUpstream, upstream_chain: Chainer
) -> None:
    upstream_chain(
        ("claude", "anthropic", {"supports_streaming": True}),
        ("oc", "openai_compatible", {"supports_streaming": True}),
    )
    fake_upstream.script("anthropic", Faults.stream(text=TEXT, error_after=2))

    text, last = collect(route_stream(REQUEST))

    assert text == "The quick"
    assert isinstance(last, StreamFailure) and last.partial is True
    assert last.error.category == "unavailable" and last.error.message == "Overloaded"
    assert seen(fake_upstream) == {"openai": 0, "anthropic": 1, "gemini": 0}


def test_a_key_echoed_by_an_in_band_error_after_the_commit_point_is_redacted(
    api: APIClient, fake_upstream: FakeUpstream, upstream_chain: Chainer
) -> None:
    upstream_chain(("claude", "anthropic", {"supports_streaming": True}))
    fake_upstream.script("anthropic", Faults.stream(text=TEXT, error_after=2, echo_key=True))

    events = audit_stream(api, {"task": "chat", "input_text": "Tell me about the fox."})

    assert "".join(d["text"] for e, d in events if e == "chunk") == "The quick"
    name, error = events[-1]
    assert name == "error" and error["partial"] is True
    assert error["message"].startswith("Overloaded") and "[redacted]" in error["message"]
    raw = json.dumps(events)
    assert KEY not in raw
    assert fake_upstream.requests_for("anthropic")[0].headers["x-api-key"] == KEY


# --- /v1/chat/completions with the official openai SDK over a live server ------------
@pytest.fixture
def sdk(live_server: Any, django_user_model: Any) -> Iterator[openai.OpenAI]:
    user = django_user_model.objects.create_user(username="sdk", password="pw-sdk-123")
    token = Token.objects.create(user=user).key
    # Closed after the test: a keep-alive connection left open would keep a live-server
    # thread (and its database connection) alive past the test.
    with openai.OpenAI(base_url=f"{live_server.url}/v1", api_key=token, max_retries=0) as client:
        yield client


def sdk_stream(client: openai.OpenAI) -> tuple[str, set[str], list[Any]]:
    chunks = list(client.chat.completions.create(model="default", messages=MESSAGES, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return text, {c.model for c in chunks}, chunks


@pytest.mark.django_db(transaction=True)
def test_sdk_continuation_completes_the_answer_without_duplicated_text(
    sdk: openai.OpenAI, fake_upstream: FakeUpstream, upstream_chain: Chainer
) -> None:
    two_vendor_chain(upstream_chain, mode="continuation")
    fake_upstream.script("openai", Faults.stream(text=TEXT, cut_after=4))
    fake_upstream.script("anthropic", Faults.stream(text=" jumps over the lazy dog."))

    text, _, chunks = sdk_stream(sdk)

    assert text == TEXT  # "The quick brown fox" + " jumps over the lazy dog."
    assert chunks[-1].choices[0].finish_reason == "stop"  # end_turn, mapped for /v1
    assert seen(fake_upstream) == {"openai": 1, "anthropic": 1, "gemini": 0}
    fallback = fake_upstream.requests_for("anthropic")[0].json
    assert fallback["messages"][-1] == {"role": "assistant", "content": "The quick brown fox"}
    decision = RoutingDecision.objects.get()
    assert attempt_rows(str(decision.request_id)) == [
        ("oc", "error", "response", True),
        ("claude", "ok", "", False),
    ]


@pytest.mark.django_db(transaction=True)
def test_sdk_stall_ends_with_an_error_within_the_idle_timeout(
    sdk: openai.OpenAI, fake_upstream: FakeUpstream, upstream_chain: Chainer
) -> None:
    two_vendor_chain(upstream_chain)
    fake_upstream.script("openai", Faults.stream(text=TEXT, stall_after=2, stall_s=30))

    received: list[str] = []
    with pytest.raises(openai.APIError) as info:
        for chunk in sdk.chat.completions.create(model="default", messages=MESSAGES, stream=True):
            if chunk.choices:
                received.append(chunk.choices[0].delta.content or "")

    assert "".join(received) == "The quick"
    assert info.value.code == "timeout"
    assert seen(fake_upstream) == {"openai": 1, "anthropic": 0, "gemini": 0}
    row = RoutingDecision.objects.get().attempts.get()
    assert (row.provider, row.error_category, row.partial) == ("oc", "timeout", True)


@pytest.mark.django_db(transaction=True)
def test_sdk_slow_first_token_fails_over_to_the_next_candidate(
    sdk: openai.OpenAI, fake_upstream: FakeUpstream, upstream_chain: Chainer
) -> None:
    two_vendor_chain(upstream_chain, first={"first_token_timeout_s": 0.3})
    fake_upstream.script("openai", Faults.stream(text=TEXT, first_chunk_delay=10))
    fake_upstream.script("anthropic", Faults.stream(text=FALLBACK_TEXT))

    text, models, _ = sdk_stream(sdk)

    assert text == FALLBACK_TEXT
    assert models == {"claude-x"}  # the model that served, never the chain name
    assert seen(fake_upstream) == {"openai": 1, "anthropic": 1, "gemini": 0}  # no retry
    decision = RoutingDecision.objects.get()
    assert attempt_rows(str(decision.request_id)) == [
        ("oc", "error", "timeout", False),
        ("claude", "ok", "", False),
    ]


@pytest.mark.django_db(transaction=True)
def test_sdk_content_policy_is_an_error_without_failover(
    sdk: openai.OpenAI, fake_upstream: FakeUpstream, upstream_chain: Chainer
) -> None:
    two_vendor_chain(upstream_chain)
    fake_upstream.script("openai", Faults.content_policy("openai"))

    with pytest.raises(openai.BadRequestError) as info:
        sdk_stream(sdk)

    assert info.value.status_code == 400
    assert info.value.code == "content_policy_violation"
    assert seen(fake_upstream) == {"openai": 1, "anthropic": 0, "gemini": 0}


@pytest.mark.django_db(transaction=True)
def test_sdk_persistent_503_falls_back_and_reports_the_fallbacks_model(
    sdk: openai.OpenAI, fake_upstream: FakeUpstream, upstream_chain: Chainer
) -> None:
    two_vendor_chain(upstream_chain, first={"max_retries": 1})
    fake_upstream.script("openai", *[Faults.unavailable("openai", 503)] * 2)
    fake_upstream.script("anthropic", Faults.stream(text=FALLBACK_TEXT))

    raw = sdk.chat.completions.with_raw_response.create(
        model="default", messages=MESSAGES, stream=True
    )
    assert raw.headers["x-llm-provider"] == "claude"
    chunks = list(raw.parse())
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    assert text == FALLBACK_TEXT
    assert {c.model for c in chunks} == {"claude-x"}
    assert seen(fake_upstream) == {"openai": 2, "anthropic": 1, "gemini": 0}  # 1 retry
    decision = RoutingDecision.objects.get()
    assert decision.fallback_reason == "unavailable"
    assert attempt_rows(str(decision.request_id)) == [
        ("oc", "error", "unavailable", False),
        ("claude", "ok", "", False),
    ]
