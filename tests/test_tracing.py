"""OpenTelemetry spans, read from the SDK's in-memory exporter: one request span, one
child per attempt with the GenAI attributes, skips as events, the incoming traceparent
continued, and no prompt or key anywhere in a span."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from rest_framework.test import APIClient

from llm_routing import tracing
from tests.fakes.upstream import FakeUpstream, Faults
from tests.support import clean_env, python

pytestmark = pytest.mark.django_db

CANARY_PROMPT = "CANARY-PROMPT-7f3a9c1e"
CANARY_KEY = "sk-CANARY-KEY-0b5d2e8f4a"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


class _Switch(SpanProcessor):
    """Hands finished spans to the current test's exporter (none between tests)."""

    exporter: InMemorySpanExporter | None = None

    def on_end(self, span: ReadableSpan) -> None:
        if self.exporter is not None:
            self.exporter.export([span])


_SWITCH = _Switch()


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(_SWITCH)
        trace.set_tracer_provider(provider)
    monkeypatch.setenv("TEST_PROVIDER_KEY", CANARY_KEY)
    exporter = InMemorySpanExporter()
    _SWITCH.exporter = exporter
    try:
        yield exporter
    finally:
        _SWITCH.exporter = None


def no_canary(span: ReadableSpan) -> None:
    texts = [span.name, *map(str, span.attributes.values())]
    for event in span.events:
        texts += [event.name, *map(str, event.attributes.values())]
    for text in texts:
        assert CANARY_PROMPT not in text and CANARY_KEY not in text, text


def test_one_request_span_one_child_per_attempt(
    api: APIClient,
    spans: InMemorySpanExporter,
    fake_upstream: FakeUpstream,
    upstream_chain: Callable[..., list[Any]],
) -> None:
    upstream_chain(
        ("oa", "openai", {"model": "gpt-4o-mini"}),
        ("dis", "openai", {"model": "gpt-4o", "enabled": False}),
        ("an", "anthropic", {"model": "claude-3-5-haiku-latest"}),
    )
    fake_upstream.script("openai", *[Faults.unavailable("openai", 503)] * 3)
    response = api.post(
        "/audit/",
        {"task": "t", "input_text": CANARY_PROMPT},
        format="json",
        HTTP_TRACEPARENT=f"00-{TRACE_ID}-{PARENT_ID}-01",
    )
    assert response.status_code == 200
    request_id = response.json()["request_id"]
    finished = spans.get_finished_spans()
    (root,) = [s for s in finished if s.name == "llm_routing.route"]
    children = sorted((s for s in finished if s is not root), key=lambda s: s.start_time or 0)
    assert len(finished) == 3 and len(children) == 2

    assert root.context is not None and root.parent is not None
    assert format(root.context.trace_id, "032x") == TRACE_ID  # the incoming trace goes on
    assert format(root.parent.span_id, "016x") == PARENT_ID
    assert root.attributes["llm_routing.request_id"] == request_id
    assert root.attributes["llm_routing.fallback_reason"] == "unavailable"
    assert [(e.name, dict(e.attributes)) for e in root.events] == [
        ("llm_routing.skip", {"gen_ai.provider.name": "dis", "llm_routing.reason": "disabled"})
    ]
    for child in children:
        assert child.parent is not None and child.parent.span_id == root.context.span_id
        assert child.kind == trace.SpanKind.CLIENT
        no_canary(child)
    no_canary(root)

    failed, served = (dict(c.attributes) for c in children)
    assert failed == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "oa",
        "gen_ai.request.model": "gpt-4o-mini",
        "gen_ai.response.model": "gpt-4o-mini",
        "gen_ai.usage.input_tokens": 0,
        "gen_ai.usage.output_tokens": 0,
        "error.type": "unavailable",
        "llm_routing.retries": 2,
        "llm_routing.request_id": request_id,
        "llm_routing.outcome": "error",
    }
    assert children[0].status.status_code == trace.StatusCode.ERROR
    assert served == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "an",
        "gen_ai.request.model": "claude-3-5-haiku-latest",
        "gen_ai.response.model": "claude-3-5-haiku-latest-fake",
        "gen_ai.usage.input_tokens": 12,
        "gen_ai.usage.output_tokens": 8,
        "llm_routing.retries": 0,
        "llm_routing.request_id": request_id,
        "llm_routing.outcome": "ok",
    }
    assert children[0].name == "chat gpt-4o-mini"
    # The children lie inside the request span, in order.
    assert root.start_time is not None and root.end_time is not None
    assert root.start_time <= children[0].start_time  # type: ignore[operator]
    assert children[0].end_time <= children[1].start_time  # type: ignore[operator]
    assert children[1].end_time <= root.end_time  # type: ignore[operator]


def test_a_stream_is_one_request_span_and_its_attempt(
    api: APIClient,
    spans: InMemorySpanExporter,
    fake_upstream: FakeUpstream,
    upstream_chain: Callable[..., list[Any]],
) -> None:
    upstream_chain(("oa", "openai", {"model": "gpt-4o-mini"}))
    response = api.post(
        "/audit/", {"task": "t", "input_text": CANARY_PROMPT, "stream": True}, format="json"
    )
    b"".join(response.streaming_content)  # type: ignore[attr-defined]
    finished = spans.get_finished_spans()
    assert sorted(s.name for s in finished) == ["chat gpt-4o-mini", "llm_routing.route"]
    root = next(s for s in finished if s.name == "llm_routing.route")
    child = next(s for s in finished if s is not root)
    assert root.attributes["llm_routing.stream"] is True
    assert root.attributes["llm_routing.request_id"] == response["X-Request-ID"]
    assert [e.name for e in child.events] == ["gen_ai.first_chunk"]
    assert child.attributes["gen_ai.usage.output_tokens"] > 0
    for span in finished:
        no_canary(span)


def test_without_a_traceparent_the_request_span_is_a_root(
    api: APIClient, spans: InMemorySpanExporter
) -> None:
    response = api.post("/audit/", {"task": "t", "input_text": "x"}, format="json")
    assert response.status_code == 200
    (root,) = [s for s in spans.get_finished_spans() if s.name == "llm_routing.route"]
    assert root.parent is None
    assert tracing.extract({"accept": "application/json"}) is None


def test_without_opentelemetry_tracing_is_a_no_op() -> None:
    code = (
        "import sys; sys.modules['opentelemetry'] = None\n"
        "import os; os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'tests.settings')\n"
        "import django; django.setup()\n"
        "from llm_routing import tracing\n"
        "assert not tracing.AVAILABLE and not tracing.enabled()\n"
        "assert tracing.extract({'traceparent': '00-"
        + TRACE_ID
        + "-"
        + PARENT_ID
        + "-01'}) is None\n"
        "with tracing.continued(None): pass\n"
        "print('ok')\n"
    )
    done = python("-c", code, env=clean_env())
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_a_sampled_out_request_writes_no_attempt_span(
    monkeypatch: pytest.MonkeyPatch, fake_upstream: FakeUpstream,
    upstream_chain: Callable[..., list[Any]],
) -> None:  # fmt: skip
    """A request span the sampler drops: no attempt span is started (their attributes
    are not even built); a recorded one gets its children (the same provider setup)."""
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON

    from llm_routing.router import route
    from llm_routing.types import AuditRequest

    upstream_chain(("oa", "openai", {"model": "gpt-4o-mini"}))
    monkeypatch.setenv("TEST_PROVIDER_KEY", CANARY_KEY)
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(_SWITCH)
        trace.set_tracer_provider(provider)  # tracing.enabled() reads the global one
    started: list[str] = []
    for sampler, expected, written in (
        (ALWAYS_OFF, ["llm_routing.route"], 0),
        (ALWAYS_ON, ["llm_routing.route", "chat"], 2),
    ):
        exporter = InMemorySpanExporter()
        own = TracerProvider(sampler=sampler)
        own.add_span_processor(SimpleSpanProcessor(exporter))
        tracer = own.get_tracer("test")
        real_start = tracer.start_span

        def start_span(name: str, *args: Any, _start: Any = real_start, **kwargs: Any) -> Any:
            started.append(name)
            return _start(name, *args, **kwargs)

        monkeypatch.setattr(tracer, "start_span", start_span)
        monkeypatch.setattr(tracing, "_tracer", lambda tracer=tracer: tracer)
        started.clear()
        routed = route(AuditRequest(task="t", input_text="x"))
        assert routed.result.ok
        assert [name.split(" ")[0] for name in started] == expected
        assert len(exporter.get_finished_spans()) == written


def test_an_embeddings_attempt_is_an_embeddings_operation(
    api: APIClient,
    spans: InMemorySpanExporter,
    fake_upstream: FakeUpstream,
    upstream_chain: Callable[..., list[Any]],
) -> None:
    upstream_chain(("oa", "openai", {"model": "text-embedding-3-small"}))
    response = api.post(
        "/v1/embeddings", {"model": "default", "input": CANARY_PROMPT}, format="json"
    )
    assert response.status_code == 200
    (child,) = [s for s in spans.get_finished_spans() if s.name != "llm_routing.route"]
    assert child.name == "embeddings text-embedding-3-small"
    assert child.attributes["gen_ai.operation.name"] == "embeddings"
    assert child.attributes["gen_ai.usage.input_tokens"] == 1
    no_canary(child)
