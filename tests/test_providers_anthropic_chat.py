"""Anthropic Messages adapter: chat requests (system split out, image blocks, tool_use /
tool_result blocks, tools, tool_choice, stop_sequences, metadata) and tool-call answers,
non-stream and stream, against the fake upstream, asserting the exact request body."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from llm_routing import errors
from llm_routing.providers.base import HttpProvider
from llm_routing.types import (
    ContentPart,
    ForcedTool,
    Message,
    StreamEnd,
    ToolCall,
    ToolCallDelta,
    Usage,
)
from tests.chat_cases import (
    CONVERSATION,
    FOUR_TURNS,
    IMAGE_URL,
    KEY,
    TIME,
    WEATHER,
    chat,
    items_of,
    stream_events,
)
from tests.fakes.upstream import FakeUpstream, Fault, StreamScript

MakeAdapter = Callable[..., HttpProvider]

WEATHER_WIRE = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
TIME_WIRE = {"name": "get_time", "input_schema": {"type": "object", "properties": {}}}
SCHEMA = {"type": "object", "properties": {"label": {"type": "string"}}, "required": ["label"]}


def test_conversation_tools_and_parameters_arrive_in_messages_api_shape(
    fake_upstream: FakeUpstream, make_adapter: MakeAdapter
) -> None:
    request = chat(
        messages=CONVERSATION,
        tools=(WEATHER, TIME),
        tool_choice=ForcedTool("get_weather"),
        stop=("END",),
        top_p=0.9,
        seed=7,  # no Anthropic equivalent: dropped
        user="user-42",
        temperature=0.3,
        max_tokens=200,
    )
    make_adapter("anthropic", model="claude-x").complete(request, api_key=KEY, timeout=5.0)
    (seen,) = fake_upstream.requests
    assert seen.json == {
        "model": "claude-x",
        "max_tokens": 200,
        "system": "Be brief.\n\nAnswer in English.",  # system and developer turns
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is in this picture, and the weather?"},
                    {
                        "type": "image",
                        "source": {
                            "type": "base64",
                            "media_type": "image/png",
                            "data": "iVBORw0KGgoAAAANSUhEUg==",
                        },
                    },
                    {"type": "image", "source": {"type": "url", "url": IMAGE_URL}},
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "tool_use",
                        "id": "call_1",
                        "name": "get_weather",
                        "input": {"city": "Paris"},
                    },
                    {"type": "tool_use", "id": "call_2", "name": "get_time", "input": {}},
                ],
            },
            {  # consecutive tool results: one user turn
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "call_1", "content": '{"temp_c": 21}'},
                    {"type": "tool_result", "tool_use_id": "call_2", "content": "12:00"},
                ],
            },
            {"role": "assistant", "content": "A cat; 21 °C at noon."},
            {"role": "user", "content": "Thanks. And tomorrow?"},
        ],
        "tools": [WEATHER_WIRE, TIME_WIRE],
        "tool_choice": {"type": "tool", "name": "get_weather"},
        "stop_sequences": ["END"],
        "top_p": 0.9,
        "metadata": {"user_id": "user-42"},
        "temperature": 0.3,
    }


@pytest.mark.parametrize(
    ("choice", "wire"),
    [("auto", {"type": "auto"}), ("required", {"type": "any"}), ("none", {"type": "none"})],
)
def test_tool_choice_words_map_to_anthropic_types(
    choice: str, wire: dict[str, str], fake_upstream: FakeUpstream, make_adapter: MakeAdapter
) -> None:
    request = chat(messages=FOUR_TURNS[:3], tools=(WEATHER,), tool_choice=choice)
    make_adapter("anthropic").complete(request, api_key=KEY, timeout=5.0)
    body = fake_upstream.requests[0].json
    assert body["tool_choice"] == wire
    assert body["messages"] == [
        {"role": "user", "content": "Hi."},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Weather in Paris?"},
    ]
    assert "system" not in body


def test_a_user_turn_after_tool_results_joins_their_turn_and_text_precedes_tool_use(
    fake_upstream: FakeUpstream, make_adapter: MakeAdapter
) -> None:
    messages = (
        Message(role="user", content="Weather?"),
        Message(role="assistant", content="Checking.", tool_calls=(ToolCall("t1", "get_weather"),)),
        Message(
            role="tool",
            content=(ContentPart(type="text", text="sunny"),),
            tool_call_id="t1",
        ),
        Message(role="user", content="And now?"),
    )
    make_adapter("anthropic").complete(
        chat(messages=messages, tools=(WEATHER,)), api_key=KEY, timeout=5.0
    )
    assert fake_upstream.requests[0].json["messages"] == [
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "t1",
                    "content": [{"type": "text", "text": "sunny"}],
                },
                {"type": "text", "text": "And now?"},
            ],
        },
    ]


@pytest.mark.parametrize(
    ("arguments", "problem"), [("{not json", "not valid JSON"), ("[1, 2]", "not a JSON object")]
)
def test_tool_call_arguments_that_are_no_json_object_are_an_invalid_request(
    arguments: str, problem: str, fake_upstream: FakeUpstream, make_adapter: MakeAdapter
) -> None:
    messages = (
        Message(role="user", content="Hi."),
        Message(role="assistant", tool_calls=(ToolCall("t1", "get_weather", arguments),)),
        Message(role="tool", content="x", tool_call_id="t1"),
    )
    with pytest.raises(errors.InvalidRequestError, match=problem):
        make_adapter("anthropic").complete(chat(messages=messages), api_key=KEY, timeout=5)
    assert fake_upstream.requests == []  # never sent


def test_image_url_that_is_neither_http_nor_data_is_an_invalid_request(
    fake_upstream: FakeUpstream, make_adapter: MakeAdapter
) -> None:
    part = ContentPart(type="image_url", image_url="file:///etc/passwd")
    with pytest.raises(errors.InvalidRequestError, match="http"):
        make_adapter("anthropic").complete(
            chat(messages=(Message(role="user", content=(part,)),)), api_key=KEY, timeout=5
        )


def test_tool_use_answer_is_normalized_and_the_round_trip_ends_in_text(
    fake_upstream: FakeUpstream, make_adapter: MakeAdapter
) -> None:
    adapter = make_adapter("anthropic")
    first = adapter.complete(
        chat(messages=FOUR_TURNS[:3], tools=(WEATHER,)), api_key=KEY, timeout=5
    )
    assert first.tool_calls == (ToolCall("toolu_fake_0", "get_weather", '{"city":"mock"}'),)
    assert first.finish_reason == "tool_use" and first.output == ""
    follow_up = (
        *FOUR_TURNS[:3],
        Message(role="assistant", tool_calls=first.tool_calls),
        Message(role="tool", content="21 C", tool_call_id="toolu_fake_0"),
    )
    final = adapter.complete(chat(messages=follow_up, tools=(WEATHER,)), api_key=KEY, timeout=5)
    assert final.tool_calls == () and final.output.startswith("fake answer")
    assert fake_upstream.requests[1].json["messages"][-2:] == [
        {
            "role": "assistant",
            "content": [
                {
                    "type": "tool_use",
                    "id": "toolu_fake_0",
                    "name": "get_weather",
                    "input": {"city": "mock"},
                }
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_fake_0", "content": "21 C"}],
        },
    ]


def test_structured_output_with_tools_sends_both_and_requires_a_tool_call(
    fake_upstream: FakeUpstream, make_adapter: MakeAdapter
) -> None:
    adapter = make_adapter("anthropic")
    request = chat(messages=FOUR_TURNS[:3], tools=(WEATHER,), response_schema=SCHEMA)
    first = adapter.complete(request, api_key=KEY, timeout=5)
    body = fake_upstream.requests[0].json
    assert body["tools"] == [
        WEATHER_WIRE,
        {
            "name": "structured_output",
            "description": "Return the answer as this JSON object.",
            "input_schema": SCHEMA,
        },
    ]
    assert body["tool_choice"] == {"type": "any"}
    assert first.tool_calls[0].name == "get_weather" and first.data is None
    follow_up = (
        *FOUR_TURNS[:3],
        Message(role="assistant", tool_calls=first.tool_calls),
        Message(role="tool", content="21 C", tool_call_id=first.tool_calls[0].id),
    )
    final = adapter.complete(
        chat(messages=follow_up, tools=(WEATHER,), response_schema=SCHEMA), api_key=KEY, timeout=5
    )
    assert final.tool_calls == () and final.data == {"label": "mock"}


def test_structured_output_with_tool_choice_none_forces_the_structured_answer(
    fake_upstream: FakeUpstream, make_adapter: MakeAdapter
) -> None:
    request = chat(
        messages=FOUR_TURNS[:1], tools=(WEATHER,), tool_choice="none", response_schema=SCHEMA
    )
    result = make_adapter("anthropic").complete(request, api_key=KEY, timeout=5)
    assert fake_upstream.requests[0].json["tool_choice"] == {
        "type": "tool",
        "name": "structured_output",
    }
    assert result.data == {"label": "mock"}


def test_a_request_tool_named_structured_output_collides_with_a_schema(
    fake_upstream: FakeUpstream, make_adapter: MakeAdapter
) -> None:
    clash = WEATHER.__class__(name="structured_output")
    with pytest.raises(errors.InvalidRequestError, match="collides"):
        make_adapter("anthropic").complete(
            chat(messages=FOUR_TURNS[:1], tools=(clash,), response_schema=SCHEMA),
            api_key=KEY,
            timeout=5,
        )


# --- streaming ------------------------------------------------------------------------
TWO_CALLS = [
    {"id": "toolu_a", "name": "get_weather", "arguments": {"city": "Paris"}},
    {"id": "toolu_b", "name": "get_time", "arguments": {}},
]


def test_streamed_tool_use_blocks_become_tool_call_fragments(
    fake_upstream: FakeUpstream, make_adapter: MakeAdapter
) -> None:
    fake_upstream.script("anthropic", Fault(tool_calls=TWO_CALLS))
    request = chat(messages=FOUR_TURNS[:3], tools=(WEATHER, TIME), stream=True)
    events = list(stream_events(make_adapter("anthropic"), request))
    assert items_of(events) == [
        ToolCallDelta(0, "toolu_a", "get_weather", ""),
        ToolCallDelta(0, arguments='{"city":'),
        ToolCallDelta(0, arguments=' "Paris"'),
        ToolCallDelta(0, arguments="}"),
        ToolCallDelta(1, "toolu_b", "get_time", ""),
        ToolCallDelta(1, arguments="{}"),
    ]
    assert events[-1] == StreamEnd(
        finish_reason="tool_use",
        usage=Usage(12, 8),
        model="model-x-fake",
        tool_calls=(
            ToolCall("toolu_a", "get_weather", '{"city": "Paris"}'),
            ToolCall("toolu_b", "get_time", "{}"),
        ),
    )
    assert fake_upstream.requests[0].json["stream"] is True


def test_stream_cut_inside_tool_use_input_has_no_end(
    fake_upstream: FakeUpstream, make_adapter: MakeAdapter
) -> None:
    fake_upstream.script("anthropic", Fault(tool_calls=TWO_CALLS, stream=StreamScript(cut_after=2)))
    request = chat(messages=FOUR_TURNS[:3], tools=(WEATHER, TIME), stream=True)
    events = list(stream_events(make_adapter("anthropic"), request))
    assert items_of(events) == [
        ToolCallDelta(0, "toolu_a", "get_weather", ""),
        ToolCallDelta(0, arguments='{"city":'),
    ]
    assert not any(isinstance(e, StreamEnd) for e in events)


def test_structured_stream_with_tools_streams_the_call_then_the_structured_answer(
    fake_upstream: FakeUpstream, make_adapter: MakeAdapter
) -> None:
    adapter = make_adapter("anthropic")
    request = chat(messages=FOUR_TURNS[:3], tools=(WEATHER,), response_schema=SCHEMA, stream=True)
    events = list(stream_events(adapter, request))
    end = events[-1]
    assert isinstance(end, StreamEnd)  # not refused as invalid structured text
    assert end.tool_calls == (ToolCall("toolu_fake_0", "get_weather", '{"city": "mock"}'),)
    assert all(isinstance(i, ToolCallDelta) for i in items_of(events))
    follow_up = (
        *FOUR_TURNS[:3],
        Message(role="assistant", tool_calls=end.tool_calls),
        Message(role="tool", content="21 C", tool_call_id="toolu_fake_0"),
    )
    events = list(
        stream_events(
            adapter,
            chat(messages=follow_up, tools=(WEATHER,), response_schema=SCHEMA, stream=True),
        )
    )
    text = "".join(i for i in items_of(events) if isinstance(i, str))
    assert text == '{"label": "mock"}'  # the structured tool's input, streamed as text
    assert isinstance(events[-1], StreamEnd) and events[-1].tool_calls == ()
