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

Streaming (``"stream": true``): named SSE events ``message_start`` (model, input
usage), ``content_block_start`` / ``content_block_delta`` (``text_delta``; for the
structured-output tool, ``input_json_delta`` pieces of its JSON input, streamed as the
answer text and validated once complete) / ``content_block_stop``, ``message_delta``
(``stop_reason``, cumulative output usage), ``message_stop``, any number of ``ping``,
and ``error`` (e.g. ``overloaded_error``) — unknown event types are ignored, as the
API's versioning policy asks.

Pass-through: the request's ``temperature`` and ``max_tokens`` override the row's
params. A continuation ``prefill`` is Anthropic's native prefill: a trailing assistant
message. The API rejects a final assistant message ending in whitespace, so trailing
whitespace is cut from the prefill and dropped again from the start of the
continuation.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

from httpx_sse import ServerSentEvent

from ..errors import ContentPolicyError, ResponseError
from ..types import AuditRequest, ProviderResult
from .base import HttpProvider, validate_structured
from .classify import classify_http_error
from .streaming import MalformedEvent, StreamDecoder, StreamItem

__all__ = [
    "ANTHROPIC_VERSION",
    "STRUCTURED_TOOL_NAME",
    "AnthropicProvider",
    "MessagesStreamDecoder",
]

ANTHROPIC_VERSION = "2023-06-01"
STRUCTURED_TOOL_NAME = "structured_output"
DEFAULT_MAX_TOKENS = 1024
_RESERVED = frozenset({"model", "messages", "system", "stream", "tools", "tool_choice"})


class MessagesStreamDecoder(StreamDecoder):
    """Anthropic Messages stream events."""

    def __init__(self, provider: AnthropicProvider, *, structured: bool, strip_prefix: str):
        super().__init__(strip_prefix=strip_prefix)
        self.provider = provider
        self.structured = structured
        self.tool_index: object = None

    def feed(self, event: ServerSentEvent) -> list[StreamItem]:
        if event.event == "ping":
            return []
        data = self.load(event)
        kind = data.get("type") or event.event
        if kind == "error" or event.event == "error":
            text, codes = self.provider.error_details(data)
            raise classify_http_error(
                200, message=text or "The provider's stream reported an error.", codes=codes
            )
        if kind == "message_start":
            message = data.get("message")
            if not isinstance(message, dict):
                raise MalformedEvent
            if isinstance(message.get("model"), str) and message["model"]:
                self.model = message["model"]
            usage = message.get("usage")
            if isinstance(usage, dict):
                self.tokens(
                    input_tokens=usage.get("input_tokens"),
                    output_tokens=usage.get("output_tokens"),
                )
            return []
        if kind == "content_block_start":
            block = data.get("content_block")
            if not isinstance(block, dict):
                raise MalformedEvent
            if block.get("type") == "tool_use" and block.get("name") == STRUCTURED_TOOL_NAME:
                self.tool_index = data.get("index")
            elif block.get("type") == "text" and not self.structured:
                initial = block.get("text")
                return self.emit([initial]) if isinstance(initial, str) and initial else []
            return []
        if kind == "content_block_delta":
            delta = data.get("delta")
            if not isinstance(delta, dict):
                raise MalformedEvent
            dtype = delta.get("type")
            if dtype == "text_delta" and not self.structured:
                piece = delta.get("text")
                if not isinstance(piece, str):
                    raise MalformedEvent
                return self.emit([piece])
            if dtype == "input_json_delta" and self.structured:
                if data.get("index") != self.tool_index:
                    return []
                partial = delta.get("partial_json")
                if not isinstance(partial, str):
                    raise MalformedEvent
                return self.emit([partial])
            return []  # thinking, signature, citations …
        if kind == "message_delta":
            delta = data.get("delta")
            if not isinstance(delta, dict):
                raise MalformedEvent
            stop = delta.get("stop_reason")
            if stop == "refusal":
                raise ContentPolicyError(
                    "The provider refused the request under its content policy.",
                    code="refusal",
                )
            if isinstance(stop, str) and stop:
                self.finish_reason = stop
            usage = data.get("usage")
            if isinstance(usage, dict):
                self.tokens(
                    input_tokens=usage.get("input_tokens"),
                    output_tokens=usage.get("output_tokens"),
                )
            return []
        if kind == "message_stop":
            self.done = True
        return []


class AnthropicProvider(HttpProvider):
    capabilities: ClassVar[frozenset[str]] = frozenset(
        {"streaming", "structured_output", "tools", "images", "prefill"}
    )
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
        if request.temperature is not None:
            payload["temperature"] = request.temperature
        if request.max_tokens is not None:
            payload["max_tokens"] = request.max_tokens
        prefill = request.prefill.rstrip()
        if prefill:
            payload["messages"].append({"role": "assistant", "content": prefill})
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

    def stream_decoder(self, request: AuditRequest) -> StreamDecoder:
        prefill = request.prefill
        return MessagesStreamDecoder(
            self,
            structured=request.response_schema is not None,
            strip_prefix=prefill[len(prefill.rstrip()) :] if prefill.rstrip() else "",
        )

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
