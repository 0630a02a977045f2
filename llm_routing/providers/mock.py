"""The mock provider: deterministic, offline, always available.

The same (task, instructions, input — ``input_text``, or the whole conversation when
``messages`` are given — response_schema) always yields the same output, and the
output says that it is a mock. It answers a request offering tools with text (it never
invents a tool call). A structured answer is generated from the schema
(:func:`llm_routing.schemas.example_instance`: ``minItems``, ``minProperties``,
``uniqueItems``, ``contains`` / ``minContains`` included) and validated against it; a
schema the generator cannot satisfy is a ``response`` error, never an ``ok`` answer that
breaks the schema. Embeddings are seeded unit vectors (the same model and input always
give the same vector). It is the router's backstop and the adapter used for any
provider row in ``mode = mock`` (staging without keys).
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

from ..conf import routing_settings
from ..errors import InvalidRequestError, ResponseError
from ..schemas import SchemaTooLarge, example_instance
from ..types import AuditRequest, ProviderResult, StreamDelta, StreamEnd, StreamEvent, Usage
from .base import BaseProvider, validate_structured
from .embeddings import MOCK_DIMENSIONS, estimated_tokens, mock_vector

__all__ = ["MockProvider", "instance_from_schema"]


def _digest(request: AuditRequest) -> str:
    # A one-shot request keeps its digest of before conversations existed.
    conversation = [m.to_dict() for m in request.messages] if request.messages else None
    material = json.dumps(
        [
            request.task,
            request.instructions,
            conversation or request.input_text,
            request.response_schema,
        ],
        sort_keys=True,
        ensure_ascii=True,
        default=str,
    )
    return hashlib.sha256(material.encode("ascii")).hexdigest()


def instance_from_schema(schema: Mapping[str, Any]) -> Any:
    """A small deterministic value that satisfies common JSON Schema shapes, bounded by
    ``MOCK_MAX_OUTPUT_BYTES`` / ``MOCK_MAX_DEPTH`` (:class:`~llm_routing.schemas.SchemaTooLarge`
    past them; see :func:`llm_routing.schemas.example_instance`)."""
    return example_instance(schema)


class MockProvider(BaseProvider):
    kind: ClassVar[str] = "mock"
    requires_key: ClassVar[bool] = False
    result_mode: ClassVar[str] = "mock"

    # The backstop serves every request (it answers tool requests with text).
    capabilities: ClassVar[frozenset[str]] = frozenset(
        {"structured_output", "streaming", "tools", "images", "embeddings", "token_inputs"}
    )

    def supports(self, capability: str) -> bool:
        return capability in self.capabilities

    def stream(
        self, request: AuditRequest, *, api_key: str | None, timeout: float
    ) -> Iterator[StreamEvent]:
        """The same output as :meth:`complete`, a word at a time."""
        result = self.complete(request, api_key=api_key, timeout=timeout)
        for piece in re.findall(r"\S+\s*", result.output):
            yield StreamDelta(piece)
        yield StreamEnd(finish_reason="stop", usage=result.usage, model=result.model)

    def embed(
        self, request: AuditRequest, *, api_key: str | None, timeout: float
    ) -> ProviderResult:
        """Deterministic unit vectors (:func:`~llm_routing.providers.embeddings.mock_vector`)
        of the dimension the walk expects, else the asked one, else the row's declared
        one, else :data:`~llm_routing.providers.embeddings.MOCK_DIMENSIONS`."""
        started = time.perf_counter()
        config = self.config
        dimension = (
            request.expected_dimensions
            or request.dimensions
            or config.embedding_dimensions
            or MOCK_DIMENSIONS
        )
        # No larger than a real upstream's answer may be (MAX_RESPONSE_BYTES of float32).
        limit = int(routing_settings.MAX_RESPONSE_BYTES) // 4
        if dimension * len(request.inputs) > limit:
            raise InvalidRequestError(
                f"The mock answers at most {limit} numbers (MAX_RESPONSE_BYTES / 4): "
                "fewer inputs or dimensions."
            )
        return ProviderResult(
            provider=config.name,
            model=config.model or routing_settings.MOCK_MODEL,
            mode="mock",
            status="ok",
            vectors=tuple(mock_vector(config, item, dimension) for item in request.inputs),
            usage=Usage(input_tokens=estimated_tokens(request.inputs)),
            latency_ms=(time.perf_counter() - started) * 1000,
        )

    def complete(
        self, request: AuditRequest, *, api_key: str | None, timeout: float
    ) -> ProviderResult:
        started = time.perf_counter()
        digest = _digest(request)
        output = (
            f"[mock] {request.task}: deterministic mock answer {digest[:16]} "
            f"for {request.input_length} characters of input."
        )
        data = None
        if request.response_schema is not None:
            # Structured output: like the vendors, the text is the JSON document.
            try:
                data = instance_from_schema(request.response_schema)
            except SchemaTooLarge as exc:
                # Only reachable through the Python API: the HTTP API refuses such a
                # schema with 400 before routing.
                raise InvalidRequestError(str(exc)) from None
            output = json.dumps(data, sort_keys=True)
            try:
                validate_structured(output, request.response_schema)
            except ResponseError as exc:
                # A schema the example generator cannot satisfy: an honest error, never an
                # "ok" answer that breaks the schema.
                raise ResponseError(
                    f"The mock cannot produce an answer for this schema: {exc.message}"
                ) from None
        if request.prefill:
            # Continuation: only what follows the delivered text.
            output = (
                output[len(request.prefill) :]
                if output.startswith(request.prefill)
                else (f" [mock continuation {digest[:8]}]")
            )
        model = self.config.model or routing_settings.MOCK_MODEL
        return ProviderResult(
            provider=self.config.name,
            model=model,
            mode="mock",
            status="ok",
            output=output,
            data=data,
            usage=Usage(
                input_tokens=(len(request.instructions) + request.input_length + 3) // 4,
                output_tokens=len(output.split()),
            ),
            latency_ms=(time.perf_counter() - started) * 1000,
            finish_reason="stop",
        )
