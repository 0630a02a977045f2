"""OpenAI and OpenAI-compatible adapters: wire shape and normalization (real HTTP)."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from llm_routing import errors
from llm_routing.providers.base import HttpProvider
from llm_routing.providers.openai import schema_name
from llm_routing.types import AuditRequest
from tests.fakes.upstream import FakeUpstream, Fault

SCHEMA = {
    "title": "Summary result!",
    "type": "object",
    "properties": {"summary": {"type": "string"}, "score": {"type": "integer"}},
    "required": ["summary", "score"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("kind", ["openai", "openai_compatible"])
def test_request_shape(
    kind: str, fake_upstream: FakeUpstream, make_adapter: Callable[..., HttpProvider]
) -> None:
    adapter = make_adapter(kind, model="gpt-4o-mini", params={"temperature": 0.2, "model": "x"})
    request = AuditRequest(task="summarize", input_text="Long text.", instructions="Be brief.")
    result = adapter.complete(request, api_key="sk-abc-123456", timeout=5.0)

    (seen,) = fake_upstream.requests
    assert seen.method == "POST"
    assert seen.path == "/v1/chat/completions"
    assert seen.headers["authorization"] == "Bearer sk-abc-123456"
    assert seen.headers["content-type"] == "application/json"
    assert seen.json == {
        "temperature": 0.2,
        "model": "gpt-4o-mini",  # params cannot override the row's model
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Long text."},
        ],
    }
    assert result.ok and result.mode == "live"
    assert result.provider == adapter.config.name
    assert result.model == "gpt-4o-mini-2024-fake"  # as the vendor reported it
    assert result.output.startswith("fake answer")
    assert (result.usage.input_tokens, result.usage.output_tokens) == (11, 7)
    assert result.finish_reason == "stop"
    assert result.latency_ms > 0


def test_no_system_message_without_instructions(
    fake_upstream: FakeUpstream, make_adapter: Callable[..., HttpProvider]
) -> None:
    make_adapter("openai").complete(
        AuditRequest(task="t", input_text="hi"), api_key="k-123456", timeout=5.0
    )
    assert fake_upstream.requests[0].json["messages"] == [{"role": "user", "content": "hi"}]


def test_structured_output_uses_json_schema_response_format(
    fake_upstream: FakeUpstream, make_adapter: Callable[..., HttpProvider]
) -> None:
    request = AuditRequest(task="t", input_text="hi", response_schema=SCHEMA)
    result = make_adapter("openai").complete(request, api_key="k-123456", timeout=5.0)
    body = fake_upstream.requests[0].json
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "Summary_result", "schema": SCHEMA, "strict": True},
    }
    assert result.data == {"summary": "mock", "score": 0}
    assert json.loads(result.output) == result.data


def test_structured_output_not_matching_the_schema_is_a_response_error(
    fake_upstream: FakeUpstream, make_adapter: Callable[..., HttpProvider]
) -> None:
    body = {
        "model": "m",
        "choices": [
            {"message": {"role": "assistant", "content": '{"summary": 3}'}, "finish_reason": "stop"}
        ],
    }
    fake_upstream.script("openai", Fault(body=body))
    request = AuditRequest(task="t", input_text="secret input", response_schema=SCHEMA)
    with pytest.raises(errors.ResponseError) as caught:
        make_adapter("openai").complete(request, api_key="k-123456", timeout=5.0)
    assert "schema" in caught.value.message
    assert "3" not in caught.value.message.replace("(root)", "")  # never the value


def test_content_filter_finish_reason_is_content_policy(
    fake_upstream: FakeUpstream, make_adapter: Callable[..., HttpProvider]
) -> None:
    body = {
        "model": "m",
        "choices": [
            {"message": {"role": "assistant", "content": None}, "finish_reason": "content_filter"}
        ],
    }
    fake_upstream.script("openai", Fault(body=body))
    with pytest.raises(errors.ContentPolicyError):
        make_adapter("openai").complete(
            AuditRequest(task="t", input_text="x"), api_key="k-123456", timeout=5.0
        )


@pytest.mark.parametrize(
    "body",
    [
        {"choices": []},
        {"choices": [{"message": "text"}]},
        [],
        {"choices": [{"message": {"content": 5}}]},
    ],
)
def test_unexpected_shapes_are_response_errors(
    body: object, fake_upstream: FakeUpstream, make_adapter: Callable[..., HttpProvider]
) -> None:
    fake_upstream.script("openai", Fault(body=json.dumps(body).encode()))
    with pytest.raises(errors.ResponseError):
        make_adapter("openai").complete(
            AuditRequest(task="t", input_text="x"), api_key="k-123456", timeout=5.0
        )


def test_openai_compatible_without_key_sends_no_authorization(
    fake_upstream: FakeUpstream, make_adapter: Callable[..., HttpProvider]
) -> None:
    adapter = make_adapter("openai_compatible", api_key_env="")
    assert adapter.requires_key is False
    assert make_adapter("openai_compatible").requires_key is True
    assert make_adapter("openai").requires_key is True
    result = adapter.complete(AuditRequest(task="t", input_text="x"), api_key=None, timeout=5.0)
    assert result.ok
    assert "authorization" not in fake_upstream.requests[0].headers


def test_openai_compatible_needs_a_base_url(make_adapter: Callable[..., HttpProvider]) -> None:
    with pytest.raises(errors.InvalidRequestError):
        make_adapter("openai_compatible", base_url="").complete(
            AuditRequest(task="t", input_text="x"), api_key=None, timeout=1.0
        )


def test_openai_default_base_url(make_adapter: Callable[..., HttpProvider]) -> None:
    adapter = make_adapter("openai", base_url="")
    assert adapter.endpoint(AuditRequest(task="t", input_text="x")) == (
        "https://api.openai.com/v1/chat/completions"
    )


@pytest.mark.parametrize(
    "schema, name",
    [({"title": "My Schema"}, "My_Schema"), ({}, "response"), ({"title": "!!!"}, "response")],
)
def test_schema_name(schema: dict[str, str], name: str) -> None:
    assert schema_name(schema) == name


def test_strict_schema_can_be_relaxed_per_row(
    fake_upstream: FakeUpstream, make_adapter: Callable[..., HttpProvider]
) -> None:
    adapter = make_adapter("openai", params={"strict_schema": False})
    adapter.complete(
        AuditRequest(task="t", input_text="x", response_schema=SCHEMA),
        api_key="k-123456",
        timeout=5.0,
    )
    body = fake_upstream.requests[0].json
    assert body["response_format"]["json_schema"]["strict"] is False
    assert "strict_schema" not in body
