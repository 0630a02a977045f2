"""Gemini adapter: chat requests (contents/parts with roles, systemInstruction,
inlineData/fileData, functionCall/functionResponse, functionDeclarations, toolConfig,
stopSequences/topP/seed) and tool-call answers, non-stream and stream, against the fake
upstream, asserting the exact request body."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from llm_routing import errors
from llm_routing.providers.base import HttpProvider
from llm_routing.types import ForcedTool, Message, StreamEnd, Tool, ToolCall, ToolCallDelta
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

DECLARATIONS = [
    {
        "functionDeclarations": [
            {
                "name": "get_weather",
                "description": "The weather in a city.",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}},
                    "required": ["city"],
                },
            },
            {"name": "get_time"},
        ]
    }
]


def test_conversation_tools_and_parameters_arrive_as_contents_and_parts(
    fake_upstream: FakeUpstream, make_adapter: MakeAdapter
) -> None:
    request = chat(
        messages=CONVERSATION,
        tools=(WEATHER, TIME),
        tool_choice=ForcedTool("get_weather"),
        stop=("END",),
        top_p=0.9,
        seed=7,
        user="user-42",  # no Gemini equivalent: dropped
        temperature=0.3,
        max_tokens=200,
    )
    make_adapter("gemini", params={"top_k": 3}).complete(request, api_key=KEY, timeout=5.0)
    (seen,) = fake_upstream.requests
    assert seen.path == "/v1beta/models/model-x:generateContent"
    assert seen.json == {
        "systemInstruction": {"parts": [{"text": "Be brief.\n\nAnswer in English."}]},
        "contents": [
            {
                "role": "user",
                "parts": [
                    {"text": "What is in this picture, and the weather?"},
                    {"inlineData": {"mimeType": "image/png", "data": "iVBORw0KGgoAAAANSUhEUg=="}},
                    {"fileData": {"fileUri": IMAGE_URL}},
                ],
            },
            {
                "role": "model",
                "parts": [
                    {"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}},
                    {"functionCall": {"name": "get_time", "args": {}}},
                ],
            },
            {  # consecutive results share one turn; names from the call or the turn
                "role": "user",
                "parts": [
                    {"functionResponse": {"name": "get_weather", "response": {"temp_c": 21}}},
                    {"functionResponse": {"name": "get_time", "response": {"result": "12:00"}}},
                ],
            },
            {"role": "model", "parts": [{"text": "A cat; 21 °C at noon."}]},
            {"role": "user", "parts": [{"text": "Thanks. And tomorrow?"}]},
        ],
        "tools": DECLARATIONS,
        "toolConfig": {
            "functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["get_weather"]}
        },
        "generationConfig": {
            "topK": 3,
            "temperature": 0.3,
            "maxOutputTokens": 200,
            "topP": 0.9,
            "stopSequences": ["END"],
            "seed": 7,
        },
    }


@pytest.mark.parametrize(
    ("choice", "mode"), [("auto", "AUTO"), ("required", "ANY"), ("none", "NONE")]
)
def test_tool_choice_words_map_to_function_calling_modes(
    choice: str, mode: str, fake_upstream: FakeUpstream, make_adapter: MakeAdapter
) -> None:
    request = chat(messages=FOUR_TURNS, tools=(WEATHER,), tool_choice=choice)
    make_adapter("gemini").complete(request, api_key=KEY, timeout=5.0)
    body = fake_upstream.requests[0].json
    assert body["toolConfig"] == {"functionCallingConfig": {"mode": mode}}
    assert body["contents"] == [
        {"role": "user", "parts": [{"text": "Hi."}]},
        {"role": "model", "parts": [{"text": "Hello!"}]},
        {"role": "user", "parts": [{"text": "Weather in Paris?"}]},
        {"role": "model", "parts": [{"text": "Let me check."}]},
    ]


@pytest.mark.parametrize(
    ("content", "response"),
    [
        ("[1, 2]", {"result": [1, 2]}),
        ("42", {"result": 42}),
        ('{"ok": true}', {"ok": True}),
        ("plain text", {"result": "plain text"}),
    ],
)
def test_tool_results_become_response_objects(
    content: str, response: object, fake_upstream: FakeUpstream, make_adapter: MakeAdapter
) -> None:
    messages = (
        Message(role="user", content="Hi."),
        Message(role="assistant", content="On it.", tool_calls=(ToolCall("x1", "get_time"),)),
        Message(role="tool", content=content, tool_call_id="x1"),
    )
    make_adapter("gemini").complete(chat(messages=messages), api_key=KEY, timeout=5)
    contents = fake_upstream.requests[0].json["contents"]
    assert contents[1] == {
        "role": "model",
        "parts": [{"text": "On it."}, {"functionCall": {"name": "get_time", "args": {}}}],
    }
    assert contents[2] == {
        "role": "user",
        "parts": [{"functionResponse": {"name": "get_time", "response": response}}],
    }


def test_a_tool_result_whose_name_cannot_be_found_is_an_invalid_request(
    fake_upstream: FakeUpstream, make_adapter: MakeAdapter
) -> None:
    messages = (
        Message(role="user", content="Hi."),
        Message(role="tool", content="1", tool_call_id="?"),
    )
    with pytest.raises(errors.InvalidRequestError, match="name"):
        make_adapter("gemini").complete(chat(messages=messages), api_key=KEY, timeout=5)
    assert fake_upstream.requests == []


def test_function_call_answer_is_normalized_and_the_round_trip_ends_in_text(
    fake_upstream: FakeUpstream, make_adapter: MakeAdapter
) -> None:
    adapter = make_adapter("gemini")
    first = adapter.complete(
        chat(messages=FOUR_TURNS[:3], tools=(WEATHER,)), api_key=KEY, timeout=5
    )
    # Gemini sent no id: a deterministic one.
    assert first.tool_calls == (ToolCall("call_0", "get_weather", '{"city":"mock"}'),)
    assert first.finish_reason == "STOP" and first.output == ""
    follow_up = (
        *FOUR_TURNS[:3],
        Message(role="assistant", tool_calls=first.tool_calls),
        Message(role="tool", content='{"temp_c": 21}', tool_call_id="call_0"),
    )
    final = adapter.complete(chat(messages=follow_up, tools=(WEATHER,)), api_key=KEY, timeout=5)
    assert final.tool_calls == () and final.output.startswith("fake answer")
    assert fake_upstream.requests[1].json["contents"][-2:] == [
        {
            "role": "model",
            "parts": [{"functionCall": {"name": "get_weather", "args": {"city": "mock"}}}],
        },
        {
            "role": "user",
            "parts": [{"functionResponse": {"name": "get_weather", "response": {"temp_c": 21}}}],
        },
    ]


def test_function_call_ids_are_kept_when_gemini_sends_them(
    fake_upstream: FakeUpstream, make_adapter: MakeAdapter
) -> None:
    calls = [
        {"id": "fc_9", "name": "get_weather", "arguments": {"city": "Rome"}},
        {"name": "get_time", "arguments": {}},
    ]
    fake_upstream.script("gemini", Fault(tool_calls=calls))
    result = make_adapter("gemini").complete(
        chat(messages=FOUR_TURNS[:1], tools=(WEATHER, TIME)), api_key=KEY, timeout=5
    )
    assert result.tool_calls == (
        ToolCall("fc_9", "get_weather", '{"city":"Rome"}'),
        ToolCall("call_1", "get_time", "{}"),
    )


def test_empty_parameters_are_left_out_and_schemas_are_reduced(
    fake_upstream: FakeUpstream, make_adapter: MakeAdapter
) -> None:
    tool = Tool(
        name="lookup",
        parameters={
            "type": "object",
            "properties": {"q": {"type": ["string", "null"]}},
            "additionalProperties": False,
        },
    )
    make_adapter("gemini").complete(
        chat(messages=FOUR_TURNS[:1], tools=(tool, TIME, EMPTY), tool_choice="none"),
        api_key=KEY,
        timeout=5,
    )
    assert fake_upstream.requests[0].json["tools"] == [
        {
            "functionDeclarations": [
                {
                    "name": "lookup",
                    "parameters": {
                        "type": "object",
                        "properties": {"q": {"type": "string", "nullable": True}},
                    },
                },
                {"name": "get_time"},
                {"name": "no_args"},  # Gemini rejects an object without properties
            ]
        }
    ]


EMPTY = Tool(name="no_args", parameters={"type": "object", "properties": {}})


# --- streaming ------------------------------------------------------------------------
TWO_CALLS = [
    {"id": "fc_a", "name": "get_weather", "arguments": {"city": "Paris"}},
    {"name": "get_time", "arguments": {}},
]


def test_streamed_function_calls_arrive_whole_one_fragment_each(
    fake_upstream: FakeUpstream, make_adapter: MakeAdapter
) -> None:
    fake_upstream.script("gemini", Fault(tool_calls=TWO_CALLS))
    request = chat(messages=FOUR_TURNS[:3], tools=(WEATHER, TIME), stream=True)
    events = list(stream_events(make_adapter("gemini"), request))
    assert items_of(events) == [
        ToolCallDelta(0, "fc_a", "get_weather", '{"city":"Paris"}'),
        ToolCallDelta(1, "call_1", "get_time", "{}"),
    ]
    end = events[-1]
    assert isinstance(end, StreamEnd)
    assert (end.finish_reason, end.model) == ("STOP", "model-x-fake")
    assert end.tool_calls == (
        ToolCall("fc_a", "get_weather", '{"city":"Paris"}'),
        ToolCall("call_1", "get_time", "{}"),
    )
    assert fake_upstream.requests[0].path.endswith(":streamGenerateContent")


def test_stream_cut_between_function_calls_has_no_end(
    fake_upstream: FakeUpstream, make_adapter: MakeAdapter
) -> None:
    fake_upstream.script("gemini", Fault(tool_calls=TWO_CALLS, stream=StreamScript(cut_after=1)))
    request = chat(messages=FOUR_TURNS[:3], tools=(WEATHER, TIME), stream=True)
    events = list(stream_events(make_adapter("gemini"), request))
    assert items_of(events) == [ToolCallDelta(0, "fc_a", "get_weather", '{"city":"Paris"}')]
    assert not any(isinstance(e, StreamEnd) for e in events)
