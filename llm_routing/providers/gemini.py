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

Pass-through: the request's ``temperature``, ``max_tokens`` (``maxOutputTokens``),
``top_p`` (``topP``), ``stop`` (``stopSequences``) and ``seed`` override the row's
params; ``user`` has no Gemini equivalent and is dropped. A continuation ``prefill`` is
a trailing ``{"role": "model", "parts": [{"text": …}]}`` turn.

The conversation: ``system`` and ``developer`` turns go to ``systemInstruction`` (their
texts joined by a blank line); user turns are ``{"role": "user", "parts"}``, assistant
turns ``{"role": "model", "parts"}`` — text parts, ``functionCall`` parts
``{name, args}`` for tool calls (args the parsed JSON arguments: anything but a JSON
object is an invalid request). ``tool`` turns become ``functionResponse`` parts
``{name, response}`` of one user turn (consecutive results share it): the name is the
turn's ``name`` or that of the earlier call with its ``tool_call_id``; the response is
the result's JSON object, anything else wrapped as ``{"result": …}``. Call ids are not
sent: Gemini matches responses to calls by name and order. Images: a base64 ``data:``
URL becomes ``inlineData``, an http(s) URL ``fileData.fileUri`` (Gemini reads only
URLs it can reach — its File API, Cloud Storage, some public hosts; others fail
upstream with 400). ``tools`` → ``[{"functionDeclarations": [{name, description,
parameters}]}]`` (parameters reduced like ``responseSchema``); ``tool_choice`` →
``toolConfig.functionCallingConfig`` ``mode`` ``AUTO`` / ``ANY`` / ``NONE``, a named
function ``ANY`` with ``allowedFunctionNames``. A response's ``functionCall`` parts
become ``result.tool_calls`` (the part's ``id`` when present, else ``call_<n>``;
arguments the compact JSON of ``args``); streamed, each arrives whole in one event and
is forwarded as one fragment with its full arguments.

Embeddings: one input is ``POST …/models/{model}:embedContent`` with ``{"content":
{"parts": [{"text"}]}, "outputDimensionality"?}`` → ``{"embedding": {"values"}}``;
several are ``…:batchEmbedContents`` with ``{"requests": [{"model": "models/{model}",
"content", "outputDimensionality"?}, …]}`` → ``{"embeddings": [{"values"}, …]}``.
``outputDimensionality`` is the client's ``dimensions``, else the row's
``params.dimensions``. Gemini takes text only (a token-array input is an invalid
request) and reports no token usage for embeddings: the input tokens are estimated at
four characters a token (``usageMetadata.promptTokenCount`` is used when present).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, ClassVar
from urllib.parse import quote

from httpx_sse import ServerSentEvent

from ..errors import ContentPolicyError, InvalidRequestError, ResponseError
from ..types import AuditRequest, ContentPart, ForcedTool, Message, ProviderResult, ToolCall
from .base import HttpProvider, validate_structured
from .chat import arguments_object, compact_json, data_url, split_system
from .embeddings import estimated_tokens, vector_of
from .streaming import MalformedEvent, StreamDecoder, StreamItem

__all__ = ["GeminiProvider", "GeminiStreamDecoder", "gemini_contents", "gemini_schema"]

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
_MODES = {"auto": "AUTO", "required": "ANY", "none": "NONE"}
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


def gemini_contents(turns: list[Message]) -> list[dict[str, Any]]:
    """User, assistant and tool turns as ``contents``."""
    out: list[dict[str, Any]] = []
    names: dict[str, str] = {}  # tool_call_id → function name, from earlier calls
    results_open = False
    for message in turns:
        if message.role == "tool":
            name = message.name or names.get(message.tool_call_id or "")
            if not name:
                raise InvalidRequestError(
                    "A tool message needs its tool's name (name, or the tool_call_id of "
                    "an earlier call) for Gemini."
                )
            part = {"functionResponse": {"name": name, "response": _response_object(message)}}
            if results_open:
                out[-1]["parts"].append(part)
            else:
                out.append({"role": "user", "parts": [part]})
                results_open = True
            continue
        results_open = False
        parts = _parts(message.content)
        if message.role == "assistant":
            if message.tool_calls and not message.text:
                parts = [p for p in parts if "text" not in p]
            for call in message.tool_calls:
                names[call.id] = call.name
                parts.append({"functionCall": {"name": call.name, "args": arguments_object(call)}})
            out.append({"role": "model", "parts": parts})
        else:
            out.append({"role": "user", "parts": parts})
    return out


def _parts(content: str | tuple[ContentPart, ...]) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"text": content}]
    parts: list[dict[str, Any]] = []
    for part in content:
        if part.type == "text":
            parts.append({"text": part.text})
            continue
        inline = data_url(part.image_url)
        if inline is not None:
            parts.append({"inlineData": {"mimeType": inline[0], "data": inline[1]}})
        elif part.image_url.startswith(("https://", "http://")):
            parts.append({"fileData": {"fileUri": part.image_url}})
        else:
            raise InvalidRequestError("An image URL must be http(s) or a base64 data: URL.")
    return parts


def _response_object(message: Message) -> dict[str, Any]:
    """A tool result as the JSON object Gemini requires (others wrapped in ``result``)."""
    text = message.text
    try:
        value: Any = json.loads(text)
    except (ValueError, RecursionError):
        value = text
    return value if isinstance(value, dict) else {"result": value}


def _parameters(schema: Mapping[str, Any]) -> dict[str, Any]:
    """``{"parameters": …}`` of a function declaration, or nothing: Gemini rejects an
    object schema without properties (a function without arguments has none)."""
    reduced = gemini_schema(dict(schema)) if schema else {}
    if not reduced or (reduced.get("type") == "object" and not reduced.get("properties")):
        return {}
    return {"parameters": reduced}


def _tool_config(choice: str | ForcedTool) -> dict[str, Any]:
    if isinstance(choice, ForcedTool):
        config: dict[str, Any] = {"mode": "ANY", "allowedFunctionNames": [choice.name]}
    else:
        config = {"mode": _MODES[choice]}
    return {"functionCallingConfig": config}


def _function_call(part: dict[str, Any]) -> tuple[str | None, str, str] | None:
    """(id, name, arguments JSON) of a ``functionCall`` part; None for other parts."""
    call = part.get("functionCall")
    if call is None:
        return None
    name = call.get("name") if isinstance(call, dict) else None
    if not isinstance(call, dict) or not isinstance(name, str) or not name:
        raise ResponseError("A functionCall part has no name.")
    call_id = call.get("id")
    args = call.get("args")
    return (
        call_id if isinstance(call_id, str) and call_id else None,
        name,
        compact_json({} if args is None else args),
    )


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
        items: list[StreamItem] = []
        for part in parts or ():
            if not isinstance(part, dict) or part.get("thought"):
                continue
            if isinstance(part.get("text"), str):
                items.extend(self.emit([part["text"]]))
                continue
            try:
                call = _function_call(part)
            except ResponseError:
                raise MalformedEvent from None
            if call is not None:
                call_id, name, arguments = call
                key = object()  # each Gemini call arrives whole: a key of its own
                items.append(self.start_tool_call(key, id=call_id, name=name, arguments=arguments))
        finish = candidate.get("finishReason")
        if finish in _BLOCKED_FINISH:
            raise ContentPolicyError(
                "The provider withheld the answer under its content policy.", code=str(finish)
            )
        if isinstance(finish, str) and finish and finish != "FINISH_REASON_UNSPECIFIED":
            self.finish_reason = finish
        return items


class GeminiProvider(HttpProvider):
    capabilities: ClassVar[frozenset[str]] = frozenset(
        {"streaming", "structured_output", "tools", "images", "embeddings"}
    )
    kind: ClassVar[str] = "gemini"
    default_base_url: ClassVar[str] = "https://generativelanguage.googleapis.com"
    usage_keys: ClassVar[tuple[str, str, str]] = (
        "usageMetadata",
        "promptTokenCount",
        "candidatesTokenCount",
    )

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
        if request.top_p is not None:
            config["topP"] = request.top_p
        if request.stop:
            config["stopSequences"] = list(request.stop)
        if request.seed is not None:
            config["seed"] = request.seed
        if request.response_schema is not None:
            config["responseMimeType"] = "application/json"
            config["responseSchema"] = gemini_schema(dict(request.response_schema))
        if request.messages:
            system, turns = split_system(request.conversation)
            contents = gemini_contents(turns)
        else:  # the one-shot form, built directly (the adapter's per-call cost)
            system = request.instructions
            contents = [{"role": "user", "parts": [{"text": request.input_text}]}]
        if request.prefill:
            contents.append({"role": "model", "parts": [{"text": request.prefill}]})
        payload: dict[str, Any] = {"contents": contents}
        if system:
            payload["systemInstruction"] = {"parts": [{"text": system}]}
        if request.tools:
            payload["tools"] = [
                {
                    "functionDeclarations": [
                        {
                            "name": tool.name,
                            **({"description": tool.description} if tool.description else {}),
                            **_parameters(tool.parameters),
                        }
                        for tool in request.tools
                    ]
                }
            ]
        if request.tool_choice is not None:
            payload["toolConfig"] = _tool_config(request.tool_choice)
        if config:
            payload["generationConfig"] = config
        return payload

    def embed_endpoint(self, request: AuditRequest) -> str:
        base = self.endpoint(request).removesuffix(":generateContent")
        return f"{base}:{'embedContent' if len(request.inputs) == 1 else 'batchEmbedContents'}"

    def embed_payload(self, request: AuditRequest) -> dict[str, Any]:
        texts = [x for x in request.inputs if isinstance(x, str)]
        if len(texts) != len(request.inputs):
            raise InvalidRequestError("Gemini embeds text only, not token arrays.")
        dimensions = request.dimensions or (self.config.params or {}).get("dimensions")
        extra = {"outputDimensionality": dimensions} if dimensions is not None else {}
        if len(texts) == 1:
            return {"content": {"parts": [{"text": texts[0]}]}, **extra}
        model = f"models/{self.config.model.removeprefix('models/')}"
        return {
            "requests": [
                {"model": model, "content": {"parts": [{"text": text}]}, **extra} for text in texts
            ]
        }

    def parse_embeddings(self, data: Any, request: AuditRequest) -> ProviderResult:
        if not isinstance(data, dict):
            raise ResponseError("The response is not a JSON object.")
        if "embedding" in data:
            items: Any = [data["embedding"]]
        else:
            items = data.get("embeddings")
        if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
            raise ResponseError("The response has no embeddings.")
        vectors = tuple(
            vector_of(item.get("values"), f"embeddings[{n}].values") for n, item in enumerate(items)
        )
        usage = data.get("usageMetadata")
        reported = usage.get("promptTokenCount") if isinstance(usage, dict) else None
        return self.ok_result(
            model=self.config.model,
            output="",
            input_tokens=reported if reported is not None else estimated_tokens(request.inputs),
            vectors=vectors,
        )

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
        tool_calls: list[ToolCall] = []
        for part in parts or ():
            call = _function_call(part) if isinstance(part, dict) else None
            if call is not None:
                call_id, name, arguments = call
                tool_calls.append(
                    ToolCall(
                        id=call_id or f"call_{len(tool_calls)}", name=name, arguments=arguments
                    )
                )
        if finish in _BLOCKED_FINISH and not texts and not tool_calls:
            raise ContentPolicyError(
                "The provider withheld the answer under its content policy.", code=str(finish)
            )
        if parts is None and finish not in {"MAX_TOKENS"}:
            raise ResponseError("candidates[0].content.parts is missing.")
        output = "".join(texts)
        structured = None
        # A tool-call answer carries no structured text to validate.
        if request.response_schema is not None and (output or not tool_calls):
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
            tool_calls=tuple(tool_calls),
        )
