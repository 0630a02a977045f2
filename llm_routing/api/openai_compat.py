"""An OpenAI-compatible face of the same router: ``POST /v1/chat/completions`` and
``GET /v1/models``.

``model`` names a chain, a route key or a provider (in that order of lookup).
Responses use OpenAI's ``chat.completion`` / ``chat.completion.chunk`` shapes with
``model`` set to the model that actually served; errors use OpenAI's
``{"error": {"message", "type", "param", "code"}}`` envelope. Conversations are
flattened for the router: system/developer messages become ``instructions``; a
single user message is the ``input_text``; longer conversations become a transcript
with role labels (the router's request has one input, not a message list).
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Iterator
from typing import Any

from django.http import StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework import exceptions, serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from ..conf import routing_settings
from ..models import Chain, Provider, RoutingRule
from ..router import route_stream
from ..service import execute
from ..types import (
    AuditRequest,
    RoutingResult,
    StreamChunk,
    StreamFailure,
    StreamResult,
)
from .chat_serializers import StrictCharField
from .sse import SSE_HEADERS, sse
from .views import RoutingAPIView

__all__ = ["ChatCompletionsView", "ModelsView"]

ROLES = ("system", "developer", "user", "assistant")


class MessageSerializer(serializers.Serializer):
    role = serializers.ChoiceField(choices=ROLES)
    content = serializers.JSONField()
    name = serializers.CharField(required=False, max_length=64)

    def validate_content(self, value: Any) -> str:
        """A string, or a list of ``{"type": "text", "text": …}`` parts."""
        if isinstance(value, str):
            text = value
        elif isinstance(value, list) and all(
            isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
            for p in value
        ):
            text = "".join(p["text"] for p in value)
        else:
            raise serializers.ValidationError(
                "content must be a string or a list of text parts; other part types are "
                "not supported."
            )
        return str(StrictCharField(allow_blank=True, trim_whitespace=False).run_validation(text))


class ResponseFormatSerializer(serializers.Serializer):
    type = serializers.ChoiceField(choices=["text", "json_object", "json_schema"])
    json_schema = serializers.DictField(required=False)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs["type"] == "json_schema":
            spec = attrs.get("json_schema") or {}
            if not isinstance(spec.get("schema"), dict):
                raise serializers.ValidationError(
                    {"json_schema": ["json_schema.schema must be a JSON Schema object."]}
                )
        return attrs


class StreamOptionsSerializer(serializers.Serializer):
    include_usage = serializers.BooleanField(required=False, default=False)


class ChatCompletionRequestSerializer(serializers.Serializer):
    model = serializers.RegexField(r"^[-a-zA-Z0-9_.:]+$", max_length=64)
    messages = MessageSerializer(many=True, allow_empty=False)
    temperature = serializers.FloatField(required=False, allow_null=True, min_value=0, max_value=2)
    max_tokens = serializers.IntegerField(required=False, allow_null=True, min_value=1)
    max_completion_tokens = serializers.IntegerField(required=False, allow_null=True, min_value=1)
    response_format = ResponseFormatSerializer(required=False, allow_null=True)
    stream = serializers.BooleanField(required=False, default=False)
    stream_options = StreamOptionsSerializer(required=False, allow_null=True)
    n = serializers.IntegerField(required=False, allow_null=True, min_value=1, max_value=1)

    def validate_messages(self, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if not any(m["role"] == "user" and m["content"].strip() for m in value):
            raise serializers.ValidationError("At least one non-empty user message is required.")
        if len(value) > 256:
            raise serializers.ValidationError("At most 256 messages are allowed.")
        return value

    def to_request(self) -> AuditRequest:
        d = self.validated_data
        messages = d["messages"]
        instructions = "\n\n".join(
            m["content"] for m in messages if m["role"] in ("system", "developer")
        )
        turns = [m for m in messages if m["role"] in ("user", "assistant")]
        if len(turns) == 1:
            input_text = turns[0]["content"]
        else:
            input_text = "\n\n".join(f"{m['role']}: {m['content']}" for m in turns)
        if len(input_text) > int(routing_settings.MAX_INPUT_CHARS):
            raise serializers.ValidationError({"messages": ["The conversation is too long."]})
        if len(instructions) > int(routing_settings.MAX_INSTRUCTIONS_CHARS):
            raise serializers.ValidationError({"messages": ["The system messages are too long."]})
        fmt = d.get("response_format") or {}
        schema: dict[str, Any] | None = None
        if fmt.get("type") == "json_schema":
            schema = fmt["json_schema"]["schema"]
        elif fmt.get("type") == "json_object":
            schema = {"type": "object"}
        selection = _select(d["model"])
        return AuditRequest(
            task="chat",
            input_text=input_text,
            instructions=instructions,
            response_schema=schema,
            stream=bool(d.get("stream")),
            temperature=d.get("temperature"),
            max_tokens=d.get("max_completion_tokens") or d.get("max_tokens"),
            **selection,
        )


def _select(model: str) -> dict[str, Any]:
    """``model`` → a chain, a route key, or a provider name."""
    if Chain.objects.filter(name=model).exists():
        return {"chain": model}
    if (
        model in (routing_settings.ROUTES or {})
        or RoutingRule.objects.filter(route=model, enabled=True).exists()
    ):
        return {"route": model}
    if model == "mock" or Provider.objects.filter(name=model).exists():
        return {"provider": model}
    raise exceptions.NotFound(f"The model {model!r} does not exist (see GET /v1/models).")


# --- errors in OpenAI's envelope ------------------------------------------------------

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
}

#: router error category → (HTTP status, OpenAI error type, code)
_CATEGORY_STATUS: dict[str, tuple[int, str, str]] = {
    "invalid_request": (400, "invalid_request_error", "invalid_request"),
    "context_length": (400, "invalid_request_error", "context_length_exceeded"),
    "content_policy": (400, "invalid_request_error", "content_policy_violation"),
    "unsupported": (400, "invalid_request_error", "unsupported"),
    "unknown_provider": (404, "invalid_request_error", "model_not_found"),
    "authentication": (502, "upstream_error", "upstream_authentication"),
    "response": (502, "upstream_error", "upstream_bad_response"),
}


def error_body(message: str, *, type_: str, code: str | None, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def _flatten(detail: Any, prefix: str = "") -> tuple[str, str | None]:
    if isinstance(detail, dict):
        for key, value in detail.items():
            message, _ = _flatten(value, f"{prefix}.{key}" if prefix else str(key))
            return message, (f"{prefix}.{key}" if prefix else str(key))
    if isinstance(detail, list) and detail:
        return _flatten(detail[0], prefix)
    return (f"{prefix}: {detail}" if prefix else str(detail)), (prefix or None)


class OpenAIErrorsMixin:
    def handle_exception(self, exc: Exception) -> Response:
        response: Response = super().handle_exception(exc)  # type: ignore[misc]
        if isinstance(exc, exceptions.APIException):
            message, param = _flatten(exc.detail)
            code = exc.get_codes()
            code_str = code if isinstance(code, str) else None
            if isinstance(exc, exceptions.ValidationError):
                code_str = "invalid_value"
            response.data = error_body(
                message,
                type_=_TYPES.get(response.status_code, "api_error"),
                code=code_str,
                param=param if isinstance(exc, exceptions.ValidationError) else None,
            )
        return response


def _headers(routed: RoutingResult) -> dict[str, str]:
    attempts = [a for a in routed.metadata.attempts if a.outcome != "skipped"]
    return {
        "X-Request-ID": routed.request_id,
        "X-LLM-Provider": routed.result.provider,
        "X-LLM-Attempts": str(sum(a.retries + 1 for a in attempts)),
    }


def _error_response(routed: RoutingResult) -> Response:
    err = routed.result.error
    category = err.category if err else "response"
    status_code, type_, code = _CATEGORY_STATUS.get(
        category, (503, "service_unavailable", category)
    )
    message = err.message if err else "Every candidate failed."
    return Response(
        error_body(message, type_=type_, code=code), status=status_code, headers=_headers(routed)
    )


def _usage(routed: RoutingResult) -> dict[str, int]:
    usage = routed.result.usage
    return {
        "prompt_tokens": usage.input_tokens,
        "completion_tokens": usage.output_tokens,
        "total_tokens": usage.input_tokens + usage.output_tokens,
    }


def _completion_id(request_id: str) -> str:
    return "chatcmpl-" + request_id.replace("-", "")


class ChatCompletionsView(OpenAIErrorsMixin, RoutingAPIView):
    @extend_schema(
        request=ChatCompletionRequestSerializer,
        responses={200: OpenApiTypes.OBJECT},
        summary="OpenAI-compatible chat completions (stream and not)",
    )
    def post(self, request: Request) -> Response | StreamingHttpResponse:
        serializer = ChatCompletionRequestSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        audit_request = serializer.to_request()
        opts = serializer.validated_data.get("stream_options") or {}
        if audit_request.stream:
            return self._stream(audit_request, include_usage=bool(opts.get("include_usage")))
        routed = execute(audit_request)
        if routed.result.status != "ok":
            return _error_response(routed)
        result = routed.result
        content = result.output
        body = {
            "id": _completion_id(routed.request_id),
            "object": "chat.completion",
            "created": int(time.time()),
            "model": result.model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content, "refusal": None},
                    "logprobs": None,
                    "finish_reason": result.finish_reason or "stop",
                }
            ],
            "usage": _usage(routed),
            "system_fingerprint": None,
        }
        return Response(body, headers=_headers(routed))

    def _stream(
        self, audit_request: AuditRequest, *, include_usage: bool
    ) -> Response | StreamingHttpResponse:
        request_id = str(uuid.uuid4())
        events = route_stream(audit_request, request_id=request_id)
        first = next(events)
        if isinstance(first, StreamResult) and first.routed.result.status != "ok":
            return _error_response(first.routed)  # nothing was sent yet: a real HTTP error
        created = int(time.time())
        completion_id = _completion_id(request_id)

        def frames() -> Iterator[bytes]:
            role_sent = False
            stream_model = ""  # every chunk of one stream names the same model
            for event in itertools.chain([first], events):
                if isinstance(event, StreamChunk):
                    stream_model = stream_model or event.model
                    delta: dict[str, Any] = {"content": event.text}
                    if not role_sent:
                        delta = {"role": "assistant", "content": event.text}
                        role_sent = True
                    yield sse(_chunk(completion_id, created, stream_model, delta, None))
                elif isinstance(event, StreamResult):
                    routed = event.routed
                    cid = completion_id
                    model = stream_model or routed.result.model
                    if not role_sent:
                        text = routed.result.output
                        yield sse(
                            _chunk(
                                cid, created, model, {"role": "assistant", "content": text}, None
                            )
                        )
                    yield sse(
                        _chunk(cid, created, model, {}, routed.result.finish_reason or "stop")
                    )
                    if include_usage:
                        yield sse(
                            {
                                "id": cid,
                                "object": "chat.completion.chunk",
                                "created": created,
                                "model": model,
                                "choices": [],
                                "usage": _usage(routed),
                            }
                        )
                    yield sse("[DONE]")
                elif isinstance(event, StreamFailure):
                    # After the first chunk: an in-band error, and no [DONE].
                    yield sse(
                        error_body(
                            event.error.message,
                            type_="upstream_error",
                            code=event.error.category,
                        )
                    )

        response = StreamingHttpResponse(frames(), content_type="text/event-stream")
        for name, value in SSE_HEADERS.items():
            response[name] = value
        response["X-Request-ID"] = request_id
        if isinstance(first, StreamChunk):
            response["X-LLM-Provider"] = first.provider
        return response


def _chunk(
    completion_id: str, created: int, model: str, delta: dict[str, Any], finish: str | None
) -> dict[str, Any]:
    return {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "system_fingerprint": None,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }


class ModelsView(OpenAIErrorsMixin, RoutingAPIView):
    @extend_schema(
        responses={200: OpenApiTypes.OBJECT},
        summary="What `model` may name: chains, route keys, providers",
    )
    def get(self, request: Request) -> Response:
        created = 0
        ids: list[tuple[str, str]] = [(c.name, "chain") for c in Chain.objects.order_by("name")]
        routes = set(routing_settings.ROUTES or {}) | set(
            RoutingRule.objects.filter(enabled=True)
            .exclude(route="")
            .values_list("route", flat=True)
        )
        ids += [(r, "route") for r in sorted(routes)]
        ids += [
            (p.name, "provider") for p in Provider.objects.filter(enabled=True).order_by("name")
        ]
        if not any(name == "mock" for name, _ in ids):
            ids.append(("mock", "provider"))
        seen: set[str] = set()
        data = []
        for name, kind in ids:
            if name in seen:
                continue
            seen.add(name)
            data.append({"id": name, "object": "model", "created": created, "owned_by": kind})
        return Response({"object": "list", "data": data}, status=status.HTTP_200_OK)
