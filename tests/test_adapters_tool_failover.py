"""Tool requests through the router over real adapters and the fake upstream: a
conversation with tools fails over across vendor kinds intact, and a stream cut inside
a tool call's arguments after the commit point ends in an explicit failure — never a
half call presented as complete."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from llm_routing.router import route, route_stream
from llm_routing.types import (
    AuditRequest,
    Message,
    StreamChunk,
    StreamFailure,
    StreamResult,
    ToolCallDelta,
)
from tests.chat_cases import FOUR_TURNS, WEATHER
from tests.conftest import Sleeps
from tests.fakes.upstream import FakeUpstream, Fault, Faults, StreamScript

pytestmark = pytest.mark.django_db

TURNS = (Message(role="system", content="Be brief."), *FOUR_TURNS[:3])


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_PROVIDER_KEY", "sk-router-test-123456")


def request(**fields: Any) -> AuditRequest:
    return AuditRequest(task="chat", messages=TURNS, tools=(WEATHER,), **fields)


ANTHROPIC_BODY_TAIL = {
    "system": "Be brief.",
    "messages": [
        {"role": "user", "content": "Hi."},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Weather in Paris?"},
    ],
    "tools": [
        {
            "name": "get_weather",
            "description": "The weather in a city.",
            "input_schema": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        }
    ],
}


def test_openai_compatible_503_fails_over_to_anthropic_with_conversation_and_tools(
    fake_upstream: FakeUpstream, upstream_chain: Callable[..., list[Any]]
) -> None:
    upstream_chain(("oc", "openai_compatible", {"max_retries": 0}), ("an", "anthropic", {}))
    fake_upstream.script("openai", Faults.unavailable("openai"))
    routed = route(request(), sleeper=Sleeps())
    assert routed.result.provider == "an" and routed.result.ok
    assert [c.name for c in routed.result.tool_calls] == ["get_weather"]
    (oc,) = fake_upstream.requests_for("openai")
    assert oc.json["messages"] == [m.to_dict() for m in TURNS]
    (an,) = fake_upstream.requests_for("anthropic")
    assert {k: an.json[k] for k in ANTHROPIC_BODY_TAIL} == ANTHROPIC_BODY_TAIL


def test_stream_fails_over_before_the_commit_point_and_streams_the_tool_call(
    fake_upstream: FakeUpstream, upstream_chain: Callable[..., list[Any]]
) -> None:
    upstream_chain(
        ("oc", "openai_compatible", {"max_retries": 0, "supports_streaming": True}),
        ("an", "anthropic", {"supports_streaming": True}),
    )
    fake_upstream.script("openai", Faults.unavailable("openai"))
    events = list(route_stream(request(stream=True), sleeper=Sleeps()))
    fragments = [e.tool_call for e in events if isinstance(e, StreamChunk)]
    assert fragments == [
        ToolCallDelta(0, "toolu_fake_0", "get_weather", ""),
        ToolCallDelta(0, arguments='{"city":'),
        ToolCallDelta(0, arguments=' "mock"}'),
    ]
    assert all(e.provider == "an" for e in events if isinstance(e, StreamChunk))
    assert isinstance(events[-1], StreamResult) and events[-1].routed.result.ok
    (an,) = fake_upstream.requests_for("anthropic")
    assert {k: an.json[k] for k in ANTHROPIC_BODY_TAIL} == ANTHROPIC_BODY_TAIL


@pytest.mark.parametrize("kind", ["openai_compatible", "anthropic"])
def test_stream_cut_inside_tool_call_arguments_after_the_commit_point_is_a_failure(
    kind: str, fake_upstream: FakeUpstream, upstream_chain: Callable[..., list[Any]]
) -> None:
    upstream_chain((kind, kind, {"max_retries": 0, "supports_streaming": True}))
    vendor = "openai" if kind == "openai_compatible" else kind
    fake_upstream.script(vendor, Fault(stream=StreamScript(cut_after=2)))
    events = list(route_stream(request(stream=True), sleeper=Sleeps()))
    chunks = [e for e in events if isinstance(e, StreamChunk)]
    assert [c.tool_call is not None for c in chunks] == [True, True]  # start + one piece
    assert isinstance(events[-1], StreamFailure)  # an explicit failure, not a StreamResult
    assert events[-1].error.category == "response"
    assert len(fake_upstream.requests_for(vendor)) == 1  # nothing replayed


def test_a_failure_after_tool_call_fragments_is_partial(
    fake_upstream: FakeUpstream, upstream_chain: Callable[..., list[Any]]
) -> None:
    upstream_chain(("an", "anthropic", {"max_retries": 0, "supports_streaming": True}))
    fake_upstream.script("anthropic", Fault(stream=StreamScript(cut_after=2)))
    events = list(route_stream(request(stream=True), sleeper=Sleeps()))
    assert isinstance(events[-1], StreamFailure) and events[-1].partial
