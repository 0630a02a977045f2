"""POST /audit/ with a conversation: ``messages`` instead of ``input_text``, ``tools``
and ``tool_choice`` — validated by the shared chat serializers (strict, bounded), routed
as the same AuditRequest, recorded by length and hash only."""

from __future__ import annotations

import hashlib
import json

import pytest
from django.test import override_settings
from rest_framework.test import APIClient

from llm_routing.api.serializers import AuditRequestSerializer
from llm_routing.jobs import job_payload
from llm_routing.models import RoutingDecision
from llm_routing.service import build_request
from llm_routing.types import ForcedTool, ProviderResult, ToolCall

from .conftest import make_chain, make_provider

pytestmark = pytest.mark.django_db

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
TURNS = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 21}'},
]


def post(client: APIClient, body: object):
    return client.post("/audit/", data=json.dumps(body), content_type="application/json")


@pytest.fixture
def tooled(scripted, key_env):
    make_chain("main", [make_provider("a", supports_tools=True)], is_default=True)
    return scripted


def test_messages_are_routed_as_a_conversation(api, tooled):
    body = {"task": "chat", "messages": TURNS, "tools": [WEATHER], "tool_choice": "auto"}
    response = post(api, body)
    assert response.status_code == 200, response.json()
    assert response.json()["result"]["provider"] == "a"
    (_, request), *_ = tooled.requests
    assert [m.role for m in request.messages] == ["system", "user", "assistant", "tool"]
    assert request.messages[2].tool_calls[0].name == "get_weather"
    assert request.messages[3].name == "get_weather"  # taken from the call it answers
    assert request.tools[0].parameters["properties"]["city"] == {"type": "string"}
    assert request.tool_choice == "auto"
    assert request.input_text == ""
    canonical = json.dumps(
        [m.to_dict() for m in request.messages],
        ensure_ascii=False,
        sort_keys=True,
        separators=(",", ":"),
    )
    decision = RoutingDecision.objects.get()
    assert decision.input_length == len(canonical)
    assert decision.input_sha256 == hashlib.sha256(canonical.encode()).hexdigest()


def test_tool_calls_appear_in_the_envelope(api, tooled):
    tooled.scripts["a"] = [
        ProviderResult(
            provider="",
            model="",
            mode="live",
            status="ok",
            tool_calls=(ToolCall(id="call_9", name="get_weather", arguments='{"city":"Oslo"}'),),
            finish_reason="tool_use",
        )
    ]
    body = {"task": "chat", "messages": TURNS[:2], "tools": [WEATHER]}
    result = post(api, body).json()["result"]
    assert result["tool_calls"] == [
        {
            "id": "call_9",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'},
        }
    ]
    assert result["finish_reason"] == "tool_use"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"task": "chat"}, "input_text"),
        ({"task": "chat", "input_text": "x", "messages": TURNS[:2]}, "input_text"),
        ({"task": "chat", "messages": []}, "messages"),
        ({"task": "chat", "messages": "hello"}, "messages"),
        ({"task": "chat", "messages": [{"role": "robot", "content": "x"}]}, "messages"),
        ({"task": "chat", "messages": [{"role": "user", "content": 5}]}, "messages"),
        ({"task": "chat", "messages": [{"role": "system", "content": "only"}]}, "messages"),
        ({"task": "chat", "messages": [{"role": "user", "content": "x", "extra": 1}]}, "messages"),
        (
            {
                "task": "chat",
                "messages": [{"role": "user", "content": [{"type": "audio", "data": "x"}]}],
            },
            "messages",
        ),
        ({"task": "chat", "input_text": "x", "stream": "yes"}, "stream"),
        ({"task": "chat", "input_text": "x", "async": 1}, "async"),
        ({"task": "chat", "input_text": "x", "tool_choice": "auto"}, "tool_choice"),
        (
            {
                "task": "chat",
                "input_text": "x",
                "tools": [WEATHER],
                "tool_choice": {"type": "function", "function": {"name": "nope"}},
            },
            "tool_choice",
        ),
        (
            {
                "task": "chat",
                "input_text": "x",
                "tools": [{"type": "function", "function": {"name": "f", "parameters": 3}}],
            },
            "tools",
        ),
        (
            {
                "task": "chat",
                "input_text": "x",
                "tools": [
                    {"type": "function", "function": {"name": "f", "parameters": {"type": 12}}}
                ],
            },
            "tools",
        ),
        ({"task": "chat", "input_text": "x", "tools": [WEATHER, WEATHER]}, "tools"),
    ],
)
def test_bad_chat_input_is_a_400_naming_the_field(api, tooled, body, field):
    response = post(api, body)
    assert response.status_code == 400, response.json()
    assert field in response.json()
    assert RoutingDecision.objects.count() == 0


def test_a_tool_turn_must_answer_an_earlier_call(api, tooled):
    turns = [TURNS[1], {"role": "tool", "tool_call_id": "call_404", "content": "{}"}]
    response = post(api, {"task": "chat", "messages": turns})
    assert response.status_code == 400
    assert "earlier" in response.json()["messages"]["1"]["tool_call_id"][0]
    # Answering before the call is made is refused too.
    response = post(api, {"task": "chat", "messages": [TURNS[1], TURNS[3], TURNS[2]]})
    assert response.status_code == 400
    assert "tool_call_id" in response.json()["messages"]["1"]


def test_tool_call_arguments_must_be_a_json_object(api, tooled):
    bad = json.loads(json.dumps(TURNS))
    bad[2]["tool_calls"][0]["function"]["arguments"] = "not json"
    response = post(api, {"task": "chat", "messages": bad})
    assert response.status_code == 400
    assert "tool_calls.0.function.arguments" in response.json()["messages"]["2"]


@override_settings(LLM_ROUTING={"MAX_MESSAGES": 3, "MAX_INPUT_CHARS": 400})
def test_conversation_bounds_come_from_settings(api, tooled):
    response = post(api, {"task": "chat", "messages": TURNS})
    assert response.status_code == 400
    assert "At most 3 messages" in response.json()["messages"][0]
    long_turns = [{"role": "user", "content": "x" * 150}, {"role": "assistant", "content": "y"}]
    long_turns.append({"role": "user", "content": "z" * 250})
    response = post(api, {"task": "chat", "messages": long_turns})
    assert response.status_code == 400
    assert "too long" in response.json()["messages"][0]


def test_images_are_parts_of_user_messages(api, scripted, key_env):
    make_chain(
        "main",
        [make_provider("blind"), make_provider("seeing", supports_images=True)],
        is_default=True,
    )
    picture = {
        "role": "user",
        "content": [
            {"type": "text", "text": "What is this?"},
            {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
        ],
    }
    response = post(api, {"task": "chat", "messages": [picture]})
    assert response.status_code == 200
    body = response.json()
    assert body["result"]["provider"] == "seeing"
    assert body["routing_metadata"]["skipped_providers"] == [
        {"provider": "blind", "reason": "unsupported"}
    ]
    not_a_url = json.loads(json.dumps(picture))
    not_a_url["content"][1]["image_url"]["url"] = "file:///etc/passwd"
    assert post(api, {"task": "chat", "messages": [not_a_url]}).status_code == 400


def test_an_async_job_keeps_the_conversation_as_json(tooled):
    body = {
        "task": "chat",
        "messages": TURNS,
        "tools": [WEATHER],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "async": True,
    }
    serializer = AuditRequestSerializer(data=body)
    assert serializer.is_valid(), serializer.errors
    payload = job_payload(serializer.validated_data)
    stored = json.loads(json.dumps(payload))  # what the JSONField holds
    rebuilt = build_request(**{k: v for k, v in stored.items() if v is not None})
    assert rebuilt == serializer.to_request()
    assert rebuilt.tool_choice == ForcedTool(name="get_weather")


@pytest.mark.parametrize(
    ("content", "place", "message"),
    [
        ("nul\x00byte", "content", "Null characters"),
        ([{"type": "text", "text": 5}], "content.0.text", "valid string"),
        ([{"type": "text", "text": "a\x00"}], "content.0.text", "Null characters"),
    ],
)
def test_bad_text_is_named_precisely(api, tooled, content, place, message):
    response = post(api, {"task": "chat", "messages": [{"role": "user", "content": content}]})
    assert response.status_code == 400
    assert message in response.json()["messages"]["0"][place][0]


def test_a_streamed_tool_call_on_audit(api, scripted, key_env):
    from llm_routing.types import StreamEnd, StreamToolCallDelta, ToolCallDelta

    call = ToolCall(id="call_1", name="get_weather", arguments='{"city":"Paris"}')
    scripted.streams["a"] = [
        [
            StreamToolCallDelta(ToolCallDelta(index=0, id="call_1", name="get_weather")),
            StreamToolCallDelta(ToolCallDelta(index=0, arguments='{"city":"Paris"}')),
            StreamEnd(finish_reason="tool_use", tool_calls=(call,)),
        ]
    ]
    make_chain(
        "main", [make_provider("a", supports_tools=True, supports_streaming=True)], is_default=True
    )
    body = {"task": "chat", "messages": TURNS[:2], "tools": [WEATHER], "stream": True}
    response = post(api, body)
    text = b"".join(response.streaming_content).decode()
    events = [
        (block.split("\n")[0].removeprefix("event: "), json.loads(block.split("data: ", 1)[1]))
        for block in text.strip().split("\n\n")
    ]
    assert [name for name, _ in events] == ["chunk", "chunk", "result"]
    assert events[0][1] == {
        "text": "",
        "tool_call": {
            "index": 0,
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": ""},
        },
    }
    assert events[1][1]["tool_call"]["function"] == {"arguments": '{"city":"Paris"}'}
    result = events[2][1]["result"]
    assert result["tool_calls"][0]["id"] == "call_1"
    assert result["finish_reason"] == "tool_use"


def test_a_message_that_is_not_an_object_is_named(api, tooled):
    response = post(api, {"task": "chat", "messages": [{"role": "user", "content": "hi"}, 7]})
    assert response.status_code == 400
    assert response.json()["messages"]["1"] == {"non_field_errors": ["Expected a message object."]}
