"""Anthropic Messages adapter: wire shape and normalization (real HTTP)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from llm_routing import errors
from llm_routing.providers.anthropic import ANTHROPIC_VERSION, STRUCTURED_TOOL_NAME
from llm_routing.providers.base import HttpProvider
from llm_routing.types import AuditRequest
from tests.fakes.upstream import FakeUpstream, Fault

SCHEMA = {
    "type": "object",
    "properties": {"label": {"type": "string", "enum": ["spam", "ham"]}},
    "required": ["label"],
}


def test_request_shape(
    fake_upstream: FakeUpstream, make_adapter: Callable[..., HttpProvider]
) -> None:
    adapter = make_adapter("anthropic", model="claude-sonnet-4-5", params={"temperature": 0})
    request = AuditRequest(task="t", input_text="Long text.", instructions="Be brief.")
    result = adapter.complete(request, api_key="sk-ant-123456", timeout=5.0)

    (seen,) = fake_upstream.requests
    assert seen.path == "/v1/messages"
    assert seen.headers["x-api-key"] == "sk-ant-123456"
    assert seen.headers["anthropic-version"] == ANTHROPIC_VERSION == "2023-06-01"
    assert "authorization" not in seen.headers
    assert seen.json == {
        "max_tokens": 1024,
        "temperature": 0,
        "model": "claude-sonnet-4-5",
        "system": "Be brief.",
        "messages": [{"role": "user", "content": "Long text."}],
    }
    assert result.ok
    assert result.model == "claude-sonnet-4-5-fake"
    assert (result.usage.input_tokens, result.usage.output_tokens) == (12, 8)
    assert result.finish_reason == "end_turn"
    assert result.output.startswith("fake answer")


def test_max_tokens_from_params(
    fake_upstream: FakeUpstream, make_adapter: Callable[..., HttpProvider]
) -> None:
    make_adapter("anthropic", params={"max_tokens": 50}).complete(
        AuditRequest(task="t", input_text="x"), api_key="k-123456", timeout=5.0
    )
    body = fake_upstream.requests[0].json
    assert body["max_tokens"] == 50
    assert "system" not in body


def test_structured_output_uses_a_forced_tool(
    fake_upstream: FakeUpstream, make_adapter: Callable[..., HttpProvider]
) -> None:
    request = AuditRequest(task="t", input_text="x", response_schema=SCHEMA)
    result = make_adapter("anthropic").complete(request, api_key="k-123456", timeout=5.0)
    body = fake_upstream.requests[0].json
    assert body["tools"] == [
        {
            "name": STRUCTURED_TOOL_NAME,
            "description": "Return the answer as this JSON object.",
            "input_schema": SCHEMA,
        }
    ]
    assert body["tool_choice"] == {"type": "tool", "name": STRUCTURED_TOOL_NAME}
    assert result.data == {"label": "spam"}
    assert result.finish_reason == "tool_use"


def test_missing_tool_use_block_is_a_response_error(
    fake_upstream: FakeUpstream, make_adapter: Callable[..., HttpProvider]
) -> None:
    fake_upstream.script(
        "anthropic",
        Fault(
            body={
                "model": "m",
                "content": [{"type": "text", "text": "no"}],
                "stop_reason": "end_turn",
            }
        ),
    )
    with pytest.raises(errors.ResponseError):
        make_adapter("anthropic").complete(
            AuditRequest(task="t", input_text="x", response_schema=SCHEMA),
            api_key="k-123456",
            timeout=5.0,
        )


def test_invalid_tool_input_is_a_response_error(
    fake_upstream: FakeUpstream, make_adapter: Callable[..., HttpProvider]
) -> None:
    block = {"type": "tool_use", "id": "t", "name": STRUCTURED_TOOL_NAME, "input": {"label": "x"}}
    fake_upstream.script("anthropic", Fault(body={"model": "m", "content": [block]}))
    with pytest.raises(errors.ResponseError):
        make_adapter("anthropic").complete(
            AuditRequest(task="t", input_text="x", response_schema=SCHEMA),
            api_key="k-123456",
            timeout=5.0,
        )


def test_refusal_stop_reason_is_content_policy(
    fake_upstream: FakeUpstream, make_adapter: Callable[..., HttpProvider]
) -> None:
    fake_upstream.script(
        "anthropic", Fault(body={"model": "m", "content": [], "stop_reason": "refusal"})
    )
    with pytest.raises(errors.ContentPolicyError):
        make_adapter("anthropic").complete(
            AuditRequest(task="t", input_text="x"), api_key="k-123456", timeout=5.0
        )


def test_no_content_list_is_a_response_error(
    fake_upstream: FakeUpstream, make_adapter: Callable[..., HttpProvider]
) -> None:
    fake_upstream.script("anthropic", Fault(body={"model": "m"}))
    with pytest.raises(errors.ResponseError):
        make_adapter("anthropic").complete(
            AuditRequest(task="t", input_text="x"), api_key="k-123456", timeout=5.0
        )
