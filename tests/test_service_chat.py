"""The Python chat API: ``llm_routing.chat`` beside ``audit``, validated like the HTTP
API, returning the same RoutingResult or the router's stream events."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError

import llm_routing
from llm_routing.errors import NetworkError
from llm_routing.types import (
    ForcedTool,
    Message,
    ProviderResult,
    RoutingResult,
    StreamChunk,
    StreamEnd,
    StreamResult,
    StreamToolCallDelta,
    Tool,
    ToolCall,
    ToolCallDelta,
)

from .conftest import make_chain, make_provider

pytestmark = pytest.mark.django_db

WEATHER = Tool(name="get_weather", parameters={"type": "object"})
CALL = ToolCall(id="call_1", name="get_weather", arguments='{"city":"Paris"}')


@pytest.fixture
def chain(scripted, key_env):
    make_chain(
        "tools",
        [
            make_provider("a", supports_tools=True, supports_streaming=True, max_retries=0),
            make_provider("b", supports_tools=True, supports_streaming=True),
        ],
    )
    return scripted


def test_chat_returns_a_routing_result_with_tool_calls(chain):
    chain.scripts["a"] = [
        ProviderResult(provider="", model="", mode="live", status="ok", tool_calls=(CALL,))
    ]
    routed = llm_routing.chat(
        [{"role": "user", "content": "Weather in Paris?"}],
        tools=[WEATHER],
        chain="tools",
        tool_choice=ForcedTool("get_weather"),
        temperature=0.2,
        stop=["END"],
        seed=7,
    )
    assert isinstance(routed, RoutingResult)
    assert routed.result.tool_calls == (CALL,)
    assert routed.metadata.chain_name == "tools"
    (_, request), *_ = chain.requests
    assert request.tools == (WEATHER,)
    assert request.tool_choice == ForcedTool("get_weather")
    assert (request.temperature, request.stop, request.seed) == (0.2, ("END",), 7)


def test_chat_accepts_message_objects_and_keeps_roles(chain):
    turns = [
        Message(role="developer", content="Answer in French."),
        Message(role="user", content="Hi"),
        Message(role="assistant", content="Bonjour"),
        Message(role="user", content="Weather?"),
    ]
    llm_routing.chat(turns, chain="tools")
    (_, request), *_ = chain.requests
    assert request.messages == tuple(turns)


def test_chat_streams_router_events(chain):
    chain.streams["a"] = [[NetworkError("reset")]]  # pre-commit: fails over to b
    chain.streams["b"] = [
        [
            StreamToolCallDelta(ToolCallDelta(index=0, id="call_1", name="get_weather")),
            StreamToolCallDelta(ToolCallDelta(index=0, arguments='{"city":"Paris"}')),
            StreamEnd(finish_reason="tool_calls", tool_calls=(CALL,)),
        ]
    ]
    events = list(
        llm_routing.chat(
            [{"role": "user", "content": "Weather?"}], tools=[WEATHER], chain="tools", stream=True
        )
    )
    assert [type(e) for e in events] == [StreamChunk, StreamChunk, StreamResult]
    end = events[-1]
    assert isinstance(end, StreamResult)
    assert end.routed.result.provider == "b"
    assert end.routed.result.tool_calls == (CALL,)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"temperature": True}, "temperature"),
        ({"stream": "yes"}, "stream"),
        ({"seed": "7"}, "seed"),
        ({"colour": "red"}, "colour"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"input_text": "x"}, "input_text"),
    ],
)
def test_chat_validates_like_the_http_api(chain, kwargs, field):
    with pytest.raises(ValidationError) as info:
        llm_routing.chat([{"role": "user", "content": "hi"}], **kwargs)
    assert field in info.value.message_dict


def test_errors_name_the_place_in_the_conversation(chain):
    turns = [
        {"role": "user", "content": "hi"},
        {"role": "tool", "tool_call_id": "nope", "content": "{}"},
    ]
    with pytest.raises(ValidationError) as info:
        llm_routing.chat(turns)
    assert "messages.1.tool_call_id" in info.value.message_dict


def test_backstop_false_turns_exhaustion_into_an_error(scripted, key_env):
    make_chain("plain", [make_provider("p")])  # no tools capability
    routed = llm_routing.chat(
        [{"role": "user", "content": "hi"}], tools=[WEATHER], chain="plain", backstop=False
    )
    assert routed.result.error is not None
    assert routed.result.error.category == "chain_exhausted"
    kept = llm_routing.chat([{"role": "user", "content": "hi"}], tools=[WEATHER], chain="plain")
    assert kept.result.mode == "mock"
