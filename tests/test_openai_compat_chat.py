"""/v1 as a chat endpoint, driven by the official ``openai`` SDK over a live server:
conversations passed through, tool calls (whole and streamed), finish_reason in
OpenAI's values, a strict request, and 503 instead of a mock answer."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from rest_framework.authtoken.models import Token

from llm_routing.models import Chain, RoutingDecision
from llm_routing.types import (
    ProviderResult,
    StreamEnd,
    StreamToolCallDelta,
    ToolCall,
    ToolCallDelta,
    Usage,
)

from .conftest import make_chain, make_provider

pytestmark = pytest.mark.django_db(transaction=True)

TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather of a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
CALL = ToolCall(id="call_1", name="get_weather", arguments='{"city":"Paris"}')
CONVERSATION: list[Any] = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi, I am in Paris."},
    {"role": "assistant", "content": "Hello! How can I help?"},
    {"role": "user", "content": "What is the weather?"},
]


@pytest.fixture
def token(django_user_model) -> str:
    user = django_user_model.objects.create_user(username="sdk", password="pw-sdk-123")
    return Token.objects.create(user=user).key


@pytest.fixture
def client(live_server, token):
    with openai.OpenAI(base_url=f"{live_server.url}/v1", api_key=token, max_retries=0) as sdk:
        yield sdk


@pytest.fixture
def raw(live_server, token):
    def post(body: dict[str, Any]) -> httpx.Response:
        return httpx.post(
            f"{live_server.url}/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {token}"},
        )

    return post


@pytest.fixture
def scripted_chain(scripted, key_env):
    a = make_provider("a", supports_tools=True, supports_streaming=True, max_retries=0)
    make_chain("main", [a], is_default=True)
    return scripted


def answer(**fields: Any) -> ProviderResult:
    return ProviderResult(
        provider="", model="", mode="live", status="ok", usage=Usage(3, 4), **fields
    )


def test_the_conversation_is_passed_through_with_roles_and_order(client, scripted_chain):
    client.chat.completions.create(model="main", messages=CONVERSATION, temperature=0.3, seed=5)
    (_, request), *_ = scripted_chain.requests
    assert [m.to_dict() for m in request.messages] == CONVERSATION
    assert request.input_text == "" and request.instructions == ""
    assert (request.temperature, request.seed, request.backstop) == (0.3, 5, False)


def test_a_tool_call_answer(client, scripted_chain):
    scripted_chain.scripts["a"] = [answer(tool_calls=(CALL,), finish_reason="tool_use")]
    completion = client.chat.completions.create(
        model="main", messages=CONVERSATION, tools=TOOLS, tool_choice="auto"
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls or []
    assert (call.id, call.type, call.function.name) == ("call_1", "function", "get_weather")
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    (_, request), *_ = scripted_chain.requests
    assert request.tools[0].name == "get_weather" and request.tool_choice == "auto"


def test_a_tool_round_trip_sends_the_result_back(client, scripted_chain):
    scripted_chain.scripts["a"] = [
        answer(tool_calls=(CALL,), finish_reason="tool_use"),
        answer(output="21 °C and sunny.", finish_reason="end_turn"),
    ]
    messages: list[Any] = [{"role": "user", "content": "Weather in Paris?"}]
    first = client.chat.completions.create(model="main", messages=messages, tools=TOOLS)
    messages.append(first.choices[0].message.model_dump(exclude_none=True))
    call = first.choices[0].message.tool_calls[0]  # type: ignore[index]
    messages.append({"role": "tool", "tool_call_id": call.id, "content": '{"temp_c": 21}'})
    final = client.chat.completions.create(model="main", messages=messages, tools=TOOLS)
    assert final.choices[0].message.content == "21 °C and sunny."
    assert final.choices[0].finish_reason == "stop"
    _, request = scripted_chain.requests[-1]
    assert [m.role for m in request.messages] == ["user", "assistant", "tool"]
    assert request.messages[1].tool_calls == (CALL,)
    assert request.messages[2].tool_call_id == "call_1"


def test_streamed_tool_calls_are_delta_tool_calls_chunks(client, scripted_chain):
    scripted_chain.streams["a"] = [
        [
            StreamToolCallDelta(ToolCallDelta(index=0, id="call_1", name="get_weather")),
            StreamToolCallDelta(ToolCallDelta(index=0, arguments='{"city"')),
            StreamToolCallDelta(ToolCallDelta(index=0, arguments=':"Paris"}')),
            StreamEnd(finish_reason="tool_use", tool_calls=(CALL,)),
        ]
    ]
    chunks = list(
        client.chat.completions.create(
            model="main", messages=CONVERSATION, tools=TOOLS, stream=True
        )
    )
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert deltas[0].role == "assistant"
    fragments = [t for d in deltas for t in (d.tool_calls or [])]
    assert [f.index for f in fragments] == [0, 0, 0]
    assert fragments[0].id == "call_1" and fragments[0].type == "function"
    assert fragments[0].function is not None and fragments[0].function.name == "get_weather"
    assert "".join((f.function.arguments or "") for f in fragments if f.function) == (
        '{"city":"Paris"}'
    )
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"


def test_tool_calls_of_a_non_streaming_adapter_are_sent_whole(client, scripted_chain):
    # An adapter that only reports the calls in its StreamEnd (no fragments).
    scripted_chain.streams["a"] = [[StreamEnd(finish_reason="STOP", tool_calls=(CALL,))]]
    chunks = list(
        client.chat.completions.create(
            model="main", messages=CONVERSATION, tools=TOOLS, stream=True
        )
    )
    calls = [t for c in chunks if c.choices for t in (c.choices[0].delta.tool_calls or [])]
    assert [(t.index, t.id) for t in calls] == [(0, "call_1")]
    assert calls[0].function is not None and calls[0].function.arguments == '{"city":"Paris"}'
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize(
    ("vendor", "openai_value"),
    [
        ("end_turn", "stop"),
        ("STOP", "stop"),
        ("stop_sequence", "stop"),
        ("max_tokens", "length"),
        ("MAX_TOKENS", "length"),
        ("tool_use", "tool_calls"),
        ("functionCall", "tool_calls"),
        ("SAFETY", "content_filter"),
        ("refusal", "content_filter"),
        (None, "stop"),
        ("something_new", "stop"),
    ],
)
def test_finish_reason_is_normalized_on_v1_and_kept_on_audit(
    client, scripted_chain, live_server, token, vendor, openai_value
):
    scripted_chain.scripts["a"] = [answer(output="x", finish_reason=vendor)]
    scripted_chain.streams["a"] = [["x", StreamEnd(finish_reason=vendor)]]
    completion = client.chat.completions.create(model="main", messages=CONVERSATION)
    assert completion.choices[0].finish_reason == openai_value
    chunks = list(client.chat.completions.create(model="main", messages=CONVERSATION, stream=True))
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == openai_value
    envelope = httpx.post(
        f"{live_server.url}/audit/",
        json={"task": "chat", "messages": CONVERSATION},
        headers={"Authorization": f"Token {token}"},
    ).json()
    assert envelope["result"]["finish_reason"] == vendor  # the vendor's own value


@pytest.mark.parametrize(
    ("extra", "param", "code"),
    [
        ({"temperature": True}, "temperature", "invalid_value"),
        ({"temperature": "0.5"}, "temperature", "invalid_value"),
        ({"stream": "yes"}, "stream", "invalid_value"),
        ({"seed": 1.5}, "seed", "invalid_value"),
        ({"top_p": 2}, "top_p", "invalid_value"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "invalid_value"),
        ({"n": 2}, "n", "invalid_value"),
        ({"colour": "red"}, "colour", "unknown_parameter"),
        ({"logprobs": True}, "logprobs", "invalid_value"),
        ({"presence_penalty": 0.5}, "presence_penalty", "invalid_value"),
        ({"parallel_tool_calls": False}, "parallel_tool_calls", "invalid_value"),
        ({"functions": [{"name": "f"}]}, "functions", "invalid_value"),
        ({"tool_choice": "required"}, "tool_choice", "invalid_value"),
        ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools", None),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "t", "schema": {"type": 12}},
                }
            },
            "response_format.json_schema.schema",
            "invalid_value",
        ),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema", None),
        (
            {"messages": [{"role": "tool", "tool_call_id": "nope", "content": "x"}]},
            "messages.0.tool_call_id",
            "invalid_value",
        ),
    ],
)
def test_a_strict_request(raw, scripted_chain, extra, param, code):
    response = raw({"model": "main", "messages": CONVERSATION, **extra})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert error["param"].startswith(param), error
    if code:
        assert error["code"] == code
    assert RoutingDecision.objects.count() == 0


def test_neutral_values_of_unsupported_parameters_are_accepted(raw, scripted_chain):
    body = {
        "model": "main",
        "messages": CONVERSATION,
        "logprobs": False,
        "presence_penalty": 0,
        "frequency_penalty": 0.0,
        "parallel_tool_calls": True,
        "logit_bias": None,
        "store": False,
        "n": 1,
        "max_completion_tokens": 50,
        "user": "end-user-7",
        "stop": "END",
        "top_p": 0.9,
    }
    response = raw(body)
    assert response.status_code == 200, response.text
    (_, request), *_ = scripted_chain.requests
    assert (request.max_tokens, request.user, request.stop, request.top_p) == (
        50,
        "end-user-7",
        ("END",),
        0.9,
    )


def test_all_candidates_skipped_is_503_with_reasons_and_audit_keeps_the_mock(
    client, scripted, key_env, live_server, token
):
    make_chain(
        "plain",
        [make_provider("no-tools"), make_provider("no-key", supports_tools=True, api_key_env="")],
        is_default=True,
    )
    with pytest.raises(openai.InternalServerError) as info:
        client.chat.completions.create(model="plain", messages=CONVERSATION, tools=TOOLS)
    assert info.value.status_code == 503
    body: Any = info.value.body
    assert body["type"] == "service_unavailable" and body["code"] == "no_provider_available"
    assert body["candidates"] == [
        {"provider": "no-tools", "outcome": "skipped", "reason": "unsupported"},
        {"provider": "no-key", "outcome": "skipped", "reason": "missing_key"},
    ]
    decision = RoutingDecision.objects.get()
    assert body["request_id"] == str(decision.request_id)
    assert info.value.response.headers["x-request-id"] == body["request_id"]
    assert decision.status == "error" and decision.fallback_reason == "chain_exhausted"
    assert [c["provider"] for c in body["candidates"]] == ["no-tools", "no-key"]

    with pytest.raises(openai.InternalServerError):  # the stream answers the same 503
        client.chat.completions.create(
            model="plain", messages=CONVERSATION, tools=TOOLS, stream=True
        )

    envelope = httpx.post(
        f"{live_server.url}/audit/",
        json={"task": "chat", "messages": CONVERSATION, "tools": TOOLS},  # the default chain
        headers={"Authorization": f"Token {token}"},
    ).json()
    assert envelope["result"]["mode"] == "mock"
    meta = envelope["routing_metadata"]
    assert meta["fallback_used"] is True and meta["selected_provider"] == "mock"
    assert meta["skipped_providers"] == [
        {"provider": "no-tools", "reason": "unsupported"},
        {"provider": "no-key", "reason": "missing_key"},
    ]


def test_a_chain_opting_into_the_backstop_gets_the_mock_on_v1(client, scripted, key_env):
    chain = make_chain("lenient", [make_provider("no-tools")])
    chain.mock_backstop = True
    chain.save()
    completion = client.chat.completions.create(model="lenient", messages=CONVERSATION, tools=TOOLS)
    assert completion.model == "mock-1"
    assert Chain.objects.get(name="lenient").mock_backstop is True


def test_v1_schema_documents_request_and_error_shapes(live_server, token):
    schema = httpx.get(
        f"{live_server.url}/api/schema/?format=json", headers={"Authorization": f"Token {token}"}
    ).json()
    operation = schema["paths"]["/v1/chat/completions"]["post"]
    request_ref = operation["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    request_schema = schema["components"]["schemas"][request_ref.rsplit("/", 1)[1]]
    for name in ("messages", "tools", "tool_choice", "stop", "seed", "top_p", "user"):
        assert name in request_schema["properties"], name
    assert {"400", "503"} <= set(operation["responses"])
    error_ref = operation["responses"]["503"]["content"]["application/json"]["schema"]["$ref"]
    assert error_ref.endswith("/OpenAIError")
    ok_ref = operation["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
    completion = schema["components"]["schemas"][ok_ref.rsplit("/", 1)[1]]
    assert {"choices", "usage", "model"} <= set(completion["properties"])


def test_the_schema_with_the_chat_shapes_validates_without_warnings(tmp_path):
    from django.core.management import call_command

    target = tmp_path / "schema.yaml"
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(target))
    text = target.read_text()
    assert "tool_call_id" in text and "OpenAIError" in text
