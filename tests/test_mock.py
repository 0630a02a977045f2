"""The mock provider: deterministic, offline, says it is a mock, honours schemas."""

from __future__ import annotations

import jsonschema
import pytest

from llm_routing.providers.mock import MockProvider, instance_from_schema
from llm_routing.types import AuditRequest, ProviderConfig

CONFIG = ProviderConfig(name="mock", kind="mock", model="mock-1", mode="mock")


def complete(**kw: object):
    kw.setdefault("task", "summarize")
    kw.setdefault("input_text", "hello")
    return MockProvider(CONFIG).complete(AuditRequest(**kw), api_key=None, timeout=1.0)  # type: ignore[arg-type]


def test_same_inputs_same_output():
    assert complete().output == complete().output
    assert complete(instructions="x").output == complete(instructions="x").output


@pytest.mark.parametrize(
    "change", [{"task": "other"}, {"instructions": "be brief"}, {"input_text": "hello!"}]
)
def test_any_input_change_changes_output(change):
    assert complete(**change).output != complete().output


def test_output_says_it_is_a_mock_and_does_not_echo_input():
    result = complete(input_text="SECRET-INPUT-TEXT")
    assert result.output.startswith("[mock]")
    assert "SECRET-INPUT-TEXT" not in result.output
    assert (result.mode, result.status, result.model) == ("mock", "ok", "mock-1")
    assert result.usage.output_tokens > 0


def test_metadata_does_not_change_output():
    assert complete(metadata={"a": "b"}).output == complete().output


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}},
        {
            "type": "object",
            "properties": {"tags": {"type": "array", "items": {"type": "string"}, "minItems": 2}},
            "required": ["tags"],
        },
        {"type": "string", "enum": ["x", "y"]},
        {"type": "string", "minLength": 10},
        {"type": ["null", "number"], "minimum": 3},
        {"anyOf": [{"type": "boolean"}, {"type": "string"}]},
        {
            "type": "object",
            "properties": {"n": {"type": "object", "properties": {"z": {"const": 4}}}},
        },
    ],
)
def test_schema_instances_validate(schema):
    value = instance_from_schema(schema)
    jsonschema.validate(value, schema)
    result = complete(response_schema=schema)
    assert result.data == value


# --- conversations (issue 10) ----------------------------------------------------------
def test_a_messages_only_request_is_described_by_its_whole_conversation():
    from llm_routing.types import Message, Tool

    turns = (
        Message(role="user", content="SECRET-TURN-ONE"),
        Message(role="assistant", content="ok"),
        Message(role="user", content="SECRET-TURN-TWO"),
    )
    request = AuditRequest(task="chat", messages=turns, tools=(Tool(name="get_time"),))
    result = MockProvider(CONFIG).complete(request, api_key=None, timeout=1.0)
    assert result.output.endswith(f"for {request.input_length} characters of input.")
    assert request.input_length > len("SECRET-TURN-ONESECRET-TURN-TWO")  # not input_text's 0
    assert "SECRET" not in result.output
    assert result.tool_calls == ()  # the backstop answers tool requests with text
    assert result.usage.input_tokens == (request.input_length + 3) // 4
    # Deterministic, and any turn changes it.
    assert complete(task="chat", input_text="", messages=turns).output == result.output
    changed = (*turns[:2], Message(role="user", content="SECRET-TURN-2"))
    assert complete(task="chat", input_text="", messages=changed).output != result.output


def test_a_one_shot_request_keeps_its_output():
    """The digest of input_text requests is unchanged by the conversation model."""
    assert complete().output == (
        "[mock] summarize: deterministic mock answer "
        f"{_old_digest('summarize', '', 'hello', None)[:16]} for 5 characters of input."
    )


def _old_digest(task: str, instructions: str, input_text: str, schema: object) -> str:
    import hashlib
    import json

    material = json.dumps(
        [task, instructions, input_text, schema], sort_keys=True, ensure_ascii=True, default=str
    )
    return hashlib.sha256(material.encode("ascii")).hexdigest()
