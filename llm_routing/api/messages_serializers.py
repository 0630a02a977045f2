"""The body of ``POST /v1/messages`` (Anthropic Messages), strictly parsed and translated
into the router's request.

Anthropic's shapes are translated into the chat shapes of
:mod:`~llm_routing.api.chat_serializers` and checked there (one set of checks for
every face: roles, text, images, tool-call ids, sizes), with the errors' places put
back in Anthropic's terms (``messages.2.content.0``):

* ``system`` (a string or text blocks) → a leading ``system`` turn;
* a ``user`` turn's ``tool_result`` blocks → one ``tool`` turn each, its other blocks
  (``text``, ``image`` base64 or URL) → a ``user`` turn after them;
* an ``assistant`` turn's ``tool_use`` blocks → its tool calls (``input`` as JSON text);
* ``tools[i]`` (``name``, ``description``, ``input_schema``) → function tools; a server
  tool (``web_search_…``, ``bash_…``, ``computer_…`` …) is a 400 naming it;
* ``tool_choice`` ``auto`` / ``any`` / ``tool`` / ``none`` → ``auto`` / ``required`` /
  the named function / ``none``;
* ``stop_sequences`` → ``stop``, ``metadata.user_id`` → ``user``.

``max_tokens`` is required (as Anthropic requires it). An unknown parameter is a 400
naming it; ``top_k`` and ``disable_parallel_tool_use`` are refused when set, since no
candidate of another kind could honour them. ``cache_control`` hints are accepted and
dropped (they change cost, never the answer).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from ..types import AuditRequest, ForcedTool, Message, Tool, ToolChoice
from .chat_serializers import (
    MessagesField,
    StopField,
    StrictBooleanField,
    StrictCharField,
    StrictFloatField,
    StrictIntegerField,
    ToolsField,
    check_conversation,
    refuse_unknown,
    tool_objects,
)
from .faces import select_model
from .serializers import model_name_field, output_tokens_within_limit

__all__ = [
    "MessagesRequestSerializer",
    "TokenCountRequestSerializer",
]

IMAGE_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")
#: Keys every block may carry that change nothing in the answer.
HINTS = frozenset({"cache_control"})


def _fail(place: str, message: str) -> serializers.ValidationError:
    return serializers.ValidationError({place: [message]})


def _check_keys(block: Mapping[str, Any], allowed: set[str], place: str) -> None:
    for key in block:
        if key not in allowed and key not in HINTS:
            raise _fail(f"{place}.{key}", "Extra inputs are not permitted.")


def _image(block: Mapping[str, Any], place: str) -> dict[str, Any]:
    _check_keys(block, {"type", "source"}, place)
    source = block.get("source")
    if not isinstance(source, Mapping):
        raise _fail(f"{place}.source", "Expected {type: base64 | url, …}.")
    if source.get("type") == "base64":
        _check_keys(source, {"type", "media_type", "data"}, f"{place}.source")
        media, data = source.get("media_type"), source.get("data")
        if media not in IMAGE_TYPES:
            raise _fail(f"{place}.source.media_type", f"Expected one of {', '.join(IMAGE_TYPES)}.")
        if not isinstance(data, str) or not data:
            raise _fail(f"{place}.source.data", "Expected base64 image data.")
        url = f"data:{media};base64,{data}"
    elif source.get("type") == "url":
        _check_keys(source, {"type", "url"}, f"{place}.source")
        given = source.get("url")
        if not isinstance(given, str):
            raise _fail(f"{place}.source.url", "Expected an http(s) URL.")
        url = given
    else:
        raise _fail(f"{place}.source.type", "Expected base64 or url.")
    return {"type": "image_url", "image_url": {"url": url}}


def _text_of(block: Mapping[str, Any], place: str) -> dict[str, Any]:
    _check_keys(block, {"type", "text", "citations"}, place)
    if block.get("citations") not in (None, []):
        raise _fail(f"{place}.citations", "Citations are not supported by this router.")
    return {"type": "text", "text": block.get("text")}


def _tool_result_text(block: Mapping[str, Any], place: str) -> str:
    _check_keys(block, {"type", "tool_use_id", "content", "is_error"}, place)
    content = block.get("content", "")
    is_error = block.get("is_error", False)
    if not isinstance(is_error, bool):
        raise _fail(f"{place}.is_error", "Must be a valid boolean.")
    if isinstance(content, list):
        texts = []
        for k, part in enumerate(content):
            if not isinstance(part, Mapping) or part.get("type") != "text":
                raise _fail(
                    f"{place}.content.{k}", "Only text blocks are supported in a tool_result."
                )
            _check_keys(part, {"type", "text"}, f"{place}.content.{k}")
            if not isinstance(part.get("text"), str):
                raise _fail(f"{place}.content.{k}.text", "Expected a string.")
            texts.append(part["text"])
        content = "".join(texts)
    elif not isinstance(content, str):
        raise _fail(f"{place}.content", "Expected a string or a list of text blocks.")
    # The router's tool turn has no error flag: an error result says so in its text.
    return f"[tool error] {content}" if is_error else content


def _turn(raw: Any, i: int, out: list[dict[str, Any]], places: list[str]) -> None:
    """Anthropic turn ``i`` → chat turns appended to ``out`` (``places[k]`` is where
    chat turn ``k`` came from)."""
    place = f"messages.{i}"
    if not isinstance(raw, Mapping):
        raise _fail(place, "Expected a message object.")
    _check_keys(raw, {"role", "content"}, place)
    role = raw.get("role")
    if role not in ("user", "assistant"):
        raise _fail(f"{place}.role", "Expected user or assistant.")
    content = raw.get("content")
    if isinstance(content, str):
        out.append({"role": role, "content": content})
        places.append(place)
        return
    if not isinstance(content, list):
        raise _fail(f"{place}.content", "Expected a string or a list of content blocks.")
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(content):
        at = f"{place}.content.{j}"
        kind = block.get("type") if isinstance(block, Mapping) else None
        if not isinstance(block, Mapping):
            raise _fail(at, "Expected a content block.")
        if kind == "text":
            parts.append(_text_of(block, at))
        elif kind == "image" and role == "user":
            parts.append(_image(block, at))
        elif kind == "tool_result" and role == "user":
            if parts:
                raise _fail(at, "tool_result blocks must come before any other content.")
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": block.get("tool_use_id"),
                    "content": _tool_result_text(block, at),
                }
            )
            places.append(at)
        elif kind == "tool_use" and role == "assistant":
            _check_keys(block, {"type", "id", "name", "input"}, at)
            arguments = block.get("input", {})
            if not isinstance(arguments, Mapping):
                raise _fail(f"{at}.input", "Expected an object.")
            calls.append(
                {
                    "id": block.get("id"),
                    "type": "function",
                    "function": {"name": block.get("name"), "arguments": json.dumps(arguments)},
                }
            )
        else:
            raise _fail(
                f"{at}.type",
                f"A {role} message's blocks are "
                + ("text, image, tool_result." if role == "user" else "text, tool_use.")
                + (f" {kind!r} is not supported." if isinstance(kind, str) else ""),
            )
    if role == "assistant":
        text = "".join(str(p["text"]) if isinstance(p["text"], str) else "" for p in parts)
        if any(not isinstance(p["text"], str) for p in parts):
            raise _fail(f"{place}.content", "Text blocks need a string text.")
        turn: dict[str, Any] = {
            "role": "assistant",
            "content": text if (text or not calls) else None,
        }
        if calls:
            turn["tool_calls"] = calls
        out.append(turn)
        places.append(place)
    elif parts or not content:
        only_text = all(p["type"] == "text" for p in parts)
        out.append(
            {
                "role": "user",
                "content": "".join(str(p["text"]) for p in parts)
                if only_text and all(isinstance(p["text"], str) for p in parts)
                else parts,
            }
        )
        places.append(place)


def _placed(detail: Any, places: list[str]) -> Any:
    """The chat checks' error ``detail`` at the Anthropic place it came from (relative
    to ``messages``: the field adds its name)."""
    if isinstance(detail, Mapping):
        index, inner = next(iter(detail.items()))
        if str(index).isdigit() and int(index) < len(places):
            at = places[int(index)].removeprefix("messages.")
            if not isinstance(inner, Mapping):
                return {at: inner}
            key, value = next(iter(inner.items()))
            name = "" if key == "non_field_errors" else f".{key}"
            if at.split(".")[-2:-1] == ["content"] and key == "tool_call_id":
                name = ".tool_use_id"  # a tool_result block
            elif str(key).startswith("tool_calls"):
                name = ".content"  # the tool_use blocks of that turn
            return {at + name: value}
    return detail


MESSAGES_SCHEMA: dict[str, Any] = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {
            "role": {"type": "string", "enum": ["user", "assistant"]},
            "content": {
                "oneOf": [
                    {"type": "string"},
                    {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "description": "text, image (source base64 or url), tool_use "
                            "(assistant) or tool_result (user) block.",
                            "properties": {
                                "type": {
                                    "type": "string",
                                    "enum": ["text", "image", "tool_use", "tool_result"],
                                }
                            },
                            "required": ["type"],
                        },
                    },
                ]
            },
        },
        "required": ["role", "content"],
    },
}


@extend_schema_field(MESSAGES_SCHEMA)
class AnthropicMessagesField(serializers.Field):
    """Anthropic's ``messages`` → ``tuple[Message, ...]`` (through the chat checks)."""

    def to_internal_value(self, data: Any) -> tuple[Message, ...]:
        if not isinstance(data, list) or not data:
            raise serializers.ValidationError("Expected a non-empty list of messages.")
        chat: list[dict[str, Any]] = []
        places: list[str] = []
        try:
            for i, raw in enumerate(data):
                _turn(raw, i, chat, places)
        except serializers.ValidationError as exc:
            raise serializers.ValidationError(_strip_messages(exc.detail)) from None
        try:
            return MessagesField().to_internal_value(chat)
        except serializers.ValidationError as exc:
            raise serializers.ValidationError(_placed(exc.detail, places)) from None

    def to_representation(self, value: Any) -> Any:
        return [m.to_dict() for m in value]


def _strip_messages(detail: Any) -> Any:
    """``{"messages.2.content": …}`` → ``{"2.content": …}`` (the field adds the name)."""
    if isinstance(detail, Mapping):
        return {str(k).removeprefix("messages."): v for k, v in detail.items()}
    return detail


SYSTEM_SCHEMA: dict[str, Any] = {
    "oneOf": [
        {"type": "string"},
        {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"type": {"enum": ["text"]}, "text": {"type": "string"}},
                "required": ["type", "text"],
            },
        },
    ]
}


@extend_schema_field(SYSTEM_SCHEMA)
class SystemField(serializers.Field):
    """``system``: a string or a list of text blocks → one string."""

    def to_internal_value(self, data: Any) -> str:
        if isinstance(data, list):
            texts = []
            for j, block in enumerate(data):
                if not isinstance(block, Mapping) or block.get("type") != "text":
                    raise serializers.ValidationError({str(j): ["Expected a text block."]})
                try:
                    _check_keys(block, {"type", "text", "citations"}, str(j))
                except serializers.ValidationError as exc:
                    raise serializers.ValidationError(exc.detail) from None
                texts.append(self._text(block.get("text"), f"{j}.text"))
            return "\n\n".join(texts)
        return self._text(data, None)

    @staticmethod
    def _text(value: Any, place: str | None) -> str:
        try:
            return str(
                StrictCharField(allow_blank=True, trim_whitespace=False).run_validation(value)
            )
        except serializers.ValidationError as exc:
            raise serializers.ValidationError(
                {place: exc.detail} if place else exc.detail
            ) from None

    def to_representation(self, value: Any) -> Any:
        return value


#: Anthropic's server-side tools, by the prefix of their ``type``.
SERVER_TOOLS = (
    "web_search",
    "web_fetch",
    "bash",
    "text_editor",
    "computer",
    "code_execution",
    "memory",
    "mcp",
)

TOOLS_SCHEMA: dict[str, Any] = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "description": {"type": "string"},
            "input_schema": {"type": "object", "description": "A JSON Schema."},
            "type": {"type": "string", "enum": ["custom"]},
        },
        "required": ["name", "input_schema"],
    },
}


@extend_schema_field(TOOLS_SCHEMA)
class AnthropicToolsField(serializers.Field):
    """Anthropic's client tools → ``tuple[Tool, ...]`` (through the chat checks)."""

    def to_internal_value(self, data: Any) -> tuple[Tool, ...]:
        chat: list[Any] = []
        for i, raw in tool_objects(data):
            kind = raw.get("type", "custom")
            if kind != "custom":
                raise serializers.ValidationError(
                    {
                        f"{i}.type": [
                            f"The server tool {kind!r} is not supported by this router; "
                            "only client tools (name, description, input_schema)."
                        ]
                    }
                )
            for key in raw:
                if key not in {"type", "name", "description", "input_schema"} | HINTS:
                    raise serializers.ValidationError(
                        {f"{i}.{key}": ["Extra inputs are not permitted."]}
                    )
            if "input_schema" not in raw:
                raise serializers.ValidationError({f"{i}.input_schema": ["Field required."]})
            function = {"name": raw.get("name"), "parameters": raw.get("input_schema")}
            if "description" in raw:
                function["description"] = raw["description"]
            chat.append({"type": "function", "function": function})
        try:
            return ToolsField().to_internal_value(chat)
        except serializers.ValidationError as exc:
            raise serializers.ValidationError(_anthropic_tool_places(exc.detail)) from None

    def to_representation(self, value: Any) -> Any:
        return [
            {"name": t.name, "description": t.description, "input_schema": dict(t.parameters)}
            for t in value
        ]


def _anthropic_tool_places(detail: Any) -> Any:
    if isinstance(detail, Mapping):
        out: dict[str, Any] = {}
        for index, inner in detail.items():
            if isinstance(inner, Mapping):
                for key, value in inner.items():
                    name = str(key).replace("function.parameters", "input_schema")
                    name = name.replace("function.", "")
                    out[f"{index}.{name}" if key != "non_field_errors" else str(index)] = value
            else:
                out[str(index)] = inner
        return out
    return detail


TOOL_CHOICE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "type": {"type": "string", "enum": ["auto", "any", "tool", "none"]},
        "name": {"type": "string", "description": "The tool (type tool)."},
        "disable_parallel_tool_use": {"type": "boolean", "enum": [False]},
    },
    "required": ["type"],
}


@extend_schema_field(TOOL_CHOICE_SCHEMA)
class AnthropicToolChoiceField(serializers.Field):
    def to_internal_value(self, data: Any) -> ToolChoice:
        if not isinstance(data, Mapping):
            raise serializers.ValidationError(
                'Expected {"type": "auto" | "any" | "tool" | "none"}.'
            )
        kind = data.get("type")
        allowed = {"type", "disable_parallel_tool_use"} | ({"name"} if kind == "tool" else set())
        for key in data:
            if key not in allowed:
                raise serializers.ValidationError({key: ["Extra inputs are not permitted."]})
        if data.get("disable_parallel_tool_use") not in (None, False):
            raise serializers.ValidationError(
                {
                    "disable_parallel_tool_use": [
                        "disable_parallel_tool_use is not supported by this router; it is "
                        "accepted only as false."
                    ]
                }
            )
        if kind == "auto":
            return "auto"
        if kind == "any":
            return "required"
        if kind == "none":
            return "none"
        if kind == "tool":
            name = data.get("name")
            if not isinstance(name, str) or not name:
                raise serializers.ValidationError({"name": ["Field required."]})
            return ForcedTool(name=name)
        raise serializers.ValidationError({"type": ["Expected auto, any, tool or none."]})

    def to_representation(self, value: Any) -> Any:
        if isinstance(value, ForcedTool):
            return {"type": "tool", "name": value.name}
        return {"type": {"required": "any"}.get(value, value)}


class MetadataSerializer(serializers.Serializer):
    user_id = StrictCharField(required=False, allow_null=True, max_length=256)

    def to_internal_value(self, data: Any) -> Any:
        refuse_unknown(data, self.fields, message="Extra inputs are not permitted.")
        return super().to_internal_value(data)


class TokenCountRequestSerializer(serializers.Serializer):
    """The body of ``POST /v1/messages/count_tokens``: the conversation part of a
    Messages request (no ``max_tokens``)."""

    #: Parameters accepted (validated) and dropped: counting needs only the text.
    COUNT_ONLY: frozenset[str] = frozenset()

    model = model_name_field()
    messages = AnthropicMessagesField()
    system = SystemField(required=False, allow_null=True)
    tools = AnthropicToolsField(required=False, allow_null=True)
    tool_choice = AnthropicToolChoiceField(required=False, allow_null=True)

    def to_internal_value(self, data: Any) -> Any:
        refuse_unknown(data, self.fields, message="Extra inputs are not permitted.")
        return super().to_internal_value(data)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs.get("system"):
            attrs["messages"] = (
                Message(role="system", content=attrs["system"]),
                *attrs["messages"],
            )
        problems = check_conversation(attrs)
        if problems:
            raise serializers.ValidationError(problems)
        return attrs

    def conversation(self, **more: Any) -> AuditRequest:
        """The conversation as the router's request (``more``: its other fields)."""
        d = self.validated_data
        return AuditRequest(
            task="chat",
            messages=d["messages"],
            tools=d.get("tools") or (),
            tool_choice=d.get("tool_choice"),
            **more,
        )


class MessagesRequestSerializer(TokenCountRequestSerializer):
    """The body of ``POST /v1/messages``: Anthropic's parameters, strictly typed."""

    max_tokens = StrictIntegerField(min_value=1)
    stop_sequences = StopField(required=False, allow_null=True)
    temperature = StrictFloatField(required=False, allow_null=True, min_value=0, max_value=1)
    top_p = StrictFloatField(required=False, allow_null=True, min_value=0, max_value=1)
    top_k = StrictIntegerField(required=False, allow_null=True, min_value=0)
    metadata = MetadataSerializer(required=False, allow_null=True)
    stream = StrictBooleanField(required=False, default=False)

    def validate_max_tokens(self, value: int) -> int | None:
        return output_tokens_within_limit(value)

    def validate_top_k(self, value: int | None) -> int | None:
        if value is not None:
            raise serializers.ValidationError(
                "top_k is not supported by this router (not every provider kind behind a "
                "chain takes it); leave it out."
            )
        return value

    def to_request(self) -> AuditRequest:
        d = self.validated_data
        return self.conversation(
            stream=bool(d.get("stream")),
            temperature=d.get("temperature"),
            top_p=d.get("top_p"),
            max_tokens=d["max_tokens"],
            stop=d.get("stop_sequences") or (),
            user=(d.get("metadata") or {}).get("user_id"),
            backstop=False,  # an exhausted chain is a 503, unless the chain opts in
            **select_model(d["model"]),
        )

    def echo(self) -> dict[str, Any]:
        return {}
