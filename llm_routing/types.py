"""Frozen value types shared by the router, the adapters, the recorder and the API.

Nothing here touches the database or the network. ``to_dict()`` methods produce
exactly the JSON shapes of ``POST /audit/`` (docs/api.md).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from .failure_policy import policy_for

__all__ = [
    "CAPABILITIES",
    "MOCK_PROVIDER_NAME",
    "SKIP_REASONS",
    "AttemptRecord",
    "AuditRequest",
    "Call",
    "ContentPart",
    "EmbeddingInput",
    "ErrorInfo",
    "ForcedTool",
    "Message",
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
    "StreamToolCallDelta",
    "Tool",
    "ToolCall",
    "ToolCallDelta",
    "ToolChoice",
    "Usage",
    "assemble_tool_calls",
]

MOCK_PROVIDER_NAME = "mock"

Mode = Literal["live", "mock", "disabled", "error"]
Status = Literal["ok", "fallback", "error"]
Outcome = Literal["ok", "error", "skipped", "hedge_lost", "hedge_skipped"]
RouterMode = Literal["explicit", "chain", "default", "rule", "forced"]
Role = Literal["system", "developer", "user", "assistant", "tool"]

#: Every reason the availability decision (``availability.may_try``) can give for
#: skipping a candidate, in the order it checks them; the metrics bound their label to it.
SKIP_REASONS = (
    "not_allowed",
    "unknown_provider",
    "disabled",
    "drained",
    "missing_key",
    "unsupported",
    "context_too_small",
    "dimension_mismatch",
    "budget_exhausted",
    "circuit_open",
)

#: What an adapter kind can declare (a provider row may override each one).
CAPABILITIES = (
    "streaming",
    "structured_output",
    "tools",
    "images",
    "prefill",
    "embeddings",
    "token_inputs",  # embeddings of token arrays, not only of texts
)

#: What a request asks of its candidates: a chat answer, or embedding vectors.
Call = Literal["chat", "embed"]
#: One input of an embeddings request: a text, or a list of token ids.
EmbeddingInput = str | tuple[int, ...]


# --- the chat request model ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ContentPart:
    """One part of a message's content: ``text``, or ``image_url`` (an http(s) or
    ``data:`` URL) for providers that take images."""

    type: Literal["text", "image_url"]
    text: str = ""
    image_url: str = ""
    detail: str | None = None  # OpenAI's image ``detail`` (auto / low / high)

    def to_dict(self) -> dict[str, Any]:
        if self.type == "text":
            return {"type": "text", "text": self.text}
        image: dict[str, Any] = {"url": self.image_url}
        if self.detail is not None:
            image["detail"] = self.detail
        return {"type": "image_url", "image_url": image}


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A complete tool call of an assistant turn, normalized across vendors:
    ``arguments`` is always a JSON text (OpenAI's convention)."""

    id: str
    name: str
    arguments: str = "{}"

    def to_dict(self) -> dict[str, Any]:
        """OpenAI's shape (``message.tool_calls[i]``), also used in ``/audit/``."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(frozen=True, slots=True)
class Message:
    """One turn of a conversation.

    ``content`` is a string or a tuple of parts; an assistant turn may carry
    ``tool_calls`` (its content may then be empty); a ``tool`` turn answers the call
    named by ``tool_call_id`` (``name`` is the tool's name when known — Gemini needs it).
    """

    role: Role
    content: str | tuple[ContentPart, ...] = ""
    name: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None

    @property
    def text(self) -> str:
        """The text of the content (text parts joined; images left out)."""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content if p.type == "text")

    @property
    def has_images(self) -> bool:
        return not isinstance(self.content, str) and any(
            p.type == "image_url" for p in self.content
        )

    def to_dict(self) -> dict[str, Any]:
        """OpenAI's chat message shape (the canonical form, hashed for the record)."""
        out: dict[str, Any] = {"role": self.role}
        out["content"] = (
            self.content if isinstance(self.content, str) else [p.to_dict() for p in self.content]
        )
        if self.name is not None:
            out["name"] = self.name
        if self.tool_calls:
            out["tool_calls"] = [c.to_dict() for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out


@dataclass(frozen=True, slots=True)
class Tool:
    """A function the model may call; ``parameters`` is its JSON Schema."""

    name: str
    description: str = ""
    parameters: Mapping[str, Any] = field(default_factory=dict)
    strict: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        """OpenAI's ``tools[i]`` shape."""
        function: dict[str, Any] = {"name": self.name, "parameters": dict(self.parameters)}
        if self.description:
            function["description"] = self.description
        if self.strict is not None:
            function["strict"] = self.strict
        return {"type": "function", "function": function}


@dataclass(frozen=True, slots=True)
class ForcedTool:
    """``tool_choice`` naming one function the model must call."""

    name: str


#: ``"auto"`` / ``"none"`` / ``"required"``, or one named function.
ToolChoice = Literal["auto", "none", "required"] | ForcedTool


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
    """One well-formed routing request (already validated by the API or caller).

    Either the one-shot form (``instructions`` + ``input_text``) or a conversation
    (``messages``; ``instructions``, when also given, becomes a leading system turn).
    Adapters read :attr:`conversation`, never ``input_text`` directly.
    """

    task: str
    input_text: str = ""
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
    # The chat request model: a conversation, tools and sampling parameters.
    messages: tuple[Message, ...] = ()
    tools: tuple[Tool, ...] = ()
    tool_choice: ToolChoice | None = None
    stop: tuple[str, ...] = ()
    top_p: float | None = None
    seed: int | None = None
    user: str | None = None  # the end user's opaque id, passed to vendors that take one
    # Prompt-cache affinity (docs/strategies.md): requests with the same key return to
    # the candidate of a step that served the key last. Only its hash is stored.
    affinity: str | None = None
    # The caller's identity for the access rules (docs/operations.md); None: a trusted
    # caller (the Python API, management commands) that may route anywhere.
    principal: Principal | None = None
    # Whether the built-in mock backstop ends the chain. ``POST /audit/`` and the Python
    # API keep it (their documented contract); ``/v1`` sets False so an exhausted chain
    # is an error rather than a fake answer, unless the chain opts in (mock_backstop).
    backstop: bool = True
    # Embeddings (``call="embed"``): the inputs (texts or token arrays, one vector
    # each), the ``dimensions`` the client asked for (sent upstream), and the dimension
    # the walk holds every candidate's vectors to (the asked one, else the first
    # candidate's declared one: :func:`llm_routing.availability.target_dimension`;
    # set by the walk, never sent upstream; the mock answers it).
    call: Call = "chat"
    inputs: tuple[EmbeddingInput, ...] = ()
    dimensions: int | None = None
    expected_dimensions: int | None = None

    @property
    def conversation(self) -> tuple[Message, ...]:
        """The turns sent upstream: ``instructions`` as a system turn, then
        ``messages``, or the one-shot ``input_text`` as one user turn."""
        head: tuple[Message, ...] = (
            (Message(role="system", content=self.instructions),) if self.instructions else ()
        )
        if self.messages:
            return head + self.messages
        return (*head, Message(role="user", content=self.input_text))

    @property
    def required_capabilities(self) -> frozenset[str]:
        """What a provider must support to serve this request."""
        if self.call == "embed":
            if all(isinstance(x, str) for x in self.inputs):
                return frozenset({"embeddings"})
            return frozenset({"embeddings", "token_inputs"})
        needed: set[str] = set()
        if self.stream:
            needed.add("streaming")
        if self.response_schema is not None:
            needed.add("structured_output")
        if self.tools or any(m.tool_calls or m.role == "tool" for m in self.messages):
            needed.add("tools")
        if any(m.has_images for m in self.messages):
            needed.add("images")
        return frozenset(needed)

    def _canonical_input(self) -> str:
        if self.call == "embed":  # the inputs as a JSON list (token arrays as lists)
            return json.dumps(
                [x if isinstance(x, str) else list(x) for x in self.inputs],
                ensure_ascii=False,
                separators=(",", ":"),
            )
        if not self.messages:
            return self.input_text
        return json.dumps(
            [m.to_dict() for m in self.messages],
            ensure_ascii=False,
            sort_keys=True,
            separators=(",", ":"),
        )

    @property
    def input_length(self) -> int:
        """Characters of the input: ``input_text``, or the canonical JSON of the whole
        conversation (roles, content, tool calls) when ``messages`` are given."""
        return len(self._canonical_input())

    @property
    def input_sha256(self) -> str:
        """SHA-256 of the canonical input's UTF-8 bytes. Defined for every ``str``: a
        lone surrogate (which no valid UTF-8 holds, and which the input boundary may
        refuse) is hashed as its three-byte form (``surrogatepass``), so the hash never
        raises after an upstream was called and the record is never lost to it. For
        valid text the bytes, and so the hash, are plain UTF-8's."""
        return hashlib.sha256(self._canonical_input().encode("utf-8", "surrogatepass")).hexdigest()


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
    # None: inherit what the adapter kind declares; True/False: the row's override.
    supports_structured_output: bool | None = None
    supports_streaming: bool | None = None
    supports_prefill: bool | None = None
    supports_tools: bool | None = None
    supports_images: bool | None = None
    supports_embeddings: bool | None = None
    # The length of the vectors this row answers (None: not declared).
    embedding_dimensions: int | None = None
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
class ToolCallDelta:
    """A fragment of a streamed tool call, in OpenAI's ``delta.tool_calls[i]`` terms:
    the first fragment of call ``index`` carries its ``id`` and ``name``; later ones
    carry pieces of ``arguments`` (JSON text) to append."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"index": self.index}
        if self.id is not None:
            out["id"] = self.id
            out["type"] = "function"
        function: dict[str, Any] = {"arguments": self.arguments}
        if self.name is not None:
            function = {"name": self.name, **function}
        out["function"] = function
        return out


def assemble_tool_calls(deltas: Iterable[ToolCallDelta]) -> tuple[ToolCall, ...]:
    """Whole tool calls from streamed fragments, in ``index`` order: a fragment's id or
    name (when it carries one) sets the call's, its arguments are appended; a call sent
    without arguments gets ``{}``."""
    calls: dict[int, list[str]] = {}
    for delta in deltas:
        call = calls.setdefault(delta.index, ["", "", ""])
        call[0] = delta.id or call[0]
        call[1] = delta.name or call[1]
        call[2] += delta.arguments
    return tuple(
        ToolCall(id=call_id, name=name, arguments=arguments or "{}")
        for _, (call_id, name, arguments) in sorted(calls.items())
    )


@dataclass(frozen=True, slots=True)
class StreamToolCallDelta:
    """A tool-call fragment from a streaming adapter (a commit point like text)."""

    delta: ToolCallDelta


@dataclass(frozen=True, slots=True)
class StreamEnd:
    """The clean end of a stream (finish reason seen and the body closed).

    ``tool_calls`` are the stream's tool calls, assembled and complete: a stream cut
    before its end has no StreamEnd, so a half tool call is never presented."""

    finish_reason: str | None = None
    usage: Usage | None = None
    model: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()


StreamEvent = StreamDelta | StreamToolCallDelta | StreamEnd


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    """A safe, key-free description of why a provider did not answer.

    It carries the failure policy, read by the walk (``advances``) and the breaker
    (``counts``, ``observed``), never re-derived there: an error made by
    :meth:`llm_routing.errors.ProviderError.to_info` takes its class's (the table's,
    or what the instance tightened); one built directly (a skip, a test) gets
    :func:`llm_routing.failure_policy.policy_for` of its category."""

    category: str
    message: str
    http_status: int | None = None
    transient: bool = False
    retry_after_s: float | None = None  # the provider's Retry-After; not in to_dict()
    #: The walk moves on to the next candidate (else it stops with this error).
    advances: bool | None = None
    #: The failure counts toward opening the provider's circuit.
    counts: bool | None = None
    #: The failure is fed to the circuit at all (False: it says nothing of the
    #: provider's health: the request deadline ran out, the client went away).
    observed: bool | None = None

    def __post_init__(self) -> None:
        policy = policy_for(self.category, transient=self.transient)
        for name in ("advances", "counts", "observed"):
            if getattr(self, name) is None:
                object.__setattr__(self, name, getattr(policy, name))

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
    tool_calls: tuple[ToolCall, ...] = ()
    # An embeddings answer: one vector (a sequence of floats) per input, in order. Not
    # in to_dict(); never scrubbed (numbers carry no key).
    vectors: tuple[Sequence[float], ...] = ()

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
            "tool_calls": [c.to_dict() for c in self.tool_calls],
            "finish_reason": self.finish_reason,
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
    # Tokens the upstream reported for this attempt (a failed one too); None when none
    # reached the router. A served stream's usage arrives later: the result's usage.
    usage: Usage | None = None
    step: int | None = None  # the chain step it belonged to (0 first); None: forced

    def to_dict(self) -> dict[str, Any]:
        return {
            "provider": self.provider,
            "model": self.model,
            "step": self.step,
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
    # Per step of several candidates that the walk reached: how its strategy ordered
    # them (llm_routing.strategies.Pick.to_dict()).
    picks: tuple[Mapping[str, Any], ...] = ()
    # Hedging (docs/strategies.md): won, lost, failed or skipped; None: no hedge was due.
    hedge: str | None = None

    @property
    def attempted_providers(self) -> list[str]:
        return [a.provider for a in self.attempts if a.outcome not in ("skipped", "hedge_skipped")]

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
            "picks": [dict(p) for p in self.picks],
            "hedge": self.hedge,
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
    """Text (or a tool-call fragment) handed to the caller; after the commit point it
    is never replayed."""

    text: str
    provider: str = ""
    model: str = ""
    tool_call: ToolCallDelta | None = None


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
