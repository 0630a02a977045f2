"""An OpenAI Responses face of the one router: ``POST /v1/responses`` (stateless).

The request is parsed and translated by
:mod:`~llm_routing.api.responses_serializers`; the answer is the ``response`` object
(``output`` items: a ``message`` with ``output_text``, ``function_call`` items;
``status`` ``completed`` or ``incomplete`` with ``incomplete_details``; ``usage``)
whichever vendor kind served it. A stream is the Responses event sequence
(``response.created``, ``response.in_progress``, ``response.output_item.added``,
``response.content_part.added``, ``response.output_text.delta`` / ``.done``,
``response.content_part.done``, ``response.function_call_arguments.delta`` /
``.done``, ``response.output_item.done``, ``response.completed``), each event with its
``sequence_number``; a failure after the commit point ends it with an ``error`` event
and ``response.failed``. Errors use OpenAI's envelope ``{"error": {"message", "type",
"param", "code"}}``. ``store`` is always false: nothing is kept to be retrieved.
"""

from __future__ import annotations

import time
from typing import Any, ClassVar

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request

from .. import pricing
from ..types import (
    ProviderResult,
    RoutingResult,
    StreamFailure,
    ToolCall,
    Usage,
)
from .faces import Face, FaceView, Frames, Parsed, Problem, StreamEvents, schema_entry
from .openai_compat import finish_reason
from .problems import UNKNOWN_PARAMETER
from .responses_serializers import ResponsesRequestSerializer
from .sse import sse

__all__ = ["ResponsesFace", "ResponsesView", "response_status"]

#: A problem's kind → OpenAI's error type.
ERROR_TYPES = {
    "invalid_request": "invalid_request_error",
    "authentication": "authentication_error",
    "permission": "permission_error",
    "not_found": "invalid_request_error",
    "too_large": "invalid_request_error",
    "rate_limit": "rate_limit_error",
    "upstream": "upstream_error",
    "unavailable": "service_unavailable",
}


#: router error category → the code ``/v1/chat/completions`` answers for it.
_CODES = {
    "context_length": "context_length_exceeded",
    "content_policy": "content_policy_violation",
    "authentication": "upstream_authentication",
    "response": "upstream_bad_response",
    "chain_exhausted": "no_provider_available",
}


def response_id(request_id: str) -> str:
    return "resp_" + request_id.replace("-", "")


def response_status(result: ProviderResult) -> tuple[str, dict[str, str] | None]:
    """``status`` and ``incomplete_details`` for a served answer."""
    reason = finish_reason(result.finish_reason, has_tool_calls=bool(result.tool_calls))
    if reason == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    if reason == "content_filter":
        return "incomplete", {"reason": "content_filter"}
    return "completed", None


def _usage(usage: Usage, routed: RoutingResult | None) -> dict[str, Any]:
    return {
        "input_tokens": usage.input_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": usage.output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.input_tokens + usage.output_tokens,
        "cost_usd": pricing.total_usd(routed) if routed is not None else None,
    }


def _message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    content = [] if status == "in_progress" else [_text_part(text)]
    return {
        "type": "message",
        "id": item_id,
        "status": status,
        "role": "assistant",
        "content": content,
    }


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _call_item(item_id: str, call: ToolCall, status: str) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call.id,
        "name": call.name,
        "arguments": call.arguments,
        "status": status,
    }


def _skeleton(rid: str, created: int, echo: Any, model: str, status: str) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "response",
        "created_at": created,
        "status": status,
        "background": False,
        "error": None,
        "incomplete_details": None,
        "model": model,
        "output": [],
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "store": False,
        "truncation": "disabled",
        "usage": None,
        **echo,
    }


class ResponsesFace(Face):
    name = "responses"
    request_serializer = ResponsesRequestSerializer

    def body(self, routed: RoutingResult, parsed: Parsed) -> dict[str, Any]:
        result = routed.result
        rid = response_id(routed.request_id)
        status, incomplete = response_status(result)
        body = _skeleton(rid, int(time.time()), parsed.echo, result.model, status)
        output: list[dict[str, Any]] = []
        if result.output or not result.tool_calls:
            output.append(_message_item(f"msg_{rid[5:]}_0", result.output, "completed"))
        output += [
            _call_item(f"fc_{rid[5:]}_{i + 1}", c, "completed")
            for i, c in enumerate(result.tool_calls)
        ]
        body.update(
            output=output, incomplete_details=incomplete, usage=_usage(result.usage, routed)
        )
        return body

    def frames(self, request_id: str, parsed: Parsed) -> Frames:
        return _ResponseEvents(request_id, parsed.echo)

    def error_body(self, problem: Problem) -> dict[str, Any]:
        code = "model_not_found" if problem.kind == "not_found" else problem.code
        code = _CODES.get(code or "", code)
        message = problem.message
        if code == UNKNOWN_PARAMETER and problem.param:  # OpenAI's own wording, unprefixed
            message = message.removeprefix(f"{problem.param}: ")
        return {
            "error": {
                "message": message,
                "type": ERROR_TYPES.get(problem.kind, "api_error"),
                "param": problem.param,
                "code": code,
                **problem.extra,
            }
        }


class _ResponseEvents(StreamEvents):
    """The Responses stream events of one answer, router event by router event."""

    empty_text = True  # an answer with neither text nor calls is an empty message item

    def __init__(self, request_id: str, echo: Any) -> None:
        self.rid = response_id(request_id)
        self.created = int(time.time())
        self.echo = echo
        self.sequence = 0
        self.model = ""
        self.started = False
        self.output: list[dict[str, Any]] = []  # finished items
        self.text = ""  # the open message item's text
        self.open: tuple[str, int] | None = None  # ("message", -1) or ("call", call index)
        self.call: list[str] = []  # the open call: id, name, arguments
        self.text_sent = False
        self.calls_sent = False

    def _event(self, name: str, data: dict[str, Any]) -> bytes:
        frame = sse({"type": name, "sequence_number": self.sequence, **data}, event=name)
        self.sequence += 1
        return frame

    def _response(self, status: str) -> dict[str, Any]:
        return _skeleton(self.rid, self.created, self.echo, self.model, status)

    def _start(self, model: str) -> list[bytes]:
        if self.started:
            return []
        self.started = True
        self.model = model
        return [
            self._event("response.created", {"response": self._response("in_progress")}),
            self._event("response.in_progress", {"response": self._response("in_progress")}),
        ]

    @property
    def _item_id(self) -> str:
        prefix = "msg" if self.open and self.open[0] == "message" else "fc"
        return f"{prefix}_{self.rid[5:]}_{len(self.output)}"

    def _close(self) -> list[bytes]:
        if self.open is None:
            return []
        index, item_id = len(self.output), self._item_id
        out: list[bytes] = []
        if self.open[0] == "message":
            where = {"item_id": item_id, "output_index": index, "content_index": 0}
            out.append(
                self._event(
                    "response.output_text.done", {**where, "text": self.text, "logprobs": []}
                )
            )
            out.append(
                self._event("response.content_part.done", {**where, "part": _text_part(self.text)})
            )
            item = _message_item(item_id, self.text, "completed")
        else:
            call = ToolCall(id=self.call[0], name=self.call[1], arguments=self.call[2] or "{}")
            out.append(
                self._event(
                    "response.function_call_arguments.done",
                    {
                        "item_id": item_id,
                        "output_index": index,
                        "name": call.name,
                        "arguments": call.arguments,
                    },
                )
            )
            item = _call_item(item_id, call, "completed")
        out.append(self._event("response.output_item.done", {"output_index": index, "item": item}))
        self.output.append(item)
        self.open, self.text, self.call = None, "", []
        return out

    def _text(self, text: str) -> list[bytes]:
        out: list[bytes] = []
        if self.open != ("message", -1):
            out += self._close()
            self.open = ("message", -1)
            index, item_id = len(self.output), self._item_id
            item = _message_item(item_id, "", "in_progress")
            out.append(
                self._event("response.output_item.added", {"output_index": index, "item": item})
            )
            out.append(
                self._event(
                    "response.content_part.added",
                    {
                        "item_id": item_id,
                        "output_index": index,
                        "content_index": 0,
                        "part": _text_part(""),
                    },
                )
            )
        self.text += text
        self.text_sent = True
        out.append(
            self._event(
                "response.output_text.delta",
                {
                    "item_id": self._item_id,
                    "output_index": len(self.output),
                    "content_index": 0,
                    "delta": text,
                    "logprobs": [],
                },
            )
        )
        return out

    def _call(self, index: int, call_id: str, name: str, arguments: str) -> list[bytes]:
        out: list[bytes] = []
        if self.open != ("call", index):
            out += self._close()
            self.open = ("call", index)
            self.call = [call_id, name, ""]
            item = _call_item(self._item_id, ToolCall(call_id, name, ""), "in_progress")
            out.append(
                self._event(
                    "response.output_item.added", {"output_index": len(self.output), "item": item}
                )
            )
        if arguments:
            self.call[2] += arguments
            out.append(
                self._event(
                    "response.function_call_arguments.delta",
                    {
                        "item_id": self._item_id,
                        "output_index": len(self.output),
                        "delta": arguments,
                    },
                )
            )
        self.calls_sent = True
        return out

    def _finish(self, routed: RoutingResult) -> list[bytes]:
        result = routed.result
        status, incomplete = response_status(result)
        final = self._response(status)
        final.update(
            output=self.output,
            incomplete_details=incomplete,
            usage=_usage(result.usage, routed),
        )
        name = "response.completed" if status == "completed" else "response.incomplete"
        return [self._event(name, {"response": final})]

    def _failure(self, event: StreamFailure) -> list[bytes]:
        # A StreamFailure after the commit point: an error event, then response.failed.
        error = {"code": event.error.category, "message": event.error.message}
        failed = self._response("failed")
        failed.update(output=self.output, error=error)
        return [
            self._event("error", {**error, "param": None}),
            self._event("response.failed", {"response": failed}),
        ]


# --- the schema -------------------------------------------------------------------------


class ResponsesOutputItemSerializer(serializers.Serializer):
    type = serializers.CharField(help_text="message or function_call")
    id = serializers.CharField()
    status = serializers.CharField()
    role = serializers.CharField(required=False)
    content = serializers.ListField(child=serializers.DictField(), required=False)
    call_id = serializers.CharField(required=False)
    name = serializers.CharField(required=False)
    arguments = serializers.CharField(required=False)


class ResponsesUsageSerializer(serializers.Serializer):
    input_tokens = serializers.IntegerField()
    output_tokens = serializers.IntegerField()
    total_tokens = serializers.IntegerField()
    cost_usd = serializers.FloatField(
        allow_null=True, help_text="Extension: USD for every attempt of this request."
    )


class ResponseObjectSerializer(serializers.Serializer):
    """The non-streaming answer (a ``response`` object); streamed answers are SSE
    events (docs/clients.md)."""

    id = serializers.CharField()
    object = serializers.ChoiceField(choices=["response"])
    created_at = serializers.IntegerField()
    status = serializers.ChoiceField(choices=["completed", "incomplete"])
    incomplete_details = serializers.DictField(allow_null=True)
    model = serializers.CharField(help_text="The model that served (never the chain name).")
    output = ResponsesOutputItemSerializer(many=True)
    usage = ResponsesUsageSerializer()
    store = serializers.BooleanField(help_text="Always false: the face is stateless.")


class ResponsesErrorDetailSerializer(serializers.Serializer):
    message = serializers.CharField()
    type = serializers.CharField()
    param = serializers.CharField(allow_null=True)
    code = serializers.CharField(allow_null=True)


class ResponsesErrorSerializer(serializers.Serializer):
    error = ResponsesErrorDetailSerializer()


_EXAMPLE_REQUEST = {
    "model": "default",
    "instructions": "Be brief.",
    "input": "What is the weather in Paris?",
    "tools": [
        {
            "type": "function",
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        }
    ],
}
_EXAMPLE_ANSWER = {
    "id": "resp_0f8e1c2d3b4a59687766554433221100",
    "object": "response",
    "created_at": 1764806400,
    "status": "completed",
    "incomplete_details": None,
    "model": "gpt-4.1-mini",
    "output": [
        {
            "type": "function_call",
            "id": "fc_0f8e1c2d3b4a59687766554433221100_1",
            "call_id": "call_1",
            "name": "get_weather",
            "arguments": '{"city": "Paris"}',
            "status": "completed",
        }
    ],
    "usage": {"input_tokens": 58, "output_tokens": 17, "total_tokens": 75, "cost_usd": 0.00005},
    "store": False,
}


class ResponsesView(FaceView):
    face: ClassVar[Face] = ResponsesFace()

    @extend_schema(
        operation_id="v1_responses_create",
        summary="OpenAI Responses (stateless), served by any provider kind of the chain",
        description="""\
OpenAI's Responses API as a face of the same router, so the `openai` SDK's
`responses.create` and the OpenAI Agents SDK can use it: set the client's base URL to
this app's `/v1` and the API key to a DRF token. `model` names a chain, a route key or
a provider; any vendor kind can serve it, and a request fails over across kinds before
the first token.

`input` (a string, or `message` / `function_call` / `function_call_output` items),
`instructions`, function `tools`, `tool_choice`, `max_output_tokens`, `temperature`,
`top_p`, `text.format` (`json_schema`: structured output), `metadata` and `user` are
translated into the router's request. The face is stateless (the app never stores
prompts): `store: true`, `previous_response_id`, `conversation` and background mode
are 400s saying so, and built-in tools are 400s naming them. The answer is a `response`
object; `stream: true` answers the Responses SSE events (`response.created` …
`response.completed`), and a failure after the first delta ends the stream with `error`
and `response.failed`. Errors are OpenAI's envelope (docs/clients.md).
""",
        request=ResponsesRequestSerializer,
        **schema_entry(
            ResponsesFace(),
            ok=ResponseObjectSerializer,
            error=ResponsesErrorSerializer,
            request_example=_EXAMPLE_REQUEST,
            ok_example=_EXAMPLE_ANSWER,
        ),
    )
    def post(self, request: Request) -> Any:
        return self.handle(request)
