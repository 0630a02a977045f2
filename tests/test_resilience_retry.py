"""The single retry layer against the fake upstream: counts, waits, caps, budgets.

The sleeper is injected (it records and never sleeps); the upstream is real HTTP.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.test import override_settings

from llm_routing.providers.base import BaseProvider, HttpProvider
from llm_routing.providers.mock import MockProvider
from llm_routing.resilience.budget import Budget
from llm_routing.resilience.retry import backoff_delay, call_with_retries
from llm_routing.types import AuditRequest, ProviderConfig, ProviderResult
from tests.fakes.upstream import FakeUpstream, Faults

REQUEST = AuditRequest(task="t", input_text="x")
SETTINGS = {"BACKOFF_BASE_S": 0.25, "BACKOFF_MAX_S": 4.0, "RETRY_AFTER_CAP_S": 5.0}


class Sleeps(list[float]):
    def __call__(self, seconds: float) -> None:
        self.append(seconds)


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_PROVIDER_KEY", "sk-retry-test-123456")


@pytest.fixture(autouse=True)
def _settings() -> object:
    with override_settings(LLM_ROUTING=SETTINGS):
        yield


def budget(**kwargs: float) -> Budget:
    return Budget(
        deadline_s=kwargs.get("deadline_s", 60.0), max_attempts=int(kwargs.get("max_attempts", 10))
    )


def run(adapter: BaseProvider, b: Budget | None = None) -> tuple[ProviderResult, Sleeps]:
    sleeps = Sleeps()
    result = call_with_retries(
        adapter, REQUEST, budget=b or budget(), sleeper=sleeps, rng=lambda: 0.5
    )
    return result, sleeps


def test_backoff_is_full_jitter_exponential_and_capped() -> None:
    assert [backoff_delay(n, rng=lambda: 1.0) for n in range(6)] == [0.25, 0.5, 1.0, 2.0, 4.0, 4.0]
    assert backoff_delay(3, rng=lambda: 0.0) == 0.0
    assert backoff_delay(1, rng=lambda: 0.5) == 0.25


def test_5xx_burst_then_success(
    fake_upstream: FakeUpstream, make_adapter: Callable[..., HttpProvider]
) -> None:
    fake_upstream.script(
        "openai", Faults.unavailable("openai", 503), Faults.unavailable("openai", 502)
    )
    result, sleeps = run(make_adapter("openai", max_retries=2))
    assert result.ok
    assert result.retries == 2
    assert result.upstream_requests == 3 == len(fake_upstream.requests)
    assert sleeps == [0.125, 0.25]  # rng 0.5 * 0.25 * 2**n


def test_5xx_burst_longer_than_max_retries(
    fake_upstream: FakeUpstream, make_adapter: Callable[..., HttpProvider]
) -> None:
    fake_upstream.script("anthropic", *[Faults.overloaded()] * 4)
    result, sleeps = run(make_adapter("anthropic", max_retries=2))
    assert not result.ok and result.error is not None
    assert result.error.category == "unavailable"
    assert result.error.http_status == 529
    assert result.error.transient
    assert result.retries == 2
    assert result.upstream_requests == 3 == len(fake_upstream.requests)
    assert len(sleeps) == 2
    assert fake_upstream.pending("anthropic") == 1


@pytest.mark.parametrize(
    "fault_kwargs, expected_sleep",
    [
        ({"retry_after": "2"}, 2.0),
        ({"retry_after_ms": "1500"}, 1.5),
        ({"retry_after_date_in": 4}, 4.0),
    ],
)
def test_retry_after_is_honoured_up_to_the_cap(
    fault_kwargs: dict[str, object],
    expected_sleep: float,
    fake_upstream: FakeUpstream,
    make_adapter: Callable[..., HttpProvider],
) -> None:
    fake_upstream.script("gemini", Faults.rate_limit("gemini", **fault_kwargs))  # type: ignore[arg-type]
    result, sleeps = run(make_adapter("gemini"))
    assert result.ok and result.retries == 1
    assert len(sleeps) == 1
    if "retry_after_date_in" in fault_kwargs:
        # An HTTP-date has 1 s resolution and is read a moment after it was written (more
        # under load): up to 1 s + latency less than asked, never more.
        assert expected_sleep - 1.5 <= sleeps[0] <= expected_sleep + 0.01
    else:
        assert sleeps[0] == pytest.approx(expected_sleep, abs=0.01)
    assert len(fake_upstream.requests) == 2


@pytest.mark.parametrize(
    "fault_kwargs",
    [{"retry_after": "30"}, {"retry_after_ms": "9000"}, {"retry_after_date_in": 120}],
)
def test_retry_after_above_the_cap_fails_over_with_zero_sleeps(
    fault_kwargs: dict[str, object],
    fake_upstream: FakeUpstream,
    make_adapter: Callable[..., HttpProvider],
) -> None:
    fake_upstream.script("openai", Faults.rate_limit("openai", **fault_kwargs))  # type: ignore[arg-type]
    result, sleeps = run(make_adapter("openai", max_retries=5))
    assert sleeps == []
    assert result.error is not None and result.error.category == "rate_limit"
    assert result.error.http_status == 429
    assert result.retries == 0 and len(fake_upstream.requests) == 1


def test_rate_limit_without_retry_after_uses_backoff(
    fake_upstream: FakeUpstream, make_adapter: Callable[..., HttpProvider]
) -> None:
    fake_upstream.script("openai", Faults.rate_limit("openai"))
    result, sleeps = run(make_adapter("openai"))
    assert result.ok and sleeps == [0.125]


def test_timeout_is_not_retried_on_the_same_provider(
    fake_upstream: FakeUpstream, make_adapter: Callable[..., HttpProvider]
) -> None:
    fake_upstream.script("anthropic", Faults.hang(), Faults.hang())
    result, sleeps = run(make_adapter("anthropic", timeout_s=0.3, max_retries=3))
    assert result.error is not None and result.error.category == "timeout"
    assert result.error.transient
    assert sleeps == [] and result.retries == 0
    assert len(fake_upstream.requests) == 1


def test_network_reset_is_retried(
    fake_upstream: FakeUpstream, make_adapter: Callable[..., HttpProvider]
) -> None:
    fake_upstream.script("openai", Faults.reset())
    result, sleeps = run(make_adapter("openai_compatible"))
    assert result.ok and result.retries == 1 and len(sleeps) == 1
    assert len(fake_upstream.requests) == 2


@pytest.mark.parametrize(
    "builder",
    [
        lambda: Faults.auth("openai"),
        lambda: Faults.invalid_request("openai"),
        lambda: Faults.content_policy("openai"),
        lambda: Faults.context_length("openai"),
        lambda: Faults.malformed(),
    ],
)
def test_permanent_errors_are_never_retried(
    builder: Callable[[], object],
    fake_upstream: FakeUpstream,
    make_adapter: Callable[..., HttpProvider],
) -> None:
    fake_upstream.script("openai", builder())  # type: ignore[arg-type]
    result, sleeps = run(make_adapter("openai", max_retries=5))
    assert not result.ok and sleeps == [] and result.retries == 0
    assert len(fake_upstream.requests) == 1


def test_attempt_budget_caps_retries(
    fake_upstream: FakeUpstream, make_adapter: Callable[..., HttpProvider]
) -> None:
    fake_upstream.script("openai", *[Faults.unavailable("openai")] * 6)
    b = budget(max_attempts=2)
    result, sleeps = run(make_adapter("openai", max_retries=5), b)
    assert result.error is not None and result.error.category == "unavailable"
    assert result.retries == 1 and result.upstream_requests == 2 and len(sleeps) == 1
    assert len(fake_upstream.requests) == 2
    assert b.attempts_used == 2 and not b.can_start()


def test_deadline_stops_a_retry_whose_wait_would_not_leave_time(
    fake_upstream: FakeUpstream, make_adapter: Callable[..., HttpProvider]
) -> None:
    now = [0.0]
    b = Budget(deadline_s=3.0, max_attempts=10, clock=lambda: now[0])
    fake_upstream.script("openai", *[Faults.rate_limit("openai", retry_after="2")] * 3)
    sleeps: list[float] = []

    def sleeper(seconds: float) -> None:
        sleeps.append(seconds)
        now[0] += seconds

    result = call_with_retries(
        make_adapter("openai", max_retries=5), REQUEST, budget=b, sleeper=sleeper
    )
    # Waits 2 s once (1 s left); a second 2 s wait would overrun the 3 s deadline.
    assert sleeps == [2.0]
    assert result.retries == 1 and len(fake_upstream.requests) == 2
    assert result.error is not None and result.error.category == "rate_limit"


def test_exhausted_budget_sends_nothing(
    fake_upstream: FakeUpstream, make_adapter: Callable[..., HttpProvider]
) -> None:
    b = budget(max_attempts=1)
    b.take()
    result, sleeps = run(make_adapter("openai"), b)
    assert result.error is not None and result.error.category == "timeout"
    assert result.upstream_requests == 0 and fake_upstream.requests == [] and sleeps == []


def test_the_mock_answers_even_when_the_budget_is_spent() -> None:
    b = budget(max_attempts=1)
    b.take()
    result, _ = run(MockProvider(ProviderConfig(name="mock", kind="mock", model="mock-1")), b)
    assert result.ok and result.upstream_requests == 0


def test_attempt_timeout_is_clamped_by_the_deadline(
    make_adapter: Callable[..., HttpProvider],
) -> None:
    seen: list[float] = []

    class Probe(BaseProvider):
        def complete(
            self, request: AuditRequest, *, api_key: str | None, timeout: float
        ) -> ProviderResult:
            seen.append(timeout)
            return ProviderResult(provider="p", model="m", mode="live", status="ok")

    now = [0.0]
    b = Budget(deadline_s=2.0, max_attempts=5, clock=lambda: now[0])
    config = ProviderConfig(
        name="p", kind="probe", model="m", api_key_env="TEST_PROVIDER_KEY", timeout_s=30.0
    )
    call_with_retries(Probe(config), REQUEST, budget=b)
    assert seen == [2.0]


def test_an_adapter_bug_becomes_a_response_error(caplog: pytest.LogCaptureFixture) -> None:
    class Broken(BaseProvider):
        def complete(
            self, request: AuditRequest, *, api_key: str | None, timeout: float
        ) -> ProviderResult:
            raise KeyError("boom")

    config = ProviderConfig(name="b", kind="broken", model="m", api_key_env="TEST_PROVIDER_KEY")
    result, sleeps = run(Broken(config))
    assert result.error is not None and result.error.category == "response"
    assert sleeps == []


def test_a_wait_that_overruns_the_deadline_keeps_the_last_error(
    fake_upstream: FakeUpstream, make_adapter: Callable[..., HttpProvider]
) -> None:
    now = [0.0]
    b = Budget(deadline_s=3.0, max_attempts=10, clock=lambda: now[0])
    fake_upstream.script("openai", *[Faults.unavailable("openai", 502)] * 3)

    def oversleeper(seconds: float) -> None:  # the process was descheduled for 10 s
        now[0] += 10.0

    result = call_with_retries(
        make_adapter("openai", max_retries=5), REQUEST, budget=b, sleeper=oversleeper
    )
    assert result.error is not None and result.error.category == "unavailable"
    assert result.error.http_status == 502
    assert result.retries == 0 and result.upstream_requests == 1
    assert len(fake_upstream.requests) == 1
