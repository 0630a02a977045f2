"""Anthropic Messages API (``POST {base_url}/v1/messages``).

Request: headers ``x-api-key`` and ``anthropic-version: 2023-06-01``; body
``{"model", "max_tokens", "system"?, "messages": [{"role": "user", "content"}], …params}``
(``max_tokens`` is required by the API: ``params["max_tokens"]`` or 1024). Structured
output: one tool whose ``input_schema`` is the request's schema, forced with
``tool_choice: {"type": "tool", "name": …}``; the answer is that ``tool_use`` block's
``input``.
Response: ``content`` blocks (``text`` / ``tool_use``), ``stop_reason`` (``end_turn``,
``max_tokens``, ``stop_sequence``, ``tool_use``, ``refusal``), ``usage.input_tokens`` /
``usage.output_tokens``, ``model``.
Errors: ``{"type": "error", "error": {"type", "message"}, "request_id"}`` — types
``invalid_request_error`` (400; "prompt is too long" means context length),
``authentication_error`` (401), ``permission_error`` (403), ``not_found_error`` (404),
``request_too_large`` (413), ``rate_limit_error`` (429), ``api_error`` (500),
``overloaded_error`` (529).
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

from ..errors import ContentPolicyError, ResponseError
from ..types import AuditRequest, ProviderResult
from .base import HttpProvider, validate_structured
from .classify import classify_http_error

__all__ = ["ANTHROPIC_VERSION", "STRUCTURED_TOOL_NAME", "AnthropicProvider"]

ANTHROPIC_VERSION = "2023-06-01"
STRUCTURED_TOOL_NAME = "structured_output"
DEFAULT_MAX_TOKENS = 1024
_RESERVED = frozenset({"model", "messages", "system", "stream", "tools", "tool_choice"})


class AnthropicProvider(HttpProvider):
    kind: ClassVar[str] = "anthropic"
    default_base_url: ClassVar[str] = "https://api.anthropic.com"

    def endpoint(self, request: AuditRequest) -> str:
        return f"{self.base_url}/v1/messages"

    def auth_headers(self, api_key: str | None) -> dict[str, str]:
        headers = {"anthropic-version": ANTHROPIC_VERSION}
        if api_key:
            headers["x-api-key"] = api_key
        return headers

    def build_payload(self, request: AuditRequest) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "max_tokens": DEFAULT_MAX_TOKENS,
            **self.extra_params(_RESERVED),
            "model": self.config.model,
            "messages": [{"role": "user", "content": request.input_text}],
        }
        if request.instructions:
            payload["system"] = request.instructions
        if request.response_schema is not None:
            payload["tools"] = [
                {
                    "name": STRUCTURED_TOOL_NAME,
                    "description": "Return the answer as this JSON object.",
                    "input_schema": dict(request.response_schema),
                }
            ]
            payload["tool_choice"] = {"type": "tool", "name": STRUCTURED_TOOL_NAME}
        return payload

    def error_details(self, data: Any) -> tuple[str, tuple[object, ...]]:
        error = data.get("error") if isinstance(data, dict) else None
        if isinstance(error, dict):
            message = error.get("message")
            details = error.get("details")
            extra = details.get("error_code") if isinstance(details, dict) else None
            return message if isinstance(message, str) else "", (error.get("type"), extra)
        return "", ()

    def raise_for_error_body(self, data: Any) -> None:
        if isinstance(data, dict) and data.get("type") == "error":
            message, codes = self.error_details(data)
            raise classify_http_error(
                200, message=message or "The provider answered 200 with an error.", codes=codes
            )
        super().raise_for_error_body(data)

    def parse(self, data: Any, request: AuditRequest) -> ProviderResult:
        content = data.get("content") if isinstance(data, dict) else None
        if not isinstance(content, list):
            raise ResponseError("The response has no content list.")
        stop = data.get("stop_reason")
        if stop == "refusal":
            raise ContentPolicyError(
                "The provider refused the request under its content policy.", code="refusal"
            )
        texts = [
            b["text"]
            for b in content
            if isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str)
        ]
        output = "".join(texts)
        structured = None
        if request.response_schema is not None:
            tool = next(
                (
                    b
                    for b in content
                    if isinstance(b, dict)
                    and b.get("type") == "tool_use"
                    and b.get("name") == STRUCTURED_TOOL_NAME
                ),
                None,
            )
            if tool is None or not isinstance(tool.get("input"), dict):
                raise ResponseError("The response has no structured_output tool_use block.")
            structured = validate_structured(tool["input"], request.response_schema)
            output = output or json.dumps(structured, ensure_ascii=False)
        usage = data.get("usage")
        if not isinstance(usage, dict):
            usage = {}
        return self.ok_result(
            model=data.get("model"),
            output=output,
            data=structured,
            input_tokens=usage.get("input_tokens", 0),
            output_tokens=usage.get("output_tokens", 0),
            finish_reason=stop,
        )
