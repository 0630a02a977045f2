"""Upstream-reported usage is bounded where it enters (``llm_routing.providers.usage``):
a fake upstream reporting 10**30 tokens is counted as ``MAX_REPORTED_TOKENS`` per count,
with a warning naming neither key nor prompt, so it cannot lock a tokens budget above
that bound. Over real HTTP to the fake upstream (tests/fakes/upstream.py), stream and
not, on a budgeted user."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import pytest
from django.test import override_settings

from llm_routing import budgets
from llm_routing.models import Budget, RoutingDecision
from tests.fakes.upstream import FakeUpstream, Faults

pytestmark = pytest.mark.django_db

KEY = "sk-usage-bound-0123456789abcdef"
AUDIT = {"task": "summarize", "input_text": "Django is a web framework."}
ABSURD = 10**30
BOUND = 1_000  # MAX_REPORTED_TOKENS in these tests: a user budget of 12,000 stays open


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_PROVIDER_KEY", KEY)


@pytest.fixture
def openai_chain(fake_upstream: FakeUpstream, upstream_chain: Callable[..., list[Any]]) -> Any:
    return upstream_chain(("oa", "openai", {"supports_streaming": True, "max_retries": 0}))[0]


def absurd_answer() -> dict[str, Any]:
    """OpenAI's whole answer, reporting 10**30 prompt and completion tokens."""
    return {
        "id": "chatcmpl-absurd",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": "gpt-4o-mini",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "short answer", "refusal": None},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": ABSURD, "completion_tokens": ABSURD, "total_tokens": ABSURD},
    }


def tokens_used(name: str) -> int:
    return budgets.usage([Budget.objects.get(name=name)])[name].tokens


def post(api: Any, stream: bool) -> tuple[int, dict[str, Any]]:
    """The status and the envelope (a stream's ``result`` event)."""
    answer = api.post(
        "/audit/", data=json.dumps({**AUDIT, "stream": stream}), content_type="application/json"
    )
    if not stream:
        return answer.status_code, answer.json()
    body = b"".join(answer.streaming_content).decode()
    answer.close()
    result = body.split("event: result\ndata: ", 1)[1].split("\n\n", 1)[0]
    return answer.status_code, json.loads(result)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_absurd_reported_usage_is_bounded_and_leaves_the_budget_open(
    api: Any,
    openai_chain: Any,
    fake_upstream: FakeUpstream,
    caplog: pytest.LogCaptureFixture,
    stream: bool,
) -> None:
    Budget.objects.create(name="tok", scope="user", subject="alice", max_tokens=12_000,
                          window="day")  # fmt: skip
    lying = (
        Faults.stream(text="one two three", usage=(ABSURD, ABSURD))
        if stream
        else Faults.ok(body=absurd_answer())
    )
    fake_upstream.script("openai", lying)
    with (
        override_settings(LLM_ROUTING={"MAX_REPORTED_TOKENS": BOUND}),
        caplog.at_level(logging.WARNING, logger="llm_routing.providers"),
    ):
        status, envelope = post(api, stream)
        assert status == 200
        assert envelope["result"]["usage"] == {"input_tokens": BOUND, "output_tokens": BOUND}
        assert tokens_used("tok") == 2 * BOUND  # both counts, each at the bound
        status, _ = post(api, stream)  # the budget is not locked: served again
        assert status == 200 and RoutingDecision.objects.count() == 2
    warnings = [r.getMessage() for r in caplog.records if r.name == "llm_routing.providers"]
    assert warnings and all("MAX_REPORTED_TOKENS" in w for w in warnings), warnings
    logged = caplog.text
    assert KEY not in logged and AUDIT["input_text"] not in logged and str(ABSURD) not in logged


def test_the_default_bound_is_ten_million_per_count(
    api: Any, openai_chain: Any, fake_upstream: FakeUpstream
) -> None:
    """Without the setting: a global budget of a billion tokens a day is not locked."""
    Budget.objects.create(name="all", scope="global", max_tokens=10**9, window="day")
    fake_upstream.script("openai", Faults.ok(body=absurd_answer()))
    assert post(api, stream=False)[0] == 200
    assert tokens_used("all") == 2 * 10_000_000
    assert post(api, stream=False)[0] == 200


ANSWERS: dict[str, dict[str, Any]] = {
    "anthropic": {
        "id": "msg_absurd",
        "type": "message",
        "role": "assistant",
        "model": "claude-fake",
        "content": [{"type": "text", "text": "short answer"}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": ABSURD, "output_tokens": ABSURD},
    },
    "gemini": {
        "candidates": [
            {
                "content": {"parts": [{"text": "short answer"}], "role": "model"},
                "finishReason": "STOP",
                "index": 0,
            }
        ],
        "usageMetadata": {"promptTokenCount": ABSURD, "candidatesTokenCount": ABSURD},
    },
}


@pytest.mark.parametrize("kind", sorted(ANSWERS))
def test_every_vendors_usage_passes_the_bound(
    api: Any, fake_upstream: FakeUpstream, upstream_chain: Callable[..., list[Any]], kind: str
) -> None:
    """Each adapter's usage goes through the one function (not only OpenAI's)."""
    upstream_chain(("up", kind, {"max_retries": 0}))
    Budget.objects.create(name="tok", scope="user", subject="alice", max_tokens=12_000,
                          window="day")  # fmt: skip
    fake_upstream.script(kind, Faults.ok(body=ANSWERS[kind]))
    with override_settings(LLM_ROUTING={"MAX_REPORTED_TOKENS": BOUND}):
        status, envelope = post(api, stream=False)
    assert status == 200 and envelope["result"]["provider"] == "up"
    assert envelope["result"]["usage"] == {"input_tokens": BOUND, "output_tokens": BOUND}
    assert tokens_used("tok") == 2 * BOUND
