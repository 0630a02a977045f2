"""The body of ``POST /v1/responses`` (OpenAI Responses, stateless), strictly parsed and
translated into the router's request.

``input`` (a string, or items) is translated into the chat shapes of
:mod:`~llm_routing.api.chat_serializers` and checked there (one set of checks for
every face), with the errors' places put back in Responses terms (``input.3``):

* a string → one ``user`` turn; ``instructions`` → a leading ``system`` turn;
* a ``message`` item (``user`` / ``system`` / ``developer`` / ``assistant``, content a
  string or ``input_text`` / ``input_image`` / ``output_text`` parts) → that turn;
* ``function_call`` items → tool calls of the assistant turn just before them (or of a
  new one), ``function_call_output`` → a ``tool`` turn;
* function ``tools`` (flat: ``name``, ``description``, ``parameters``, ``strict``) →
  the router's tools; a built-in tool (web search, file search, computer use, code
  interpreter …) is a 400 naming it;
* ``text.format`` ``json_schema`` → the router's structured output (``json_object``:
  any object), ``max_output_tokens`` → ``max_tokens``.

The face is stateless (the app never stores prompts or answers): ``store: true``,
``previous_response_id``, ``conversation``, ``background: true`` and item references
are 400s saying so. An unknown parameter is a 400 naming it (``code:
unknown_parameter``); known parameters the router cannot honour are accepted only with
their neutral value (:data:`NEUTRAL_VALUES`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from ..conf import routing_settings
from ..types import AuditRequest, ForcedTool, Message, Tool, ToolChoice
from .chat_serializers import (
    MessagesField,
    StrictBooleanField,
    StrictCharField,
    StrictFloatField,
    StrictIntegerField,
    ToolsField,
    check_conversation,
    check_output_schema,
    refuse_unknown,
    requested_schema,
    tool_objects,
)
from .faces import select_model
from .problems import UNKNOWN_PARAMETER
from .serializers import StrictStringMapField, model_name_field, output_tokens_within_limit

__all__ = ["BUILTIN_TOOLS", "NEUTRAL_VALUES", "STATELESS", "ResponsesRequestSerializer"]

STATELESS = (
    "this face is stateless: the app never stores prompts or answers, so send the whole "
    "conversation in input"
)
#: Parameters that ask for server-side state, and the values that do not.
STATEFUL: dict[str, tuple[Any, ...]] = {
    "store": (False,),
    "previous_response_id": (),
    "conversation": (),
    "background": (False,),
}
#: Known parameters the router does not implement, accepted only with a neutral value.
NEUTRAL_VALUES: dict[str, tuple[Any, ...]] = {
    "parallel_tool_calls": (True,),
    "include": ([],),
    "truncation": ("disabled",),
    "reasoning": ({}, {"effort": "none"}, {"effort": None}),
    "service_tier": ("auto", "default"),
    "stream_options": ({}, {"include_obfuscation": False}, {"include_obfuscation": True}),
    "top_logprobs": (0,),
}
#: The built-in tool types of the Responses API (none is served by this router).
BUILTIN_TOOLS = (
    "web_search",
    "web_search_preview",
    "web_search_preview_2025_03_11",
    "file_search",
    "computer_use_preview",
    "computer_use",
    "code_interpreter",
    "image_generation",
    "mcp",
    "local_shell",
    "shell",
    "apply_patch",
    "custom",
)


def _same(value: Any, neutral: Any) -> bool:
    if isinstance(value, Mapping) and isinstance(neutral, Mapping):  # null members: unset
        value = {k: v for k, v in value.items() if v is not None}
        return value == {k: v for k, v in neutral.items() if v is not None}
    if isinstance(value, bool) or isinstance(neutral, bool):
        return value is neutral
    return bool(value == neutral and type(value) is type(neutral))


def _refuse(place: str, message: str, code: str | None = None) -> serializers.ValidationError:
    return serializers.ValidationError({place: [message]}, code=code)


def _content(raw: Any, role: str, place: str) -> Any:
    """A message item's content → chat content (a string or chat parts)."""
    if isinstance(raw, str):
        return raw
    if not isinstance(raw, list):
        raise _refuse(f"{place}.content", "Expected a string or a list of content parts.")
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(raw):
        at = f"{place}.content.{j}"
        kind = part.get("type") if isinstance(part, Mapping) else None
        if not isinstance(part, Mapping):
            raise _refuse(at, "Expected a content part with a type.")
        if kind in ("input_text", "output_text"):
            allowed = {"type", "text"} | (
                {"annotations", "logprobs"} if kind == "output_text" else set()
            )
            _keys(part, allowed, at)
            for extra in ("annotations", "logprobs"):
                if part.get(extra) not in (None, []):
                    raise _refuse(f"{at}.{extra}", f"{extra} are not supported by this router.")
            parts.append({"type": "text", "text": part.get("text")})
        elif kind == "refusal" and role == "assistant":
            _keys(part, {"type", "refusal"}, at)
            parts.append({"type": "text", "text": part.get("refusal")})
        elif kind == "input_image":
            _keys(part, {"type", "image_url", "detail", "file_id"}, at)
            if part.get("file_id") is not None:
                raise _refuse(f"{at}.file_id", f"Files are not supported: {STATELESS}.")
            image: dict[str, Any] = {"url": part.get("image_url")}
            if part.get("detail") is not None:
                image["detail"] = part["detail"]
            parts.append({"type": "image_url", "image_url": image})
        else:
            raise _refuse(
                f"{at}.type",
                "A content part is input_text, input_image or (assistant) output_text"
                + (f"; {kind!r} is not supported." if isinstance(kind, str) else "."),
            )
    if all(p["type"] == "text" and isinstance(p["text"], str) for p in parts):
        return "".join(p["text"] for p in parts)
    return parts


def _keys(item: Mapping[str, Any], allowed: set[str], place: str) -> None:
    for key in item:
        if key not in allowed:
            raise _refuse(
                f"{place}.{key}", f"Unknown parameter: '{place}.{key}'.", UNKNOWN_PARAMETER
            )


def _output_text(raw: Any, place: str) -> str:
    """``function_call_output.output``: a string or input_text parts."""
    if isinstance(raw, str):
        return raw
    content = _content(raw, "tool", place) if isinstance(raw, list) else None
    if not isinstance(content, str):
        raise _refuse(f"{place}.output", "Expected a string or a list of input_text parts.")
    return content


def _items(data: Any) -> tuple[list[dict[str, Any]], list[str]]:
    """``input`` → chat turns, and where each came from (``input.3``)."""
    if isinstance(data, str):
        return [{"role": "user", "content": data}], ["input"]
    if not isinstance(data, list) or not data:
        raise _refuse("input", "Expected a string or a non-empty list of input items.")
    limit = int(routing_settings.MAX_MESSAGES)
    if len(data) > limit:
        raise _refuse("input", f"At most {limit} input items are allowed.")
    chat: list[dict[str, Any]] = []
    places: list[str] = []
    for i, item in enumerate(data):
        place = f"input.{i}"
        if not isinstance(item, Mapping):
            raise _refuse(place, "Expected an input item object.")
        kind = item.get("type", "message")
        if kind == "message":
            _keys(item, {"type", "role", "content", "id", "status"}, place)
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise _refuse(f"{place}.role", "Expected user, system, developer or assistant.")
            chat.append({"role": role, "content": _content(item.get("content"), role, place)})
            places.append(place)
        elif kind == "function_call":
            _keys(item, {"type", "call_id", "name", "arguments", "id", "status"}, place)
            call = {
                "id": item.get("call_id"),
                "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments")},
            }
            last = chat[-1] if chat else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
                if last["content"] == "":
                    last["content"] = None
            else:
                chat.append({"role": "assistant", "content": None, "tool_calls": [call]})
                places.append(place)
        elif kind == "function_call_output":
            _keys(item, {"type", "call_id", "output", "id", "status"}, place)
            chat.append(
                {
                    "role": "tool",
                    "tool_call_id": item.get("call_id"),
                    "content": _output_text(item.get("output"), place),
                }
            )
            places.append(place)
        elif kind == "item_reference":
            raise _refuse(f"{place}.type", f"Item references are not supported: {STATELESS}.")
        else:
            raise _refuse(
                f"{place}.type",
                f"Input items are message, function_call and function_call_output; "
                f"{kind!r} is not supported by this router.",
            )
    return chat, places


def _placed(exc: serializers.ValidationError, places: list[str]) -> serializers.ValidationError:
    """The chat checks' error at the ``input`` place it came from."""
    detail: Any = exc.detail
    if isinstance(detail, Mapping):
        index, inner = next(iter(detail.items()))
        if str(index).isdigit() and int(index) < len(places):
            at = places[int(index)]
            if isinstance(inner, Mapping):
                key, value = next(iter(inner.items()))
                key = {"tool_call_id": "call_id", "non_field_errors": ""}.get(str(key), str(key))
                if key.startswith("tool_calls"):
                    key = ""  # the function_call items of that turn
                return serializers.ValidationError({f"{at}.{key}" if key else at: value})
            return serializers.ValidationError({at: inner})
    return serializers.ValidationError({"input": detail})


INPUT_SCHEMA: dict[str, Any] = {
    "oneOf": [
        {"type": "string"},
        {
            "type": "array",
            "items": {
                "type": "object",
                "description": "A message (role, content: a string or input_text / "
                "input_image / output_text parts), a function_call (call_id, name, "
                "arguments) or a function_call_output (call_id, output).",
                "properties": {
                    "type": {
                        "type": "string",
                        "enum": ["message", "function_call", "function_call_output"],
                    },
                    "role": {"type": "string"},
                    "content": {},
                    "call_id": {"type": "string"},
                    "name": {"type": "string"},
                    "arguments": {"type": "string"},
                    "output": {"type": "string"},
                },
            },
        },
    ]
}


@extend_schema_field(INPUT_SCHEMA)
class InputField(serializers.Field):
    """``input`` → ``tuple[Message, ...]`` (through the chat checks)."""

    def to_internal_value(self, data: Any) -> tuple[Message, ...]:
        try:
            chat, places = _items(data)
        except serializers.ValidationError as exc:
            raise _unprefixed(exc) from None
        try:
            return MessagesField().to_internal_value(chat)
        except serializers.ValidationError as exc:
            raise _unprefixed(_placed(exc, places)) from None

    def to_representation(self, value: Any) -> Any:
        return [m.to_dict() for m in value]


def _unprefixed(exc: serializers.ValidationError) -> serializers.ValidationError:
    """``{"input.2.content": …}`` → ``{"2.content": …}`` (DRF adds the field's name)."""
    detail: Any = exc.detail
    if isinstance(detail, Mapping):
        detail = {str(k).removeprefix("input.").removeprefix("input"): v for k, v in detail.items()}
        detail = {k or "non_field_errors": v for k, v in detail.items()}
    return serializers.ValidationError(detail)


TOOLS_SCHEMA: dict[str, Any] = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {
            "type": {"type": "string", "enum": ["function"]},
            "name": {"type": "string"},
            "description": {"type": "string"},
            "parameters": {"type": "object", "description": "A JSON Schema."},
            "strict": {"type": "boolean"},
        },
        "required": ["type", "name"],
    },
}


@extend_schema_field(TOOLS_SCHEMA)
class FunctionToolsField(serializers.Field):
    """Responses' flat function tools → ``tuple[Tool, ...]`` (through the chat checks)."""

    def to_internal_value(self, data: Any) -> tuple[Tool, ...]:
        chat: list[Any] = []
        for i, raw in tool_objects(data):
            kind = raw.get("type")
            if kind != "function":
                name = kind if isinstance(kind, str) else "?"
                builtin = name in BUILTIN_TOOLS or name.startswith(BUILTIN_TOOLS)
                raise serializers.ValidationError(
                    {
                        f"{i}.type": [
                            f"The built-in tool {name!r} is not supported by this router; "
                            "only function tools."
                            if builtin
                            else "Expected a function tool."
                        ]
                    }
                )
            for key in raw:
                if key not in {"type", "name", "description", "parameters", "strict"}:
                    raise serializers.ValidationError(
                        {f"{i}.{key}": [f"Unknown parameter: 'tools[{i}].{key}'."]},
                        code=UNKNOWN_PARAMETER,
                    )
            function = {k: v for k, v in raw.items() if k != "type" and v is not None}
            chat.append({"type": "function", "function": function})
        try:
            return ToolsField().to_internal_value(chat)
        except serializers.ValidationError as exc:
            detail: Any = exc.detail
            if isinstance(detail, Mapping):
                detail = {
                    f"{i}.{str(key).removeprefix('function.')}"
                    if key != "non_field_errors"
                    else str(i): value
                    for i, inner in detail.items()
                    for key, value in (inner.items() if isinstance(inner, Mapping) else [])
                } or detail
            raise serializers.ValidationError(detail) from None

    def to_representation(self, value: Any) -> Any:
        return [{"type": "function", **t.to_dict()["function"]} for t in value]


TOOL_CHOICE_SCHEMA: dict[str, Any] = {
    "oneOf": [
        {"type": "string", "enum": ["auto", "none", "required"]},
        {
            "type": "object",
            "properties": {
                "type": {"type": "string", "enum": ["function"]},
                "name": {"type": "string"},
            },
            "required": ["type", "name"],
        },
    ]
}


@extend_schema_field(TOOL_CHOICE_SCHEMA)
class ResponsesToolChoiceField(serializers.Field):
    def to_internal_value(self, data: Any) -> ToolChoice:
        if data in ("auto", "none", "required"):
            return data
        if (
            isinstance(data, Mapping)
            and set(data) == {"type", "name"}
            and data.get("type") == "function"
            and isinstance(data.get("name"), str)
        ):
            return ForcedTool(name=data["name"])
        raise serializers.ValidationError(
            'Expected "auto", "none", "required" or {"type": "function", "name": …}.'
        )

    def to_representation(self, value: Any) -> Any:
        if isinstance(value, ForcedTool):
            return {"type": "function", "name": value.name}
        return value


FORMAT_TYPES = ("text", "json_object", "json_schema")


class FormatSerializer(serializers.Serializer):
    # Not a ChoiceField: its enum would share a name with chat's response_format.type.
    type = StrictCharField(help_text="text, json_object or json_schema")

    def validate_type(self, value: str) -> str:
        if value not in FORMAT_TYPES:
            raise serializers.ValidationError(f"Expected one of {', '.join(FORMAT_TYPES)}.")
        return value

    name = StrictCharField(required=False, max_length=64)
    description = StrictCharField(required=False, allow_blank=True)
    schema = serializers.JSONField(required=False)
    strict = StrictBooleanField(required=False, allow_null=True)

    def to_internal_value(self, data: Any) -> Any:
        _refuse_unknown(data, self.fields, "text.format")
        return super().to_internal_value(data)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs["type"] != "json_schema":
            return attrs
        problem = check_output_schema(attrs.get("schema"))
        if problem:
            raise serializers.ValidationError({"schema": [problem]})
        return attrs


class TextSerializer(serializers.Serializer):
    format = FormatSerializer(required=False, allow_null=True)
    # A hint to the model (not every candidate's): accepted and dropped.
    verbosity = serializers.ChoiceField(
        choices=["low", "medium", "high"], required=False, allow_null=True
    )

    def to_internal_value(self, data: Any) -> Any:
        _refuse_unknown(data, self.fields, "text")
        return super().to_internal_value(data)


def _refuse_unknown(data: Any, known: Any, prefix: str) -> None:
    refuse_unknown(data, known, message=lambda name: f"Unknown parameter: '{prefix}.{name}'.")


class ResponsesRequestSerializer(serializers.Serializer):
    """The body of ``POST /v1/responses``: the Responses parameters, strictly typed."""

    model = model_name_field()
    input = InputField()
    instructions = StrictCharField(
        required=False, allow_null=True, allow_blank=True, trim_whitespace=False
    )
    tools = FunctionToolsField(required=False, allow_null=True)
    tool_choice = ResponsesToolChoiceField(required=False, allow_null=True)
    max_output_tokens = StrictIntegerField(required=False, allow_null=True, min_value=1)
    temperature = StrictFloatField(required=False, allow_null=True, min_value=0, max_value=2)
    top_p = StrictFloatField(required=False, allow_null=True, min_value=0, max_value=1)
    text = TextSerializer(required=False, allow_null=True)
    metadata = StrictStringMapField(required=False, allow_null=True)
    user = StrictCharField(required=False, allow_null=True, max_length=256)
    stream = StrictBooleanField(required=False, default=False)

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, Mapping):
            for name in data:
                value = data[name]
                if name in STATEFUL:
                    if value is not None and not any(_same(value, v) for v in STATEFUL[name]):
                        raise _refuse(name, f"Not supported: {STATELESS}.")
                elif name in NEUTRAL_VALUES:
                    if value is not None and not any(_same(value, v) for v in NEUTRAL_VALUES[name]):
                        shown = " or ".join(
                            ["null", *(json.dumps(v) for v in NEUTRAL_VALUES[name])]
                        )
                        raise _refuse(
                            name,
                            f"Not supported by this router; accepted only as {shown}.",
                        )
                elif name not in self.fields:
                    raise _refuse(str(name), f"Unknown parameter: '{name}'.", UNKNOWN_PARAMETER)
            data = {k: v for k, v in data.items() if k in self.fields}
        return super().to_internal_value(data)

    def validate_max_output_tokens(self, value: int | None) -> int | None:
        return output_tokens_within_limit(value)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs.get("instructions"):
            head = Message(role="system", content=attrs["instructions"])
            attrs["input"] = (head, *attrs["input"])
        problems = check_conversation({**attrs, "messages": attrs["input"]})
        if problems:
            problems = {("input" if k == "messages" else k): v for k, v in problems.items()}
            raise serializers.ValidationError(problems)
        return attrs

    def to_request(self) -> AuditRequest:
        d = self.validated_data
        fmt = (d.get("text") or {}).get("format") or {}
        schema = requested_schema(fmt.get("type"), fmt.get("schema"))
        return AuditRequest(
            task="chat",
            messages=d["input"],
            tools=d.get("tools") or (),
            tool_choice=d.get("tool_choice"),
            response_schema=schema,
            metadata=d.get("metadata") or {},
            stream=bool(d.get("stream")),
            temperature=d.get("temperature"),
            top_p=d.get("top_p"),
            max_tokens=d.get("max_output_tokens"),
            user=d.get("user"),
            backstop=False,  # an exhausted chain is a 503, unless the chain opts in
            **select_model(d["model"]),
        )

    def echo(self) -> dict[str, Any]:
        """The request's settings the response object repeats."""
        d = self.validated_data
        fmt = dict((d.get("text") or {}).get("format") or {"type": "text"})
        return {
            "instructions": d.get("instructions"),
            "max_output_tokens": d.get("max_output_tokens"),
            "temperature": d.get("temperature"),
            "top_p": d.get("top_p"),
            "tool_choice": self.fields["tool_choice"].to_representation(d["tool_choice"])
            if d.get("tool_choice") is not None
            else "auto",
            "tools": self.fields["tools"].to_representation(d.get("tools") or ()),
            "text": {"format": fmt},
            "metadata": d.get("metadata") or {},
            "user": d.get("user"),
        }
