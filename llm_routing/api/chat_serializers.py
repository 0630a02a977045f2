"""The chat request shapes shared by ``POST /audit/``, ``POST /v1/chat/completions`` and
:func:`llm_routing.chat`: messages, tools, ``tool_choice``, ``stop``, and the strict
scalar fields (no coercion: ``true`` is not a number, ``"yes"`` is not a boolean).

The input boundary (:mod:`llm_routing.boundary`) reaches the serializers through
:func:`check_input` (called first by every root request serializer), :func:`json_text`
(JSON carried as text: tool-call ``arguments``, explain's ``schema``) and
:class:`ClosedSerializer` (nested objects whose keys OpenAI's schema closes).

Messages and tools arrive in OpenAI's JSON shapes and leave as the router's
:class:`~llm_routing.types.Message` / :class:`~llm_routing.types.Tool` objects. Errors
name the place: ``{"messages": {"2": {"tool_call_id": ["…"]}}}``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from ..boundary import CheckedObject, InputRefused, Path, check, parse_json_text
from ..conf import routing_settings
from ..schemas import SchemaRefused, check_schema
from ..types import AuditRequest, ContentPart, ForcedTool, Message, Tool, ToolCall, ToolChoice
from .problems import UNKNOWN_PARAMETER

__all__ = [
    "ROLES",
    "ClosedSerializer",
    "MessagesField",
    "SamplingSerializer",
    "StopField",
    "StrictBooleanField",
    "StrictCharField",
    "StrictFloatField",
    "StrictIntegerField",
    "ToolChoiceField",
    "ToolsField",
    "check_conversation",
    "check_input",
    "check_json_schema",
    "check_output_schema",
    "json_text",
    "refuse_unknown",
    "requested_schema",
    "tool_choice_to_dict",
    "tool_objects",
]

ROLES = ("system", "developer", "user", "assistant", "tool")
TOOL_NAME_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
IMAGE_URL_RE = re.compile(r"^(https?://\S+|data:image/[a-zA-Z0-9.+-]+;base64,[A-Za-z0-9+/=\s]+)$")
IMAGE_DETAILS = ("auto", "low", "high")
MAX_STOP = 4
# Keys OpenAI's SDKs send back on assistant turns (a returned message re-sent as is);
# accepted when null or empty, since the router has nothing to pass on for them.
IGNORED_WHEN_EMPTY = frozenset({"refusal", "audio", "function_call", "annotations"})
MESSAGE_KEYS = frozenset({"role", "content", "name", "tool_calls", "tool_call_id"})


def check_input(data: Any) -> None:
    """The input boundary for a request's data, as a 400 naming the field: a no-op for a
    body the HTTP parser already checked (:class:`~llm_routing.boundary.CheckedObject`);
    the Python API's arguments and explain's query are walked here. Every root request
    serializer calls it before anything else."""
    if isinstance(data, CheckedObject):
        return
    try:
        check(data)
    except InputRefused as exc:
        raise serializers.ValidationError(exc.as_detail()) from None


def json_text(text: str, path: Path = ()) -> Any:
    """JSON carried as text inside a request, parsed through the input boundary (the
    same depth limit, no NaN, no lone surrogate); a ValidationError otherwise."""
    try:
        return parse_json_text(text, path=path)
    except InputRefused as exc:
        raise serializers.ValidationError(exc.reason) from None


class ClosedSerializer(serializers.Serializer):
    """A nested object whose keys OpenAI's schema closes: an unknown key is a 400
    naming it (``response_format.json_schema.schemas``), never silently ignored."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, Mapping):
            unknown = sorted(str(k) for k in set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError(
                    {name[:64]: ["Unknown field."] for name in unknown[:20]}
                )
        return super().to_internal_value(data)


def refuse_unknown(
    data: Any, known: Any, *, message: str | Callable[[str], str] = "Unknown parameter."
) -> None:
    """400 naming the first parameter of ``data`` not in ``known`` (code
    ``unknown_parameter``); ``message`` is the words, or makes them from the name."""
    if isinstance(data, Mapping):
        for name in data:
            if name not in known:
                words = message(str(name)) if callable(message) else message
                raise serializers.ValidationError({str(name): [words]}, code=UNKNOWN_PARAMETER)


def tool_objects(data: Any) -> Iterator[tuple[int, Mapping[str, Any]]]:
    """Each tool of a face's ``tools`` list with its index: 400 for a value that is not
    a list, or (when it is reached) an item that is not an object."""
    if not isinstance(data, list):
        raise serializers.ValidationError("Expected a list of tools.")
    for i, raw in enumerate(data):
        if not isinstance(raw, Mapping):
            raise serializers.ValidationError({str(i): ["Expected a tool object."]})
        yield i, raw


def check_json_schema(schema: Any) -> str | None:
    """Why ``schema`` is not a valid JSON Schema, or None. The one place requests'
    schemas (``response_format``, tool ``parameters``) are checked."""
    try:
        check_schema(schema)  # no I/O, local refs only, RE2 patterns, a bounded mock answer
    except SchemaRefused as exc:
        return str(exc)
    return None


def check_output_schema(schema: Any) -> str | None:
    """Why ``schema`` cannot be a structured-output schema (not an object, larger than
    ``MAX_SCHEMA_BYTES``, or not a valid JSON Schema), or None: ``response_format`` and
    ``text.format`` alike."""
    if not isinstance(schema, dict):
        return "Expected a JSON Schema object."
    if len(json.dumps(schema)) > int(routing_settings.MAX_SCHEMA_BYTES):
        return "The schema is too large."
    return check_json_schema(schema)


def requested_schema(kind: Any, schema: Any) -> dict[str, Any] | None:
    """The router's ``response_schema`` for a validated output format: its schema for
    ``json_schema``, any object for ``json_object``, none for ``text``."""
    if kind == "json_schema":
        return schema
    if kind == "json_object":
        return {"type": "object"}
    return None


# --- strict scalars ---------------------------------------------------------------------


class StrictCharField(serializers.CharField):
    """A CharField that refuses numbers and booleans instead of coercing them."""

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return str(super().to_internal_value(data))


class StrictBooleanField(serializers.BooleanField):
    """Only JSON ``true``/``false`` (DRF's BooleanField also takes ``"yes"``, ``1`` …)."""

    def to_internal_value(self, data: Any) -> bool:
        if not isinstance(data, bool):
            self.fail("invalid", input=data)
        return data


class StrictIntegerField(serializers.IntegerField):
    """Only JSON integers (DRF's IntegerField also takes ``"3"``, ``true``, ``3.0``)."""

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return int(super().to_internal_value(data))


class StrictFloatField(serializers.FloatField):
    """Only JSON numbers (DRF's FloatField also takes ``"0.5"`` and ``true``)."""

    def to_internal_value(self, data: Any) -> float:
        if isinstance(data, bool) or not isinstance(data, int | float):
            self.fail("invalid")
        return float(super().to_internal_value(data))


def _text(value: Any) -> str:
    """A string as DRF checks it (no NUL, no lone surrogates), blank allowed."""
    return str(StrictCharField(allow_blank=True, trim_whitespace=False).run_validation(value))


def _first_error(exc: serializers.ValidationError) -> str:
    detail: Any = exc.detail
    while isinstance(detail, list | dict) and detail:
        detail = detail[0] if isinstance(detail, list) else next(iter(detail.values()))
    return str(detail)


class _Problems:
    """Errors collected by place, raised together as one nested ValidationError."""

    def __init__(self) -> None:
        self.errors: dict[str, Any] = {}

    def add(self, place: str, key: str | None, message: str) -> None:
        """``key`` None: about the item as a whole (DRF's ``non_field_errors``)."""
        slot = self.errors.setdefault(place, {})
        slot.setdefault(key or "non_field_errors", []).append(message)

    def raise_any(self) -> None:
        if self.errors:
            raise serializers.ValidationError(self.errors)


# --- messages ---------------------------------------------------------------------------

_CONTENT_SCHEMA: dict[str, Any] = {
    "oneOf": [
        {"type": "string"},
        {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "type": {"type": "string", "enum": ["text", "image_url"]},
                    "text": {"type": "string"},
                    "image_url": {
                        "type": "object",
                        "properties": {
                            "url": {"type": "string"},
                            "detail": {"type": "string", "enum": list(IMAGE_DETAILS)},
                        },
                        "required": ["url"],
                    },
                },
                "required": ["type"],
            },
        },
    ],
    "nullable": True,
}
_TOOL_CALL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "type": {"type": "string", "enum": ["function"]},
        "function": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "arguments": {"type": "string", "description": "A JSON object as text."},
            },
            "required": ["name", "arguments"],
        },
    },
    "required": ["id", "type", "function"],
}
MESSAGES_SCHEMA: dict[str, Any] = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {
            "role": {"type": "string", "enum": list(ROLES)},
            "content": _CONTENT_SCHEMA,
            "name": {"type": "string"},
            "tool_calls": {"type": "array", "items": _TOOL_CALL_SCHEMA},
            "tool_call_id": {"type": "string"},
        },
        "required": ["role"],
    },
}


def _parts(raw: list[Any], role: str, at: str, problems: _Problems) -> tuple[ContentPart, ...]:
    parts: list[ContentPart] = []
    for j, part in enumerate(raw):
        key = f"content.{j}"
        if not isinstance(part, Mapping):
            problems.add(at, key, "Expected an object with a type.")
            continue
        kind = part.get("type")
        try:
            if kind == "text" and set(part) <= {"type", "text"}:
                parts.append(ContentPart(type="text", text=_text(part.get("text"))))
            elif kind == "image_url" and set(part) <= {"type", "image_url"}:
                if role != "user":
                    problems.add(at, key, "Only user messages may carry images.")
                    continue
                image = part.get("image_url")
                if not isinstance(image, Mapping) or set(image) - {"url", "detail"}:
                    problems.add(at, key, 'image_url must be {"url": …, "detail": …}.')
                    continue
                url = image.get("url")
                if not isinstance(url, str) or not IMAGE_URL_RE.match(url):
                    problems.add(at, key, "The image URL must be http(s) or a base64 data URL.")
                    continue
                detail = image.get("detail")
                if detail is not None and detail not in IMAGE_DETAILS:
                    problems.add(at, key, "detail must be auto, low or high.")
                    continue
                parts.append(ContentPart(type="image_url", image_url=url, detail=detail))
            else:
                problems.add(
                    at, key, "A content part is {type: text, text} or {type: image_url, image_url}."
                )
        except serializers.ValidationError as exc:
            problems.add(at, f"{key}.text", _first_error(exc))
    return tuple(parts)


def _tool_calls(raw: Any, at: str, problems: _Problems) -> tuple[ToolCall, ...]:
    if not isinstance(raw, list) or not raw:
        problems.add(at, "tool_calls", "Expected a non-empty list of tool calls.")
        return ()
    calls: list[ToolCall] = []
    for j, call in enumerate(raw):
        key = f"tool_calls.{j}"
        function = call.get("function") if isinstance(call, Mapping) else None
        if (
            not isinstance(call, Mapping)
            or set(call) - {"id", "type", "function", "index"}
            or call.get("type", "function") != "function"
            or not isinstance(function, Mapping)
            or set(function) - {"name", "arguments"}
        ):
            problems.add(
                at, key, 'Expected {"id", "type": "function", "function": {name, arguments}}.'
            )
            continue
        call_id, name, arguments = call.get("id"), function.get("name"), function.get("arguments")
        if not isinstance(call_id, str) or not 0 < len(call_id) <= 128:
            problems.add(at, key, "id must be a non-empty string of at most 128 characters.")
        elif not isinstance(name, str) or not TOOL_NAME_RE.match(name):
            problems.add(at, key, "function.name must match ^[a-zA-Z0-9_-]{1,64}$.")
        elif not isinstance(arguments, str):
            problems.add(at, key, "function.arguments must be a JSON object as a string.")
        else:
            try:
                parsed = json_text(arguments)
            except serializers.ValidationError as exc:
                problems.add(at, f"{key}.function.arguments", _first_error(exc))
                continue
            if not isinstance(parsed, dict):
                problems.add(at, key, "function.arguments must be a JSON object as a string.")
            else:
                calls.append(ToolCall(id=call_id, name=name, arguments=arguments))
    if len({c.id for c in calls}) != len(calls):
        problems.add(at, "tool_calls", "Tool call ids must be unique.")
    return tuple(calls)


def _message(raw: Any, at: str, calls: dict[str, str], problems: _Problems) -> Message | None:
    if not isinstance(raw, Mapping):
        problems.add(at, None, "Expected a message object.")
        return None
    for key in sorted(set(raw) - MESSAGE_KEYS):
        if key not in IGNORED_WHEN_EMPTY or raw[key] not in (None, "", [], {}):
            problems.add(at, str(key), "Unknown field.")
    role = raw.get("role")
    if role not in ROLES:
        problems.add(at, "role", f"Expected one of {', '.join(ROLES)}.")
        return None
    tool_calls: tuple[ToolCall, ...] = ()
    if raw.get("tool_calls") is not None:
        if role != "assistant":
            problems.add(at, "tool_calls", "Only assistant messages carry tool calls.")
        else:
            tool_calls = _tool_calls(raw["tool_calls"], at, problems)
    content_raw = raw.get("content")
    content: str | tuple[ContentPart, ...] = ""
    if content_raw is None:
        if not (role == "assistant" and raw.get("tool_calls")):
            problems.add(at, "content", "This field is required.")
    elif isinstance(content_raw, list):
        content = _parts(content_raw, str(role), at, problems)
    elif not isinstance(content_raw, str):
        problems.add(at, "content", "Expected a string or a list of content parts.")
    else:
        try:
            content = _text(content_raw)
        except serializers.ValidationError as exc:  # NUL, lone surrogates
            problems.add(at, "content", _first_error(exc))
    name = raw.get("name")
    if name is not None and (not isinstance(name, str) or not 0 < len(name) <= 64):
        problems.add(at, "name", "Expected a string of at most 64 characters.")
        name = None
    tool_call_id = raw.get("tool_call_id")
    if role == "tool":
        if not isinstance(tool_call_id, str) or tool_call_id not in calls:
            problems.add(
                at,
                "tool_call_id",
                "A tool message must answer the id of a tool call made by an earlier "
                "assistant message.",
            )
            return None
        name = name or calls[tool_call_id]  # the tool's name (Gemini's functionResponse)
    elif tool_call_id is not None:
        problems.add(at, "tool_call_id", "Only tool messages carry a tool_call_id.")
    for call in tool_calls:
        calls[call.id] = call.name
    return Message(
        role=role,
        content=content,
        name=name,
        tool_calls=tool_calls,
        tool_call_id=tool_call_id if role == "tool" else None,
    )


@extend_schema_field(MESSAGES_SCHEMA)
class MessagesField(serializers.Field):
    """A conversation in OpenAI's message shapes → ``tuple[Message, ...]``."""

    def to_internal_value(self, data: Any) -> tuple[Message, ...]:
        if not isinstance(data, list) or not data:
            raise serializers.ValidationError("Expected a non-empty list of messages.")
        limit = int(routing_settings.MAX_MESSAGES)
        if len(data) > limit:
            raise serializers.ValidationError(f"At most {limit} messages are allowed.")
        problems = _Problems()
        calls: dict[str, str] = {}
        messages = [_message(raw, str(i), calls, problems) for i, raw in enumerate(data)]
        problems.raise_any()
        out = tuple(m for m in messages if m is not None)
        if not any(m.role == "user" and (m.text.strip() or m.has_images) for m in out):
            raise serializers.ValidationError("At least one non-empty user message is required.")
        return out

    def to_representation(self, value: Any) -> Any:
        return [m.to_dict() for m in value]


# --- tools ------------------------------------------------------------------------------

TOOLS_SCHEMA: dict[str, Any] = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {
            "type": {"type": "string", "enum": ["function"]},
            "function": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "pattern": TOOL_NAME_RE.pattern},
                    "description": {"type": "string"},
                    "parameters": {"type": "object", "description": "A JSON Schema."},
                    "strict": {"type": "boolean"},
                },
                "required": ["name"],
            },
        },
        "required": ["type", "function"],
    },
}


def _tool(raw: Any, at: str, problems: _Problems) -> Tool | None:
    function = raw.get("function") if isinstance(raw, Mapping) else None
    if (
        not isinstance(raw, Mapping)
        or set(raw) - {"type", "function"}
        or raw.get("type") != "function"
        or not isinstance(function, Mapping)
    ):
        problems.add(at, None, 'Expected {"type": "function", "function": {…}}.')
        return None
    for key in sorted(set(function) - {"name", "description", "parameters", "strict"}):
        problems.add(at, f"function.{key}", "Unknown field.")
    name, description = function.get("name"), function.get("description", "")
    parameters, strict = function.get("parameters", {}), function.get("strict")
    if not isinstance(name, str) or not TOOL_NAME_RE.match(name):
        problems.add(at, "function.name", f"Must match {TOOL_NAME_RE.pattern}.")
        return None
    if not isinstance(description, str):
        problems.add(at, "function.description", "Expected a string.")
        return None
    if strict is not None and not isinstance(strict, bool):
        problems.add(at, "function.strict", "Expected true or false.")
        return None
    if not isinstance(parameters, Mapping):
        problems.add(at, "function.parameters", "Expected a JSON Schema object.")
        return None
    if len(json.dumps(parameters)) > int(routing_settings.MAX_SCHEMA_BYTES):
        problems.add(at, "function.parameters", "The schema is too large.")
        return None
    problem = check_json_schema(parameters)
    if problem:
        problems.add(at, "function.parameters", problem)
        return None
    return Tool(name=name, description=description, parameters=dict(parameters), strict=strict)


@extend_schema_field(TOOLS_SCHEMA)
class ToolsField(serializers.Field):
    """Function definitions in OpenAI's ``tools`` shape → ``tuple[Tool, ...]``."""

    def to_internal_value(self, data: Any) -> tuple[Tool, ...]:
        if not isinstance(data, list):
            raise serializers.ValidationError("Expected a list of tools.")
        limit = int(routing_settings.MAX_TOOLS)
        if len(data) > limit:
            raise serializers.ValidationError(f"At most {limit} tools are allowed.")
        problems = _Problems()
        tools = [_tool(raw, str(i), problems) for i, raw in enumerate(data)]
        problems.raise_any()
        out = tuple(t for t in tools if t is not None)
        if len({t.name for t in out}) != len(out):
            raise serializers.ValidationError("Tool names must be unique.")
        return out

    def to_representation(self, value: Any) -> Any:
        return [t.to_dict() for t in value]


TOOL_CHOICE_SCHEMA: dict[str, Any] = {
    "oneOf": [
        {"type": "string", "enum": ["auto", "none", "required"]},
        {
            "type": "object",
            "properties": {
                "type": {"type": "string", "enum": ["function"]},
                "function": {
                    "type": "object",
                    "properties": {"name": {"type": "string"}},
                    "required": ["name"],
                },
            },
            "required": ["type", "function"],
        },
    ]
}


def tool_choice_to_dict(choice: ToolChoice) -> str | dict[str, Any]:
    """OpenAI's wire form of a tool choice."""
    if isinstance(choice, ForcedTool):
        return {"type": "function", "function": {"name": choice.name}}
    return choice


@extend_schema_field(TOOL_CHOICE_SCHEMA)
class ToolChoiceField(serializers.Field):
    """``"auto"`` / ``"none"`` / ``"required"`` or ``{"type": "function", "function":
    {"name": …}}`` → a :data:`~llm_routing.types.ToolChoice`."""

    def to_internal_value(self, data: Any) -> ToolChoice:
        if data in ("auto", "none", "required"):
            return data
        function = data.get("function") if isinstance(data, Mapping) else None
        if (
            isinstance(data, Mapping)
            and set(data) == {"type", "function"}
            and data.get("type") == "function"
            and isinstance(function, Mapping)
            and set(function) == {"name"}
            and isinstance(function.get("name"), str)
        ):
            return ForcedTool(name=function["name"])
        raise serializers.ValidationError(
            'Expected "auto", "none", "required" or {"type": "function", "function": {"name": …}}.'
        )

    def to_representation(self, value: Any) -> Any:
        return tool_choice_to_dict(value)


@extend_schema_field(
    {
        "oneOf": [
            {"type": "string"},
            {"type": "array", "items": {"type": "string"}, "maxItems": MAX_STOP},
        ]
    }
)
class StopField(serializers.Field):
    """One stop sequence or a list of up to four → ``tuple[str, ...]``."""

    def to_internal_value(self, data: Any) -> tuple[str, ...]:
        values = [data] if isinstance(data, str) else data
        if not isinstance(values, list) or len(values) > MAX_STOP:
            raise serializers.ValidationError(
                f"Expected a string or a list of at most {MAX_STOP} strings."
            )
        out: list[str] = []
        for value in values:
            if not isinstance(value, str) or not value or len(value) > 256:
                raise serializers.ValidationError(
                    "Each stop sequence is a non-empty string of at most 256 characters."
                )
            out.append(_text(value))
        return tuple(out)

    def to_representation(self, value: Any) -> Any:
        return list(value)


def check_conversation(attrs: Mapping[str, Any]) -> dict[str, list[str]]:
    """Request-level checks of validated chat fields: the tool choice names a tool
    that is offered, and the whole conversation fits ``MAX_INPUT_CHARS``."""
    errors: dict[str, list[str]] = {}
    tools: tuple[Tool, ...] = attrs.get("tools") or ()
    choice = attrs.get("tool_choice")
    if choice is not None and choice != "none" and not tools:
        errors["tool_choice"] = ["tool_choice needs tools."]
    elif isinstance(choice, ForcedTool) and choice.name not in {t.name for t in tools}:
        errors["tool_choice"] = [f"No tool named {choice.name!r} is offered in tools."]
    messages: tuple[Message, ...] = attrs.get("messages") or ()
    if messages:
        size = AuditRequest(task="chat", messages=messages).input_length  # as recorded
        limit = int(routing_settings.MAX_INPUT_CHARS)
        if size > limit:
            errors["messages"] = [
                f"The conversation is too long ({size} characters; at most {limit})."
            ]
    return errors


class SamplingSerializer(serializers.Serializer):
    """The sampling parameters of a chat request (``/v1`` and :func:`llm_routing.chat`);
    None leaves the provider's default (or its row's ``params``)."""

    temperature = StrictFloatField(required=False, allow_null=True, min_value=0, max_value=2)
    top_p = StrictFloatField(required=False, allow_null=True, min_value=0, max_value=1)
    max_tokens = StrictIntegerField(required=False, allow_null=True, min_value=1)
    seed = StrictIntegerField(required=False, allow_null=True)
    stop = StopField(required=False, allow_null=True)
    user = StrictCharField(required=False, allow_null=True, max_length=256)

    def sampling(self) -> dict[str, Any]:
        """AuditRequest keyword arguments of the validated sampling parameters."""
        d = self.validated_data
        return {
            "temperature": d.get("temperature"),
            "top_p": d.get("top_p"),
            "max_tokens": d.get("max_tokens"),
            "seed": d.get("seed"),
            "stop": d.get("stop") or (),
            "user": d.get("user"),
        }
