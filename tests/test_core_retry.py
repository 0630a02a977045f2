"""What the retry layer reports for each outcome: the result's fields, the key the adapter
receives, the waits and the log lines an operator reads (issue 17).

The adapter is the scripted test kind; the layer's clock (``time.perf_counter``) is a
ticking fake so a result's ``latency_ms`` is exact.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from django.test import override_settings

from llm_routing.errors import ProviderTimeoutError, RateLimitError, UnavailableError
from llm_routing.resilience import retry
from llm_routing.resilience.budget import MIN_ATTEMPT_S, Budget
from llm_routing.resilience.retry import call_with_retries
from llm_routing.types import AuditRequest, ProviderConfig, ProviderResult

from .conftest import KeylessScriptedProvider, ScriptedProvider

REQUEST = AuditRequest(task="t", input_text="x")
KEY = "sk-retry-core-0123456789abcdef"


class Sleeps(list[float]):
    def __call__(self, seconds: float) -> None:
        self.append(seconds)


class Ticking:
    """A perf_counter that moves on by ``step`` seconds each time it is read."""

    def __init__(self, step: float) -> None:
        self.now, self.step = 100.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


@pytest.fixture(autouse=True)
def _env(
    scripted: type[ScriptedProvider], monkeypatch: pytest.MonkeyPatch
) -> Iterator[type[ScriptedProvider]]:
    monkeypatch.setenv("TEST_PROVIDER_KEY", KEY)
    with override_settings(
        LLM_ROUTING={"BACKOFF_BASE_S": 0.25, "BACKOFF_MAX_S": 4.0, "RETRY_AFTER_CAP_S": 5.0}
    ):
        yield scripted


def adapter(max_retries: int = 2, *, keyless: bool = False) -> ScriptedProvider:
    kind = KeylessScriptedProvider if keyless else ScriptedProvider
    return kind(
        ProviderConfig(
            name="a",
            kind=kind.kind,
            model="m-1",
            api_key_env="TEST_PROVIDER_KEY",
            max_retries=max_retries,
        )
    )


def call(
    provider: ScriptedProvider, budget: Budget | None = None, **kwargs: Any
) -> tuple[ProviderResult, Sleeps]:
    sleeps = Sleeps()
    out = call_with_retries(
        provider,
        REQUEST,
        budget=budget or Budget(deadline_s=60.0, max_attempts=10),
        sleeper=sleeps,
        rng=lambda: 0.5,
        **kwargs,
    )
    return out, sleeps


def test_a_failed_call_reports_who_failed_how_and_in_how_long(
    scripted: type[ScriptedProvider], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(retry, "time", SimpleNamespace(perf_counter=Ticking(0.25)))
    scripted.scripts["a"] = [UnavailableError("down", http_status=503)]
    out, sleeps = call(adapter(max_retries=1))
    assert (out.provider, out.model, out.mode, out.status) == ("a", "m-1", "error", "error")
    assert out.error is not None and out.error.category == "unavailable"
    assert (out.retries, out.upstream_requests) == (1, 2)
    assert sleeps == [0.125]  # full jitter: 0.5 x min(4, 0.25 x 2**0)
    assert out.latency_ms == 250.0  # one clock step between start and end


def test_a_served_call_reports_its_latency(
    scripted: type[ScriptedProvider], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(retry, "time", SimpleNamespace(perf_counter=Ticking(0.5)))
    out, _ = call(adapter())
    assert out.ok and out.latency_ms == 500.0
    assert (out.retries, out.upstream_requests) == (0, 1)


def test_a_spent_budget_reports_its_own_latency_and_message(
    scripted: type[ScriptedProvider], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(retry, "time", SimpleNamespace(perf_counter=Ticking(0.25)))
    out, sleeps = call(adapter(), Budget(deadline_s=60.0, max_attempts=0))
    assert scripted.calls == [] and sleeps == []
    assert out.error is not None and out.error.category == "timeout"
    assert out.error.message == "The request-wide deadline or attempt budget was used up."
    assert (out.provider, out.model, out.mode, out.status) == ("a", "m-1", "error", "error")
    assert (out.retries, out.upstream_requests) == (0, 0)
    assert out.latency_ms == 250.0


def test_the_adapter_receives_the_key_read_at_call_time(
    scripted: type[ScriptedProvider], monkeypatch: pytest.MonkeyPatch
) -> None:
    call(adapter())
    monkeypatch.setenv("TEST_PROVIDER_KEY", "sk-rotated-key-9876543210")
    scripted.scripts["a"] = [UnavailableError(http_status=503), "ok"]
    call(adapter())
    assert scripted.calls == [
        ("a", KEY),
        ("a", "sk-rotated-key-9876543210"),
        ("a", "sk-rotated-key-9876543210"),
    ]


def test_a_keyless_adapter_never_receives_a_key(scripted: type[ScriptedProvider]) -> None:
    out, _ = call(adapter(keyless=True))
    assert out.ok and scripted.calls == [("a", None)]


def test_a_key_in_an_error_message_is_scrubbed(scripted: type[ScriptedProvider]) -> None:
    scripted.scripts["a"] = [UnavailableError(f"denied for key {KEY}", http_status=503)]
    out, _ = call(adapter(max_retries=0))
    assert out.error is not None
    assert KEY not in out.error.message and "denied for key" in out.error.message


def test_max_retries_zero_overrides_the_providers_own(scripted: type[ScriptedProvider]) -> None:
    scripted.scripts["a"] = [UnavailableError(http_status=503)]
    out, sleeps = call(adapter(max_retries=2), max_retries=0)  # the half-open probe
    assert (out.retries, out.upstream_requests, sleeps) == (0, 1, [])
    assert len(scripted.calls) == 1


@pytest.mark.parametrize(("retry_after", "sleeps"), [(0.0, [0.0]), (5.0, [5.0]), (5.01, [])])
def test_retry_after_is_honoured_up_to_and_including_the_cap(
    scripted: type[ScriptedProvider], retry_after: float, sleeps: list[float]
) -> None:
    scripted.scripts["a"] = [RateLimitError(http_status=429, retry_after=retry_after), "ok"]
    out, waited = call(adapter())
    assert waited == sleeps
    assert out.ok is bool(sleeps)


def test_an_adapter_bug_is_logged_and_reported_by_its_type(
    scripted: type[ScriptedProvider], caplog: pytest.LogCaptureFixture
) -> None:
    scripted.scripts["a"] = [KeyError("boom")]
    caplog.set_level(logging.INFO, logger="llm_routing.retry")
    out, _ = call(adapter(max_retries=0))
    assert out.error is not None
    assert out.error.message == "The adapter failed unexpectedly (KeyError)."
    assert [r.getMessage() for r in caplog.records] == [
        "Adapter a (scripted) raised <class 'KeyError'>"
    ]


def test_each_retry_is_logged_with_its_reason_number_and_wait(
    scripted: type[ScriptedProvider], caplog: pytest.LogCaptureFixture
) -> None:
    scripted.scripts["a"] = [
        UnavailableError(http_status=503),
        UnavailableError(http_status=503),
        "ok",
    ]
    caplog.set_level(logging.INFO, logger="llm_routing.retry")
    out, _ = call(adapter())
    assert out.ok and out.retries == 2
    assert [r.getMessage() for r in caplog.records] == [
        "Retrying a after unavailable (retry 1, sleeping 0.125s)",
        "Retrying a after unavailable (retry 2, sleeping 0.250s)",
    ]


def test_the_budget_allows_an_attempt_with_exactly_the_minimum_time_left() -> None:
    now = [0.0]
    budget = Budget(deadline_s=MIN_ATTEMPT_S, max_attempts=2, clock=lambda: now[0])
    assert budget.remaining() == MIN_ATTEMPT_S
    assert budget.can_start()  # exactly MIN_ATTEMPT_S left is enough
    assert budget.can_wait(0.0)  # and a zero wait still leaves it
    assert not budget.can_wait(0.001)
    assert budget.timeout_for(30.0) == MIN_ATTEMPT_S  # clamped to what is left
    now[0] = 1.0
    assert budget.remaining() == 0.0 and budget.timeout_for(30.0) == 0.0
    assert not budget.can_start()


# --- a timeout the request-wide deadline caused ----------------------------------------------


class Clock:
    """A monotonic clock for the budget that moves only when told to (exact floats)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def timing_out(clock: Clock, *, at: float, seen: list[float]) -> Any:
    """An invoke that uses the clock up to ``at`` and then times out (HTTP 504)."""

    def invoke(api_key: str | None, timeout: float) -> ProviderResult:
        seen.append(timeout)
        clock.now = at
        raise ProviderTimeoutError("no answer", http_status=504)

    return invoke


def own_timeout(seconds: float) -> ScriptedProvider:
    return ScriptedProvider(
        ProviderConfig(name="a", kind="scripted", model="m-1", timeout_s=seconds, max_retries=2)
    )


def test_a_timeout_the_deadline_cut_short_is_budget_exhausted_not_the_providers() -> None:
    clock, seen = Clock(), list[float]()
    budget = Budget(deadline_s=1.5, max_attempts=5, clock=clock)
    out, sleeps = call(own_timeout(30.0), budget, invoke=timing_out(clock, at=1.5, seen=seen))
    assert seen == [1.5]  # the call had only what was left of the deadline
    assert out.error is not None
    assert (out.error.category, out.error.http_status) == ("budget_exhausted", 504)
    assert out.error.message == (
        "The request-wide deadline ran out during this call (it had 1.500s of its own 30s timeout)."
    )
    assert (out.retries, out.upstream_requests, sleeps) == (0, 1, [])


def test_a_timeout_of_the_providers_own_full_timeout_stays_a_timeout() -> None:
    clock, seen = Clock(), list[float]()
    budget = Budget(deadline_s=5.0, max_attempts=5, clock=clock)
    out, _ = call(own_timeout(5.0), budget, invoke=timing_out(clock, at=5.0, seen=seen))
    assert seen == [5.0]  # not clamped: the provider's own timeout ran out
    assert out.error is not None and out.error.category == "timeout"


def test_a_timeout_that_leaves_exactly_the_minimum_time_is_the_providers() -> None:
    # 0.1 - 0.05 == 0.05 exactly in binary floating point
    clock, seen = Clock(), list[float]()
    budget = Budget(deadline_s=2 * MIN_ATTEMPT_S, max_attempts=5, clock=clock)
    out, _ = call(own_timeout(30.0), budget, invoke=timing_out(clock, at=MIN_ATTEMPT_S, seen=seen))
    assert budget.remaining() == MIN_ATTEMPT_S
    assert out.error is not None and out.error.category == "timeout"


def test_a_failed_call_reports_the_tokens_the_provider_still_charged(
    scripted: type[ScriptedProvider],
) -> None:
    """A refused answer that consumed tokens (its usage kept on the error) reports them,
    so the attempt is charged; a failure that reported none reports zero tokens."""
    from llm_routing.errors import ResponseError
    from llm_routing.types import Usage

    charged = ResponseError("The answer broke its schema.")
    charged.usage = Usage(input_tokens=11, output_tokens=7)
    scripted.scripts["a"] = [charged]
    out, _ = call(adapter(max_retries=0))
    assert out.error is not None and out.usage == Usage(input_tokens=11, output_tokens=7)
    scripted.scripts["a"] = [UnavailableError("down", http_status=503)]
    out, _ = call(adapter(max_retries=0))
    assert out.error is not None and out.usage == Usage()
