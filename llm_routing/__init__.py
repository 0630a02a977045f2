"""django-llm-routing: resilient LLM provider routing for Django.

``from llm_routing import audit, chat`` is the Python API; the HTTP views and the Celery
task call the same functions.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, overload

from .version import __version__

if TYPE_CHECKING:
    from .types import Message, RouterStreamEvent, RoutingResult, Tool

__all__ = ["__version__", "audit", "chat"]


def audit(**kwargs: Any) -> RoutingResult:
    """Route one request; keyword arguments mirror the fields of ``POST /audit/``.

    Required: ``task`` and ``input_text``. Optional: ``instructions``, ``provider``,
    ``route``, ``force_provider``, ``response_schema``, ``metadata``. Inputs are
    validated exactly as the HTTP API validates them; bad input raises
    ``django.core.exceptions.ValidationError`` naming the field.
    """
    from .service import audit as _audit

    return _audit(**kwargs)


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
    from .service import chat as _chat

    return _chat(messages, tools=tools, chain=chain, stream=stream, **params)
