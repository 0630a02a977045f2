"""Frozen value types shared by the router, the adapters, the recorder and the API.

Nothing here touches the database or the network. ``to_dict()`` methods produce
exactly the JSON shapes of DESIGN §5.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "MOCK_PROVIDER_NAME",
    "AttemptRecord",
    "AuditRequest",
    "ErrorInfo",
    "Principal",
    "ProviderConfig",
    "ProviderResult",
    "RouterStreamEvent",
    "RoutingMetadata",
    "RoutingResult",
    "StreamChunk",
    "StreamDelta",
    "StreamEnd",
    "StreamEvent",
    "StreamFailure",
    "StreamResult",
    "Usage",
]

MOCK_PROVIDER_NAME = "mock"

Mode = Literal["live", "mock", "disabled", "error"]
Status = Literal["ok", "fallback", "error"]
Outcome = Literal["ok", "error", "skipped"]
RouterMode = Literal["explicit", "default", "rule", "forced"]


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is asking, as far as routing cares: computed by the API layer from the
    authenticated user (so the router never imports auth models). ``user_id`` None is
    an anonymous caller."""

    user_id: Any = None
    group_ids: frozenset[Any] = frozenset()
    can_force_provider: bool = False
    can_route_any_provider: bool = False


@dataclass(frozen=True, slots=True)
class AuditRequest:
    """One well-formed routing request (already validated by the API or caller)."""

    task: str
    input_text: str
    instructions: str = ""
    provider: str | None = None
    route: str | None = None
    force_provider: str | None = None
    # A chain chosen by name (the OpenAI-compatible face's ``model``), instead of rules.
    chain: str | None = None
    response_schema: Mapping[str, Any] | None = None
    metadata: Mapping[str, str] = field(default_factory=dict)
    stream: bool = False
    # Continuation streaming: text already delivered, sent as a trailing assistant
    # message so the fallback continues it (only to providers declaring prefill).
    prefill: str = ""
    # Passed through by the OpenAI-compatible face (None: the provider's default).
    temperature: float | None = None
    max_tokens: int | None = None
    # The caller's identity for the access rules (docs/operations.md); None: a trusted
    # caller (the Python API, management commands) that may route anywhere.
    principal: Principal | None = None

    @property
    def input_length(self) -> int:
        return len(self.input_text)

    @property
    def input_sha256(self) -> str:
        return hashlib.sha256(self.input_text.encode("utf-8")).hexdigest()


@dataclass(frozen=True, slots=True)
class ProviderConfig:
    """A snapshot of one Provider row, handed to adapters (which never touch the DB)."""

    name: str
    kind: str
    model: str
    base_url: str = ""
    api_key_env: str = ""
    enabled: bool = True
    mode: str = "live"
    timeout_s: float = 30.0
    first_token_timeout_s: float = 10.0
    max_retries: int = 2
    params: Mapping[str, Any] = field(default_factory=dict)
    supports_structured_output: bool = False
    supports_streaming: bool = False
    supports_prefill: bool = False
    version: str = ""  # changes whenever the row changes (updated_at); keys pooled clients

    def with_model(self, model: str) -> ProviderConfig:
        from dataclasses import replace

        return replace(self, model=model)


@dataclass(frozen=True, slots=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0

    def to_dict(self) -> dict[str, int]:
        return {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens}


@dataclass(frozen=True, slots=True)
class StreamDelta:
    """A piece of answer text from a streaming adapter."""

    text: str


@dataclass(frozen=True, slots=True)
class StreamEnd:
    """The clean end of a stream (finish reason seen and the body closed)."""

    finish_reason: str | None = None
    usage: Usage | None = None
    model: str | None = None


StreamEvent = StreamDelta | StreamEnd


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    """A safe, key-free description of why a provider did not answer."""

    category: str
    message: str
    http_status: int | None = None
    transient: bool = False
    retry_after_s: float | None = None  # the provider's Retry-After; not in to_dict()

    def to_dict(self) -> dict[str, Any]:
        return {
            "category": self.category,
            "message": self.message,
            "http_status": self.http_status,
            "transient": self.transient,
        }


@dataclass(frozen=True, slots=True)
class ProviderResult:
    """What one adapter call produced. Adapters return it; they never raise out."""

    provider: str
    model: str
    mode: Mode
    status: Status
    output: str = ""
    data: Any = None
    usage: Usage = field(default_factory=Usage)
    latency_ms: float = 0.0
    error: ErrorInfo | None = None
    finish_reason: str | None = None
    retries: int = 0
    upstream_requests: int = 0  # requests the upstream actually saw for this attempt

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_dict(self) -> dict[str, Any]:
        return {
            "provider": self.provider,
            "model": self.model,
            "mode": self.mode,
            "status": self.status,
            "output": self.output,
            "data": self.data,
            "usage": self.usage.to_dict(),
            "latency_ms": round(self.latency_ms, 3),
            "error": self.error.to_dict() if self.error else None,
        }


@dataclass(frozen=True, slots=True)
class AttemptRecord:
    """One candidate considered by the router: skipped, failed or served."""

    index: int
    provider: str
    model: str
    outcome: Outcome
    reason: str | None = None  # skip reason or error category
    error_category: str | None = None
    http_status: int | None = None
    transient: bool = False
    retries: int = 0
    latency_ms: float = 0.0
    served: bool = False
    partial: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "provider": self.provider,
            "model": self.model,
            "outcome": self.outcome,
            "error_category": self.error_category,
            "http_status": self.http_status,
            "transient": self.transient,
            "retries": self.retries,
            "latency_ms": round(self.latency_ms, 3),
        }


@dataclass(frozen=True, slots=True)
class RoutingMetadata:
    request_id: str
    router_mode: RouterMode
    route: str | None
    rule: str | None
    chain_name: str | None
    requested_provider: str | None
    selected_provider: str | None
    chain: tuple[str, ...]
    attempts: tuple[AttemptRecord, ...]
    fallback_used: bool
    fallback_reason: str | None

    @property
    def attempted_providers(self) -> list[str]:
        return [a.provider for a in self.attempts if a.outcome != "skipped"]

    @property
    def skipped_providers(self) -> list[dict[str, str | None]]:
        return [
            {"provider": a.provider, "reason": a.reason}
            for a in self.attempts
            if a.outcome == "skipped"
        ]

    def to_dict(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "router_mode": self.router_mode,
            "route": self.route,
            "rule": self.rule,
            "chain_name": self.chain_name,
            "requested_provider": self.requested_provider,
            "selected_provider": self.selected_provider,
            "chain": list(self.chain),
            "attempted_providers": self.attempted_providers,
            "skipped_providers": self.skipped_providers,
            "attempts": [a.to_dict() for a in self.attempts if a.outcome != "skipped"],
            "fallback_used": self.fallback_used,
            "fallback_reason": self.fallback_reason,
        }


@dataclass(frozen=True, slots=True)
class RoutingResult:
    """The router's answer: the served (or error) result plus its metadata."""

    request_id: str
    result: ProviderResult
    metadata: RoutingMetadata
    total_latency_ms: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        meta = self.metadata.to_dict()
        return {
            "request_id": self.request_id,
            "result": self.result.to_dict(),
            "routing_metadata": meta,
            "diagnostics": dict(meta),
        }


@dataclass(frozen=True, slots=True)
class StreamChunk:
    """Text handed to the caller (after the commit point it is never replayed)."""

    text: str
    provider: str = ""
    model: str = ""


@dataclass(frozen=True, slots=True)
class StreamResult:
    """The stream's clean end: the complete envelope (or a pre-commit error result)."""

    routed: RoutingResult


@dataclass(frozen=True, slots=True)
class StreamFailure:
    """A failure after text was delivered: the stream ends with this, never cleanly."""

    error: ErrorInfo
    partial: bool
    routed: RoutingResult


RouterStreamEvent = StreamChunk | StreamResult | StreamFailure
