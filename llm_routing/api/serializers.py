"""Request/response serializers for ``POST /audit/`` (docs/api.md)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from ..conf import routing_settings
from ..schemas import SchemaRefused, check_schema
from ..types import AuditRequest
from .chat_serializers import (
    MessagesField,
    SamplingSerializer,
    StrictBooleanField,
    StrictCharField,
    ToolChoiceField,
    ToolsField,
    check_conversation,
    check_input,
)

__all__ = [
    "AuditRequestSerializer",
    "AuditResponseSerializer",
    "ChatCallSerializer",
    "StrictCharField",
    "check_one_provider_choice",
    "output_tokens_within_limit",
]

SLUG_RE = r"^[-a-zA-Z0-9_]+$"


def output_tokens_within_limit(value: int | None) -> int | None:
    """A client's ``max_tokens``: 400 above ``MAX_OUTPUT_TOKENS_LIMIT``; below it the
    router clamps it to the row's and the global ceilings (``MAX_OUTPUT_TOKENS``)."""
    limit = int(routing_settings.MAX_OUTPUT_TOKENS_LIMIT)
    if value is not None and value > limit:
        raise serializers.ValidationError(f"Ensure this value is less than or equal to {limit}.")
    return value


def check_one_provider_choice(attrs: Mapping[str, Any]) -> None:
    """``provider`` (tried first) and ``force_provider`` (only that one) exclude each other."""
    if attrs.get("force_provider") and attrs.get("provider"):
        raise serializers.ValidationError(
            {"force_provider": ["Use either provider or force_provider, not both."]}
        )


class StrictRegexField(serializers.RegexField):
    """A slug field: the message names the pattern and gives an example."""

    default_error_messages = {
        "invalid": (
            f"Enter a slug matching {SLUG_RE}: letters, digits, hyphens and underscores "
            'only, for example "summarize" or "openai-main".'
        )
    }

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return str(super().to_internal_value(data))


def model_name_field() -> StrictRegexField:
    """The ``model`` of every ``/v1`` face: a string (never a coerced number) naming a
    chain, route or provider."""
    return StrictRegexField(
        r"^[-a-zA-Z0-9_.:]+$",
        max_length=64,
        error_messages={"invalid": "Enter a model name: letters, digits, '-', '_', '.', ':'."},
    )


@extend_schema_field({"type": "object", "additionalProperties": {"type": "string"}})
class StrictStringMapField(serializers.Field):
    """A flat ``{str: str}`` object with bounded size; no coercion of numbers."""

    default_error_messages = {
        "not_a_dict": "Expected an object of string values.",
        "too_many": "At most {max} keys are allowed.",
        "bad_key": "Keys must be non-empty strings of at most {max} characters.",
        "bad_value": "Value of {name!r} must be a string of at most {max} characters.",
    }

    def to_internal_value(self, data: Any) -> dict[str, str]:
        if not isinstance(data, Mapping):
            self.fail("not_a_dict")
        max_keys = int(routing_settings.MAX_METADATA_KEYS)
        max_key = int(routing_settings.MAX_METADATA_KEY_CHARS)
        max_value = int(routing_settings.MAX_METADATA_VALUE_CHARS)
        if len(data) > max_keys:
            self.fail("too_many", max=max_keys)
        out: dict[str, str] = {}
        for key, value in data.items():
            # NUL and lone surrogates: refused by the input boundary (check_input).
            if not isinstance(key, str) or not key or len(key) > max_key:
                self.fail("bad_key", max=max_key)
            if not isinstance(value, str) or len(value) > max_value:
                self.fail("bad_value", name=key[:64], max=max_value)
            out[key] = value
        return out

    def to_representation(self, value: Any) -> Any:
        return value


class AuditRequestSerializer(serializers.Serializer):
    task = StrictRegexField(SLUG_RE, max_length=64)
    instructions = StrictCharField(
        required=False, allow_blank=True, default="", trim_whitespace=False
    )
    # Exactly one of input_text (one user turn) and messages (a conversation).
    input_text = StrictCharField(required=False, trim_whitespace=False)
    messages = MessagesField(required=False)
    tools = ToolsField(required=False)
    tool_choice = ToolChoiceField(required=False, allow_null=True)
    provider = StrictRegexField(SLUG_RE, max_length=64, required=False, allow_null=True)
    route = StrictRegexField(SLUG_RE, max_length=64, required=False, allow_null=True)
    force_provider = StrictRegexField(SLUG_RE, max_length=64, required=False, allow_null=True)
    chain = StrictRegexField(SLUG_RE, max_length=64, required=False, allow_null=True)
    response_schema = serializers.JSONField(required=False, allow_null=True)
    metadata = StrictStringMapField(required=False, default=dict)
    stream = StrictBooleanField(required=False, default=False)
    affinity = StrictCharField(
        required=False,
        allow_null=True,
        max_length=256,
        help_text="Prompt-cache affinity key (a conversation id): requests with the same "
        "key go back to the candidate that served it last. Only its hash is kept.",
    )

    def get_fields(self) -> dict[str, serializers.Field]:
        fields = super().get_fields()
        # "async" is a Python keyword, so the field is added by name here.
        fields["async"] = StrictBooleanField(required=False, default=False)
        return fields

    def to_internal_value(self, data: Any) -> Any:
        check_input(data)  # the input boundary, once (llm_routing.boundary)
        if isinstance(data, Mapping):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError(
                    {name: ["Unknown field."] for name in unknown[:20]}
                )
        return super().to_internal_value(data)

    def validate_task(self, value: str) -> str:
        # MAX_TASK_CHARS may lower the limit; 64 (the field's max_length) is the column.
        limit = min(int(routing_settings.MAX_TASK_CHARS), 64)
        if len(value) > limit:
            raise serializers.ValidationError(
                f"Ensure this field has no more than {limit} characters."
            )
        return value

    def validate_instructions(self, value: str) -> str:
        limit = int(routing_settings.MAX_INSTRUCTIONS_CHARS)
        if len(value) > limit:
            raise serializers.ValidationError(
                f"Ensure this field has no more than {limit} characters."
            )
        return value

    def validate_input_text(self, value: str) -> str:
        limit = int(routing_settings.MAX_INPUT_CHARS)
        if not value.strip():
            raise serializers.ValidationError("This field may not be blank.")
        if len(value) > limit:
            raise serializers.ValidationError(
                f"Ensure this field has no more than {limit} characters."
            )
        return value

    def validate_response_schema(self, value: Any) -> Any:
        if value is None:
            return None
        try:
            check_schema(value)  # no I/O: remote $refs and unsupported patterns are refused
        except SchemaRefused as exc:
            raise serializers.ValidationError(str(exc)) from None
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if ("input_text" in attrs) == ("messages" in attrs):
            raise serializers.ValidationError(
                {"input_text": ["Give exactly one of input_text and messages."]}
            )
        problems = check_conversation(attrs)
        if problems:
            raise serializers.ValidationError(problems)
        if attrs.get("async") and attrs.get("stream"):
            raise serializers.ValidationError({"async": ["Use either stream or async, not both."]})
        check_one_provider_choice(attrs)
        return attrs

    def to_request(self) -> AuditRequest:
        d = self.validated_data
        return AuditRequest(
            task=d["task"],
            input_text=d.get("input_text", ""),
            messages=d.get("messages", ()),
            tools=d.get("tools", ()),
            tool_choice=d.get("tool_choice"),
            instructions=d.get("instructions", ""),
            provider=d.get("provider"),
            route=d.get("route"),
            force_provider=d.get("force_provider"),
            chain=d.get("chain"),
            response_schema=d.get("response_schema"),
            metadata=d.get("metadata") or {},
            stream=bool(d.get("stream")),
            affinity=d.get("affinity") or None,
        )


class ChatCallSerializer(SamplingSerializer, AuditRequestSerializer):
    """The keyword arguments of :func:`llm_routing.chat`: ``/audit/``'s fields with
    ``messages`` required instead of ``input_text``, a chain chosen by name, the
    sampling parameters, ``stream``, and ``backstop`` (False: an exhausted chain is an
    error result instead of the mock's answer, unless the chain opts in)."""

    task = StrictRegexField(SLUG_RE, max_length=64, required=False, default="chat")
    input_text = None  # type: ignore[assignment]  # DRF: None removes an inherited field
    messages = MessagesField()
    backstop = StrictBooleanField(required=False, default=True)

    def get_fields(self) -> dict[str, serializers.Field]:
        fields = super().get_fields()
        fields.pop("async")
        return fields

    def to_request(self) -> AuditRequest:
        d = self.validated_data
        return replace(
            super().to_request(),
            backstop=d["backstop"],
            **self.sampling(),
        )


# --- response shapes (documentation for the OpenAPI schema) --------------------------


class UsageSerializer(serializers.Serializer):
    input_tokens = serializers.IntegerField()
    output_tokens = serializers.IntegerField()


class ErrorSerializer(serializers.Serializer):
    category = serializers.CharField()
    message = serializers.CharField()
    http_status = serializers.IntegerField(allow_null=True)
    transient = serializers.BooleanField()


class ToolCallFunctionSerializer(serializers.Serializer):
    name = serializers.CharField()
    arguments = serializers.CharField(help_text="The call's arguments: a JSON object as text.")


class ToolCallSerializer(serializers.Serializer):
    id = serializers.CharField()
    type = serializers.ChoiceField(choices=["function"])
    function = ToolCallFunctionSerializer()


class ResultSerializer(serializers.Serializer):
    provider = serializers.CharField()
    model = serializers.CharField()
    mode = serializers.ChoiceField(choices=["live", "mock", "disabled", "error"])
    status = serializers.ChoiceField(choices=["ok", "fallback", "error"])
    output = serializers.CharField()
    usage = UsageSerializer()
    latency_ms = serializers.FloatField()
    error = ErrorSerializer(allow_null=True)
    tool_calls = ToolCallSerializer(
        many=True, help_text="The tool calls of the answer (OpenAI's shape); [] when none."
    )
    finish_reason = serializers.CharField(
        allow_null=True,
        help_text="Why the answer ended, in the serving vendor's own words (end_turn, STOP, "
        "tool_use, length …); /v1 maps it to OpenAI's values.",
    )

    def get_fields(self) -> dict[str, serializers.Field]:
        fields = super().get_fields()
        # "data" would shadow Serializer.data as a class attribute.
        fields["data"] = serializers.JSONField(allow_null=True)
        return fields


class SkipSerializer(serializers.Serializer):
    provider = serializers.CharField()
    reason = serializers.CharField()


class AttemptSerializer(serializers.Serializer):
    provider = serializers.CharField()
    model = serializers.CharField()
    step = serializers.IntegerField(
        allow_null=True, help_text="The chain step of the candidate (0 first); null: forced."
    )
    outcome = serializers.ChoiceField(
        choices=["ok", "error", "skipped", "hedge_lost", "hedge_skipped"],
        help_text="hedge_lost: cancelled because the other side of a hedge answered first; "
        "hedge_skipped: a hedge was due but the deadline, the attempt budget or a tokens "
        "or cost cap could not afford it (its reason: deadline, attempt_budget, cost_cap).",
    )
    error_category = serializers.CharField(allow_null=True)
    http_status = serializers.IntegerField(allow_null=True)
    transient = serializers.BooleanField()
    retries = serializers.IntegerField()
    latency_ms = serializers.FloatField()
    cost_usd = serializers.FloatField(
        allow_null=True, help_text="USD for this attempt's tokens; null when unknown."
    )


class PickSerializer(serializers.Serializer):
    step = serializers.IntegerField()
    strategy = serializers.ChoiceField(choices=["weighted", "least_in_flight", "latency", "cost"])
    picked = serializers.CharField(allow_null=True)
    reason = serializers.CharField()
    order = serializers.ListField(child=serializers.CharField())
    weights = serializers.DictField(child=serializers.FloatField())
    counts = serializers.DictField(
        child=serializers.IntegerField(), required=False, help_text="least_in_flight"
    )
    scores = serializers.DictField(
        child=serializers.FloatField(allow_null=True),
        required=False,
        help_text="latency (ms, peak-EWMA) or cost (estimated USD); null: no data.",
    )
    draw = serializers.FloatField(required=False, help_text="weighted: the seeded draw.")
    explored = serializers.BooleanField(required=False, help_text="latency: an exploration.")


class RoutingMetadataSerializer(serializers.Serializer):
    request_id = serializers.UUIDField()
    router_mode = serializers.ChoiceField(
        choices=["explicit", "chain", "default", "rule", "forced"]
    )
    route = serializers.CharField(allow_null=True)
    rule = serializers.CharField(allow_null=True)
    chain_name = serializers.CharField(allow_null=True)
    requested_provider = serializers.CharField(allow_null=True)
    selected_provider = serializers.CharField(allow_null=True)
    chain = serializers.ListField(child=serializers.CharField())
    attempted_providers = serializers.ListField(child=serializers.CharField())
    skipped_providers = SkipSerializer(many=True)
    attempts = AttemptSerializer(many=True)
    fallback_used = serializers.BooleanField()
    fallback_reason = serializers.CharField(allow_null=True)
    cost_usd = serializers.FloatField(
        allow_null=True,
        help_text="USD for every attempt (failed ones that consumed tokens included); "
        "null when any price is unknown.",
    )
    picks = PickSerializer(
        many=True, help_text="Per step of several candidates: how its strategy picked."
    )
    hedge = serializers.ChoiceField(
        choices=["won", "lost", "failed", "skipped"],
        allow_null=True,
        help_text="A hedged request: won (the hedge answered first), lost (the first "
        "attempt did), failed (neither answered), skipped (not affordable); null: no "
        "hedge was due.",
    )


class AuditResponseSerializer(serializers.Serializer):
    request_id = serializers.UUIDField()
    result = ResultSerializer()
    routing_metadata = RoutingMetadataSerializer()
    diagnostics = RoutingMetadataSerializer()
