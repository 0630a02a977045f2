"""An OpenAI embeddings face of the one router: ``POST /v1/embeddings``.

The request is parsed by :mod:`~llm_routing.api.embeddings_serializers` into the
router's request (``call="embed"``: the inputs, the ``dimensions`` asked for) and
routed as every face is (the same chains, rules, skips, retries, failover, circuits,
budgets, throttles, permissions, records, metrics and costs); candidates whose kind
serves no embeddings are skipped as ``unsupported``, those declaring another vector
length as ``dimension_mismatch``. The answer is OpenAI's ``list`` of ``embedding``
objects (``embedding`` a list of floats, or base64 of little-endian float32 with
``encoding_format: "base64"``), ``model`` the model that served, ``usage`` with
``prompt_tokens``, ``total_tokens`` and the extension ``cost_usd``. Errors use OpenAI's
envelope, as ``/v1/responses``. There is no stream.
"""

from __future__ import annotations

from typing import Any, ClassVar

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request

from .. import pricing
from ..providers.embeddings import to_base64, to_floats
from ..types import RoutingResult
from .embeddings_serializers import EmbeddingsRequestSerializer
from .faces import Face, FaceView, Frames, Parsed, Problem, schema_entry
from .responses_face import ResponsesErrorSerializer, ResponsesFace

__all__ = ["EmbeddingsFace", "EmbeddingsView"]

#: OpenAI's error envelope, worded as on ``/v1/responses``.
_OPENAI_ERRORS = ResponsesFace()


class EmbeddingsFace(Face):
    name = "embeddings"
    request_serializer = EmbeddingsRequestSerializer

    def body(self, routed: RoutingResult, parsed: Parsed) -> dict[str, Any]:
        result = routed.result
        encode = to_base64 if parsed.echo.get("encoding_format") == "base64" else to_floats
        tokens = result.usage.input_tokens
        return {
            "object": "list",
            "data": [
                {"object": "embedding", "index": i, "embedding": encode(vector)}
                for i, vector in enumerate(result.vectors)
            ],
            "model": result.model,
            "usage": {
                "prompt_tokens": tokens,
                "total_tokens": tokens + result.usage.output_tokens,
                "cost_usd": pricing.total_usd(routed),
            },
        }

    def frames(self, request_id: str, parsed: Parsed) -> Frames:
        raise NotImplementedError("The embeddings face has no stream.")

    def error_body(self, problem: Problem) -> dict[str, Any]:
        return _OPENAI_ERRORS.error_body(problem)


# --- the schema -------------------------------------------------------------------------


class EmbeddingObjectSerializer(serializers.Serializer):
    object = serializers.ChoiceField(choices=["embedding"])
    index = serializers.IntegerField()
    embedding = serializers.JSONField(
        help_text="A list of floats, or (encoding_format base64) base64 of little-endian float32."
    )


class EmbeddingsUsageSerializer(serializers.Serializer):
    prompt_tokens = serializers.IntegerField(
        help_text="As the upstream reported it (Gemini reports none: four characters a token)."
    )
    total_tokens = serializers.IntegerField()
    cost_usd = serializers.FloatField(
        allow_null=True, help_text="Extension: USD for every attempt of this request."
    )


#: The answer (a serializer field named ``data`` would shadow ``Serializer.data``).
EmbeddingsListSerializer = inline_serializer(
    name="EmbeddingsList",
    fields={
        "object": serializers.ChoiceField(choices=["list"]),
        "data": EmbeddingObjectSerializer(many=True),
        "model": serializers.CharField(help_text="The model that served (never the chain name)."),
        "usage": EmbeddingsUsageSerializer(),
    },
)


_EXAMPLE_REQUEST = {
    "model": "embeddings",
    "input": ["The food was delicious.", "The waiter was friendly."],
    "dimensions": 4,
}
_EXAMPLE_ANSWER = {
    "object": "list",
    "data": [
        {"object": "embedding", "index": 0, "embedding": [0.0123, -0.5521, 0.7934, -0.2551]},
        {"object": "embedding", "index": 1, "embedding": [0.3312, 0.1409, -0.8826, 0.3045]},
    ],
    "model": "text-embedding-3-small",
    "usage": {"prompt_tokens": 10, "total_tokens": 10, "cost_usd": 0.0000002},
}


class EmbeddingsView(FaceView):
    face: ClassVar[Face] = EmbeddingsFace()

    @extend_schema(
        operation_id="v1_embeddings_create",
        summary="OpenAI embeddings, served by any embeddings-capable provider of the chain",
        description="""\
OpenAI's embeddings API as a face of the same router, so the `openai` SDK's
`embeddings.create` works against it: set the client's base URL to this app's `/v1`
and the API key to a DRF token. `model` names a chain, a route key or a provider;
`openai`, `openai_compatible` and `gemini` providers serve it (an `anthropic` one is
skipped as `unsupported`).

`input` is a string, a list of strings, a token array or a list of token arrays (up to
2048 inputs); `dimensions` is sent upstream and holds every candidate to that length;
`encoding_format` is `float` (default) or `base64`; `user` is passed on. Failover only
moves between candidates of one vector length: a candidate declaring another
`embedding_dimensions` is skipped as `dimension_mismatch`, and an upstream answering
vectors of the wrong length is a 502 (never returned). Errors are OpenAI's envelope
(docs/clients.md).
""",
        request=EmbeddingsRequestSerializer,
        **schema_entry(
            EmbeddingsFace(),
            ok=EmbeddingsListSerializer,
            error=ResponsesErrorSerializer,
            request_example=_EXAMPLE_REQUEST,
            ok_example=_EXAMPLE_ANSWER,
        ),
    )
    def post(self, request: Request) -> Any:
        return self.handle(request)
