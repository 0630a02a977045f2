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
