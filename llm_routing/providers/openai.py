"""OpenAI Chat Completions (``POST {base_url}/chat/completions``).

Request: ``Authorization: Bearer <key>``; body ``{"model", "messages": [system?, user],
…params}``; structured output through ``response_format`` ``{"type": "json_schema",
"json_schema": {"name", "schema", "strict": true}}``.
Response: ``choices[0].message.content`` (or ``.refusal``), ``choices[0].finish_reason``,
``usage.prompt_tokens`` / ``usage.completion_tokens``, ``model``.
Errors: ``{"error": {"message", "type", "param", "code"}}`` — ``code`` such as
``context_length_exceeded``, ``invalid_api_key``, ``rate_limit_exceeded``,
``insufficient_quota``, ``content_policy_violation``.

Streaming: ``"stream": true`` and ``stream_options: {"include_usage": true}`` (a row
may send ``params {"stream_include_usage": false}`` for servers that reject it);
``data:`` events carry ``chat.completion.chunk`` objects (``choices[0].delta.content``,
``choices[0].finish_reason``), then a usage chunk with empty ``choices``, then
``data: [DONE]``. A mid-stream failure is an in-band ``data: {"error": {…}}`` event.

Pass-through: the request's ``temperature`` and ``max_tokens`` (the OpenAI-compatible
face) override the row's ``params``; ``max_tokens`` is sent under the key the row's
params use (``max_tokens`` or ``max_completion_tokens``), else under
:attr:`OpenAIProvider.max_tokens_key`. A continuation ``prefill`` is sent as a
trailing assistant message.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

from httpx_sse import ServerSentEvent

from ..errors import ContentPolicyError, ResponseError
from ..types import AuditRequest, ProviderResult
from .base import HttpProvider, validate_structured
from .streaming import MalformedEvent, StreamDecoder

__all__ = ["ChatCompletionChunkDecoder", "OpenAIProvider", "chat_messages", "schema_name"]

_RESERVED = frozenset(
    {
        "model",
        "messages",
        "stream",
        "stream_options",
        "response_format",
        "n",
        "strict_schema",
        "stream_include_usage",
    }
)
_NAME_RE = re.compile(r"[^a-zA-Z0-9_-]+")


def chat_messages(request: AuditRequest) -> list[dict[str, str]]:
    messages: list[dict[str, str]] = []
    if request.instructions:
        messages.append({"role": "system", "content": request.instructions})
    messages.append({"role": "user", "content": request.input_text})
    if request.prefill:
        messages.append({"role": "assistant", "content": request.prefill})
    return messages


def schema_name(schema: Any) -> str:
    """A ``json_schema.name``: the schema's title made safe (a-z, 0-9, _ and -; ≤ 64)."""
    title = schema.get("title") if isinstance(schema, dict) else None
    name = _NAME_RE.sub("_", title).strip("_")[:64] if isinstance(title, str) else ""
    return name or "response"


class ChatCompletionChunkDecoder(StreamDecoder):
    """``chat.completion.chunk`` events, the usage chunk and ``[DONE]``."""

    def __init__(self, provider: OpenAIProvider) -> None:
        super().__init__()
        self.provider = provider

    def feed(self, event: ServerSentEvent) -> list[str]:
        if event.data.strip() == "[DONE]":
            self.done = True
            return []
        data = self.load(event)
        self.provider.raise_for_error_body(data)
        if isinstance(data.get("model"), str) and data["model"]:
            self.model = data["model"]
        usage = data.get("usage")
        if isinstance(usage, dict):
            self.tokens(
                input_tokens=usage.get("prompt_tokens"),
                output_tokens=usage.get("completion_tokens"),
            )
        choices = data.get("choices")
        if choices is None:
            return []
        if not isinstance(choices, list):
            raise MalformedEvent
        texts: list[str] = []
        for choice in choices:
            if not isinstance(choice, dict):
                raise MalformedEvent
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if not isinstance(delta, dict):
                raise MalformedEvent
            content = delta.get("content")
            if content is not None and not isinstance(content, str):
                raise MalformedEvent
            finish = choice.get("finish_reason")
            if finish == "content_filter" or delta.get("refusal"):
                raise ContentPolicyError(
                    "The provider refused the request under its content policy.",
                    code="content_filter",
                )
            if content:
                texts.append(content)
            if finish:
                self.finish_reason = str(finish)
        return self.emit(texts)


class OpenAIProvider(HttpProvider):
    kind: ClassVar[str] = "openai"
    default_base_url: ClassVar[str] = "https://api.openai.com/v1"
    #: Where a pass-through ``max_tokens`` goes when the row's params name neither key.
    max_tokens_key: ClassVar[str] = "max_completion_tokens"
    capabilities: ClassVar[frozenset[str]] = frozenset(
        {"streaming", "structured_output", "tools", "images"}
    )

    def endpoint(self, request: AuditRequest) -> str:
        return f"{self.base_url}/chat/completions"

    def auth_headers(self, api_key: str | None) -> dict[str, str]:
        return {"authorization": f"Bearer {api_key}"} if api_key else {}

    def build_payload(self, request: AuditRequest) -> dict[str, Any]:
        payload: dict[str, Any] = {
            **self.extra_params(_RESERVED),
            "model": self.config.model,
            "messages": chat_messages(request),
        }
        if request.temperature is not None:
            payload["temperature"] = request.temperature
        if request.max_tokens is not None:
            params = self.config.params or {}
            key = next(
                (k for k in ("max_completion_tokens", "max_tokens") if k in params),
                self.max_tokens_key,
            )
            payload.pop("max_tokens", None)
            payload.pop("max_completion_tokens", None)
            payload[key] = request.max_tokens
        if request.response_schema is not None:
            schema = dict(request.response_schema)
            # Strict mode needs every property required and additionalProperties false;
            # a row can relax it with params {"strict_schema": false} (not sent upstream).
            strict = (self.config.params or {}).get("strict_schema", True) is not False
            payload["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": schema_name(schema), "schema": schema, "strict": strict},
            }
        return payload

    def stream_payload(self, request: AuditRequest) -> dict[str, Any]:
        payload = {**self.build_payload(request), "stream": True}
        if (self.config.params or {}).get("stream_include_usage", True) is not False:
            payload["stream_options"] = {"include_usage": True}
        return payload

    def stream_decoder(self, request: AuditRequest) -> StreamDecoder:
        return ChatCompletionChunkDecoder(self)

    def error_details(self, data: Any) -> tuple[str, tuple[object, ...]]:
        error = data.get("error") if isinstance(data, dict) else None
        if isinstance(error, dict):
            message = error.get("message")
            return (
                message if isinstance(message, str) else "",
                (error.get("code"), error.get("type")),
            )
        if isinstance(error, str):  # some compatible servers: {"error": "text"}
            return error, ()
        return "", ()

    def parse(self, data: Any, request: AuditRequest) -> ProviderResult:
        try:
            choice = data["choices"][0]
            message = choice["message"]
        except (KeyError, IndexError, TypeError):
            raise ResponseError("The response has no choices[0].message.") from None
        if not isinstance(message, dict):
            raise ResponseError("choices[0].message is not an object.")
        finish = choice.get("finish_reason") if isinstance(choice, dict) else None
        content = message.get("content")
        if finish == "content_filter" or (message.get("refusal") and not content):
            raise ContentPolicyError(
                "The provider refused the request under its content policy.",
                code="content_filter",
            )
        if content is None:
            content = ""
        if not isinstance(content, str):
            raise ResponseError("choices[0].message.content is not a string.")
        structured = None
        if request.response_schema is not None:
            structured = validate_structured(content, request.response_schema)
        usage = data.get("usage")
        if not isinstance(usage, dict):
            usage = {}
        return self.ok_result(
            model=data.get("model"),
            output=content,
            data=structured,
            input_tokens=usage.get("prompt_tokens", 0),
            output_tokens=usage.get("completion_tokens", 0),
            finish_reason=finish,
        )
