"""An OpenAI-compatible face of the same router: ``POST /v1/chat/completions`` and
``GET /v1/models``.

``model`` names a chain, a route key or a provider (in that order of lookup). The
conversation is passed through as messages (roles and order intact), with tools,
``tool_choice`` and the sampling parameters. Responses use OpenAI's ``chat.completion``
/ ``chat.completion.chunk`` shapes with ``model`` set to the model that actually served,
tool calls as ``message.tool_calls`` / ``delta.tool_calls``, and ``finish_reason`` mapped
to OpenAI's values; errors use OpenAI's ``{"error": {"message", "type", "param",
"code"}}`` envelope. The request is strict: unknown parameters, wrong types and
parameters the router cannot honour are 400s naming the parameter. A chain whose real
candidates were all skipped or failed answers 503 (no mock answer presented as a real
one) unless the chain sets ``mock_backstop``.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Mapping
from typing import Any

from django.http.response import HttpResponseBase
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import exceptions, serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from .. import pricing, snapshot
from ..access import NOBODY, Viewer, may_see, viewer_for
from ..conf import routing_settings
from ..logging import current_request_id
from ..router import aroute_stream, route_stream
from ..service import aexecute, execute
from ..types import (
    AuditRequest,
    ProviderResult,
    RouterStreamEvent,
    RoutingResult,
    StreamChunk,
    StreamResult,
)
from .base import RoutingAPIView
from .budget_guard import BudgetRefused
from .chat_serializers import (
    ClosedSerializer,
    MessagesField,
    SamplingSerializer,
    StrictBooleanField,
    StrictCharField,
    StrictIntegerField,
    ToolChoiceField,
    ToolsField,
    check_conversation,
    check_input,
    check_output_schema,
    requested_schema,
)
from .problems import flatten, routed_problem, routing_headers
from .reuse import reused
from .schema_docs import CHAT_COMPLETIONS, MODELS
from .serializers import (
    ToolCallSerializer,
    model_name_field,
    output_tokens_within_limit,
)
from .sse import (
    EventFrames,
    SSENegotiationMixin,
    aclose_events,
    aevent_frames,
    afirst_event,
    routed_stream_response,
    sse,
)

logger = logging.getLogger("llm_routing.api")

__all__ = [
    "ChatCompletionRequestSerializer",
    "ChatCompletionSerializer",
    "ChatCompletionsView",
    "ModelsView",
    "OpenAIErrorSerializer",
    "finish_reason",
]

#: The ``/v1`` faces a ``GET /v1/models`` entry can be named on: every chain, route and
#: provider serves every chat face (any vendor kind behind it translates each one).
SERVED_FACES = ("/v1/chat/completions", "/v1/responses", "/v1/messages")
#: Served by a name only when one of its providers serves embeddings (:func:`_embeds`).
EMBEDDINGS_FACE = "/v1/embeddings"


def _embeds(config: snapshot.ConfigSnapshot, providers: list[str]) -> bool:
    """Whether one of ``providers`` (enabled, its kind known) serves embeddings: its
    row's ``supports_embeddings``, else its kind's declaration (the built-in mock does)."""
    from ..providers.registry import get_adapter_class, is_known_kind

    for name in providers:
        row = config.provider(name)
        if row is None:
            if name == "mock":
                return True
            continue
        kind = "mock" if row.mode == "mock" or name == "mock" else row.kind
        if not row.enabled or not is_known_kind(kind):
            continue
        try:
            if get_adapter_class(kind)(row.to_config()).supports("embeddings"):
                return True
        except Exception as exc:  # a custom kind that cannot be imported serves nothing
            logger.warning("Cannot build adapter for provider %s (%s).", name, type(exc).__name__)
    return False


def _members(config: snapshot.ConfigSnapshot, name: str, kind: str) -> list[str]:
    """The providers a ``/v1/models`` entry may route to."""
    if kind == "provider":
        return [name]
    if kind == "chain":
        chain = config.chain(name)
        return [p for p, _ in chain.provider_names()] if chain else []
    routes = routing_settings.ROUTES or {}
    members = [str(p) for p in routes.get(name, ())]
    for rule in config.rules:
        if rule.route == name:
            members += [p for p, _ in rule.chain.provider_names()]
    return members


#: Known OpenAI parameters the router does not implement, accepted only with a value
#: that asks for nothing (the neutral default); anything else is a 400 naming them.
NEUTRAL_VALUES: dict[str, tuple[Any, ...]] = {
    "logprobs": (False,),
    "top_logprobs": (0,),
    "presence_penalty": (0,),
    "frequency_penalty": (0,),
    "logit_bias": ({},),
    "parallel_tool_calls": (True,),
    "store": (False,),
    "service_tier": ("auto", "default"),
    "metadata": ({},),
    "modalities": (["text"],),
    "functions": (),
    "function_call": (),
    "audio": (),
    "prediction": (),
    "reasoning_effort": (),
    "web_search_options": (),
}


def _is_neutral(name: str, value: Any) -> bool:
    if value is None:
        return True
    for neutral in NEUTRAL_VALUES[name]:
        if isinstance(neutral, bool) or isinstance(value, bool):
            if value is neutral:
                return True
        elif value == neutral and type(value) in (type(neutral), float):
            return True
    return False


def _neutral_text(name: str) -> str:
    shown = ["null", *(json.dumps(v) for v in NEUTRAL_VALUES[name])]
    return " or ".join(shown)


class JsonSchemaFormatSerializer(ClosedSerializer):
    name = StrictCharField(required=False, max_length=64)
    description = StrictCharField(required=False, allow_blank=True)
    schema = serializers.JSONField()
    strict = StrictBooleanField(required=False, allow_null=True)

    def validate_schema(self, value: Any) -> Any:
        problem = check_output_schema(value)
        if problem:
            raise serializers.ValidationError(problem)
        return value


class ResponseFormatSerializer(ClosedSerializer):
    type = serializers.ChoiceField(choices=["text", "json_object", "json_schema"])
    json_schema = JsonSchemaFormatSerializer(required=False)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs["type"] == "json_schema" and "json_schema" not in attrs:
            raise serializers.ValidationError(
                {"json_schema": ['type "json_schema" needs json_schema.schema.']}
            )
        return attrs


class StreamOptionsSerializer(ClosedSerializer):
    include_usage = StrictBooleanField(required=False, default=False)


class ChatCompletionRequestSerializer(SamplingSerializer):
    """The body of ``POST /v1/chat/completions``: OpenAI's parameters, strictly typed.

    An unknown top-level parameter is a 400 naming it; the parameters listed in
    :data:`NEUTRAL_VALUES` are accepted only with their neutral value."""

    model = model_name_field()
    messages = MessagesField()
    tools = ToolsField(required=False, allow_null=True)
    tool_choice = ToolChoiceField(required=False, allow_null=True)
    max_completion_tokens = StrictIntegerField(required=False, allow_null=True, min_value=1)
    response_format = ResponseFormatSerializer(required=False, allow_null=True)
    stream = StrictBooleanField(required=False, default=False)
    stream_options = StreamOptionsSerializer(required=False, allow_null=True)
    n = StrictIntegerField(required=False, allow_null=True, min_value=1, max_value=1)

    def to_internal_value(self, data: Any) -> Any:
        check_input(data)  # the input boundary, once (llm_routing.boundary)
        if isinstance(data, Mapping):
            for name in data:
                if name in NEUTRAL_VALUES:
                    if not _is_neutral(name, data[name]):
                        raise serializers.ValidationError(
                            {
                                name: [
                                    f"{name} is not supported by this router; it is accepted "
                                    f"only as {_neutral_text(name)}."
                                ]
                            }
                        )
                elif name not in self.fields:
                    raise serializers.ValidationError(
                        {name: [f"Unrecognized request argument supplied: {name}"]}
                    )
            data = {k: v for k, v in data.items() if k not in NEUTRAL_VALUES}
        return super().to_internal_value(data)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        problems = check_conversation(attrs)
        if problems:
            raise serializers.ValidationError(problems)
        return attrs

    def validate_max_tokens(self, value: int | None) -> int | None:
        return output_tokens_within_limit(value)

    def validate_max_completion_tokens(self, value: int | None) -> int | None:
        return output_tokens_within_limit(value)

    def to_request(self) -> AuditRequest:
        d = self.validated_data
        fmt = d.get("response_format") or {}
        schema = requested_schema(fmt.get("type"), (fmt.get("json_schema") or {}).get("schema"))
        sampling = self.sampling()
        sampling["max_tokens"] = d.get("max_completion_tokens") or d.get("max_tokens")
        return AuditRequest(
            task="chat",
            messages=d["messages"],
            tools=d.get("tools") or (),
            tool_choice=d.get("tool_choice"),
            response_schema=schema,
            stream=bool(d.get("stream")),
            backstop=False,  # an exhausted chain is a 503, unless the chain opts in
            **sampling,
            **select_model(d["model"]),
        )


def select_model(model: str) -> dict[str, Any]:
    """``model`` → a chain, a route key, or a provider name (in that order of lookup),
    for every ``/v1`` face; 404 naming it otherwise (the words of a hidden one)."""
    config = snapshot.current()  # no configuration rows on the request path
    if config.chain(model) is not None:
        return {"chain": model}
    if model in (routing_settings.ROUTES or {}) or config.has_route_rule(model):
        return {"route": model}
    if model == "mock" or config.provider(model) is not None:
        return {"provider": model}
    raise model_not_found(model)


def model_not_found(model: str) -> exceptions.NotFound:
    """The 404 of a ``model`` that names nothing, or something the caller may not use:
    the same status, code and words for both, so names cannot be enumerated."""
    return exceptions.NotFound(
        f"The model {model!r} does not exist or you do not have access to it (see GET /v1/models).",
        code="model_not_found",
    )


def visible_model(audit_request: AuditRequest, viewer: Viewer) -> bool:
    """Whether ``viewer`` may see the chain, route or provider the request's ``model``
    named (:func:`llm_routing.access.may_see`)."""
    if audit_request.chain:
        return may_see(viewer, "chain", audit_request.chain)
    if audit_request.route:
        return may_see(viewer, "route", audit_request.route, task=audit_request.task)
    return may_see(viewer, "provider", audit_request.provider or "")


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

#: router error category → (OpenAI error type, code); the HTTP status is the one of
#: every /v1 face (api.problems.CATEGORY_STATUS).
_CATEGORY_TYPE: dict[str, tuple[str, str]] = {
    "invalid_request": ("invalid_request_error", "invalid_request"),
    "context_length": ("invalid_request_error", "context_length_exceeded"),
    "content_policy": ("invalid_request_error", "content_policy_violation"),
    "unsupported": ("invalid_request_error", "unsupported"),
    "unknown_provider": ("invalid_request_error", "model_not_found"),
    "authentication": ("upstream_error", "upstream_authentication"),
    "response": ("upstream_error", "upstream_bad_response"),
    "chain_exhausted": ("service_unavailable", "no_provider_available"),
}


class ChatCompletionMessageSerializer(serializers.Serializer):
    role = serializers.ChoiceField(choices=["assistant"])
    content = serializers.CharField(allow_null=True, help_text="null when only tool calls.")
    refusal = serializers.CharField(allow_null=True)
    tool_calls = ToolCallSerializer(many=True, required=False)


class ChatCompletionChoiceSerializer(serializers.Serializer):
    index = serializers.IntegerField()
    message = ChatCompletionMessageSerializer()
    logprobs = serializers.JSONField(allow_null=True)
    finish_reason = serializers.ChoiceField(
        choices=["stop", "length", "tool_calls", "content_filter"]
    )


class ChatCompletionUsageSerializer(serializers.Serializer):
    prompt_tokens = serializers.IntegerField()
    completion_tokens = serializers.IntegerField()
    total_tokens = serializers.IntegerField()
    cost_usd = serializers.FloatField(
        allow_null=True,
        help_text="Extension: USD for every attempt of this request (failed ones that "
        "consumed tokens included); null when a price is unknown.",
    )


class ChatCompletionSerializer(serializers.Serializer):
    """The non-streaming answer (``chat.completion``); streamed answers are SSE
    ``chat.completion.chunk`` events (docs/api.md)."""

    id = serializers.CharField(help_text="chatcmpl- + the routing request id")
    object = serializers.ChoiceField(choices=["chat.completion"])
    created = serializers.IntegerField()
    model = serializers.CharField(help_text="The model that served (never the chain name).")
    choices = ChatCompletionChoiceSerializer(many=True)
    usage = ChatCompletionUsageSerializer()
    system_fingerprint = serializers.CharField(allow_null=True)


class OpenAIErrorDetailSerializer(serializers.Serializer):
    message = serializers.CharField()
    type = serializers.CharField(help_text="invalid_request_error, service_unavailable …")
    param = serializers.CharField(
        allow_null=True, help_text="The request parameter at fault (400s), e.g. messages.2.content"
    )
    code = serializers.CharField(allow_null=True)
    request_id = serializers.CharField(
        required=False, help_text="503 only: the routing decision's request id."
    )
    candidates = serializers.ListField(
        child=serializers.DictField(),
        required=False,
        help_text="503 only: each candidate as {provider, outcome, reason} — the skip "
        "reason (unsupported, missing_key, circuit_open …) or the error category.",
    )


class OpenAIErrorSerializer(serializers.Serializer):
    error = OpenAIErrorDetailSerializer()


def error_body(
    message: str, *, type_: str, code: str | None, param: str | None = None, **extra: Any
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code, **extra}}


class OpenAIErrorsMixin:
    def handle_exception(self, exc: Exception) -> Response:
        response: Response = super().handle_exception(exc)  # type: ignore[misc]
        if isinstance(exc, BudgetRefused):  # budgets: their fields in the envelope
            response.data = exc.openai_body()
        elif isinstance(exc, exceptions.APIException):
            message, param = flatten(exc.detail)
            code = exc.get_codes()
            code_str = code if isinstance(code, str) else None
            if isinstance(exc, exceptions.ValidationError):
                code_str = "invalid_value"
                if message.startswith(f"{param}: Unrecognized request argument"):
                    code_str, message = "unknown_parameter", message.split(": ", 1)[1]
            response.data = error_body(
                message,
                type_=_TYPES.get(response.status_code, "api_error"),
                code=code_str,
                param=param if isinstance(exc, exceptions.ValidationError) else None,
            )
        return response


def _error_response(routed: RoutingResult, viewer: Viewer = NOBODY) -> Response:
    """The error in OpenAI's envelope; a 503 names only the candidates ``viewer`` may
    see (:func:`llm_routing.api.problems.routed_problem`)."""
    problem = routed_problem(routed, viewer)
    category = problem.code or ""
    type_, code = _CATEGORY_TYPE.get(category, ("service_unavailable", category))
    return Response(
        error_body(problem.message, type_=type_, code=code, **problem.extra),
        status=problem.status,
        headers=routing_headers(routed, viewer),
    )


#: vendor stop reasons → OpenAI's finish_reason values
_FINISH_REASONS = {
    "stop": "stop",
    "end_turn": "stop",
    "stop_sequence": "stop",
    "STOP": "stop",
    "pause_turn": "stop",
    "length": "length",
    "max_tokens": "length",
    "MAX_TOKENS": "length",
    "model_context_window_exceeded": "length",
    "tool_calls": "tool_calls",
    "tool_use": "tool_calls",
    "function_call": "tool_calls",
    "functionCall": "tool_calls",
    "content_filter": "content_filter",
    "refusal": "content_filter",
    "SAFETY": "content_filter",
    "RECITATION": "content_filter",
    "BLOCKLIST": "content_filter",
    "PROHIBITED_CONTENT": "content_filter",
    "SPII": "content_filter",
    "IMAGE_SAFETY": "content_filter",
}


def finish_reason(vendor_reason: str | None, *, has_tool_calls: bool) -> str:
    """OpenAI's ``finish_reason`` (stop / length / tool_calls / content_filter) for a
    vendor's own stop reason. An answer with tool calls finishes with ``tool_calls``
    (Gemini reports ``STOP`` for those); an unknown or missing reason is ``stop``."""
    reason = _FINISH_REASONS.get(vendor_reason or "", "stop")
    if has_tool_calls and reason == "stop":
        return "tool_calls"
    return reason


def _message(result: ProviderResult) -> dict[str, Any]:
    message: dict[str, Any] = {
        "role": "assistant",
        "content": result.output if (result.output or not result.tool_calls) else None,
        "refusal": None,
    }
    if result.tool_calls:
        message["tool_calls"] = [c.to_dict() for c in result.tool_calls]
    return message


def _usage(routed: RoutingResult) -> dict[str, Any]:
    """OpenAI's usage object plus the extension ``cost_usd`` (every attempt's cost, the
    failed ones included; null when a price is unknown)."""
    usage = routed.result.usage
    return {
        "prompt_tokens": usage.input_tokens,
        "completion_tokens": usage.output_tokens,
        "total_tokens": usage.input_tokens + usage.output_tokens,
        "cost_usd": pricing.total_usd(routed),
    }


def _completion_id(request_id: str) -> str:
    return "chatcmpl-" + request_id.replace("-", "")


def _with_shapes(entry: dict[str, Any]) -> dict[str, Any]:
    """The reference text of api/schema_docs.py with this face's own shapes: the
    ``chat.completion`` serializer for 200, OpenAI's error envelope for every error."""
    responses: dict[Any, Any] = {}
    for code, documented_answer in entry["responses"].items():
        status_code = code[0] if isinstance(code, tuple) else code
        shape = ChatCompletionSerializer if status_code == 200 else OpenAIErrorSerializer
        responses[code] = OpenApiResponse(response=shape, description=documented_answer.description)
    return {**entry, "responses": responses}


_CHAT_DOCS = _with_shapes(CHAT_COMPLETIONS)


class ChatCompletionsView(SSENegotiationMixin, OpenAIErrorsMixin, RoutingAPIView):
    async_method = "post"
    admits_inline = True
    viewer: Viewer = NOBODY  # set by admit: who is asking (access.viewer_for)

    @extend_schema(request=ChatCompletionRequestSerializer, **_CHAT_DOCS)
    def post(self, request: Request) -> HttpResponseBase:
        return self.handle(request)

    def admit(self, request: Request) -> tuple[AuditRequest, bool]:
        """The validated, authorized request and whether the stream ends with usage."""
        with reused(ChatCompletionRequestSerializer, request.data) as serializer:
            serializer.is_valid(raise_exception=True)
            audit_request = serializer.to_request()
            model = serializer.validated_data["model"]
            opts = serializer.validated_data.get("stream_options") or {}
        # What the caller may not use is answered as what does not exist (same 404).
        self.viewer = viewer_for(request.user)
        if not visible_model(audit_request, self.viewer):
            raise model_not_found(model)
        return self.authorize(request, audit_request), bool(opts.get("include_usage"))

    def answer(self, request: Request, admitted: tuple[AuditRequest, bool]) -> HttpResponseBase:
        audit_request, include_usage = admitted
        if not audit_request.stream:
            routed = execute(audit_request, request_id=current_request_id())
            return _completion_response(routed, self.viewer)
        request_id = current_request_id() or str(uuid.uuid4())
        events = route_stream(audit_request, request_id=request_id)
        first = next(events)
        if isinstance(first, StreamResult) and first.routed.result.status != "ok":
            # nothing was sent yet: a real HTTP error
            return _error_response(first.routed, self.viewer)
        frames = _Frames(request_id, include_usage=include_usage)
        body = EventFrames(events, frames, head=(first,))
        return routed_stream_response(body, request_id, first)

    async def aanswer(
        self, request: Request, admitted: tuple[AuditRequest, bool]
    ) -> HttpResponseBase:
        audit_request, include_usage = admitted
        if not audit_request.stream:
            routed = await aexecute(audit_request, request_id=current_request_id())
            return _completion_response(routed, self.viewer)
        request_id = current_request_id() or str(uuid.uuid4())
        events = aroute_stream(audit_request, request_id=request_id)
        first = await afirst_event(events)
        if isinstance(first, StreamResult) and first.routed.result.status != "ok":
            await aclose_events(events)
            # nothing was sent yet: a real HTTP error
            return _error_response(first.routed, self.viewer)
        frames = _Frames(request_id, include_usage=include_usage)
        return routed_stream_response(aevent_frames(events, frames, (first,)), request_id, first)


def _completion_response(routed: RoutingResult, viewer: Viewer = NOBODY) -> Response:
    """The ``chat.completion`` answer, or the error in OpenAI's envelope."""
    if routed.result.status != "ok":
        return _error_response(routed, viewer)
    result = routed.result
    body = {
        "id": _completion_id(routed.request_id),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": result.model,
        "choices": [
            {
                "index": 0,
                "message": _message(result),
                "logprobs": None,
                "finish_reason": finish_reason(
                    result.finish_reason, has_tool_calls=bool(result.tool_calls)
                ),
            }
        ],
        "usage": _usage(routed),
        "system_fingerprint": None,
    }
    return Response(body, headers=routing_headers(routed))


class _Frames:
    """The ``chat.completion.chunk`` SSE frames of one streamed answer, router event by
    router event: one shaping for the sync and the async driver."""

    def __init__(self, request_id: str, *, include_usage: bool) -> None:
        self.completion_id = _completion_id(request_id)
        self.created = int(time.time())
        self.include_usage = include_usage
        self.role_sent = False
        self.streamed_calls = False
        self.stream_model = ""  # every chunk of one stream names the same model

    def __call__(self, event: RouterStreamEvent) -> list[bytes]:
        cid, created = self.completion_id, self.created
        if isinstance(event, StreamChunk):
            self.stream_model = self.stream_model or event.model
            delta: dict[str, Any] = (
                {"tool_calls": [event.tool_call.to_dict()]}
                if event.tool_call is not None
                else {"content": event.text}
            )
            self.streamed_calls = self.streamed_calls or event.tool_call is not None
            if not self.role_sent:
                delta = {"role": "assistant", **delta}
                self.role_sent = True
            return [sse(_chunk(cid, created, self.stream_model, delta, None))]
        if isinstance(event, StreamResult):
            routed = event.routed
            result = routed.result
            model = self.stream_model or result.model
            out: list[bytes] = []
            if not self.role_sent or (result.tool_calls and not self.streamed_calls):
                # Nothing (or no tool call) was streamed: send the answer whole.
                whole: dict[str, Any] = {"role": "assistant"}
                if not self.role_sent:
                    whole["content"] = result.output
                if result.tool_calls and not self.streamed_calls:
                    whole["tool_calls"] = [
                        {"index": i, **c.to_dict()} for i, c in enumerate(result.tool_calls)
                    ]
                out.append(sse(_chunk(cid, created, model, whole, None)))
            finish = finish_reason(result.finish_reason, has_tool_calls=bool(result.tool_calls))
            out.append(sse(_chunk(cid, created, model, {}, finish)))
            if self.include_usage:
                out.append(
                    sse(
                        {
                            "id": cid,
                            "object": "chat.completion.chunk",
                            "created": created,
                            "model": model,
                            "choices": [],
                            "usage": _usage(routed),
                        }
                    )
                )
            out.append(sse("[DONE]"))
            return out
        # A StreamFailure, after the first chunk: an in-band error, and no [DONE].
        return [
            sse(error_body(event.error.message, type_="upstream_error", code=event.error.category))
        ]


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
    @extend_schema(**MODELS)  # the reference text: api/schema_docs.py
    @extend_schema(
        responses={200: OpenApiTypes.OBJECT},
        summary="What `model` may name: chains, route keys, providers",
    )
    def get(self, request: Request) -> Response:
        created = 0
        # Only what this caller may use (access.may_see; docs/operations.md, "Who sees
        # what"): /v1 routes every request with the task "chat".
        viewer = viewer_for(request.user)
        config = snapshot.current()
        ids: list[tuple[str, str]] = [
            (name, "chain")
            for name in sorted(config.chains)
            if may_see(viewer, "chain", name, config=config)
        ]
        routes = set(routing_settings.ROUTES or {}) | {r.route for r in config.rules if r.route}
        ids += [
            (r, "route")
            for r in sorted(routes)
            if may_see(viewer, "route", r, task="chat", config=config)
        ]
        ids += [
            (name, "provider")
            for name, p in sorted(config.providers.items())
            if p.enabled and may_see(viewer, "provider", name, config=config)
        ]
        if not any(name == "mock" for name, _ in ids):
            ids.append(("mock", "provider"))
        seen: set[str] = set()
        data = []
        for name, kind in ids:
            if name in seen:
                continue
            seen.add(name)
            data.append(
                {
                    "id": name,
                    "object": "model",
                    "created": created,
                    "owned_by": kind,
                    # the /v1 paths that take it as model
                    "faces": [
                        *SERVED_FACES,
                        *(
                            [EMBEDDINGS_FACE]
                            if _embeds(config, _members(config, name, kind))
                            else []
                        ),
                    ],
                }
            )
        return Response({"object": "list", "data": data}, status=status.HTTP_200_OK)
