"""Chat requests shared by the adapter translation tests: a conversation using every
role, content parts, a tool round trip, and tool definitions."""

from __future__ import annotations

from collections.abc import Iterator

from llm_routing.providers.base import HttpProvider
from llm_routing.providers.streaming import StreamItem
from llm_routing.types import (
    AuditRequest,
    ContentPart,
    Message,
    StreamDelta,
    StreamEvent,
    StreamToolCallDelta,
    Tool,
    ToolCall,
)

KEY = "sk-chat-KEY-0123456789"
PNG = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUg=="
IMAGE_URL = "https://images.example/cat.jpg"

WEATHER = Tool(
    name="get_weather",
    description="The weather in a city.",
    parameters={
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
)
TIME = Tool(name="get_time", parameters={})
CALL = ToolCall(id="call_1", name="get_weather", arguments='{"city": "Paris"}')
CALL_2 = ToolCall(id="call_2", name="get_time", arguments="")

#: system, developer, user with parts, assistant with two tool calls, two tool results,
#: assistant text, user.
CONVERSATION = (
    Message(role="system", content="Be brief."),
    Message(role="developer", content="Answer in English."),
    Message(
        role="user",
        content=(
            ContentPart(type="text", text="What is in this picture, and the weather?"),
            ContentPart(type="image_url", image_url=PNG, detail="low"),
            ContentPart(type="image_url", image_url=IMAGE_URL),
        ),
    ),
    Message(role="assistant", content="", tool_calls=(CALL, CALL_2)),
    Message(role="tool", content='{"temp_c": 21}', tool_call_id="call_1"),
    Message(role="tool", content="12:00", tool_call_id="call_2", name="get_time"),
    Message(role="assistant", content="A cat; 21 °C at noon."),
    Message(role="user", content="Thanks. And tomorrow?"),
)

FOUR_TURNS = (
    Message(role="user", content="Hi."),
    Message(role="assistant", content="Hello!"),
    Message(role="user", content="Weather in Paris?"),
    Message(role="assistant", content="Let me check."),
)


def chat(**fields: object) -> AuditRequest:
    return AuditRequest(task="chat", **fields)  # type: ignore[arg-type]


def stream_events(adapter: HttpProvider, request: AuditRequest) -> Iterator[StreamEvent]:
    return adapter.stream(request, api_key=KEY, timeout=5.0)


def items_of(events: list[StreamEvent]) -> list[StreamItem]:
    """Text pieces and tool-call deltas, in order (the end left out)."""
    out: list[StreamItem] = []
    for event in events:
        if isinstance(event, StreamDelta):
            out.append(event.text)
        elif isinstance(event, StreamToolCallDelta):
            out.append(event.delta)
    return out
