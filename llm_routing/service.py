"""The Python API behind ``llm_routing.audit``, ``llm_routing.chat`` and
``llm_routing.embed`` (and their async twins ``aaudit``, ``achat`` and ``aembed``) —
shared by the HTTP views and tasks."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any, Literal, overload

from django.core.exceptions import ValidationError

from . import snapshot
from .logging import bound_request_id
from .router import aroute, aroute_stream, route, route_stream
from .types import AuditRequest, ForcedTool, Message, RouterStreamEvent, RoutingResult, Tool

__all__ = [
    "aaudit",
    "achat",
    "aembed",
    "aexecute",
    "audit",
    "build_request",
    "chat",
    "embed",
    "execute",
]


def _messages_of(detail: Any, prefix: str) -> dict[str, list[str]]:
    """DRF's nested error detail as ``{"messages.2.tool_call_id": ["…"]}``."""
    if isinstance(detail, Mapping):
        out: dict[str, list[str]] = {}
        for key, value in detail.items():
            name = str(key) if key != "non_field_errors" else ""
            out.update(_messages_of(value, f"{prefix}.{name}".strip(".") if name else prefix))
        return out
    if isinstance(detail, list) and detail and not isinstance(detail[0], str | Mapping | list):
        detail = [str(e) for e in detail]
    if isinstance(detail, list) and any(isinstance(e, Mapping | list) for e in detail):
        out = {}
        for index, item in enumerate(detail):
            out.update(_messages_of(item, f"{prefix}.{index}"))
        return out
    return {
        prefix or "__all__": [str(e) for e in (detail if isinstance(detail, list) else [detail])]
    }


def _validated(serializer_class: type, data: Mapping[str, Any]) -> AuditRequest:
    serializer = serializer_class(data=dict(data))
    if not serializer.is_valid():
        raise ValidationError(_messages_of(serializer.errors, ""))
    request: AuditRequest = serializer.to_request()
    return request


def build_request(**kwargs: Any) -> AuditRequest:
    """Validate keyword arguments exactly as ``POST /audit/`` validates its body."""
    from .api.serializers import AuditRequestSerializer

    return _validated(AuditRequestSerializer, kwargs)


def _check_chain(request: AuditRequest, config: snapshot.ConfigSnapshot | None = None) -> None:
    """A chain named by the caller must exist (the router would otherwise fall back to
    the default chain): ``ValidationError`` naming ``chain``, before anything routes."""
    if request.chain and (message := snapshot.unknown_chain(request.chain, config)):
        raise ValidationError({"chain": [message]})


def execute(
    request: AuditRequest, *, request_id: str | None = None, persist: bool = True
) -> RoutingResult:
    """Route one already-validated request: the single entry point of the HTTP view,
    the Python API and the Celery task. ``persist=False`` leaves the recording to the
    caller (async jobs record the decision in the transaction that finishes the job).
    A chain that does not exist raises ``ValidationError`` naming ``chain``."""
    _check_chain(request)
    request_id = request_id or str(uuid.uuid4())
    with bound_request_id(request_id):  # its log lines carry the routing request id
        return route(request, request_id=request_id, persist=persist)


async def aexecute(
    request: AuditRequest, *, request_id: str | None = None, persist: bool = True
) -> RoutingResult:
    """:func:`execute` on the event loop (the async driver of the router)."""
    if request.chain:
        _check_chain(request, await snapshot.acurrent())
    request_id = request_id or str(uuid.uuid4())
    with bound_request_id(request_id):  # its log lines carry the routing request id
        return await aroute(request, request_id=request_id, persist=persist)


def audit(**kwargs: Any) -> RoutingResult:
    """Route one request; keyword arguments mirror the fields of ``POST /audit/``.

    Required: ``task`` and ``input_text``. Optional: ``instructions``, ``provider``,
    ``route``, ``force_provider``, ``response_schema``, ``metadata``. Inputs are
    validated exactly as the HTTP API validates them; bad input raises
    ``django.core.exceptions.ValidationError`` naming the field.
    """
    return execute(build_request(**kwargs))


def build_chat_request(
    messages: Sequence[Mapping[str, Any] | Message],
    *,
    tools: Sequence[Mapping[str, Any] | Tool] = (),
    chain: str | None = None,
    stream: bool = False,
    **params: Any,
) -> AuditRequest:
    """Validate :func:`chat`'s arguments exactly as the HTTP API validates a body."""
    from .api.serializers import ChatCallSerializer

    data: dict[str, Any] = dict(params)
    data["messages"] = [m.to_dict() if isinstance(m, Message) else m for m in messages]
    if tools:
        data["tools"] = [t.to_dict() if isinstance(t, Tool) else t for t in tools]
    if isinstance(data.get("tool_choice"), ForcedTool):
        data["tool_choice"] = {"type": "function", "function": {"name": data["tool_choice"].name}}
    if chain is not None:
        data["chain"] = chain
    data["stream"] = stream
    return _validated(ChatCallSerializer, data)


@overload
def chat(
    messages: Sequence[Mapping[str, Any] | Message],
    *,
    tools: Sequence[Mapping[str, Any] | Tool] = ...,
    chain: str | None = ...,
    stream: Literal[False] = ...,
    **params: Any,
) -> RoutingResult: ...


@overload
def chat(
    messages: Sequence[Mapping[str, Any] | Message],
    *,
    tools: Sequence[Mapping[str, Any] | Tool] = ...,
    chain: str | None = ...,
    stream: Literal[True],
    **params: Any,
) -> Iterator[RouterStreamEvent]: ...


@overload
def chat(
    messages: Sequence[Mapping[str, Any] | Message],
    *,
    tools: Sequence[Mapping[str, Any] | Tool] = ...,
    chain: str | None = ...,
    stream: bool,
    **params: Any,
) -> RoutingResult | Iterator[RouterStreamEvent]: ...


def chat(
    messages: Sequence[Mapping[str, Any] | Message],
    *,
    tools: Sequence[Mapping[str, Any] | Tool] = (),
    chain: str | None = None,
    stream: bool = False,
    **params: Any,
) -> RoutingResult | Iterator[RouterStreamEvent]:
    """Route one conversation through a chain, like ``POST /v1/chat/completions``.

    ``messages`` and ``tools`` are OpenAI-shaped dicts (or :class:`~llm_routing.types.Message`
    / :class:`~llm_routing.types.Tool` objects); ``chain`` names a Chain (else routing
    rules and the default chain decide). ``params``: ``tool_choice``, ``temperature``,
    ``top_p``, ``max_tokens``, ``seed``, ``stop``, ``user``, ``response_schema``,
    ``task`` (default ``"chat"``), ``provider``, ``route``, ``force_provider``,
    ``metadata``, ``instructions``, ``backstop`` (default True: like :func:`audit`, an
    exhausted chain is answered by the mock; False makes it an error result).

    Returns the :class:`~llm_routing.types.RoutingResult` (``result.tool_calls`` holds
    the calls), or with ``stream=True`` an iterator of ``StreamChunk`` … ending in one
    ``StreamResult`` or ``StreamFailure``. Bad input raises
    ``django.core.exceptions.ValidationError`` naming the field
    (``messages.1.tool_call_id``).
    """
    request = build_chat_request(messages, tools=tools, chain=chain, stream=stream, **params)
    if stream:
        _check_chain(request)
        return route_stream(request)
    return execute(request)


async def aaudit(**kwargs: Any) -> RoutingResult:
    """:func:`audit` as a coroutine, for async views and tasks: the same arguments,
    validation and result; the provider calls never block the event loop."""
    return await aexecute(build_request(**kwargs))


@overload
async def achat(
    messages: Sequence[Mapping[str, Any] | Message],
    *,
    tools: Sequence[Mapping[str, Any] | Tool] = ...,
    chain: str | None = ...,
    stream: Literal[False] = ...,
    **params: Any,
) -> RoutingResult: ...


@overload
async def achat(
    messages: Sequence[Mapping[str, Any] | Message],
    *,
    tools: Sequence[Mapping[str, Any] | Tool] = ...,
    chain: str | None = ...,
    stream: Literal[True],
    **params: Any,
) -> AsyncIterator[RouterStreamEvent]: ...


@overload
async def achat(
    messages: Sequence[Mapping[str, Any] | Message],
    *,
    tools: Sequence[Mapping[str, Any] | Tool] = ...,
    chain: str | None = ...,
    stream: bool,
    **params: Any,
) -> RoutingResult | AsyncIterator[RouterStreamEvent]: ...


async def achat(
    messages: Sequence[Mapping[str, Any] | Message],
    *,
    tools: Sequence[Mapping[str, Any] | Tool] = (),
    chain: str | None = None,
    stream: bool = False,
    **params: Any,
) -> RoutingResult | AsyncIterator[RouterStreamEvent]:
    """:func:`chat` as a coroutine: the same arguments and validation. Returns the
    :class:`~llm_routing.types.RoutingResult`, or with ``stream=True`` an async iterator
    of ``StreamChunk`` … ending in one ``StreamResult`` or ``StreamFailure``
    (``async for event in await achat(..., stream=True)``; close it early with
    ``aclose()`` and the decision records ``client_disconnected``)."""
    await snapshot.acurrent()  # fresh: the chain check reads it with no I/O
    request = build_chat_request(messages, tools=tools, chain=chain, stream=stream, **params)
    if stream:
        _check_chain(request, snapshot.latest())
        return aroute_stream(request)
    return await aexecute(request)


def build_embed_request(
    input: str | Sequence[str] | Sequence[int] | Sequence[Sequence[int]], **params: Any
) -> AuditRequest:
    """Validate :func:`embed`'s arguments exactly as ``POST /v1/embeddings`` validates
    its ``input``, ``dimensions`` and ``user``."""
    from .api.embeddings_serializers import EmbedCallSerializer

    data: dict[str, Any] = dict(params)
    data["input"] = (
        input
        if isinstance(input, str)
        else [x if isinstance(x, str | int) else list(x) for x in input]
    )
    return _validated(EmbedCallSerializer, data)


def embed(
    input: str | Sequence[str] | Sequence[int] | Sequence[Sequence[int]], **params: Any
) -> RoutingResult:
    """Embed ``input`` through a chain, like ``POST /v1/embeddings``: a text, a list of
    texts, a token array or a list of token arrays. ``params``: ``chain``, ``provider``,
    ``route``, ``force_provider``, ``dimensions``, ``user``, ``task`` (default
    ``"embeddings"``), ``metadata``, ``backstop`` (default True: an exhausted chain is
    answered by the mock's deterministic vectors; False makes it an error result).

    Returns the :class:`~llm_routing.types.RoutingResult`: ``result.vectors`` holds one
    vector (a sequence of floats) per input, in order. Bad input raises
    ``django.core.exceptions.ValidationError`` naming the field."""
    return execute(build_embed_request(input, **params))


async def aembed(
    input: str | Sequence[str] | Sequence[int] | Sequence[Sequence[int]], **params: Any
) -> RoutingResult:
    """:func:`embed` as a coroutine: the same arguments, validation and result."""
    await snapshot.acurrent()  # fresh: the chain check reads it with no I/O
    return await aexecute(build_embed_request(input, **params))
