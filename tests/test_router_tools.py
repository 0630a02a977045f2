"""The router with chat requests: capability skips, tool calls as complete answers,
streamed tool calls (assembled; a cut inside one is an error, never a half call), and
the mock backstop that /v1 turns off."""

from __future__ import annotations

import pytest

from llm_routing.errors import NetworkError
from llm_routing.router import route, route_stream
from llm_routing.types import (
    AuditRequest,
    ContentPart,
    Message,
    ProviderResult,
    StreamChunk,
    StreamEnd,
    StreamFailure,
    StreamResult,
    StreamToolCallDelta,
    Tool,
    ToolCall,
    ToolCallDelta,
)

from .conftest import make_chain, make_provider

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("driver")]

WEATHER = Tool(
    name="get_weather",
    description="Weather of a city",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}},
)
CONVERSATION = (
    Message(role="system", content="Be brief."),
    Message(role="user", content="Weather in Paris?"),
)
CALL = ToolCall(id="call_1", name="get_weather", arguments='{"city":"Paris"}')


def chat(**kwargs: object) -> AuditRequest:
    fields: dict[str, object] = {"task": "chat", "messages": CONVERSATION, "tools": (WEATHER,)}
    fields.update(kwargs)
    return AuditRequest(**fields)  # type: ignore[arg-type]


def tool_stream(*, cut_after: int | None = None) -> list[object]:
    steps: list[object] = [
        StreamToolCallDelta(ToolCallDelta(index=0, id="call_1", name="get_weather")),
        StreamToolCallDelta(ToolCallDelta(index=0, arguments='{"city"')),
        StreamToolCallDelta(ToolCallDelta(index=0, arguments=':"Paris"}')),
        StreamEnd(finish_reason="tool_calls", tool_calls=(CALL,)),
    ]
    if cut_after is not None:
        return [*steps[:cut_after], NetworkError("reset")]
    return steps


def test_a_provider_without_tools_is_skipped_as_unsupported(scripted, key_env):
    make_chain(
        "main",
        [make_provider("plain"), make_provider("tooled", supports_tools=True)],
        is_default=True,
    )
    routed = route(chat())
    assert routed.result.provider == "tooled"
    assert routed.metadata.skipped_providers == [{"provider": "plain", "reason": "unsupported"}]
    assert [name for name, _ in scripted.requests] == ["tooled"]


def test_images_need_the_images_capability(scripted, key_env):
    picture = Message(
        role="user",
        content=(
            ContentPart(type="text", text="What is this?"),
            ContentPart(type="image_url", image_url="https://example.com/cat.png"),
        ),
    )
    make_chain(
        "main",
        [make_provider("blind"), make_provider("seeing", supports_images=True)],
        is_default=True,
    )
    routed = route(AuditRequest(task="chat", messages=(picture,)))
    assert routed.result.provider == "seeing"
    assert routed.metadata.skipped_providers[0]["reason"] == "unsupported"


def test_a_tool_call_answer_is_complete_and_failover_keeps_the_request(scripted, key_env):
    scripted.scripts["a"] = [NetworkError("reset")]
    scripted.scripts["b"] = [
        ProviderResult(
            provider="",
            model="",
            mode="live",
            status="ok",
            tool_calls=(CALL,),
            finish_reason="tool_use",
        )
    ]
    make_chain(
        "main",
        [
            make_provider("a", supports_tools=True, max_retries=0),
            make_provider("b", supports_tools=True),
        ],
        is_default=True,
    )
    request = chat(tool_choice="required")
    routed = route(request)
    assert routed.result.ok and routed.result.output == ""
    assert routed.result.tool_calls == (CALL,)
    assert [name for name, _ in scripted.requests] == ["a", "b"]
    assert scripted.requests[1][1] == request  # the same conversation, tools and choice
    envelope = routed.to_dict()["result"]
    assert envelope["tool_calls"] == [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
        }
    ]
    assert envelope["finish_reason"] == "tool_use"  # the vendor's own value on /audit/


def test_streamed_tool_call_fragments_reach_the_caller_and_the_result(scripted, key_env):
    scripted.streams["a"] = [tool_stream()]
    make_chain(
        "main", [make_provider("a", supports_tools=True, supports_streaming=True)], is_default=True
    )
    events = list(route_stream(chat(stream=True)))
    fragments = [e.tool_call for e in events if isinstance(e, StreamChunk)]
    assert [f.arguments if f else None for f in fragments] == ["", '{"city"', ':"Paris"}']
    assert fragments[0] is not None and fragments[0].id == "call_1"
    end = events[-1]
    assert isinstance(end, StreamResult)
    assert end.routed.result.tool_calls == (CALL,)
    assert end.routed.result.finish_reason == "tool_calls"


def test_tool_calls_are_assembled_when_the_end_does_not_list_them(scripted, key_env):
    steps = tool_stream()
    steps[-1] = StreamEnd(finish_reason="tool_calls")
    scripted.streams["a"] = [steps]
    make_chain(
        "main", [make_provider("a", supports_tools=True, supports_streaming=True)], is_default=True
    )
    end = list(route_stream(chat(stream=True)))[-1]
    assert isinstance(end, StreamResult)
    assert end.routed.result.tool_calls == (CALL,)


@pytest.mark.parametrize("mode", ["direct", "continuation"])
def test_a_stream_cut_inside_a_tool_call_is_an_error_never_a_half_call(scripted, key_env, mode):
    # Text first, then a tool call cut half-way: not even continuation may go on.
    scripted.streams["a"] = [["Let me check. ", *tool_stream(cut_after=2)]]
    chain = make_chain(
        "main",
        [
            make_provider("a", supports_tools=True, supports_streaming=True, max_retries=0),
            make_provider("b", supports_tools=True, supports_streaming=True, supports_prefill=True),
        ],
        is_default=True,
    )
    chain.stream_mode = mode
    chain.save()
    events = list(route_stream(chat(stream=True)))
    end = events[-1]
    assert isinstance(end, StreamFailure)
    assert end.partial is True
    assert end.routed.result.tool_calls == ()
    assert end.routed.result.status == "error"
    assert [name for name, _ in scripted.requests] == ["a"]  # no continuation, no replay
    assert end.routed.metadata.attempts[-1].partial is True


def test_a_cut_before_the_first_fragment_fails_over(scripted, key_env):
    scripted.streams["a"] = [[NetworkError("reset")]]
    scripted.streams["b"] = [tool_stream()]
    make_chain(
        "main",
        [
            make_provider("a", supports_tools=True, supports_streaming=True, max_retries=0),
            make_provider("b", supports_tools=True, supports_streaming=True),
        ],
        is_default=True,
    )
    end = list(route_stream(chat(stream=True)))[-1]
    assert isinstance(end, StreamResult)
    assert end.routed.result.provider == "b"
    assert end.routed.result.tool_calls == (CALL,)


def test_without_backstop_an_exhausted_chain_is_an_error(scripted, key_env):
    make_chain("main", [make_provider("plain")], is_default=True)  # lacks tools
    routed = route(chat(backstop=False))
    assert routed.result.status == "error"
    assert routed.result.error is not None
    assert routed.result.error.category == "chain_exhausted"
    assert routed.metadata.chain == ("plain",)
    assert routed.metadata.skipped_providers == [{"provider": "plain", "reason": "unsupported"}]
    assert routed.metadata.fallback_reason == "chain_exhausted"
    # The same request with the backstop (POST /audit/'s contract) gets the mock.
    assert route(chat()).result.mode == "mock"


def test_a_chain_may_opt_into_the_backstop(scripted, key_env):
    chain = make_chain("main", [make_provider("plain")], is_default=True)
    chain.mock_backstop = True
    chain.save()
    routed = route(chat(backstop=False))
    assert routed.result.mode == "mock"
    assert routed.metadata.fallback_reason == "unsupported"


def test_without_backstop_failures_also_exhaust(scripted, key_env):
    scripted.scripts["a"] = [NetworkError("reset")]
    make_chain("main", [make_provider("a", max_retries=0)], is_default=True)
    routed = route(AuditRequest(task="t", input_text="x", backstop=False))
    assert routed.result.error is not None
    assert routed.result.error.category == "chain_exhausted"
    assert [a.reason for a in routed.metadata.attempts] == ["network"]


def test_a_forced_provider_names_the_missing_capability(scripted, key_env):
    make_provider("plain", supports_streaming=True)
    routed = route(chat(force_provider="plain"))
    assert routed.result.error is not None
    assert routed.result.error.category == "unsupported"
    assert "does not support tools" in routed.result.error.message
