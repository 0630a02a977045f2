"""An Anthropic Messages face of the one router: ``POST /v1/messages`` and
``POST /v1/messages/count_tokens``.

The request is parsed and translated by
:mod:`~llm_routing.api.messages_serializers`; the answer is Anthropic's ``message``
object (``text`` and ``tool_use`` content blocks, ``stop_reason`` ``end_turn`` /
``max_tokens`` / ``stop_sequence`` / ``tool_use`` / ``refusal``, ``usage``) whichever
vendor kind served it. A stream is Anthropic's event sequence: ``message_start``,
``ping``, per block ``content_block_start`` / ``content_block_delta`` (``text_delta``,
``input_json_delta``) / ``content_block_stop``, then ``message_delta`` and
``message_stop``; a failure after the commit point ends it with an ``error`` event.
Errors are Anthropic's envelope ``{"type": "error", "error": {"type", "message"}}``.
Clients authenticate with ``x-api-key`` (the Anthropic SDK) as well as Bearer/Token;
``anthropic-version`` and ``anthropic-beta`` headers are accepted and ignored.

``count_tokens`` answers an estimate (:func:`estimate_tokens`: four characters a token
over the conversation and tool definitions), not a vendor tokenizer's count.
"""

from __future__ import annotations

import json
import math
from typing import Any, ClassVar

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from .. import pricing
from ..types import (
    AuditRequest,
    ProviderResult,
    RoutingResult,
    StreamFailure,
    ToolCall,
)
from .faces import (
    Face,
    FaceView,
    Frames,
    Parsed,
    Problem,
    StreamEvents,
    schema_entry,
    select_model,
)
from .messages_serializers import MessagesRequestSerializer, TokenCountRequestSerializer
from .openai_compat import finish_reason
from .sse import sse

__all__ = [
    "CountTokensView",
    "MessagesFace",
    "MessagesView",
    "estimate_tokens",
    "stop_reason",
]

#: A problem's kind → Anthropic's error type.
ERROR_TYPES = {
    "invalid_request": "invalid_request_error",
    "authentication": "authentication_error",
    "permission": "permission_error",
    "not_found": "not_found_error",
    "too_large": "request_too_large",
    "rate_limit": "rate_limit_error",
    "unavailable": "overloaded_error",
}

_STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "content_filter": "refusal",
}


def stop_reason(result: ProviderResult) -> str:
    """Anthropic's ``stop_reason`` for any vendor's finish reason."""
    if result.finish_reason == "stop_sequence":
        return "stop_sequence"
    reason = finish_reason(result.finish_reason, has_tool_calls=bool(result.tool_calls))
    return _STOP_REASONS[reason]


def message_id(request_id: str) -> str:
    return "msg_" + request_id.replace("-", "")


def _input(call: ToolCall) -> Any:
    try:
        value = json.loads(call.arguments or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _tool_use(call: ToolCall) -> dict[str, Any]:
    return {"type": "tool_use", "id": call.id, "name": call.name, "input": _input(call)}


def _usage(routed: RoutingResult) -> dict[str, Any]:
    usage = routed.result.usage
    return {
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "cost_usd": pricing.total_usd(routed),
    }


class MessagesFace(Face):
    name = "messages"
    request_serializer = MessagesRequestSerializer

    def body(self, routed: RoutingResult, parsed: Parsed) -> dict[str, Any]:
        result = routed.result
        content: list[dict[str, Any]] = []
        if result.output or not result.tool_calls:
            content.append({"type": "text", "text": result.output})
        content += [_tool_use(c) for c in result.tool_calls]
        return {
            "id": message_id(routed.request_id),
            "type": "message",
            "role": "assistant",
            "model": result.model,
            "content": content,
            "stop_reason": stop_reason(result),
            "stop_sequence": None,
            "usage": _usage(routed),
        }

    def frames(self, request_id: str, parsed: Parsed) -> Frames:
        return _MessageEvents(request_id)

    def error_body(self, problem: Problem) -> dict[str, Any]:
        error = {
            "type": ERROR_TYPES.get(problem.kind, "api_error"),
            "message": problem.message,
            **problem.extra,
        }
        return {"type": "error", "error": error}


class _MessageEvents(StreamEvents):
    """Anthropic's stream events of one answer, router event by router event."""

    def __init__(self, request_id: str) -> None:
        self.id = message_id(request_id)
        self.started = False
        self.blocks = 0  # content blocks opened so far
        self.open: tuple[str, int] | None = None  # ("text", -1) or ("tool", call index)
        self.text_sent = False
        self.calls_sent = False

    @staticmethod
    def _event(name: str, data: dict[str, Any]) -> bytes:
        return sse({"type": name, **data}, event=name)

    def _start(self, model: str) -> list[bytes]:
        if self.started:
            return []
        self.started = True
        message: dict[str, Any] = {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }
        return [self._event("message_start", {"message": message}), self._event("ping", {})]

    def _close(self) -> list[bytes]:
        if self.open is None:
            return []
        self.open = None
        return [self._event("content_block_stop", {"index": self.blocks - 1})]

    def _open(self, key: tuple[str, int], block: dict[str, Any]) -> list[bytes]:
        out = self._close()
        self.open = key
        self.blocks += 1
        out.append(
            self._event("content_block_start", {"index": self.blocks - 1, "content_block": block})
        )
        return out

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return self._event("content_block_delta", {"index": self.blocks - 1, "delta": delta})

    def _text(self, text: str) -> list[bytes]:
        out: list[bytes] = []
        if self.open != ("text", -1):
            out += self._open(("text", -1), {"type": "text", "text": ""})
        out.append(self._delta({"type": "text_delta", "text": text}))
        self.text_sent = True
        return out

    def _call(self, index: int, call_id: str, name: str, arguments: str) -> list[bytes]:
        out: list[bytes] = []
        if self.open != ("tool", index):
            block = {"type": "tool_use", "id": call_id, "name": name, "input": {}}
            out += self._open(("tool", index), block)
        if arguments:
            out.append(self._delta({"type": "input_json_delta", "partial_json": arguments}))
        self.calls_sent = True
        return out

    def _finish(self, routed: RoutingResult) -> list[bytes]:
        usage = routed.result.usage
        return [
            self._event(
                "message_delta",
                {
                    "delta": {"stop_reason": stop_reason(routed.result), "stop_sequence": None},
                    "usage": {
                        "input_tokens": usage.input_tokens,
                        "output_tokens": usage.output_tokens,
                    },
                },
            ),
            self._event("message_stop", {}),
        ]

    def _failure(self, event: StreamFailure) -> list[bytes]:
        # A StreamFailure after the commit point: an in-band error, no message_stop.
        error_type = "overloaded_error" if event.error.category == "unavailable" else "api_error"
        return [
            self._event("error", {"error": {"type": error_type, "message": event.error.message}})
        ]


# --- the schema -------------------------------------------------------------------------


class MessagesContentBlockSerializer(serializers.Serializer):
    type = serializers.CharField(help_text="text or tool_use")
    text = serializers.CharField(required=False)
    id = serializers.CharField(required=False)
    name = serializers.CharField(required=False)
    input = serializers.JSONField(required=False)


class MessagesUsageSerializer(serializers.Serializer):
    input_tokens = serializers.IntegerField()
    output_tokens = serializers.IntegerField()
    cost_usd = serializers.FloatField(
        allow_null=True, help_text="Extension: USD for every attempt of this request."
    )


class MessageSerializer(serializers.Serializer):
    """The non-streaming answer (Anthropic's ``message``); streamed answers are SSE
    events (docs/clients.md)."""

    id = serializers.CharField()
    type = serializers.CharField(help_text="message")
    role = serializers.ChoiceField(choices=["assistant"])
    model = serializers.CharField(help_text="The model that served (never the chain name).")
    content = MessagesContentBlockSerializer(many=True)
    stop_reason = serializers.ChoiceField(
        choices=["end_turn", "max_tokens", "stop_sequence", "tool_use", "refusal"]
    )
    stop_sequence = serializers.CharField(allow_null=True)
    usage = MessagesUsageSerializer()


class MessagesErrorDetailSerializer(serializers.Serializer):
    type = serializers.CharField(help_text="invalid_request_error, overloaded_error …")
    message = serializers.CharField()


class AnthropicErrorSerializer(serializers.Serializer):
    type = serializers.CharField(help_text="error")
    error = MessagesErrorDetailSerializer()


class TokenCountSerializer(serializers.Serializer):
    input_tokens = serializers.IntegerField(help_text="An estimate: 4 characters a token.")


_EXAMPLE_REQUEST = {
    "model": "default",
    "max_tokens": 256,
    "system": "Be brief.",
    "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
    "tools": [
        {
            "name": "get_weather",
            "description": "The weather in a city.",
            "input_schema": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        }
    ],
}
_EXAMPLE_ANSWER = {
    "id": "msg_0f8e1c2d3b4a59687766554433221100",
    "type": "message",
    "role": "assistant",
    "model": "claude-sonnet-4-5",
    "content": [
        {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"city": "Paris"}}
    ],
    "stop_reason": "tool_use",
    "stop_sequence": None,
    "usage": {"input_tokens": 412, "output_tokens": 38, "cost_usd": 0.00181},
}


class MessagesView(FaceView):
    face: ClassVar[Face] = MessagesFace()
    extra_authentication = ("llm_routing.api.authentication.ApiKeyHeaderAuthentication",)

    @extend_schema(
        operation_id="v1_messages_create",
        summary="Anthropic Messages, served by any provider kind of the chain",
        description="""\
Anthropic's Messages API as a face of the same router, so the Anthropic SDK (and any
tool that takes an Anthropic base URL) can use it: set the base URL to this app and the
API key to a DRF token (sent as `x-api-key`; Bearer/Token work too; `anthropic-version`
is accepted). `model` names a chain, a route key or a provider; any vendor kind can
serve it, and a request fails over across kinds before the first token.

`max_tokens` is required. `system`, `messages` (text, image, tool_use, tool_result
blocks), client `tools`, `tool_choice`, `stop_sequences`, `temperature`, `top_p` and
`metadata.user_id` are translated into the router's request; an unknown parameter,
`top_k`, server tools and `disable_parallel_tool_use` are 400s naming them. The answer
is a `message` with `text` / `tool_use` blocks and `stop_reason`; `stream: true`
answers Anthropic's SSE events (`message_start` … `message_stop`), and a failure after
the first delta ends the stream with an `error` event. Errors are Anthropic's envelope
`{"type": "error", "error": {"type", "message"}}` (docs/clients.md).
""",
        request=MessagesRequestSerializer,
        **schema_entry(
            MessagesFace(),
            ok=MessageSerializer,
            error=AnthropicErrorSerializer,
            request_example=_EXAMPLE_REQUEST,
            ok_example=_EXAMPLE_ANSWER,
        ),
    )
    def post(self, request: Request) -> Any:
        return self.handle(request)


def estimate_tokens(request: AuditRequest) -> int:
    """An estimate of the input tokens of ``request``: four characters a token over the
    conversation and the tool definitions (no vendor tokenizer is called)."""
    tools = json.dumps([t.to_dict() for t in request.tools]) if request.tools else ""
    return max(1, math.ceil((request.input_length + len(tools)) / 4))


class CountTokensView(FaceView):
    face: ClassVar[Face] = MessagesFace()
    extra_authentication = MessagesView.extra_authentication
    async_method = None  # nothing is routed: the sync view under both servers
    admits_inline = False

    @extend_schema(
        operation_id="v1_messages_count_tokens",
        summary="An estimate of a Messages request's input tokens",
        description="""\
The Anthropic SDK's `messages.count_tokens`. The request is validated as
`POST /v1/messages` validates it (without `max_tokens`: unknown parameters, blocks,
tools and `model` are checked the same way, in the same envelope) and answered with an
estimate: four characters a token over the conversation and the tool definitions. No
vendor tokenizer is called, nothing is routed and nothing is recorded, so treat the
number as an order of magnitude for a context-window guard, never as a bill.
""",
        request=TokenCountRequestSerializer,
        **schema_entry(
            MessagesFace(),
            ok=TokenCountSerializer,
            error=AnthropicErrorSerializer,
            request_example={
                "model": "default",
                "messages": [{"role": "user", "content": "How long is this?"}],
            },
            ok_example={"input_tokens": 57},
            codes=(400, 401, 404),
        ),
    )
    def post(self, request: Request) -> Response:
        serializer = TokenCountRequestSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        select_model(serializer.validated_data["model"])  # 404 for a name that routes nowhere
        return Response({"input_tokens": estimate_tokens(serializer.conversation())})
