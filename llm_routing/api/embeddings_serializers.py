"""The body of ``POST /v1/embeddings`` (OpenAI's embeddings parameters), strictly parsed
and translated into the router's request (``call="embed"``), and the keyword arguments
of :func:`llm_routing.embed`.

``input`` is a string, a list of strings, one token array (a list of integers) or a
list of token arrays: one vector each, in order. Bounds: at most
:data:`MAX_EMBEDDING_INPUTS` inputs, none empty, a text within ``MAX_INPUT_CHARS``
characters, a token array within ``MAX_INPUT_CHARS`` ids, each id in 0 … 2**31 - 1; a list
mixing texts and token arrays is refused (OpenAI's schema refuses it too).
``dimensions`` (1 … 65536) is sent upstream and holds every candidate to that length;
``encoding_format`` is ``float`` (default) or ``base64`` (little-endian float32, as the
official client decodes it); ``user`` is passed to vendors that take one. An unknown
parameter is a 400 naming it (``code: unknown_parameter``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from ..conf import routing_settings
from ..types import AuditRequest, EmbeddingInput
from .chat_serializers import (
    StrictBooleanField,
    StrictCharField,
    StrictIntegerField,
    check_input,
    refuse_unknown,
)
from .openai_compat import select_model
from .serializers import SLUG_RE, StrictRegexField, StrictStringMapField, model_name_field

__all__ = [
    "ENCODING_FORMATS",
    "MAX_EMBEDDING_INPUTS",
    "EmbedCallSerializer",
    "EmbeddingsRequestSerializer",
    "InputField",
]

#: OpenAI's own limit of inputs in one request.
MAX_EMBEDDING_INPUTS = 2048
#: The largest token id taken (a signed 32-bit integer).
MAX_TOKEN_ID = 2**31 - 1
ENCODING_FORMATS = ("float", "base64")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _tokens(value: list[Any], place: str) -> tuple[int, ...]:
    limit = int(routing_settings.MAX_INPUT_CHARS)
    if not value:
        raise serializers.ValidationError({place: ["A token array may not be empty."]})
    if len(value) > limit:
        raise serializers.ValidationError({place: [f"At most {limit} tokens."]})
    for j, token in enumerate(value):
        if not _is_int(token) or not 0 <= token <= MAX_TOKEN_ID:
            raise serializers.ValidationError(
                {f"{place}.{j}": [f"Expected a token id: an integer from 0 to {MAX_TOKEN_ID}."]}
            )
    return tuple(value)


def _text(value: str, place: str) -> str:
    limit = int(routing_settings.MAX_INPUT_CHARS)
    if not value:
        raise serializers.ValidationError({place: ["A text to embed may not be empty."]})
    if len(value) > limit:
        raise serializers.ValidationError({place: [f"At most {limit} characters."]})
    return value


@extend_schema_field(
    {
        "oneOf": [
            {"type": "string", "minLength": 1},
            {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1},
            {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1},
            {
                "type": "array",
                "items": {"type": "array", "items": {"type": "integer", "minimum": 0}},
                "minItems": 1,
            },
        ],
        "description": "A text, a list of texts, a token array or a list of token arrays "
        f"(at most {MAX_EMBEDDING_INPUTS} inputs): one vector each, in order.",
    }
)
class InputField(serializers.Field):
    """``input`` → a tuple of inputs (texts, or token arrays as tuples of ints)."""

    def to_internal_value(self, data: Any) -> tuple[EmbeddingInput, ...]:
        if isinstance(data, str):
            return (_text(data, "0"),) if data else self._empty()
        if not isinstance(data, list):
            raise serializers.ValidationError(
                "Expected a string, a list of strings, a token array or a list of token arrays."
            )
        if not data:
            raise serializers.ValidationError("Expected at least one input.")
        if all(_is_int(x) for x in data):
            return (_tokens(data, "0"),)
        if len(data) > MAX_EMBEDDING_INPUTS:
            raise serializers.ValidationError(f"At most {MAX_EMBEDDING_INPUTS} inputs.")
        kind = str if isinstance(data[0], str) else list
        out: list[EmbeddingInput] = []
        for i, item in enumerate(data):
            if not isinstance(item, kind) or isinstance(item, bool):
                raise serializers.ValidationError(
                    {str(i): ["Expected every input to be a string, or every input a token array."]}
                )
            out.append(_text(item, str(i)) if isinstance(item, str) else _tokens(item, str(i)))
        return tuple(out)

    @staticmethod
    def _empty() -> tuple[EmbeddingInput, ...]:
        raise serializers.ValidationError("A text to embed may not be empty.")

    def to_representation(self, value: Any) -> Any:
        return [x if isinstance(x, str) else list(x) for x in value]


class _EmbeddingParams(serializers.Serializer):
    """What the face and the Python API share."""

    input = InputField()
    dimensions = StrictIntegerField(required=False, allow_null=True, min_value=1, max_value=65_536)
    user = StrictCharField(required=False, allow_null=True, max_length=256)

    def params(self) -> dict[str, Any]:
        d = self.validated_data
        return {
            "call": "embed",
            "inputs": d["input"],
            "dimensions": d.get("dimensions"),
            "user": d.get("user"),
        }


class EmbeddingsRequestSerializer(_EmbeddingParams):
    """The body of ``POST /v1/embeddings``: OpenAI's parameters, strictly typed."""

    model = model_name_field()
    encoding_format = serializers.ChoiceField(
        choices=list(ENCODING_FORMATS), required=False, allow_null=True, default="float"
    )

    def to_internal_value(self, data: Any) -> Any:
        check_input(data)  # the input boundary, once (llm_routing.boundary)
        refuse_unknown(
            data,
            self.fields,
            message=lambda name: f"Unrecognized request argument supplied: {name}",
        )
        return super().to_internal_value(data)

    def to_request(self) -> AuditRequest:
        return AuditRequest(
            task="embeddings",
            backstop=False,  # an exhausted chain is a 503, unless the chain opts in
            **self.params(),
            **select_model(self.validated_data["model"]),
        )

    def echo(self) -> dict[str, Any]:
        return {"encoding_format": self.validated_data.get("encoding_format") or "float"}


class EmbedCallSerializer(_EmbeddingParams):
    """The keyword arguments of :func:`llm_routing.embed`: the face's parameters with a
    chain, route or provider named as in :func:`llm_routing.chat`."""

    task = StrictRegexField(SLUG_RE, max_length=64, required=False, default="embeddings")
    provider = StrictRegexField(SLUG_RE, max_length=64, required=False, allow_null=True)
    route = StrictRegexField(SLUG_RE, max_length=64, required=False, allow_null=True)
    force_provider = StrictRegexField(SLUG_RE, max_length=64, required=False, allow_null=True)
    chain = StrictRegexField(SLUG_RE, max_length=64, required=False, allow_null=True)
    metadata = StrictStringMapField(required=False, default=dict)
    backstop = StrictBooleanField(required=False, default=True)

    def to_internal_value(self, data: Any) -> Any:
        check_input(data)
        if isinstance(data, Mapping):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError(
                    {name: ["Unknown field."] for name in unknown[:20]}
                )
        return super().to_internal_value(data)

    def to_request(self) -> AuditRequest:
        d = self.validated_data
        return AuditRequest(
            task=d["task"],
            provider=d.get("provider"),
            route=d.get("route"),
            force_provider=d.get("force_provider"),
            chain=d.get("chain"),
            metadata=d.get("metadata") or {},
            backstop=d["backstop"],
            **self.params(),
        )
