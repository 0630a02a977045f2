"""OpenAI and OpenAI-compatible adapters: chat requests (conversation, content parts,
tools, sampling parameters) and tool-call answers, non-stream and stream, against the
fake upstream (real HTTP), asserting the exact upstream request body."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from llm_routing import errors
from llm_routing.providers.base import BaseProvider, HttpProvider
from llm_routing.types import (
    ForcedTool,
    Message,
    StreamEnd,
    StreamToolCallDelta,
    ToolCall,
    ToolCallDelta,
    Usage,
)
from tests.chat_cases import (
    CONVERSATION,
    FOUR_TURNS,
    IMAGE_URL,
    KEY,
    PNG,
    TIME,
    WEATHER,
    chat,
    items_of,
    stream_events,
)
from tests.fakes.upstream import FakeUpstream, Fault, StreamScript

MakeAdapter = Callable[..., HttpProvider]
KINDS = ["openai", "openai_compatible"]

WEATHER_WIRE = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
TIME_WIRE = {"type": "function", "function": {"name": "get_time", "parameters": {}}}


def wire_conversation(developer_role: str) -> list[dict[str, object]]:
    return [
        {"role": "system", "content": "Be brief."},
        {"role": developer_role, "content": "Answer in English."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is in this picture, and the weather?"},
                {"type": "image_url", "image_url": {"url": PNG, "detail": "low"}},
                {"type": "image_url", "image_url": {"url": IMAGE_URL}},
            ],
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                },
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "get_time", "arguments": ""},
                },
            ],
        },
        {"role": "tool", "content": '{"temp_c": 21}', "tool_call_id": "call_1"},
        {"role": "tool", "content": "12:00", "tool_call_id": "call_2"},
        {"role": "assistant", "content": "A cat; 21 °C at noon."},
        {"role": "user", "content": "Thanks. And tomorrow?"},
    ]


@pytest.mark.parametrize("kind", KINDS)
def test_conversation_tools_and_parameters_arrive_in_openai_shape(
    kind: str, fake_upstream: FakeUpstream, make_adapter: MakeAdapter
) -> None:
    adapter = make_adapter(kind, model="gpt-x", params={"top_p": 0.5, "tools": ["row's"]})
    request = chat(
        messages=CONVERSATION,
        tools=(WEATHER, TIME),
        tool_choice=ForcedTool("get_weather"),
        stop=("END", "STOP"),
        top_p=0.9,
        seed=7,
        user="user-42",
        temperature=0.3,
        max_tokens=200,
    )
    adapter.complete(request, api_key=KEY, timeout=5.0)
    (seen,) = fake_upstream.requests
    max_key = "max_completion_tokens" if kind == "openai" else "max_tokens"
    assert seen.json == {
        "model": "gpt-x",
        # openai_compatible: local servers reject the newer developer role.
        "messages": wire_conversation("developer" if kind == "openai" else "system"),
        "tools": [WEATHER_WIRE, TIME_WIRE],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "stop": ["END", "STOP"],
        "top_p": 0.9,  # the request's value beats the row's params
        "seed": 7,
        "user": "user-42",
        "temperature": 0.3,
        max_key: 200,
    }


@pytest.mark.parametrize("choice", ["auto", "none", "required"])
def test_tool_choice_words_pass_through(
    choice: str, fake_upstream: FakeUpstream, make_adapter: MakeAdapter
) -> None:
    request = chat(messages=FOUR_TURNS[:3], tools=(WEATHER,), tool_choice=choice)
    make_adapter("openai").complete(request, api_key=KEY, timeout=5.0)
    body = fake_upstream.requests[0].json
    assert body["tool_choice"] == choice
    assert body["messages"] == [m.to_dict() for m in FOUR_TURNS[:3]]


def test_one_shot_request_keeps_its_shape_and_sends_no_chat_fields(
    fake_upstream: FakeUpstream, make_adapter: MakeAdapter
) -> None:
    request = chat(input_text="Long text.", instructions="Be brief.", prefill="It")
    make_adapter("openai").complete(request, api_key=KEY, timeout=5.0)
    assert fake_upstream.requests[0].json == {
        "model": "model-x",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Long text."},
            {"role": "assistant", "content": "It"},
        ],
    }


@pytest.mark.parametrize("kind", KINDS)
def test_tool_call_answer_is_normalized(
    kind: str, fake_upstream: FakeUpstream, make_adapter: MakeAdapter
) -> None:
    request = chat(messages=FOUR_TURNS[:3], tools=(WEATHER,))
    result = make_adapter(kind).complete(request, api_key=KEY, timeout=5.0)
    assert result.ok
    assert result.tool_calls == (ToolCall("call_fake_0", "get_weather", '{"city": "mock"}'),)
    assert result.finish_reason == "tool_calls"  # as the vendor sent it
    assert result.output == ""


def test_tool_result_turn_gets_the_final_text_answer(
    fake_upstream: FakeUpstream, make_adapter: MakeAdapter
) -> None:
    adapter = make_adapter("openai_compatible")
    first = adapter.complete(
        chat(messages=FOUR_TURNS[:3], tools=(WEATHER,)), api_key=KEY, timeout=5
    )
    (call,) = first.tool_calls
    follow_up = (
        *FOUR_TURNS[:3],
        Message(role="assistant", tool_calls=(call,)),
        Message(role="tool", content='{"temp_c": 21}', tool_call_id=call.id),
    )
    final = adapter.complete(chat(messages=follow_up, tools=(WEATHER,)), api_key=KEY, timeout=5)
    assert final.tool_calls == () and final.output.startswith("fake answer")
    assert final.finish_reason == "stop"
    assert fake_upstream.requests[1].json["messages"][-2:] == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_fake_0",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "mock"}'},
                }
            ],
        },
        {"role": "tool", "content": '{"temp_c": 21}', "tool_call_id": "call_fake_0"},
    ]


def test_compatible_server_quirks_in_tool_calls_are_normalized(
    fake_upstream: FakeUpstream, make_adapter: MakeAdapter
) -> None:
    message = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"function": {"name": "get_weather", "arguments": {"city": "Oslo"}}},
            {"id": "c9", "type": "function", "function": {"name": "get_time"}},
        ],
    }
    body = {"choices": [{"message": message, "finish_reason": "tool_calls"}]}
    fake_upstream.script("openai", Fault(body=body))
    result = make_adapter("openai_compatible").complete(
        chat(messages=FOUR_TURNS[:1], tools=(WEATHER, TIME)), api_key=KEY, timeout=5
    )
    assert result.tool_calls == (
        ToolCall("call_0", "get_weather", '{"city":"Oslo"}'),
        ToolCall("c9", "get_time", "{}"),
    )


def test_tool_call_without_a_name_is_a_response_error(
    fake_upstream: FakeUpstream, make_adapter: MakeAdapter
) -> None:
    message = {"role": "assistant", "tool_calls": [{"id": "c1", "function": {"arguments": "{}"}}]}
    fake_upstream.script("openai", Fault(body={"choices": [{"message": message}]}))
    with pytest.raises(errors.ResponseError, match="no function name"):
        make_adapter("openai").complete(chat(messages=FOUR_TURNS[:1]), api_key=KEY, timeout=5)


def test_structured_request_answered_with_a_tool_call_is_not_validated_as_text(
    fake_upstream: FakeUpstream, make_adapter: MakeAdapter
) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
    request = chat(messages=FOUR_TURNS[:1], tools=(WEATHER,), response_schema=schema)
    result = make_adapter("openai").complete(request, api_key=KEY, timeout=5)
    assert result.data is None and len(result.tool_calls) == 1


# --- streaming ------------------------------------------------------------------------
TWO_CALLS = [
    {"id": "call_a", "name": "get_weather", "arguments": {"city": "Paris"}},
    {"id": "call_b", "name": "get_time", "arguments": {}},
]


@pytest.mark.parametrize("kind", KINDS)
def test_streamed_tool_call_fragments_are_forwarded_and_assembled(
    kind: str, fake_upstream: FakeUpstream, make_adapter: MakeAdapter
) -> None:
    fake_upstream.script("openai", Fault(tool_calls=TWO_CALLS))
    request = chat(messages=FOUR_TURNS[:3], tools=(WEATHER, TIME), stream=True)
    events = list(stream_events(make_adapter(kind), request))
    assert items_of(events) == [
        ToolCallDelta(0, "call_a", "get_weather", ""),
        ToolCallDelta(0, arguments='{"city":'),
        ToolCallDelta(0, arguments=' "Paris"'),
        ToolCallDelta(0, arguments="}"),
        ToolCallDelta(1, "call_b", "get_time", ""),
        ToolCallDelta(1, arguments="{}"),
    ]
    assert events[-1] == StreamEnd(
        finish_reason="tool_calls",
        usage=Usage(11, 6),
        model="model-x-2024-fake",
        tool_calls=(
            ToolCall("call_a", "get_weather", '{"city": "Paris"}'),
            ToolCall("call_b", "get_time", "{}"),
        ),
    )
    body = fake_upstream.requests[0].json
    assert body["stream"] is True and body["tools"] == [WEATHER_WIRE, TIME_WIRE]


def test_stream_cut_inside_tool_call_arguments_has_no_end(
    fake_upstream: FakeUpstream, make_adapter: MakeAdapter
) -> None:
    fake_upstream.script("openai", Fault(tool_calls=TWO_CALLS, stream=StreamScript(cut_after=2)))
    request = chat(messages=FOUR_TURNS[:3], tools=(WEATHER, TIME), stream=True)
    events = list(stream_events(make_adapter("openai"), request))  # a clean cut: no error
    assert items_of(events) == [
        ToolCallDelta(0, "call_a", "get_weather", ""),
        ToolCallDelta(0, arguments='{"city":'),
    ]
    assert not any(isinstance(e, StreamEnd) for e in events)  # never presented as complete


def test_a_server_ignoring_stream_answers_tool_calls_in_one_piece(
    fake_upstream: FakeUpstream, make_adapter: MakeAdapter
) -> None:
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}
        ],
    }
    body = {"model": "local", "choices": [{"message": message, "finish_reason": "tool_calls"}]}
    fake_upstream.script("openai", Fault(body=body))
    request = chat(messages=FOUR_TURNS[:1], tools=(TIME,), stream=True)
    events = list(stream_events(make_adapter("openai_compatible"), request))
    call = ToolCall("c1", "get_time", "{}")
    assert events == [
        _delta(0, call),
        StreamEnd("tool_calls", Usage(0, 0), "local", tool_calls=(call,)),
    ]


def test_default_stream_of_a_whole_answer_emits_each_tool_call(
    fake_upstream: FakeUpstream, make_adapter: MakeAdapter
) -> None:
    fake_upstream.script("openai", Fault(tool_calls=TWO_CALLS))
    adapter = make_adapter("openai")
    request = chat(messages=FOUR_TURNS[:1], tools=(WEATHER, TIME))
    events = list(BaseProvider.stream(adapter, request, api_key=KEY, timeout=5.0))
    calls = (
        ToolCall("call_a", "get_weather", '{"city": "Paris"}'),
        ToolCall("call_b", "get_time", "{}"),
    )
    assert events[:2] == [_delta(0, calls[0]), _delta(1, calls[1])]
    assert isinstance(events[2], StreamEnd) and events[2].tool_calls == calls
    assert len(events) == 3
    assert json.loads(calls[0].arguments) == {"city": "Paris"}


def _delta(index: int, call: ToolCall) -> StreamToolCallDelta:
    return StreamToolCallDelta(ToolCallDelta(index, call.id, call.name, call.arguments))
