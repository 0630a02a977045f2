"""OpenAI Chat Completions (``POST {base_url}/chat/completions``).

Request: ``Authorization: Bearer <key>``; body ``{"model", "messages": [system?, user],
…params}``; structured output through ``response_format`` ``{"type": "json_schema",
"json_schema": {"name", "schema", "strict": true}}``.
Response: ``choices[0].message.content`` (or ``.refusal``), ``choices[0].finish_reason``,
``usage.prompt_tokens`` / ``usage.completion_tokens``, ``model``.
Errors: ``{"error": {"message", "type", "param", "code"}}`` — ``code`` such as
``context_length_exceeded``, ``invalid_api_key``, ``rate_limit_exceeded``,
``insufficient_quota``, ``content_policy_violation``.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

from ..errors import ContentPolicyError, ResponseError
from ..types import AuditRequest, ProviderResult
from .base import HttpProvider, validate_structured

__all__ = ["OpenAIProvider", "chat_messages", "schema_name"]

_RESERVED = frozenset(
    {"model", "messages", "stream", "stream_options", "response_format", "n", "strict_schema"}
)
_NAME_RE = re.compile(r"[^a-zA-Z0-9_-]+")


def chat_messages(request: AuditRequest) -> list[dict[str, str]]:
    messages: list[dict[str, str]] = []
    if request.instructions:
        messages.append({"role": "system", "content": request.instructions})
    messages.append({"role": "user", "content": request.input_text})
    return messages


def schema_name(schema: Any) -> str:
    """A ``json_schema.name``: the schema's title made safe (a-z, 0-9, _ and -; ≤ 64)."""
    title = schema.get("title") if isinstance(schema, dict) else None
    name = _NAME_RE.sub("_", title).strip("_")[:64] if isinstance(title, str) else ""
    return name or "response"


class OpenAIProvider(HttpProvider):
    kind: ClassVar[str] = "openai"
    default_base_url: ClassVar[str] = "https://api.openai.com/v1"

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
