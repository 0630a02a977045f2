"""Gemini generateContent adapter: wire shape and normalization (real HTTP)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from llm_routing import errors
from llm_routing.providers.base import HttpProvider
from llm_routing.providers.gemini import gemini_schema
from llm_routing.types import AuditRequest
from tests.fakes.upstream import FakeUpstream, Fault

SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "properties": {
        "topics": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        "note": {"type": ["string", "null"]},
    },
    "required": ["topics"],
    "additionalProperties": False,
}


def test_request_shape_key_in_header_never_in_url(
    fake_upstream: FakeUpstream, make_adapter: Callable[..., HttpProvider]
) -> None:
    adapter = make_adapter(
        "gemini", model="gemini-2.5-flash", params={"temperature": 0.1, "max_tokens": 64}
    )
    request = AuditRequest(task="t", input_text="Long text.", instructions="Be brief.")
    result = adapter.complete(request, api_key="AIza-test-123456", timeout=5.0)

    (seen,) = fake_upstream.requests
    assert seen.path == "/v1beta/models/gemini-2.5-flash:generateContent"
    assert seen.query == ""
    assert seen.headers["x-goog-api-key"] == "AIza-test-123456"
    assert "AIza" not in seen.path
    assert seen.json == {
        "contents": [{"role": "user", "parts": [{"text": "Long text."}]}],
        "systemInstruction": {"parts": [{"text": "Be brief."}]},
        "generationConfig": {"temperature": 0.1, "maxOutputTokens": 64},
    }
    assert result.ok
    assert result.model == "gemini-2.5-flash-fake"
    assert (result.usage.input_tokens, result.usage.output_tokens) == (13, 9)
    assert result.finish_reason == "STOP"


def test_models_prefix_is_accepted(
    fake_upstream: FakeUpstream, make_adapter: Callable[..., HttpProvider]
) -> None:
    make_adapter("gemini", model="models/gemini-pro").complete(
        AuditRequest(task="t", input_text="x"), api_key="k-123456", timeout=5.0
    )
    assert fake_upstream.requests[0].path == "/v1beta/models/gemini-pro:generateContent"
    assert "generationConfig" not in fake_upstream.requests[0].json


def test_structured_output_uses_response_schema(
    fake_upstream: FakeUpstream, make_adapter: Callable[..., HttpProvider]
) -> None:
    request = AuditRequest(task="t", input_text="x", response_schema=SCHEMA)
    result = make_adapter("gemini").complete(request, api_key="k-123456", timeout=5.0)
    config = fake_upstream.requests[0].json["generationConfig"]
    assert config["responseMimeType"] == "application/json"
    assert config["responseSchema"] == {
        "type": "object",
        "properties": {
            "topics": {"type": "array", "items": {"type": "string"}, "minItems": 1},
            "note": {"type": "string", "nullable": True},
        },
        "required": ["topics"],
    }
    assert result.data == {"topics": ["mock"]}


def test_gemini_schema_drops_unsupported_keywords() -> None:
    assert gemini_schema({"type": "object", "$defs": {}, "additionalProperties": False}) == {
        "type": "object"
    }


@pytest.mark.parametrize("finish", ["SAFETY", "PROHIBITED_CONTENT", "RECITATION"])
def test_blocked_candidate_is_content_policy(
    finish: str, fake_upstream: FakeUpstream, make_adapter: Callable[..., HttpProvider]
) -> None:
    fake_upstream.script(
        "gemini", Fault(body={"candidates": [{"finishReason": finish, "index": 0}]})
    )
    with pytest.raises(errors.ContentPolicyError):
        make_adapter("gemini").complete(
            AuditRequest(task="t", input_text="x"), api_key="k-123456", timeout=5.0
        )


@pytest.mark.parametrize(
    "body", [{}, {"candidates": []}, {"candidates": [{"finishReason": "STOP"}]}]
)
def test_no_candidates_is_a_response_error(
    body: dict[str, object], fake_upstream: FakeUpstream, make_adapter: Callable[..., HttpProvider]
) -> None:
    fake_upstream.script("gemini", Fault(body=body))
    with pytest.raises(errors.ResponseError):
        make_adapter("gemini").complete(
            AuditRequest(task="t", input_text="x"), api_key="k-123456", timeout=5.0
        )
