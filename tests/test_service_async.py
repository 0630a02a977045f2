"""The async Python API: ``llm_routing.aaudit`` and ``llm_routing.achat`` take the same
arguments as ``audit``/``chat``, validate the same way and return the same results; a
stream is an async iterator, and closing it early records ``client_disconnected``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
from asgiref.sync import async_to_sync
from django.core.exceptions import ValidationError

import llm_routing
from llm_routing import service
from llm_routing.errors import NetworkError
from llm_routing.models import RoutingDecision
from llm_routing.types import RoutingResult, StreamChunk, StreamResult

from .conftest import make_chain, make_provider

# The async API routes in worker threads (their own connections): rows must be committed.
pytestmark = pytest.mark.django_db(transaction=True)

T = TypeVar("T")
MESSAGES = [{"role": "user", "content": "Hi"}]


def run(make: Callable[[], Awaitable[T]]) -> T:
    async def call() -> T:
        return await make()

    return async_to_sync(call)()


@pytest.fixture
def chain(scripted: Any, key_env: str) -> Any:
    make_chain(
        "main",
        [
            make_provider("a", supports_streaming=True, max_retries=0),
            make_provider("b", supports_streaming=True),
        ],
        is_default=True,
    )
    return scripted


def test_exported_lazily_from_the_package() -> None:
    assert llm_routing.aaudit is service.aaudit and llm_routing.achat is service.achat
    assert {"aaudit", "achat"} <= set(llm_routing.__all__)


def test_aaudit_returns_what_audit_returns(chain: Any) -> None:
    routed = run(lambda: llm_routing.aaudit(task="summarize", input_text="Some text."))
    assert isinstance(routed, RoutingResult)
    assert routed.result.provider == "a" and routed.result.output == "answer from a"
    same = llm_routing.audit(task="summarize", input_text="Some text.")
    assert set(routed.to_dict()) == set(same.to_dict())
    assert RoutingDecision.objects.filter(request_id=routed.request_id).exists()


def test_aaudit_fails_over(chain: Any) -> None:
    chain.scripts["a"] = [NetworkError("refused")]
    routed = run(lambda: llm_routing.aaudit(task="summarize", input_text="Some text."))
    assert routed.result.provider == "b"
    assert routed.metadata.fallback_used and routed.metadata.fallback_reason == "network"


def test_bad_input_raises_the_same_validation_error() -> None:
    with pytest.raises(ValidationError) as sync_error:
        llm_routing.audit(task="summarize")
    with pytest.raises(ValidationError) as async_error:
        run(lambda: llm_routing.aaudit(task="summarize"))
    assert async_error.value.message_dict == sync_error.value.message_dict
    assert "input_text" in async_error.value.message_dict
    with pytest.raises(ValidationError) as chat_error:
        run(lambda: llm_routing.achat([{"role": "tool", "content": "x"}]))
    assert "messages.0.tool_call_id" in chat_error.value.message_dict
    assert RoutingDecision.objects.count() == 0


def test_achat_non_stream(chain: Any) -> None:
    routed = run(lambda: llm_routing.achat(MESSAGES, chain="main", temperature=0.2))
    assert isinstance(routed, RoutingResult)
    assert routed.metadata.chain_name == "main" and routed.result.provider == "a"


def test_achat_stream_is_an_async_iterator_of_router_events(chain: Any) -> None:
    chain.streams["a"] = [["Hel", "lo", "END"]]

    async def collect() -> list[Any]:
        events = await llm_routing.achat(MESSAGES, chain="main", stream=True)
        return [event async for event in events]

    events = run(collect)
    assert [e.text for e in events if isinstance(e, StreamChunk)] == ["Hel", "lo"]
    assert isinstance(events[-1], StreamResult)
    assert events[-1].routed.result.output == "Hello"
    assert RoutingDecision.objects.filter(request_id=events[-1].routed.request_id).exists()


def test_closing_the_stream_early_records_client_disconnected(chain: Any) -> None:
    chain.streams["a"] = [["one", " two", " three", "END"]]

    async def first_then_close() -> str:
        events = await llm_routing.achat(MESSAGES, chain="main", stream=True)
        first = await anext(aiter(events))
        await events.aclose()  # type: ignore[attr-defined]
        assert isinstance(first, StreamChunk)
        return first.text

    assert run(first_then_close) == "one"
    attempt = RoutingDecision.objects.get().attempts.get()
    assert attempt.error_category == "client_disconnected" and attempt.partial is True
