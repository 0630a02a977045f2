"""Google Gemini API ``generateContent``.

Endpoint: ``POST {base_url}/v1beta/models/{model}:generateContent``.

Request: the key goes in the ``x-goog-api-key`` header — never in the URL, where it
would reach access logs; body ``{"contents": [{"role": "user", "parts": [{"text"}]}],
"systemInstruction"?: {"parts": [{"text"}]}, "generationConfig": {…}}``. Row ``params``
map to ``generationConfig`` (``temperature``, ``max_tokens`` → ``maxOutputTokens``,
``top_p`` → ``topP``, ``top_k`` → ``topK``, ``stop`` → ``stopSequences``; camelCase
keys pass through). Structured output: ``responseMimeType: "application/json"`` and
``responseSchema`` (the OpenAPI subset Gemini accepts: keys outside it are dropped).
Response: ``candidates[0].content.parts[].text``, ``candidates[0].finishReason``
(``STOP``, ``MAX_TOKENS``, ``SAFETY``, ``RECITATION``, ``PROHIBITED_CONTENT`` …),
``promptFeedback.blockReason``, ``usageMetadata.promptTokenCount`` /
``candidatesTokenCount``, ``modelVersion``.
Errors: ``{"error": {"code", "message", "status", "details"}}`` — ``status`` a
google.rpc code name: ``INVALID_ARGUMENT`` (400; "API key not valid" with reason
``API_KEY_INVALID`` means authentication), ``PERMISSION_DENIED`` (403),
``RESOURCE_EXHAUSTED`` (429), ``INTERNAL`` (500), ``UNAVAILABLE`` (503),
``DEADLINE_EXCEEDED`` (504).

Streaming: ``POST …/models/{model}:streamGenerateContent?alt=sse``; every ``data:``
event is a whole ``GenerateContentResponse`` (text in
``candidates[0].content.parts[].text``, ``finishReason`` on the last one,
``usageMetadata`` and ``modelVersion``). There is no end marker: the body's clean end
after a finish reason completes the stream. The key stays in the header.

Pass-through: the request's ``temperature`` and ``max_tokens`` (``maxOutputTokens``)
override the row's params. A continuation ``prefill`` is a trailing
``{"role": "model", "parts": [{"text": …}]}`` turn.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar
from urllib.parse import quote

from httpx_sse import ServerSentEvent

from ..errors import ContentPolicyError, ResponseError
from ..types import AuditRequest, ProviderResult
from .base import HttpProvider, validate_structured
from .streaming import MalformedEvent, StreamDecoder, StreamItem

__all__ = ["GeminiProvider", "GeminiStreamDecoder", "gemini_schema"]

_PARAM_NAMES = {
    "max_tokens": "maxOutputTokens",
    "max_output_tokens": "maxOutputTokens",
    "top_p": "topP",
    "top_k": "topK",
    "stop": "stopSequences",
    "stop_sequences": "stopSequences",
    "candidate_count": "candidateCount",
    "presence_penalty": "presencePenalty",
    "frequency_penalty": "frequencyPenalty",
}
_RESERVED = frozenset({"responseMimeType", "responseSchema", "response_schema"})
#: Keys of Gemini's ``Schema`` object (an OpenAPI 3.0 subset).
_SCHEMA_KEYS = frozenset(
    {
        "type",
        "format",
        "title",
        "description",
        "nullable",
        "enum",
        "maxItems",
        "minItems",
        "properties",
        "required",
        "minProperties",
        "maxProperties",
        "minLength",
        "maxLength",
        "pattern",
        "example",
        "anyOf",
        "propertyOrdering",
        "default",
        "items",
        "minimum",
        "maximum",
    }
)
_BLOCKED_FINISH = frozenset(
    {"SAFETY", "RECITATION", "PROHIBITED_CONTENT", "BLOCKLIST", "SPII", "IMAGE_SAFETY"}
)


def gemini_schema(schema: Any, *, depth: int = 0) -> Any:
    """The request's JSON Schema reduced to Gemini's ``Schema`` subset.

    ``type: [X, "null"]`` becomes ``type: X, nullable: true``; unsupported keywords
    (``additionalProperties``, ``$schema``, ``$defs`` …) are dropped. The full schema is
    still enforced locally with jsonschema on the answer.
    """
    if depth > 32 or not isinstance(schema, Mapping):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key not in _SCHEMA_KEYS:
            continue
        if key == "type" and isinstance(value, list):
            kinds = [k for k in value if k != "null"]
            out["type"] = kinds[0] if kinds else "null"
            if "null" in value:
                out["nullable"] = True
        elif key == "properties" and isinstance(value, Mapping):
            out[key] = {k: gemini_schema(v, depth=depth + 1) for k, v in value.items()}
        elif key == "items":
            out[key] = gemini_schema(value, depth=depth + 1)
        elif key == "anyOf" and isinstance(value, list):
            out[key] = [gemini_schema(v, depth=depth + 1) for v in value]
        else:
            out[key] = value
    return out


class GeminiStreamDecoder(StreamDecoder):
    """``streamGenerateContent?alt=sse`` events: one GenerateContentResponse each."""

    def __init__(self, provider: GeminiProvider) -> None:
        super().__init__()
        self.provider = provider

    def feed(self, event: ServerSentEvent) -> list[StreamItem]:
        data = self.load(event)
        self.provider.raise_for_error_body(data)
        if isinstance(data.get("modelVersion"), str) and data["modelVersion"]:
            self.model = data["modelVersion"]
        usage = data.get("usageMetadata")
        if isinstance(usage, dict):
            self.tokens(
                input_tokens=usage.get("promptTokenCount"),
                output_tokens=usage.get("candidatesTokenCount"),
            )
        candidates = data.get("candidates")
        feedback = data.get("promptFeedback")
        if isinstance(feedback, dict) and feedback.get("blockReason") and not candidates:
            raise ContentPolicyError(
                "The provider blocked the prompt under its content policy.",
                code=str(feedback.get("blockReason")),
            )
        if candidates is None:
            return []
        if not isinstance(candidates, list) or not candidates:
            raise MalformedEvent
        candidate = candidates[0]
        if not isinstance(candidate, dict):
            raise MalformedEvent
        content = candidate.get("content")
        parts = content.get("parts") if isinstance(content, dict) else None
        if parts is not None and not isinstance(parts, list):
            raise MalformedEvent
        texts = [
            p["text"]
            for p in parts or ()
            if isinstance(p, dict) and isinstance(p.get("text"), str) and not p.get("thought")
        ]
        finish = candidate.get("finishReason")
        if finish in _BLOCKED_FINISH:
            raise ContentPolicyError(
                "The provider withheld the answer under its content policy.", code=str(finish)
            )
        if isinstance(finish, str) and finish and finish != "FINISH_REASON_UNSPECIFIED":
            self.finish_reason = finish
        return self.emit(texts)


class GeminiProvider(HttpProvider):
    capabilities: ClassVar[frozenset[str]] = frozenset(
        {"streaming", "structured_output", "tools", "images"}
    )
    kind: ClassVar[str] = "gemini"
    default_base_url: ClassVar[str] = "https://generativelanguage.googleapis.com"

    def endpoint(self, request: AuditRequest) -> str:
        model = self.config.model.removeprefix("models/")
        return f"{self.base_url}/v1beta/models/{quote(model, safe='.-_')}:generateContent"

    def stream_endpoint(self, request: AuditRequest) -> str:
        base = self.endpoint(request).removesuffix(":generateContent")
        return f"{base}:streamGenerateContent?alt=sse"

    def stream_payload(self, request: AuditRequest) -> dict[str, Any]:
        return self.build_payload(request)  # the method, not the body, says "stream"

    def stream_decoder(self, request: AuditRequest) -> StreamDecoder:
        return GeminiStreamDecoder(self)

    def auth_headers(self, api_key: str | None) -> dict[str, str]:
        return {"x-goog-api-key": api_key} if api_key else {}

    def build_payload(self, request: AuditRequest) -> dict[str, Any]:
        config: dict[str, Any] = {}
        for key, value in (self.config.params or {}).items():
            if key in _RESERVED:
                continue
            config[_PARAM_NAMES.get(key, key)] = value
        if request.temperature is not None:
            config["temperature"] = request.temperature
        if request.max_tokens is not None:
            config["maxOutputTokens"] = request.max_tokens
        if request.response_schema is not None:
            config["responseMimeType"] = "application/json"
            config["responseSchema"] = gemini_schema(dict(request.response_schema))
        contents: list[dict[str, Any]] = [{"role": "user", "parts": [{"text": request.input_text}]}]
        if request.prefill:
            contents.append({"role": "model", "parts": [{"text": request.prefill}]})
        payload: dict[str, Any] = {"contents": contents}
        if request.instructions:
            payload["systemInstruction"] = {"parts": [{"text": request.instructions}]}
        if config:
            payload["generationConfig"] = config
        return payload

    def error_details(self, data: Any) -> tuple[str, tuple[object, ...]]:
        error = data.get("error") if isinstance(data, dict) else None
        if not isinstance(error, dict):
            return "", ()
        message = error.get("message")
        codes: list[object] = [error.get("status"), error.get("code")]
        for detail in error.get("details") or ():
            if isinstance(detail, dict):
                codes.append(detail.get("reason"))
        return message if isinstance(message, str) else "", tuple(codes)

    def parse(self, data: Any, request: AuditRequest) -> ProviderResult:
        if not isinstance(data, dict):
            raise ResponseError("The response is not a JSON object.")
        feedback = data.get("promptFeedback")
        candidates = data.get("candidates")
        if isinstance(feedback, dict) and feedback.get("blockReason") and not candidates:
            raise ContentPolicyError(
                "The provider blocked the prompt under its content policy.",
                code=str(feedback.get("blockReason")),
            )
        if not isinstance(candidates, list) or not candidates:
            raise ResponseError("The response has no candidates.")
        candidate = candidates[0]
        if not isinstance(candidate, dict):
            raise ResponseError("candidates[0] is not an object.")
        finish = candidate.get("finishReason")
        content = candidate.get("content")
        parts = content.get("parts") if isinstance(content, dict) else None
        texts = [
            p["text"]
            for p in parts or ()
            if isinstance(p, dict) and isinstance(p.get("text"), str) and not p.get("thought")
        ]
        if finish in _BLOCKED_FINISH and not texts:
            raise ContentPolicyError(
                "The provider withheld the answer under its content policy.", code=str(finish)
            )
        if parts is None and finish not in {"MAX_TOKENS"}:
            raise ResponseError("candidates[0].content.parts is missing.")
        output = "".join(texts)
        structured = None
        if request.response_schema is not None:
            structured = validate_structured(output, request.response_schema)
        usage = data.get("usageMetadata")
        if not isinstance(usage, dict):
            usage = {}
        return self.ok_result(
            model=data.get("modelVersion"),
            output=output,
            data=structured,
            input_tokens=usage.get("promptTokenCount", 0),
            output_tokens=usage.get("candidatesTokenCount", 0),
            finish_reason=finish,
        )
