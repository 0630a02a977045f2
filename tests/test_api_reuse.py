"""``llm_routing.api.reuse.reused``: one request serializer per class and thread, handed
out with fresh data and nothing of the previous request."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from rest_framework.exceptions import ValidationError

from llm_routing.api.openai_compat import ChatCompletionRequestSerializer
from llm_routing.api.reuse import reused
from llm_routing.api.serializers import AuditRequestSerializer

MESSAGES = [{"role": "user", "content": "Say hello."}]
TOOL = {
    "type": "function",
    "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}},
}


def _validated(cls: type, data: Any) -> tuple[int, dict[str, Any]]:
    with reused(cls, data) as serializer:
        serializer.is_valid(raise_exception=True)
        return id(serializer), dict(serializer.validated_data)


def test_one_instance_per_thread_with_nothing_left_from_the_last_request() -> None:
    first_id, first = _validated(
        ChatCompletionRequestSerializer, {"model": "m", "messages": MESSAGES, "tools": [TOOL]}
    )
    second_id, second = _validated(
        ChatCompletionRequestSerializer, {"model": "other", "messages": MESSAGES}
    )
    assert first_id == second_id  # reused, not rebuilt
    assert first["model"] == "m" and first["tools"]
    assert second["model"] == "other" and "tools" not in second


def test_a_refused_body_leaves_the_next_one_unaffected() -> None:
    with pytest.raises(ValidationError) as refused:
        _validated(ChatCompletionRequestSerializer, {"model": "m", "messages": [], "n": 2})
    assert {"messages", "n"} & set(refused.value.detail)  # type: ignore[arg-type]
    _, ok = _validated(ChatCompletionRequestSerializer, {"model": "m", "messages": MESSAGES})
    assert ok["model"] == "m"
    with reused(ChatCompletionRequestSerializer, {"model": "m", "messages": MESSAGES}) as s:
        assert s.is_valid() and not s.errors


def test_nested_use_and_other_threads_get_their_own_instance() -> None:
    body = {"task": "summarize", "input_text": "x"}
    with reused(AuditRequestSerializer, body) as outer:
        with reused(AuditRequestSerializer, {**body, "input_text": "y"}) as inner:
            assert outer is not inner
            assert inner.is_valid() and inner.validated_data["input_text"] == "y"
        assert outer.is_valid() and outer.validated_data["input_text"] == "x"
    seen: list[Any] = []  # the objects themselves: an id may be reused once freed

    def other() -> None:
        with reused(AuditRequestSerializer, body) as serializer:
            seen.append(serializer)

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    with reused(AuditRequestSerializer, body) as mine:
        assert seen and seen[0] is not mine
