"""The shared tool-call assembly of the SSE decoders, event by event: ids and names
from the first fragment, argument pieces appended, indexes counted per call, repeated
ids ignored, nameless calls refused at the end, and text and calls kept in order."""

from __future__ import annotations

import json
from typing import Any

import pytest
from httpx_sse import ServerSentEvent

from llm_routing.errors import ResponseError
from llm_routing.providers.anthropic import AnthropicProvider
from llm_routing.providers.gemini import GeminiProvider
from llm_routing.providers.openai_compatible import OpenAICompatibleProvider
from llm_routing.providers.streaming import StreamDecoder
from llm_routing.types import AuditRequest, ProviderConfig, ToolCall, ToolCallDelta

REQUEST = AuditRequest(task="t", input_text="x", stream=True)


def decoder(kind: str) -> StreamDecoder:
    cls: Any = {
        "openai_compatible": OpenAICompatibleProvider,
        "anthropic": AnthropicProvider,
        "gemini": GeminiProvider,
    }[kind]
    found = cls(ProviderConfig(name="p", kind=kind, model="m")).stream_decoder(REQUEST)
    assert found is not None
    return found


def feed(dec: StreamDecoder, *events: tuple[str, dict[str, Any]]) -> list[object]:
    out: list[object] = []
    for name, data in events:
        out.extend(dec.feed(ServerSentEvent(event=name, data=json.dumps(data))))
    return out


def chunk(delta: dict[str, Any], finish: str | None = None) -> tuple[str, dict[str, Any]]:
    return ("message", {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})


def test_openai_fragments_without_ids_repeated_ids_and_whole_calls() -> None:
    dec = decoder("openai_compatible")
    items = feed(
        dec,
        chunk({"content": "Let me look."}),
        # No id (some local servers): a deterministic one.
        chunk({"tool_calls": [{"index": 0, "function": {"name": "a", "arguments": '{"x"'}}]}),
        # The id repeated on a later fragment is ignored.
        chunk({"tool_calls": [{"index": 0, "id": "zz", "function": {"arguments": ": 1}"}}]}),
        # A whole call in one fragment.
        chunk(
            {"tool_calls": [{"index": 1, "id": "c2", "function": {"name": "b", "arguments": "{}"}}]}
        ),
        chunk({}, "tool_calls"),
    )
    assert items == [
        "Let me look.",
        ToolCallDelta(0, "call_0", "a", '{"x"'),
        ToolCallDelta(0, arguments=": 1}"),
        ToolCallDelta(1, "c2", "b", "{}"),
    ]
    end = dec.end()
    assert end is not None and end.finish_reason == "tool_calls"
    assert end.tool_calls == (ToolCall("call_0", "a", '{"x": 1}'), ToolCall("c2", "b", "{}"))


def test_a_streamed_call_that_never_got_a_name_is_refused_at_the_end() -> None:
    dec = decoder("openai_compatible")
    feed(
        dec,
        chunk({"tool_calls": [{"index": 0, "id": "c1", "function": {"arguments": "{}"}}]}),
        chunk({}, "tool_calls"),
    )
    with pytest.raises(ResponseError, match="without a name"):
        dec.end()


def test_a_cut_stream_has_no_end_even_with_complete_looking_arguments() -> None:
    dec = decoder("openai_compatible")
    feed(dec, chunk({"tool_calls": [{"index": 0, "id": "c", "function": {"name": "a"}}]}))
    assert dec.end() is None


def test_anthropic_call_indexes_count_calls_not_content_blocks() -> None:
    dec = decoder("anthropic")
    start = {"type": "content_block_start"}
    items = feed(
        dec,
        (
            "content_block_start",
            {**start, "index": 0, "content_block": {"type": "text", "text": ""}},
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": "Hm."},
            },
        ),
        (
            "content_block_start",
            {
                **start,
                "index": 1,
                "content_block": {"type": "tool_use", "id": "tu", "name": "a", "input": {}},
            },
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 1,
                "delta": {"type": "input_json_delta", "partial_json": '{"q": 1}'},
            },
        ),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "tool_use"},
                "usage": {"output_tokens": 3},
            },
        ),
    )
    assert items == ["Hm.", ToolCallDelta(0, "tu", "a", ""), ToolCallDelta(0, arguments='{"q": 1}')]
    end = dec.end()
    assert end is not None and end.tool_calls == (ToolCall("tu", "a", '{"q": 1}'),)


def test_gemini_text_and_function_calls_keep_their_order() -> None:
    dec = decoder("gemini")
    parts = [{"text": "Sure."}, {"functionCall": {"name": "a", "args": {"q": [1, 2]}}}]
    items = feed(
        dec,
        ("message", {"candidates": [{"content": {"parts": parts, "role": "model"}}]}),
        (
            "message",
            {
                "candidates": [
                    {
                        "content": {"parts": [{"functionCall": {"id": "g2", "name": "b"}}]},
                        "finishReason": "STOP",
                    }
                ]
            },
        ),
    )
    assert items == [
        "Sure.",
        ToolCallDelta(0, "call_0", "a", '{"q":[1,2]}'),
        ToolCallDelta(1, "g2", "b", "{}"),
    ]
    end = dec.end()
    assert end is not None and [c.id for c in end.tool_calls] == ["call_0", "g2"]


def test_openai_compatible_fragments_without_index_are_told_apart_by_id() -> None:
    dec = decoder("openai_compatible")
    items = feed(
        dec,
        chunk({"tool_calls": [{"id": "a1", "function": {"name": "a", "arguments": '{"x":'}}]}),
        chunk({"tool_calls": [{"function": {"arguments": " 1}"}}]}),  # continues a1
        chunk({"tool_calls": [{"id": "b1", "function": {"name": "b", "arguments": "{}"}}]}),
        chunk({}, "tool_calls"),
    )
    assert items == [
        ToolCallDelta(0, "a1", "a", '{"x":'),
        ToolCallDelta(0, arguments=" 1}"),
        ToolCallDelta(1, "b1", "b", "{}"),
    ]
    end = dec.end()
    assert end is not None
    assert end.tool_calls == (ToolCall("a1", "a", '{"x": 1}'), ToolCall("b1", "b", "{}"))
